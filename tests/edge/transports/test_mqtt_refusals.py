"""The edge's MQTT connection and transport against a real Mosquitto that refuses.

Each test starts its own broker (``configured_mosquitto``: a free port, its own
config with ``max_packet_size``, ``message_size_limit``, or a password file and an
ACL). What the edge must do: refuse a request over the Maximum Packet Size the
broker announced before sending it (the broker would drop the connection and paho
would send the message again after every reconnect, for good), take Mosquitto's
PUBACK "Packet too large" for a message over ``message_size_limit`` as a refusal
(not a malformed packet), fail an escalation the ACL refuses at once with the
broker's reason, say why a broker cannot be reached, and say clearly when another
client takes the session of the same client id.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import threading
import time
import uuid
from typing import Dict, List, Optional

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge.escalating import Escalating
from edge.metrics import EdgeMetrics
from edge.records import FrameRecord
from edge.sources.base import Frame
from edge.spool import Spool
from edge.transports import RECONNECT_DELAY_S, TransportError
from edge.transports.mqtt import (
    MqttConnection,
    MqttTransport,
    PublishRefused,
    Refusal,
    publish_packet_size,
)
from edgewise import mqtt_topics
from edgewise.detections import Detections
from edgewise.policy.deciding import Decision
from edgewise.policy.loading import parse_policy
from edgewise.v1 import detect_pb2
from tests.conftest import Broker, configured_mosquitto, free_port
from tests.edge.helpers import frame_record, policy_yaml
from tests.logs import said
from tests.waiting import async_wait_until, wait_until

LOGGER = "edge.transports.mqtt"


def reload(broker: Broker) -> None:
    """Make Mosquitto read its password and ACL files again (SIGHUP)."""
    broker.proc.send_signal(1)


class Responder:
    """A plain paho client playing the gateway: answers every request OK, with its
    correlation data, on its response topic."""

    def __init__(self, broker: Broker, username: str = "", password: str = "") -> None:
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"responder-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)
        if username:
            self.c.username_pw_set(username, password)
        self.ready = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe("edgewise/+/escalate", qos=1)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.ready.set()
        self.c.on_message = self._answer
        self.c.connect(broker.host, broker.port)
        self.c.loop_start()
        assert self.ready.wait(10)

    def _answer(self, c, u, msg):
        req = detect_pb2.DetectRequest.FromString(msg.payload)
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = msg.properties.CorrelationData
        resp = detect_pb2.DetectResponse(status=detect_pb2.OK, frame_seq=req.frame_seq, device_id=req.device_id)
        c.publish(msg.properties.ResponseTopic, resp.SerializeToString(), qos=1, properties=props)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def request(seq: int, image_bytes: int = 100) -> detect_pb2.DetectRequest:
    req = detect_pb2.DetectRequest(device_id="cam-1", stream_id="s", frame_seq=seq)
    req.image.encoding = detect_pb2.Image.JPEG
    req.image.data = os.urandom(image_bytes)
    return req


def connected(broker: Broker, client_id: str, metrics: Optional[EdgeMetrics] = None, **kw) -> MqttConnection:
    conn = MqttConnection(broker.host, broker.port, client_id=client_id, metrics=metrics, **kw)
    conn.start()
    wait_until(conn.connected.is_set, 10, "the edge's MQTT connection")
    return conn


def refused_count(metrics: EdgeMetrics, topic: str, reason: str) -> float:
    value = metrics.registry.get_sample_value("edgewise_edge_mqtt_refused_total", {"topic": topic, "reason": reason})
    return value or 0.0


def warnings_with(caplog, text: str) -> List[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING and text in r.getMessage()]


async def first_answer(t: MqttTransport) -> detect_pb2.DetectResponse:
    """The first answer (the response subscription settles in the background)."""
    async def one():
        try:
            return await t.detect(request(0), 1.0)
        except TransportError:
            return None
    return await async_wait_until(one, 10, "a first answer over MQTT")


def test_an_escalation_over_the_brokers_maximum_packet_size_is_refused_before_it_is_sent(caplog):
    """Mosquitto with ``max_packet_size 10000`` announces it in CONNACK: a 20 KB request is
    refused at once (INVALID_ARGUMENT naming both sizes, not spoolable, counted), nothing is
    sent, so the connection stays up and the next request is answered. A message of exactly
    the limit goes through (the size is the whole PUBLISH packet), one byte more does not."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    with configured_mosquitto("max_packet_size 10000") as broker:
        responder = Responder(broker)
        metrics = EdgeMetrics()
        conn = connected(broker, "cam-1-size", metrics)
        try:
            assert conn.max_packet_size == 10000

            async def run():
                t = MqttTransport(conn, "cam-1")
                await t.start()
                await first_answer(t)
                big = request(1, 20_000)
                t0 = time.monotonic()
                with pytest.raises(TransportError) as ei:
                    await t.detect(big, 5.0)
                assert time.monotonic() - t0 < 1.0
                assert ei.value.status == detect_pb2.INVALID_ARGUMENT and not ei.value.spoolable
                assert "Maximum Packet Size of 10000 bytes" in ei.value.message
                assert f"{big.ByteSize()} bytes of payload" in ei.value.message
                assert "edgewise/cam-1/escalate" in ei.value.message
                resp = await t.detect(request(2), 5.0)  # same connection, still up
                assert resp.frame_seq == 2
                await t.close()
            asyncio.run(run())
            assert refused_count(metrics, "edgewise/cam-1/escalate", "packet_too_large") == 1
            assert conn.connected.is_set() and not warnings_with(caplog, "disconnected")

            topic = "edgewise/cam-1/size"
            fits = b"x" * (10000 - publish_packet_size(topic, b""))
            while publish_packet_size(topic, fits) > 10000:  # the length field grew by a byte
                fits = fits[:-1]
            assert publish_packet_size(topic, fits) == 10000
            answers: List[Optional[Refusal]] = []
            done = threading.Event()

            def answered(r: Optional[Refusal]) -> None:
                answers.append(r)
                done.set()
            conn.publish(topic, fits, on_done=answered)
            assert done.wait(5) and answers == [None]  # the broker took the packet of exactly 10000 bytes
            with pytest.raises(PublishRefused) as pi:
                conn.publish(topic, fits + b"x")
            assert pi.value.refusal.status == detect_pb2.INVALID_ARGUMENT
            assert not conn.client._out_messages  # nothing left for paho to send again
        finally:
            conn.stop()
            responder.close()


