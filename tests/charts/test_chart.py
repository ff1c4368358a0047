"""The Helm chart: lint, render every mode, validate every manifest, reject bad values with
a sentence, and render what each value promises (PDBs that a drain can satisfy, release-scoped
autoscaling queries, the engine cache, pass-throughs, Ingress / GRPCRoute, observability).

Manifests are validated with kubernetes-validate --strict against Kubernetes 1.29 and 1.33;
the custom resources against the CRD subsets in ``tests/charts/crds.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.charts.helm import (
    CHART,
    K8S_VERSIONS,
    MODES,
    ROOT,
    VALUES,
    by_kind,
    helm,
    helm_args,
    helm_test_pod,
    named,
    pod_specs,
    render,
    render_text,
    validate_manifest,
)

BAD = Path(__file__).parent / "bad-values"


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
    out = subprocess.run([helm(), "lint", "--strict", str(CHART), *helm_args(*MODES[mode])],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


# --------------------------------------------------------------------------- defaults that are true

def test_kube_version_is_the_supported_window() -> None:
    """Chart.yaml refuses clusters older than the README's window and renders inside it."""
    window = re.search(r"Kubernetes (\d+\.\d+)–(\d+\.\d+) through the Helm chart", (ROOT / "README.md").read_text())
    assert window, "README.md no longer states the supported Kubernetes window"
    low, high = window.groups()
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == f">={low}.0-0"
    for version in (f"{low}.0", f"{high}.0"):
        render_text(extra=("--kube-version", version))
    older = f"{low.split('.')[0]}.{int(low.split('.')[1]) - 1}.0"
    out = subprocess.run([helm(), "template", "rel", str(CHART), "--kube-version", older],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "kubeVersion" in out.stderr, out.stderr


def test_description_and_notes_follow_the_shipped_model() -> None:
    from edgewise.runtime.metadata import load_model_info
    from edgewise_tools.images import image_files

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    shipped = image_files()[values["model"]["path"]]  # the file the image bakes in at that path
    arch = load_model_info(shipped).metadata["edgewise_arch"]  # e.g. yolov5s
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert arch.lower() in chart["description"].lower() and "yolov5x" not in chart["description"].lower()
    out = subprocess.run([helm(), "install", "rel", str(CHART), "--dry-run=client", "-n", "ml"],
                         capture_output=True, text=True)
    notes = out.stdout.split("NOTES:", 1)[1]
    assert f"Workers: 2 x {Path(values['model']['path']).name}" in notes and arch.lower() in notes.lower(), notes


def test_helm_show_readme_is_the_generated_page() -> None:
    from edgewise_tools.reference import CHART_SCHEMA, chart_leaves

    out = subprocess.run([helm(), "show", "readme", str(CHART)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    assert out.stdout.strip() == (CHART / "README.md").read_text().strip()  # helm adds a newline
    for cmd in ("helm install", "helm upgrade", "helm rollback", "helm uninstall"):
        assert cmd in out.stdout
    for path, node in chart_leaves(json.loads((ROOT / CHART_SCHEMA).read_text())):
        assert f"| `{path}` |" in out.stdout, path
        assert node.get("description"), f"values.schema.json: {path} has no description for the README"


# --------------------------------------------------------------------------- autoscaling

def test_autoscaling_modes_emit_their_objects() -> None:
    hpa = by_kind(render(*MODES["hpa"]), "HorizontalPodAutoscaler")[0]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert by_kind(render(*MODES["keda"]), "ScaledObject")
    builtin = render()
    assert named(builtin, "Deployment", "autoscaler")
    role = named(builtin, "Role", "autoscaler")
    # Least privilege: only the worker Deployment's scale subresource, only get/patch.
    scale_rule = [r for r in role["rules"] if "deployments/scale" in r["resources"]][0]
    assert scale_rule["verbs"] == ["get", "patch"] and scale_rule["resourceNames"] == ["rel-edgewise-worker"]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])
    # HPA/KEDA own the replica count: the Deployment must not fight them.
    assert "replicas" not in named(render(*MODES["hpa"]), "Deployment", "worker")["spec"]


def test_builtin_autoscaler_gets_the_shipped_load_target() -> None:
    """One default in one place: the chart's targetLoad is the autoscaler's own default."""
    from cloud.autoscaler.scaling import DEFAULT_TARGET_LOAD

    def args(*sets: str) -> list:
        return named(render(*sets), "Deployment", "autoscaler")["spec"]["template"]["spec"]["containers"][0]["args"]

    assert yaml.safe_load((ROOT / "charts/edgewise/values.yaml").read_text())["autoscaling"]["targetLoad"] \
        == DEFAULT_TARGET_LOAD
    a = args()
    assert f"--target-load={DEFAULT_TARGET_LOAD:g}" in a and not any(x.startswith("--target-util") for x in a)
    a = args("autoscaling.targetLoad=0")
    assert "--target-utilization=0.1" in a and not any(x.startswith("--target-load") for x in a)
    a = args("autoscaling.queueWaitSloMs=50")
    assert "--queue-wait-slo-ms=50" in a and f"--target-load={DEFAULT_TARGET_LOAD:g}" in a


@pytest.mark.parametrize("release, namespace", [("rel", "ml"), ("edgewise", "vision-prod")])
def test_autoscaling_queries_are_scoped_to_the_release(release: str, namespace: str) -> None:
    """Two releases in one Prometheus never mix: the KEDA query and the HPA's External metric
    select this namespace and release, and the ServiceMonitor puts that label on the series."""
    scoped = f'namespace="{namespace}",app_kubernetes_io_instance="{release}"'
    keda = by_kind(render(*MODES["keda"], release=release, namespace=namespace), "ScaledObject")[0]
    query = keda["spec"]["triggers"][0]["metadata"]["query"]
    assert query.count(scoped) == 2 and "{{" not in query
    hpa = by_kind(render(*MODES["hpa"], release=release, namespace=namespace), "HorizontalPodAutoscaler")[0]
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"app_kubernetes_io_instance": release}
    monitor = by_kind(render(*MODES["servicemonitor"], release=release, namespace=namespace), "ServiceMonitor")[0]
    assert monitor["spec"]["podTargetLabels"] == ["app.kubernetes.io/instance"]


KEDA_QUERY_TEMPLATES = (
    '{{ lookup "v1" "Secret" "kube-system" "" }}',       # every Secret, with the installer's rights
    '{{ (lookup "v1" "Secret" "ml" "db").data.password | b64dec }}',
    '{{ include "edgewise.fullname" . }}',
    '{{ .Values.image.repository }}',
    '{{- .Release.Name -}}',                           # a placeholder in another spelling
    '{{ env "HOME" }}',
)


def test_keda_query_is_never_rendered_as_a_template(tmp_path: Path) -> None:
    """autoscaling.keda.query is plain PromQL: a values file cannot run template functions
    (lookup would read the cluster's Secrets with the installer's rights at install time).
    Its two placeholders are replaced as text, in either spelling; any other {{ is refused
    with a sentence quoting it, and nothing of it is evaluated."""
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump({"autoscaling": {"mode": "keda", "keda": {
        "query": 'sum(x{namespace="{{.Release.Namespace}}",app_kubernetes_io_instance="{{  .Release.Name  }}"})'}}}))
    keda = by_kind(render(values=ok, release="edgewise", namespace="vision"), "ScaledObject")[0]
    assert keda["spec"]["triggers"][0]["metadata"]["query"] == \
        'sum(x{namespace="vision",app_kubernetes_io_instance="edgewise"})'
    for piece in KEDA_QUERY_TEMPLATES:
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"autoscaling": {"mode": "keda", "keda": {"query": f"sum(x{{a=\"{piece}\"}})"}}}))
        out = subprocess.run([helm(), "template", "rel", str(CHART), "-n", "ml", "-f", str(bad)],
                             capture_output=True, text=True)
        assert out.returncode != 0, f"{piece} was accepted:\n{out.stdout[-2000:]}"
        assert f"autoscaling.keda.query contains '{piece}', which the chart does not render" in out.stderr, \
            out.stderr
        assert "map[" not in out.stderr and "rel-edgewise" not in out.stderr  # nothing was evaluated
    # in another mode the query is not used: an earlier chart's query left in the values does not
    # block an upgrade, and it still reaches no template engine (no ScaledObject renders it)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"autoscaling": {"mode": "builtin", "keda": {"query": '{{ include "x" . }}'}}}))
    assert not by_kind(render(values=other), "ScaledObject")
    # the chart does not call tpl at all (a values string reaches no template engine)
    for template in (CHART / "templates").rglob("*"):
        if template.is_file():
            code = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}", "", template.read_text(), flags=re.S)  # comments
            assert not re.search(r"\btpl\b", code), template.name


# --------------------------------------------------------------------------- workers

def test_gpu_default_and_cpu_profile() -> None:
    pod = named(render(), "Deployment", "worker")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert c["image"].endswith("-cuda")
    cpu = named(render(*MODES["cpu"]), "Deployment", "worker")["spec"]["template"]["spec"]
    c = cpu["containers"][0]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert not c["image"].endswith("-cuda")
    assert {v["name"]: v for v in cpu["volumes"]}["models"]["persistentVolumeClaim"]["claimName"] == "models"


def _engine_cache(mode: str) -> tuple[dict, list]:
    docs = render(*MODES[mode])
    pod = named(docs, "Deployment", "worker")["spec"]["template"]["spec"]
    mount = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "engine-cache"][0]
    assert mount["mountPath"] == "/var/cache/edgewise"  # the images' EDGEWISE_ENGINE_CACHE is below it
    return {v["name"]: v for v in pod["volumes"]}["engine-cache"], by_kind(docs, "PersistentVolumeClaim")


def test_engine_cache_modes() -> None:
    assert "ENGINE_CACHE=/var/cache/edgewise/engines" in (ROOT / "deploy/docker/Dockerfile.cuda").read_text()
    vol, pvcs = _engine_cache("default")
    assert vol["emptyDir"] == {} and not pvcs
    vol, pvcs = _engine_cache("engine-cache-pvc")
    assert vol["persistentVolumeClaim"]["claimName"] == "rel-edgewise-engine-cache"
    assert [p["metadata"]["name"] for p in pvcs] == ["rel-edgewise-engine-cache"]
    assert pvcs[0]["spec"]["accessModes"] == ["ReadWriteMany"] and pvcs[0]["spec"]["storageClassName"] == "shared-rwx"
    vol, pvcs = _engine_cache("engine-cache-claim")
    assert vol["persistentVolumeClaim"]["claimName"] == "engines" and not pvcs
    vol, pvcs = _engine_cache("engine-cache-hostpath")
    assert vol["hostPath"] == {"path": "/var/cache/edgewise", "type": "Directory"} and not pvcs


