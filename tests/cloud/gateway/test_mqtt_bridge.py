"""MQTT v5 bridge with a real Mosquitto broker and two gateway replicas sharing the subscription."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from cloud.gateway.server import Gateway
from edgewise.v1 import detect_pb2
from tests.cloud.gateway.test_gateway import run, settings_for
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import async_wait_until as wait_until


class Edge:
    """A plain paho MQTT v5 client playing the edge: request/response with correlation data."""

    def __init__(self, host: str, port: int, reply_topic: str = "") -> None:
        self.responses: dict[bytes, list[detect_pb2.DetectResponse]] = {}
        self.lock = threading.Lock()
        self.reply_topic = reply_topic or f"edgewise/cam-1/response/{uuid.uuid4().hex[:8]}"
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edge-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)
        self.ready = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: (c.subscribe(self.reply_topic, options=SubscribeOptions(qos=1)))
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.ready.set()
        self.c.on_message = self._on_message
        self.c.connect(host, port)
        self.c.loop_start()
        assert self.ready.wait(10)

    def _on_message(self, c, u, msg):
        corr = msg.properties.CorrelationData
        with self.lock:
            self.responses.setdefault(corr, []).append(detect_pb2.DetectResponse.FromString(msg.payload))

    def send(self, payload: bytes, corr: bytes, device: str = "cam-1", reply: bool = True,
             reply_topic: str = "", token: str = "", retain: bool = False, expiry_s: int = 0) -> None:
        props = Properties(PacketTypes.PUBLISH)
        if reply:
            props.ResponseTopic = reply_topic or self.reply_topic
        props.CorrelationData = corr
        if expiry_s:
            props.MessageExpiryInterval = expiry_s
        if token:
            props.UserProperty = [("authorization", f"Bearer {token}")]
        self.c.publish(f"edgewise/{device}/escalate", payload, qos=1, properties=props,
                       retain=retain).wait_for_publish(5)

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


async def bridged_gateway(broker, w: TestWorker, **settings: object) -> Gateway:
    """A started gateway routing to ``w``, its MQTT bridge on ``broker`` (reconnecting within
    0.5-1 s); ``settings`` add to or override those."""
    gw = Gateway(settings_for([(w, 1)], **{
        "mqtt.enabled": True, "mqtt.host": broker.host, "mqtt.port": broker.port,
        "mqtt.reconnect_min_s": 0.5, "mqtt.reconnect_max_s": 1, **settings}))
    await gw.start()
    assert gw.bridge is not None
    return gw



def topics_handled(bridge) -> list[str]:
    """The topics of the messages the bridge has handled so far (on paho's thread), in order."""
    seen: list[str] = []
    handle = bridge._on_message

    def counting(client, userdata, msg):
        handle(client, userdata, msg)
        seen.append(msg.topic)

    bridge.client.on_message = counting
    return seen

def test_two_replicas_share_the_subscription(mosquitto):
    async def main():
        workers = [(TestWorker("a", 0.01, concurrency=4), 1), (TestWorker("b", 0.01, concurrency=4), 1)]
        for w, _ in workers:
            await w.start()
        mq = {"mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port,
              "mqtt.group": "g1"}
        gws = [Gateway(settings_for(workers, **mq, **{"mqtt.client_id": f"gw{i}"})) for i in range(2)]
        for gw in gws:
            await gw.start()
        await wait_until(lambda: all(gw.bridge.connected.is_set() for gw in gws), 15, "both bridges subscribed")
        edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
        try:
            n = 40
            for i in range(n):
                await asyncio.to_thread(edge.send, request(seq=i).SerializeToString(), f"c{i}".encode())
            await asyncio.to_thread(edge.send, b"\x07\x07not a protobuf\xff", b"bad")
            await asyncio.to_thread(edge.send, request(device="cam-2", seq=99).SerializeToString(), b"spoof")
            await asyncio.to_thread(edge.send, request(seq=98).SerializeToString(), b"noreply", "cam-1", False)
            # every request handled (a duplicate answer would be counted on top)
            await wait_until(lambda: len(edge.responses) >= n + 2 and sum(
                sum(gw.bridge.counts.values()) for gw in gws) >= n + 3, 15, "all n + 3 requests handled")
            with edge.lock:
                got = dict(edge.responses)
            for i in range(n):
                answers = got[f"c{i}".encode()]
                assert len(answers) == 1, (i, answers)  # answered exactly once
                assert answers[0].status == detect_pb2.OK and answers[0].frame_seq == i
            bad = got[b"bad"][0]
            assert bad.status == detect_pb2.INVALID_ARGUMENT and "not a serialized DetectRequest" in bad.error
            assert got[b"spoof"][0].status == detect_pb2.UNAUTHENTICATED
            assert b"noreply" not in got
            per_replica = [gw.bridge.counts.get("answered", 0) for gw in gws]
            assert sum(per_replica) == n and all(c > 0 for c in per_replica), per_replica
            assert sum(gw.bridge.counts.get("malformed", 0) for gw in gws) == 1
            assert sum(gw.bridge.counts.get("no_response_topic", 0) for gw in gws) == 1
            assert Counter(w.calls > 0 for w, _ in workers)[True] == 2
        finally:
            edge.close()
            for gw in gws:
                await gw.stop(1)
            for w, _ in workers:
                await w.stop()
    run(main())


def test_bridge_survives_broker_restart(mosquitto):
    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{
            "mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port,
            "mqtt.reconnect_min_s": 0.5, "mqtt.reconnect_max_s": 1}))
        await gw.start()
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            await asyncio.to_thread(mosquitto.stop)
            await wait_until(lambda: not gw.bridge.connected.is_set(), 15, "the disconnect")
            await asyncio.to_thread(mosquitto.start)
            await wait_until(gw.bridge.connected.is_set, 20, "the bridge subscribed again")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            try:
                await asyncio.to_thread(edge.send, request(seq=5).SerializeToString(), b"after")
                await wait_until(lambda: b"after" in edge.responses)
                assert edge.responses[b"after"][0].status == detect_pb2.OK
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_a_retained_request_is_never_answered_again(mosquitto):
    """A request published with the retain flag stays in the broker, token and all, and
    Mosquitto delivers it to the bridge's shared subscription at every subscribe: each
    reconnect answered it again (found by a probe). The bridge subscribes asking for no
    retained messages, and drops one a broker delivers anyway."""
    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
        gw = None
        try:
            await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"kept", retain=True)
            for _ in range(2):  # two subscribes: a start, and a restart of the bridge
                gw = await bridged_gateway(mosquitto, w)
                await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
                await asyncio.to_thread(edge.send, request(seq=2).SerializeToString(), b"live")
                await wait_until(lambda: b"live" in edge.responses)
                await asyncio.sleep(0.5)
                assert b"kept" not in edge.responses and w.calls == 1
                assert "retained" not in gw.bridge.counts  # the broker kept it back (Retain Handling 2)
                await gw.stop(1)
                gw, w.calls = None, 0
                edge.responses.clear()
            gw = await bridged_gateway(mosquitto, w)
            msg = mqtt.MQTTMessage(topic=b"edgewise/cam-1/escalate")
            msg.payload, msg.retain = request(seq=3).SerializeToString(), True
            msg.properties = Properties(PacketTypes.PUBLISH)
            msg.properties.ResponseTopic, msg.properties.CorrelationData = edge.reply_topic, b"anyway"
            gw.bridge._accept(msg)  # a broker that delivers it anyway
            await asyncio.sleep(0.5)
            assert gw.bridge.counts.get("retained") == 1 and w.calls == 0 and not edge.responses
        finally:
            if gw is not None:
                await gw.stop(1)
            await asyncio.to_thread(edge.close)
            await w.stop()
    run(main())


