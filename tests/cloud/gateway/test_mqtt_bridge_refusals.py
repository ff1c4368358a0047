"""The gateway's MQTT bridge when a real Mosquitto refuses it: an ACL without write access
to the devices' response topics (the refused answers are counted and logged, naming the
topic and the reason), an ACL that refuses the bridge's subscription (Mosquitto's dynamic
security answers the SUBACK with Not authorized; its ``acl_file`` grants such a subscription
and delivers nothing), and two gateways sharing one ``mqtt.client_id`` (reported as such)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import threading
import uuid

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from cloud.gateway.server import Gateway
from edgewise.v1 import detect_pb2
from tests.cloud.gateway.test_gateway import run, settings_for
from tests.cloud.gateway.test_mqtt_bridge import Edge
from tests.cloud.gateway.workers import TestWorker, request
from tests.conftest import Broker, dynsec_mosquitto
from tests.edge.transports.test_mqtt_refusals import configured_mosquitto
from tests.waiting import async_wait_until as wait_until

LOGGER = "edgewise.gateway.mqtt"
USERS = {"edgewise-gateway": "gw-pass", "cam-1": "pass-1"}


def warnings_with(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.WARNING and text in r.getMessage()]


def errors_with(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == LOGGER and r.levelno == logging.ERROR and text in r.getMessage()]


class AclEdge(Edge):
    """The plain paho edge of ``test_mqtt_bridge``, logged in as cam-1."""

    def __init__(self, host: str, port: int) -> None:
        self.responses: dict[bytes, list[detect_pb2.DetectResponse]] = {}
        self.lock = threading.Lock()
        self.reply_topic = f"edgewise/cam-1/response/{uuid.uuid4().hex[:8]}"
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"cam-1-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)
        self.c.username_pw_set("cam-1", USERS["cam-1"])
        self.ready = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(self.reply_topic, qos=1)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.ready.set()
        self.c.on_message = self._on_message
        self.c.connect(host, port)
        self.c.loop_start()
        assert self.ready.wait(10)


def test_answers_the_broker_refuses_are_counted_and_logged(caplog):
    """The ACL gives the gateway's user read on the requests but no write on
    ``edgewise/+/response/#``: each answer's PUBACK says Not authorized; the bridge counts
    ``response_refused`` and says which topic, why and what to fix."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    acl = ("user edgewise-gateway\ntopic read edgewise/+/escalate\n\n"
           "pattern write edgewise/%u/escalate\npattern read edgewise/%u/response/#\n")

    async def main(broker):
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{
            "mqtt.enabled": True, "mqtt.host": broker.host, "mqtt.port": broker.port,
            "mqtt.username": "edgewise-gateway", "mqtt.password": USERS["edgewise-gateway"]}))
        await gw.start()
        bridge = gw.bridge
        assert bridge is not None
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(AclEdge, broker.host, broker.port)
            try:
                for seq in range(2):
                    await asyncio.to_thread(edge.send, request(seq=seq).SerializeToString(), f"c{seq}".encode())
                await wait_until(lambda: bridge.counts.get("response_refused") == 2, 15, "2 refused answers")
                assert w.calls == 2 and edge.responses == {}
                sample = gw.metrics.registry.get_sample_value(
                    "edgewise_gateway_mqtt_messages_total", {"result": "response_refused"})
                assert sample == 2
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()

    with configured_mosquitto(users=USERS, acl=acl) as broker:
        run(main(broker))
    (first, *_) = warnings_with(caplog, "broker refused publish to edgewise/cam-1/response/")
    assert ": Not authorized; check the broker's ACL" in first
    assert "needs write access to edgewise/+/response/#" in first


def test_two_gateways_with_one_client_id_are_reported(caplog):
    """Two gateways with the same ``mqtt.client_id`` take the session from each other on
    every reconnect; the bridge names the id and the setting, a couple of times a minute."""
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def main(broker):
        w = TestWorker("a", 0.005)
        await w.start()
        mq = {"mqtt.enabled": True, "mqtt.host": broker.host, "mqtt.port": broker.port,
              "mqtt.client_id": "gw-same", "mqtt.reconnect_min_s": 0.5, "mqtt.reconnect_max_s": 1}
        gws = [Gateway(settings_for([(w, 1)], **mq)) for _ in range(2)]
        for gw in gws:
            await gw.start()
        try:
            await wait_until(lambda: warnings_with(caplog, "same client id"), 20, "the takeover warning")
            await asyncio.sleep(3)  # they keep knocking each other off meanwhile
        finally:
            for gw in gws:
                await gw.stop(1)
            await w.stop()

    with configured_mosquitto() as broker:
        run(main(broker))
    takeovers = warnings_with(caplog, "same client id")
    assert "client id 'gw-same'" in takeovers[0] and "mqtt.client_id" in takeovers[0]
    assert len(takeovers) <= 4, takeovers


