"""Both escalation transports against the real cloud: the real gateway
(``cloud.gateway.server.Gateway``) in front of a real worker with the tiny model,
in-process on port 0 (``tests.realcloud``), and for MQTT the gateway's own MQTT
bridge on a real Mosquitto broker. The failures are the gateway's real ones: its
bearer-token check, its per-device rate limit, a busy worker, a closed port,
a refused TLS handshake."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import cv2
import grpc
import numpy as np
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge.transports import RECONNECT_DELAY_S, MeteredTransport, TransportError
from edge.transports.grpc import GrpcTransport
from edge.transports.mqtt import MqttConnection, MqttTransport
from edgewise.v1 import detect_pb2
from tests.cloud.gateway.pki import Pki
from tests.conftest import TopicRecorder, configured_mosquitto, free_port, in_process_cloud_class
from tests.waiting import async_wait_until

TOKENS = [{"device": "d", "token": "s3cret"}]


def request(seq: int = 1) -> detect_pb2.DetectRequest:
    ok, jpg = cv2.imencode(".jpg", np.full((32, 48, 3), 128, np.uint8))
    req = detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=seq)
    req.image.encoding = detect_pb2.Image.JPEG
    req.image.data = jpg.tobytes()
    return req


def test_grpc_roundtrip_token_and_status_mapping(tiny_model):
    """OK from the worker; UNAUTHENTICATED for a wrong token; DEADLINE_EXCEEDED while
    the worker is busy; RESOURCE_EXHAUSTED from the gateway's rate limit (burst 3)."""
    limits = {"auth.tokens": TOKENS, "limits.rate_per_device": 0.001, "limits.burst_per_device": 3}
    with in_process_cloud_class()(tiny_model, gateway=limits) as cloud:
        async def run():
            t = GrpcTransport([cloud.address], token="s3cret")
            await t.start()
            resp = await t.detect(request(7), 5.0)
            assert resp.frame_seq == 7 and resp.status == detect_pb2.OK and resp.worker_id == "worker-0"
            wrong = GrpcTransport([cloud.address], token="nope")
            with pytest.raises(TransportError) as ei:
                await wrong.detect(request(8), 5.0)
            assert ei.value.status == detect_pb2.UNAUTHENTICATED
            release = cloud.block_worker(0)
            with pytest.raises(TransportError) as ei:
                await t.detect(request(9), 0.3)
            assert ei.value.status == detect_pb2.DEADLINE_EXCEEDED
            release.set()
            await t.detect(request(10), 5.0)  # the third token of the burst
            with pytest.raises(TransportError) as ei:
                await t.detect(request(11), 5.0)
            assert ei.value.status == detect_pb2.RESOURCE_EXHAUSTED and "rate limit" in ei.value.message
            assert ei.value.spoolable
            await t.close()
            await wrong.close()
        asyncio.run(run())


def test_metered_transport_counts_every_request_sent_failed_or_not(real_cloud):
    sent = []

    async def run():
        t = MeteredTransport(GrpcTransport([real_cloud.address]), lambda name, n: sent.append((name, n)))
        assert t.name == "grpc"
        await t.start()
        assert (await t.detect(request(1), 5.0)).frame_seq == 1
        bad = request(2)
        bad.device_id = ""  # the gateway refuses it (INVALID_ARGUMENT): still sent, still counted
        with pytest.raises(TransportError):
            await t.detect(bad, 5.0)
        await t.close()

    asyncio.run(run())
    assert sent == [("grpc", request(1).ByteSize()), ("grpc", request(2).ByteSize() - 3)]
    assert sent[0][1] > 100  # the JPEG is most of it


