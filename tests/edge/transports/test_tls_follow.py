"""The edge's transports follow their TLS files (``cloud.tls_ca``, ``cloud.tls_cert``,
``cloud.tls_key``) without a restart.

Before, the gRPC transport built its channel credentials once at start and the MQTT connection
called paho's ``tls_set`` once: a client certificate renewed on the device (``step ca renew
--daemon``, ``edgewise edge provision``) or a rotated CA bundle was used only after the daemon
restarted, and once the old certificate expired every reconnect was refused and escalations spooled.

Real components: the real gateway in-process (``cloud.gateway.server.Gateway``, mutual TLS) in
front of a real gRPC worker, a real Mosquitto that requires client certificates, real
certificates made by openssl, the files swapped the way kubelet updates a mounted Secret or
rewritten in place. A rollout: the cloud restarts trusting only the new CA, so a reconnect that
presents the old certificate is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import sys
from pathlib import Path
from typing import Iterator, Tuple

import grpc
import pytest

if sys.version_info < (3, 10):  # the Jetson lane's 3.8 has no cloud tier to run in-process
    pytest.skip("the in-process gateway needs Python >= 3.10 (the Jetson lane checks the device against a "
                "gateway process instead)", allow_module_level=True)

from cloud.gateway.server import Gateway
from cloud.gateway.settings import load_settings
from edge.transports import TransportError
from edge.transports.grpc import GrpcTransport
from edge.transports.mqtt import MqttConnection, MqttTransport
from tests.cloud.gateway.pki import Pki, openssl
from tests.cloud.gateway.test_mqtt_tls import TlsBroker, running_tls_broker
from tests.cloud.gateway.workers import TestWorker, request
from tests.conftest import free_port
from tests.edge.transports.test_mqtt_refusals import Responder
from tests.namedpipes import pipe_in_place
from tests.secretvolume import SecretVolume
from tests.waiting import async_wait_until

SAN = "DNS:localhost,IP:127.0.0.1"
GRPC_LOG = "edge.transports.grpc"
MQTT_LOG = "edge.transports.mqtt"


class NamedPki(Pki):
    """A ``Pki`` whose CA has its own name: two CAs of one name in one bundle (a rotation) would be
    told apart by signature only, which TLS libraries do not do."""

    def __init__(self, d: Path) -> None:
        super().__init__(d)
        openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-days", "2", "-keyout", "ca.key", "-out", "ca.pem", "-subj", f"/CN=edgewise-test-{d.name}")


def _pki(d: Path) -> Pki:
    d.mkdir()
    return NamedPki(d)


def two_cas(tmp_path: Path, server: str, cn: str) -> Tuple[Pki, Pki]:
    """CA 1 and CA 2, each with a server certificate ``server`` (CN ``cn``); the edge's
    certificate A of CA 1 and B of CA 2."""
    one, two = _pki(tmp_path / "ca1"), _pki(tmp_path / "ca2")
    for pki in (one, two):
        pki.issue(server, cn, SAN)
    one.issue("edge-a", "cam-1")
    two.issue("edge-b", "cam-1")
    return one, two


class Clock:
    """The transport's monotonic clock, moved by the test (the gRPC transport looks at its files
    at most once a second)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, s: float = 1.0) -> None:
        self.now += s


def records(caplog, logger: str, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == logger and r.levelno == level and text in r.getMessage()]


async def mtls_gateway(worker: TestWorker, server: Pki, client_ca: Path, port: int = 0) -> Gateway:
    """A gateway serving ``server``'s certificate that requires client certificates of ``client_ca``."""
    gw = Gateway(load_settings(None, {
        "listen": f"127.0.0.1:{port}", "metrics_port": -1, "discovery.static": [worker.address],
        "tls.cert_file": server.path("server.pem"), "tls.key_file": server.path("server.key"),
        "tls.client_ca_file": str(client_ca), "tls.require_client_cert": True}, env={}))
    await gw.start()
    return gw