def test_tokens_and_the_operators_response_pattern(mosquitto):
    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{
            "mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port,
            "mqtt.response_topic_pattern": "replies/{device}/#",
            "auth.tokens": [{"device": "cam-1", "token": "tok"}]}))
        await gw.start()
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port, "replies/cam-1/r")
            try:
                req = request(seq=1).SerializeToString()
                await asyncio.to_thread(edge.send, req, b"ok", token="tok")
                await asyncio.to_thread(edge.send, req, b"none")
                # the default subtree is not allowed once the operator set a pattern
                await asyncio.to_thread(edge.send, req, b"default", reply_topic="edgewise/cam-1/response/x",
                                        token="tok")
                await wait_until(lambda: {b"ok", b"none"} <= set(edge.responses))
                await wait_until(lambda: gw.bridge.counts.get("foreign_response_topic") == 1)
                assert edge.responses[b"ok"][0].status == detect_pb2.OK
                assert edge.responses[b"none"][0].status == detect_pb2.UNAUTHENTICATED
                assert w.calls == 1
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_a_payload_over_the_message_limit_is_refused_before_any_worker(mosquitto):
    """gRPC refuses a message over ``limits.max_message_bytes`` itself; MQTT brings any size
    to the bridge, which must refuse it the same way (not forward it, and not let the worker's
    channel refusal count as the worker's overload)."""
    from tests.cloud.gateway.test_gateway import _padded

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{
            "mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port,
            "limits.max_message_bytes": 64 * 1024, "limits.max_image_bytes": 64 * 1024}))
        await gw.start()
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            try:
                await asyncio.to_thread(edge.send, _padded(request(seq=1), 100 * 1024), b"big")
                await asyncio.to_thread(edge.send, request(seq=2).SerializeToString(), b"ok")
                await wait_until(lambda: {b"big", b"ok"} <= set(edge.responses))
                big = edge.responses[b"big"][0]
                assert big.status == detect_pb2.INVALID_ARGUMENT
                assert "max_message_bytes" in big.error and str(64 * 1024) in big.error
                assert edge.responses[b"ok"][0].status == detect_pb2.OK
                assert w.calls == 1 and gw.bridge.counts.get("malformed") == 1
                assert gw.pool.balancer.endpoints[w.address].overload_cap is None
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_the_broker_keeps_a_huge_request_from_the_bridge(mosquitto):
    """Mosquitto forwards up to 256 MB by default, and the bridge held each such request three
    times over (paho's buffer, the payload, a copy) before refusing it: one device could run the
    gateway out of memory. The bridge's CONNECT announces a Maximum Packet Size of twice
    ``limits.max_message_bytes`` and 1 MiB, so the broker discards a larger request (its edge
    times out); one a little over the limit is still answered INVALID_ARGUMENT (above)."""
    from cloud.gateway.mqtt_bridge import receive_limit
    from tests.cloud.gateway.test_gateway import _padded

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(mosquitto, w, **{"limits.max_message_bytes": 64 * 1024,
                                                    "limits.max_image_bytes": 64 * 1024})
        try:
            assert gw.bridge.receive_limit == receive_limit(64 * 1024) == 2 * 64 * 1024 + (1 << 20)
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            try:
                await asyncio.to_thread(edge.send, _padded(request(seq=1), gw.bridge.receive_limit), b"huge")
                await asyncio.to_thread(edge.send, _padded(request(seq=2), 100 * 1024), b"over")
                await asyncio.to_thread(edge.send, request(seq=3).SerializeToString(), b"ok")
                await wait_until(lambda: {b"over", b"ok"} <= set(edge.responses))
                await asyncio.sleep(0.3)
                assert b"huge" not in edge.responses and sum(gw.bridge.counts.values()) == 2
                assert edge.responses[b"over"][0].status == detect_pb2.INVALID_ARGUMENT
                assert edge.responses[b"ok"][0].status == detect_pb2.OK and w.calls == 1
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_a_broker_that_does_not_answer_is_logged_and_exported(caplog):
    """No broker at mqtt.host:port: the gateway serves gRPC, says the bridge cannot connect
    (it retries with backoff) and exports edgewise_gateway_mqtt_connected 0."""
    import socket

    from tests.cloud.gateway.test_gateway import http_get

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{"mqtt.enabled": True, "mqtt.host": "127.0.0.1", "mqtt.port": port}))
        await gw.start()
        try:
            await wait_until(lambda: gw.bridge.counts.get("connect_failed", 0) >= 1, 15, "a failed connection")
            # (paho's thread counts the failure, then logs it)
            await wait_until(lambda: any(f"cannot connect to the broker at 127.0.0.1:{port}" in r.getMessage() and
                                         "mqtt.host and mqtt.port" in r.getMessage() for r in caplog.records),
                             5, "the warning")
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            assert "edgewise_gateway_mqtt_connected 0.0" in text
            assert gw.serving
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_the_connected_gauge_follows_the_broker(mosquitto):
    from tests.cloud.gateway.test_gateway import http_get

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{"mqtt.enabled": True, "mqtt.host": mosquitto.host,
                                               "mqtt.port": mosquitto.port}))
        await gw.start()
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            assert "edgewise_gateway_mqtt_connected 1.0" in text
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_one_device_cannot_take_every_slot_a_refused_caller_is_told_so_and_the_edges_deadline_holds(mosquitto):
    """Found by a probe of the MQTT path:
    - one device flooding the bridge took all of `mqtt.max_in_flight`, and every other device
      was answered RESOURCE_EXHAUSTED (over gRPC it was served);
    - while the bridge was full, a request with no valid token was told RESOURCE_EXHAUSTED
      (spooled, replayed) where gRPC says UNAUTHENTICATED;
    - the edge's deadline (its Message Expiry Interval) was ignored: every request got the
      gateway's 5 s default."""
    import time

    async def main():
        w = TestWorker("slow", 4.0, concurrency=16)
        await w.start()
        gw = await bridged_gateway(mosquitto, w, **{
            "mqtt.max_in_flight": 4, "mqtt.max_in_flight_per_device": 2,
            "auth.tokens": [{"device": "cam-1", "token": "t1"}, {"device": "cam-2", "token": "t2"}]})
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            one = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            two = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port, "edgewise/cam-2/response/r")
            try:
                for i in range(3):
                    await asyncio.to_thread(one.send, request("cam-1", i).SerializeToString(), b"one%d" % i,
                                            token="t1")
                await wait_until(lambda: b"one2" in one.responses, 10, "the third request of cam-1 answered")
                third = one.responses[b"one2"][0]
                assert third.status == detect_pb2.RESOURCE_EXHAUSTED
                assert "device 'cam-1' has 2 requests in flight over MQTT" in third.error
                for i in range(2):  # cam-2 still gets its share: the bridge is now full (4 of 4)
                    await asyncio.to_thread(two.send, request("cam-2", i).SerializeToString(), b"two%d" % i,
                                            device="cam-2", token="t2")
                await wait_until(lambda: w.calls == 4, 10, "both devices' requests at the worker")
                assert len(gw.bridge._pending) == 4  # full: the stranger meets the overload check
                await asyncio.to_thread(two.send, request("cam-2", 9).SerializeToString(), b"stranger",
                                        device="cam-2", token="wrong")
                await wait_until(lambda: b"stranger" in two.responses, 10, "the refused caller answered")
                assert two.responses[b"stranger"][0].status == detect_pb2.UNAUTHENTICATED
                await wait_until(lambda: w.calls == 4 and not gw.bridge._pending, 15, "the slow requests done")
                t0 = time.monotonic()  # a request whose edge waits 1 s is given up at the gateway after 1 s
                await asyncio.to_thread(one.send, request("cam-1", 7).SerializeToString(), b"short", token="t1",
                                        expiry_s=1)
                await wait_until(lambda: b"short" in one.responses, 10, "the expiring request answered")
                assert one.responses[b"short"][0].status == detect_pb2.DEADLINE_EXCEEDED
                assert time.monotonic() - t0 < 2.5
            finally:
                one.close()
                two.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_requests_that_fail_authentication_on_a_devices_topic_take_none_of_its_slots(mosquitto):
    """A client that may publish on cam-1's request topic (a broker that does not confine devices
    to their own topics) floods it with requests whose token is wrong or missing. Each took one of
    cam-1's ``mqtt.max_in_flight_per_device`` slots until the gateway's event loop refused it, so
    while the loop was behind the flood cam-1's own request was answered RESOURCE_EXHAUSTED, and
    the refusals met at the full bridge were not counted by the bridge at all (found by a probe).
    The token is checked before any slot is taken: cam-1 is served, each refusal is answered
    UNAUTHENTICATED and counted as one. The gateway's loop is held while the bridge takes the
    flood (a loop behind a flood, made certain), and let go once all of it reached the bridge."""
    import time

    from tests.cloud.gateway.test_gateway import http_get

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(mosquitto, w, **{
            "mqtt.max_in_flight_per_device": 2, "auth.tokens": [{"device": "cam-1", "token": "t1"}]})
        bridge = gw.bridge
        seen = topics_handled(bridge)
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            cam = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            liar = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port, "edgewise/cam-1/response/liar")
            try:
                def flood_then_the_device() -> None:  # (on the gateway's loop, which it holds)
                    for i in range(6):
                        liar.send(request(seq=100 + i).SerializeToString(), b"liar%d" % i,
                                  token="wrong" if i % 3 else "")
                    cam.send(request(seq=1).SerializeToString(), b"cam", token="t1")
                    deadline = time.monotonic() + 10
                    while len(seen) < 7 and time.monotonic() < deadline:
                        time.sleep(0.01)
                    assert len(seen) == 7, seen

                flood_then_the_device()
                await wait_until(lambda: b"cam" in cam.responses and len(liar.responses) == 6, 10, "all answered")
                answer = cam.responses[b"cam"][0]
                assert answer.status == detect_pb2.OK, answer.error
                for i in range(6):
                    refused = liar.responses[b"liar%d" % i][0]
                    assert refused.status == detect_pb2.UNAUTHENTICATED, (i, refused.error)
                assert w.calls == 1
                assert bridge.counts.get("error_answered") == 6 and bridge.counts.get("answered") == 1, bridge.counts
                assert "overloaded" not in bridge.counts
                await wait_until(lambda: not bridge._per_device, 5, "no slot held")
                text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
                assert 'edgewise_gateway_rejected_total{reason="unauthenticated"} 6.0' in text
                assert 'edgewise_gateway_requests_total{status="UNAUTHENTICATED",transport="mqtt"} 6.0' in text
            finally:
                cam.close()
                liar.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_both_transports_word_a_bad_token_and_an_oversize_request_alike(mosquitto):
    """The same input over gRPC and over MQTT: a token that is no device's was "bad token: it is
    no device's" over gRPC and "unknown device or bad token for device 'cam-1'" over MQTT; a
    request over ``limits.max_message_bytes`` was gRPC's "Received message larger than max (N vs.
    M)" and the bridge's "request of N bytes is larger than ...". One rule each now
    (``admission.bad_token``, ``admission.oversize``): the same words, the device named where the
    gateway knows it, and the same status as the edge reads it."""
    import grpc

    from edgewise import status
    from tests.cloud.gateway.test_gateway import _padded

    limit = 64 * 1024

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(mosquitto, w, **{
            "auth.tokens": [{"device": "cam-1", "token": "t1"}],
            "limits.max_message_bytes": limit, "limits.max_image_bytes": limit})
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            big = _padded(request(seq=2), 100 * 1024)
            try:
                await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"bad", token="wrong")
                await asyncio.to_thread(edge.send, big, b"big", token="t1")
                await wait_until(lambda: {b"bad", b"big"} <= set(edge.responses), 10, "both answered")
            finally:
                edge.close()
            over_mqtt = {k: edge.responses[k][0] for k in (b"bad", b"big")}
            over_grpc = {}
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                detect = ch.unary_unary("/edgewise.v1.Escalation/Detect")
                for key, body, md in ((b"bad", request(seq=1).SerializeToString(), (("authorization", "Bearer wrong"),)),
                                      (b"bad-named", request(seq=1).SerializeToString(),
                                       (("authorization", "Bearer wrong"), ("x-edgewise-device", "cam-1"))),
                                      (b"big", big, (("authorization", "Bearer t1"),))):
                    try:
                        await detect(body, metadata=md, timeout=5)
                    except grpc.aio.AioRpcError as exc:
                        over_grpc[key] = (exc.code(), exc.details())
            bad = over_mqtt[b"bad"]
            assert bad.status == detect_pb2.UNAUTHENTICATED
            assert over_grpc[b"bad-named"] == (grpc.StatusCode.UNAUTHENTICATED, bad.error)
            assert over_grpc[b"bad"] == (grpc.StatusCode.UNAUTHENTICATED, bad.error.replace(" for device 'cam-1'", ""))
            code, details = over_grpc[b"big"]
            size = f"message larger than max ({len(big)} vs. {limit}"
            assert size in details and size in over_mqtt[b"big"].error, (details, over_mqtt[b"big"].error)
            assert status.from_grpc(code, details) == over_mqtt[b"big"].status == detect_pb2.INVALID_ARGUMENT
            assert w.calls == 0
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_a_request_of_100000_user_properties_does_not_hold_up_the_others(mosquitto):
    """paho read them in time growing with the square of their number: one such request, from a
    device without a valid token, held the bridge's network thread for 18 s before any check,
    and every other device waited (found by a probe). It is read no further than 64 properties
    and refused, counted and answered INVALID_ARGUMENT (its response topic is among the first
    ones), and the next request is answered at once."""
    import time

    from paho.mqtt.properties import VariableByteIntegers

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(mosquitto, w)
        try:
            await wait_until(gw.bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            try:
                def text(t: str) -> bytes:
                    return len(t).to_bytes(2, "big") + t.encode()

                body = (b"\x08" + text(edge.reply_topic) + b"\x09" + text("flood")
                        + b"".join(b"\x26" + text(f"k{i}") + text("v") for i in range(100_000)))
                packet = (b"\x32" + VariableByteIntegers.encode(len(text("edgewise/cam-1/escalate")) + 2 + len(
                    VariableByteIntegers.encode(len(body))) + len(body) + 4) + text("edgewise/cam-1/escalate")
                    + b"\x00\x07" + VariableByteIntegers.encode(len(body)) + body + b"\x00" * 4)
                sock = edge.c.socket()  # the raw PUBLISH (QoS 1, mid 7): paho would take minutes to pack it
                await asyncio.to_thread(sock.sendall, packet)
                t0 = time.monotonic()
                await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"next")
                await wait_until(lambda: b"next" in edge.responses, 10, "the next request answered")
                assert time.monotonic() - t0 < 3.0
                await wait_until(lambda: gw.bridge.counts.get("too_many_properties") == 1, 10, "the flood refused")
                # told why on its response topic, read among the first properties (it went unanswered)
                await wait_until(lambda: b"flood" in edge.responses, 10, "the flood answered")
                flood = edge.responses[b"flood"][0]
                assert flood.status == detect_pb2.INVALID_ARGUMENT and "more than 64 properties" in flood.error
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def _deliver(bridge, reply_topic: str, seq: int, corr: bytes) -> None:
    """A request handed to the bridge as paho's network thread hands one over."""
    msg = mqtt.MQTTMessage(topic=b"edgewise/cam-1/escalate")
    msg.payload = request(seq=seq).SerializeToString()
    msg.properties = Properties(PacketTypes.PUBLISH)
    msg.properties.ResponseTopic = reply_topic
    msg.properties.CorrelationData = corr
    bridge._on_message(bridge.client, None, msg)


