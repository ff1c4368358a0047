"""The one rule both MQTT ends use to tell a client-id clash from a broker that went away (pure logic)."""

from __future__ import annotations

from edgewise.mqtt_sessions import SESSION_TAKEN_OVER, SILENT_CLOSES, TAKEN_OVER, SessionWatch

SILENT = 0x80  # what paho reports for a connection closed without a DISCONNECT ("Unspecified error")


def _closes(w: SessionWatch, n: int, t: float = 0.0) -> list:
    out = []
    for i in range(n):
        w.connected(t + i)
        out.append(w.closed(t + i + 0.5, SILENT, from_server=False))
    return out


def test_only_the_brokers_word_is_a_sure_takeover_and_silent_closes_are_ambiguous():
    w = SessionWatch()
    w.connected(0.0)
    assert w.closed(100.0, SESSION_TAKEN_OVER, from_server=True) == TAKEN_OVER  # after any length
    assert _closes(w, 3) == [None, None, SILENT_CLOSES]
    assert "the broker was restarted" in w.silent_closes() and "same client id" in w.silent_closes()


def test_a_failed_attempt_a_long_session_or_our_own_disconnect_ends_the_run():
    w = SessionWatch()
    assert _closes(w, 2) == [None, None]
    w.unreachable()  # the broker was away: a restart, not a clash
    assert _closes(w, 2) == [None, None]
    w.connected(0.0)
    assert w.closed(60.0, SILENT, from_server=False) is None  # a session that lasted
    assert _closes(w, 2) == [None, None]
    w.connected(0.0)
    assert w.closed(0.1, 0, from_server=False) is None  # this client's own DISCONNECT
    assert _closes(w, 3)[-1] == SILENT_CLOSES
    assert w.closed(1.0, SILENT, from_server=False) is None  # no connection was up: nothing to count