@pytest.mark.parametrize("how", ["kubelet", "in_place"])
def test_grpc_a_renewed_certificate_is_used_after_a_rollout_without_a_restart(tmp_path, caplog, how):
    """The edge connects with certificate A of CA 1 through a gateway that trusts CA 1 and CA 2 (a
    rotation under way). Its files are renewed to certificate B of CA 2 (kubelet: the Secret with a
    CA bundle of both CAs, the gateway's new certificate being of CA 2; in place: key then
    certificate rewritten). The next call goes over new channels presenting B, while a call in
    flight on the old channel ends normally. Then the rollout: the gateway stops and a new one
    starts on the same port trusting only CA 2; the transport's next call succeeds. Before, the
    channel reconnected presenting A: UNAVAILABLE, until the daemon restarted."""
    caplog.set_level(logging.INFO, logger=GRPC_LOG)
    one, two = two_cas(tmp_path, "server", "gateway")
    ca1, ca2 = (one.d / "ca.pem").read_bytes(), (two.d / "ca.pem").read_bytes()
    both = tmp_path / "both-cas.pem"
    both.write_bytes(ca1 + ca2)
    a_key, a_cert = one.read("edge-a")
    b_key, b_cert = two.read("edge-b")
    if how == "kubelet":
        vol = SecretVolume(tmp_path / "tls", {"ca.crt": ca1, "tls.crt": a_cert, "tls.key": a_key})
        ca, cert, key = vol.root / "ca.crt", vol.root / "tls.crt", vol.root / "tls.key"
        new_server = two  # the rollout's gateway serves a certificate of the new CA

        def renew() -> None:
            vol.update({"ca.crt": ca1 + ca2, "tls.crt": b_cert, "tls.key": b_key})
    else:
        ca, cert, key = tmp_path / "ca.pem", tmp_path / "edge.pem", tmp_path / "edge.key"
        ca.write_bytes(ca1)
        cert.write_bytes(a_cert)
        key.write_bytes(a_key)
        new_server = one

        def renew() -> None:  # an agent rewriting the files where they are
            key.write_bytes(b_key)
            cert.write_bytes(b_cert)
    clock = Clock()

    async def main() -> None:
        w = TestWorker("w", service_s=0.3, concurrency=4)
        await w.start()
        gw = await mtls_gateway(w, one, both)
        port = gw.port
        t = GrpcTransport([f"localhost:{port}"], str(ca), str(cert), str(key), clock=clock)
        try:
            await t.start()
            assert (await t.detect(request(seq=1), 5.0)).frame_seq == 1  # with A
            first = list(t.channels)
            in_flight = asyncio.ensure_future(t.detect(request(seq=2), 5.0))
            await async_wait_until(lambda: w.in_flight >= 1, 5, "a call in flight")
            renew()
            clock.advance()
            assert not in_flight.done()
            assert (await t.detect(request(seq=3), 5.0)).frame_seq == 3  # new channels, with B
            assert t.channels[0] is not first[0], "the renewed files were not put in force"
            assert (await in_flight).frame_seq == 2  # the old channel's call was not cut short
            await async_wait_until(lambda: first[0].get_state() == grpc.ChannelConnectivity.SHUTDOWN, 5,
                                   "the old channel closed once its call ended")

            await gw.stop(0)  # the rollout: only certificates of CA 2 from now on
            gw = await mtls_gateway(w, new_server, two.d / "ca.pem", port)
            clock.advance()
            assert (await t.detect(request(seq=4), 5.0)).frame_seq == 4
        finally:
            await t.close()
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    (info,) = records(caplog, GRPC_LOG, logging.INFO, "TLS files changed")
    assert "the gRPC transport connects with the new files from now on" in info
    assert f"cloud.tls_cert {cert}" in info and f"cloud.tls_key {key}" in info
    assert (f"cloud.tls_ca {ca}" in info) == (how == "kubelet"), info
    assert not records(caplog, GRPC_LOG, logging.ERROR, "TLS files")