def test_a_request_delivered_after_the_drain_is_answered_unavailable_not_lost(mosquitto):
    """stop() unsubscribes, then serves what comes and waits for the requests in flight. A request
    that reaches paho after stop() has taken its last look at them (the broker quiet for
    DRAIN_QUIET_S after its UNSUBACK, or the grace over; a broker's stray delivery, one paho hands
    over late) was once served with nothing waiting for it, and the bridge disconnected when the
    others were done, so its answer never went out and the edge learnt nothing until its own
    deadline. It is answered UNAVAILABLE at once (the edge spools it), and stop() leaves nothing
    running."""
    async def main():
        w = TestWorker("slow", 1.0, concurrency=4)
        await w.start()
        gw = await bridged_gateway(mosquitto, w)
        bridge = gw.bridge
        edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"early")
            await wait_until(lambda: w.calls == 1, 10, "the first request at the worker")
            real_flushed = bridge._flushed

            async def deliver_then_flush() -> None:  # after the last look, before the disconnect
                assert bridge._closed
                await asyncio.to_thread(_deliver, bridge, edge.reply_topic, 3, b"while-waiting")
                await real_flushed()
            bridge._flushed = deliver_then_flush
            await bridge.stop(5)
            assert not bridge._pending  # nothing left running after stop()
            await wait_until(lambda: all(c in edge.responses for c in (b"early", b"while-waiting")), 10,
                             "every request answered")
            assert edge.responses[b"early"][0].status == detect_pb2.OK  # in flight before stop: finished
            answer = edge.responses[b"while-waiting"][0]
            assert answer.status == detect_pb2.UNAVAILABLE and "gateway is shutting down" in answer.error
            assert w.calls == 1
            assert bridge.counts.get("error_answered") == 1 and bridge.counts.get("answered") == 1
        finally:
            edge.close()
            await gw.stop(1)
            await w.stop()
    run(main())