def test_metered_transport_does_not_count_a_request_refused_before_it_left():
    """The MQTT transport refuses a request at once when its uplink window is full, or the broker is
    not connected: nothing went up. Counted, a slow uplink's refusals (56 of 120 escalations in
    test_mqtt_uplink's measurement) read as bytes it carried."""
    sent = []
    with configured_mosquitto() as broker:
        async def run():
            conn = MqttConnection(broker.host, broker.port, client_id="edge-metered")
            conn.start()
            t = MeteredTransport(MqttTransport(conn, "d", max_in_flight_bytes=200),
                                 lambda name, n: sent.append((name, n)))
            await t.start()
            await async_wait_until(conn.connected.is_set, 10, "connected")
            # the first goes (an idle uplink takes one); the others would pass the 200 bytes: refused
            # (a deadline long enough that the first still fills the window when a loaded machine
            # gets to the others: at 0.3 s it could expire first and let the second go up)
            got = await asyncio.gather(*(t.detect(request(i), 2.0) for i in range(3)), return_exceptions=True)
            assert [e.status for e in got] == [detect_pb2.DEADLINE_EXCEEDED] + [detect_pb2.RESOURCE_EXHAUSTED] * 2
            conn.stop()
            with pytest.raises(TransportError) as ei:  # not connected
                await t.detect(request(3), 0.3)
            assert ei.value.status == detect_pb2.UNAVAILABLE
            await t.close()
        asyncio.run(run())
    assert sent == [("mqtt", request(0).ByteSize())]


def test_metered_transport_does_not_count_a_request_given_up_before_paho_wrote_it():
    """A broker that stops reading (SIGSTOP) with a Receive Maximum of 4: paho writes 4 of 12
    escalations at once and holds the other 8 until their deadline withdraws them; all 12 were
    counted as sent, three times the bytes that went up."""
    sent = []
    with configured_mosquitto("max_inflight_messages 4") as broker:
        async def run():
            conn = MqttConnection(broker.host, broker.port, client_id="edge-metered-held")
            conn.start()
            t = MeteredTransport(MqttTransport(conn, "d"), lambda name, n: sent.append(n))
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set() and conn.in_flight_bound == 4, 10, "connected")
            broker.proc.send_signal(signal.SIGSTOP)
            try:
                got = await asyncio.gather(*(t.detect(request(i), 0.05) for i in range(12)), return_exceptions=True)
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            assert [e.sent for e in got].count(False) == 8, got
            conn.stop()
            await t.close()
        asyncio.run(run())
    assert len(sent) == 4  # the requests written


def test_metered_transport_does_not_count_a_request_published_after_the_connection_dropped():
    """The broker goes away and paho closes the socket, but has not yet told the edge (its thread,
    held up here, runs ``on_disconnect`` late): an escalation then is published while disconnected
    (paho: "not currently connected"), fails UNAVAILABLE and is withdrawn, and was counted as sent."""
    import threading

    sent = []
    with configured_mosquitto() as broker:
        async def run():
            conn = MqttConnection(broker.host, broker.port, client_id="edge-metered-dropped")
            conn.start()
            t = MeteredTransport(MqttTransport(conn, "d"), lambda name, n: sent.append(n))
            await t.start()
            await async_wait_until(conn.connected.is_set, 10, "connected")
            told, go_on = threading.Event(), threading.Event()
            on_disconnect = conn.client.on_disconnect

            def late(*args):
                told.set()
                go_on.wait(10)
                on_disconnect(*args)
            conn.client.on_disconnect = late
            broker.stop()
            try:
                await async_wait_until(told.is_set, 10, "paho's socket closed")
                assert conn.connected.is_set()  # the edge does not know yet
                with pytest.raises(TransportError) as ei:
                    await t.detect(request(1), 0.5)
                assert ei.value.status == detect_pb2.UNAVAILABLE and "not currently connected" in ei.value.message
                assert not ei.value.sent and not conn.client._out_messages and not conn._waiting
            finally:
                go_on.set()
            conn.stop()
            await t.close()
        asyncio.run(run())
    assert sent == []


