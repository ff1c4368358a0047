"""`edgewise cloud probe` (the helm test hook) against a real local cloud."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cloud.local import LocalCloud
from cloud.probe import probe, probe_frame
from edgewise.v1 import detect_pb2
from tests.cloud.gateway.pki import Pki
from tests.conftest import free_port


def test_probe_frame_is_deterministic() -> None:
    a, b = probe_frame(seed=1), probe_frame(seed=1)
    assert a.shape == (480, 640, 3) and a.dtype.name == "uint8" and (a == b).all()


def test_probe_through_real_gateway(tiny_model) -> None:
    with LocalCloud(tiny_model, workers=1) as cloud:
        resp = probe(cloud.address, timeout=30)
        assert resp.status == detect_pb2.OK and resp.worker_id
        out = subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", "--target", cloud.address,
                              "--timeout", "30"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["status"] == "OK" and report["round_trip_ms"] > 0


@pytest.mark.timeout(60)
def test_probe_fails_clearly_without_gateway() -> None:
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", "--target", f"127.0.0.1:{port}",
                          "--timeout", "2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert f"cannot connect to 127.0.0.1:{port}" in out.stdout


@pytest.mark.timeout(60)
def test_probe_names_an_ipv6_target_as_its_certificate_carries_it() -> None:
    """The TLS hint names the address a certificate's IP SAN holds (::1), not the bracketed form of
    the target ([::1]), which no certificate carries."""
    import socket

    with socket.socket(socket.AF_INET6) as s:  # a port nothing listens on
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", "--target", f"[::1]:{port}",
                          "--timeout", "2", "--tls"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "is the certificate valid for '::1'" in out.stdout, out.stdout


def _probe_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    """A private CA, a gateway certificate for a public name only, and the probe's client certificate."""
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("server", "gateway.example.com", "DNS:gateway.example.com")
    p.issue("probe", "helm-test")
    return p


def test_probe_tls_modes_against_a_real_gateway(tiny_model, pki: Pki) -> None:
    """A certificate for a public name, reached by address: verified with --tls-server-name;
    without it the handshake fails and says which name it checked. mTLS with a client certificate."""
    settings = {"tls.cert_file": pki.path("server.pem"), "tls.key_file": pki.path("server.key"),
                "tls.client_ca_file": pki.path("ca.pem"), "tls.require_client_cert": True}
    with LocalCloud(tiny_model, workers=1, gateway_settings=settings) as cloud:
        client = ("--tls-cert", pki.path("probe.pem"), "--tls-key", pki.path("probe.key"), "--device-id", "helm-test")
        ok = _probe_cli("--target", cloud.address, "--timeout", "30", "--tls-ca", pki.path("ca.pem"),
                        "--tls-server-name", "gateway.example.com", *client)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert json.loads(ok.stdout.strip().splitlines()[-1])["status"] == "OK"
        wrong_name = _probe_cli("--target", cloud.address, "--timeout", "3", "--tls-ca", pki.path("ca.pem"), *client)
        assert wrong_name.returncode == 1
        assert f"is the certificate valid for '{cloud.address.split(':')[0]}'" in wrong_name.stdout
        no_client_cert = _probe_cli("--target", cloud.address, "--timeout", "3", "--tls-ca", pki.path("ca.pem"),
                                    "--tls-server-name", "gateway.example.com")
        assert no_client_cert.returncode == 1 and "cannot connect" in no_client_cert.stdout


