"""The device's TLS files, checked at start with real certificates made by openssl."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from edge.preflight import preflight
from edge.settings import load_settings
from edge.tlsfiles import certificate_warnings, check_ca, check_files, check_pair
from edgewise.errors import ConfigError
from tests.cloud.gateway.pki import Pki, openssl
from tests.namedpipes import pipe_in_place


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    p = Pki(tmp_path)
    p.issue("cam", "cam-1")
    p.issue("other", "cam-2")
    return p


def test_a_usable_set_passes_without_warnings(pki: Pki):
    assert check_files(pki.path("ca.pem"), pki.path("cam.pem"), pki.path("cam.key"), "cam-1") == []


@pytest.mark.parametrize("ca, says", [
    ("missing.pem", r"cloud.tls_ca .*missing.pem: cannot be used as a CA bundle \(file not found\)"),
    ("cam.key", r"cloud.tls_ca .*cam.key: cannot be used as a CA bundle"),
    (".", r"cannot be used as a CA bundle \(is a folder\)"),
])
def test_a_ca_bundle_that_is_not_one_is_named(pki: Pki, ca, says):
    with pytest.raises(ConfigError, match=says):
        check_ca(pki.path(ca), "cloud.tls_ca")


def test_a_named_pipe_or_a_device_is_refused_without_waiting_on_it(pki: Pki):
    """A named pipe put where a TLS file was: the check opened it and waited for a writer for ever
    (on the daemon's event loop at a reload); ``/dev/zero`` was read until the memory ran out."""
    with pipe_in_place(pki.d / "renewing.pem") as fifo:
        started = time.monotonic()
        with pytest.raises(ConfigError, match=r"cloud.tls_ca .*renewing.pem: is a named pipe \(FIFO\)"):
            check_ca(str(fifo), "cloud.tls_ca")
        with pytest.raises(ConfigError, match=r"cloud.tls_key .*renewing.pem: is a named pipe \(FIFO\)"):
            check_pair(pki.path("cam.pem"), str(fifo), "cloud.tls_cert", "cloud.tls_key")
        with pytest.raises(ConfigError, match=r"cloud.tls_cert /dev/zero: is a device"):
            check_pair("/dev/zero", pki.path("cam.key"), "cloud.tls_cert", "cloud.tls_key")
        assert time.monotonic() - started < 1.5, "a check waited on the named pipe"


def test_a_key_of_another_certificate_and_a_missing_key_are_named(pki: Pki):
    with pytest.raises(ConfigError, match=r"^k .*other.key: is not the key of c .*cam.pem"):
        check_pair(pki.path("cam.pem"), pki.path("other.key"), "c", "k")
    with pytest.raises(ConfigError, match=r"^k .*nope.key: file not found"):
        check_pair(pki.path("cam.pem"), pki.path("nope.key"), "c", "k")
    with pytest.raises(ConfigError, match=r"cannot be used as a client certificate and key"):
        check_pair(pki.path("ca.cnf"), pki.path("cam.key"), "c", "k")  # not a certificate


def test_an_encrypted_key_is_refused_without_asking_for_a_password(pki: Pki):
    openssl(pki.d, "pkey", "-in", "cam.key", "-aes256", "-passout", "pass:secret", "-out", "enc.key")
    with pytest.raises(ConfigError, match=r"the key is encrypted; the daemon needs it unencrypted"):
        check_pair(pki.path("cam.pem"), pki.path("enc.key"), "c", "k")


def test_expired_future_and_foreign_certificates_are_warnings(pki: Pki):
    pki.issue("old", "cam-1", start="20200101000000Z", end="20200201000000Z")
    [w] = certificate_warnings(pki.path("old.pem"), "cam-1")
    assert "expired on Feb  1 00:00:00 2020 GMT" in w
    [w] = certificate_warnings(pki.path("cam.pem"), "cam-1", now=0.0)  # a Jetson before NTP: 1970
    assert "valid only from" in w and "is this device's clock right (1970-01-01" in w
    [w] = certificate_warnings(pki.path("other.pem"), "cam-1")
    assert "names cam-2, not the device id 'cam-1'" in w
    assert certificate_warnings(pki.path("cam.pem"), "cam-1", now=time.time()) == []


def test_preflight_refuses_a_mismatched_pair_and_warns_about_an_expired_certificate(pki: Pki, tmp_path, caplog):
    """`edge check-config` said ok, and every escalation then spooled forever ("Failed to create
    security handshaker"); over MQTT the daemon stopped with a traceback."""
    def settings(cert: str, key: str):
        cfg = tmp_path / "edge.yaml"
        cfg.write_text(f"device_id: cam-1\nstreams: [{{id: s, kind: synthetic}}]\nmodel: {{path: m.onnx}}\n"
                       f"spool: {{path: {tmp_path / 'state' / 'spool.db'}}}\n"
                       f"cloud: {{endpoints: ['gw.plant.lan:50051'], tls_ca: {pki.path('ca.pem')}, "
                       f"tls_cert: {pki.path(cert)}, tls_key: {pki.path(key)}}}\n")
        return load_settings(str(cfg), env={})

    with pytest.raises(ConfigError, match=r"cloud.tls_key .*other.key: is not the key of cloud.tls_cert"):
        preflight(settings("cam.pem", "other.key"), create=False)
    pki.issue("old", "cam-1", start="20200101000000Z", end="20200201000000Z")
    with caplog.at_level(logging.WARNING, logger="edge.preflight"):
        preflight(settings("old.pem", "old.key"), create=True)
    assert "the certificate expired on" in caplog.text
