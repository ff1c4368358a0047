"""MQTT security end to end: a real Mosquitto with the shipped ACL (deploy/mosquitto) and a
password per device, a real gateway process bridging to a real worker (tiny model), and the
edge's own MQTT transport. Tokens ride in the MQTT v5 User Property and are checked like
gRPC metadata; a device can neither send as another device nor read its answers; a request
asking for its answer on another device's topic gets nothing published there."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from cloud.local import LocalCloud
from edge.transports import TransportError
from edge.transports.mqtt import MqttConnection, MqttTransport
from edgewise.v1 import detect_pb2
from edgewise.wire import encode_image
from tests.conftest import configured_mosquitto
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
ACL = ROOT / "deploy" / "mosquitto" / "edgewise-acl.conf"
USERS = {"edgewise-gateway": "gw-pass", "cam-1": "pass-1", "cam-2": "pass-2"}
TOKENS = [{"device": "cam-1", "token": "tok-1"}, {"device": "cam-2", "token": "tok-2"}]


@pytest.fixture
def acl_broker():
    """Mosquitto with no anonymous clients, a password per user and the shipped ACL file."""
    with configured_mosquitto(users=USERS, acl=ACL.read_text()) as broker:
        yield broker.port


class Spy:
    """A raw MQTT v5 client logged in as ``user``, subscribed to ``filters``."""

    def __init__(self, port: int, user: str, filters: list[str]) -> None:
        self.got: list[tuple[str, bytes]] = []
        self.acks: dict[int, str] = {}
        self.ready = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{user}-spy-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)
        self.c.username_pw_set(user, USERS[user])
        self.c.on_connect = lambda c, u, f, rc, p: [c.subscribe(t, options=SubscribeOptions(qos=1))
                                                    for t in filters]
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.ready.set()
        self.c.on_message = lambda c, u, m: self.got.append((m.topic, bytes(m.payload)))
        self.c.on_publish = lambda c, u, mid, rc, p: self.acks.__setitem__(mid, str(rc))
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        assert self.ready.wait(10)

    def request(self, topic: str, req: detect_pb2.DetectRequest, response_topic: str, token: str = "") -> int:
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = response_topic
        props.CorrelationData = uuid.uuid4().bytes
        if token:
            props.UserProperty = [("authorization", f"Bearer {token}")]
        info = self.c.publish(topic, req.SerializeToString(), qos=1, properties=props)
        info.wait_for_publish(5)
        return info.mid

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def frame(device: str, seq: int) -> detect_pb2.DetectRequest:
    img = (np.random.default_rng(seq).random((120, 160, 3)) * 255).astype(np.uint8)
    cv2.putText(img, "7", (50, 90), cv2.FONT_HERSHEY_SIMPLEX, 2.5, (255, 255, 255), 6)
    return detect_pb2.DetectRequest(device_id=device, stream_id="s", frame_seq=seq, trace_id=f"t{seq}",
                                    image=encode_image(img, "jpeg"))


def mqtt_counts(cloud: LocalCloud) -> dict[str, float]:
    out = {}
    for line in cloud.metrics_text().splitlines():
        if line.startswith("edgewise_gateway_mqtt_messages_total{"):
            out[line.split('result="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def wait_for(cond, timeout: float = 20.0) -> bool:
    return bool(wait_until(cond, timeout, "the condition"))


def test_mqtt_tokens_acl_and_response_topics(acl_broker, tiny_model):
    port = acl_broker
    gateway = {"mqtt.enabled": True, "mqtt.host": "127.0.0.1", "mqtt.port": port,
               "mqtt.username": "edgewise-gateway", "mqtt.password": USERS["edgewise-gateway"],
               "mqtt.group": "gw", "auth.tokens": TOKENS}
    with LocalCloud(tiny_model, workers=1, gateway_settings=gateway) as cloud:
        spy2 = Spy(port, "cam-2", ["edgewise/#", "$share/evil/edgewise/+/escalate"])

        def edge(client: str, token: str) -> tuple[MqttConnection, MqttTransport]:
            conn = MqttConnection("127.0.0.1", port, client_id=client, username="cam-1",
                                  password=USERS["cam-1"])
            conn.start()
            assert conn.connected.wait(10)
            return conn, MqttTransport(conn, "cam-1", token=token)

        async def detect(t: MqttTransport, seq: int, timeout: float = 10.0) -> detect_pb2.DetectResponse | TransportError:
            await t.start()
            try:
                return await t.detect(frame("cam-1", seq), timeout)
            except TransportError as exc:
                return exc

        conn, good = edge("cam-1-a", "tok-1")
        conn_b, no_token = edge("cam-1-b", "")
        conn_c, wrong = edge("cam-1-c", "tok-2")
        try:
            # the bridge joins the shared subscription in the background: first answer proves it
            resp = None
            for seq in range(20):
                resp = asyncio.run(detect(good, seq, 2.0))
                if isinstance(resp, detect_pb2.DetectResponse):
                    break
            assert isinstance(resp, detect_pb2.DetectResponse), resp
            assert resp.status == detect_pb2.OK and resp.worker_id and resp.model_name
            err = asyncio.run(detect(no_token, 100))
            assert isinstance(err, TransportError) and err.status == detect_pb2.UNAUTHENTICATED
            assert "Bearer" in err.message
            err = asyncio.run(detect(wrong, 101))  # cam-2's token on cam-1's topic and id
            assert isinstance(err, TransportError) and err.status == detect_pb2.UNAUTHENTICATED
            assert "bad token for device 'cam-1'" in err.message
            before = mqtt_counts(cloud)

            # cam-1 (allowed to publish its own requests) asks for the answer on cam-2's topics
            spy1 = Spy(port, "cam-1", ["edgewise/cam-1/response/#"])
            spy1.request("edgewise/cam-1/escalate", frame("cam-1", 200), "edgewise/cam-2/detections", "tok-1")
            spy1.request("edgewise/cam-1/escalate", frame("cam-1", 201), "edgewise/cam-2/response/x", "tok-1")
            assert wait_for(lambda: mqtt_counts(cloud).get("foreign_response_topic", 0)
                            - before.get("foreign_response_topic", 0) == 2)
            # cam-2 sends as cam-1 (topic and id): the broker refuses, the gateway never sees it
            mid = spy2.request("edgewise/cam-1/escalate", frame("cam-1", 300), "edgewise/cam-2/response/x",
                               "tok-2")
            assert wait_for(lambda: mid in spy2.acks) and spy2.acks[mid] == "Not authorized"
            # a control request after both: once it is answered, the others had their chance
            spy1.request("edgewise/cam-1/escalate", frame("cam-1", 400), "edgewise/cam-1/response/spy", "tok-1")
            assert wait_for(lambda: any(t == "edgewise/cam-1/response/spy" for t, _ in spy1.got))
            after = mqtt_counts(cloud)
            handled = sum(after.values()) - sum(before.values())
            assert handled == 3, (before, after)  # two foreign-topic refusals and the control
            # cam-2 saw nothing of cam-1's requests or answers, and nothing was published to it
            assert spy2.got == [], spy2.got
            spy1.close()
        finally:
            for c in (conn, conn_b, conn_c):
                c.stop()
            spy2.close()


def test_a_device_cannot_join_the_gateways_shared_subscription(acl_broker, tiny_model):
    """Mosquitto's acl_file does not check SUBSCRIBE: a device joined the gateways' shared
    subscription under the default group's public name, the broker gave it its turn of every
    device's requests, the ACL denied it them, and they were dropped: with 3 such sessions 16
    of 20 requests went unanswered (found by a probe). With no group set, the gateways' group
    is derived from their broker credential, which no device has: the old public names take
    nothing away."""
    port = acl_broker
    gateway = {"mqtt.enabled": True, "mqtt.host": "127.0.0.1", "mqtt.port": port,
               "mqtt.username": "edgewise-gateway", "mqtt.password": USERS["edgewise-gateway"],
               "auth.tokens": TOKENS}
    with LocalCloud(tiny_model, workers=1, gateway_settings=gateway) as cloud:
        names = ("edgewise-gateway", "edgewise-gateways")  # the gateway's and the chart's former defaults
        spies = [Spy(port, "cam-2", [f"$share/{g}/edgewise/+/escalate" for g in names]) for _ in range(3)]
        conn = MqttConnection("127.0.0.1", port, client_id="cam-1-a", username="cam-1", password=USERS["cam-1"])
        conn.start()
        assert conn.connected.wait(10)
        transport = MqttTransport(conn, "cam-1", token="tok-1")

        async def detect_all(n: int) -> list:
            await transport.start()
            out = []
            for seq in range(n):
                try:
                    out.append(await transport.detect(frame("cam-1", seq), 3.0))
                except TransportError as exc:
                    out.append(exc)
            return out

        try:
            wait_until(lambda: "edgewise_gateway_mqtt_connected 1.0" in cloud.metrics_text(), 20,
                       "the bridge's subscription")
            results = asyncio.run(detect_all(20))
            answered = [r for r in results if isinstance(r, detect_pb2.DetectResponse) and r.status == detect_pb2.OK]
            assert len(answered) == 20, [r for r in results if r not in answered][:3]
            assert not any(s.got for s in spies)
        finally:
            for s in spies:
                s.c.loop_stop()
                s.c.disconnect()
            conn.stop()
