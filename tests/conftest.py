"""Shared fixtures: real ONNX models built once per session, a real Mosquitto broker.

Models are architecture-exact YOLOv5 graphs with random weights built by
``edgewise_tools.models`` (the code ``edgewise model build`` runs), cached under
``.cache/test-models`` so repeated runs skip the torch export.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".cache" / "test-models"
DIGIT_NAMES = tuple(str(i) for i in range(10))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _built_model(arch: str, imgsz: int, nc: int) -> Path:
    path = MODEL_CACHE / f"{arch}-{imgsz}-{nc}.onnx"
    if not path.exists():  # the Jetson lane's Python 3.8 has no torch: it uses the cached files
        from edgewise_tools.models import build_onnx

        MODEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        build_onnx(arch, imgsz=imgsz, nc=nc, path=tmp, names=DIGIT_NAMES[:nc] if nc <= 10 else None, seed=0)
        tmp.replace(path)
    return path


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """YOLOv5n at 160 px with 10 classes: the fast model for most tests."""
    return _built_model("yolov5n", 160, 10)


@pytest.fixture(scope="session")
def small_model() -> Path:
    """YOLOv5n at 320 px with 10 classes."""
    return _built_model("yolov5n", 320, 10)


def mosquitto_binary() -> str:
    for cand in (shutil.which("mosquitto"), "/usr/sbin/mosquitto"):
        if cand and os.path.exists(cand):
            return cand
    pytest.skip("mosquitto is not installed (make test installs it with apt-get)")
    raise AssertionError  # unreachable


class Broker:
    """A running Mosquitto broker on 127.0.0.1:port (MQTT v5, anonymous)."""

    def __init__(self, port: int, proc: subprocess.Popen[bytes], conf: Path) -> None:
        self.host = "127.0.0.1"
        self.port = port
        self.proc = proc
        self.conf = conf

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def start(self) -> None:
        """(Re)start on the same port, e.g. after ``stop()`` in a broker-restart test."""
        self.proc = _spawn_mosquitto(self.conf, self.port)


def _spawn_mosquitto(conf: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("mosquitto did not start listening within 10 s")


@pytest.fixture
def mosquitto() -> Iterator[Broker]:
    """A real Mosquitto 2.x broker on a free port, stopped after the test."""
    port = free_port()
    d = Path(tempfile.mkdtemp(prefix="ew-mosq-"))
    conf = d / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {d}/\nmax_inflight_messages 100\n"
    )
    broker = Broker(port, _spawn_mosquitto(conf, port), conf)
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)