def test_grpc_unavailable_fails_fast_and_fails_over(real_cloud):
    dead = f"127.0.0.1:{free_port()}"

    async def run():
        only_dead = GrpcTransport([dead])
        t0 = time.monotonic()
        with pytest.raises(TransportError) as ei:
            await only_dead.detect(request(), 2.0)
        assert ei.value.status == detect_pb2.UNAVAILABLE
        assert time.monotonic() - t0 < 2.0
        both = GrpcTransport([dead, real_cloud.address])
        resp = await both.detect(request(3), 5.0)
        assert resp.frame_seq == 3 and resp.status == detect_pb2.OK
        await only_dead.close()
        await both.close()
    asyncio.run(run())


def test_grpc_failover_of_every_request_to_a_dead_cloud_is_said_a_few_times_not_each_time(caplog):
    """With every endpoint down, each escalation logged "endpoint ... unavailable, trying the
    next one" again (the preferred endpoint stays the first): a line per escalated frame for
    the whole outage (found by a log-flood probe). A few per interval now."""
    caplog.set_level("INFO", logger="edge.transports.grpc")

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
        for seq in range(8):
            with pytest.raises(TransportError):
                await t.detect(request(seq), 2.0)
        await t.close()
    asyncio.run(run())
    said = [r.getMessage() for r in caplog.records if "trying the next one" in r.getMessage()]
    assert 1 <= len(said) <= 3, said


def test_grpc_reconnects_to_a_cloud_back_from_an_outage_as_mqtt_does():
    # gRPC's own reconnect backoff grows to 120 s: measured against a real server stopped for
    # 330 s, the first escalation answered came 89.5 s after the server was back, and every
    # escalation meanwhile was spooled; bounded as paho's, 11.7 s
    options = dict(GrpcTransport(["127.0.0.1:1"]).options)
    assert options["grpc.initial_reconnect_backoff_ms"] == RECONNECT_DELAY_S[0] * 1000
    assert "grpc.min_reconnect_backoff_ms" not in options  # the least time a connection attempt gets: 20 s
    assert options["grpc.max_reconnect_backoff_ms"] == RECONNECT_DELAY_S[1] * 1000
    conn = MqttConnection("127.0.0.1", 1)
    assert (conn.client._reconnect_min_delay, conn.client._reconnect_max_delay) == RECONNECT_DELAY_S


def test_an_mqtt_escalation_given_up_is_not_sent_later_when_it_never_left():
    """A broker that stops reading (SIGSTOP: the connection stays up): paho writes what the
    broker's Receive Maximum lets in flight and holds the rest. Escalations given up at their
    deadline (spooled, replayed later) went out once the broker read again, all of them: a real
    daemon with the gateway's bridge stalled 20 s had its 60 spooled escalations all reach the
    gateway after the stall, which refused 39 of them as overloaded beside the live ones. Those
    paho still held are withdrawn; only those already written can still arrive."""
    from paho.mqtt.client import CallbackAPIVersion, Client

    with configured_mosquitto("max_inflight_messages 4") as broker:
        got = []
        sub = Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="count", protocol=5)
        sub.on_message = lambda c, u, m: got.append(m.mid)
        sub.connect(broker.host, broker.port)
        sub.subscribe("edgewise/d/escalate", qos=1)
        sub.loop_start()

        async def run():
            conn = MqttConnection(broker.host, broker.port, client_id="edge-stall")
            conn.start()
            t = MqttTransport(conn, "d")
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set() and conn.in_flight_bound == 4, 10, "connected")
            broker.proc.send_signal(signal.SIGSTOP)
            try:
                # at once: one by one, the transport's window refuses those after the first deadline
                # before paho has them (test_mqtt_uplink); these all reach paho, 4 in flight
                got_back = await asyncio.gather(*(t.detect(request(i), 0.05) for i in range(12)),
                                                return_exceptions=True)
                assert all(isinstance(e, TransportError) and e.status == detect_pb2.DEADLINE_EXCEEDED
                           for e in got_back), got_back
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            # what was in flight acknowledged, nothing left waiting (a fixed 1.5 s was too short when
            # paho's thread read the PUBACKs late), and what the broker took on the topic
            await async_wait_until(lambda: not conn._waiting and not conn.client._out_messages and got, 30,
                                   "the requests in flight acknowledged and on the topic")
            await asyncio.sleep(0.3)  # room for a held request wrongly sent to reach the subscriber too
            conn.stop()

        try:
            asyncio.run(run())
        finally:
            sub.loop_stop()
            sub.disconnect()
    assert 1 <= len(got) <= 4  # the four written before the deadlines; not the eight held back


