"""LocalCloud (``edgewise cloud up``): bad ports, weights and thread counts are refused before any
process starts, and a failed start keeps the log its error names."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path
from typing import Any, Dict

import pytest

from cloud.local import LocalCloud
from edgewise.errors import ConfigError, UnavailableError


@pytest.mark.parametrize("kw, says", [
    ({"port": -5}, r"port: -5 must be within 0..65535"),
    ({"port": 70000}, r"port: 70000 must be within 0..65535"),
    ({"metrics_port": 65536}, r"metrics_port: 65536 must be within 0..65535"),
    ({"worker_threads": -3}, r"worker_threads: -3 must be >= 0"),
    ({"weights": [float("nan")]}, r"weights: nan must be a positive finite number"),
    ({"weights": [float("inf")]}, r"weights: inf must be a positive finite number"),
    ({"weights": [0.0]}, r"weights: 0 must be a positive finite number"),
    ({"weights": [-1.0]}, r"weights: -1 must be a positive finite number"),
])
def test_bad_values_are_refused_up_front(tmp_path: Path, kw: Dict[str, Any], says: str) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    with pytest.raises(ConfigError, match=says):
        LocalCloud(model, workers=1, log_dir=tmp_path / "logs", **kw)
    assert not (tmp_path / "logs").exists()


def test_a_failed_start_keeps_the_log_its_error_names(tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cloud = LocalCloud(tiny_model, workers=1, port=port, start_timeout=60)
        with pytest.raises(UnavailableError) as exc:
            cloud.start()
    m = re.search(r"log (\S+\.log)", str(exc.value))
    assert m is not None, exc.value
    log = Path(m.group(1))
    try:
        assert log.is_file() and "cannot bind" in log.read_text()
        assert cloud.workers == [None] and cloud.gateway is None  # every process was stopped
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)


def test_cloud_up_needs_a_worker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`edgewise cloud up --workers 0` passed LocalCloud's check (workers are added later in
    local mode) and then failed in the gateway on `discovery.static` at a line of a temporary
    file; the command now names its own flag."""
    from edgewise.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    assert main(["cloud", "up", "--model", str(model), "--workers", "0"]) == 2
    assert "edgewise: error: --workers 0: the pool needs at least one worker" in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["--workers", "2", "--weights", "4,2,1"], "--weights: 3 given for 2 workers"),  # was "weights: 3 given..."
    (["--workers", "1", "--weights", "nan"], "--weights: nan must be a positive finite number"),
    (["--worker-threads", "-1"], "--worker-threads: -1 must be >= 0"),
    (["--workers", "65"], "--workers: 65 must be within 0..64"),
])
def test_cloud_up_names_its_own_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], args, says) -> None:
    from edgewise.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    assert main(["cloud", "up", "--model", str(model), "--port", "0", *args]) == 2
    assert f"edgewise: error: {says}" in capsys.readouterr().err


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe limits: {}\n", "not UTF-8 text ("),  # was a UnicodeDecodeError traceback
    (b"limits: [\n", ":2: not valid YAML"),  # was a yaml ScannerError traceback
    (b"- limits\n", ":1: the top level must be a mapping of gateway settings"),  # was a ValueError from dict()
])
def test_a_gateway_config_that_is_not_settings_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           content: bytes, says: str) -> None:
    from edgewise.cli import main

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")  # never loaded: nothing starts
    config = tmp_path / "gateway.yaml"
    config.write_bytes(content)
    assert main(["cloud", "up", "--model", str(model), "--port", "0", "--gateway-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edgewise: error: {config}") and says in err and err.count("\n") == 1, err


def test_more_workers_than_one_machine_takes_are_refused_up_front(tmp_path: Path) -> None:
    """`edgewise cloud up --workers 100000` started hundreds of workers, each loading the model,
    until the machine stalled; and its stop then left most of them running."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"workers: 65 must be within 0..64 \(processes on this one machine"):
        LocalCloud(model, workers=65, log_dir=tmp_path / "logs")
    assert not (tmp_path / "logs").exists()


_IGNORES_SIGTERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "print('EDGEWISE_WORKER_SERVING port=1', flush=True); time.sleep(120)")


class _NeverEnds:
    """A process handle that no signal ends (a process the kernel cannot reap in time)."""

    pid = 4242
    returncode = None

    def poll(self) -> None:
        return None

    def wait(self, timeout: float) -> int:
        import subprocess

        raise subprocess.TimeoutExpired("stuck", timeout)

    def send_signal(self, _sig: int) -> None:
        pass


def test_stop_all_stops_every_process_together_and_past_one_that_will_not_end(tmp_path: Path) -> None:
    """A local cloud stopped its workers one by one, each given the whole grace after SIGTERM, and
    the first that outlived its SIGKILL by 5 s (a loaded machine) raised out of ``stop``: every
    later worker was left running, orphaned. Now all get SIGTERM at once and one grace, then
    SIGKILL, and one that does not end is named and passed over."""
    import os
    import sys
    import time

    from cloud.local import _WORKER_RE, _Proc, stop_all
    from edgewise.lifeline import Lifeline

    life = Lifeline()
    procs = [_Proc(f"worker {i}", [sys.executable, "-c", _IGNORES_SIGTERM], tmp_path / f"w{i}.log",
                   os.environ, tmp_path, life) for i in range(4)]
    for p in procs:
        p.wait_line(_WORKER_RE, 30)  # its SIGTERM handler is in place
    stuck = _Proc("worker stuck", [sys.executable, "-c", "pass"], tmp_path / "stuck.log", os.environ, tmp_path, life)
    stuck.popen.wait(10)
    stuck.popen = _NeverEnds()  # type: ignore[assignment]
    t0 = time.monotonic()
    codes = stop_all([procs[0], stuck, *procs[1:]], grace=2.0)
    took = time.monotonic() - t0
    assert codes == [-9, None, -9, -9, -9]
    assert all(p.popen.poll() == -9 for p in procs)
    assert took < 4 * 2.0, f"took {took:.1f} s: the processes were not given one grace together"
    life.close()
