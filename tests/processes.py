"""``edgewise edge run`` as a real child process, for tests that send it real signals
(``kill -9``, SIGTERM, SIGHUP) and restart it on the same spool: the end-to-end
tests and the fault suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Set

ROOT = Path(__file__).resolve().parents[1]

#: Put before a command to start it with SIGHUP's default disposition: under ``nohup`` the
#: tests run with it ignored, and an ignored signal stays ignored across exec. Not a
#: ``preexec_fn``: Python code between fork and exec, in a test process whose gRPC threads are
#: live, ran gRPC's fork handlers, and a child died of SIGABRT before exec ("epoll_wait error:
#: Bad file descriptor"). This resets it in the new program, then execs the command.
DEFAULT_HUP = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
               "os.execvp(sys.argv[1], sys.argv[1:])"]


def stop_under_sighups(proc: subprocess.Popen[Any], limit_s: float = 30.0) -> int:
    """SIGTERM ``proc``, then SIGHUP it every 2 ms until it exits (at most ``limit_s``): a
    reload asked for while a daemon stops, up to its last moments. Returns its exit status."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.002)
    return proc.wait(5)


class EdgeProcess:
    """``edgewise edge run --config`` as a child process (log appended across restarts)."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.killed_epochs: Set[int] = set()  # runs ended by kill -9
        self.runs = 0
        self.start()

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(self.config)],
                stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT, env=env)
        self.runs += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> bool:
        """For ``wait_until``: fail at once when the daemon died."""
        assert self.alive(), f"edge exited with {self.proc.returncode if self.proc else None}; log {self.log}"
        return True

    def kill9(self, epoch: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.killed_epochs.add(epoch)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def close(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)
