"""The Helm chart: lint, render every mode, validate every manifest, reject bad values.

Manifests are validated with kubernetes-validate --strict against Kubernetes 1.29
and 1.33. The two CRD kinds the chart can emit (KEDA ScaledObject, Prometheus
Operator ServiceMonitor) have no schema there; they are checked against the
subset of their CRD schemas in ``CRD_SCHEMAS`` below.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Dict, List

import jsonschema
import pytest
import yaml

from tests.charts.helm import CHART, helm, render

BAD = Path(__file__).parent / "bad-values"
K8S_VERSIONS = ("1.29.0", "1.33.0")

MODES = {
    "default": (),
    "hpa": ("autoscaling.mode=hpa",),
    "keda": ("autoscaling.mode=keda",),
    "none": ("autoscaling.mode=none",),
    "broker-on": ("mqtt.bridge.enabled=true", "mqtt.broker.enabled=true", "mqtt.broker.authSecret=mqtt-auth"),
    "broker-external": ("mqtt.bridge.enabled=true", "mqtt.external.host=broker.example"),
    "tls-on": ("tls.grpc.enabled=true", "tls.grpc.secretName=gw-tls", "tls.grpc.clientAuth=true",
               "mqtt.bridge.enabled=true", "mqtt.broker.enabled=true", "tls.mqtt.enabled=true",
               "tls.mqtt.secretName=mqtt-tls", "gateway.tokensSecret=edge-tokens",
               "helmTest.tokenSecret=probe-token", "helmTest.clientTlsSecret=probe-tls",
               "mqtt.broker.authSecret=mqtt-auth"),
    "cpu": ("worker.profile=cpu", "model.source=pvc", "model.pvc.claimName=models"),
    "init-model": ("model.source=initContainer", "model.initContainer.image=registry/models:1"),
    "servicemonitor": ("serviceMonitor.enabled=true",),
}

# Subsets of the published CRD schemas (KEDA v2.x keda.sh_scaledobjects.yaml,
# prometheus-operator monitoring.coreos.com_servicemonitors.yaml): the fields we emit.
CRD_SCHEMAS: Dict[str, Dict[str, Any]] = {
    "ScaledObject": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "spec": {
                "type": "object", "required": ["scaleTargetRef", "triggers"], "additionalProperties": False,
                "properties": {
                    "scaleTargetRef": {"type": "object", "required": ["name"],
                                       "properties": {"name": {"type": "string"}, "kind": {"type": "string"},
                                                      "apiVersion": {"type": "string"}}, "additionalProperties": False},
                    "minReplicaCount": {"type": "integer"}, "maxReplicaCount": {"type": "integer"},
                    "pollingInterval": {"type": "integer"}, "cooldownPeriod": {"type": "integer"},
                    "advanced": {"type": "object"},
                    "triggers": {"type": "array", "items": {
                        "type": "object", "required": ["type", "metadata"], "additionalProperties": False,
                        "properties": {"type": {"type": "string"}, "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                                       "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                       "name": {"type": "string"}}}},
                },
            },
        },
    },
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "spec": {"type": "object", "required": ["selector"], "additionalProperties": False,
                     "properties": {"selector": {"type": "object"},
                                    "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                                        "port": {"type": "string"}, "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}},
                                        "additionalProperties": False}}}},
        },
    },
}


def validate_manifest(doc: Dict[str, Any], version: str) -> None:
    import kubernetes_validate

    kind = doc["kind"]
    if kind in CRD_SCHEMAS:
        jsonschema.validate(doc, CRD_SCHEMAS[kind])
        return
    kubernetes_validate.validate(doc, version, strict=True)


def test_lint_strict() -> None:
    out = subprocess.run([helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("mode", sorted(MODES))
def test_mode_renders_and_validates(mode: str) -> None:
    docs = render(*MODES[mode])
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds
    for version in K8S_VERSIONS:
        for doc in docs:
            validate_manifest(doc, version)
    out = subprocess.run([helm(), "lint", "--strict", str(CHART), *sum((["--set", s] for s in MODES[mode]), [])],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def _by_kind(docs: List[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_autoscaling_modes_emit_their_objects() -> None:
    assert _by_kind(render(*MODES["hpa"]), "HorizontalPodAutoscaler")[0]["apiVersion"] == "autoscaling/v2"
    assert _by_kind(render(*MODES["keda"]), "ScaledObject")
    builtin = render()
    names = [d["metadata"]["name"] for d in _by_kind(builtin, "Deployment")]
    assert "rel-edgewise-autoscaler" in names
    role = [r for r in _by_kind(builtin, "Role") if r["metadata"]["name"].endswith("autoscaler")][0]
    # Least privilege: only the worker Deployment's scale subresource, only get/patch.
    scale_rule = [r for r in role["rules"] if "deployments/scale" in r["resources"]][0]
    assert scale_rule["verbs"] == ["get", "patch"] and scale_rule["resourceNames"] == ["rel-edgewise-worker"]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])
    # HPA/KEDA own the replica count: the Deployment must not fight them.
    hpa_worker = [d for d in _by_kind(render(*MODES["hpa"]), "Deployment") if d["metadata"]["name"].endswith("worker")][0]
    assert "replicas" not in hpa_worker["spec"]


def test_gpu_default_and_cpu_profile() -> None:
    worker = [d for d in _by_kind(render(), "Deployment") if d["metadata"]["name"].endswith("worker")][0]
    pod = worker["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert c["image"].endswith("-cuda")
    cpu = [d for d in _by_kind(render(*MODES["cpu"]), "Deployment") if d["metadata"]["name"].endswith("worker")][0]
    c = cpu["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert not c["image"].endswith("-cuda")
    assert cpu["spec"]["template"]["spec"]["volumes"][-1]["persistentVolumeClaim"]["claimName"] == "models"


def test_headless_worker_service_and_grpc_probes() -> None:
    docs = render()
    svc = [s for s in _by_kind(docs, "Service") if s["metadata"]["name"].endswith("worker")][0]
    assert svc["spec"]["clusterIP"] == "None"
    for dep in _by_kind(docs, "Deployment"):
        if dep["metadata"]["name"].endswith(("gateway", "worker")):
            c = dep["spec"]["template"]["spec"]["containers"][0]
            assert "grpc" in c["readinessProbe"] and "grpc" in c["livenessProbe"]


def test_helm_test_hook_sends_a_detection() -> None:
    pods = [p for p in _by_kind(render(), "Pod") if p["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert len(pods) == 1
    args = pods[0]["spec"]["containers"][0]["args"]
    assert args[:2] == ["cloud", "probe"] and any(a.startswith("--target=rel-edgewise-gateway:") for a in args)


def _pod_specs(docs: List[Dict[str, Any]]):
    for d in docs:
        if d["kind"] == "Deployment":
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            yield d["metadata"]["name"], d["spec"]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_container_is_locked_down(mode: str) -> None:
    for name, spec in _pod_specs(render(*MODES[mode])):
        psc = spec.get("securityContext", {})
        assert psc.get("runAsNonRoot") is True, name
        assert psc.get("runAsUser", 0) != 0, name
        assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            where = f"{name}/{c['name']}"
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert "resources" in c and c["resources"].get("limits"), where


def test_helm_test_authenticates_when_auth_is_on() -> None:
    pod = [p for p in _by_kind(render(*MODES["tls-on"]), "Pod")][0]["spec"]
    c = pod["containers"][0]
    assert "--tls-cert=/etc/edgewise/client-tls/tls.crt" in c["args"] and "--tls-ca=/etc/edgewise/tls/ca.crt" in c["args"]
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "probe-token", "key": "token"}
    assert {v["name"] for v in pod["volumes"]} >= {"grpc-tls", "client-tls"}


def test_servicemonitor_scrapes_each_pod_once() -> None:
    docs = render(*MODES["servicemonitor"])
    sel = _by_kind(docs, "ServiceMonitor")[0]["spec"]["selector"]["matchLabels"]
    scraped = [s["metadata"]["name"] for s in _by_kind(docs, "Service")
               if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
    assert sorted(scraped) == ["rel-edgewise-gateway", "rel-edgewise-worker"]


def test_tls_mounts_secrets_and_configures_gateway() -> None:
    docs = render(*MODES["tls-on"])
    gw = [d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway")][0]
    vols = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    assert vols["grpc-tls"]["secret"]["secretName"] == "gw-tls"
    assert vols["mqtt-tls"]["secret"]["secretName"] == "mqtt-tls"
    cm = [c for c in _by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("gateway")][0]
    cfg = yaml.safe_load(cm["data"]["gateway.yaml"])
    assert cfg["tls"]["client_ca_file"] == "/etc/edgewise/tls/ca.crt" and cfg["tls"]["require_client_cert"]
    # other tls settings of gateway.config survive the chart's own
    cm = [c for c in _by_kind(render(*MODES["tls-on"], "gateway.config.tls.client_identity=san_uri"), "ConfigMap")
          if c["metadata"]["name"].endswith("gateway")][0]
    tls = yaml.safe_load(cm["data"]["gateway.yaml"])["tls"]
    assert tls["client_identity"] == "san_uri" and tls["cert_file"] == "/etc/edgewise/tls/tls.crt"
    assert cfg["mqtt"]["port"] == 8883 and cfg["mqtt"]["tls"] is True
    conf = [c for c in _by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("mosquitto")][0]["data"]["mosquitto.conf"]
    assert "allow_anonymous false" in conf and "certfile /mosquitto/tls/tls.crt" in conf
    assert "listener 1883" not in conf and "listener 8883" in conf


def test_policy_configmap_is_a_valid_policy() -> None:
    cm = [c for c in _by_kind(render(), "ConfigMap") if c["metadata"]["name"].endswith("policy")][0]
    policy = yaml.safe_load(cm["data"]["policy.yaml"])
    assert policy["kind"] == "EscalationPolicy"
    parse = pytest.importorskip("edgewise.policy").parse_policy
    parse(cm["data"]["policy.yaml"], "chart:policy.yaml")


@pytest.mark.parametrize("bad", sorted(BAD.glob("*.yaml")), ids=lambda p: p.stem)
def test_bad_values_rejected_with_message(bad: Path) -> None:
    expect = bad.read_text().splitlines()[0].removeprefix("# expect: ").strip()
    out = subprocess.run([helm(), "template", "rel", str(CHART), "-f", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0, f"{bad.name} was accepted"
    assert expect in out.stderr, out.stderr


@pytest.mark.parametrize("mode", sorted(MODES))
def test_rendered_gateway_config_loads_in_the_gateway(mode: str, tmp_path) -> None:
    """The chart and the gateway agree on every key: the gateway's own loader accepts it."""
    import inspect

    from cloud.discovery.kubernetes import KubernetesDiscovery
    from cloud.gateway.settings import load_settings

    cm = [c for c in _by_kind(render(*MODES[mode]), "ConfigMap") if c["metadata"]["name"].endswith("gateway")][0]
    path = tmp_path / "gateway.yaml"
    path.write_text(cm["data"]["gateway.yaml"])
    settings = load_settings(path, env={})
    assert settings.discovery.kind == "kubernetes"
    inspect.signature(KubernetesDiscovery).bind(**settings.discovery.kubernetes)
    assert settings.listen == "0.0.0.0:50051" and settings.metrics_port == 9100


@pytest.mark.parametrize("mode", ["default", "cpu", "tls-on"])
def test_container_args_parse_with_the_real_cli(mode: str) -> None:
    """Every edgewise container's args are accepted by the CLI they will run."""
    from edgewise.cli import build_parser

    parser = build_parser()
    seen = set()
    for name, spec in _pod_specs(render(*MODES[mode])):
        for c in spec["containers"]:
            args = c.get("args")
            if not args or args[0] not in ("cloud", "edge", "model"):
                continue
            ns = parser.parse_args(args)
            assert callable(ns.func), name
            seen.add(args[1])
    assert {"gateway", "worker", "autoscaler", "probe"} <= seen
