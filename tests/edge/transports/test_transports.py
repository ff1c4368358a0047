"""Both escalation transports against a real server: a grpc.aio Escalation stub on
port 0 and a real Mosquitto broker with an MQTT v5 responder."""

from __future__ import annotations

import asyncio
import time

import cv2
import numpy as np
import pytest

from edge.transports import TransportError
from edge.transports.grpc import GrpcTransport
from edge.transports.mqtt import MqttConnection, MqttTransport
from edgewise.v1 import detect_pb2
from tests.conftest import free_port
from tests.edge.cloudstub import GrpcStubThread, MqttResponder, StubCloud


def request(seq: int = 1) -> detect_pb2.DetectRequest:
    ok, jpg = cv2.imencode(".jpg", np.full((32, 48, 3), 128, np.uint8))
    req = detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=seq)
    req.image.encoding = detect_pb2.Image.JPEG
    req.image.data = jpg.tobytes()
    return req


def test_grpc_roundtrip_token_and_status_mapping():
    cloud = StubCloud(None)
    stub = GrpcStubThread(cloud)
    try:
        async def run():
            t = GrpcTransport([f"127.0.0.1:{stub.port}"], token="s3cret")
            await t.start()
            resp = await t.detect(request(7), 2.0)
            assert resp.frame_seq == 7 and resp.status == detect_pb2.OK
            cloud.force_status = detect_pb2.RESOURCE_EXHAUSTED
            with pytest.raises(TransportError) as ei:
                await t.detect(request(8), 2.0)
            assert ei.value.code == "RESOURCE_EXHAUSTED"
            cloud.force_status = 0
            cloud.delay_s = 0.5
            with pytest.raises(TransportError) as ei:
                await t.detect(request(9), 0.1)
            assert ei.value.code == "DEADLINE_EXCEEDED"
            await t.close()
        asyncio.run(run())
    finally:
        stub.stop()
    assert [r.frame_seq for r in cloud.seen[:2]] == [7, 8]


def test_grpc_unavailable_fails_fast_and_fails_over():
    dead = f"127.0.0.1:{free_port()}"
    cloud = StubCloud(None)
    stub = GrpcStubThread(cloud)
    try:
        async def run():
            only_dead = GrpcTransport([dead])
            t0 = time.monotonic()
            with pytest.raises(TransportError) as ei:
                await only_dead.detect(request(), 2.0)
            assert ei.value.code == "UNAVAILABLE"
            assert time.monotonic() - t0 < 2.0
            both = GrpcTransport([dead, f"127.0.0.1:{stub.port}"])
            resp = await both.detect(request(3), 2.0)
            assert resp.frame_seq == 3
            await only_dead.close()
            await both.close()
        asyncio.run(run())
    finally:
        stub.stop()


def test_mqtt_request_response_with_correlation(mosquitto):
    cloud = StubCloud(None)
    responder = MqttResponder(cloud, mosquitto.host, mosquitto.port)
    try:
        async def run():
            conn = MqttConnection(mosquitto.host, mosquitto.port, client_id="edge-test")
            conn.start()
            t = MqttTransport(conn, "dev1")
            await t.start()
            for _ in range(100):
                if conn.connected.is_set():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # subscription of the response topic
            resps = await asyncio.gather(*(t.detect(request(i), 5.0) for i in range(5)))
            assert sorted(r.frame_seq for r in resps) == list(range(5))
            assert [r.frame_seq for r in resps] == list(range(5))  # matched by correlation data
            assert t.request_topic == "edgewise/dev1/escalate"
            assert t.response_topic == "edgewise/dev1/response/edge-test"
            # Broker gone: UNAVAILABLE quickly, not a hang.
            mosquitto.stop()
            for _ in range(100):
                if not conn.connected.is_set():
                    break
                await asyncio.sleep(0.05)
            with pytest.raises(TransportError) as ei:
                await t.detect(request(99), 1.0)
            assert ei.value.code == "UNAVAILABLE"
            # Broker back: paho's loop reconnects with backoff and requests flow again.
            mosquitto.start()
            for _ in range(200):
                if conn.connected.is_set():
                    break
                await asyncio.sleep(0.05)
            assert conn.connected.is_set()
            await t.close()
            conn.stop()
        asyncio.run(run())
    finally:
        responder.stop()