def test_a_puback_packet_too_large_is_a_refusal_not_a_reconnect_loop(caplog):
    """Mosquitto with ``message_size_limit 10000`` announces nothing and answers a larger
    message with PUBACK 0x95 "Packet too large" (a code MQTT 5.0 lists for CONNACK and
    DISCONNECT only). That fails the escalation at once, INVALID_ARGUMENT; the connection
    is not dropped and paho does not keep the message to send it again."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    with configured_mosquitto("message_size_limit 10000") as broker:
        responder = Responder(broker)
        metrics = EdgeMetrics()
        conn = connected(broker, "cam-1-limit", metrics)
        try:
            async def run():
                t = MqttTransport(conn, "cam-1")
                await t.start()
                await first_answer(t)
                t0 = time.monotonic()
                with pytest.raises(TransportError) as ei:
                    await t.detect(request(1, 20_000), 3.0)
                assert time.monotonic() - t0 < 1.0, ei.value
                assert ei.value.status == detect_pb2.INVALID_ARGUMENT and not ei.value.spoolable
                assert ei.value.message.startswith(
                    "broker refused publish to edgewise/cam-1/escalate: Packet too large; ")
                assert "message_size_limit" in ei.value.message
                assert (await t.detect(request(2), 5.0)).frame_seq == 2
                await t.close()
            asyncio.run(run())
            time.sleep(1.5)  # paho would have reconnected and sent it again by now
            assert conn.connected.is_set() and not warnings_with(caplog, "disconnected")
            assert not conn.client._out_messages
            assert refused_count(metrics, "edgewise/cam-1/escalate", "packet_too_large") == 1
        finally:
            conn.stop()
            responder.close()


def test_a_broker_that_takes_qos_0_only_is_a_refusal_not_a_reconnect_loop(caplog):
    """Mosquitto with ``max_qos 0`` announces a Maximum QoS of 0 and drops a client that
    publishes at QoS 1 ("QoS not supported"); paho would send the message again after every
    reconnect, once a second, for good. What paho held from before the broker's CONNACK (a
    record published while the broker was down, restarted with ``max_qos 0``) is dropped
    and settled as refused; later publishes are refused before they are sent: an escalation
    fails at once, UNAVAILABLE (spooled), the message naming ``max_qos``."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    with configured_mosquitto() as broker:
        metrics = EdgeMetrics()
        conn = connected(broker, "cam-1-qos0", metrics)
        try:
            broker.stop()
            wait_until(lambda: not conn.connected.is_set(), 10, "the broker gone")
            settled: List[Optional[Refusal]] = []
            done = threading.Event()
            conn.publish("edgewise/cam-1/detections", b"{}",
                         on_done=lambda r: (settled.append(r), done.set()))  # held by paho (no connection)
            broker.conf.write_text(broker.conf.read_text() + "max_qos 0\n")
            broker.start()
            assert done.wait(15), "the held record settled at the reconnect"
            assert settled[0] is not None and settled[0].code == 0x9B and "max_qos" in settled[0].message
            wait_until(conn.connected.is_set, 10, "the edge connected again")

            async def run():
                t = MqttTransport(conn, "cam-1")
                await t.start()
                with pytest.raises(TransportError) as ei:
                    await t.detect(request(1), 3.0)
                assert ei.value.status == detect_pb2.UNAVAILABLE and ei.value.spoolable
                assert "Maximum QoS of 0" in ei.value.message and "max_qos" in ei.value.message
                await t.close()
            asyncio.run(run())
            time.sleep(2.5)  # paho would have reconnected twice by now
            assert conn.connected.is_set() and not warnings_with(caplog, "QoS not supported);")
            assert not conn.client._out_messages
            assert refused_count(metrics, "edgewise/cam-1/escalate", "qos_not_supported") == 1
            assert refused_count(metrics, "edgewise/cam-1/detections", "qos_not_supported") == 1
        finally:
            conn.stop()


