"""``edgewise edge engine`` / ``edge model-info``: the device's model commands (no edgewise_tools).

The engine command must build exactly the engine the daemon then loads: driven here through
the recording TensorRT stand-in (``tests/edgewise/runtime/fake_tensorrt.py``), the daemon's
own ``Detector.from_file`` afterwards must hit the cache, not build again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgewise.cli import main
from edgewise.runtime import detector as D
from edgewise.runtime.backends import tensorrt as trtb
from tests.edge.helpers import settings_yaml


def _config(tmp_path: Path, model: Path, backend: str, max_batch: int = 2) -> Path:
    return settings_yaml(tmp_path / "edge.yaml", device_id="d", streams=[{"id": "s", "kind": "synthetic"}],
                         model={"path": str(model), "backend": backend, "max_batch": max_batch},
                         spool={"path": str(tmp_path / "spool.db")}, metrics={"port": -1})


@pytest.fixture
def fake_trt(monkeypatch, tmp_path: Path):
    from tests.edgewise.runtime import fake_tensorrt
    from tests.edgewise.runtime.graphs import fake_yolo

    model = fake_yolo(tmp_path / "m.onnx", nc=2)
    cuda = fake_tensorrt.HostCuda()
    model_fn, _ = fake_tensorrt.onnx_model_fn(model, cuda)

    mod = fake_tensorrt.make("8.5.2.2", True, model_fn)
    monkeypatch.setattr(trtb, "import_tensorrt", lambda: mod)
    monkeypatch.setattr(trtb, "_Cuda", lambda: cuda)
    monkeypatch.setattr(trtb, "cuda_device_name", lambda: "Xavier")
    monkeypatch.setattr(D, "tensorrt_unusable_reason", lambda: "")
    monkeypatch.setenv("EDGEWISE_ENGINE_CACHE", str(tmp_path / "engines"))
    return mod, model


def test_engine_builds_what_the_daemon_loads_then_reuses_it(fake_trt, tmp_path: Path, capsys) -> None:
    mod, model = fake_trt
    cfg = _config(tmp_path, model, "tensorrt", max_batch=2)
    assert main(["edge", "engine", "--config", str(cfg)]) == 0
    assert "fp16 engine" in capsys.readouterr().out
    (engine,) = (tmp_path / "engines").glob("*.engine")
    assert "-b2-trt8.5.2.2-xavier-" in engine.name
    builds = sum(1 for c in mod.calls if c[0] == "build")
    assert main(["edge", "engine", "--config", str(cfg)]) == 0
    assert "is cached" in capsys.readouterr().out
    det = D.Detector.from_file(model, backend="tensorrt", max_batch=2)  # what edge.daemon does
    assert sum(1 for c in mod.calls if c[0] == "build") == builds
    det.close()
    # model-info names the same cached engine for the same model.max_batch
    assert main(["edge", "model-info", str(model), "--max-batch", "2"]) == 0
    assert f"{engine} (batch <= 2; cached)" in capsys.readouterr().out


def test_model_info_refuses_a_batch_below_one(tiny_model: Path, capsys) -> None:
    for bad in ("0", "-3"):
        with pytest.raises(SystemExit) as exc:
            main(["edge", "model-info", str(tiny_model), "--max-batch", bad])
        assert exc.value.code == 2
        assert f"argument --max-batch: invalid whole number >= 1 value: '{bad}'" in capsys.readouterr().err


@pytest.mark.parametrize("bad, hint", [("١٢", "write it in the ASCII digits 0-9"), ("２", "write it in the ASCII digits 0-9"),
                                       ("1_0", "write it without '_' separators")])
def test_model_info_reads_the_batch_in_ascii_digits_only(tiny_model: Path, capsys, bad: str, hint: str) -> None:
    """``--max-batch ١٢`` (Arabic-Indic), ``２`` (full-width) and ``1_0`` were read as 12, 2 and 10 by
    int(), though every setting refuses them (found by a probe); the flag follows the one rule."""
    with pytest.raises(SystemExit) as exc:
        main(["edge", "model-info", str(tiny_model), "--max-batch", bad])
    assert exc.value.code == 2
    assert f"argument --max-batch: invalid whole number >= 1 value: '{bad}' ({hint})" in capsys.readouterr().err



def test_model_info_refuses_a_batch_the_daemon_refuses(tiny_model: Path, capsys) -> None:
    """``--max-batch 99999999`` was accepted, and named an engine no daemon can load."""
    assert main(["edge", "model-info", str(tiny_model), "--max-batch", "257"]) == 2
    assert "--max-batch 257: must be within 1..256 (model.max_batch's range)" in capsys.readouterr().err


def test_engine_with_onnxruntime_has_nothing_to_build(tmp_path: Path, tiny_model: Path, capsys) -> None:
    assert main(["edge", "engine", "--config", str(_config(tmp_path, tiny_model, "onnxruntime"))]) == 0
    assert "no TensorRT engine to build" in capsys.readouterr().out


def test_engine_without_tensorrt_is_one_line(tmp_path: Path, tiny_model: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(D, "tensorrt_unusable_reason", lambda: "the tensorrt module is not installed")
    monkeypatch.setattr(trtb, "import_tensorrt", lambda: (_ for _ in ()).throw(
        trtb.TensorRTUnavailableError(trtb.TENSORRT_MISSING)))
    assert main(["edge", "engine", "--config", str(_config(tmp_path, tiny_model, "tensorrt"))]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "JetPack" in err and "model.backend: onnxruntime" in err


def test_model_info(tiny_model: Path, capsys) -> None:
    assert main(["edge", "model-info", str(tiny_model)]) == 0
    out = capsys.readouterr().out
    assert "YOLOv5 detector" in out and "size 160x160" in out and "classes 10: 0, 1, 2" in out
    assert "TensorRT engine: " in out and "opsets ai.onnx 17; on JetPack 5.1: loads" in out
    assert main(["edge", "model-info", str(tiny_model), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["classes"] == 10 and d["imgsz"] == [160, 160] and len(d["sha256"]) == 64
    assert d["opsets"] == {"ai.onnx": 17} and d["jetpack51"] == "loads"


def test_model_info_bad_file_is_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    assert main(["edge", "model-info", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(bad) in err
