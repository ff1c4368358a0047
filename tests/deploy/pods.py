"""Run the containers of a rendered Kubernetes pod spec with podman, as a kubelet would.

Each pod is a podman pod (its infra container holds the network namespace, hostname and
``/etc/hosts``, as the pod sandbox does), so killing a container leaves the pod's address
in place, as in a cluster. The subset of the pod API the chart uses, mapped to flags:

* ``args``/``command`` with Kubernetes' ``$(VAR)`` expansion over the container's env
  (``$$`` escapes, unknown references stay as written) — API reference, Container;
* ``env`` values, ``fieldRef`` (``metadata.name``/``metadata.namespace``),
  ``secretKeyRef``/``configMapKeyRef`` from given data;
* the pod and container ``securityContext``: ``runAsUser``/``runAsGroup`` → ``--user``,
  ``fsGroup`` → a supplementary group, ``runAsNonRoot`` enforced as the kubelet does,
  ``readOnlyRootFilesystem`` → ``--read-only`` without podman's extra tmpfs mounts,
  ``capabilities``, ``allowPrivilegeEscalation: false`` → no-new-privileges,
  ``seccompProfile: RuntimeDefault`` → podman's default profile;
* volumes: ``emptyDir`` → tmpfs, ``configMap``/``secret`` (with ``subPath``) → read-only
  files written from the given data; the service-account token when
  ``automountServiceAccountToken`` is true, plus ``KUBERNETES_SERVICE_HOST``/``PORT``;
* ``resources.limits.memory`` → ``--memory`` (CPU limits are not applied: CI machines
  have fewer cores than the chart's limits), ``terminationGracePeriodSeconds`` → stop timeout,
  ``imagePullPolicy`` → ``--pull``;
* probes of kind ``grpc`` (the standard health service, :func:`probe_ok`) and ``httpGet``
  (a port number or a container port's name, plain HTTP; 200-399 passes), checked by
  :func:`probe_passes`.

Anything else in a container or pod spec raises :class:`Unsupported` naming the field, so a
chart change the smoke test does not model fails loudly instead of being ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTAINER_KEYS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports", "resources",
                  "securityContext", "volumeMounts", "readinessProbe", "livenessProbe", "startupProbe"}
# Scheduling and registry fields have no meaning on one machine.
POD_KEYS = {"containers", "volumes", "securityContext", "serviceAccountName", "automountServiceAccountToken",
            "terminationGracePeriodSeconds", "restartPolicy", "imagePullSecrets", "nodeSelector",
            "tolerations", "affinity"}
PULL = {"IfNotPresent": "missing", "Always": "always", "Never": "never"}
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class Unsupported(ValueError):
    """The pod spec uses something this runner does not model."""


@dataclass
class PodContext:
    """What the cluster would supply to a pod."""

    name: str
    namespace: str
    workdir: Path
    configmaps: Dict[str, Dict[str, str]] = field(default_factory=dict)
    secrets: Dict[str, Dict[str, str]] = field(default_factory=dict)
    service_account: Optional[Dict[str, str]] = None   # token, ca.crt, namespace
    kube_env: Dict[str, str] = field(default_factory=dict)  # KUBERNETES_SERVICE_HOST/PORT
    hosts: Dict[str, str] = field(default_factory=dict)     # cluster DNS names -> IP


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known variables replaced, ``$$`` → ``$``, others kept."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(sub, text)


def quantity_bytes(q: str) -> int:
    """A Kubernetes memory quantity (``512Mi``, ``1G``, ``1000``) in bytes."""
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    if not m or (m.group(2) and m.group(2) not in _UNITS):
        raise Unsupported(f"memory quantity {q!r}")
    return int(float(m.group(1)) * _UNITS.get(m.group(2), 1))


def _env(container: Mapping[str, Any], ctx: PodContext) -> Dict[str, str]:
    env: Dict[str, str] = dict(ctx.kube_env)
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        src = item.get("valueFrom") or {}
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            values = {"metadata.name": ctx.name, "metadata.namespace": ctx.namespace}
            if path not in values:
                raise Unsupported(f"env {name}: fieldRef {path}")
            env[name] = values[path]
        elif "secretKeyRef" in src or "configMapKeyRef" in src:
            kind = "secretKeyRef" if "secretKeyRef" in src else "configMapKeyRef"
            ref = src[kind]
            store = ctx.secrets if kind == "secretKeyRef" else ctx.configmaps
            try:
                env[name] = store[ref["name"]][ref["key"]]
            except KeyError:
                raise Unsupported(f"env {name}: {kind} {ref['name']}/{ref['key']} was not provided") from None
        else:
            raise Unsupported(f"env {name}: valueFrom {sorted(src)}")
    return env


def _security(pod: Mapping[str, Any], container: Mapping[str, Any], image_user: str) -> List[str]:
    psc, csc = pod.get("securityContext") or {}, container.get("securityContext") or {}
    sc = {**psc, **csc}
    unknown = set(sc) - {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "seccompProfile",
                         "readOnlyRootFilesystem", "allowPrivilegeEscalation", "capabilities"}
    if unknown:
        raise Unsupported(f"securityContext {sorted(unknown)}")
    flags: List[str] = []
    uid = sc.get("runAsUser")
    user = image_user.split(":")[0] if uid is None else str(uid)
    if sc.get("runAsNonRoot") and (not user.isdigit() or int(user) == 0):
        # The kubelet refuses to start such a container (it cannot verify a named user).
        raise Unsupported(f"runAsNonRoot is set but the container would run as user {user or 'root'!r}")
    if uid is not None:
        flags += ["--user", f"{uid}:{sc['runAsGroup']}" if "runAsGroup" in sc else str(uid)]
    if "fsGroup" in psc:
        flags += ["--group-add", str(psc["fsGroup"])]
    if sc.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    caps = sc.get("capabilities") or {}
    flags += [f"--cap-drop={c.lower()}" for c in caps.get("drop") or []]
    flags += [f"--cap-add={c.lower()}" for c in caps.get("add") or []]
    seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        flags += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise Unsupported(f"seccompProfile {seccomp}")
    return flags


def _write_files(dest: Path, data: Mapping[str, str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)
    for key, value in data.items():
        (dest / key).write_text(value)
        (dest / key).chmod(0o644)  # defaultMode of configMap/secret/projected volumes


def _mounts(pod: Mapping[str, Any], container: Mapping[str, Any], ctx: PodContext) -> List[str]:
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    flags: List[str] = []
    for m in container.get("volumeMounts") or []:
        vol = volumes.get(m["name"])
        if vol is None:
            raise Unsupported(f"volumeMount {m['name']} names no volume")
        path, sub = m["mountPath"], m.get("subPath")
        if "emptyDir" in vol:
            if sub:
                raise Unsupported(f"subPath on emptyDir {m['name']}")
            flags += ["--mount", f"type=tmpfs,destination={path},tmpfs-mode=0777"]
            continue
        if "configMap" in vol or "secret" in vol:
            kind, ref = ("configMap", vol["configMap"]["name"]) if "configMap" in vol else ("secret", vol["secret"]["secretName"])
            store = ctx.configmaps if kind == "configMap" else ctx.secrets
            if ref not in store:
                raise Unsupported(f"{kind} {ref} (volume {m['name']}) was not provided")
            src = ctx.workdir / ctx.name / "volumes" / m["name"]
            _write_files(src, store[ref])
            if sub:
                if sub not in store[ref]:
                    raise Unsupported(f"{kind} {ref} has no key {sub}")
                src = src / sub
            flags += ["-v", f"{src}:{path}:ro"]  # Kubernetes mounts both read-only
            continue
        raise Unsupported(f"volume {m['name']} of kind {sorted(set(vol) - {'name'})}")
    if pod.get("automountServiceAccountToken") and ctx.service_account is not None:
        src = ctx.workdir / ctx.name / "serviceaccount"
        _write_files(src, ctx.service_account)
        flags += ["-v", f"{src}:{SA_DIR}:ro"]
    return flags


def pod_args(ctx: PodContext, labels: Sequence[str] = ()) -> List[str]:
    """``podman pod create`` arguments: name and hostname = the pod name, cluster DNS names."""
    flags = ["--name", ctx.name, "--hostname", ctx.name] + [f"--label={label}" for label in labels]
    for host, ip in sorted(ctx.hosts.items()):
        flags += ["--add-host", f"{host}:{ip}"]
    return flags


def container_name(ctx: PodContext, container: Mapping[str, Any]) -> str:
    return f"{ctx.name}-{container['name']}"


def run_args(pod: Mapping[str, Any], container: Mapping[str, Any], ctx: PodContext,
             image_user: str = "") -> List[str]:
    """``podman run`` arguments (after ``podman run``) for one container of a pod spec, in
    the podman pod made with :func:`pod_args`."""
    for what, keys, known in (("pod spec", pod, POD_KEYS), ("container", container, CONTAINER_KEYS)):
        unknown = set(keys) - known
        if unknown:
            raise Unsupported(f"{what} fields {sorted(unknown)}")
    env = _env(container, ctx)
    flags = ["-d", "--pod", ctx.name, "--name", container_name(ctx, container)]
    flags += ["--pull", PULL[container.get("imagePullPolicy", "IfNotPresent")]]
    for key, value in env.items():
        flags += ["-e", f"{key}={value}"]
    flags += _security(pod, container, image_user)
    flags += _mounts(pod, container, ctx)
    mem = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    if mem:
        flags += ["--memory", str(quantity_bytes(mem))]
    flags += ["--stop-timeout", str(pod.get("terminationGracePeriodSeconds", 30))]
    if container.get("command"):
        flags += ["--entrypoint", json.dumps([expand(c, env) for c in container["command"]])]
    return flags + [container["image"]] + [expand(a, env) for a in container.get("args") or []]


@dataclass(frozen=True)
class Probe:
    """What a probe asks: a gRPC health check on ``port``, or ``GET path`` on ``port``."""

    port: int
    path: Optional[str] = None  # None: gRPC


def probe_of(container: Mapping[str, Any], kind: str) -> Optional[Probe]:
    """The ``grpc`` or ``httpGet`` probe ``kind`` (``readinessProbe``, ...), None when there is none."""
    spec = container.get(kind)
    if not spec:
        return None
    if set(spec) & {"tcpSocket", "exec"}:
        raise Unsupported(f"{kind} of kind {sorted(set(spec) & {'tcpSocket', 'exec'})}")
    if "httpGet" in spec:
        http = spec["httpGet"]
        if set(http) - {"path", "port"}:
            raise Unsupported(f"{kind} httpGet fields {sorted(set(http) - {'path', 'port'})}")
        port = http["port"]
        if isinstance(port, str):
            named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
            if port not in named:
                raise Unsupported(f"{kind} httpGet port {port!r} names no container port")
            port = named[port]
        return Probe(int(port), http.get("path", "/"))
    return Probe(int(spec["grpc"]["port"]))


def probe_passes(ip: str, probe: Probe, timeout: float = 2.0) -> bool:
    """One probe as the kubelet makes it."""
    if probe.path is None:
        return probe_ok(ip, probe.port, timeout=timeout)
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{ip}:{probe.port}{probe.path}", timeout=timeout) as r:
            return 200 <= r.status < 400
    except (urllib.error.URLError, OSError):
        return False


def probe_ok(ip: str, port: int, service: str = "", timeout: float = 2.0) -> bool:
    """One gRPC health check, as the kubelet's grpc probe makes it: SERVING or not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"{ip}:{port}") as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                        timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
