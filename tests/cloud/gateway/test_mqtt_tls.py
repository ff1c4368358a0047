"""The MQTT bridge follows its TLS files (``mqtt.ca_file``, ``mqtt.cert_file``, ``mqtt.key_file``)
without a restart (``cloud.gateway.mqtt_bridge.BridgeTls``).

Before, ``tls_set`` read them once at start and every reconnect used what it had read: after
cert-manager renewed the bridge's client certificate, or the broker's CA was rotated, the bridge
could not connect again until the gateway restarted, and MQTT escalations stopped.

A real Mosquitto with a TLS listener that requires client certificates (``require_certificate
true``) for the bridge, and a plain listener for the test's edge; real certificates made by openssl;
the bridge's files laid out and swapped the way kubelet updates a mounted Secret. The broker is
restarted to take its new files (and to drop the bridge's open connection, which keeps the
certificate its handshake used).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Tuple

import pytest

from cloud.gateway.mqtt_bridge import MqttBridge
from cloud.gateway.mqtt_tls import BridgeTls, load_client_tls
from cloud.gateway.server import Gateway
from edgewise.errors import ConfigError
from edgewise.v1 import detect_pb2
from tests.cloud.gateway.pki import Pki
from tests.cloud.gateway.test_gateway import run, settings_for
from tests.cloud.gateway.test_mqtt_bridge import Edge
from tests.cloud.gateway.workers import TestWorker, request
from tests.conftest import Broker, configured_mosquitto, free_port
from tests.namedpipes import pipe_in_place
from tests.secretvolume import SecretVolume
from tests.waiting import async_wait_until as wait_until

LOGGER = "edgewise.gateway.mqtt"
BROKER_SAN = "DNS:localhost,IP:127.0.0.1"


def _pki(d: Path) -> Pki:
    d.mkdir()
    return Pki(d)


def records(caplog, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


class TlsBroker:
    """A Mosquitto with a plain listener (``broker.port``, for the edge) and a TLS listener
    (``tls_port``, for the bridge) that requires a client certificate signed by ``clients-ca.pem``
    and serves ``server.pem``; :meth:`restart` with other files."""

    def __init__(self, broker: Broker, files: Path, tls_port: int) -> None:
        self.broker = broker
        self.files = files
        self.tls_port = tls_port

    @staticmethod
    def lay_out(files: Path, server: Pki, clients_ca: Pki) -> None:
        # mosquitto runs as root and drops to its own user: it reads them here
        for src, name in ((server.d / "broker.pem", "server.pem"), (server.d / "broker.key", "server.key"),
                          (clients_ca.d / "ca.pem", "clients-ca.pem")):
            shutil.copyfile(src, files / name)
            (files / name).chmod(0o644)

    async def restart(self, server: Pki, clients_ca: Pki) -> None:
        """Serve ``server``'s broker certificate and take clients of ``clients_ca`` only."""
        await asyncio.to_thread(self.broker.stop)
        self.lay_out(self.files, server, clients_ca)
        await asyncio.to_thread(self.broker.start)


@contextlib.contextmanager
def running_tls_broker(server: Pki, clients_ca: Pki) -> Iterator[TlsBroker]:
    """A real Mosquitto with a plain listener (the test's edge or responder) and a TLS listener
    serving ``server``'s certificate and requiring client certificates of ``clients_ca``."""
    files = Path(tempfile.mkdtemp(prefix="ew-mosq-tls-"))
    files.chmod(0o755)
    TlsBroker.lay_out(files, server, clients_ca)
    tls_port = free_port()
    try:
        with configured_mosquitto(f"listener {tls_port} 127.0.0.1\ncafile {files}/clients-ca.pem\n"
                                  f"certfile {files}/server.pem\nkeyfile {files}/server.key\n"
                                  "require_certificate true\n") as broker:
            yield TlsBroker(broker, files, tls_port)
    finally:
        shutil.rmtree(files, ignore_errors=True)


