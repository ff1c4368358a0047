"""A renewed certificate, and a rotated client CA bundle, are served to new connections without a
restart or a signal (``cloud.gateway.tlsreload``); files that cannot be served leave the current
certificate in force, logged once per change.

A real gateway on port 0 in front of a real gRPC worker server, real certificates made by
openssl, real TLS clients: Python's ``ssl`` module (which certificate the handshake got) and gRPC
(a call end to end). Files are replaced the way kubelet updates a mounted Secret and the way an
in-place writer (certbot-style) does. The decision itself is driven with a fake clock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from cloud.gateway import tlsreload
from cloud.gateway.server import Gateway
from cloud.gateway.settings import load_settings
from cloud.gateway.tlsfiles import ServerFiles
from cloud.gateway.tlsreload import ServedTlsFiles
from edgewise.errors import ConfigError
from edgewise.filewatch import NOTHING, ReloadDecision
from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.pki import Pki, openssl
from tests.cloud.gateway.workers import TestWorker, request
from tests.namedpipes import pipe_in_place
from tests.secretvolume import SecretVolume
from tests.waiting import async_wait_until

SERVER_SAN = "DNS:localhost,IP:127.0.0.1"


@pytest.fixture
def fast_looks(monkeypatch):
    """Look at the files at most every 50 ms (1 s in production): many looks in a short test."""
    monkeypatch.setattr(tlsreload, "RECHECK_S", 0.05)


def _pki(d: Path) -> Pki:
    d.mkdir()
    return Pki(d)


def served_cn(port: int, ca: Path, client: tuple[str, str] | None = None) -> str:
    """A TLS handshake with the gateway (ALPN h2, as gRPC's clients): the subject CN of the
    certificate it served, checked against ``ca`` and the name localhost."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])
    if client is not None:
        ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        peer = tls.getpeercert()
    assert peer, "no certificate served"
    return next(str(value) for rdn in peer["subject"] for key, value in rdn if key == "commonName")


def serves(port: int, ca: Path, cn: str) -> Callable[[], Awaitable[bool]]:
    """For ``async_wait_until``: whether a new handshake gets the certificate named ``cn``."""
    async def check() -> bool:
        return await asyncio.to_thread(served_cn, port, ca) == cn
    return check


async def detect(port: int, ca: bytes, client: tuple[bytes, bytes] | None = None) -> str:
    """One Detect over a new TLS channel (``client``: key, chain); the status code's name."""
    key, chain = client if client else (None, None)
    creds = grpc.ssl_channel_credentials(ca, key, chain)
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
        try:
            await service_pb2_grpc.EscalationStub(ch).Detect(request(device="cam-1"), timeout=5)
            return "OK"
        except grpc.aio.AioRpcError as exc:
            return exc.code().name


async def gateway(worker: TestWorker, **tls: object) -> Gateway:
    gw = Gateway(load_settings(None, {"listen": "127.0.0.1:0", "metrics_port": -1,
                                      "discovery.static": [worker.address], **tls}, env={}))
    await gw.start()
    return gw


def messages(caplog, text: str, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.levelno == level]


@pytest.mark.parametrize("how", ["kubelet", "in_place"])
def test_a_renewed_certificate_is_served_without_a_restart(tmp_path, caplog, how):
    pki = _pki(tmp_path / "pki")
    pki.issue("old", "gateway-old", SERVER_SAN)
    pki.issue("new", "gateway-new", SERVER_SAN, end="20991231235959Z")  # its own end of validity
    ca = pki.d / "ca.pem"
    old_key, old_cert = pki.read("old")
    new_key, new_cert = pki.read("new")
    if how == "kubelet":  # cert-manager renews the Secret, kubelet swaps the mounted folder's ..data link
        vol = SecretVolume(tmp_path / "tls", {"tls.crt": old_cert, "tls.key": old_key})
        cert, key = vol.root / "tls.crt", vol.root / "tls.key"

        def renew() -> None:
            vol.update({"tls.crt": new_cert, "tls.key": new_key})
    else:  # files rewritten where they are (same inode), the key first
        cert, key = tmp_path / "server.pem", tmp_path / "server.key"
        cert.write_bytes(old_cert)
        key.write_bytes(old_key)

        def renew() -> None:
            key.write_bytes(new_key)
            cert.write_bytes(new_cert)
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = await gateway(w, **{"tls.cert_file": str(cert), "tls.key_file": str(key)})
        expiry = "edgewise_gateway_tls_certificate_expiry_timestamp_seconds"
        try:
            assert await asyncio.to_thread(served_cn, gw.port, ca) == "gateway-old"
            day_ahead = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).timestamp()
            assert abs(gw.metrics.registry.get_sample_value(expiry) - day_ahead) < 600  # the old one's, a day
            async with grpc.aio.secure_channel(f"localhost:{gw.port}", grpc.ssl_channel_credentials(
                    ca.read_bytes())) as open_before:
                stub = service_pb2_grpc.EscalationStub(open_before)
                await stub.Detect(request(device="cam-1"), timeout=5)
                renew()
                await async_wait_until(serves(gw.port, ca, "gateway-new"), 10,
                                       "the renewed certificate served to a new connection")
                assert await detect(gw.port, ca.read_bytes()) == "OK"  # a new gRPC connection end to end
                await stub.Detect(request(device="cam-1"), timeout=5)  # the connection opened before goes on
            assert gw.tls_files is not None and gw.tls_files.not_after > dt.datetime.now(dt.timezone.utc)
            # the exported end of validity follows the renewal (what an expiry alert reads)
            assert gw.metrics.registry.get_sample_value(expiry) == dt.datetime(
                2099, 12, 31, 23, 59, 59, tzinfo=dt.timezone.utc).timestamp()
        finally:
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    served = messages(caplog, "TLS files changed: serving the new certificate (valid until ")
    assert served and f"tls.cert_file {cert}" in served[-1], served
    if how == "kubelet":  # one atomic swap: one reload, nothing refused
        assert len(served) == 1 and f"tls.key_file {key}" in served[0], served
        assert not messages(caplog, "TLS files changed", logging.ERROR)