@pytest.mark.parametrize("args, message", [
    (("--tls-ca", "/nonexistent/ca.crt"), "probe: --tls-ca /nonexistent/ca.crt: No such file or directory"),
    (("--tls-cert", "{pki}/probe.pem"), "probe: --tls-cert needs --tls-key"),
    (("--tls-key", "{pki}/probe.key"), "probe: --tls-key needs --tls-cert"),
    (("--tls-ca", "{pki}/ca.cnf"), "probe: --tls-ca {pki}/ca.cnf: not a PEM file"),
    (("--tls-ca", "{pki}/ca.pem", "--tls-cert", "{pki}/probe.pem", "--tls-key", "/nonexistent/k"),
     "probe: --tls-key /nonexistent/k: No such file or directory"),
])
def test_probe_unusable_tls_file_is_one_line(pki: Pki, args: tuple, message: str) -> None:
    out = _probe_cli("--target", f"127.0.0.1:{free_port()}", "--timeout", "2", *(a.format(pki=pki.d) for a in args))
    assert out.returncode == 2
    assert out.stdout.strip().startswith(message.format(pki=pki.d)), out.stdout
    assert len(out.stdout.strip().splitlines()) == 1 and "Traceback" not in out.stdout + out.stderr


@pytest.mark.parametrize("args, message", [
    # each waited out its 10 s, then said it could not connect
    (("--target", "gateway"), "probe: --target: 'gateway' is not 'host:port'"),
    (("--target", "127.0.0.1:99999"), "probe: --target: '127.0.0.1:99999': port 99999 is outside 1..65535"),
    # NaN waited forever; inf and 1e300 were an OverflowError traceback; 0 and -1 never connected
    (("--target", "127.0.0.1:50051", "--timeout", "nan"), "probe: --timeout nan: must be a number of seconds in (0, 3600]"),
    (("--target", "127.0.0.1:50051", "--timeout", "inf"), "probe: --timeout inf: must be"),
    (("--target", "127.0.0.1:50051", "--timeout", "1e300"), "probe: --timeout 1e+300: must be"),
    (("--target", "127.0.0.1:50051", "--timeout", "0"), "probe: --timeout 0: must be"),
    (("--target", "127.0.0.1:50051", "--timeout", "-1"), "probe: --timeout -1: must be"),
])
@pytest.mark.timeout(60)
def test_probe_unusable_target_or_timeout_is_one_line_at_once(args: tuple, message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "edgewise.cli", "cloud", "probe", *args], capture_output=True,
                         text=True, timeout=40)
    assert (out.returncode, out.stderr) == (2, ""), out.stdout + out.stderr
    assert out.stdout.startswith(message) and out.stdout.count("\n") == 1, out.stdout


def test_probe_sends_no_wall_clock_deadline(monkeypatch) -> None:
    """A probe host whose clock is behind the gateway's must not always get DEADLINE_EXCEEDED:
    the request carries no deadline_unix_ns; the call's timeout bounds it."""
    import cloud.probe as probe_mod

    sent = []

    class Stub:
        def __init__(self, channel) -> None:
            pass

        def Detect(self, req, timeout, metadata):
            sent.append((req, timeout))
            return detect_pb2.DetectResponse(status=detect_pb2.OK)

    class Ready:
        def result(self, timeout):
            return None

    monkeypatch.setattr(probe_mod.service_pb2_grpc, "EscalationStub", Stub)
    monkeypatch.setattr(probe_mod.grpc, "channel_ready_future", lambda channel: Ready())
    assert probe(f"127.0.0.1:{free_port()}", timeout=7).status == detect_pb2.OK
    ((req, timeout),) = sent
    assert req.deadline_unix_ns == 0 and timeout == 7


@pytest.mark.timeout(120)
def test_probe_endless_tls_file_is_refused_at_its_size_cap() -> None:
    """--tls-ca /dev/zero was read until the memory ran out (a MemoryError traceback under a limit,
    the kernel's kill without one). The probe runs under a 2 GiB address-space limit here."""
    limited = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, "
               "(2 << 30, 2 << 30)); os.execvp(sys.argv[1], sys.argv[1:])"]
    out = subprocess.run([*limited, sys.executable, "-m", "edgewise.cli", "cloud", "probe", "--target",
                          f"127.0.0.1:{free_port()}", "--timeout", "2", "--tls-ca", "/dev/zero"],
                         capture_output=True, text=True, timeout=100)
    assert (out.returncode, out.stderr) == (2, ""), out.stdout + out.stderr[-2000:]
    assert out.stdout == "probe: --tls-ca /dev/zero: holds more than 1048576 bytes; is this the right file?\n"