def test_a_frame_too_large_for_the_broker_keeps_its_edge_result_and_is_not_spooled(tmp_path):
    """Through ``Escalating``: the frame's record is its edge result with the reason
    (``outcome: edge_only``, INVALID_ARGUMENT), as for a message over gRPC's limit; the
    spool stays empty (a replay would be refused the same way)."""
    with configured_mosquitto("max_packet_size 10000") as broker:
        metrics = EdgeMetrics()
        conn = connected(broker, "cam-1-esc", metrics)
        spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
        written: List[FrameRecord] = []
        policy = parse_policy(policy_yaml("p", transport="mqtt", on_unavailable="spool"))
        noise = (np.random.default_rng(1).random((240, 320, 3)) * 255).astype(np.uint8)  # a JPEG of ~100 KB
        dets = Detections(boxes=np.zeros((0, 4), np.float32), scores=np.zeros(0, np.float32),
                          class_ids=np.zeros(0, np.int32), names=("a",), source="edge")

        async def run():
            t = MqttTransport(conn, "cam-1")
            esc = Escalating("cam-1", {"mqtt": t}, written.append, metrics, spool=spool, default_transport="mqtt")
            esc.submit(Frame("s", 1, noise, 0, 0.0), dets, Decision(True, "hard", 0.8, {}), policy,
                       frame_record("s", 1, device="cam-1"))
            await async_wait_until(lambda: written, 10, "the frame's record")
            await esc.drain(0.1)
            await esc.close()
            await t.close()
        try:
            asyncio.run(run())
        finally:
            conn.stop()
        rec = written[0]
        assert rec.outcome == "edge_only" and rec.error is not None, rec
        assert rec.error.startswith("INVALID_ARGUMENT: MQTT message to edgewise/cam-1/escalate is ")
        assert "Maximum Packet Size of 10000 bytes" in rec.error
        assert len(spool) == 0 and metrics.spool_events.labels("put")._value.get() == 0
        spool.close()


