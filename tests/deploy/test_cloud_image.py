"""The CPU cloud image built from ``deploy/docker/Dockerfile`` runs the chart's pods.

The image is built with podman (``edgewise_tools.images``, what ``make images`` runs; a
rebuild with unchanged sources takes seconds). A gateway and two workers then start from it
with exactly the arguments, environment, user, read-only root filesystem and volumes that
``helm template`` renders for them (``tests/deploy/pods.py`` maps the pod spec to
``podman run``), each container on its own address of podman's bridge network as pods
have. The gateway discovers the workers as it does in a cluster: in-cluster service-account
config against a local HTTPS server speaking the EndpointSlice API. Real frames go through
the gateway while one worker container is killed; no request may be lost. Then /metrics,
/pool, the health service and the chart's ``helm test`` pod, and a graceful stop.

Skipped, with the reason, only where podman cannot run containers.
"""

from __future__ import annotations

import json
import secrets
import ssl
import subprocess
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgewise.v1 import detect_pb2, service_pb2_grpc
from edgewise.wire import encode_image
from edgewise_tools import images
from tests.charts.helm import NAMESPACE, render
from tests.cloud.discovery.fakeapi import FakeKubeAPI, endpoint, slice_doc
from tests.cloud.gateway.pki import Pki
from tests.deploy.pods import (
    PodContext,
    Probe,
    container_name,
    pod_args,
    probe_of,
    probe_ok,
    probe_passes,
    run_args,
)

# The first test also builds the image (minutes on a fresh machine: stand-in base + pip).
pytestmark = pytest.mark.timeout(1800)

FRAMES = 36          # requests sent through the gateway
KILL_AFTER = 12      # answers (from both workers) before one worker container is killed
CLIENTS = 4          # concurrent edges, one channel each
DEADLINE_S = 30.0    # per request, as an edge's escalation deadline


def podman(*args: str, timeout: float = 120, check: bool = True) -> str:
    out = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])} failed: {out.stderr.strip()}")
    return out.stdout.strip()


@pytest.fixture(scope="module")
def cloud_image() -> images.Built:
    problem = images.podman_problem()
    if problem:
        pytest.skip(problem)
    base = images.choose_base("auto", log=lambda _msg: None)
    ran = subprocess.run(["podman", "run", "--rm", base.name, "python3", "-c", "pass"],
                         capture_output=True, text=True, timeout=300)
    if ran.returncode != 0:
        pytest.skip(f"podman cannot run containers here: {(ran.stderr.strip().splitlines() or ['?'])[-1]}")
    return images.build(base, images.IMAGE)


def _by(docs: List[Dict[str, Any]], kind: str, component: str) -> Dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind
             and d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one {kind} of component {component}, got {len(found)}"
    return found[0]


def _only_container(pod: Mapping[str, Any]) -> Dict[str, Any]:
    assert len(pod["containers"]) == 1 and not pod.get("initContainers"), "one container per pod expected"
    return dict(pod["containers"][0])


def _port(container: Mapping[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == name))