def test_grpc_files_that_cannot_be_used_keep_the_channels_logged_once_per_change(tmp_path, caplog):
    """A certificate written before its key: the pair does not match. The transport goes on with
    the channels in force (certificate A), one ERROR naming the settings and the problem however
    many calls follow; a CA bundle that does not parse: one more. Once the key and the bundle are
    right, the new files are in force at the next look, not before a second has passed."""
    caplog.set_level(logging.INFO, logger=GRPC_LOG)
    pki = _pki(tmp_path / "ca")
    pki.issue("server", "gateway", SAN)
    pki.issue("edge-a", "cam-1")
    pki.issue("edge-b", "cam-1")
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "edge.pem", tmp_path / "edge.key"
    ca.write_bytes((pki.d / "ca.pem").read_bytes())
    key.write_bytes(pki.read("edge-a")[0])
    cert.write_bytes(pki.read("edge-a")[1])
    clock = Clock()

    def errors() -> list[str]:
        return records(caplog, GRPC_LOG, logging.ERROR, "TLS files changed")

    async def main() -> None:
        w = TestWorker("w")
        await w.start()
        gw = await mtls_gateway(w, pki, pki.d / "ca.pem")
        t = GrpcTransport([f"localhost:{gw.port}"], str(ca), str(cert), str(key), clock=clock)
        try:
            await t.start()
            in_force = list(t.channels)
            cert.write_bytes(pki.read("edge-b")[1])  # the certificate first: A's key does not match it
            for seq in range(1, 5):
                clock.advance()
                assert (await t.detect(request(seq=seq), 5.0)).frame_seq == seq
            assert t.channels == in_force and len(errors()) == 1, errors()

            ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")  # another change: reported
            clock.advance()
            assert (await t.detect(request(seq=5), 5.0)).frame_seq == 5
            assert t.channels == in_force and len(errors()) == 2, errors()

            key.write_bytes(pki.read("edge-b")[0])
            ca.write_bytes((pki.d / "ca.pem").read_bytes())
            clock.advance(0.5)  # no look within a second of the last one
            assert (await t.detect(request(seq=6), 5.0)).frame_seq == 6
            assert t.channels == in_force
            clock.advance(0.5)
            assert (await t.detect(request(seq=7), 5.0)).frame_seq == 7
            assert t.channels[0] is not in_force[0]
        finally:
            await t.close()
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    first, second = errors()
    assert first.startswith(f"TLS files changed (cloud.tls_cert {cert}) but were not put in force: the gRPC "
                            "transport connects with the files it had; they are read again when they change, "
                            "and tried again every 60 s: ")
    assert f"cloud.tls_key {key}: is not the key of cloud.tls_cert {cert}" in first, first
    assert f"cloud.tls_ca {ca}: cannot be used as a CA bundle" in second, second
    assert len(records(caplog, GRPC_LOG, logging.INFO, "TLS files changed")) == 1


def test_grpc_a_named_pipe_put_where_the_ca_bundle_was_is_refused_without_blocking_the_loop(tmp_path, caplog):
    """A named pipe in place of cloud.tls_ca: the look before a call opened it to check it, on the
    daemon's event loop, and waited for a writer for ever: no escalation, no frame went on. Now
    it is refused by name (one ERROR) and the calls go on over the channels in force."""
    caplog.set_level(logging.INFO, logger=GRPC_LOG)
    pki = _pki(tmp_path / "ca")
    pki.issue("server", "gateway", SAN)
    pki.issue("edge-a", "cam-1")
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "edge.pem", tmp_path / "edge.key"
    ca.write_bytes((pki.d / "ca.pem").read_bytes())
    key.write_bytes(pki.read("edge-a")[0])
    cert.write_bytes(pki.read("edge-a")[1])
    clock = Clock()

    async def main() -> None:
        w = TestWorker("w")
        await w.start()
        gw = await mtls_gateway(w, pki, pki.d / "ca.pem")
        t = GrpcTransport([f"localhost:{gw.port}"], str(ca), str(cert), str(key), clock=clock)
        try:
            await t.start()
            with pipe_in_place(ca):
                loop = asyncio.get_running_loop()
                for seq in range(1, 4):
                    clock.advance()
                    started = loop.time()
                    assert (await t.detect(request(seq=seq), 5.0)).frame_seq == seq
                    assert loop.time() - started < 1.5, "the call waited on the named pipe"
        finally:
            await t.close()
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    errors = records(caplog, GRPC_LOG, logging.ERROR, "TLS files changed")
    assert len(errors) == 1 and f"cloud.tls_ca {ca}: is a named pipe (FIFO), expected a PEM file" in errors[0], errors


# --------------------------------------------------------------------------- MQTT