def test_files_that_cannot_be_served_leave_the_current_certificate_logged_once(tmp_path, caplog, fast_looks):
    pki = _pki(tmp_path / "pki")
    pki.issue("old", "gateway-old", SERVER_SAN)
    pki.issue("new", "gateway-new", SERVER_SAN)
    ca = pki.d / "ca.pem"
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    old_key, old_cert = pki.read("old")
    cert.write_bytes(old_cert)
    key.write_bytes(old_key)
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    def refused() -> list[str]:
        return messages(caplog, "but were not put in force, the current certificate is still served", logging.ERROR)

    async def served_for_a_while(gw: Gateway, expected: str) -> None:
        """Handshakes for 0.5 s: about ten looks at the same files."""
        loop = asyncio.get_running_loop()
        until = loop.time() + 0.5
        while loop.time() < until:
            assert await asyncio.to_thread(served_cn, gw.port, ca) == expected
            await asyncio.sleep(0.02)

    async def refusals_after_a_handshake(gw: Gateway) -> int:
        await asyncio.to_thread(served_cn, gw.port, ca)  # a new connection: gRPC asks for the files
        return len(refused())

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = await gateway(w, **{"tls.cert_file": str(cert), "tls.key_file": str(key)})
        try:
            # the certificate is renewed but the key is not (yet): the pair does not match
            cert.write_bytes(pki.read("new")[1])
            await async_wait_until(lambda: refusals_after_a_handshake(gw), 10, "the mismatched pair refused")
            await served_for_a_while(gw, "gateway-old")
            assert len(refused()) == 1, refused()
            assert (f"tls.cert_file {cert} and tls.key_file {key}: the key does not belong to the certificate"
                    in refused()[0]), refused()
            assert await detect(gw.port, ca.read_bytes()) == "OK"  # the old pair still serves

            # a file that does not parse: refused once more
            cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
            async def refused_twice() -> bool:
                return await refusals_after_a_handshake(gw) >= 2
            await async_wait_until(refused_twice, 10, "the broken file refused")
            await served_for_a_while(gw, "gateway-old")
            assert len(refused()) == 2 and "not a PEM certificate and private key" in refused()[1], refused()

            # the matching pair in place: served
            new_key, new_cert = pki.read("new")
            key.write_bytes(new_key)
            cert.write_bytes(new_cert)
            await async_wait_until(serves(gw.port, ca, "gateway-new"), 10,
                                   "the fixed pair served")
            assert await detect(gw.port, ca.read_bytes()) == "OK"
        finally:
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert len(refused()) == 2, refused()
    assert len(messages(caplog, "TLS files changed: serving the new certificate")) == 1


