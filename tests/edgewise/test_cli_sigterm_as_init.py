"""SIGTERM as PID 1 of a PID namespace (a container without an init), where the kernel ignores a
signal left at its default: real processes in a real new PID namespace, real signals."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.processes import ROOT


def _pid1(argv: list, log) -> subprocess.Popen[bytes]:
    """``argv`` as PID 1 of a new PID namespace (a container without an init); skips where
    this machine cannot make one (not root)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--pid", "--fork", "true"],
                                                         capture_output=True).returncode != 0:
        pytest.skip("no new PID namespace here (unshare --pid needs root)")
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", *argv], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _sig_caught(pid: int, sig: int) -> bool:
    """Whether the process has a handler for ``sig`` (its SigCgt mask in Linux /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught, 16) & (1 << (sig - 1)))


def test_a_sigterm_while_a_service_starts_as_pid_1_ends_it_instead_of_being_lost(tmp_path, tiny_model):
    """A worker as PID 1 (the chart's pods: the image's ENTRYPOINT is ``edgewise``), stopped as
    soon as Python runs the dispatcher (while it loads its modules and the model): the kernel
    ignored that SIGTERM (the default disposition of a namespace's init), the worker went on to
    serve, and only Kubernetes' SIGKILL ended it. Now it exits 143 at once, never serving."""
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        proc = _pid1([sys.executable, "-m", "edgewise.cli", "cloud", "worker", "--model", str(tiny_model),
                      "--port", "0", "--metrics-port", "-1"], log)
    try:
        deadline = time.monotonic() + 30
        kids: list = []
        while not kids or not _sig_caught(kids[0], signal.SIGHUP):  # edgewise.hangup holds it first thing
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            kids = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            time.sleep(0.002)
        os.kill(kids[0], signal.SIGTERM)
        assert proc.wait(20) == 143, log_path.read_text()
        assert "EDGEWISE_WORKER_SERVING" not in log_path.read_text()
        assert "Traceback" not in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