def test_requests_the_broker_sent_before_it_took_the_unsubscribe_are_served_at_a_drain(mosquitto):
    """A rolling restart: the broker hands the group's requests to the other replicas once it has
    taken the stopping bridge's UNSUBSCRIBE, and the ones it sent this bridge before that come
    first on its connection. They were answered UNAVAILABLE ("gateway is shutting down") when
    they reached paho after stop() had sent the UNSUBSCRIBE, and the edges spooled escalations a
    gateway could serve (2 of 300 at 250 a second, stopping one of two real gateway processes).
    Here real requests published just before the UNSUBSCRIBE goes out are all served, and stop()
    waits for them."""
    async def main():
        w = TestWorker("w", 0.3, concurrency=8)
        await w.start()
        gw = await bridged_gateway(mosquitto, w)
        bridge = gw.bridge
        edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            real_unsubscribe = bridge.client.unsubscribe
            corrs = [f"just-before-{i}".encode() for i in range(5)]

            def requests_then_unsubscribe(topic, *args, **kwargs):
                # stop() has begun: the broker takes these (its PUBACK to the edge) and routes them
                # to this bridge before it reads the UNSUBSCRIBE sent next
                bridge.client.unsubscribe = real_unsubscribe
                for i, corr in enumerate(corrs):
                    edge.send(request(seq=10 + i).SerializeToString(), corr)
                return real_unsubscribe(topic, *args, **kwargs)

            bridge.client.unsubscribe = requests_then_unsubscribe
            await bridge.stop(5)
            assert not bridge._pending
            await wait_until(lambda: all(c in edge.responses for c in corrs), 10, "every request answered")
            statuses = [edge.responses[c][0].status for c in corrs]
            assert statuses == [detect_pb2.OK] * len(corrs), [edge.responses[c][0].error for c in corrs]
            assert w.calls == len(corrs) and bridge.counts.get("answered") == len(corrs)
        finally:
            edge.close()
            await gw.stop(1)
            await w.stop()
    run(main())