def test_a_rotated_client_ca_is_honored_for_new_connections(tmp_path, caplog):
    old_ca_pki = _pki(tmp_path / "old-ca")
    old_ca_pki.issue("server", "gateway", SERVER_SAN)
    old_ca_pki.issue("cam", "cam-1")
    new_ca_pki = _pki(tmp_path / "new-ca")
    new_ca_pki.issue("cam", "cam-1")
    server_ca = (old_ca_pki.d / "ca.pem").read_bytes()  # what edges check the gateway with
    vol = SecretVolume(tmp_path / "tls", {"tls.crt": old_ca_pki.read("server")[1],
                                          "tls.key": old_ca_pki.read("server")[0],
                                          "ca.crt": (old_ca_pki.d / "ca.pem").read_bytes()})
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = await gateway(w, **{"tls.cert_file": str(vol.root / "tls.crt"), "tls.key_file": str(vol.root / "tls.key"),
                                 "tls.client_ca_file": str(vol.root / "ca.crt"), "tls.require_client_cert": True})
        try:
            old_device, new_device = old_ca_pki.read("cam"), new_ca_pki.read("cam")
            assert [await detect(gw.port, server_ca, c) for c in (old_device, new_device, None)] == \
                ["OK", "UNAVAILABLE", "UNAVAILABLE"]
            # the devices' CA is rotated: the Secret's ca.crt now holds the new CA only
            vol.update({"tls.crt": old_ca_pki.read("server")[1], "tls.key": old_ca_pki.read("server")[0],
                        "ca.crt": (new_ca_pki.d / "ca.pem").read_bytes()})
            async def new_device_accepted() -> bool:
                return await detect(gw.port, server_ca, new_device) == "OK"
            await async_wait_until(new_device_accepted, 10, "a certificate of the new CA accepted")
            # mutual TLS is still required, and the old CA no longer honored
            assert [await detect(gw.port, server_ca, c) for c in (old_device, None)] == ["UNAVAILABLE", "UNAVAILABLE"]
        finally:
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    served = messages(caplog, "TLS files changed: serving the new certificate")
    assert len(served) == 1 and f"tls.client_ca_file {vol.root / 'ca.crt'}" in served[0], served


def test_an_emptied_client_ca_bundle_is_refused_at_start_and_at_a_reload(tmp_path, caplog, fast_looks):
    """An editor writing the devices' CA bundle in place empties it first: ``ssl`` took the empty
    file (it then loads the system's CAs instead), and gRPC served mutual TLS trusting no device,
    every device refused until the file was written again (or, at start, for ever, without a word)."""
    pki = _pki(tmp_path / "pki")
    pki.issue("server", "gateway", SERVER_SAN)
    pki.issue("cam", "cam-1")
    server_ca = (pki.d / "ca.pem").read_bytes()
    client_ca = tmp_path / "ca.crt"
    client_ca.write_bytes(b"")
    tls = {"tls.cert_file": pki.path("server.pem"), "tls.key_file": pki.path("server.key"),
           "tls.client_ca_file": str(client_ca), "tls.require_client_cert": True}
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    async def main():
        w = TestWorker("w")
        await w.start()
        try:
            try:
                await (await gateway(w, **tls)).stop(0)
                problem = "the gateway started"
            except ConfigError as exc:
                problem = str(exc)
            assert f"tls.client_ca_file {client_ca}: not a PEM CA bundle" in problem, problem
            client_ca.write_bytes(server_ca)
            gw = await gateway(w, **tls)
            try:
                assert await detect(gw.port, server_ca, pki.read("cam")) == "OK"
                client_ca.write_bytes(b"")  # the truncation of an in-place write
                async def refused() -> bool:
                    await detect(gw.port, server_ca, pki.read("cam"))  # a new connection: gRPC asks for the files
                    return bool(messages(caplog, "but were not put in force", logging.ERROR))
                await async_wait_until(refused, 10, "the emptied bundle refused")
                assert [await detect(gw.port, server_ca, pki.read("cam")) for _ in range(3)] == ["OK"] * 3
            finally:
                await gw.stop(0)
        finally:
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert not messages(caplog, "TLS files changed: serving the new certificate")
    refusals = messages(caplog, "but were not put in force", logging.ERROR)
    assert len(refusals) == 1 and f"tls.client_ca_file {client_ca}: not a PEM CA bundle" in refusals[0], refusals


