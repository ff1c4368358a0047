"""`edgewise cloud probe` (the helm test hook) against a real local cloud."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cloud.local import LocalCloud
from cloud.probe import probe, probe_frame
from edgewise.v1 import detect_pb2
from tests.conftest import free_port


def test_probe_frame_is_deterministic() -> None:
    a, b = probe_frame(seed=1), probe_frame(seed=1)
    assert a.shape == (480, 640, 3) and a.dtype.name == "uint8" and (a == b).all()


def test_probe_through_real_gateway(tiny_model) -> None:
    with LocalCloud(tiny_model, workers=1) as cloud:
        resp = probe(cloud.address, timeout=30)
        assert resp.status == detect_pb2.OK and resp.worker_id
        out = subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", "--target", cloud.address,
                              "--timeout", "30"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["status"] == "OK" and report["round_trip_ms"] > 0


@pytest.mark.timeout(60)
def test_probe_fails_clearly_without_gateway() -> None:
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", "--target", f"127.0.0.1:{port}",
                          "--timeout", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in out.stdout