def test_the_answers_of_a_drain_reach_the_broker_before_the_bridge_disconnects(mosquitto):
    """stop() waited for the requests in flight and disconnected as soon as they were done: paho
    closes the socket right after writing the DISCONNECT, with the broker's PUBACKs to the last
    answers unread, so the connection ended with a reset and the broker dropped answers it had
    not read yet. Measured: of 5 requests answered together at the end of a drain, all 5 reached
    the edge in only 1 run of 3 (a rolling restart's last answers lost, the edges spooling
    escalations the cloud had computed). The bridge now waits for the broker's PUBACKs (at most
    ``STOP_FLUSH_S``) before it disconnects. Three drains, each of a fresh gateway."""
    async def main():
        w = TestWorker("w", 0.5, concurrency=8)
        await w.start()
        edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
        try:
            for drain in range(3):
                gw = await bridged_gateway(mosquitto, w)
                bridge = gw.bridge
                try:
                    await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
                    corrs = [f"drain-{drain}-{i}".encode() for i in range(5)]
                    for i, corr in enumerate(corrs):
                        await asyncio.to_thread(edge.send, request(seq=i).SerializeToString(), corr)
                    await wait_until(lambda: w.in_flight == len(corrs), 10, "every request at the worker")
                    await bridge.stop(5)
                    assert bridge.counts.get("answered") == len(corrs)
                    await wait_until(lambda: all(c in edge.responses for c in corrs), 5,
                                     f"every answer of drain {drain} at the edge")
                finally:
                    await gw.stop(1)
        finally:
            edge.close()
            await w.stop()
    run(main())


