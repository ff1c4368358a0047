"""Both escalation transports against a real server: a grpc.aio Escalation stub on
port 0 and a real Mosquitto broker with an MQTT v5 responder."""

from __future__ import annotations

import asyncio
import time

import cv2
import numpy as np
import pytest

from edge.transports import MeteredTransport, TransportError
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
            assert ei.value.status == detect_pb2.RESOURCE_EXHAUSTED
            cloud.force_status = 0
            cloud.delay_s = 0.5
            with pytest.raises(TransportError) as ei:
                await t.detect(request(9), 0.1)
            assert ei.value.status == detect_pb2.DEADLINE_EXCEEDED
            await t.close()
        asyncio.run(run())
    finally:
        stub.stop()
    assert [r.frame_seq for r in cloud.seen[:2]] == [7, 8]


def test_metered_transport_counts_every_request_sent_failed_or_not():
    cloud = StubCloud(None)
    stub = GrpcStubThread(cloud)
    sent = []
    try:
        async def run():
            t = MeteredTransport(GrpcTransport([f"127.0.0.1:{stub.port}"]), lambda name, n: sent.append((name, n)))
            assert t.name == "grpc"
            await t.start()
            assert (await t.detect(request(1), 2.0)).frame_seq == 1
            cloud.force_status = detect_pb2.UNAVAILABLE
            with pytest.raises(TransportError):
                await t.detect(request(2), 2.0)
            await t.close()
        asyncio.run(run())
    finally:
        stub.stop()
    size = request(1).ByteSize()
    assert sent == [("grpc", size), ("grpc", size)] and size > 100  # the JPEG is most of it


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
            assert ei.value.status == detect_pb2.UNAVAILABLE
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
            assert ei.value.status == detect_pb2.UNAVAILABLE
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


def _openssl(*args, cwd):
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """A CA, a server cert for 127.0.0.1/localhost and a client cert, with the openssl CLI."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext", cwd=d)
    return d


def test_grpc_mutual_tls_and_bearer_token(tmp_path):
    d = make_pki(tmp_path)
    read = lambda n: (d / n).read_bytes()  # noqa: E731
    cloud = StubCloud(None)
    cloud.token = "t0k3n"
    stub = GrpcStubThread(cloud, tls=(read("server.key"), read("server.pem"), read("ca.pem")))
    ep = [f"127.0.0.1:{stub.port}"]
    ca, cert, key = str(d / "ca.pem"), str(d / "client.pem"), str(d / "client.key")
    try:
        async def run():
            good = GrpcTransport(ep, tls_ca=ca, tls_cert=cert, tls_key=key, token="t0k3n")
            assert (await good.detect(request(1), 5.0)).frame_seq == 1
            bad_token = GrpcTransport(ep, tls_ca=ca, tls_cert=cert, tls_key=key, token="wrong")
            with pytest.raises(TransportError) as ei:
                await bad_token.detect(request(2), 5.0)
            assert ei.value.status == detect_pb2.UNAUTHENTICATED
            no_client_cert = GrpcTransport(ep, tls_ca=ca, token="t0k3n")
            with pytest.raises(TransportError) as ei:
                await no_client_cert.detect(request(3), 5.0)
            assert ei.value.status == detect_pb2.UNAVAILABLE  # handshake refused by the server
            plaintext = GrpcTransport(ep, token="t0k3n")
            with pytest.raises(TransportError):
                await plaintext.detect(request(4), 2.0)
            for t in (good, bad_token, no_client_cert, plaintext):
                await t.close()
        asyncio.run(run())
    finally:
        stub.stop()
    assert [r.frame_seq for r in cloud.seen] == [1]