def test_an_acl_refusal_fails_the_escalation_at_once_as_unauthenticated(caplog):
    """The ACL does not let cam-1 publish its requests: the PUBACK "Not authorized" fails the
    escalation at once (not after the deadline) with the broker's reason, classified as gRPC's
    PERMISSION_DENIED is (UNAUTHENTICATED: a configuration problem, not spooled); logged and
    counted with the topic."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    acl = "pattern read edgewise/%u/response/#\npattern write edgewise/%u/detections\n"
    with configured_mosquitto(users={"cam-1": "pw"}, acl=acl) as broker:
        metrics = EdgeMetrics()
        conn = connected(broker, "cam-1-acl", metrics, username="cam-1", password="pw")
        try:
            async def run():
                t = MqttTransport(conn, "cam-1")
                await t.start()
                t0 = time.monotonic()
                with pytest.raises(TransportError) as ei:
                    await t.detect(request(1), 5.0)
                assert time.monotonic() - t0 < 1.0
                await t.close()
                return ei.value
            err = asyncio.run(run())
        finally:
            conn.stop()
    assert err.status == detect_pb2.UNAUTHENTICATED and not err.spoolable
    assert err.message.startswith("broker refused publish to edgewise/cam-1/escalate: Not authorized; "
                                  "check the broker's ACL for this device"), err.message
    assert refused_count(metrics, "edgewise/cam-1/escalate", "not_authorized") == 1
    assert any(m.startswith("broker refused publish to edgewise/cam-1/escalate: Not authorized")
               for m in warnings_with(caplog, "Not authorized"))


def test_an_unreachable_broker_is_a_warning_with_its_cause_and_a_gauge(caplog):
    """A closed port and a host name that does not resolve: a WARNING with the cause and
    host:port (throttled), ``edgewise_edge_mqtt_connected`` 0, and the escalation's error
    says why; once a broker listens there the gauge turns 1."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    port = free_port()
    metrics = EdgeMetrics()
    conn = MqttConnection("127.0.0.1", port, client_id="cam-1-down", metrics=metrics)
    typo = MqttConnection("broker-typo.invalid", 1883, client_id="cam-1-typo", metrics=EdgeMetrics())
    gauge = lambda: metrics.registry.get_sample_value("edgewise_edge_mqtt_connected")  # noqa: E731
    conn.start()
    typo.start()
    try:
        wait_until(lambda: warnings_with(caplog, f"127.0.0.1:{port} cannot be reached"), 10, "the warning")
        wait_until(lambda: warnings_with(caplog, "broker-typo.invalid:1883 cannot be reached"), 10, "the warning")
        (down,) = warnings_with(caplog, f"127.0.0.1:{port} cannot be reached")[:1]
        assert "ConnectionRefusedError" in down and "check cloud.mqtt.host, cloud.mqtt.port" in down
        assert "gaierror" in warnings_with(caplog, "broker-typo.invalid:1883")[0]
        assert gauge() == 0

        async def escalate():
            t = MqttTransport(conn, "cam-1")
            with pytest.raises(TransportError) as ei:
                await t.detect(request(1), 1.0)
            await t.close()
            return ei.value
        err = asyncio.run(escalate())
        assert err.status == detect_pb2.UNAVAILABLE and "ConnectionRefusedError" in err.message
        time.sleep(3.5)  # paho retries after 1, 2 s ...: a few warnings a minute at most
        assert len(warnings_with(caplog, f"127.0.0.1:{port}")) <= 3
        with configured_mosquitto(port=port):
            wait_until(conn.connected.is_set, 40, "the connection once the broker listens")
            assert gauge() == 1
    finally:
        conn.stop()
        typo.stop()
    assert gauge() == 0


def test_the_connected_gauge_is_in_step_before_the_connected_event_changes():
    """A test waiting for ``connected`` read the gauge still 0 now and then (the event was set
    first, the gauge a moment later, on paho's thread): the gauge goes first, both ways, so
    whoever sees the event sees the gauge agree."""
    metrics = EdgeMetrics()
    conn = MqttConnection("127.0.0.1", 1, client_id="cam-1-gauge", metrics=metrics)
    seen: List[tuple] = []
    gauge = conn.metrics.connected

    class Spy:
        def set(self, value: float) -> None:
            seen.append((value, conn.connected.is_set()))
            gauge.set(value)

    conn.metrics.connected = Spy()
    conn._set_connected(True)
    conn._set_connected(False)
    assert seen == [(1, False), (0, True)]  # each written while the event still said the old state
    assert metrics.registry.get_sample_value("edgewise_edge_mqtt_connected") == 0


def test_a_subscription_made_while_the_connection_comes_up_is_not_left_for_the_next_reconnect():
    """``subscribe`` from another thread after the CONNACK handler took its list of topics but
    before it said connected: neither sent the SUBSCRIBE, and the topic (an MqttTransport's
    responses, started just after the connection) waited for a reconnect, every escalation
    timing out meanwhile. The handler looks again once connected."""
    from types import SimpleNamespace

    conn = MqttConnection("127.0.0.1", 1, client_id="cam-1-late-topic")
    sent: List[str] = []
    conn.subscribe("edgewise/cam-1/early", lambda msg: None)  # before the connection: sent in CONNACK

    def subscribe(client, topic: str) -> None:
        sent.append(topic)
        if len(sent) == 1:  # the other thread, at the worst moment
            conn.subscribe("edgewise/cam-1/response/late", lambda msg: None)

    conn._subscribe = subscribe
    conn._on_connect(conn.client, None, SimpleNamespace(session_present=False),
                     SimpleNamespace(is_failure=False), None)
    assert conn.connected.is_set()
    assert sent == ["edgewise/cam-1/early", "edgewise/cam-1/response/late"]
    conn.subscribe("edgewise/cam-1/after", lambda msg: None)  # once connected: subscribe sends it itself
    assert sent[-1] == "edgewise/cam-1/after" and len(sent) == 3


