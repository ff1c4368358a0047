"""The gateway's MQTT bridge against a real Mosquitto with ``max_packet_size``: one request whose
answer would be larger than the broker takes must not take the bridge down.

Before the fix the bridge echoed any Correlation Data and published every answer: an answer over
the broker's Maximum Packet Size made Mosquitto drop the gateway's connection, paho sent the same
unacknowledged answer again after each reconnect, and no request was answered any more."""

from __future__ import annotations

import asyncio
import logging

from cloud.gateway.server import Gateway
from edgewise import status
from tests.cloud.gateway.test_gateway import run
from tests.cloud.gateway.test_mqtt_bridge import Edge, bridged_gateway
from tests.cloud.gateway.workers import TestWorker, request
from tests.edge.transports.test_mqtt_refusals import configured_mosquitto
from tests.waiting import async_wait_until as wait_until

LOGGER = "edgewise.gateway.mqtt"
TOKEN = "tok-cam-1"
#: the broker's max_packet_size: a valid request (a ~4 KB JPEG) fits
LIMIT = 8192


def _mqtt_count(gw: Gateway, result: str) -> float:
    return gw.metrics.registry.get_sample_value("edgewise_gateway_mqtt_messages_total", {"result": result}) or 0.0


async def _poisoned(broker, poison) -> tuple[Gateway, TestWorker]:
    """A gateway (auth on) bridged to ``broker``; ``poison(edge)`` sends the bad request between
    two valid ones. Returns after checking that the valid one after it is answered and the bridge
    stayed connected."""
    w = TestWorker("a", 0.005)
    await w.start()
    gw = await bridged_gateway(broker, w, **{"auth.tokens": [{"device": "cam-1", "token": TOKEN}]})
    bridge = gw.bridge
    assert bridge is not None
    edge = None
    try:
        await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
        assert bridge.max_packet_size == LIMIT  # read from the broker's CONNACK
        edge = await asyncio.to_thread(Edge, broker.host, broker.port)
        await asyncio.to_thread(edge.send, request(seq=0).SerializeToString(), b"before", token=TOKEN)
        await wait_until(lambda: b"before" in edge.responses, 10, "the answer before")
        await asyncio.to_thread(poison, edge)
        await asyncio.sleep(1.5)  # the old bridge was disconnected within this
        await asyncio.to_thread(edge.send, request(seq=1).SerializeToString(), b"after", token=TOKEN)
        await wait_until(lambda: b"after" in edge.responses, 10, "the answer to a valid request after it")
        assert status.is_ok(edge.responses[b"after"][0].status)
        assert bridge.connected.is_set()
        assert gw.metrics.registry.get_sample_value("edgewise_gateway_mqtt_connected") == 1
    finally:
        if edge is not None:
            edge.close()
        await gw.stop(1)
        await w.stop()
    return gw, w


def test_long_correlation_data_is_refused_and_its_answer_published_only_if_it_fits(caplog):
    """A malformed, unauthenticated request with ~8 KB of Correlation Data (the answer would echo
    it, ~100 bytes more than the request): not read, counted, logged, and its INVALID_ARGUMENT
    answer not published (over the broker's limit); the bridge stays up and answers the next valid
    request. One with 300 bytes (over ``mqtt.max_correlation_bytes``, 256) is told why, with its
    Correlation Data, as every request refused on a response topic it may use (it went unanswered)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    edges: list[Edge] = []

    def poison(edge: Edge) -> None:
        edge.send(b"\xff\xff\xff", b"A" * (LIMIT - 110), device="cam-1")
        edge.send(b"\xff\xff\xff", b"B" * 300, device="cam-1")
        edges.append(edge)  # (its answers are read once the valid request after these is answered)

    with configured_mosquitto(f"max_packet_size {LIMIT}") as broker:
        gw, _ = run(_poisoned(broker, poison))
    assert _mqtt_count(gw, "correlation_too_large") == 2
    assert _mqtt_count(gw, "answer_too_large") == 1
    assert _mqtt_count(gw, "malformed") == 0  # never read
    logged = [r.getMessage() for r in caplog.records if "mqtt.max_correlation_bytes" in r.getMessage()]
    assert logged and f"{LIMIT - 110} bytes of Correlation Data" in logged[0]
    told = edges[0].responses
    assert b"A" * (LIMIT - 110) not in told
    answer = told[b"B" * 300][0]
    assert answer.status == status.INVALID_ARGUMENT and "300 bytes of Correlation Data" in answer.error


def test_answer_over_the_brokers_packet_size_is_not_published(caplog):
    """A request under the correlation limit whose answer still would not fit (a long response
    topic inside the device's subtree): the answer is not published, counted and logged; the
    bridge stays up."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    long_reply = "edgewise/cam-1/response/" + "x" * (LIMIT - 300)

    def poison(edge: Edge) -> None:
        edge.send(b"\xff\xff\xff", b"C" * 200, device="cam-1", reply_topic=long_reply)

    with configured_mosquitto(f"max_packet_size {LIMIT}") as broker:
        gw, _ = run(_poisoned(broker, poison))
    assert _mqtt_count(gw, "error_answered") == 1  # no token: refused before it is read
    assert _mqtt_count(gw, "answer_too_large") == 1
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("answer to ")]
    assert logged and f"over the Maximum Packet Size of {LIMIT} bytes the broker announced" in logged[0]


def test_an_answer_over_the_brokers_message_size_limit_is_a_refusal_not_a_reconnect(caplog):
    """Mosquitto's ``message_size_limit`` announces nothing in CONNACK and answers a larger
    message with a PUBACK "Packet too large" (0x95), a code MQTT 5.0 lists for CONNACK and
    DISCONNECT only. paho took it for a malformed packet and dropped the connection, then sent
    the same answer again after each reconnect, for good. The bridge's client
    (``edgewise.mqtt_client.Client``, the edge's too) takes it as a refusal: counted once,
    logged, and the bridge stays connected."""
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def main(broker):
        w = TestWorker("a", 0.005)
        await w.start()
        gw = await bridged_gateway(broker, w)
        bridge = gw.bridge
        assert bridge is not None
        edge = None
        try:
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            edge = await asyncio.to_thread(Edge, broker.host, broker.port)
            # 3 bytes in; the error answer naming what is wrong is longer than the limit
            await asyncio.to_thread(edge.send, b"\xff\xff\xff", b"c0")
            await wait_until(lambda: _mqtt_count(gw, "response_refused") == 1, 10, "the refused answer")
            await asyncio.sleep(2.5)  # the old bridge reconnected and sent it again within this
            assert _mqtt_count(gw, "response_refused") == 1
            assert bridge.connected.is_set()
        finally:
            if edge is not None:
                edge.close()
            await gw.stop(1)
            await w.stop()
        return gw

    with configured_mosquitto("message_size_limit 64") as broker:
        gw = run(main(broker))
    assert _mqtt_count(gw, "malformed") == 1
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("broker refused publish to ")]
    assert refused and "Packet too large" in refused[0], refused
    assert not [r for r in caplog.records if "disconnected" in r.getMessage()]