def test_odd_properties_are_answered_and_never_take_the_bridge_down(mosquitto, caplog):
    """Properties a broker forwards, however odd, are each answered (or dropped) on their own:
    a U+FEFF in a string (valid MQTT 5.0: 1.5.4 says a receiver must not strip it), a token that
    is no device's, a 60,000-character token, a token that is not UTF-8 (the broker refuses that
    PUBLISH itself); the bridge's connection stays up, and the device's next request is served."""
    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(mosquitto, w, **{"auth.tokens": [{"device": "cam-1", "token": "t1"}]})
        bridge = gw.bridge
        drops: list[object] = []

        def on_disconnect(*args):
            drops.append(args[3])
            bridge._on_disconnect(*args)

        bridge.client.on_disconnect = on_disconnect
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            odd = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port, "edgewise/cam-1/response/odd")
            raw = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port, "edgewise/cam-1/response/raw")
            try:
                def send(client: Edge, corr: bytes, token: str | bytes, **more: object) -> None:
                    props = Properties(PacketTypes.PUBLISH)
                    props.ResponseTopic, props.CorrelationData = client.reply_topic, corr
                    props.UserProperty = [("authorization", token if isinstance(token, bytes) else f"Bearer {token}")]
                    for name, value in more.items():
                        setattr(props, name, value)
                    client.c.publish("edgewise/cam-1/escalate", request(seq=len(corr)).SerializeToString(), qos=1,
                                     properties=props)

                await asyncio.to_thread(send, odd, b"feff-type", "t1", ContentType="\ufeffapplication/x-protobuf")
                await asyncio.to_thread(send, odd, b"feff-token", "\ufeffwrong")
                await asyncio.to_thread(send, odd, b"long-token", "x" * 60_000)
                await wait_until(lambda: len(odd.responses) >= 3, 10, "the odd requests answered")
                await asyncio.to_thread(send, raw, b"not-utf8", b"Bearer \xff\xfe")  # the broker drops the sender
                await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"next", token="t1")
                await wait_until(lambda: b"next" in edge.responses, 10, "the next request answered")
                assert edge.responses[b"next"][0].status == detect_pb2.OK
                assert odd.responses[b"feff-type"][0].status == detect_pb2.OK
                for corr in (b"feff-token", b"long-token"):
                    answer = odd.responses[corr][0]
                    assert answer.status == detect_pb2.UNAUTHENTICATED and len(answer.error) < 300, corr
                assert not raw.responses
                assert drops == [] and "internal_error" not in bridge.counts, (drops, bridge.counts)
                assert all(len(r.getMessage()) < 1000 for r in caplog.records)
            finally:
                edge.close()
                odd.close()
                raw.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_an_mqtt_requests_deadline_counts_its_wait_for_the_gateway(mosquitto):
    """The edge's deadline (its Message Expiry Interval) was read when paho's thread took the
    request and handed to the gateway's event loop as a duration: the time the request then
    waited for the loop (behind a burst) was not counted, so a request its edge had given up on
    still went to a worker with its whole interval (a gRPC call's deadline is a moment, and the
    wait counts against it). Held 1.5 s before the loop takes it, a request of 1 s is answered
    DEADLINE_EXCEEDED without reaching a worker; one that does not wait is served."""
    import time

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(mosquitto, w)
        bridge = gw.bridge
        seen = topics_handled(bridge)
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port)
            try:
                def send_then_hold_the_loop() -> None:  # (on the gateway's loop)
                    edge.send(request(seq=1).SerializeToString(), b"late", expiry_s=1)
                    deadline = time.monotonic() + 10
                    while not seen and time.monotonic() < deadline:
                        time.sleep(0.01)
                    assert seen
                    time.sleep(1.5)

                send_then_hold_the_loop()
                await wait_until(lambda: b"late" in edge.responses, 10, "the late request answered")
                late = edge.responses[b"late"][0]
                assert late.status == detect_pb2.DEADLINE_EXCEEDED and w.calls == 0, (late.status, late.error)
                await asyncio.to_thread(edge.send, request(seq=2).SerializeToString(), b"fresh", expiry_s=1)
                await wait_until(lambda: b"fresh" in edge.responses, 10, "the fresh request answered")
                assert edge.responses[b"fresh"][0].status == detect_pb2.OK and w.calls == 1
            finally:
                edge.close()
        finally:
            await gw.stop(1)
            await w.stop()
    run(main())