def test_mqtt_escalations_failed_by_a_close_are_withdrawn_too():
    """A broker that stops reading (SIGSTOP) with a Receive Maximum of 4, and the transport closed
    (a stop past its grace) while 12 escalations wait: each failed UNAVAILABLE ("transport closed",
    spooled), but only an escalation given up at its deadline, or cancelled, was withdrawn: all 12
    reached the broker's topic once it read again, 8 of them from paho's queue (spooled, they were
    replayed: computed twice), and all 12 were counted as sent."""
    import threading

    from paho.mqtt.client import CallbackAPIVersion, Client

    sent = []
    with configured_mosquitto("max_inflight_messages 4") as broker:
        got = []
        sub = Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="count-closed", protocol=5)
        sub.on_message = lambda c, u, m: got.append(m.mid)
        subscribed = threading.Event()
        sub.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        sub.connect(broker.host, broker.port)
        sub.subscribe("edgewise/d/escalate", qos=1)
        sub.loop_start()

        async def run():
            await async_wait_until(subscribed.is_set, 10, "subscribed")
            conn = MqttConnection(broker.host, broker.port, client_id="edge-closed")
            conn.start()
            t = MeteredTransport(MqttTransport(conn, "d"), lambda name, n: sent.append(n))
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set() and conn.in_flight_bound == 4, 10, "connected")
            broker.proc.send_signal(signal.SIGSTOP)
            try:
                waiting = [asyncio.ensure_future(t.detect(request(i), 5.0)) for i in range(12)]
                await async_wait_until(lambda: len(conn.client._out_messages) == 12, 5, "12 requests in paho")
                await t.close()
                failed = await asyncio.gather(*waiting, return_exceptions=True)
                assert {str(e) for e in failed} == {"UNAVAILABLE: transport closed"}
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            await async_wait_until(lambda: not conn.client._out_messages and len(got) >= 4, 30,
                                   "the written ones acknowledged and on the topic")
            await asyncio.sleep(0.3)  # room for a held request wrongly sent to reach the subscriber too
            conn.stop()

        try:
            asyncio.run(run())
        finally:
            sub.loop_stop()
            sub.disconnect()
    assert len(got) == 4 and len(sent) == 4  # the four written before the close


def test_mqtt_request_response_with_correlation_through_the_gateway_bridge(tiny_model, mosquitto):
    bridge = {"mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port,
              "mqtt.reconnect_min_s": 0.2, "mqtt.reconnect_max_s": 1.0}
    with in_process_cloud_class()(tiny_model, gateway=bridge) as cloud:
        async def run():
            conn = MqttConnection(mosquitto.host, mosquitto.port, client_id="edge-test")
            conn.start()
            t = MqttTransport(conn, "d")
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set() and cloud.gateway.bridge.connected.is_set(),
                                   10, "the edge and the bridge connected")

            async def one(seq):
                try:
                    return await t.detect(request(seq), 2.0)
                except TransportError:
                    return None  # the response subscription may still be settling
            await async_wait_until(lambda: one(0), 10, "a first answer over MQTT")
            resps = await asyncio.gather(*(t.detect(request(i), 5.0) for i in range(5)))
            assert [r.frame_seq for r in resps] == list(range(5))  # matched by correlation data
            assert all(r.status == detect_pb2.OK and r.worker_id == "worker-0" for r in resps)
            assert t.request_topic == "edgewise/d/escalate"
            assert t.response_topic == "edgewise/d/response/edge-test"
            # Broker gone: UNAVAILABLE quickly, not a hang.
            mosquitto.stop()
            await async_wait_until(lambda: not conn.connected.is_set(), 10, "the disconnect")
            with pytest.raises(TransportError) as ei:
                await t.detect(request(99), 1.0)
            assert ei.value.status == detect_pb2.UNAVAILABLE
            # Broker back: paho's loop reconnects with backoff and requests flow again.
            mosquitto.start()
            await async_wait_until(lambda: one(100), 30, "answers after the broker came back")
            await t.close()
            conn.stop()
        asyncio.run(run())


