"""The pod-spec → ``podman run`` mapping of the container smoke test, on the chart's own render."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.charts.helm import NAMESPACE, render
from tests.deploy.pods import (
    PodContext,
    Probe,
    Unsupported,
    expand,
    probe_of,
    quantity_bytes,
    run_args,
)


def _pod(component: str, *sets: str):
    docs = render("worker.profile=cpu", *sets)
    dep = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["labels"]["app.kubernetes.io/component"] == component)
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    return dep["spec"]["template"]["spec"], configmaps


def _flag_values(args, flag):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def test_expand_follows_kubernetes_rules() -> None:
    env = {"POD_NAME": "w-1", "A": "x"}
    assert expand("--worker-id=$(POD_NAME)", env) == "--worker-id=w-1"
    assert expand("$$(POD_NAME) $(A)$(A)", env) == "$(POD_NAME) xx"
    assert expand("$(MISSING) $HOME $(", env) == "$(MISSING) $HOME $("


@pytest.mark.parametrize("q, n", [("8Gi", 8 * 2**30), ("512Mi", 512 * 2**20), ("1G", 10**9), ("100", 100),
                                  ("1.5Gi", int(1.5 * 2**30))])
def test_memory_quantities(q, n) -> None:
    assert quantity_bytes(q) == n


def test_memory_quantity_with_unknown_suffix_is_refused() -> None:
    with pytest.raises(Unsupported, match="1Xi"):
        quantity_bytes("1Xi")


def test_worker_pod_maps_to_podman_flags(tmp_path: Path) -> None:
    pod, cms = _pod("worker")
    c = pod["containers"][0]
    args = run_args(pod, c, PodContext("rel-edgewise-worker-abc", NAMESPACE, tmp_path, configmaps=cms),
                    image_user="10001:10001")
    image_at = args.index(c["image"])
    flags, cmd = args[:image_at], args[image_at + 1:]
    assert cmd[:2] == ["cloud", "worker"] and "--worker-id=rel-edgewise-worker-abc" in cmd
    assert _flag_values(flags, "--user") == ["10001:10001"] and _flag_values(flags, "--group-add") == ["10001"]
    assert {"--read-only", "--read-only-tmpfs=false", "--cap-drop=all"} <= set(flags)
    assert _flag_values(flags, "--security-opt") == ["no-new-privileges"]
    assert sorted(_flag_values(flags, "--mount")) == [
        "type=tmpfs,destination=/tmp,tmpfs-mode=0777",
        "type=tmpfs,destination=/var/cache/edgewise,tmpfs-mode=0777"]
    assert "POD_NAME=rel-edgewise-worker-abc" in _flag_values(flags, "-e")
    assert _flag_values(flags, "--memory") == [str(8 * 2**30)]
    assert _flag_values(flags, "--pull") == ["missing"] and _flag_values(flags, "--stop-timeout") == ["30"]
    assert probe_of(c, "startupProbe") == probe_of(c, "readinessProbe") == Probe(50052)


def test_gateway_gets_its_config_file_and_the_service_account(tmp_path: Path) -> None:
    pod, cms = _pod("gateway")
    sa = {"token": "t", "ca.crt": "CA", "namespace": NAMESPACE}
    ctx = PodContext("rel-edgewise-gateway-abc", NAMESPACE, tmp_path, configmaps=cms, service_account=sa,
                     kube_env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"})
    args = run_args(pod, pod["containers"][0], ctx, image_user="10001:10001")
    vols = dict(v.rsplit(":", 2)[:2] for v in _flag_values(args, "-v"))
    assert all(v.endswith(":ro") for v in _flag_values(args, "-v"))
    cfg = Path(next(src for src, dst in vols.items() if dst == "/etc/edgewise/gateway.yaml"))
    assert cfg.read_text() == cms["rel-edgewise-gateway"]["gateway.yaml"]
    token = Path(next(src for src, dst in vols.items() if dst == "/var/run/secrets/kubernetes.io/serviceaccount"))
    assert (token / "token").read_text() == "t"
    assert {"KUBERNETES_SERVICE_HOST=10.0.0.1", "KUBERNETES_SERVICE_PORT=6443"} <= set(_flag_values(args, "-e"))


@pytest.mark.parametrize("change, message", [
    (lambda pod, c: c.update(lifecycle={"preStop": {}}), "lifecycle"),
    (lambda pod, c: pod.update(hostNetwork=True), "hostNetwork"),
    (lambda pod, c: c["securityContext"].update(runAsUser=0), "would run as user '0'"),
    (lambda pod, c: c.update(readinessProbe={"tcpSocket": {"port": 1}}), "tcpSocket"),
    (lambda pod, c: c.update(readinessProbe={"httpGet": {"port": "nope"}}), "names no container port"),
    (lambda pod, c: c["env"].append({"name": "X", "valueFrom": {"resourceFieldRef": {}}}), "resourceFieldRef"),
])
def test_what_the_runner_does_not_model_is_refused(tmp_path: Path, change, message) -> None:
    pod, cms = _pod("worker")
    c = pod["containers"][0]
    change(pod, c)
    with pytest.raises(Unsupported, match=message):
        run_args(pod, c, PodContext("w", NAMESPACE, tmp_path, configmaps=cms))
        probe_of(c, "readinessProbe")


def test_pvc_models_are_not_modelled(tmp_path: Path) -> None:
    pod, cms = _pod("worker", "model.source=pvc", "model.pvc.claimName=models")
    with pytest.raises(Unsupported, match="persistentVolumeClaim"):
        run_args(pod, pod["containers"][0], PodContext("w", NAMESPACE, tmp_path, configmaps=cms))


def test_the_gateways_http_probes_are_modelled_by_port_name() -> None:
    pod, _ = _pod("gateway")
    c = pod["containers"][0]
    assert probe_of(c, "readinessProbe") == probe_of(c, "livenessProbe") == Probe(9100, "/healthz")