def test_a_session_taken_over_by_the_same_client_id_is_a_clear_warning(caplog):
    """Two edges with one client id knock each other off on every reconnect (Mosquitto 2.0
    closes the older connection without a reason; MQTT 5.0 brokers may say "Session taken
    over"); each says so, naming the id and the likely cause, a couple of times a minute,
    not every second."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    with configured_mosquitto() as broker:
        a = connected(broker, "cam-1-twin")
        b = MqttConnection(broker.host, broker.port, client_id="cam-1-twin")
        b.start()
        try:
            wait_until(lambda: warnings_with(caplog, "same client id"), 15, "the takeover warning")
            time.sleep(4)  # they keep taking the session from each other meanwhile
        finally:
            a.stop()
            b.stop()
    takeovers = warnings_with(caplog, "same client id")
    assert "client id 'cam-1-twin'" in takeovers[0] and "give each its own client id" in takeovers[0]
    assert len(takeovers) <= 4, takeovers  # two connections, at most two each a minute
    assert len(warnings_with(caplog, "disconnected from")) <= 6  # three each a minute


def _restart(broker: Broker, conn: MqttConnection, down_s: float) -> None:
    """Stop the broker, keep it down ``down_s``, start it again; wait for ``conn`` to reconnect."""
    broker.stop()
    wait_until(lambda: not conn.connected.is_set(), 5, "the edge noticing the broker went away")
    time.sleep(down_s)
    broker.start()
    wait_until(conn.connected.is_set, 15, "the edge's reconnect")


def test_a_broker_restarted_three_times_is_not_called_a_client_id_clash(caplog):
    """Mosquitto 2.0 closes every connection without a DISCONNECT when it stops, as it closes the older
    connection of a client id another client takes: a broker restarted three times within 10 s made the
    edge warn "most likely another client connected with the same client id" (found by a probe). A
    quick restart (back before the first reconnect) says both causes, not a clash; a restart the edge
    saw (a connection attempt failed: the broker was away) is no such run at all."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    with configured_mosquitto() as broker:
        conn = connected(broker, "cam-1-restarts")
        try:
            for _ in range(3):  # down past the reconnect: a failed attempt in between
                _restart(broker, conn, RECONNECT_DELAY_S[0] + 0.5)
            assert warnings_with(caplog, "cannot be reached")
            assert not warnings_with(caplog, "times in a row"), warnings_with(caplog, "times in a row")
            for _ in range(3):  # back before the reconnect (1 s): all the edge sees is a silent close
                _restart(broker, conn, 0.0)
            runs = warnings_with(caplog, "times in a row within seconds of accepting it")
            assert len(runs) == 1 and "closed its connection 3 times" in runs[0], runs
            assert "the broker was restarted" in runs[0] and "if the broker was not restarting" in runs[0]
        finally:
            conn.stop()
    assert not warnings_with(caplog, "another client connected with the same client id")
    assert not warnings_with(caplog, "most likely another client")


def test_the_daemons_client_id_is_unique_per_start_and_its_connection_is_measured(tmp_path, mosquitto):
    """Two daemons from one copied configuration (in a container both are PID 1) must not
    share a client id: the device id plus a random suffix, a valid topic level (the
    response topic ends with it); the daemon's registry exports the connection gauge."""
    from edge.daemon import EdgeDaemon
    from edge.settings import load_settings
    from tests.edge.helpers import settings_yaml

    ids = {MqttConnection.unique_client_id("cam-1") for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch(r"cam-1-[0-9a-f]{8}", i) for i in ids)
    assert all(mqtt_topics.check_segment(i, "client id") for i in ids)
    settings = load_settings(str(settings_yaml(
        tmp_path / "edge.yaml", device_id="cam-1",
        cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}},
        streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
        model={"path": str(tmp_path / "unused.onnx")}, spool={"path": str(tmp_path / "spool.db")},
        metrics={"port": -1})), env={})

    async def build():
        d = EdgeDaemon(settings)
        await d._build_transports()
        d.mqtt.start()  # the daemon starts it once the sinks are made
        return d
    daemons = [asyncio.run(build()) for _ in range(2)]
    try:
        for d in daemons:
            wait_until(d.mqtt.connected.is_set, 10, "the daemon's MQTT connection")
            assert re.fullmatch(r"cam-1-[0-9a-f]{8}", d.mqtt.client_id), d.mqtt.client_id
            assert d.metrics.registry.get_sample_value("edgewise_edge_mqtt_connected") == 1
        assert daemons[0].mqtt.client_id != daemons[1].mqtt.client_id
        assert daemons[0].mqtt.connected.is_set()  # not taken over by the second one
    finally:
        for d in daemons:
            d.mqtt.stop()


