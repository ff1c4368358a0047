"""A stop signal while the real daemon loads its model is honoured at once (``edge.loading``).

The load is made slow by the real knob that makes it slow on a device: the daemon runs one
batch of ``model.max_batch`` frames as it starts (here 64 frames at 640 px on one thread, about
7 s on this CPU; a TensorRT engine build takes minutes). The daemon used to wait for the whole
load after SIGTERM, and a build would overrun systemd's ``TimeoutStopSec=30`` (then SIGKILL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from tests.edge.helpers import hold_write_lock, let_go, policy_yaml, settings_yaml

ROOT = Path(__file__).resolve().parents[2]


def _messages(srv: socket.socket, until: str, timeout: float) -> List[str]:
    """sd_notify datagrams the daemon sent, read until one contains ``until`` (or ``timeout``)."""
    got: List[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        srv.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got.append(srv.recv(4096).decode())
        except socket.timeout:
            break
        if until in got[-1]:
            break
    return got


def test_a_sigterm_while_the_model_loads_stops_the_daemon_at_once_through_its_usual_shutdown(
        tmp_path, native_model):
    """The daemon runs under a real sd_notify socket; once it says it is loading the model,
    SIGTERM. It exits 0 within 3 s (the load alone takes about 7 s), says STOPPING to systemd,
    closes its spool and releases its instance lock (a second daemon starts on the same state
    folder), and writes no record: no frame was accepted before the model was loaded."""
    notify = tmp_path / "notify.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(str(notify))
    out = tmp_path / "out.jsonl"
    log = tmp_path / "edge.log"
    config = settings_yaml(tmp_path / "edge.yaml", device_id="dev",
                           streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                           model={"path": str(native_model), "imgsz": 640, "max_batch": 64, "threads": 1},
                           spool={"path": str(tmp_path / "spool.db")}, sinks={"jsonl": str(out)},
                           metrics={"port": -1})
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", NOTIFY_SOCKET=str(notify))
    cmd = [sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)]
    try:
        with open(log, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env=env)
        try:
            said = _messages(srv, "STATUS=loading", 120)  # notifier.busy: the load has begun
            assert said and "STATUS=loading" in said[-1], (said, log.read_text())
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        said = _messages(srv, "\0", 0.5)  # what came after (nothing can contain a NUL)
    finally:
        srv.close()
    text = log.read_text()
    assert rc == 0 and took < 3.0, (rc, took, text)
    assert any("STOPPING=1" in m for m in said), said
    assert "stopped after 0 frames: the stop came before the model was loaded" in text
    assert "Traceback" not in text, text
    assert not out.exists() or out.read_bytes() == b""
    # the spool was closed and the state folder let go: the next daemon opens both
    with open(log, "ab") as err:
        again = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                                 env=dict(env, NOTIFY_SOCKET=""))
    try:
        deadline = time.monotonic() + 60
        while "loading model" not in log.read_text()[len(text):]:
            assert again.poll() is None, log.read_text()[len(text):]
            assert time.monotonic() < deadline, log.read_text()[len(text):]
            time.sleep(0.05)
        again.send_signal(signal.SIGTERM)
        assert again.wait(60) == 0, log.read_text()[len(text):]
    finally:
        if again.poll() is None:
            again.kill()
            again.wait(10)


def test_a_sigterm_while_the_model_loads_does_not_wait_for_a_lock_another_process_holds_on_the_spool(
        tmp_path, native_model):
    """With a policy the daemon opens its spool before the model; once the load has begun,
    another process (an operator's ``sqlite3`` shell, a backup tool) takes the spool's write
    lock, then SIGTERM. No escalation was built, so nothing had told the spool the daemon
    stops: its close's checkpoint waited SQLite's 30 s busy timeout for the lock (30.3 s to
    exit, past systemd's TimeoutStopSec=30: SIGKILL). It exits at once, the load given up."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", transport=None))
    log = tmp_path / "edge.log"
    config = settings_yaml(tmp_path / "edge.yaml", device_id="dev",
                           streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                           model={"path": str(native_model), "imgsz": 640, "max_batch": 64, "threads": 1},
                           spool={"path": str(tmp_path / "spool.db")}, policy_file=str(policy),
                           metrics={"port": -1})
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", NOTIFY_SOCKET="")
    cmd = [sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)]
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env=env)
    holder = None
    try:
        deadline = time.monotonic() + 60
        while "loading model" not in log.read_text():  # (the spool is open before the load)
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        holder = hold_write_lock(tmp_path / "spool.db")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(15)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if holder is not None:
            let_go(holder)
    text = log.read_text()
    assert rc == 0 and took < 3.0, (rc, took, text)
    assert "exiting without waiting for the model load the stop gave up" in text, text