def test_the_share_group_a_connected_bridge_logs_is_not_the_secret_name(mosquitto, caplog):
    """The shared-subscription group is a secret (docs/install-cloud.md#mqtt-security: a device
    that names it takes a share of every device's requests, and Mosquitto's acl_file does not
    check subscriptions), derived from the broker password or set in mqtt.group. The bridge
    logged the whole subscription, group included, at INFO at every connection: into the pod
    logs, which `view` rights read. It now says where the group comes from instead."""
    import logging

    from cloud.gateway.settings import MqttSettings

    caplog.set_level(logging.DEBUG)
    derived = MqttSettings(username="gw", password="broker-pass").share_group()

    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        mq = {"mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port}
        gws = [Gateway(settings_for([(w, 1)], **mq, **{"mqtt.client_id": "gw-derived", "mqtt.username": "gw",
                                                       "mqtt.password": "broker-pass"})),
               Gateway(settings_for([(w, 1)], **mq, **{"mqtt.client_id": "gw-set", "mqtt.group": "only-gateways-7f3"}))]
        for gw in gws:
            await gw.start()
        try:
            await wait_until(lambda: all(gw.bridge.connected.is_set() for gw in gws), 15, "both bridges subscribed")
        finally:
            for gw in gws:
                await gw.stop(1)
            await w.stop()
    run(main())
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if derived in m or "only-gateways-7f3" in m or "broker-pass" in m], said
    connected = [m for m in said if "MQTT bridge connected to" in m]
    assert any("$share/<derived from mqtt.password>/edgewise/+/escalate" in m for m in connected), connected
    assert any("$share/<mqtt.group>/edgewise/+/escalate" in m for m in connected), connected