@pytest.fixture
def tls_broker_of() -> Iterator:
    """``tls_broker_of(server, clients_ca)``: a started ``TlsBroker`` (``running_tls_broker``),
    stopped at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda server, clients_ca: stack.enter_context(running_tls_broker(server, clients_ca))


@contextlib.asynccontextmanager
async def tls_bridged_gateway(tb: TlsBroker, vol: SecretVolume) -> AsyncIterator[Tuple[Gateway, MqttBridge]]:
    """A real worker and gateway whose bridge reaches ``tb``'s TLS listener with the files in
    ``vol``: (the gateway, its bridge), both stopped at the end."""
    w = TestWorker("a", 0.005)
    await w.start()
    gw = Gateway(settings_for([(w, 1)], **{
        "mqtt.enabled": True, "mqtt.host": "127.0.0.1", "mqtt.port": tb.tls_port,
        "mqtt.reconnect_min_s": 0.5, "mqtt.reconnect_max_s": 1, "mqtt.tls": True,
        "mqtt.ca_file": str(vol.root / "ca.crt"), "mqtt.cert_file": str(vol.root / "tls.crt"),
        "mqtt.key_file": str(vol.root / "tls.key")}))
    await gw.start()
    try:
        assert gw.bridge is not None and gw.bridge.tls is not None
        yield gw, gw.bridge
    finally:
        await gw.stop(1)
        await w.stop()


async def answered(tb: TlsBroker, seq: int) -> None:
    """An edge's request on the plain listener is answered through the bridge, end to end."""
    edge = await asyncio.to_thread(Edge, tb.broker.host, tb.broker.port)
    corr = f"r{seq}".encode()
    try:
        await asyncio.to_thread(edge.send, request(seq=seq).SerializeToString(), corr)
        await wait_until(lambda: corr in edge.responses, 10, f"the answer to request {seq}")
        assert edge.responses[corr][0].status == detect_pb2.OK
    finally:
        edge.close()


def secret(pki: Pki, ca: Pki, client: str, key_of: str = "") -> dict[str, bytes]:
    """The bridge's Secret: ``ca.crt`` (the broker's CA), ``tls.crt``/``tls.key`` (its client
    certificate ``client``, with the key of ``key_of`` when given)."""
    return {"ca.crt": (ca.d / "ca.pem").read_bytes(), "tls.crt": (pki.d / f"{client}.pem").read_bytes(),
            "tls.key": (pki.d / f"{key_of or client}.key").read_bytes()}


@pytest.mark.parametrize("rotated", ["client certificate", "broker CA and client certificate"])
def test_a_renewed_client_certificate_and_a_rotated_ca_are_used_without_a_restart(
        tmp_path, caplog, tls_broker_of, rotated):
    """The bridge is connected with certificate A of CA 1. The Secret is renewed with certificate
    B of CA 2 (and, second case, the broker's CA bundle rotated to CA 2, whose certificate the
    broker serves from then on); the broker restarts taking clients of CA 2 only, so A is refused.
    The bridge reconnects with B and answers, without a restart; a removed CA is trusted no more."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    ca_rotated = rotated != "client certificate"
    one, two = _pki(tmp_path / "ca1"), _pki(tmp_path / "ca2")
    for pki in (one, two):
        pki.issue("broker", "broker", BROKER_SAN)
    one.issue("bridge-a", "gateway")
    two.issue("bridge-b", "gateway")
    vol = SecretVolume(tmp_path / "mqtt-tls", secret(one, one, "bridge-a"))
    tb = tls_broker_of(one, one)

    async def main() -> None:
        async with tls_bridged_gateway(tb, vol) as (_, bridge):
            assert bridge.tls is not None
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed with certificate A")
            await answered(tb, 1)
            vol.update(secret(two, two if ca_rotated else one, "bridge-b"))  # cert-manager renews, kubelet swaps
            await tb.restart(two if ca_rotated else one, two)  # certificate A is refused from now on
            await wait_until(lambda: not bridge.connected.is_set(), 10, "the disconnect")
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed with certificate B")
            await answered(tb, 2)
            trusted = bridge.tls.context.current.get_ca_certs()
            assert trusted == ssl.create_default_context(cafile=str((two if ca_rotated else one).d / "ca.pem")
                                                         ).get_ca_certs()

    run(main())
    (info,) = records(caplog, logging.INFO, "MQTT bridge TLS files changed")
    assert "the bridge connects with the new files from now on (client certificate valid until " in info
    assert f"mqtt.cert_file {vol.root / 'tls.crt'}" in info and f"mqtt.key_file {vol.root / 'tls.key'}" in info
    assert not records(caplog, logging.ERROR, "TLS files")


def test_a_pair_that_does_not_match_leaves_the_files_in_force_logged_once(tmp_path, caplog, tls_broker_of):
    """The Secret gets certificate B with A's key (as when one is written before the other): one
    ERROR naming the files, however many connection attempts follow; the bridge reconnects with
    A, still in force, and answers. Once B's key follows, B is in force at the next connection."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    pki = _pki(tmp_path / "ca")
    pki.issue("broker", "broker", BROKER_SAN)
    pki.issue("bridge-a", "gateway")
    pki.issue("bridge-b", "gateway")
    vol = SecretVolume(tmp_path / "mqtt-tls", secret(pki, pki, "bridge-a"))
    tb = tls_broker_of(pki, pki)

    async def main() -> None:
        async with tls_bridged_gateway(tb, vol) as (_, bridge):
            assert bridge.tls is not None
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            in_force = bridge.tls.context.current
            vol.update(secret(pki, pki, "bridge-b", key_of="bridge-a"))
            await asyncio.to_thread(tb.broker.stop)
            await wait_until(lambda: bridge.counts.get("connect_failed", 0) >= 2, 10,
                             "two connection attempts, each looking at the files")
            await asyncio.to_thread(tb.broker.start)
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed again, with A")
            await answered(tb, 1)
            assert bridge.tls.context.current is in_force
            assert len(records(caplog, logging.ERROR, "were not put in force")) == 1

            vol.update(secret(pki, pki, "bridge-b"))  # the key follows
            await asyncio.to_thread(tb.broker.stop)
            await asyncio.to_thread(tb.broker.start)
            await wait_until(lambda: records(caplog, logging.INFO, "MQTT bridge TLS files changed"), 15,
                             "B in force")
            await wait_until(bridge.connected.is_set, 15, "the bridge subscribed with B")
            await answered(tb, 2)
            assert bridge.tls.context.current is not in_force

    run(main())
    (error,) = records(caplog, logging.ERROR, "were not put in force")
    assert error.startswith("MQTT bridge TLS files changed (")
    assert f"mqtt.cert_file {vol.root / 'tls.crt'}" in error and f"mqtt.key_file {vol.root / 'tls.key'}" in error
    assert error.endswith("the key does not belong to the certificate")
    assert "the bridge connects with the files it had" in error


