"""sd_notify speaks the real datagram protocol to a socket like systemd's."""

from __future__ import annotations

import socket

from edge.sdnotify import Notifier


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