def test_a_client_ca_bundle_with_non_ascii_comments_is_served(tmp_path):
    """A bundle whose comment lines are UTF-8 (``# Issuer: CN=...Főtanúsítvány``, as certifi's and
    other generated bundles have; OpenSSL and gRPC read only the PEM blocks): the check decoded
    it with U+FFFD for each such byte, and ``ssl`` refuses a str that is not ASCII with a
    TypeError, so the gateway ended in a traceback at start (at a reload, a traceback a minute)."""
    pki = _pki(tmp_path / "pki")
    pki.issue("server", "gateway", SERVER_SAN)
    pki.issue("cam", "cam-1")
    server_ca = (pki.d / "ca.pem").read_bytes()
    client_ca = tmp_path / "ca.crt"
    client_ca.write_bytes("# Issuer: CN=NetLock Arany (Class Gold) Főtanúsítvány\n".encode() + server_ca)
    tls = {"tls.cert_file": pki.path("server.pem"), "tls.key_file": pki.path("server.key"),
           "tls.client_ca_file": str(client_ca), "tls.require_client_cert": True}

    async def main():
        w = TestWorker("w")
        await w.start()
        try:
            gw = await gateway(w, **tls)
            try:
                assert await detect(gw.port, server_ca, pki.read("cam")) == "OK"
            finally:
                await gw.stop(0)
        finally:
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_certificate_file_with_text_before_its_block_is_served(tmp_path):
    """``openssl pkcs12 -nokeys`` (a .pfx converted to PEM) writes ``Bag Attributes``, ``subject=``
    and ``issuer=`` lines before each block, which OpenSSL and gRPC skip: the gateway read the
    certificate's validity from the file's start and refused to start ("cannot read its
    validity (Invalid PEM encoding; must start with -----BEGIN CERTIFICATE-----)")."""
    pki = _pki(tmp_path / "pki")
    pki.issue("server", "gateway", SERVER_SAN)
    server_ca = (pki.d / "ca.pem").read_bytes()
    cert = tmp_path / "server.pem"
    cert.write_bytes(b"Bag Attributes\n    localKeyID: 01 00 00 00\nsubject=CN = gateway\nissuer=CN = ca\n"
                     + pki.read("server")[1])

    async def main():
        w = TestWorker("w")
        await w.start()
        try:
            gw = await gateway(w, **{"tls.cert_file": str(cert), "tls.key_file": pki.path("server.key")})
            try:
                assert await detect(gw.port, server_ca) == "OK"
            finally:
                await gw.stop(0)
        finally:
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_an_encrypted_key_is_refused_at_start_and_at_a_reload_never_prompted_for(tmp_path, caplog, fast_looks):
    """An encrypted key (there is no passphrase setting): OpenSSL asked the terminal for its
    passphrase, holding the start, or at a reload the gRPC thread asking for the certificate,
    until someone typed; without a terminal the load ended in ``OSError: [Errno 22]``, no
    ConfigError: a traceback at start, and a traceback and a new try every second at a reload."""
    pki = _pki(tmp_path / "pki")
    pki.issue("server", "gateway", SERVER_SAN)
    openssl(pki.d, "ec", "-in", "server.key", "-aes256", "-passout", "pass:secret", "-out", "encrypted.key")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_bytes(pki.read("server")[1])
    key.write_bytes((pki.d / "encrypted.key").read_bytes())
    caplog.set_level(logging.INFO, logger="edgewise.gateway")
    encrypted = f"tls.cert_file {cert} and tls.key_file {key}: the key is encrypted"

    async def main():
        w = TestWorker("w")
        await w.start()
        try:
            try:
                await (await gateway(w, **{"tls.cert_file": str(cert), "tls.key_file": str(key)})).stop(0)
                problem = "the gateway started"
            except ConfigError as exc:
                problem = str(exc)
            assert encrypted in problem, problem
            key.write_bytes(pki.read("server")[0])
            gw = await gateway(w, **{"tls.cert_file": str(cert), "tls.key_file": str(key)})
            try:
                key.write_bytes((pki.d / "encrypted.key").read_bytes())
                async def refused() -> bool:
                    await detect(gw.port, (pki.d / "ca.pem").read_bytes())  # a new connection: gRPC asks
                    return bool(messages(caplog, "but were not put in force", logging.ERROR))
                await async_wait_until(refused, 10, "the encrypted key refused")
                assert [await detect(gw.port, (pki.d / "ca.pem").read_bytes()) for _ in range(3)] == ["OK"] * 3
            finally:
                await gw.stop(0)
        finally:
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    refusals = messages(caplog, "but were not put in force", logging.ERROR)
    assert len(refusals) == 1 and encrypted in refusals[0], refusals
    assert not messages(caplog, "looking at the TLS files failed", logging.ERROR)


