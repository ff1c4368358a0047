"""The shared MQTT client (``edgewise.mqtt_client.Client``) against a hostile broker: a real
socket speaking MQTT v5 as a broker that no Mosquitto is (Mosquitto refuses a topic that is not
UTF-8 from its publishers, so only a hostile broker or a man in the middle sends one), with the
edge's real connection (``edge.transports.mqtt.MqttConnection``) on the other end."""

from __future__ import annotations

import socket
import threading
from typing import Any, List, Optional, Tuple

from edge.transports.mqtt import MqttConnection
from tests.waiting import wait_until

RESPONSES = "edgewise/cam-1/response/x"


def _vbi(n: int) -> bytes:
    """A Variable Byte Integer (MQTT 5.0, 1.5.5)."""
    out = b""
    while True:
        n, digit = divmod(n, 128)
        out += bytes([digit | (0x80 if n else 0)])
        if not n:
            return out


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _vbi(len(body)) + body


def _read_packet(conn: socket.socket) -> Tuple[Optional[int], bytes]:
    """(the first byte, the rest) of the next packet; (None, b"") once the client is gone."""
    head = conn.recv(1)
    if not head:
        return None, b""
    n, shift = 0, 0
    while True:
        digit = conn.recv(1)[0]
        n += (digit & 0x7F) << shift
        shift += 7
        if not digit & 0x80:
            break
    body = b""
    while len(body) < n:
        body += conn.recv(n - len(body))
    return head[0], body


def _publish(topic: bytes, payload: bytes) -> bytes:
    """A QoS 0 PUBLISH without properties."""
    return _packet(0x30, len(topic).to_bytes(2, "big") + topic + b"\x00" + payload)


class HostileBroker:
    """Accepts one client; at its SUBSCRIBE, answers SUBACK and sends ``messages``."""

    def __init__(self, messages: List[bytes]) -> None:
        self.messages = messages
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conn: Optional[socket.socket] = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        self.conn = conn
        with conn:
            _read_packet(conn)  # CONNECT
            conn.sendall(_packet(0x20, b"\x00\x00\x00"))  # CONNACK: accepted, no properties
            while True:
                kind, body = _read_packet(conn)
                if kind is None:
                    return
                if kind >> 4 == 8:  # SUBSCRIBE: SUBACK granted QoS 0, then the messages
                    conn.sendall(_packet(0x90, body[:2] + b"\x00\x00") + b"".join(self.messages))
                elif kind >> 4 == 12:  # PINGREQ
                    conn.sendall(_packet(0xD0, b""))

    def close(self) -> None:
        self.server.close()
        self.thread.join(5)