def test_requests_past_their_deadline_are_not_sent_again_after_the_broker_comes_back(mosquitto):
    """A hung broker (SIGSTOP: the connection stays open, nothing is answered): the escalations
    time out and the edge gives up on them, but paho held their requests and sent them all again
    after the reconnect, each with its whole Message Expiry Interval, so the broker handed the
    gateway requests the edge had spooled long before (hundreds after a minute's hang)."""
    conn = MqttConnection(mosquitto.host, mosquitto.port, client_id="edge-stale", keepalive_s=60)
    conn.start()
    t = MqttTransport(conn, "d")
    recorder = None

    async def run():
        nonlocal recorder
        await t.start()
        await async_wait_until(lambda: conn.connected.is_set(), 10, "the edge connected")
        # the recorder subscribed, and its session saved by the broker (SIGUSR1; mosquitto.db appears
        # once written): the restarted broker keeps what the edge sends for it however soon the edge
        # reconnects (subscribing after the restart raced paho's reconnect, 1 s after the kill)
        recorder = TopicRecorder(mosquitto, t.request_topic, client_id="stale-requests")
        os.kill(mosquitto.proc.pid, signal.SIGUSR1)
        await async_wait_until((mosquitto.conf.parent / "mosquitto.db").exists, 10, "the broker's sessions saved")
        os.kill(mosquitto.proc.pid, signal.SIGSTOP)
        try:
            # at once, so paho holds all three (one by one, the transport's window refuses those
            # after the first deadline before paho has them); 1 s of Message Expiry Interval each
            got_back = await asyncio.gather(*(t.detect(request(i), 0.3) for i in range(3)), return_exceptions=True)
            assert all(isinstance(e, TransportError) and e.status == detect_pb2.DEADLINE_EXCEEDED
                       for e in got_back), got_back
            props = Properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = 60
            conn.publish(t.request_topic, b"fresh", props)  # held by paho too, within its interval
            await asyncio.sleep(1.0)  # past the escalations' interval
        finally:
            mosquitto.proc.kill()  # (a stopped process dies of SIGKILL)
            mosquitto.stop()
        mosquitto.start()
        await async_wait_until(lambda: conn.connected.is_set(), 30, "the reconnect")
        await async_wait_until(lambda: recorder.messages, 30, "the request still within its interval")
        await asyncio.sleep(0.3)
        assert [payload for _, payload in recorder.messages] == [b"fresh"]  # the expired ones: not sent
        assert conn._waiting == {}
    try:
        asyncio.run(run())
    finally:
        conn.stop()
        if recorder is not None:
            recorder.stop()