def test_a_named_pipe_put_where_the_certificate_was_is_refused_without_waiting_on_it(tmp_path, caplog, fast_looks):
    """A named pipe in place of tls.cert_file: the look read it, in the gRPC thread asking for the
    certificate, and waited for a writer for ever; no new connection was served again (each
    Detect ended in DEADLINE_EXCEEDED) and the gateway's stop never ended."""
    pki = _pki(tmp_path / "pki")
    pki.issue("server", "gateway", SERVER_SAN)
    ca = (pki.d / "ca.pem").read_bytes()
    cert = tmp_path / "server.pem"
    cert.write_bytes(pki.read("server")[1])
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = await gateway(w, **{"tls.cert_file": str(cert), "tls.key_file": pki.path("server.key")})
        try:
            assert await detect(gw.port, ca) == "OK"
            with pipe_in_place(cert):
                async def refused() -> bool:
                    await detect(gw.port, ca)  # a new connection: gRPC asks for the files
                    return bool(messages(caplog, "but were not put in force", logging.ERROR))
                await async_wait_until(refused, 20, "the named pipe refused")
                assert [await detect(gw.port, ca) for _ in range(3)] == ["OK"] * 3
        finally:
            await asyncio.wait_for(gw.stop(0), 20)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 90))
    refusals = messages(caplog, "but were not put in force", logging.ERROR)
    assert len(refusals) == 1 and f"tls.cert_file {cert}: is a named pipe (FIFO)" in refusals[0], refusals


# --------------------------------------------------------------------------- the decision, pure

def _files(name: str) -> ServerFiles:
    t = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    return ServerFiles(name.encode(), b"key", None, t, t)


class Disk:
    """What a look at the files sees (identities) and what a load gives; counts both."""

    def __init__(self) -> None:
        self.ids: tuple = (("c", 1), ("k", 1), None)
        self.looks = self.loads = 0
        self.result: ServerFiles | ConfigError = _files("v1")
        self.written_during_load = False

    def identities(self) -> tuple:
        self.looks += 1
        return self.ids

    def load(self) -> ServerFiles:
        self.loads += 1
        if self.written_during_load:
            self.ids = (self.ids[0], ("k", self.ids[1][1] + 1), None)
            self.written_during_load = False
        if isinstance(self.result, ConfigError):
            raise self.result
        return self.result


def test_the_decision_looks_once_a_second_and_loads_only_on_change():
    disk = Disk()
    d = ReloadDecision(disk.ids, now=100.0, interval_s=1.0)
    assert d.look(100.5, disk.identities, disk.load) is NOTHING and disk.looks == 0  # not due yet
    assert d.look(101.0, disk.identities, disk.load) is NOTHING and (disk.looks, disk.loads) == (1, 0)
    for t in (101.1, 101.5, 101.9):  # a storm of connections within the second: no look at all
        assert d.look(t, disk.identities, disk.load) is NOTHING
    assert disk.looks == 1

    disk.ids = (("c", 2), ("k", 2), None)
    disk.result = _files("v2")
    out = d.look(102.0, disk.identities, disk.load)
    assert out.files == _files("v2") and out.changed == (0, 1) and out.problem is None
    assert d.look(103.0, disk.identities, disk.load) is NOTHING and disk.loads == 1