def test_requests_the_broker_routed_before_the_unsubscribe_but_delivers_after_its_unsuback_are_served():
    """A broker routes a request when it takes its PUBLISH; one routed to this bridge but still
    queued for it (past the broker's in-flight window: Mosquitto's max_inflight_messages, 20 by
    default) is delivered after the UNSUBACK, as MQTT 5 section 3.10.4 allows ("MAY continue to
    deliver any existing messages buffered for delivery"). The bridge answered those UNAVAILABLE
    ("gateway is shutting down") though it was still connected and serving: the edges spooled
    escalations no other replica would get. A real Mosquitto with an in-flight window of 1 and 20
    requests routed just before the UNSUBSCRIBE: all are served and stop() waits for them."""
    from tests.conftest import configured_mosquitto

    async def main(broker):
        w = TestWorker("w", 0.05, concurrency=8)
        await w.start()
        gw = await bridged_gateway(broker, w)
        bridge = gw.bridge
        edge = await asyncio.to_thread(Edge, broker.host, broker.port)
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            real_unsubscribe = bridge.client.unsubscribe
            corrs = [f"queued-{i}".encode() for i in range(20)]

            def requests_then_unsubscribe(topic, *args, **kwargs):
                bridge.client.unsubscribe = real_unsubscribe
                # paho's thread busy (as under load): it holds the first delivery unacknowledged, so
                # the broker routes the others to this bridge and queues them behind its window
                with bridge._lock:
                    for i, corr in enumerate(corrs):
                        edge.send(request(seq=10 + i).SerializeToString(), corr)
                    time.sleep(0.3)
                    return real_unsubscribe(topic, *args, **kwargs)

            bridge.client.unsubscribe = requests_then_unsubscribe
            await bridge.stop(10)
            await wait_until(lambda: all(c in edge.responses for c in corrs), 10, "every request answered")
            statuses = [detect_pb2.Status.Name(edge.responses[c][0].status) for c in corrs]
            assert statuses == ["OK"] * len(corrs), statuses
        finally:
            edge.close()
            await gw.stop(1)
            await w.stop()

    with configured_mosquitto("max_inflight_messages 1") as broker:
        run(main(broker))