def test_a_request_given_up_when_its_connection_dropped_is_not_sent_again_after_the_reconnect(mosquitto):
    """A request written to a broker that then goes away (SIGSTOP, then SIGKILL and a restart): the
    escalation fails UNAVAILABLE at its deadline (1.05 s) and is spooled, but paho still held the
    written request and sent it again at the reconnect, 1 s after the loss, within its Message
    Expiry Interval (whole seconds: 2 s), so the gateway got it to compute, and the replay of the
    spooled escalation made it compute the frame twice. Given up, it is dropped at the reconnect."""
    conn = MqttConnection(mosquitto.host, mosquitto.port, client_id="edge-dropped", keepalive_s=60)
    conn.start()
    t = MqttTransport(conn, "d")
    recorder = None

    async def run():
        nonlocal recorder
        await t.start()
        await async_wait_until(lambda: conn.connected.is_set(), 10, "the edge connected")
        recorder = TopicRecorder(mosquitto, t.request_topic, client_id="dropped-requests")
        os.kill(mosquitto.proc.pid, signal.SIGUSR1)  # the recorder's session outlives the restart
        await async_wait_until((mosquitto.conf.parent / "mosquitto.db").exists, 10, "the broker's sessions saved")
        os.kill(mosquitto.proc.pid, signal.SIGSTOP)
        escalation = asyncio.ensure_future(t.detect(request(1), 1.05))
        await asyncio.sleep(0.3)  # written, not acknowledged
        mosquitto.proc.kill()
        mosquitto.stop()
        mosquitto.start()
        with pytest.raises(TransportError) as ei:
            await escalation
        assert ei.value.status == detect_pb2.UNAVAILABLE  # given up before the reconnect: spooled
        await async_wait_until(lambda: conn.connected.is_set(), 30, "the reconnect")
        props = Properties(PacketTypes.PUBLISH)
        props.MessageExpiryInterval = 60
        conn.publish(t.request_topic, b"fresh", props)
        await async_wait_until(lambda: recorder.messages, 30, "a request sent after the reconnect")
        await asyncio.sleep(0.3)
        assert [payload for _, payload in recorder.messages] == [b"fresh"]  # not the one given up
        assert conn._waiting == {} and not conn.client._out_messages
    try:
        asyncio.run(run())
    finally:
        conn.stop()
        if recorder is not None:
            recorder.stop()


def test_grpc_mutual_tls_and_bearer_token(tmp_path, tiny_model):
    """The gateway with mTLS (the client certificate names the device) and tokens."""
    pki = Pki(tmp_path)
    pki.server()
    pki.issue("client", "d")
    tls = {"tls.cert_file": pki.path("server.pem"), "tls.key_file": pki.path("server.key"),
           "tls.client_ca_file": pki.path("ca.pem"), "tls.require_client_cert": True, "auth.tokens": TOKENS}
    ca, cert, key = pki.path("ca.pem"), pki.path("client.pem"), pki.path("client.key")
    with in_process_cloud_class()(tiny_model, gateway=tls) as cloud:
        ep = [f"localhost:{cloud.port}"]

        async def run():
            good = GrpcTransport(ep, tls_ca=ca, tls_cert=cert, tls_key=key, token="s3cret")
            assert (await good.detect(request(1), 5.0)).frame_seq == 1
            bad_token = GrpcTransport(ep, tls_ca=ca, tls_cert=cert, tls_key=key, token="wrong")
            with pytest.raises(TransportError) as ei:
                await bad_token.detect(request(2), 5.0)
            assert ei.value.status == detect_pb2.UNAUTHENTICATED
            no_client_cert = GrpcTransport(ep, tls_ca=ca, token="s3cret")
            with pytest.raises(TransportError) as ei:
                await no_client_cert.detect(request(3), 5.0)
            assert ei.value.status == detect_pb2.UNAVAILABLE  # handshake refused by the server
            plaintext = GrpcTransport(ep, token="s3cret")
            with pytest.raises(TransportError):
                await plaintext.detect(request(4), 2.0)
            for t in (good, bad_token, no_client_cert, plaintext):
                await t.close()
        asyncio.run(run())