def test_the_decision_reports_a_refusal_once_per_change():
    disk = Disk()
    d = ReloadDecision(disk.ids, now=0.0, interval_s=1.0)
    disk.ids = (("c", 2), ("k", 1), None)  # the certificate written, not yet its key
    disk.result = ConfigError("tls: the key does not belong to the certificate")
    out = d.look(1.0, disk.identities, disk.load)
    assert out.problem == "tls: the key does not belong to the certificate" and out.files is None
    assert out.changed == (0,)
    for t in (2.0, 3.0, 4.0):
        assert d.look(t, disk.identities, disk.load) is NOTHING
    assert disk.loads == 1
    disk.ids = (("c", 2), ("k", 2), None)  # now the key
    disk.result = _files("v2")
    out = d.look(5.0, disk.identities, disk.load)
    assert out.files == _files("v2") and out.changed == (0, 1)
    assert d.refused is None and d.served == disk.ids


def test_refused_files_are_tried_again_once_a_minute_and_a_problem_is_reported_once():
    """A read error that passes (EIO on a network volume, EMFILE) refuses files that did not change:
    without the retry, a renewal that met it would wait for the next renewal."""
    disk = Disk()
    d = ReloadDecision(disk.ids, now=0.0, interval_s=1.0)
    assert d.retry_s == 60.0
    disk.ids = (("c", 2), ("k", 2), None)  # renewed
    disk.result = ConfigError("tls.cert_file c: cannot be read (Input/output error)")
    out = d.look(1.0, disk.identities, disk.load)
    assert out.problem == "tls.cert_file c: cannot be read (Input/output error)" and out.changed == (0, 1)
    for t in (2.0, 30.0, 60.9):
        assert d.look(t, disk.identities, disk.load) is NOTHING
    assert disk.loads == 1
    assert d.look(62.0, disk.identities, disk.load) is NOTHING and disk.loads == 2  # the same problem: not again
    disk.result = ConfigError("tls: the key does not belong to the certificate")
    assert d.look(122.0, disk.identities, disk.load).problem == "tls: the key does not belong to the certificate"
    assert d.look(150.0, disk.identities, disk.load) is NOTHING and disk.loads == 3
    disk.result = _files("v2")  # the error has passed: the renewal, unchanged on disk, goes in force
    out = d.look(182.0, disk.identities, disk.load)
    assert out.files == _files("v2") and out.changed == (0, 1) and d.served == disk.ids and d.refused is None
    assert d.look(300.0, disk.identities, disk.load) is NOTHING and disk.loads == 4


def test_files_written_while_read_are_read_again_at_the_next_look():
    disk = Disk()
    d = ReloadDecision(disk.ids, now=0.0, interval_s=1.0)
    disk.ids = (("c", 2), ("k", 1), None)
    disk.result = _files("torn")
    disk.written_during_load = True  # the key is written while the pair is read
    assert d.look(1.0, disk.identities, disk.load) is NOTHING and disk.loads == 1
    disk.result = _files("v2")
    out = d.look(2.0, disk.identities, disk.load)
    assert out.files == _files("v2") and disk.loads == 2


def test_fetch_never_raises(tmp_path, caplog):
    pki = _pki(tmp_path / "pki")
    pki.issue("server", "gateway", SERVER_SAN)
    now = [0.0]
    served = ServedTlsFiles(pki.path("server.pem"), pki.path("server.key"), "", False, clock=lambda: now[0])
    assert served.fetch() is None  # nothing changed (and no look due)

    def broken() -> ServerFiles:
        raise RuntimeError("a bug")
    served.load = broken  # type: ignore[method-assign]
    (pki.d / "server.pem").write_bytes((pki.d / "server.pem").read_bytes())  # touched: a change
    with caplog.at_level(logging.ERROR, logger="edgewise.gateway"):
        for t in (5.0, 10.0, 15.0):
            now[0] = t
            assert served.fetch() is None
    failed = [r for r in caplog.records if "looking at the TLS files failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None  # with its traceback, a few per minute


def test_a_gateway_without_tls_exports_no_certificate_expiry():
    """The expiry series exists only where a certificate is served (a 0 would read as expired)."""

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = await gateway(w)
        try:
            return gw.metrics.registry.get_sample_value("edgewise_gateway_tls_certificate_expiry_timestamp_seconds")
        finally:
            await gw.stop(0)
            await w.stop()

    assert asyncio.run(asyncio.wait_for(main(), 30)) is None
