"""The gateway's MQTT bridge against a real Mosquitto with ``max_qos 0``: its CONNACK announces a
Maximum QoS of 0, and the bridge needs QoS 1 (the broker's PUBACK is how a refused answer is known).

Before the fix the bridge did not read the Maximum QoS: it subscribed at QoS 1 (Mosquitto granted
QoS 0 and delivered QoS 0 requests), served them, and published each answer at QoS 1; Mosquitto
dropped the connection ("QoS not supported"), paho reconnected after ``mqtt.reconnect_min_s`` and
sent the same answer again, once a second, for good. The only line was a throttled WARNING
"disconnected ... (QoS not supported) ... the broker's log says why"; the answer was counted as
answered and never arrived."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cloud.gateway.mqtt_bridge import MqttBridge
from cloud.gateway.server import Gateway
from edgewise.v1 import detect_pb2
from tests.cloud.gateway.test_gateway import run
from tests.cloud.gateway.test_mqtt_bridge import Edge, bridged_gateway
from tests.cloud.gateway.workers import TestWorker, request
from tests.conftest import Broker, configured_mosquitto
from tests.waiting import async_wait_until as wait_until

LOGGER = "edgewise.gateway.mqtt"
#: how long the bridge is watched for a reconnect loop (the old one reconnected every second)
QUIET_S = 3.0


def _records(caplog: Any, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == level and text in r.getMessage()]


def _count(gw: Gateway, result: str) -> float:
    return gw.metrics.registry.get_sample_value("edgewise_gateway_mqtt_messages_total", {"result": result}) or 0.0


class _Sessions:
    """Every CONNACK and disconnect of the bridge's client, as they happen (paho's thread)."""

    def __init__(self, bridge: MqttBridge) -> None:
        self.events: list[str] = []
        on_connect, on_disconnect = bridge.client.on_connect, bridge.client.on_disconnect
        assert on_connect is not None and on_disconnect is not None

        def connected(*args: Any) -> None:
            self.events.append("connect")
            on_connect(*args)

        def disconnected(*args: Any) -> None:
            self.events.append(f"disconnect {args[3]}")
            on_disconnect(*args)

        bridge.client.on_connect = connected
        bridge.client.on_disconnect = disconnected


class _QosZeroEdge:
    """A client that publishes its request at QoS 0 (the one QoS such a broker takes)."""

    def __init__(self, broker: Broker) -> None:
        self.reply_topic = f"edgewise/cam-1/response/{uuid.uuid4().hex[:8]}"
        self.answers: list[bytes] = []
        self.ready = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edge0-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(self.reply_topic, qos=0)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.ready.set()
        self.c.on_message = lambda c, u, msg: self.answers.append(msg.payload)
        self.c.connect(broker.host, broker.port)
        self.c.loop_start()
        assert self.ready.wait(10)

    def send(self) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = b"q0"
        self.c.publish("edgewise/cam-1/escalate", request(seq=1).SerializeToString(), qos=0,
                       properties=props).wait_for_publish(5)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_a_broker_that_takes_qos_0_only_is_one_error_and_no_subscription(caplog):
    """From the first CONNACK: one ERROR naming ``max_qos`` and what to set, no subscription (a
    QoS 0 request is neither taken nor forwarded), the connection kept (no reconnect loop) and
    ``edgewise_gateway_mqtt_connected`` 0."""
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def main(broker: Broker) -> None:
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(broker, w)
        bridge = gw.bridge
        assert bridge is not None
        sessions = _Sessions(bridge)
        edge = None
        try:
            await wait_until(lambda: _records(caplog, logging.ERROR, "max_qos"), 15, "the max_qos error")
            assert bridge.max_qos == 0
            edge = await asyncio.to_thread(_QosZeroEdge, broker)
            await asyncio.to_thread(edge.send)
            await asyncio.sleep(QUIET_S)
            assert w.calls == 0 and edge.answers == [] and bridge.counts == {}
            assert not bridge.connected.is_set()
            assert gw.metrics.registry.get_sample_value("edgewise_gateway_mqtt_connected") == 0
            assert bridge.client.is_connected() and not any(e.startswith("disconnect") for e in sessions.events)
        finally:
            if edge is not None:
                edge.close()
            await gw.stop(1)
            await w.stop()

    with configured_mosquitto("max_qos 0") as broker:
        run(main(broker))
    (error,) = _records(caplog, logging.ERROR, "max_qos")
    assert "takes QoS 0 only" in error and "without subscribing $share/edgewise-gateway/edgewise/+/escalate" in error
    assert "set max_qos 1, or remove it" in error and "restart the broker" in error
    assert not _records(caplog, logging.WARNING, "disconnected")


@pytest.mark.parametrize("answer", ["held by paho", "finished after the CONNACK"])
def test_answers_a_broker_restarted_with_qos_0_cannot_take_are_counted_not_resent(caplog, answer):
    """A request is in the worker when the broker goes down and comes back with ``max_qos 0``.
    Its answer, whether paho holds it from before the CONNACK (published while the broker was
    down) or it is finished after, is not published: counted ``response_refused`` and logged,
    never sent again on every reconnect. One ERROR; once the broker takes QoS 1 again the bridge
    subscribes and answers."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    held = answer == "held by paho"

    async def main(broker: Broker) -> None:
        w = TestWorker("a", 1.0 if held else 4.0)  # 4 s: the bridge is back well before it answers
        await w.start()
        gw = await bridged_gateway(broker, w)
        bridge = gw.bridge
        assert bridge is not None
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, broker.host, broker.port)
            try:
                await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"lost")
                await wait_until(lambda: w.calls == 1, 10, "the request in the worker")
            finally:
                edge.close()
            await asyncio.to_thread(broker.stop)
            if held:  # the answer is handed to paho while the broker is down
                await wait_until(lambda: bridge.counts.get("answered") == 1, 10, "the answer")
            broker.conf.write_text(broker.conf.read_text() + "max_qos 0\n")
            await asyncio.to_thread(broker.start)
            await wait_until(lambda: _records(caplog, logging.ERROR, "max_qos"), 15, "the max_qos error")
            sessions = _Sessions(bridge)
            await wait_until(lambda: bridge.counts.get("response_refused") == 1, 10, "the answer refused")
            await asyncio.sleep(QUIET_S)
            assert sessions.events == [] and bridge.client.is_connected()  # no reconnect loop
            assert bridge.counts.get("answered") == 1 and _count(gw, "response_refused") == 1
            if not held:  # finished after the CONNACK: never handed to paho. (Handed to it while the broker
                assert "publish_failed" not in bridge.counts  # was down, it fails only once paho has noticed.)
            assert not bridge.connected.is_set()

            await asyncio.to_thread(broker.stop)  # the operator removes max_qos and restarts the broker
            broker.conf.write_text(broker.conf.read_text().replace("max_qos 0\n", ""))
            await asyncio.to_thread(broker.start)
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed again")
            assert bridge.max_qos == 2
            edge = await asyncio.to_thread(Edge, broker.host, broker.port)
            try:
                await asyncio.to_thread(edge.send, request(seq=2).SerializeToString(), b"after")
                await wait_until(lambda: b"after" in edge.responses, 10, "the answer after")
                assert edge.responses[b"after"][0].status == detect_pb2.OK
                assert b"lost" not in edge.responses
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()

    with configured_mosquitto() as broker:
        run(main(broker))
    (error,) = _records(caplog, logging.ERROR, "max_qos")
    assert "takes QoS 0 only" in error and "set max_qos 1, or remove it" in error
    if held:
        assert "answers it held, not published: 1 (response_refused)" in error
    (lost,) = _records(caplog, logging.WARNING, "not published")
    assert lost.startswith("answer to edgewise/cam-1/response/") and "takes QoS 0 only (Mosquitto max_qos)" in lost
    assert not _records(caplog, logging.WARNING, "QoS not supported")
    assert _records(caplog, logging.INFO, "takes QoS 2 now: the bridge subscribes")
