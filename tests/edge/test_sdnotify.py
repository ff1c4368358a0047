"""sd_notify speaks the real datagram protocol to a socket like systemd's."""

from __future__ import annotations

import socket
import threading

from edge.sdnotify import Notifier
from tests.waiting import wait_until


def test_messages_reach_the_socket(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "notify")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(2)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    n = Notifier(path)
    assert n.enabled and n.watchdog_interval == 15.0
    assert n.ready("model loaded")
    assert srv.recv(1024) == b"READY=1\nSTATUS=model loaded"
    assert n.watchdog()
    assert srv.recv(1024) == b"WATCHDOG=1"
    srv.close()


def test_noop_without_systemd(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    n = Notifier()
    assert not n.enabled and n.watchdog_interval is None
    assert n.ready() is False


def test_watchdog_for_another_pid_is_ignored(monkeypatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert Notifier("/nonexistent").watchdog_interval is None


def _listen(tmp_path):
    path = str(tmp_path / "notify")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(0.5)
    return srv, path


def _drain(srv):
    out = []
    try:
        while True:
            out.append(srv.recv(1024).decode())
    except socket.timeout:
        return out


def test_busy_extends_the_start_timeout_while_a_long_step_runs(tmp_path) -> None:
    srv, path = _listen(tmp_path)
    got = []
    with Notifier(path).busy("building the engine", every_s=0.05, extend_s=60):
        # the step runs until three have come (in a fixed 0.3 s a loaded machine may send fewer)
        srv.settimeout(10)
        while len(got) < 3:  # one at the start, then every 0.05 s
            got.append(srv.recv(1024).decode())
        srv.settimeout(0.5)
    got += _drain(srv)
    assert len(got) >= 3
    assert all(m.startswith("EXTEND_TIMEOUT_USEC=60000000\nWATCHDOG=1\nSTATUS=building the engine (") for m in got)
    assert _drain(srv) == []  # nothing after the step
    srv.close()


def test_busy_stops_extending_at_its_cap(tmp_path) -> None:
    srv, path = _listen(tmp_path)
    with Notifier(path).busy("stuck", every_s=0.05, limit_s=0.5):
        # the heartbeat ends by itself while the step still runs (a cap of 0.12 s and a fixed 0.5 s
        # step: on a loaded machine the thread could start past the cap and send nothing)
        wait_until(lambda: not any(t.name == "sd-notify-busy" for t in threading.enumerate()), 10,
                   "the heartbeat stopped at its cap")
    got = _drain(srv)
    assert 2 <= len(got) <= 0.5 / 0.05 + 1  # a step stuck past the cap meets the unit's own timeout
    srv.close()


def test_busy_is_a_no_op_outside_systemd(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    with Notifier().busy("x"):
        assert not any(t.name == "sd-notify-busy" for t in threading.enumerate())  # no heartbeat thread