def _wait(what: str, cond: Callable[[], bool], timeout: float, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s; logs:\n{logs()}")
        time.sleep(0.2)


def _metrics(ip: str, port: int) -> Dict[str, Dict[tuple, float]]:
    """``/metrics`` as {sample name: {sorted label items: value}}."""
    text = urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10).read().decode()
    out: Dict[str, Dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


class Cluster:
    """The pods of one smoke run: labelled for clean-up; their containers' addresses and logs."""

    def __init__(self, image: images.Built) -> None:
        self.image = image
        self.label = f"edgewise.smoke={secrets.token_hex(4)}"
        self.image_user = podman("image", "inspect", "--format", "{{.Config.User}}", image.tag)

    def start(self, pod: Mapping[str, Any], ctx: PodContext) -> tuple[str, str]:
        """Start the pod's container; returns (container name, pod IP)."""
        container = _only_container(pod)
        args = run_args(pod, container, ctx, self.image_user)
        podman("pod", "create", *pod_args(ctx, [self.label]))
        podman("run", *args)
        infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", ctx.name)
        return container_name(ctx, container), podman("inspect", "--format", "{{.NetworkSettings.IPAddress}}", infra)

    def logs(self, name: str, tail: int = 40) -> str:
        """The container's stdout and stderr (its log records), last ``tail`` lines."""
        out = subprocess.run(["podman", "logs", "--tail", str(tail), name], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        return out.stdout.strip() or "(none)"

    def running(self, name: str) -> bool:
        return podman("inspect", "--format", "{{.State.Running}}", name, check=False) == "true"

    def wait_probes(self, name: str, ip: str, container: Mapping[str, Any], timeout: float = 240) -> None:
        """The startup and readiness probes pass (the kubelet's order), or the container died."""
        for kind in ("startupProbe", "readinessProbe"):
            probe = probe_of(container, kind)
            if probe is None:
                continue
            def ok(probe: Probe = probe) -> bool:
                if not self.running(name):
                    raise AssertionError(f"{name} exited; logs:\n{self.logs(name)}")
                return probe_passes(ip, probe)
            _wait(f"{name}: {kind} {probe} passes", ok, timeout, lambda: self.logs(name))

    def remove_all(self) -> None:
        ids = podman("pod", "ps", "-q", "--filter", f"label={self.label}", check=False).split()
        if ids:
            podman("pod", "rm", "-f", "-t", "0", *ids, check=False)


@pytest.fixture
def cluster(cloud_image: images.Built) -> Iterator[Cluster]:
    c = Cluster(cloud_image)
    try:
        yield c
    finally:
        c.remove_all()


def _frames(n: int) -> List[bytes]:
    """``n`` JPEG 1280x720 frames of the camera world's held-out scenes (what the baked-in
    cloud model, the camera pair's, was trained for), from CLIENTS streams."""
    from edgewise.synth import StreamGenerator, load_difficulty

    gens = [StreamGenerator(1280, 720, load_difficulty("camera"), "test", seed=7, stream=s) for s in range(CLIENTS)]
    return [encode_image(gens[i % CLIENTS].next_frame()[0], "jpeg", 90) for i in range(n)]


def _send(target: str, frames: List[bytes], on_answer: Callable[[int, Any], None]) -> List[Any]:
    """Each frame as one Detect call from CLIENTS concurrent edges (one channel each, as the
    edge daemon keeps one); returns (send time, response or error) per frame."""
    results: List[Any] = [None] * len(frames)
    lock = threading.Lock()
    done = [0]

    def client(c: int) -> None:
        with grpc.insecure_channel(target) as ch:
            stub = service_pb2_grpc.EscalationStub(ch)
            for i in range(c, len(frames), CLIENTS):
                t0, now = time.monotonic(), time.time_ns()
                req = detect_pb2.DetectRequest(
                    device_id=f"smoke-cam-{c}", stream_id="cam", frame_seq=i, capture_time_unix_ns=now,
                    deadline_unix_ns=now + int(DEADLINE_S * 1e9), trace_id=uuid.uuid4().hex,
                    image=frames[i], reason="smoke")
                try:
                    results[i] = (t0, stub.Detect(req, timeout=DEADLINE_S))
                except grpc.RpcError as exc:
                    results[i] = (t0, f"{exc.code().name}: {exc.details()}")
                with lock:
                    done[0] += 1
                    count = done[0]
                on_answer(count, results[i][1])

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_gateway_and_workers_from_the_image_survive_a_worker_kill(cluster: Cluster, tmp_path: Path, capsys) -> None:
    t_start = time.monotonic()
    image = cluster.image
    docs = render("worker.profile=cpu", f"image.repository={image.tag.rsplit(':', 1)[0]}", "autoscaling.mode=none")
    gw_dep, wk_dep = _by(docs, "Deployment", "gateway"), _by(docs, "Deployment", "worker")
    gw_pod, wk_pod = gw_dep["spec"]["template"]["spec"], wk_dep["spec"]["template"]["spec"]
    gw_c, wk_c = _only_container(gw_pod), _only_container(wk_pod)
    assert gw_c["image"] == wk_c["image"] == image.tag, "the chart's CPU image must be the one built"
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    wk_svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-worker"))

    # ---- two worker pods: pod name -> (container, IP) ------------------------------------------
    workers: Dict[str, tuple[str, str]] = {}
    for _ in range(2):
        name = f"{wk_dep['metadata']['name']}-{secrets.token_hex(3)}"
        workers[name] = cluster.start(wk_pod, PodContext(name, NAMESPACE, tmp_path, configmaps=configmaps))
    for container, ip in workers.values():
        cluster.wait_probes(container, ip, wk_c)

    # ---- the API server the gateway's discovery watches (in-cluster config, HTTPS) --------
    bridge = podman("network", "inspect", "podman", "--format", "{{range .Subnets}}{{.Gateway}}{{end}}")
    pki = Pki(tmp_path)
    pki.issue("api", "kube-apiserver", f"IP:{bridge}")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.path("api.pem"), pki.path("api.key"))
    api = FakeKubeAPI(namespace=NAMESPACE, service=wk_svc["metadata"]["name"], host=bridge, ssl_context=tls)
    try:
        weight = wk_dep["spec"]["template"]["metadata"]["annotations"].get("edgewise.io/weight")
        for name in workers:
            api.put_pod(name, weight=weight)
        ports = tuple((p["name"], _port(wk_c, p["targetPort"]) if isinstance(p["targetPort"], str)
                       else int(p["targetPort"])) for p in wk_svc["spec"]["ports"])  # targetPorts resolved

        def publish(ready: Mapping[str, bool]) -> None:
            eps = [endpoint(workers[n][1], n, ready=r) for n, r in ready.items()]
            api.put_slice(slice_doc(f"{wk_svc['metadata']['name']}-abcde", wk_svc["metadata"]["name"], eps,
                                    ports=ports))
        publish({n: True for n in workers})

        # ---- the gateway pod --------------------------------------------------------------
        sa = {"token": "smoke-token", "ca.crt": (tmp_path / "ca.pem").read_text(), "namespace": NAMESPACE}
        ctx = PodContext(f"{gw_dep['metadata']['name']}-{secrets.token_hex(3)}", NAMESPACE, tmp_path,
                         configmaps=configmaps, service_account=sa,
                         kube_env={"KUBERNETES_SERVICE_HOST": bridge, "KUBERNETES_SERVICE_PORT": str(api.port)})
        gw, gw_ip = cluster.start(gw_pod, ctx)
        cluster.wait_probes(gw, gw_ip, gw_c)
        grpc_port, gw_metrics = _port(gw_c, "grpc"), _port(gw_c, "metrics")

        def pool() -> Dict[str, str]:
            doc = json.loads(urllib.request.urlopen(f"http://{gw_ip}:{gw_metrics}/pool", timeout=10).read())
            return {w["name"]: w["state"] for w in doc["workers"]}
        _wait("the gateway lists both workers from the EndpointSlice",
              lambda: pool() == {n: "ready" for n in workers}, 60, lambda: cluster.logs(gw))
        # the service-account token, as the in-cluster client sends it (auth schemes are case-insensitive)
        assert {(a or "").lower() for *_, a in api.requests} == {"bearer smoke-token"}, api.requests

        # ---- real frames; one worker container is killed mid-run ------------------------------
        victim, survivor = list(workers)
        killed_at: List[float] = []
        seen: set = set()
        kill_lock = threading.Lock()

        def on_answer(count: int, resp: Any) -> None:  # kill once both workers have answered
            with kill_lock:
                if isinstance(resp, detect_pb2.DetectResponse):
                    seen.add(resp.worker_id)
                if count >= KILL_AFTER and seen == set(workers) and not killed_at:
                    podman("kill", "--signal", "KILL", workers[victim][0])
                    killed_at.append(time.monotonic())
        results = _send(f"{gw_ip}:{grpc_port}", _frames(FRAMES), on_answer)
        assert killed_at, f"no kill: both workers never answered (answers came from {seen})"
        assert not cluster.running(workers[victim][0])
        lost = [(round(t - killed_at[0], 2), r) for t, r in results
                if not isinstance(r, detect_pb2.DetectResponse) or r.status != detect_pb2.OK]
        assert not lost, (f"{len(lost)} of {FRAMES} requests lost (sent at s after the kill, error): {lost}\n"
                          f"gateway log:\n{cluster.logs(gw)}")
        assert seen == set(workers), "worker ids are the pod names ($(POD_NAME) expanded)"
        assert {r.worker_id for t, r in results if t > killed_at[0] + 0.5} <= {survivor}
        # the kill may come late in the run (both workers had to answer first): more frames after
        # it, while the gateway still lists the dead worker, are answered by the survivor alone
        more = _send(f"{gw_ip}:{grpc_port}", _frames(2 * CLIENTS), lambda count, resp: None)
        assert all(isinstance(r, detect_pb2.DetectResponse) and r.status == detect_pb2.OK
                   and r.worker_id == survivor for _, r in more), (more, cluster.logs(gw))
        assert sum(len(r.detections) for _, r in results) >= FRAMES, "the reference model finds the digits"

        # the endpoint controller marks the dead pod not ready: with nothing in flight it leaves the pool
        publish({victim: False, survivor: True})
        _wait("the gateway drops the killed worker", lambda: pool() == {survivor: "ready"}, 30,
              lambda: f"pool {pool()}\n{cluster.logs(gw)}")

        # ---- health service and /metrics ------------------------------------------------------
        sv_container, sv_ip = workers[survivor]
        assert probe_ok(gw_ip, grpc_port) and probe_ok(gw_ip, grpc_port, "edgewise.v1.Escalation")
        assert probe_ok(sv_ip, _port(wk_c, "grpc"))
        m = _metrics(gw_ip, gw_metrics)
        assert m["edgewise_gateway_requests_total"][(("status", "OK"), ("transport", "grpc"))] == FRAMES + len(more)
        assert any(dict(k)["process"] == "gateway" for k in m["edgewise_build_info"])
        m = _metrics(sv_ip, _port(wk_c, "metrics"))
        answered = sum(1 for _, r in [*results, *more] if r.worker_id == survivor)
        assert m["edgewise_worker_requests_total"][(("status", "OK"),)] == answered
        assert m["edgewise_worker_serving"][()] == 1

        # ---- the chart's `helm test` pod, with cluster DNS for the gateway Service --------------
        test_pod = next(d for d in docs if d["kind"] == "Pod"
                        and d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test")
        probe_pod, _ = cluster.start(test_pod["spec"], PodContext(
            test_pod["metadata"]["name"], NAMESPACE, tmp_path, hosts={gw_dep["metadata"]["name"]: gw_ip}))
        podman("wait", probe_pod, timeout=120)
        code = podman("inspect", "--format", "{{.State.ExitCode}}", probe_pod)
        assert code == "0", f"helm test pod exited {code}:\n{cluster.logs(probe_pod)}"
        assert '"status": "OK"' in podman("logs", probe_pod), cluster.logs(probe_pod)

        # ---- graceful stop (SIGTERM, within the pods' grace periods) ------------------------------
        for name in (gw, sv_container):
            t0 = time.monotonic()
            podman("stop", name, timeout=60)
            code = podman("inspect", "--format", "{{.State.ExitCode}}", name)
            assert code == "0", f"{name} exited {code} on SIGTERM:\n{cluster.logs(name)}"
            assert time.monotonic() - t0 < 30, f"{name} took {time.monotonic() - t0:.0f} s to stop"
    finally:
        api.close()

    with capsys.disabled():
        print(f"\n[cloud image] {images.summary(image)}; base {image.base.how}; "
              f"smoke test (gateway + 2 workers, {FRAMES} frames, 1 worker killed) {time.monotonic() - t_start:.1f} s")


def test_image_user_tools_and_no_torch(cloud_image: images.Built) -> None:
    """The image runs as the non-root user by itself, ships `edgewise model info` for the
    baked model, and carries no torch (the cloud extra does not need it)."""
    user = podman("image", "inspect", "--format", "{{.Config.User}}", cloud_image.tag)
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0, user
    info = podman("run", "--rm", "--read-only", "--cap-drop=all", cloud_image.tag,
                  "model", "info", "--json", "/models/cloud.onnx")
    assert json.loads(info)["imgsz"], info
    check = ("import importlib.util, os, sys; "
             "sys.exit(f'torch in the image: {importlib.util.find_spec(\"torch\")}' "
             "if importlib.util.find_spec('torch') else 0 if os.getuid() else 'running as root')")
    podman("run", "--rm", "--read-only", "--entrypoint", "python3", cloud_image.tag, "-c", check)