def test_a_message_whose_topic_is_not_utf8_is_dropped_and_the_connection_lives_on(caplog) -> None:
    """A broker's PUBLISH on a topic that is not UTF-8 made ``message.topic`` raise in the
    edge's ``on_message``, and paho let that end its network thread: the next answer (on the
    right topic) never came, nothing reconnected, and the connection still said it was
    connected. It is now dropped with a WARNING, and the next message is delivered."""
    broker = HostileBroker([_publish(RESPONSES.encode() + b"\xff", b"forged"), _publish(RESPONSES.encode(), b"ok")])
    conn = MqttConnection("127.0.0.1", broker.port, client_id="x")
    got: List[Tuple[str, bytes]] = []
    try:
        conn.start()
        wait_until(conn.connected.is_set, 10, "the connection")
        conn.subscribe(RESPONSES, lambda msg: got.append((msg.topic, bytes(msg.payload))))
        wait_until(lambda: got, 10, "the message on the right topic")
        assert got == [(RESPONSES, b"ok")]
        assert conn.client._thread is not None and conn.client._thread.is_alive()
        assert any("topic b'edgewise/cam-1/response/x\\xff' is not UTF-8" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    finally:
        conn.stop()
        broker.close()


def test_an_exception_out_of_a_callback_ends_the_connection_not_the_network_thread(mosquitto, caplog) -> None:
    """An exception out of ``on_message`` (any callback's, or paho's own) ended paho's network
    thread: nothing was received or reconnected again until the process restarted. It is now
    logged, the connection is ended as lost (``on_disconnect`` says so) and made again, and
    the next message arrives, on a real Mosquitto."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from edgewise.mqtt_client import Client

    got: List[bytes] = []
    connects: List[int] = []
    subscribed: List[int] = []
    disconnects: List[Any] = []
    client = Client(CallbackAPIVersion.VERSION2, client_id="raises-once", protocol=mqtt.MQTTv5)
    client.reconnect_delay_set(0.1, 0.5)

    def on_connect(c: Any, _u: Any, _f: Any, _rc: Any, _p: Any = None) -> None:
        connects.append(1)
        c.subscribe("t/#", qos=1)

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        if msg.payload == b"boom":
            raise RuntimeError("a bug in a callback")
        got.append(bytes(msg.payload))

    client.on_connect = on_connect
    client.on_subscribe = lambda *_args: subscribed.append(1)  # the broker's SUBACK: it delivers from now on
    client.on_message = on_message
    client.on_disconnect = lambda _c, _u, _f, rc, _p=None: disconnects.append(rc)
    sender = Client(CallbackAPIVersion.VERSION2, client_id="sender", protocol=mqtt.MQTTv5)
    try:
        client.connect("127.0.0.1", mosquitto.port)
        client.loop_start()
        wait_until(lambda: subscribed, 10, "the first subscription")
        sender.connect("127.0.0.1", mosquitto.port)
        sender.loop_start()
        sender.publish("t/a", b"boom", qos=0).wait_for_publish(5)
        wait_until(lambda: len(subscribed) >= 2, 15, "the connection and its subscription made again")
        sender.publish("t/a", b"after", qos=0).wait_for_publish(5)
        wait_until(lambda: got, 10, "the message after the failure")
        assert got == [b"after"]
        assert disconnects, "on_disconnect was not called for the dropped connection"
        assert client._thread is not None and client._thread.is_alive()
        assert any("MQTT network loop failed" in r.getMessage() for r in caplog.records)
    finally:
        sender.loop_stop()
        sender.disconnect()
        client.disconnect()
        client.loop_stop()
    assert client._thread is None  # loop_stop still ends it


def test_a_disconnect_stays_one_when_on_disconnect_raises(mosquitto, caplog) -> None:
    """The network loop that survives an exception ended the connection as lost when
    ``on_disconnect`` itself raised, even for a ``disconnect()`` the program asked for: paho then
    connected again (and went on until ``loop_stop``). A disconnect asked for stays one: the
    network thread ends, as paho's own does, and no new connection is made."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from edgewise.mqtt_client import Client

    connects: List[int] = []
    client = Client(CallbackAPIVersion.VERSION2, client_id="raises-at-disconnect", protocol=mqtt.MQTTv5)
    client.reconnect_delay_set(0.1, 0.5)
    client.on_connect = lambda *_args: connects.append(1)

    def on_disconnect(*_args: Any) -> None:
        raise RuntimeError("a bug in on_disconnect")

    client.on_disconnect = on_disconnect
    try:
        client.connect("127.0.0.1", mosquitto.port)
        client.loop_start()
        wait_until(lambda: connects, 10, "the connection")
        thread = client._thread
        assert thread is not None
        client.disconnect()
        thread.join(10)
        assert not thread.is_alive(), "the network thread went on after disconnect()"
        assert connects == [1]
    finally:
        client.loop_stop()


def test_withdraw_forgets_only_the_message_it_was_given_and_never_sends_it_again() -> None:
    import paho.mqtt.client as mqtt

    from edgewise.mqtt_client import Client, Withdrawn

    c = Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2, client_id="w", protocol=mqtt.MQTTv5)
    held = c.publish("t", b"x", qos=1)  # not connected: paho holds it for the connection
    assert held.rc == mqtt.MQTT_ERR_NO_CONN and held.mid in c._out_messages
    other = mqtt.MQTTMessageInfo(held.mid)  # another message that took the same packet identifier
    assert c.withdraw(other) == Withdrawn(forgotten=False, written=True) and held.mid in c._out_messages
    assert c.withdraw(held) == Withdrawn(forgotten=True, written=False) and held.mid not in c._out_messages
    assert c.withdraw(held) == Withdrawn(forgotten=False, written=True)  # gone already (maybe acknowledged)
    earlier = c.publish("t", b"y", qos=1)
    c._out_messages[earlier.mid].dup = True  # written on an earlier connection only: not sent again
    assert c.withdraw(earlier) == Withdrawn(forgotten=True, written=True) and earlier.mid not in c._out_messages
    live = c.publish("t", b"z", qos=1)
    c._out_messages[live.mid].state = mqtt.mqtt_ms_wait_for_puback  # written on this connection: its PUBACK
    assert c.withdraw(live) == Withdrawn(forgotten=False, written=True) and live.mid in c._out_messages
    assert c.drop_expired() == {live.mid: "t"}  # at the reconnect: dropped, not sent again
    exchange = c.publish("t", b"q2", qos=2)
    c._out_messages[exchange.mid].dup = True  # QoS 2 the broker may hold unreleased: its exchange must end
    assert c.withdraw(exchange) == Withdrawn(forgotten=False, written=True)
    assert c.drop_expired() == {} and exchange.mid in c._out_messages