def test_with_the_mqtt_sink_the_client_id_is_kept_in_its_outbox_and_the_session_outlives_a_restart(tmp_path):
    """The MQTT sink completes its QoS 2 exchanges after a restart (``tests/edge/test_mqtt_sink_restart.py``):
    that needs the same client id and a session the broker keeps. The id is made once per
    outbox (another outbox, another id; a renamed device, a new one)."""
    from edge.daemon import EdgeDaemon
    from edge.settings import load_settings
    from edge.transports.mqtt import SESSION_EXPIRY_S
    from tests.edge.helpers import settings_yaml

    def daemon(name: str, device: str = "cam-1"):
        settings = load_settings(str(settings_yaml(
            tmp_path / f"{name}.yaml", device_id=device, sinks={"mqtt": True},
            cloud={"mqtt": {"host": "127.0.0.1", "port": 1}},
            streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
            model={"path": str(tmp_path / "unused.onnx")}, spool={"path": str(tmp_path / name / "spool.db")},
            metrics={"port": -1})), env={})
        d = EdgeDaemon(settings)

        async def start() -> None:  # the daemon's own start: the outbox keeps a new id before connecting
            d.stop_event = asyncio.Event()
            await d._build_transports()
            await d._start_mqtt()
        asyncio.run(start())
        d.mqtt.stop()
        d.outbox.close()
        return d.mqtt

    first, again, other = daemon("a"), daemon("a"), daemon("b")
    assert re.fullmatch(r"cam-1-[0-9a-f]{8}", first.client_id), first.client_id
    assert again.client_id == first.client_id and other.client_id != first.client_id
    assert first.session_expiry_s == SESSION_EXPIRY_S
    renamed = daemon("a", device="cam-2")
    assert re.fullmatch(r"cam-2-[0-9a-f]{8}", renamed.client_id), renamed.client_id


def test_a_refused_subscription_to_the_answers_fails_escalations_at_once_and_is_tried_again(caplog):
    """The broker's ACL (Mosquitto's dynamic security) does not let the device read its
    answers: the SUBACK says Not authorized. The edge logged an ERROR and went on sending every
    escalation, each timing out and spooled, its replay the same, until a reconnect: also after
    the operator allowed it at run time. Now one ERROR names the topic, the reason and the
    retry; an escalation meanwhile fails UNAVAILABLE at once, not sent (spooled, no uplink
    spent on it); and once allowed the edge subscribes again by itself and gets its answers."""
    from tests.conftest import dynsec_mosquitto

    def dynsec(ctrl: List[str], *args: str) -> None:
        subprocess.run([*ctrl, *args], check=True, capture_output=True, timeout=10)

    caplog.set_level(logging.INFO, logger="edge.transports.mqtt")
    with dynsec_mosquitto() as (broker, ctrl):
        for args in (("createClient", "cam-1", "-p", "pass-1"), ("createRole", "device"),
                     ("addRoleACL", "device", "publishClientSend", "edgewise/cam-1/escalate", "allow"),
                     ("addClientRole", "cam-1", "device"),
                     ("createClient", "cloud", "-p", "cloud-pass"), ("createRole", "cloud"),
                     ("addRoleACL", "cloud", "subscribePattern", "edgewise/+/escalate", "allow"),
                     ("addRoleACL", "cloud", "publishClientSend", "edgewise/+/response/#", "allow"),
                     ("addClientRole", "cloud", "cloud")):
            dynsec(ctrl, *args)
        responder = Responder(broker, "cloud", "cloud-pass")
        conn = MqttConnection(broker.host, broker.port, client_id="cam-1-0a1b2c3d", username="cam-1",
                              password="pass-1")
        conn.resubscribe_s = 0.5

        async def run() -> None:
            t = MqttTransport(conn, "cam-1")
            await t.start()
            conn.start()
            await async_wait_until(lambda: t.response_topic in conn.refused, 10, "the refused SUBACK")
            await asyncio.sleep(1.2)  # subscribed again twice meanwhile, refused each time
            with pytest.raises(TransportError) as ei:
                await t.detect(request(1), 5.0)
            assert ei.value.status == detect_pb2.UNAVAILABLE and not ei.value.sent and ei.value.spoolable
            assert f"refused the subscription to {t.response_topic} (Not authorized)" in ei.value.message
            await asyncio.get_running_loop().run_in_executor(None, lambda: dynsec(
                ctrl, "addRoleACL", "device", "subscribePattern", "edgewise/cam-1/response/#", "allow"))
            await async_wait_until(lambda: not conn.refused, 10, "subscribed once allowed, without a restart")
            assert (await t.detect(request(2), 5.0)).frame_seq == 2
            await t.close()

        try:
            asyncio.run(run())
        finally:
            conn.stop()
            responder.close()
    (line,) = [m for m in said(caplog.records, "edge.transports.mqtt") if "refused the subscription" in m]
    assert line.startswith(f"MQTT broker 127.0.0.1:{broker.port} refused the subscription to "
                           "edgewise/cam-1/response/cam-1-0a1b2c3d (Not authorized)"), line
    assert "escalations are spooled until it is granted" in line and "subscribing again every 0.5 s" in line
    assert "ACL must let this device's user read it" in line
    assert conn._subscribing == {} and conn._resubscribe is None


