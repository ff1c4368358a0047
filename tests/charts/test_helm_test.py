"""``helm test`` in every documented TLS mode, run for real: certificates made with openssl,
Secrets created with kubectl (client dry run), the chart rendered, the gateway started
from the rendered gateway.yaml with the files those Secrets provide, and the helm test
pod's own args and env run against it. The test pod's arguments must point at files
that the Secrets provide, or the mode fails here with the missing path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from cloud.local import LocalCloud
from tests.charts.helm import NAMESPACE, RELEASE, render
from tests.charts.simcluster import SimCluster
from tests.cloud.gateway.pki import Pki

SERVICE = f"{RELEASE}-edgewise-gateway"
TOKENS = "- {device: helm-test, token: probe-s3cret}\n- {device: cam-1, token: cam-s3cret}\n"

# mode -> (server certificate SANs, kubectl commands, chart values, env of the probe)
MODES: Dict[str, Tuple[str, List[str], Tuple[str, ...], Dict[str, str]]] = {
    # a certificate from a CA the probe image trusts (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH stands
    # in for a public root here), for the gateway's public name
    "public-ca": ("DNS:gateway.example.com",
                  ["create secret tls gw-tls --cert=server.pem --key=server.key"],
                  ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls", "helmTest.serverName=gateway.example.com"),
                  {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": "ca.pem"}),
    # a private CA in its own Secret; the server Secret has no ca.crt (the issue's FileNotFoundError)
    "private-ca": ("DNS:gateway.example.com",
                   ["create secret tls gw-tls --cert=server.pem --key=server.key",
                    "create secret generic gw-ca --from-file=ca.crt=ca.pem"],
                   ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls", "helmTest.caSecret=gw-ca",
                    "helmTest.serverName=gateway.example.com"), {}),
    # mutual TLS and device tokens; the CA in the server Secret (cert-manager's layout),
    # the certificate for the Service name, the probe's certificate for helmTest.deviceId
    "mtls-tokens": (f"DNS:{SERVICE},DNS:{SERVICE}.{NAMESPACE}.svc",
                    ["create secret generic gw-tls --type=kubernetes.io/tls --from-file=tls.crt=server.pem "
                     "--from-file=tls.key=server.key --from-file=ca.crt=ca.pem",
                     "create secret tls probe-tls --cert=probe.pem --key=probe.key",
                     "create secret generic edge-tokens --from-file=tokens.yaml",
                     "create secret generic probe-token --from-literal=token=probe-s3cret"],
                    ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls", "tls.grpc.clientAuth=true",
                     "helmTest.caSecret=gw-tls", "helmTest.clientTlsSecret=probe-tls",
                     "gateway.tokensSecret=edge-tokens", "helmTest.tokenSecret=probe-token"), {}),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_helm_test_passes_in_tls_mode(mode: str, tmp_path: Path, tiny_model: Path) -> None:
    sans, commands, sets, env = MODES[mode]
    pki = Pki(tmp_path)
    pki.issue("server", SERVICE, sans)
    pki.issue("probe", "helm-test")
    (tmp_path / "tokens.yaml").write_text(TOKENS)
    cluster = SimCluster(tmp_path, NAMESPACE)
    for cmd in commands:
        cluster.kubectl(["-n", NAMESPACE, *cmd.split()])
    docs = render(*sets)
    settings = cluster.gateway_settings(docs)
    assert settings["tls.cert_file"].endswith("/etc/edgewise/tls/tls.crt")
    with LocalCloud(tiny_model, workers=1, gateway_settings=settings) as cloud:
        out = cluster.run_helm_test(docs, cloud.address, env={k: str(tmp_path / v) for k, v in env.items()})
        assert out.returncode == 0, out.stdout + out.stderr
        assert json.loads(out.stdout.strip().splitlines()[-1])["status"] == "OK"
        if mode == "mtls-tokens":  # the gateway really checks: no token, no answer
            cluster.secrets["probe-token"]["token"] = b"wrong"
            out = cluster.run_helm_test(docs, cloud.address)
            assert out.returncode == 1 and "UNAUTHENTICATED" in out.stdout, out.stdout