def test_a_stop_does_not_wait_for_a_hung_broker_to_acknowledge(mosquitto) -> None:
    """A hung broker (SIGSTOP: the connection stays open, nothing is read or answered) and the
    socket's buffers full of unacknowledged QoS 1 messages (escalations of full frames): paho's
    ``loop_stop`` after ``disconnect()`` waited for their PUBACKs until the keepalive ended the
    connection, and the edge's stop took 39 s, past systemd's TimeoutStopSec=30. The connection
    is now shut down after ``STOP_FLUSH_S`` (2 s)."""
    import os
    import signal
    import time

    conn = MqttConnection("127.0.0.1", mosquitto.port, client_id="stops-on-time", keepalive_s=60)
    conn.start()
    wait_until(conn.connected.is_set, 10, "the connection")
    os.kill(mosquitto.proc.pid, signal.SIGSTOP)
    try:
        payload = b"x" * (1 << 20)
        for _ in range(40):  # more than the socket buffers of both ends take
            conn.publish("edgewise/cam-1/escalate", payload)
        time.sleep(0.5)
        t0 = time.monotonic()
        conn.stop()
        took = time.monotonic() - t0
    finally:
        os.kill(mosquitto.proc.pid, signal.SIGCONT)
    assert took < 5, took  # STOP_FLUSH_S and the loop's last turn
    assert conn.client._thread is None


def test_a_stop_closes_the_wake_up_socket_pair_of_the_network_thread(mosquitto) -> None:
    """paho closes the socket pair ``loop_start`` makes only in its ``__del__``; a connection and
    its client are a reference cycle, which the garbage collector may finalize sockets first in:
    "unclosed socket" failed a test module (tests/edge/test_sinks.py) at its end-of-module
    collection. ``loop_stop`` closes the pair once the thread is done, and a publish after the
    stop is still no error."""
    conn = MqttConnection("127.0.0.1", mosquitto.port, client_id="closes-its-pair")
    conn.start()
    wait_until(conn.connected.is_set, 10, "the connection")
    pair = (conn.client._sockpairR, conn.client._sockpairW)
    assert all(end is not None and end.fileno() >= 0 for end in pair)
    conn.stop()
    assert [end.fileno() for end in pair] == [-1, -1]  # closed
    assert conn.client._sockpairR is None and conn.client._sockpairW is None
    conn.client.publish("edgewise/cam-1/escalate", b"after the stop", qos=1)  # queued, no OSError


def test_a_connection_whose_socket_is_descriptor_1024_or_more_works(mosquitto) -> None:
    """paho's network loop waits with select(), which refuses a descriptor of 1024 or more
    (FD_SETSIZE): a gateway that raised its open-file limit for a fleet's connections, or an
    edge with many streams, whose MQTT socket was opened past 1023 (a reconnect while many are
    open) had every attempt end as a lost connection at once, quietly, forever (found by a
    probe). The loop now waits with poll(); a real Mosquitto, a socket past 1023."""
    import os
    import resource

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from edgewise.mqtt_client import Client

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1100
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            import pytest

            pytest.skip(f"the open-file limit ({hard}) leaves no descriptor past 1023 to use")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    fillers = []
    got: List[bytes] = []
    client = Client(CallbackAPIVersion.VERSION2, client_id="past-1023", protocol=mqtt.MQTTv5)
    client.reconnect_delay_set(0.1, 0.5)
    try:
        while not fillers or fillers[-1] < 1030:  # what the fleet's connections hold
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        subscribed: List[int] = []
        client.on_connect = lambda c, *_a: c.subscribe("t/#", qos=1)
        client.on_subscribe = lambda *_a: subscribed.append(1)
        client.on_message = lambda _c, _u, msg: got.append(bytes(msg.payload))
        client.connect("127.0.0.1", mosquitto.port)
        assert client.socket().fileno() >= 1024
        client.loop_start()
        wait_until(lambda: subscribed, 10, "the subscription over a socket past descriptor 1023")
        client.publish("t/a", b"hello", qos=0).wait_for_publish(5)  # (QoS 1 waits for on_connack: the connections call it)
        wait_until(lambda: got, 10, "the message back")
        assert got == [b"hello"]
    finally:
        client.disconnect()
        client.loop_stop()
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
