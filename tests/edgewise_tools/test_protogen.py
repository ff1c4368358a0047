"""The committed protobuf stubs must be what the pinned grpcio-tools generates."""

from __future__ import annotations

import pytest

from edgewise_tools import protogen


def test_committed_stubs_are_fresh() -> None:
    pytest.importorskip("grpc_tools")
    assert protogen.stale_files() == [], "stubs are stale: run `make proto` and commit"


def test_stale_stub_is_detected(tmp_path, monkeypatch) -> None:
    pytest.importorskip("grpc_tools")
    # A copy of the tree with one stub edited must be reported as stale.
    import shutil

    fake_root = tmp_path / "root"
    shutil.copytree(protogen.ROOT / "proto", fake_root / "proto")
    shutil.copytree(protogen.ROOT / "edgewise" / "v1", fake_root / "edgewise" / "v1")
    stub = fake_root / "edgewise" / "v1" / "detect_pb2.py"
    stub.write_text(stub.read_text() + "\n# hand edit\n")
    monkeypatch.setattr(protogen, "ROOT", fake_root)
    monkeypatch.setattr(protogen, "PROTO_ROOT", fake_root / "proto")
    assert protogen.stale_files() == ["detect_pb2.py"]


def test_generated_messages_round_trip() -> None:
    from edgewise.v1 import detect_pb2

    req = detect_pb2.DetectRequest(device_id="cam-1", stream_id="s", frame_seq=7, trace_id="t")
    req.image.encoding = detect_pb2.Image.JPEG
    req.hardness.signals["entropy"] = 0.5
    back = detect_pb2.DetectRequest.FromString(req.SerializeToString())
    assert back == req
    assert back.hardness.signals["entropy"] == pytest.approx(0.5)