def test_files_that_cannot_be_loaded_at_start_are_one_line_naming_them(tmp_path):
    """At start, as before, the gateway does not start; the error names the setting and the file."""
    pki = _pki(tmp_path / "ca")
    pki.issue("a", "a")
    pki.issue("b", "b")
    ca, junk = pki.path("ca.pem"), tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"mqtt.cert_file .*/b.pem and mqtt.key_file .*/a.key: the key does "
                                          r"not belong to the certificate"):
        load_client_tls(ca, pki.path("b.pem"), pki.path("a.key"))
    with pytest.raises(ConfigError, match=r"mqtt.ca_file .*/junk.pem: not a PEM CA bundle"):
        load_client_tls(str(junk), pki.path("a.pem"), pki.path("a.key"))
    with pytest.raises(ConfigError, match=r"mqtt.cert_file .*/gone.pem and mqtt.key_file .*/a.key: cannot be read"):
        load_client_tls(ca, str(tmp_path / "gone.pem"), pki.path("a.key"))


def test_a_named_pipe_in_place_of_a_file_is_refused_without_waiting_on_it(tmp_path):
    """OpenSSL opened a named pipe put where mqtt.ca_file was and waited for a writer for ever (at
    a reconnect, in paho's network thread: the bridge never connected again)."""
    pki = _pki(tmp_path / "ca")
    pki.issue("a", "a")
    with pipe_in_place(tmp_path / "ca.pem") as fifo:
        with pytest.raises(ConfigError, match=r"mqtt.ca_file .*/ca.pem: is a named pipe \(FIFO\), expected a PEM file"):
            load_client_tls(str(fifo), pki.path("a.pem"), pki.path("a.key"))


def test_a_look_never_raises(tmp_path, caplog, monkeypatch):
    """Whatever goes wrong while looking (a bug), paho's network thread goes on with the files in
    force: logged with its traceback."""
    pki = _pki(tmp_path / "ca")
    pki.issue("a", "a")
    key = tmp_path / "a.key"
    shutil.copyfile(pki.d / "a.key", key)
    tls = BridgeTls(pki.path("ca.pem"), pki.path("a.pem"), str(key),
                    wall=lambda: dt.datetime.now(dt.timezone.utc))
    in_force = tls.context.current
    key.write_bytes(key.read_bytes() + b"\n")  # changed

    def broken() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(tls, "load", broken)
    tls.look()
    assert tls.context.current is in_force
    assert records(caplog, logging.ERROR, "looking at the MQTT bridge's TLS files failed")