def test_a_broker_restarted_three_times_is_not_called_a_client_id_clash(caplog):
    """Mosquitto 2.0 closes every connection without a DISCONNECT when it stops, as it closes the older
    connection of a client id another client takes: a broker restarted three times within 10 s made the
    bridge warn "most likely another client connected with the same client id, another gateway with
    the same mqtt.client_id" (found by a probe). Restarts the bridge saw (a connection attempt failed:
    the broker was away) are no such run; quick ones (back before the reconnect) say both causes."""
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def restart(broker, gw, down_s: float) -> None:
        broker.stop()
        await wait_until(lambda: not gw.bridge.connected.is_set(), 5, "the bridge noticing the broker went away")
        await asyncio.sleep(down_s)
        broker.start()
        await wait_until(gw.bridge.connected.is_set, 15, "the bridge's reconnect")

    async def main(broker):
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{"mqtt.enabled": True, "mqtt.host": broker.host,
                                               "mqtt.port": broker.port, "mqtt.reconnect_min_s": 1,
                                               "mqtt.reconnect_max_s": 1}))
        await gw.start()
        try:
            await wait_until(gw.bridge.connected.is_set, 10, "the bridge's connection")
            for _ in range(3):  # down past the reconnect (1 s): a failed attempt in between
                await restart(broker, gw, 1.5)
            assert warnings_with(caplog, "cannot connect to the broker")
            assert not warnings_with(caplog, "times in a row"), warnings_with(caplog, "times in a row")
            for _ in range(3):  # back before the reconnect: all the bridge sees is a silent close
                await restart(broker, gw, 0.0)
        finally:
            await gw.stop(1)
            await w.stop()

    with configured_mosquitto() as broker:
        run(main(broker))
    runs = warnings_with(caplog, "times in a row within seconds of accepting it")
    assert len(runs) == 1 and "closed its connection 3 times" in runs[0], runs
    assert "the broker was restarted" in runs[0] and "if the broker was not restarting" in runs[0]
    assert not warnings_with(caplog, "another client connected with the same client id")
    assert not warnings_with(caplog, "most likely another")


def test_a_refused_subscription_is_an_error_naming_it_and_is_retried(caplog):
    """The broker's ACL does not let the gateway's user subscribe to the requests: the SUBACK
    says Not authorized. The bridge logs one ERROR naming the subscription, the reason, the
    user and what to allow; once the operator allows it (at run time) the bridge subscribes
    again by itself and serves requests, without a restart."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    from cloud.gateway.settings import MqttSettings

    # the group the bridge derives from its password (no device can name it)
    group = MqttSettings(username="edgewise-gateway", password=USERS["edgewise-gateway"]).share_group()
    subscription = f"$share/{group}/edgewise/+/escalate"

    async def main(broker: Broker, ctrl: list[str]) -> None:
        def dynsec(*args: str) -> None:
            subprocess.run([*ctrl, *args], check=True, capture_output=True, timeout=10)

        for args in (("createClient", "edgewise-gateway", "-p", USERS["edgewise-gateway"]),
                     ("createRole", "gateway"),
                     ("addRoleACL", "gateway", "publishClientSend", "edgewise/+/response/#", "allow"),
                     ("addClientRole", "edgewise-gateway", "gateway"),
                     ("createClient", "cam-1", "-p", USERS["cam-1"]),
                     ("createRole", "device"),
                     ("addRoleACL", "device", "publishClientSend", "edgewise/cam-1/escalate", "allow"),
                     ("addRoleACL", "device", "subscribePattern", "edgewise/cam-1/response/#", "allow"),
                     ("addClientRole", "cam-1", "device")):
            await asyncio.to_thread(dynsec, *args)
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{
            "mqtt.enabled": True, "mqtt.host": broker.host, "mqtt.port": broker.port,
            "mqtt.username": "edgewise-gateway", "mqtt.password": USERS["edgewise-gateway"],
            "mqtt.reconnect_min_s": 0.5, "mqtt.reconnect_max_s": 1}))
        await gw.start()
        bridge = gw.bridge
        assert bridge is not None
        try:
            await wait_until(lambda: errors_with(caplog, "refused the bridge's subscription"), 15, "the error")
            await asyncio.sleep(2.5)  # the bridge subscribes again every second meanwhile, and is refused
            assert not bridge.connected.is_set()
            assert gw.metrics.registry.get_sample_value("edgewise_gateway_mqtt_connected") == 0
            await asyncio.to_thread(dynsec, "addRoleACL", "gateway", "subscribePattern", subscription, "allow")
            await wait_until(bridge.connected.is_set, 10, "the bridge subscribed once allowed")
            edge = await asyncio.to_thread(AclEdge, broker.host, broker.port)
            try:
                await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"after")
                await wait_until(lambda: b"after" in edge.responses, 10, "the answer")
                assert edge.responses[b"after"][0].status == detect_pb2.OK
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()

    with dynsec_mosquitto() as (broker, ctrl):
        run(main(broker, ctrl))
    (error,) = errors_with(caplog, "refused the bridge's subscription")
    assert f"refused the bridge's subscription to {subscription} (Not authorized)" in error
    assert "no MQTT escalation reaches this gateway" in error
    assert "the gateway's MQTT user ('edgewise-gateway') subscribe to it" in error
    assert f"subscribePattern {subscription}" in error and "subscribes again every 1 s" in error