class SubackFirst:
    """paho, as its network thread may handle a SUBACK: before ``subscribe`` has returned the
    packet identifier to the thread that subscribed (a timer's, or the event loop's; paho's
    thread sends the SUBSCRIBE and reads the broker's answer meanwhile)."""

    def __init__(self, conn: MqttConnection, code: int) -> None:
        self.conn, self.code, self.mid = conn, code, 6

    def subscribe(self, topic: str, qos: int = 0) -> tuple:
        from paho.mqtt.reasoncodes import ReasonCode

        self.mid += 1
        paho = threading.Thread(target=self.conn._on_subscribe, args=(
            self, None, self.mid, [ReasonCode(PacketTypes.SUBACK, identifier=self.code)], None))
        paho.start()
        paho.join(5)
        return mqtt.MQTT_ERR_SUCCESS, self.mid

    def disconnect(self) -> None:
        pass

    def loop_stop(self) -> None:
        pass


def test_a_suback_handled_before_subscribe_returned_is_the_subscriptions(caplog):
    """The subscription to the answers was refused; the retry (a timer's thread) is granted,
    and paho's thread handles that SUBACK before ``subscribe`` returned its packet identifier.
    The SUBACK went to topic "?": the refusal stayed noted with nothing left to retry it, and
    every escalation failed at once, not sent, until a reconnect, though the broker granted the
    subscription. A refusal that came that early (``subscribe`` from the event loop) was not
    noted at all, and said of "?"."""
    topic = "edgewise/cam-1/response/cam-1-0a1b2c3d"
    conn = MqttConnection("broker.example", 1883, client_id="cam-1-0a1b2c3d")
    conn.resubscribe_s = 3600.0
    conn.client = SubackFirst(conn, 1)  # granted QoS 1
    conn.subscriptions[topic] = lambda msg: None
    conn.refused[topic] = "Not authorized"
    conn.connected.set()
    try:
        conn._subscribe_again()
        assert conn.refused == {} and conn._subscribing == {}
        conn.client.code = 0x87  # Not authorized
        other = "edgewise/cam-1/response/other"
        with caplog.at_level("ERROR", logger="edge.transports.mqtt"):
            conn.subscribe(other, lambda msg: None)
        assert conn.refused == {other: "Not authorized"} and conn._subscribing == {}
        (line,) = said(caplog.records, "edge.transports.mqtt")
        assert f"refused the subscription to {other} (Not authorized)" in line, line
    finally:
        conn.stop()
    assert conn._resubscribe is None


class SizedResponder(Responder):
    """A responder that answers request ``seq`` with ``payloads[seq]`` (raw bytes), and the
    others with an OK ``DetectResponse``."""

    def __init__(self, broker: Broker, payloads: Dict[int, bytes]) -> None:
        self.payloads = payloads
        super().__init__(broker)

    def _answer(self, c, u, msg):
        req = detect_pb2.DetectRequest.FromString(msg.payload)
        if req.frame_seq not in self.payloads:
            return super()._answer(c, u, msg)
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = msg.properties.CorrelationData
        c.publish(msg.properties.ResponseTopic, self.payloads[req.frame_seq], qos=1, properties=props)


