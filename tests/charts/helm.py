"""``helm template`` of the chart, shared by the chart tests, the docs walkthrough and the
container smoke test: ``helm``/``kubectl``, the modes the chart tests render, and
validation of each manifest (kubernetes-validate --strict for built-in kinds, the CRD
subsets of ``tests/charts/crds.py`` for the rest)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import jsonschema
import pytest
import yaml

from tests.charts.crds import CRD_SCHEMAS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "edgewise"
VALUES = Path(__file__).parent / "values"
RELEASE, NAMESPACE = "rel", "ml"
K8S_VERSIONS = ("1.29.0", "1.33.0")


def tool(name: str) -> str:
    """``helm`` or ``kubectl`` from .cache/tools (``make helm``) or the PATH."""
    for cand in (ROOT / ".cache" / "tools" / name, shutil.which(name)):
        if cand and os.path.exists(str(cand)):
            return str(cand)
    pytest.fail(f"{name} is not installed: `make helm` puts it in .cache/tools")
    raise AssertionError


def helm() -> str:
    return tool("helm")


def helm_args(*sets: str) -> List[str]:
    """``--set`` for each ``key=value``; ``@name`` is ``-f tests/charts/values/name.yaml``."""
    out: List[str] = []
    for s in sets:
        out += ["-f", str(VALUES / f"{s[1:]}.yaml")] if s.startswith("@") else ["--set", s]
    return out


def render_text(*sets: str, values: Optional[Path] = None, release: str = RELEASE, namespace: str = NAMESPACE,
                extra: Tuple[str, ...] = ()) -> str:
    cmd = [helm(), "template", release, str(CHART), "--namespace", namespace, *helm_args(*sets)]
    if values:
        cmd += ["-f", str(values)]
    out = subprocess.run([*cmd, *extra], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def render(*sets: str, values: Optional[Path] = None, release: str = RELEASE,
           namespace: str = NAMESPACE) -> List[Dict[str, Any]]:
    """The manifests of ``release`` (``rel``) in ``namespace`` (``ml``) with ``--set`` values
    ``sets`` (``@name``: a file of tests/charts/values/) and a values file."""
    return [d for d in yaml.safe_load_all(render_text(*sets, values=values, release=release, namespace=namespace))
            if d]


MODES: Dict[str, Tuple[str, ...]] = {
    "default": (),
    "hpa": ("autoscaling.mode=hpa",),
    "keda": ("autoscaling.mode=keda",),
    "none": ("autoscaling.mode=none",),
    "broker-on": ("mqtt.bridge.enabled=true", "mqtt.broker.enabled=true", "mqtt.broker.authSecret=mqtt-auth"),
    "broker-external": ("mqtt.bridge.enabled=true", "mqtt.external.host=broker.example"),
    # helm test TLS modes: a certificate from a public CA; a private CA in its own Secret and a
    # certificate for a public name; mutual TLS with tokens (the CA in the server's Secret).
    "tls-public-ca": ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls"),
    "tls-private-ca": ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls", "helmTest.caSecret=gw-ca",
                       "helmTest.serverName=gateway.example.com"),
    "tls-on": ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls", "tls.grpc.clientAuth=true",
               "helmTest.caSecret=gw-tls", "mqtt.bridge.enabled=true", "mqtt.broker.enabled=true",
               "tls.mqtt.enabled=true", "tls.mqtt.secretName=mqtt-tls", "gateway.tokensSecret=edge-tokens",
               "helmTest.tokenSecret=probe-token", "helmTest.clientTlsSecret=probe-tls",
               "mqtt.broker.authSecret=mqtt-auth"),
    "cpu": ("worker.profile=cpu", "model.source=pvc", "model.pvc.claimName=models"),
    "init-model": ("model.source=initContainer", "model.initContainer.image=registry/models:1"),
    "servicemonitor": ("serviceMonitor.enabled=true",),
    "observability": ("serviceMonitor.enabled=true", "prometheusRule.enabled=true", "grafanaDashboard.enabled=true"),
    "exposed": ("@exposed",),
    "passthroughs": ("@passthroughs",),
    "engine-cache-pvc": ("worker.engineCache.type=pvc", "worker.engineCache.pvc.storageClassName=shared-rwx"),
    "engine-cache-claim": ("worker.engineCache.type=pvc", "worker.engineCache.pvc.claimName=engines"),
    "engine-cache-hostpath": ("worker.engineCache.type=hostPath",),
    "single-gateway": ("gateway.replicas=1",),
    # an existing ServiceAccount (no chart-made ones): the gateway's Role is bound to it
    "existing-sa": ("serviceAccount.create=false", "serviceAccount.name=edgewise-sa", "autoscaling.mode=hpa"),
    # a private registry: a pinned tag and pull secrets on every pod, the broker's and the test's included
    "private-registry": ("image.tag=0.2.0", "imagePullSecrets[0].name=regcred", "mqtt.bridge.enabled=true",
                         "mqtt.broker.enabled=true"),
    # every image pinned by digest (image.digest, image.cudaDigest, the broker's and a model image's)
    "digest-pinned": ("@digest-pinned",),
    # a workload identity per ServiceAccount (serviceAccount.gateway/autoscaler.annotations)
    "service-accounts": ("@service-accounts",),
}


def validate_manifest(doc: Dict[str, Any], version: str) -> None:
    import kubernetes_validate

    kind = doc["kind"]
    if kind in CRD_SCHEMAS:
        jsonschema.validate(doc, CRD_SCHEMAS[kind])
        return
    kubernetes_validate.validate(doc, version, strict=True)


def by_kind(docs: List[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: List[Dict[str, Any]], kind: str, suffix: str) -> Dict[str, Any]:
    """The one ``kind`` whose name ends in ``suffix``."""
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {[d['metadata']['name'] for d in by_kind(docs, kind)]}"
    return found[0]


def pod_specs(docs: List[Dict[str, Any]]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    for d in docs:
        if d["kind"] == "Deployment":
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            yield d["metadata"]["name"], d["spec"]


def helm_test_pod(docs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The ``helm test`` pod."""
    pods = [p for p in by_kind(docs, "Pod") if p["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert len(pods) == 1
    return pods[0]