def test_an_idle_edge_keeps_its_connection_to_the_real_gateway(real_cloud):
    """The edge pings between escalations (cloud.keepalive_s, here its minimum, 5 s); gRPC's
    server default answers a third ping without a call with GOAWAY too_many_pings, so an idle
    edge was disconnected every 3 pings (a minute at the 20 s default) and its next
    escalation paid a new handshake. The real gateway accepts them: the channel stays READY."""
    from edgewise.wire import MIN_PING_INTERVAL_S

    async def run():
        t = GrpcTransport([real_cloud.address], keepalive_s=MIN_PING_INTERVAL_S)
        await t.start()
        assert (await t.detect(request(1), 5.0)).status == detect_pb2.OK
        ch = t.channels[0]
        states = set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.5 * MIN_PING_INTERVAL_S:  # past the third ping
            states.add(ch.get_state())
            await asyncio.sleep(0.25)
        assert states == {grpc.ChannelConnectivity.READY}, states
        assert (await t.detect(request(2), 5.0)).status == detect_pb2.OK
        await t.close()
    asyncio.run(run())


def test_a_grpc_request_that_never_connected_is_not_counted_as_sent():
    """The cloud unreachable (nothing listens on the port): 5 requests fail with "failed to
    connect" and none counts as sent; all 5 did. A real server answering the same status
    (UNAVAILABLE, overloaded) got them: each counts, and so does a call that tried the
    unreachable endpoint first and then that server."""
    sent = []

    async def unavailable(req: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "overloaded, try later")
        return b""

    async def run():
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "edgewise.v1.Escalation", {"Detect": grpc.unary_unary_rpc_method_handler(unavailable)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        nowhere, there = f"127.0.0.1:{free_port()}", f"127.0.0.1:{port}"
        transports = {name: MeteredTransport(GrpcTransport(endpoints), lambda _, n, name=name: sent.append(name))
                      for name, endpoints in (("nowhere", [nowhere]), ("there", [there]),
                                              ("both", [nowhere, there]))}
        try:
            for name, t in transports.items():
                await t.start()
                for i in range(5):
                    with pytest.raises(TransportError) as ei:
                        await t.detect(request(i), 5.0)
                    assert ei.value.status == detect_pb2.UNAVAILABLE, ei.value
                    assert ei.value.sent == (name != "nowhere"), ei.value
                    if name == "nowhere":
                        assert "failed to connect" in ei.value.message.lower(), ei.value
        finally:
            for t in transports.values():
                await t.close()
            await server.stop(None)

    asyncio.run(run())
    assert sent.count("nowhere") == 0 and sent.count("there") == 5 and sent.count("both") == 5, sent


def test_a_grpc_request_the_server_took_before_it_went_away_is_counted_as_sent():
    """A fresh channel (IDLE before the call), a real server that takes the request, works on it
    and then stops (a cloud restart) mid-call: gRPC's retries then fail to connect, the channel is
    in TRANSIENT_FAILURE after the call, and the request the server received was not counted as
    sent (looked at before and after the call only)."""
    sent = []

    async def run():
        received = asyncio.Event()

        async def slow(req: bytes, context: grpc.aio.ServicerContext) -> bytes:
            received.set()
            await asyncio.sleep(60)
            return b""

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "edgewise.v1.Escalation", {"Detect": grpc.unary_unary_rpc_method_handler(slow)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        t = MeteredTransport(GrpcTransport([f"127.0.0.1:{port}"]), lambda _, n: sent.append(n))
        await t.start()
        try:
            call = asyncio.ensure_future(t.detect(request(1), 20.0))
            await asyncio.wait_for(received.wait(), 15.0)
            await asyncio.sleep(0.3)  # the cloud works on it
            await server.stop(None)
            with pytest.raises(TransportError) as ei:
                await asyncio.wait_for(call, 20.0)
            assert ei.value.sent, ei.value
        finally:
            await t.close()
            await server.stop(None)

    asyncio.run(run())
    assert len(sent) == 1 and sent[0] > 0, sent