def test_the_edge_announces_the_largest_answer_it_takes_and_the_broker_sends_it_nothing_larger(monkeypatch, caplog):
    """The edge announced no Maximum Packet Size in its CONNECT, so a broker sent it packets of
    any size MQTT allows (256 MiB: whoever may publish to its response topic could make it read
    and hold that much). It announces ``receive_limit()``: the largest answer
    (``MAX_ANSWER_BYTES``, made small here so the test sends little) and room for the headers.
    Mosquitto keeps a larger packet from it: that escalation times out (a spoolable failure),
    the connection stays up and the next answers come. A packet of exactly the limit is
    delivered, and refused for its size with its reason, as before."""
    import edge.transports.mqtt as M

    monkeypatch.setattr(M, "MAX_ANSWER_BYTES", 4096)
    limit = M.receive_limit()
    assert limit == 4096 + M.ANSWER_HEADER_ROOM
    caplog.set_level(logging.INFO, logger=LOGGER)
    with configured_mosquitto() as broker:  # no limits of its own: 256 MiB
        conn = connected(broker, "cam-1-rx")
        assert conn.receive_limit == limit
        topic = mqtt_topics.response_topic("edgewise", "cam-1", conn.client_id)

        def payload_of_packet(size: int) -> bytes:
            """Bytes whose answer is a PUBLISH packet of ``size`` bytes (16 bytes of correlation data)."""
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = b"c" * 16
            data = b"\0" * (size - publish_packet_size(topic, b"", props))
            while publish_packet_size(topic, data, props) > size:  # the length field grew
                data = data[:-1]
            assert publish_packet_size(topic, data, props) == size
            return data

        # limit + 2: Mosquitto 2.0 measures a packet without its first byte (packet__check_oversize),
        # so it still sends one of limit + 1
        responder = SizedResponder(broker, {1: payload_of_packet(limit), 2: payload_of_packet(limit + 2)})
        try:
            async def run():
                t = MqttTransport(conn, "cam-1")
                await t.start()
                await first_answer(t)
                with pytest.raises(TransportError) as at_limit:  # delivered, refused for its size
                    await t.detect(request(1), 5.0)
                with pytest.raises(TransportError) as over:  # not delivered at all
                    await t.detect(request(2), 2.0)
                after = await t.detect(request(3), 5.0)
                await t.close()
                return at_limit.value, over.value, after
            at_limit, over, after = asyncio.run(run())
        finally:
            conn.stop()
            responder.close()
    assert at_limit.status == detect_pb2.INVALID_ARGUMENT, at_limit
    assert "over the 4096 bytes an answer may have" in at_limit.message
    assert over.status == detect_pb2.DEADLINE_EXCEEDED and over.spoolable, over
    assert after.frame_seq == 3
    assert not warnings_with(caplog, "disconnected")


#: ``edgewise_edge_mqtt_refused_total``'s reasons: every PUBACK/PUBREC failure code, Mosquitto's
#: Packet too large, the edge's own QoS refusal
REFUSAL_REASONS = ("unspecified_error", "implementation_specific_error", "not_authorized", "topic_name_invalid",
                   "packet_identifier_in_use", "packet_too_large", "quota_exceeded", "payload_format_invalid",
                   "qos_not_supported")


def test_refusals_start_at_zero_for_every_topic_the_edge_publishes_to(tmp_path):
    """Its series appeared at the first refusal, at 1, which has no increase() in Prometheus: the
    first escalation or record a broker's ACL refused never fired ``increase(...[15m]) > 0``."""
    from edge.outbox import Outbox
    from edge.sinks import MqttSink

    metrics = EdgeMetrics()
    conn = MqttConnection("127.0.0.1", 1, client_id="cam-1-abc", metrics=metrics)  # never started
    MqttTransport(conn, "cam-1")
    sink = MqttSink(conn, mqtt_topics.detections_topic("edgewise", "cam-1"), Outbox(tmp_path / "outbox.db", 10),
                    metrics)
    try:
        for topic in ("edgewise/cam-1/escalate", "edgewise/cam-1/detections"):
            for reason in REFUSAL_REASONS:
                assert metrics.registry.get_sample_value(
                    "edgewise_edge_mqtt_refused_total", {"topic": topic, "reason": reason}) == 0, (topic, reason)
        # a connection measured after its publishers noted their topics (the sink's order) exports them too
        later = EdgeMetrics()
        conn2 = MqttConnection("127.0.0.1", 1, client_id="cam-2-abc")
        MqttTransport(conn2, "cam-2")
        conn2.measure(later)
        assert later.registry.get_sample_value(
            "edgewise_edge_mqtt_refused_total", {"topic": "edgewise/cam-2/escalate", "reason": "not_authorized"}) == 0
    finally:
        sink.close()
    # the labels exported are the ones a refusal counts under, for each code the edge acts on
    from edge.transports.mqtt import REFUSAL_CODES, refusal
    from edgewise.mqtt_client import _reason

    for code in REFUSAL_CODES:
        for packet in (PacketTypes.PUBACK, PacketTypes.PUBREC):
            assert refusal("t", _reason(packet, code)).label in REFUSAL_REASONS
    assert len(REFUSAL_CODES) == len(REFUSAL_REASONS)
    from edge.transports import mqtt as mqtt_module
    assert set(mqtt_module._GRPC_OF_REASON) | set(mqtt_module._HINTS) <= set(REFUSAL_CODES)