@pytest.fixture
def tls_broker() -> Iterator:
    """``tls_broker(server, clients_ca)``: a started ``TlsBroker`` (a plain listener for the test's
    responder, a TLS listener requiring client certificates of ``clients_ca`` for the edge),
    stopped at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda server, clients_ca: stack.enter_context(running_tls_broker(server, clients_ca))


def edge_secret(ca: bytes, pki: Pki, name: str, key_of: str = "") -> dict[str, bytes]:
    return {"ca.crt": ca, "tls.crt": (pki.d / f"{name}.pem").read_bytes(),
            "tls.key": (pki.d / f"{key_of or name}.key").read_bytes()}


def tls_connection(tb: TlsBroker, vol: SecretVolume) -> MqttConnection:
    conn = MqttConnection("127.0.0.1", tb.tls_port, client_id="cam-1-edge", tls=True,
                          tls_ca=str(vol.root / "ca.crt"), tls_cert=str(vol.root / "tls.crt"),
                          tls_key=str(vol.root / "tls.key"))
    conn.client.reconnect_delay_set(min_delay=1, max_delay=1)  # the test's pace (1-30 s in production)
    return conn


def test_mqtt_reconnects_with_a_renewed_certificate_and_rotated_ca_without_a_restart(
        tmp_path, caplog, tls_broker):
    """The edge is connected with certificate A of CA 1 to a broker serving a certificate of CA 1.
    The edge's files are renewed (certificate B of CA 2, the CA bundle rotated to CA 2) and the
    broker restarts serving a certificate of CA 2 and taking clients of CA 2 only. The edge
    reconnects with the new files and its escalations are answered, without a restart. Before,
    paho reconnected with what ``tls_set`` had read at start, refused for good."""
    caplog.set_level(logging.INFO, logger=MQTT_LOG)
    one, two = two_cas(tmp_path, "broker", "broker")
    vol = SecretVolume(tmp_path / "edge-tls", edge_secret((one.d / "ca.pem").read_bytes(), one, "edge-a"))
    tb = tls_broker(one, one)
    conn = tls_connection(tb, vol)
    responder = Responder(tb.broker)

    async def main() -> None:
        t = MqttTransport(conn, "cam-1")
        await t.start()
        conn.start()
        await async_wait_until(conn.connected.is_set, 10, "the edge connected with certificate A")

        async def answered(seq: int) -> bool:
            try:
                return (await t.detect(request(seq=seq), 1.0)).frame_seq == seq
            except TransportError:
                return False  # the response subscription may still be settling
        await async_wait_until(lambda: answered(1), 10, "an answer with certificate A")
        vol.update(edge_secret((two.d / "ca.pem").read_bytes(), two, "edge-b"))
        await tb.restart(two, two)
        await async_wait_until(lambda: answered(2), 15, "an answer after the broker's restart, with certificate B")
        await t.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
        assert conn.tls_context is not None
        assert conn.tls_context.current.get_ca_certs() == ssl.create_default_context(
            cafile=str(two.d / "ca.pem")).get_ca_certs()  # CA 1 trusted no more
    finally:
        responder.close()
        conn.stop()
    (info,) = records(caplog, MQTT_LOG, logging.INFO, "TLS files changed")
    assert "the MQTT connection connects with the new files from now on" in info
    for setting, name in (("tls_ca", "ca.crt"), ("tls_cert", "tls.crt"), ("tls_key", "tls.key")):
        assert f"cloud.{setting} {vol.root / name}" in info, info
    assert not records(caplog, MQTT_LOG, logging.ERROR, "TLS files")


def test_mqtt_a_pair_that_does_not_match_keeps_the_files_in_force_logged_once(tmp_path, caplog):
    """Before each connection attempt (paho's ``on_pre_connect``, as paho calls it) the files are
    looked at: a certificate without its key is refused once however many attempts follow, and
    the context in force stays; once the key follows, the next attempt uses the new files."""
    caplog.set_level(logging.INFO, logger=MQTT_LOG)
    pki = _pki(tmp_path / "ca")
    pki.issue("edge-a", "cam-1")
    pki.issue("edge-b", "cam-1")
    ca = (pki.d / "ca.pem").read_bytes()
    vol = SecretVolume(tmp_path / "edge-tls", edge_secret(ca, pki, "edge-a"))
    conn = MqttConnection("127.0.0.1", free_port(), client_id="cam-1-edge", tls=True,
                          tls_ca=str(vol.root / "ca.crt"), tls_cert=str(vol.root / "tls.crt"),
                          tls_key=str(vol.root / "tls.key"))
    assert conn.tls_context is not None and conn.client.on_pre_connect is not None
    in_force = conn.tls_context.current
    vol.update(edge_secret(ca, pki, "edge-b", key_of="edge-a"))
    for _ in range(3):
        conn.client.on_pre_connect(conn.client, None)
    assert conn.tls_context.current is in_force
    (error,) = records(caplog, MQTT_LOG, logging.ERROR, "TLS files changed")
    assert error.startswith("TLS files changed (cloud.tls_ca ") and f"cloud.tls_cert {vol.root / 'tls.crt'}" in error
    assert "but were not put in force: the MQTT connection connects with the files it had" in error
    assert f"cloud.tls_key {vol.root / 'tls.key'}: is not the key of cloud.tls_cert" in error
    vol.update(edge_secret(ca, pki, "edge-b"))
    conn.client.on_pre_connect(conn.client, None)
    assert conn.tls_context.current is not in_force
    assert len(records(caplog, MQTT_LOG, logging.INFO, "TLS files changed")) == 1
