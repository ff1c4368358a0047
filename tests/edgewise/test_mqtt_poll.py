"""``edgewise.mqtt_poll``: select.select's contract, as paho's loop uses it, over poll(2)."""

from __future__ import annotations

import socket

import pytest

from edgewise import mqtt_poll


def test_readiness_is_reported_as_select_reports_it() -> None:
    a, b = socket.socketpair()
    try:
        assert mqtt_poll.poll_select([a], [a], [], 0) == ([], [a], [])  # nothing to read; room to write
        b.sendall(b"x")
        assert mqtt_poll.poll_select([a, b], [], [], 1.0) == ([a], [], [])
        b.close()  # a hang-up: readable (the next read meets the end), as select says
        r, w, _ = mqtt_poll.poll_select([a], [a], [], 0)
        assert r == [a] and w == [a]
    finally:
        a.close()


def test_bad_arguments_raise_what_select_raises_for_paho_to_handle() -> None:
    a, _b = socket.socketpair()
    a.close()  # fileno() is -1 now: paho's loop meets this after a disconnect
    with pytest.raises(ValueError):
        mqtt_poll.poll_select([a], [], [], 0)
    with pytest.raises(TypeError):
        mqtt_poll.poll_select([None], [], [], 0)
    _b.close()


def test_paho_waits_with_it_once_the_client_module_is_imported() -> None:
    import paho.mqtt.client as paho_client

    import edgewise.mqtt_client  # noqa: F401  (installs it)

    assert paho_client.select.select is mqtt_poll.poll_select
    assert paho_client.select.POLLIN == __import__("select").POLLIN  # the rest of select is there