def test_headless_worker_service_and_grpc_probes() -> None:
    docs = render()
    assert named(docs, "Service", "worker")["spec"]["clusterIP"] == "None"
    for suffix in ("gateway", "worker"):
        c = named(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]
        # the gateway's probes ask /healthz (test_gateway_probes_ask_healthz_however_configured)
        for probe in ("readinessProbe", "livenessProbe"):
            assert ("httpGet" if suffix == "gateway" else "grpc") in c[probe]


# --------------------------------------------------------------------------- disruption budgets

def _notes(*sets: str) -> str:
    out = subprocess.run([helm(), "install", "rel", str(CHART), "--dry-run=client", "-n", "ml", *helm_args(*sets)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize("sets, rendered", [
    (("gateway.replicas=1",), False),                 # minAvailable 1 of 1: a drain would wait forever
    ((), True),                                       # 1 of 2
    (("gateway.replicas=3", "gateway.pdb.minAvailable=50%"), True),
    (("gateway.pdb.minAvailable=100%",), False),
    (("gateway.replicas=3", "gateway.pdb.minAvailable=3"), False),
])
def test_gateway_pdb_only_where_a_drain_can_satisfy_it(sets: tuple, rendered: bool) -> None:
    pdbs = [p["metadata"]["name"] for p in by_kind(render(*sets), "PodDisruptionBudget")]
    assert ("rel-edgewise-gateway" in pdbs) is rendered
    assert "rel-edgewise-worker" in pdbs  # maxUnavailable >= 1: always satisfiable
    assert ("No gateway PodDisruptionBudget" in _notes(*sets)) is not rendered


# --------------------------------------------------------------------------- helm test and TLS

def test_helm_test_hook_sends_a_detection() -> None:
    args = helm_test_pod(render())["spec"]["containers"][0]["args"]
    assert args[:2] == ["cloud", "probe"] and any(a.startswith("--target=rel-edgewise-gateway:") for a in args)
    assert not any(a.startswith("--tls") for a in args)


@pytest.mark.parametrize("mode, tls_args", [
    ("tls-public-ca", ["--tls"]),
    ("tls-private-ca", ["--tls-ca=/etc/edgewise/test-ca/ca.crt", "--tls-server-name=gateway.example.com"]),
    ("tls-on", ["--tls-ca=/etc/edgewise/test-ca/ca.crt", "--tls-cert=/etc/edgewise/client-tls/tls.crt",
                "--tls-key=/etc/edgewise/client-tls/tls.key"]),
])
def test_helm_test_tls_arguments_per_mode(mode: str, tls_args: list) -> None:
    pod = helm_test_pod(render(*MODES[mode]))["spec"]
    args = pod["containers"][0]["args"]
    assert [a for a in args if a.startswith("--tls")] == tls_args
    # the gateway's own Secret (its private key) is mounted only where it is also the named CA Secret
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert ("gw-tls" in secrets) is (mode == "tls-on")


def test_helm_test_authenticates_when_auth_is_on() -> None:
    pod = helm_test_pod(render(*MODES["tls-on"]))["spec"]
    c = pod["containers"][0]
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "probe-token", "key": "token"}
    assert {v["name"] for v in pod["volumes"]} >= {"test-ca", "client-tls"}


def test_tls_mounts_secrets_and_configures_gateway() -> None:
    docs = render(*MODES["tls-on"])
    gw = named(docs, "Deployment", "gateway")
    vols = {v["name"]: v for v in gw["spec"]["template"]["spec"]["volumes"]}
    assert vols["grpc-tls"]["secret"]["secretName"] == "gw-tls"
    assert vols["mqtt-tls"]["secret"]["secretName"] == "mqtt-tls"
    # the broker's Secret holds its private key: the gateway, which parses every device's
    # request, mounts its CA only (found by a review); so does the helm test pod, pointed at the
    # gateway's own Secret by the docs
    assert vols["mqtt-tls"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    test_ca = {v["name"]: v for v in helm_test_pod(docs)["spec"]["volumes"]}["test-ca"]
    assert test_ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    cfg = yaml.safe_load(named(docs, "ConfigMap", "gateway")["data"]["gateway.yaml"])
    assert cfg["tls"]["client_ca_file"] == "/etc/edgewise/tls/ca.crt" and cfg["tls"]["require_client_cert"]
    # other tls settings of gateway.config survive the chart's own
    cm = named(render(*MODES["tls-on"], "gateway.config.tls.client_identity=san_uri"), "ConfigMap", "gateway")
    tls = yaml.safe_load(cm["data"]["gateway.yaml"])["tls"]
    assert tls["client_identity"] == "san_uri" and tls["cert_file"] == "/etc/edgewise/tls/tls.crt"
    assert cfg["mqtt"]["port"] == 8883 and cfg["mqtt"]["tls"] is True
    conf = named(docs, "ConfigMap", "mosquitto")["data"]["mosquitto.conf"]
    assert "allow_anonymous false" in conf and "certfile /mosquitto/tls/tls.crt" in conf
    assert "listener 1883" not in conf and "listener 8883" in conf


@pytest.mark.parametrize("limit", [None, 7_000_000, 200_000_000])
def test_the_charts_broker_takes_no_larger_packet_than_the_bridge(limit: int | None) -> None:
    """Mosquitto forwards 256 MB by default: one device could run the 256 MiB broker (and the
    gateway) out of memory. The chart's broker takes what the gateway's bridge announces it
    takes (``receive_limit``), from the gateway's default or its configured message limit."""
    from cloud.gateway.mqtt_bridge import receive_limit
    from cloud.gateway.settings import LimitSettings

    sets = MODES["broker-on"] + ((f"gateway.config.limits.max_message_bytes={limit}",) if limit else ())
    conf = named(render(*sets), "ConfigMap", "mosquitto")["data"]["mosquitto.conf"]
    want = receive_limit(limit or LimitSettings().max_message_bytes)
    assert f"\n    max_packet_size {want}\n".replace("    ", "") in conf, conf


def test_the_charts_broker_announces_100_in_flight_without_nagle_and_mosquitto_loads_its_config(tmp_path) -> None:
    """A QoS 2 record holds one of a device's in-flight slots for two round trips: Mosquitto's
    default of 20 held an edge's MQTT sink to 25 records/s over a 300 ms uplink
    (bench/mqtt_sink.py). The rendered configuration is loaded by a real Mosquitto 2.0."""
    import socket

    from tests.conftest import free_port, mosquitto_binary
    from tests.waiting import wait_until

    conf = named(render("mqtt.bridge.enabled=true", "mqtt.broker.enabled=true"), "ConfigMap",
                 "mosquitto")["data"]["mosquitto.conf"]
    assert "\nmax_inflight_messages 100\n" in conf and "\nset_tcp_nodelay true\n" in conf
    port = free_port()
    (tmp_path / "mosquitto.conf").write_text(conf.replace("listener 1883", f"listener {port} 127.0.0.1"))
    proc = subprocess.Popen([mosquitto_binary(), "-c", str(tmp_path / "mosquitto.conf")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    def answers() -> bool:
        """A CONNACK to an MQTT 3.1.1 CONNECT: its main loop runs (it printed "running" before;
        a fixed 1 s could end before that on a loaded machine, its buffered log then lost)."""
        assert proc.poll() is None, proc.communicate()[0]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
                return s.recv(4)[:1] == b"\x20"
        except OSError:
            return False

    try:
        wait_until(answers, 30, "mosquitto answering with the chart's configuration")
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    assert "running" in out and "Error" not in out, out


# --------------------------------------------------------------------------- security, pass-throughs

@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_container_is_locked_down(mode: str) -> None:
    for name, spec in pod_specs(render(*MODES[mode])):
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


def test_pass_throughs_reach_the_pods() -> None:
    docs = render(*MODES["passthroughs"])
    for suffix, extra_label, priority, env_from, volume, mount in (
        ("gateway", {"tier": "edge-facing"}, "edgewise-critical", {"secretRef": {"name": "gateway-env"}}, "extra-ca",
         "/etc/corp-ca"),
        ("worker", {"tier": "gpu"}, "edgewise-batch", {"configMapRef": {"name": "worker-env"}}, "scratch", "/scratch"),
    ):
        tpl = named(docs, "Deployment", suffix)["spec"]["template"]
        labels, annotations, spec = tpl["metadata"]["labels"], tpl["metadata"]["annotations"], tpl["spec"]
        assert labels["cost-center"] == "ml-42" and labels["app.kubernetes.io/component"] == suffix
        assert extra_label.items() <= labels.items() and annotations["team"] == "vision"
        assert annotations["prometheus.io/scrape"] == "true"  # the chart's own annotations stay
        assert spec["priorityClassName"] == priority
        c = spec["containers"][0]
        assert c["envFrom"] == [env_from]
        assert volume in {v["name"] for v in spec["volumes"]} and mount in {m["mountPath"] for m in c["volumeMounts"]}
        # a spread constraint without labelSelector gets the component's pods
        first = spec["topologySpreadConstraints"][0]
        assert first["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == suffix
    worker = named(docs, "Deployment", "worker")["spec"]["template"]["spec"]
    assert worker["topologySpreadConstraints"][1]["labelSelector"] == {"matchLabels": {"tier": "gpu"}}
    for d in by_kind(docs, "Deployment") + by_kind(docs, "Pod"):  # chart-wide labels: every pod
        meta = d["metadata"] if d["kind"] == "Pod" else d["spec"]["template"]["metadata"]
        assert meta["labels"]["cost-center"] == "ml-42", d["metadata"]["name"]
    for sa in by_kind(docs, "ServiceAccount"):
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")


def test_gateway_exposed_by_ingress_and_grpcroute() -> None:
    docs = render(*MODES["exposed"])
    ing = by_kind(docs, "Ingress")[0]
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPCS"
    assert ing["spec"]["ingressClassName"] == "nginx" and ing["spec"]["tls"][0]["hosts"] == ["gateway.example.com"]
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "rel-edgewise-gateway", "port": {"name": "grpc"}}
    route = by_kind(docs, "GRPCRoute")[0]["spec"]
    assert route["parentRefs"][0]["name"] == "edge-gateway" and route["hostnames"] == ["gateway.example.com"]
    assert route["rules"][0]["backendRefs"] == [{"name": "rel-edgewise-gateway", "port": 50051}]
    svc = named(docs, "Service", "gateway")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"] == 50051
    plain = by_kind(render("gateway.ingress.enabled=true", "gateway.ingress.hosts[0]=gw.example.com"), "Ingress")[0]
    assert plain["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"


# --------------------------------------------------------------------------- observability

def test_servicemonitor_scrapes_each_pod_once() -> None:
    docs = render(*MODES["servicemonitor"])
    sel = by_kind(docs, "ServiceMonitor")[0]["spec"]["selector"]["matchLabels"]
    scraped = [s["metadata"]["name"] for s in by_kind(docs, "Service")
               if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
    assert sorted(scraped) == ["rel-edgewise-autoscaler", "rel-edgewise-gateway-pods", "rel-edgewise-worker"]


def test_gateway_side_port_stays_inside_the_cluster() -> None:
    """/metrics and /pool (worker addresses, load) were published on the edge-facing Service
    (a LoadBalancer in production) and open to any source in the NetworkPolicy."""
    docs = render()
    edge_facing = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "rel-edgewise-gateway"][0]
    assert [p["name"] for p in edge_facing["spec"]["ports"]] == ["grpc"]
    pods = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "rel-edgewise-gateway-pods"][0]
    assert [p["name"] for p in pods["spec"]["ports"]] == ["metrics"] and pods["spec"]["clusterIP"] == "None"
    policy = [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "rel-edgewise-gateway"][0]
    side = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 9100]
    assert side and all(r.get("from") for r in side), side


def test_dashboard_and_rules_are_optional_objects() -> None:
    assert not {"PrometheusRule"} & {d["kind"] for d in render()}
    docs = render(*MODES["observability"])
    cm = named(docs, "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["edgewise.json"])
    assert dashboard["uid"] == "edgewise-overview" and dashboard["panels"]
    groups = by_kind(docs, "PrometheusRule")[0]["spec"]["groups"]
    assert {r["alert"] for g in groups for r in g["rules"]} >= {
        "EdgewiseEscalatedP99OverSLO", "EdgewiseRejectionRatioHigh", "EdgewiseAllWorkersEjected", "EdgewiseWorkersFailing",
        "EdgewiseSpoolBacklogGrowing", "EdgewiseEdgeOffline"}
    no_edge = by_kind(render(*MODES["observability"], "prometheusRule.edgeAlerts=false"), "PrometheusRule")[0]
    assert [g["name"] for g in no_edge["spec"]["groups"]] == ["edgewise-cloud"]


def test_policy_configmap_is_a_valid_policy() -> None:
    cm = named(render(), "ConfigMap", "policy")
    policy = yaml.safe_load(cm["data"]["policy.yaml"])
    assert policy["kind"] == "EscalationPolicy"
    parse = pytest.importorskip("edgewise.policy").parse_policy
    parse(cm["data"]["policy.yaml"], "chart:policy.yaml")


# --------------------------------------------------------------------------- bad values

@pytest.mark.parametrize("bad", sorted(BAD.glob("*.yaml")), ids=lambda p: p.stem)
def test_bad_values_rejected_with_message(bad: Path) -> None:
    """Line 1: ``# expect: <text of the error>``; an optional line 2 ``# release: <name>``
    renders under that release name instead of ``rel``."""
    lines = bad.read_text().splitlines()
    expect = lines[0].removeprefix("# expect: ").strip()
    release = lines[1].removeprefix("# release: ").strip() if lines[1:2] and lines[1].startswith("# release: ") \
        else "rel"
    out = subprocess.run([helm(), "template", release, str(CHART), "-f", str(bad)], capture_output=True, text=True)
    assert out.returncode != 0, f"{bad.name} was accepted"
    assert expect in out.stderr, out.stderr
    assert "'allOf' failed" not in out.stderr and "'not' failed" not in out.stderr


def test_every_rule_between_values_is_a_sentence_with_a_bad_values_case() -> None:
    """No cross-field rule hides in the schema (Helm would print it without a reason), and
    each of validate.yaml's rules is triggered by one of bad-values/."""
    schema = (CHART / "values.schema.json").read_text()
    assert not re.search(r'"(allOf|anyOf|if|then|not)":', schema), "cross-field rules belong in validate.yaml"
    rules = re.findall(r'fail (?:\(printf )?"([^"%]+)', (CHART / "templates/validate.yaml").read_text())
    expected = " ".join(p.read_text().splitlines()[0] for p in BAD.glob("*.yaml"))
    untested = [r for r in rules if r.split(" ")[0] not in expected]
    assert len(rules) >= 15 and not untested, untested


# --------------------------------------------------------------------------- chart <-> code

@pytest.mark.parametrize("mode", sorted(MODES))
def test_rendered_gateway_config_loads_in_the_gateway(mode: str, tmp_path) -> None:
    """The chart and the gateway agree on every key: the gateway's own loader accepts it."""
    import inspect

    from cloud.discovery.kubernetes import KubernetesDiscovery
    from cloud.gateway.settings import load_settings

    cm = named(render(*MODES[mode]), "ConfigMap", "gateway")
    path = tmp_path / "gateway.yaml"
    path.write_text(cm["data"]["gateway.yaml"])
    settings = load_settings(path, env={})
    assert settings.discovery.kind == "kubernetes"
    inspect.signature(KubernetesDiscovery).bind(**settings.discovery.kubernetes)
    assert settings.listen == "0.0.0.0:50051" and settings.metrics_port == 9100
    # the kubelet's /healthz probe goes to the pod's IP: IPv6 in an IPv6-only cluster, which a side
    # port on 0.0.0.0 refused (the gateway never became ready); "::" answers both families
    assert settings.metrics_host == "::"


def _text_ranges() -> list:
    """The generated table: every value that may be a number written as text, its path from .Values."""
    from edgewise_tools.reference import chart_ranges

    text = chart_ranges()
    assert text is not None
    return json.loads(text.split("-}}\n", 1)[1].rsplit("\n{{- end", 1)[0])


def _outside(r: dict) -> str:
    if r["lo"] is not None:
        return repr(float(r["lo"]) if r["loOpen"] else float(r["lo"]) - 0.5)
    return repr(float(r["hi"]) if r["hiOpen"] else float(r["hi"]) + 0.5)


def _inside(r: dict) -> float:
    """A value inside the range, and unlike any default (so the render shows it is used)."""
    lo, hi = r["lo"], r["hi"]
    if lo is not None and hi is not None:
        return round(float(lo) + 0.37 * (float(hi) - float(lo)), 6)
    return float(lo) + 0.37 if lo is not None else float(hi) - 0.37


def test_numbers_written_as_text_are_range_checked_like_the_gateway_does(tmp_path) -> None:
    """``helm --set key=1.5`` passes text, whose range JSON Schema does not check: such values
    passed ``helm install`` and the gateway refused them at its start (a crash-looping pod).
    For every gateway.config number: a text value just outside its range is refused by the chart
    with the gateway's own ``allowed:``, and the gateway refuses it too; one just inside renders
    and loads."""
    from cloud.gateway.settings import load_settings
    from edgewise.errors import ConfigError

    ranges = [r for r in _text_ranges() if r["path"][:2] == ["gateway", "config"]]
    assert len(ranges) >= 20 and any(r["path"][2:] == ["retry", "budget_ratio"] for r in ranges)
    for r in ranges:
        key = ".".join(r["path"])
        bad = _outside(r)
        out = subprocess.run([helm(), "template", "rel", str(CHART), "--set", f"{key}={bad}"],
                             capture_output=True, text=True)
        assert out.returncode != 0, f"{key}={bad} was accepted"
        assert f'{key}: "{bad}" is out of range; allowed: {r["allowed"]} (the gateway refuses' in out.stderr, \
            out.stderr
        path = tmp_path / "gateway.yaml"
        doc: dict = {"discovery": {"kind": "static", "static": ["127.0.0.1:9"]}}
        node = doc
        for part in r["path"][2:-1]:
            node = node.setdefault(part, {})
        node[r["path"][-1]] = bad
        path.write_text(yaml.safe_dump(doc))
        with pytest.raises(ConfigError, match=re.escape(f"allowed: {r['allowed']}")):
            load_settings(path, env={})
    overflow = subprocess.run([helm(), "template", "rel", str(CHART), "--set", "gateway.config.retry.budget_ratio=1e999"],
                              capture_output=True, text=True)
    assert 'gateway.config.retry.budget_ratio: "1e999" is out of range' in overflow.stderr, overflow.stderr
    ok = subprocess.run([helm(), "template", "rel", str(CHART), "--set", "gateway.config.retry.budget_ratio=0.5",
                         "--set", "gateway.config.limits.default_deadline_s= 2.5 "], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_every_number_that_may_be_text_is_in_the_range_table() -> None:
    """The table takes a value by its pattern: a copy of the pattern edited by hand would drop
    its value out of the range checks, silently. Every number-or-text value of the schema
    (resource quantities aside, which have their own grammar) is in it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    found = []

    def walk(node: dict, path: tuple) -> None:
        for key, sub in node.get("properties", {}).items():
            walk(sub, path + (key,))
        kinds = node.get("type")
        if isinstance(kinds, list) and {"number", "string"} <= set(kinds) and "pattern" in node \
                and "Ki" not in node["pattern"]:
            found.append(list(path))

    walk(schema, ())
    assert len(found) >= 25 and sorted(found) == sorted(r["path"] for r in _text_ranges())


def test_the_charts_own_decimals_take_helm_set_text_and_render_as_the_number() -> None:
    """``helm install --set autoscaling.targetLoad=0.7`` passes the text "0.7": the schema's
    ``type: number`` refused it ("got string, want number"), so an operator had to know
    ``--set-json``. Every chart value that may be such text renders exactly as the same number
    given as a number (``--set-json``), even with spaces around it; just outside its range it is
    refused with the schema's range; text that is no number is refused by the schema."""
    ranges = [r for r in _text_ranges() if r["path"][:2] != ["gateway", "config"]]
    keys = [".".join(r["path"]) for r in ranges]
    assert {"worker.weight", "autoscaling.targetLoad", "prometheusRule.rejectionRatio"} <= set(keys)
    used = set()
    # between them every value is in use: the builtin autoscaler on utilization, the HPA, the alerts
    for base in (("prometheusRule.enabled=true", "autoscaling.targetLoad=0", "autoscaling.queueWaitSloMs=0"),
                 ("autoscaling.mode=hpa",)):
        for key, r in zip(keys, ranges):
            good = _inside(r)
            others = [s for s in base if not s.startswith(f"{key}=")]  # helm applies --set after --set-json
            default = render(*others)
            as_text = render(*others, f"{key}= {good!r} ")
            as_number = render_text(*others, extra=("--set-json", f"{key}={good!r}"))
            assert as_text == [d for d in yaml.safe_load_all(as_number) if d], key
            if as_text != default:
                used.add(key)
    assert used == set(keys)
    for key, r in zip(keys, ranges):
        bad = _outside(r)
        out = subprocess.run([helm(), "template", "rel", str(CHART), "--set", f"{key}={bad}"],
                             capture_output=True, text=True)
        assert out.returncode != 0 and f'{key}: "{bad}" is out of range; allowed: {r["allowed"]}' in out.stderr, \
            out.stderr
        assert "gateway refuses" not in out.stderr
        word = subprocess.run([helm(), "template", "rel", str(CHART), "--set", f"{key}=fast"],
                              capture_output=True, text=True)
        assert word.returncode != 0 and "does not match pattern" in word.stderr, word.stderr
    assert render("autoscaling.targetLoad=0.0") == render("autoscaling.targetLoad=0")  # 0.0 is off too


@pytest.mark.parametrize("mode", ["default", "cpu", "tls-on", "tls-public-ca", "tls-private-ca"])
def test_container_args_parse_with_the_real_cli(mode: str) -> None:
    """Every edgewise container's args are accepted by the CLI they will run."""
    from edgewise.cli import build_parser

    parser = build_parser()
    seen = set()
    for name, spec in pod_specs(render(*MODES[mode])):
        for c in spec["containers"]:
            args = c.get("args")
            if not args or args[0] not in ("cloud", "edge", "model"):
                continue
            ns = parser.parse_args(args)
            assert callable(ns.func), name
            seen.add(args[1])
    assert {"gateway", "worker", "autoscaler", "probe"} <= seen


# --------------------------------------------------------------------------- values the chart checks itself

def test_only_keda_scales_to_zero() -> None:
    """minReplicas 0 is refused for builtin and hpa (bad-values/min-replicas-zero-*)."""
    keda = by_kind(render("autoscaling.mode=keda", "autoscaling.minReplicas=0"), "ScaledObject")[0]
    assert keda["spec"]["minReplicaCount"] == 0
    assert not by_kind(render("autoscaling.mode=none", "autoscaling.minReplicas=0"), "HorizontalPodAutoscaler")


def test_user_strings_stay_strings() -> None:
    """Every user string lands quoted: ' #' does not start a comment, ': ' does not make a map,
    and "2024", "true", "null" stay strings; the manifests still validate."""
    docs = render(values=VALUES / "tricky-strings.yaml")
    for version in K8S_VERSIONS:
        for doc in docs:
            validate_manifest(doc, version)
    args = helm_test_pod(docs)["spec"]["containers"][0]["args"]
    assert "--device-id=lobby-cam #2: east" in args and "--tls-server-name=gw: 1 #a" in args
    assert "--tls-ca=/etc/edgewise/test-ca/0.1" in args
    pod = helm_test_pod(docs)["spec"]
    assert {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == \
        {"test-ca": "2024", "client-tls": "null"}
    assert pod["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "true"
    gw = named(docs, "Deployment", "gateway")["spec"]["template"]["spec"]
    assert {v["name"]: v["secret"]["secretName"] for v in gw["volumes"] if "secret" in v} == \
        {"grpc-tls": "true", "tokens": "2024", "mqtt-tls": "1e3"}
    assert gw["priorityClassName"] == "123"
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in gw["containers"][0]["env"][1:]} == {"null"}
    worker = named(docs, "Deployment", "worker")["spec"]["template"]["spec"]
    assert worker["priorityClassName"] == "0.5"
    assert "--model=/models/cam #2: v1.onnx" in worker["containers"][0]["args"]
    assert {v["name"]: v for v in worker["volumes"]}["models"]["persistentVolumeClaim"]["claimName"] == "null"
    assert [m for m in worker["containers"][0]["volumeMounts"] if m["name"] == "models"][0]["subPath"] == "a: b #c"
    pvc = by_kind(docs, "PersistentVolumeClaim")[0]["spec"]
    assert pvc["storageClassName"] == "1.0" and pvc["resources"]["requests"]["storage"] == "5"
    broker = named(docs, "Deployment", "mosquitto")["spec"]["template"]["spec"]
    assert {v["name"]: v["secret"]["secretName"] for v in broker["volumes"] if "secret" in v} == \
        {"auth": "null", "tls": "1e3"}
    rules = [r for g in by_kind(docs, "PrometheusRule")[0]["spec"]["groups"] for r in g["rules"]]
    assert [r["expr"] for r in rules if r["alert"] == "EdgewiseEdgeOffline"] == ['up{job=~"edge: #1"} == 0']


def test_init_container_source_path_is_an_argument() -> None:
    """The model image's path reaches cp as one argument, never as shell text."""
    spec = named(render(*MODES["init-model"], "model.initContainer.sourcePath=/models/a b;$(x)"),
                 "Deployment", "worker")["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["command"] == ["sh", "-c", 'cp -r "$1"/. /models/', "fetch-model",
                                                     "/models/a b;$(x)"]


NAME_VALUES = ("gateway.tokensSecret", "gateway.priorityClassName", "worker.priorityClassName",
               "worker.engineCache.pvc.claimName", "worker.engineCache.pvc.storageClassName", "model.pvc.claimName",
               "tls.grpc.secretName", "tls.mqtt.secretName", "mqtt.broker.authSecret", "helmTest.tokenSecret",
               "helmTest.clientTlsSecret", "helmTest.caSecret", "serviceAccount.name", "gateway.ingress.className",
               "imagePullSecrets[0].name", "gateway.ingress.tls[0].secretName")


@pytest.mark.parametrize("path", NAME_VALUES)
@pytest.mark.parametrize("bad", ["Gateway_TLS", "a b", 'a"b', "-a", "a.", "x" * 254])
def test_object_names_are_kubernetes_names(path: str, bad: str) -> None:
    """Secret, claim, storage class, priority class (...) names: DNS-1123 subdomains, refused
    by the schema with the value's path."""
    out = subprocess.run([helm(), "template", "rel", str(CHART), "--set-string", f"{path}={bad}"],
                         capture_output=True, text=True)
    where = "/" + re.sub(r"\[(\d+)\]", r"/\1", path).replace(".", "/")
    assert out.returncode != 0 and f"at '{where}'" in out.stderr, out.stderr


def _schema_node(path: str) -> dict:
    node = json.loads((CHART / "values.schema.json").read_text())
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


@pytest.mark.parametrize("path, good, bad", [
    ("tls.grpc.secretName", ["", "gw-tls", "2024", "my.secret-1", "a" * 253], ["A", "a_b", "-a", "a-", "a..b", "a" * 254]),
    ("image.tag", ["", "0.1.0-cuda", "v1.2_3", "_x", "a" * 128], ["bad tag", "a:b", ".x", "-x", "a" * 129, "a/b"]),
    ("helmTest.caKey", ["ca.crt", "CA_bundle-1"], ["", "ca/crt", "a b"]),
    ("image.digest", ["", "sha256:" + "0123456789abcdef" * 4],
     ["sha256:abc", "sha256:" + "A" * 64, "a" * 64, "sha256:" + "a" * 65, "@sha256:" + "a" * 64,
      "sha512:" + "a" * 128, "sha256:" + "g" * 64, " sha256:" + "a" * 64]),
    ("image.cudaDigest", ["", "sha256:" + "f" * 64], ["sha256:", "sha256:" + "a" * 63, "0.1.0-cuda"]),
    ("image.repository", ["ghcr.io/edgewise/edgewise", "edgewise", "localhost:5000/a/b_c", "registry.example.com/x--y"],
     ["", "ghcr.io/Edgewise/x", "edgewise:1.0", "a b", "a//b", "/a", "a/", "ghcr.io:port/a", "a@sha256:00"]),
    ("model.initContainer.image", ["", "ghcr.io/acme/models:v3", "acme/models@sha256:" + "a" * 64, "localhost:5000/m:1"],
     ["acme/models:", "acme/models:bad tag", "Acme/models", "acme/models@sha256:xyz", "acme/models v3"]),
    ("mqtt.broker.image", ["eclipse-mosquitto:2.0.20", "docker.io/library/eclipse-mosquitto:2.0.20"],
     ["", "eclipse-mosquitto:2.0.20 --x", "eclipse mosquitto"]),
    ("worker.gpu.resourceName", ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "nvidia.com/mig-1g.10gb"],
     ["", "gpu", "nvidia.com/", "/gpu", "Nvidia.com/gpu", "nvidia.com/gpu x", "nvidia/gpu"]),
    ("worker.resources.requests.[cpu]",
     [0, 2, 0.5, "500m", "2", "1Gi", "1.5Ki", "1e3", "1E", ".5", "5.", "+1", "100n", "4Ei"],
     [-1, "-1", "lots", "1 Gi", "1GB", "1gi", "", "1e", "Mi", "1mi"]),
])
def test_schema_patterns(path: str, good: list, bad: list) -> None:
    """The schema's Kubernetes name, OCI tag and reference, Secret key, extended resource and quantity grammars."""
    import jsonschema

    if path.endswith(".[cpu]"):
        schema = _schema_node(path.removesuffix(".[cpu]"))["additionalProperties"]
    else:
        schema = _schema_node(path)
    check = jsonschema.Draft7Validator(schema)
    assert [g for g in good if not check.is_valid(g)] == []
    assert [b for b in bad if check.is_valid(b)] == []


def test_every_resources_map_is_checked_as_quantities() -> None:
    for component in ("gateway", "worker", "mqtt.broker"):
        for kind in ("requests", "limits"):
            node = _schema_node(f"{component}.resources.{kind}")
            assert node["additionalProperties"] == _schema_node("worker.resources.requests")["additionalProperties"]


@pytest.mark.parametrize("removed, container, left", [
    ("worker.resources", "worker", {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}),
    ("worker.resources.limits", "worker", {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1},
                                           "limits": {"nvidia.com/gpu": 1}}),
    ("worker.resources.requests", "worker", {"requests": {"nvidia.com/gpu": 1},
                                             "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 1}}),
    ("gateway.resources", "gateway", {}),
    ("mqtt.broker.resources", "mosquitto", {}),
])
def test_a_resources_map_removed_with_null_renders_none(removed: str, container: str, left: dict) -> None:
    """null is how Helm drops a default (--set worker.resources=null, to leave sizing to a
    LimitRange): the chart failed with "nil pointer evaluating interface {}.requests" (gateway,
    broker, worker) or "mapping values are not allowed in this context" (worker requests or
    limits), naming no value. It renders the container without them (a GPU worker keeps its GPU)."""
    docs = render(*MODES["broker-on"], f"{removed}=null")
    for doc in docs:
        for version in K8S_VERSIONS:
            validate_manifest(doc, version)
    pods = {name: spec for name, spec in pod_specs(docs)}
    c = next(c for name, spec in pods.items() if name.endswith(f"-{container}") for c in spec["containers"]
             if c["name"] == container)
    assert c["resources"] == left


@pytest.mark.parametrize("removed, key, left", [
    ("worker.gpu.tolerations", "tolerations", None),  # GPU nodes without the nvidia.com/gpu taint
    ("worker.tolerations", "tolerations", [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]),
    ("worker.gpu.nodeSelector", "nodeSelector", None),
    ("worker.nodeSelector", "nodeSelector", {"nvidia.com/gpu.present": "true"}),
])
def test_a_worker_placement_default_removed_with_null_is_empty(removed: str, key: str, left: object) -> None:
    """A default list dropped with null (worker.gpu.tolerations=null) failed the worker template
    in concat ("error calling concat"), a default map (worker.nodeSelector=null) with "wrong type
    for value; expected map": neither named the value. Dropped, it is empty."""
    docs = render(f"{removed}=null")
    for doc in docs:
        validate_manifest(doc, K8S_VERSIONS[-1])
    assert named(docs, "Deployment", "worker")["spec"]["template"]["spec"].get(key) == left


def _object_sections(node: dict, path: str = "") -> list:
    out = []
    for key, sub in node.get("properties", {}).items():
        if sub.get("type") == "object" and "properties" in sub:
            out.append(f"{path}{key}")
            out += _object_sections(sub, f"{path}{key}.")
    return out


def test_a_section_removed_with_null_renders_or_is_refused_by_name() -> None:
    """``--set model=null`` (or ``gateway.service``, ``worker.batching``, ``tls``: 29 sections)
    failed in a template with "nil pointer evaluating interface {}.source", naming no value.
    Each section the templates read is required by the schema now, so Helm says
    "missing property 'model'"; the rest (resources, placement maps) render without it."""
    # the sections a template reads only in another mode, rendered in that mode: with the
    # defaults alone, autoscaling.hpa=null (mode hpa), model.pvc=null (source pvc) and four more
    # rendered, and failed with "nil pointer evaluating interface {}.metricName" when read
    reads = {"autoscaling.hpa": ("autoscaling.mode=hpa",),
             "mqtt.external": ("mqtt.bridge.enabled=true", "mqtt.external.host=broker.example"),
             "model.pvc": ("model.source=pvc",),
             "model.initContainer": ("model.source=initContainer",),
             "worker.engineCache.pvc": ("worker.engineCache.type=pvc",),
             "worker.engineCache.hostPath": ("worker.engineCache.type=hostPath",)}
    for section in _object_sections(json.loads((CHART / "values.schema.json").read_text())):
        out = subprocess.run([helm(), "template", "rel", str(CHART), *helm_args(*reads.get(section, ())),
                              "--set", f"{section}=null"], capture_output=True, text=True)
        parent, _, key = section.rpartition(".")
        where = "/" + parent.replace(".", "/") if parent else ""
        refused = (f"at '{where}': missing property '{key}'",
                   f"at '/{section.replace('.', '/')}': got null, want object")
        assert out.returncode == 0 or any(r in out.stderr for r in refused), (section, out.stderr)


def _defaulted_values(schema: dict, values: dict, path: str = "") -> list:
    """The single values of values.yaml (and the PVC's access modes), outside gateway.config
    (written by hand: null stays null there)."""
    out = []
    for key, sub in schema.get("properties", {}).items():
        full, default = f"{path}{key}", values.get(key)
        if full == "gateway.config" or key not in values:
            continue
        if sub.get("type") == "object" and "properties" in sub:
            out += _defaulted_values(sub, default or {}, f"{full}.")
        elif default is not None and not isinstance(default, (dict, list)) \
                or full == "worker.engineCache.pvc.accessModes":
            out.append(full)
    return out


def test_a_value_removed_with_null_is_refused_by_name() -> None:
    """Helm deletes a value set to null, so the templates read nothing where values.yaml has a
    default: worker.replicas=null rendered a pool of 0 workers (autoscaling.mode none, and a
    paused HPA target), worker.terminationGracePeriodSeconds=null 'terminationGracePeriodSeconds:
    0' with '--grace=-5', gateway.grpcPort=null 'listen: 0.0.0.0:0', autoscaling.targetLoad=null
    switched the autoscaler to targetUtilization, podSecurityContext.runAsNonRoot=null went past
    "runAsNonRoot must stay true", and model.path=null (or policy.content, worker.gpu.resourceName,
    autoscaling.keda.query; tls.mqtt.enabled with the broker on) failed in a template with "wrong
    type for value; expected string; got interface {}". Each value is required by the schema (a
    list or map is not: its null is "none"), so Helm names it; "", 0 or false is how to write
    an empty one."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = _defaulted_values(schema, yaml.safe_load((CHART / "values.yaml").read_text()))
    assert {"worker.replicas", "model.path", "podSecurityContext.runAsNonRoot", "tls.mqtt.enabled"} <= set(leaves)
    out = subprocess.run([helm(), "template", "rel", str(CHART), *helm_args(*(f"{v}=null" for v in leaves))],
                         capture_output=True, text=True)
    assert out.returncode != 0
    named = {f"{where[1:].replace('/', '.')}.{key}"  # Helm: "at '/gateway/pdb': missing properties 'a', 'b'"
             for where, keys in re.findall(r"at '(/[^']*)': missing propert(?:y|ies) ((?:'[^']+'(?:, )?)+)", out.stderr)
             for key in re.findall(r"'([^']+)'", keys)}
    assert not set(leaves) - named, out.stderr


@pytest.mark.parametrize("sets", [
    ("gateway.resources.requests.memory=1024Mi", "gateway.resources.limits.memory=1Gi"),
    ("gateway.resources.requests.cpu=1000m", "gateway.resources.limits.cpu=1"),
    ("gateway.resources.requests.cpu=0.5", "gateway.resources.limits.cpu=500m"),
    ("gateway.resources.requests.memory=1e9", "gateway.resources.limits.memory=1G"),
    ("worker.resources.requests.ephemeral-storage=2Gi",),            # no limit to compare with
    ("mqtt.broker.resources.requests.cpu=100m", "mqtt.broker.resources.limits.cpu=0.1"),
])
def test_requests_equal_to_limits_in_other_units_are_accepted(sets: tuple) -> None:
    render(*sets)


@pytest.mark.parametrize("limits, accepted", [
    ({"max_message_bytes": None, "max_image_bytes": "message"}, True),      # the gateway's defaults
    ({"max_message_bytes": None, "max_image_bytes": "message+1"}, False),
    ({"max_message_bytes": "image"}, True),
    ({"max_message_bytes": "image-1"}, False),
    ({"max_deadline_s": "default"}, True),
    ({"max_deadline_s": "default/2"}, False),
    ({"default_deadline_s": "max"}, True),
    ({"default_deadline_s": "max+1"}, False),
    ({"default_deadline_s": " 6e1 ", "max_deadline_s": "6e1"}, True),
    ({"default_deadline_s": "6.5", "max_deadline_s": 6}, False),
])
def test_gateway_limit_rules_agree_with_the_gateway(limits: dict, accepted: bool, tmp_path: Path) -> None:
    """The chart refuses exactly the gateway.config.limits the gateway would refuse at start,
    with the gateway's own defaults for the unset ones."""
    from cloud.gateway.settings import LimitSettings, load_settings
    from edgewise.errors import ConfigError

    d = LimitSettings()
    named_values = {"message": d.max_message_bytes, "message+1": d.max_message_bytes + 1,
                    "image": d.max_image_bytes, "image-1": d.max_image_bytes - 1,
                    "default": d.default_deadline_s, "default/2": d.default_deadline_s / 2,
                    "max": d.max_deadline_s, "max+1": d.max_deadline_s + 1}
    limits = {k: named_values.get(v, v) if isinstance(v, str) else v for k, v in limits.items()}
    sets = []
    for key, value in limits.items():
        text = "null" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
        sets += ["--set-string" if isinstance(value, str) else "--set", f"gateway.config.limits.{key}={text}"]
    out = subprocess.run([helm(), "template", "rel", str(CHART), "-n", "ml", *sets], capture_output=True, text=True)
    assert (out.returncode == 0) is accepted, out.stderr
    # the gateway's verdict on the same limits, on top of the default render's config
    config = yaml.safe_load(named(render(), "ConfigMap", "gateway")["data"]["gateway.yaml"])
    for key, value in limits.items():
        if value is None:
            config["limits"].pop(key, None)
        else:
            config["limits"][key] = value
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    if accepted:
        load_settings(path, env={})
    else:
        assert "gateway.config.limits." in out.stderr and "must be <=" in out.stderr, out.stderr
        with pytest.raises(ConfigError):
            load_settings(path, env={})


@pytest.mark.parametrize("release", ["my.rel", "cams.edgewise.prod", "a" * 20 + "." + "b" * 32])
def test_dotted_release_names_give_valid_object_names(release: str) -> None:
    """Helm allows dots in a release name; Service names must be DNS-1035 labels."""
    docs = render(*MODES["broker-on"], release=release)
    label = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    for doc in docs:
        name = doc["metadata"]["name"]
        assert label.match(name) and len(name) <= 63, f"{doc['kind']} {name}"
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        for version in K8S_VERSIONS:
            validate_manifest(doc, version)
    assert named(docs, "Service", "gateway")["metadata"]["name"].startswith(release.replace(".", "-")[:20])


# --------------------------------------------------------------------------- QA probe fixes

def _container(docs: list, suffix: str) -> dict:
    return named(docs, "Deployment", suffix)["spec"]["template"]["spec"]["containers"][0]


def _gateway_config(docs: list) -> dict:
    return yaml.safe_load(named(docs, "ConfigMap", "gateway")["data"]["gateway.yaml"])


def test_every_metrics_port_listens_on_both_families() -> None:
    """Prometheus scrapes the pods' IPs, IPv6 ones in an IPv6-only cluster: a side port on the
    settings' default 0.0.0.0 is IPv4 only, and the worker's and the autoscaler's metrics went
    unscraped there; "::" answers both families (cloud/gateway/http.py)."""
    from cloud.autoscaler import settings as autoscaler
    from cloud.worker import settings as worker
    from edgewise.cli import build_parser
    from edgewise.settings import settings_from_args

    docs = render()
    env = {e["name"]: e["value"] for e in _container(docs, "worker").get("env", []) if "value" in e}
    assert worker.load_settings(None, {"model": "m.onnx"}, env=env).metrics_host == "::", env
    ns = build_parser().parse_args(_container(docs, "autoscaler")["args"])
    assert settings_from_args(ns, autoscaler.SCHEMA, env={}).metrics_host == "::"
    assert _gateway_config(docs)["metrics_host"] == "::"


@pytest.mark.parametrize("mode", ["default", "tls-public-ca", "tls-private-ca", "tls-on", "tokens", "tokens-env"])
def test_gateway_probes_ask_healthz_however_configured(mode: str) -> None:
    """The kubelet's gRPC probe is plaintext and sends no token: against a TLS port it never
    passes, and a gateway with device tokens refuses it (cloud/gateway/server.py, _Screen),
    however the tokens are given (a Secret, or EDGEWISE_GATEWAY__AUTH__* variables through
    envFrom: a review found pods that never became Ready that way). So the gateway's probes GET
    /healthz on the side port (always on: metricsPort >= 1), the gateway's serving state
    (cloud/gateway/http.py)."""
    sets = {"tokens": ("gateway.tokensSecret=edge-tokens", "helmTest.tokenSecret=probe-token"),
            "tokens-env": ("gateway.envFrom[0].secretRef.name=gateway-tokens",)}.get(mode) or MODES[mode]
    c = _container(render(*sets), "gateway")
    assert "metrics" in {p["name"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert "grpc" not in c[probe], probe
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    assert _schema_node("gateway.metricsPort")["minimum"] >= 1  # the side port cannot be switched off
    assert '"/healthz"' in (ROOT / "cloud/gateway/http.py").read_text()


def _peer_admits(peer: dict, labels: dict) -> bool:
    """A NetworkPolicy peer of this namespace (podSelector only) admitting a pod with ``labels``."""
    if "namespaceSelector" in peer or "ipBlock" in peer:
        return False
    return all(labels.get(k) == v for k, v in peer.get("podSelector", {}).get("matchLabels", {}).items())


@pytest.mark.parametrize("values", ["@exposed", "networkPolicy.gatewayIngressFrom[0].namespaceSelector.matchLabels.x=y"])
def test_helm_test_pod_may_reach_the_gateway(values: str) -> None:
    """docs' "Expose the gateway": gatewayIngressFrom admits the ingress controller's namespace
    only; the helm test pod must still reach the gateway's gRPC port."""
    docs = render(values)
    labels = helm_test_pod(docs)["metadata"]["labels"]
    policy = [p for p in by_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "rel-edgewise-gateway"][0]
    assert all(labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items()) is False
    admitted = [r for r in policy["spec"]["ingress"]
                if {"port": 50051, "protocol": "TCP"} in r["ports"]
                and (not r.get("from") or any(_peer_admits(p, labels) for p in r["from"]))]
    assert admitted, policy["spec"]["ingress"]
    # and edges still only from the configured sources
    assert [r for r in policy["spec"]["ingress"] if not r.get("from")] == []


@pytest.mark.parametrize("mode", ["hpa", "keda", "none"])
def test_existing_service_account_gets_the_gateway_role(mode: str) -> None:
    """serviceAccount.create=false: the gateway runs as serviceAccount.name and may still
    discover workers (EndpointSlices list/watch, pods get)."""
    docs = render("serviceAccount.create=false", "serviceAccount.name=edgewise-sa", f"autoscaling.mode={mode}")
    assert not by_kind(docs, "ServiceAccount")
    assert named(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["serviceAccountName"] == "edgewise-sa"
    rules = {r["resources"][0]: r["verbs"] for r in named(docs, "Role", "gateway")["rules"]}
    assert rules == {"endpointslices": ["list", "watch"], "pods": ["get"]}
    binding = named(docs, "RoleBinding", "gateway")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "edgewise-sa", "namespace": "ml"}]
    assert binding["roleRef"]["name"] == "rel-edgewise-gateway"
    assert "serviceAccount.create=false needs serviceAccount.name" in \
        (BAD / "service-account-without-name.yaml").read_text()


def test_each_service_account_gets_its_own_annotations() -> None:
    """A workload identity belongs to one account: serviceAccount.gateway.annotations and
    serviceAccount.autoscaler.annotations reach only their own ServiceAccount, on top of the
    shared serviceAccount.annotations (the account's own win on a key both set)."""
    docs = render(*MODES["service-accounts"])
    gateway = named(docs, "ServiceAccount", "gateway")["metadata"]["annotations"]
    autoscaler = named(docs, "ServiceAccount", "autoscaler")["metadata"]["annotations"]
    assert gateway == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/edgewise-gateway",
                       "example.com/owner": "gateway-team", "team": "vision"}
    assert autoscaler == {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/edgewise-autoscaler",
                          "example.com/owner": "platform", "team": "vision"}
    # the pods run as the account their annotations were meant for
    assert named(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["serviceAccountName"] == \
        named(docs, "ServiceAccount", "gateway")["metadata"]["name"]
    assert named(docs, "Deployment", "autoscaler")["spec"]["template"]["spec"]["serviceAccountName"] == \
        named(docs, "ServiceAccount", "autoscaler")["metadata"]["name"]
    # none set: no annotations key at all; the gateway's own only: not on the autoscaler
    assert all("annotations" not in sa["metadata"] for sa in by_kind(render(), "ServiceAccount"))
    docs = render("serviceAccount.gateway.annotations.team=gw")
    assert named(docs, "ServiceAccount", "gateway")["metadata"]["annotations"] == {"team": "gw"}
    assert "annotations" not in named(docs, "ServiceAccount", "autoscaler")["metadata"]
    # the shared key still reaches both (values written for earlier charts), and NOTES.txt says
    # when that hands one cloud identity to both accounts
    out = subprocess.run([helm(), "install", "rel", str(CHART), "--dry-run=client", "-n", "ml",
                          *helm_args(*MODES["passthroughs"])], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    notes = out.stdout.split("NOTES:", 1)[1]
    assert "serviceAccount.annotations sets eks.amazonaws.com/role-arn on both ServiceAccounts" in notes
    out = subprocess.run([helm(), "install", "rel", str(CHART), "--dry-run=client", "-n", "ml",
                          *helm_args(*MODES["service-accounts"])], capture_output=True, text=True)
    assert "on both ServiceAccounts" not in out.stdout.split("NOTES:", 1)[1]
    # create=false: the shared annotations are on no account (refusing them would break upgrades
    # of installs that set them before; the per-account keys, new, are refused), and NOTES says so
    sets = ("serviceAccount.create=false", "serviceAccount.name=edgewise-sa", "autoscaling.mode=hpa",
            "serviceAccount.annotations.team=vision", "serviceAccount.annotations.example\\.com/owner=ops")
    out = subprocess.run([helm(), "install", "rel", str(CHART), "--dry-run=client", "-n", "ml", *helm_args(*sets)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "serviceAccount.annotations is set but serviceAccount.create=false: the chart creates no ServiceAccount, " \
        "so these annotations (example.com/owner, team) are on no account. Annotate the existing ServiceAccount " \
        "edgewise-sa yourself" in out.stdout.split("NOTES:", 1)[1]
    assert not by_kind(render(*sets), "ServiceAccount")


def test_every_pod_gets_the_image_pull_secrets() -> None:
    docs = render(*MODES["private-registry"])
    pods = dict(pod_specs(docs))
    assert {"rel-edgewise-mosquitto", "rel-edgewise-test-detect"} <= set(pods)
    for name, spec in pods.items():
        assert spec.get("imagePullSecrets") == [{"name": "regcred"}], name


@pytest.mark.parametrize("sets, worker, gateway", [
    ((), "0.1.0-cuda", "0.1.0"),
    (("image.tag=0.2.0",), "0.2.0-cuda", "0.2.0"),
    (("image.tag=0.2.0-cuda",), "0.2.0-cuda", "0.2.0-cuda"),
    (("image.tag=0.2.0", "worker.profile=cpu"), "0.2.0", "0.2.0"),
])
def test_gpu_workers_keep_the_cuda_image_with_a_pinned_tag(sets: tuple, worker: str, gateway: str) -> None:
    docs = render(*sets)
    repo = "ghcr.io/edgewise-ai/edgewise:"
    assert _container(docs, "worker")["image"] == repo + worker
    assert _container(docs, "gateway")["image"] == repo + gateway
    assert helm_test_pod(docs)["spec"]["containers"][0]["image"] == repo + gateway


DIGEST_A, DIGEST_C = "sha256:" + "a" * 64, "sha256:" + "c" * 64


def test_every_image_pinned_by_digest() -> None:
    """image.digest / image.cudaDigest render <repository>:<tag>@sha256:..., on the gateway,
    the autoscaler, the helm test and the workers (GPU workers: the -cuda image's digest), and
    with the broker's and the model image's own digests no container is left pulled by tag."""
    docs = render(*MODES["digest-pinned"])
    repo = "ghcr.io/edgewise-ai/edgewise:"
    assert _container(docs, "gateway")["image"] == f"{repo}0.2.0@{DIGEST_A}"
    assert _container(docs, "autoscaler")["image"] == f"{repo}0.2.0@{DIGEST_A}"
    assert helm_test_pod(docs)["spec"]["containers"][0]["image"] == f"{repo}0.2.0@{DIGEST_A}"
    assert _container(docs, "worker")["image"] == f"{repo}0.2.0-cuda@{DIGEST_C}"
    images = {name: [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]
              for name, spec in pod_specs(docs)}
    assert {"rel-edgewise-mosquitto", "rel-edgewise-test-detect", "rel-edgewise-worker"} <= set(images)
    unpinned = {n: i for n, i in images.items() if not all(re.search(r"@sha256:[a-f0-9]{64}$", x) for x in i)}
    assert not unpinned, unpinned


@pytest.mark.parametrize("sets, worker, gateway", [
    (("worker.profile=cpu", f"image.digest={DIGEST_A}"), f"0.1.0@{DIGEST_A}", f"0.1.0@{DIGEST_A}"),
    # a tag already ending in -cuda is one image everywhere: one digest
    (("image.tag=0.2.0-cuda", f"image.digest={DIGEST_A}"), f"0.2.0-cuda@{DIGEST_A}", f"0.2.0-cuda@{DIGEST_A}"),
    # only the GPU workers pinned
    ((f"image.cudaDigest={DIGEST_C}",), f"0.1.0-cuda@{DIGEST_C}", "0.1.0"),
    ((f"image.cudaDigest={DIGEST_C}", "worker.profile=cpu"), "0.1.0", "0.1.0"),
], ids=["cpu", "tag-already-cuda", "gpu-workers-only", "cuda-digest-unused-on-cpu"])
def test_image_digest_follows_the_image_each_pod_runs(sets: tuple, worker: str, gateway: str) -> None:
    docs = render(*sets)
    repo = "ghcr.io/edgewise-ai/edgewise:"
    assert _container(docs, "worker")["image"] == repo + worker
    assert _container(docs, "gateway")["image"] == repo + gateway
    assert helm_test_pod(docs)["spec"]["containers"][0]["image"] == repo + gateway


def test_gateway_mqtt_settings_survive_the_bridge(tmp_path: Path) -> None:
    """gateway.config.mqtt keys are merged with the chart's bridge settings (which win)."""
    from cloud.gateway.settings import load_settings

    docs = render(*MODES["broker-on"], "gateway.config.mqtt.keepalive_s=45",
                  "gateway.config.mqtt.response_topic_pattern=replies/{device}/#",
                  "gateway.config.mqtt.host=elsewhere.example", "gateway.config.mqtt.topic_prefix=fleet")
    mqtt = _gateway_config(docs)["mqtt"]
    assert mqtt["keepalive_s"] == 45 and mqtt["response_topic_pattern"] == "replies/{device}/#"
    assert mqtt["topic_prefix"] == "fleet"
    assert mqtt["host"] == "rel-edgewise-mosquitto" and mqtt["port"] == 1883 and mqtt["enabled"] is True
    path = tmp_path / "gateway.yaml"
    path.write_text(named(docs, "ConfigMap", "gateway")["data"]["gateway.yaml"])
    settings = load_settings(path, env={})
    assert settings.mqtt.keepalive_s == 45 and settings.mqtt.response_pattern() == "replies/{device}/#"


def test_gateway_auth_settings_survive_the_tokens_secret(tmp_path: Path) -> None:
    """gateway.config.auth keys are merged with the tokens file gateway.tokensSecret mounts (which wins):
    auth.tokens_poll_s was dropped without a word when a tokens Secret was named, and the gateway polled
    every 5 s (its default) instead of the value given."""
    from cloud.gateway.settings import load_settings

    docs = render("gateway.tokensSecret=tokens", "helmTest.tokenSecret=test-token",
                  "gateway.config.auth.tokens_poll_s=30", "gateway.config.auth.tokens_file=/elsewhere.yaml")
    auth = _gateway_config(docs)["auth"]
    assert auth == {"tokens_file": "/etc/edgewise/auth/tokens.yaml", "tokens_poll_s": 30}
    path = tmp_path / "gateway.yaml"
    path.write_text(named(docs, "ConfigMap", "gateway")["data"]["gateway.yaml"])
    assert load_settings(path, env={}).auth.tokens_poll_s == 30.0


@pytest.mark.parametrize("bad", ["gateway-inline-tokens", "gateway-inline-mqtt-password"])
def test_inline_secrets_stay_out_of_the_configmap(bad: str) -> None:
    out = subprocess.run([helm(), "template", "rel", str(CHART), "-f", str(BAD / f"{bad}.yaml")],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "clear text" in out.stderr
    assert ("gateway.tokensSecret" if "tokens" in bad else "mqtt.broker.authSecret") in out.stderr


@pytest.mark.parametrize("key, flag, value", [
    ("max_message_bytes", "--max-message-bytes", "default"),
    ("max_message_bytes", "--max-message-bytes", None),  # values.yaml sets it; null unsets it
    ("max_message_bytes", "--max-message-bytes", 16777216),
    ("max_image_pixels", "--max-image-pixels", "default"),
    ("max_image_pixels", "--max-image-pixels", 50_000_000),
])
def test_workers_take_the_gateway_limits(key: str, flag: str, value) -> None:
    """limits.max_message_bytes and max_image_pixels hold "on both hops": the workers accept
    what the gateway forwards (unset: the gateway's default, which is the worker's)."""
    from cloud.gateway.settings import LimitSettings
    from cloud.worker.settings import WorkerSettings

    default = getattr(LimitSettings(), key)
    assert getattr(WorkerSettings(), key) == default
    sets = () if value == "default" else (f"gateway.config.limits.{key}={'null' if value is None else value}",)
    args = _container(render(*sets), "worker")["args"]
    if value == "default":
        value = yaml.safe_load((CHART / "values.yaml").read_text())["gateway"]["config"]["limits"].get(key)
    if value is None:  # unset: the worker's own default, which is the gateway's
        assert not [a for a in args if a.startswith(f"{flag}=")], args
    else:
        assert f"{flag}={value}" in args


@pytest.mark.parametrize("mode, replicas", [("default", 2), ("none", 2)])
def test_worker_replicas_in_builtin_mode_come_from_the_live_deployment(mode: str, replicas: int) -> None:
    """builtin: `helm upgrade` keeps the autoscaled count (lookup of the live Deployment);
    helm template sees no cluster and renders worker.replicas."""
    assert named(render(*MODES[mode]), "Deployment", "worker")["spec"]["replicas"] == replicas
    assert named(render(*MODES[mode], "worker.replicas=5"), "Deployment", "worker")["spec"]["replicas"] == 5
    tpl = (CHART / "templates/worker.yaml").read_text()
    assert 'lookup "apps/v1" "Deployment" .Release.Namespace (printf "%s-worker"' in tpl
    assert 'dig "spec" "replicas" .Values.worker.replicas' in tpl


def _gateway_verdict(config: dict, tmp_path: Path):
    """The gateway's loader on the default render's gateway.yaml with ``config`` merged in."""
    from cloud.gateway.settings import load_settings

    merged = _gateway_config(render())
    for section, keys in config.items():
        merged.setdefault(section, {}).update(keys)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(merged))
    return lambda: load_settings(path, env={})


@pytest.mark.parametrize("config, accepted", [
    ({"balancer": {"base_ejection_s": 600}}, False),
    ({"balancer": {"base_ejection_s": 300}}, True),
    ({"balancer": {"base_ejection_s": 10, "max_ejection_s": 5}}, False),
    ({"balancer": {"base_ejection_s": 60, "max_ejection_s": "6e1"}}, True),
    ({"mqtt": {"reconnect_min_s": 40}}, False),
    ({"mqtt": {"reconnect_min_s": 30}}, True),
    ({"mqtt": {"reconnect_min_s": 1, "reconnect_max_s": 0.5}}, False),
    ({"mqtt": {"response_topic_pattern": "replies/{device}/#"}}, True),
    ({"mqtt": {"response_topic_pattern": "a/+/{device}"}}, True),
    ({"mqtt": {"response_topic_pattern": "replies/#"}}, False),
    ({"mqtt": {"response_topic_pattern": "replies/#/{device}"}}, False),
    ({"mqtt": {"response_topic_pattern": "$SYS/{device}"}}, False),
    ({"mqtt": {"response_topic_pattern": "a//{device}"}}, False),
    ({"mqtt": {"response_topic_pattern": "a/b+c/{device}"}}, False),
    ({"tls": {"client_ca_file": "/c"}}, False),
    ({"tls": {"require_client_cert": True}}, False),
    ({"tls": {"client_ca_file": "/c", "require_client_cert": True}}, False),
    ({"tls": {"cert_file": "/a"}}, False),
    ({"tls": {"cert_file": "/a", "key_file": "/b"}}, True),
    ({"tls": {"cert_file": "/a", "key_file": "/b", "client_ca_file": "/c"}}, False),
    ({"tls": {"cert_file": "/a", "key_file": "/b", "require_client_cert": True}}, False),
    ({"tls": {"cert_file": "/a", "key_file": "/b", "client_ca_file": "/c", "require_client_cert": True}}, True),
])
def test_gateway_cross_field_rules_agree_with_the_gateway(config: dict, accepted: bool, tmp_path: Path) -> None:
    """validate.yaml refuses the gateway.config the gateway would refuse at start (balancer
    ejection, MQTT reconnect, server TLS keys, response topic pattern), naming the value."""
    from edgewise.errors import ConfigError

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"gateway": {"config": config}}))
    out = subprocess.run([helm(), "template", "rel", str(CHART), "-n", "ml", "-f", str(values)],
                         capture_output=True, text=True)
    assert (out.returncode == 0) is accepted, out.stderr
    load = _gateway_verdict(config, tmp_path)
    if accepted:
        load()
    else:
        section = next(iter(config))
        assert f"gateway.config.{section}" in out.stderr and "refuses to start" in out.stderr, out.stderr
        with pytest.raises(ConfigError):
            load()


def test_chart_tls_values_satisfy_the_gateway_tls_rules() -> None:
    """tls.grpc.* sets the keys itself: gateway.config.tls.client_identity alone is fine, and
    clientAuth supplies client_ca_file and require_client_cert together."""
    render(*MODES["tls-on"], "gateway.config.tls.client_identity=none")
    render(*MODES["tls-public-ca"], "gateway.config.tls.client_identity=none")


@pytest.mark.parametrize("sets, seconds", [((), 1200), (("worker.startupSeconds=3600",), 3600),
                                           (("worker.startupSeconds=95",), 95)])
def test_worker_startup_allows_startup_seconds(sets: tuple, seconds: int) -> None:
    """A first TensorRT build takes ~12 minutes: the startup probe allows worker.startupSeconds."""
    probe = _container(render(*sets), "worker")["startupProbe"]
    allowed = probe["periodSeconds"] * probe["failureThreshold"]
    assert seconds <= allowed < seconds + probe["periodSeconds"]


def test_ingress_refuses_client_certificates() -> None:
    out = subprocess.run([helm(), "template", "rel", str(CHART), "-f", str(BAD / "ingress-with-client-auth.yaml")],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "gateway.ingress.enabled" in out.stderr and "tls.grpc.clientAuth" in out.stderr
    render(*MODES["tls-on"], "gateway.service.type=LoadBalancer")  # mTLS end to end stays possible


@pytest.mark.parametrize("value, setting", [
    ("threads", "threads"),
    ("batching.maxBatchSize", "batching.max_batch_size"),
    ("batching.maxQueueDelayMs", "batching.max_queue_delay_ms"),
    ("batching.queueSize", "batching.max_queue_size"),
])
def test_the_chart_and_the_worker_allow_the_same_worker_values(value: str, setting: str) -> None:
    """worker.yaml passes these values to the worker's flags: a range the chart checks and the
    worker does not (threads, maxQueueDelayMs, queueSize were open-ended in the worker, so
    `edgewise cloud worker --threads 99999999999999` died in ONNX Runtime with a traceback) is
    a rule kept in two places. The chart's schema and the worker's settings give the same."""
    from cloud.worker.settings import WorkerSettings
    from edgewise.settings.fields import walk

    node = json.loads((CHART / "values.schema.json").read_text())["properties"]["worker"]
    for part in value.split("."):
        node = node["properties"][part]
    spec = dict(walk(WorkerSettings))[setting].spec
    assert (node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum")) == (spec.lo, spec.hi)
    assert ("exclusiveMinimum" in node, "exclusiveMaximum" in node) == (spec.lo_open, spec.hi_open)


@pytest.mark.parametrize("value, setting, chart_zero", [
    ("minReplicas", "min_replicas", True),            # 0: keda mode only (validate.yaml), no autoscaler runs
    ("maxReplicas", "max_replicas", False),
    ("targetLoad", "target_load", True),              # 0: off, the flag is left out (autoscaling.yaml)
    ("targetUtilization", "target_utilization", False),
    ("queueWaitSloMs", "queue_wait_slo_ms", True),    # 0: off, the flag is left out
])
def test_the_chart_and_the_autoscaler_allow_the_same_autoscaling_values(value: str, setting: str,
                                                                        chart_zero: bool) -> None:
    """autoscaling.yaml passes these values to the builtin autoscaler's flags. The chart capped
    them (10000 workers, ratios of 10, a 600 s queue-wait target) and the autoscaler did not, so
    `edgewise cloud autoscaler --max 99999999999999` (or `--target-load 1e300`) ran, patching a
    scale the API server refuses (found by a probe). The chart's schema and the autoscaler's
    settings give the same bounds; where the chart's lowest is 0, 0 means off (the flag is left
    out) or keda mode (no autoscaler), and the autoscaler takes what is above it."""
    from cloud.autoscaler.settings import AutoscalerSettings
    from edgewise.settings.fields import walk

    node = json.loads((CHART / "values.schema.json").read_text())["properties"]["autoscaling"]["properties"][value]
    spec = dict(walk(AutoscalerSettings))[setting].spec
    assert (node.get("maximum"), "exclusiveMaximum" in node) == (spec.hi, spec.hi_open)
    if chart_zero:
        assert node["minimum"] == 0 and "exclusiveMinimum" not in node
        assert spec.lo in (0, 1) and (spec.lo_open or spec.lo == 1)
    else:
        assert node.get("minimum", node.get("exclusiveMinimum")) == spec.lo
        assert ("exclusiveMinimum" in node) == spec.lo_open


def test_large_integers_render_as_integers(tmp_path: Path) -> None:
    """Helm reads numbers of a values file as floats: 1000000 printed as is is 1e+06."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "gateway": {"replicas": 1000, "pdb": {"minAvailable": 100},
                    "config": {"limits": {"max_message_bytes": 16777216, "max_image_bytes": 10000000}}},
        "worker": {"replicas": 10000, "terminationGracePeriodSeconds": 86400, "threads": 1000,
                   "batching": {"queueSize": 1000000, "maxBatchSize": 8}, "pdb": {"maxUnavailable": 1000}},
        "autoscaling": {"minReplicas": 1000, "maxReplicas": 10000, "scaleDownStabilizationSeconds": 3600,
                        "queueWaitSloMs": 100000}}))
    for mode in ("builtin", "hpa", "keda"):
        text = render_text(f"autoscaling.mode={mode}", values=values)
        assert not re.search(r"\d[eE]\+\d", text), re.findall(r".*\d[eE]\+\d.*", text)
        docs = [d for d in yaml.safe_load_all(text) if d]
        for doc in docs:
            validate_manifest(doc, K8S_VERSIONS[-1])
    docs = render(values=values)
    worker = named(docs, "Deployment", "worker")
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 86400
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"--queue-size=1000000", "--grace=86395", "--threads=1000", "--max-message-bytes=16777216"} <= set(args)
    auto = _container(docs, "autoscaler")["args"]
    assert {"--min=1000", "--max=10000", "--queue-wait-slo-ms=100000"} <= set(auto)
    out = subprocess.run([helm(), "template", "rel", str(CHART), "--set", "worker.terminationGracePeriodSeconds=1000000"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "/worker/terminationGracePeriodSeconds" in out.stderr


@pytest.mark.parametrize("sets, seconds", [
    ((), 30),                                                     # the chart's 5 s + the gateway's 10 s + 15
    (("gateway.config.shutdown_grace_s=60",), 80),
    (("gateway.config.shutdown_grace_s=20.5",), 41),              # 25.5 s rounded up, + 15
    (("gateway.config.shutdown_delay_s=0.5", "gateway.config.shutdown_grace_s=20.4"), 36),  # the sum rounded up
    (("gateway.config.shutdown_delay_s=30",), 55),
    (("gateway.config.shutdown_delay_s=0",), 30),                 # at least 30
    (("gateway.config.shutdown_delay_s=null", "gateway.config.shutdown_grace_s=20"), 35),  # the gateway's 0
])
def test_gateway_pod_grace_covers_its_shutdown_delay_and_grace(sets: tuple, seconds: int) -> None:
    """terminationGracePeriodSeconds is the gateway's ``shutdown_delay_s`` (it still serves while
    the Service drops the pod) and ``shutdown_grace_s`` (its drain), rounded up, + 15 s, at
    least 30: below the sum, the kubelet killed the gateway mid-drain."""
    from cloud.gateway.settings import GatewaySettings

    chart = yaml.safe_load((CHART / "values.yaml").read_text())["gateway"]["config"]
    assert chart["shutdown_delay_s"] == 5  # the chart waits for the Service (the gateway's own default: 0)
    assert GatewaySettings().shutdown_delay_s == 0
    # the default render's 30 s covers the chart's delay and the gateway's default grace
    assert chart["shutdown_delay_s"] + GatewaySettings().shutdown_grace_s + 15 <= 30
    spec = named(render(*sets), "Deployment", "gateway")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == seconds


def test_autoscaler_role_and_hpa_docs_match_what_is_rendered() -> None:
    """The autoscaler only reads/patches the worker scale (it finds gateways by DNS); the docs
    name the HPA's metric type the chart renders."""
    role = named(render(), "Role", "autoscaler")
    assert [r["resources"] for r in role["rules"]] == [["deployments/scale"]]
    autoscaler = "".join(p.read_text() for p in (ROOT / "cloud/autoscaler").glob("*.py"))
    assert "endpointslice" not in autoscaler.lower() and "DiscoveryV1" not in autoscaler
    metric = by_kind(render(*MODES["hpa"]), "HorizontalPodAutoscaler")[0]["spec"]["metrics"][0]["type"]
    row = [line for line in (ROOT / "docs/install-cloud.md").read_text().splitlines() if line.startswith("| `hpa` |")]
    assert len(row) == 1 and f"{metric} metric" in row[0] and "Object metric" not in row[0]


def test_the_gateways_share_group_is_left_to_them_unless_set() -> None:
    """A device that names the gateways' shared-subscription group joins it and drops a share
    of every device's requests (acl_file does not check subscriptions); the chart's former
    default, ``edgewise-gateways``, was public. Unset, the gateways derive it from their broker
    credential; the chart's broker also ends never-expiring sessions."""
    docs = render(*MODES["broker-on"])
    cfg = yaml.safe_load(named(docs, "ConfigMap", "gateway")["data"]["gateway.yaml"])
    assert cfg["mqtt"]["enabled"] is True and "group" not in cfg["mqtt"]
    assert "persistent_client_expiration 1d" in named(docs, "ConfigMap", "mosquitto")["data"]["mosquitto.conf"]
    # the broker's password reaches mosquitto_passwd through a pipe, not its arguments (the node's ps)
    init = named(docs, "Deployment", "mosquitto")["spec"]["template"]["spec"]["initContainers"][0]["command"][-1]
    assert "| mosquitto_passwd" in init and "-b" not in init.split("mosquitto_passwd", 1)[1]
    # a new packet limit (from the gateway's message limit) restarts the broker
    before = named(docs, "Deployment", "mosquitto")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = named(render(*MODES["broker-on"], "gateway.config.limits.max_message_bytes=6291456"), "Deployment",
                  "mosquitto")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert before != after
    cfg = yaml.safe_load(named(render(*MODES["broker-on"], "mqtt.bridge.group=s3cret-9f"), "ConfigMap",
                               "gateway")["data"]["gateway.yaml"])
    assert cfg["mqtt"]["group"] == "s3cret-9f"
