"""Running rendered chart pods on this machine, for the parts a test needs (no cluster runs here).

``SimCluster`` keeps the Secrets an operator creates with ``kubectl create secret ...``
(run for real, as a client-side dry run), mounts them into a pod's files the way the
kubelet does (each key a file under the volume's mountPath), and runs the gateway
(``LocalCloud`` with the rendered ``gateway.yaml``: TLS, tokens, limits) and the
``helm test`` pod's probe (its rendered args and env) as local processes. A path the
rendered pod names that no mounted Secret provides fails the test with its name.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence

import yaml

from tests.charts.helm import helm_test_pod, named, tool

#: gateway.yaml keys the chart sets for a cluster; LocalCloud sets its own (static discovery, ports),
#: and has no Service to wait for at a stop (``shutdown_delay_s``: its gateway stops at once).
_CLUSTER_KEYS = ("listen", "metrics_host", "metrics_port", "discovery", "mqtt", "shutdown_delay_s")


class SimCluster:
    def __init__(self, workdir: Path, namespace: str) -> None:
        self.dir = workdir
        self.namespace = namespace
        self.secrets: Dict[str, Dict[str, bytes]] = {}

    # ---- Secrets ------------------------------------------------------------------------
    def kubectl(self, argv: Sequence[str]) -> None:
        """Run ``kubectl <argv>`` as a client-side dry run in the work dir and keep the Secret
        it would create (``create secret ...``); other commands must at least parse."""
        args = [a for a in argv if a not in ("--dry-run=client",)]
        if list(args[:2]) == ["create", "secret"] or (len(args) > 3 and list(args[2:4]) == ["create", "secret"]):
            out = subprocess.run([tool("kubectl"), *args, "--dry-run=client", "-o", "yaml"], cwd=self.dir,
                                 capture_output=True, text=True)
            assert out.returncode == 0, f"kubectl {' '.join(argv)}: {out.stderr}"
            doc = yaml.safe_load(out.stdout)
            assert doc["metadata"].get("namespace", self.namespace) == self.namespace, doc["metadata"]
            data = {k: base64.b64decode(v) for k, v in (doc.get("data") or {}).items()}
            data.update({k: v.encode() for k, v in (doc.get("stringData") or {}).items()})
            self.secrets[doc["metadata"]["name"]] = data
            return
        # anything else needs a cluster: check that kubectl accepts the flags (it fails to connect)
        out = subprocess.run([tool("kubectl"), *args, "--server=http://127.0.0.1:9", "--request-timeout=1s"],
                             cwd=self.dir, capture_output=True, text=True)
        assert "unknown flag" not in out.stderr and "unknown command" not in out.stderr, out.stderr

    def secret_file(self, name: str, key: str) -> bytes:
        assert name in self.secrets, f"the pod mounts Secret {name!r}, which no kubectl command created"
        assert key in self.secrets[name], f"Secret {name!r} has no key {key!r} (it has {sorted(self.secrets[name])})"
        return self.secrets[name][key]

    # ---- pods ---------------------------------------------------------------------------
    def mount(self, pod: str, spec: Mapping[str, Any], container: Mapping[str, Any]) -> Dict[str, Path]:
        """The container's Secret volumes as local directories: mountPath -> directory."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        out: Dict[str, Path] = {}
        for m in container.get("volumeMounts", []):
            vol = volumes[m["name"]]
            if "secret" not in vol:
                continue
            name = vol["secret"]["secretName"]
            assert name in self.secrets, f"{pod} mounts Secret {name!r}, which no kubectl command created"
            d = self.dir / "pods" / pod / m["mountPath"].lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            for key, data in self.secrets[name].items():
                (d / key).write_bytes(data)
            out[m["mountPath"]] = d
        return out

    @staticmethod
    def local(mounts: Mapping[str, Path], path: str, what: str) -> str:
        """The local file of a path inside the pod; fails unless a mounted Secret provides it."""
        for mount_path, d in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if path.startswith(mount_path.rstrip("/") + "/"):
                local = d / path[len(mount_path.rstrip("/")) + 1:]
                assert local.is_file(), f"{what} {path}: no key {local.name!r} in the Secret mounted at {mount_path}"
                return str(local)
        raise AssertionError(f"{what} {path}: no Secret is mounted there (mounts: {sorted(mounts)})")

    def gateway_settings(self, docs: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The rendered gateway.yaml as LocalCloud settings, its file paths made local."""
        dep = named(docs, "Deployment", "-gateway")
        spec = dep["spec"]["template"]["spec"]
        mounts = self.mount("gateway", spec, spec["containers"][0])
        cfg = yaml.safe_load(named(docs, "ConfigMap", "-gateway")["data"]["gateway.yaml"])
        flat: Dict[str, Any] = {}

        def walk(node: Dict[str, Any], prefix: str) -> None:
            for k, v in node.items():
                key = f"{prefix}{k}"
                if not prefix and k in _CLUSTER_KEYS:
                    continue
                if isinstance(v, dict):
                    walk(v, key + ".")
                    continue
                flat[key] = self.local(mounts, str(v), f"gateway.yaml {key}") if key.endswith("_file") and v else v

        walk(cfg, "")
        return flat

    def run_helm_test(self, docs: List[Dict[str, Any]], address: str, env: Mapping[str, str] | None = None,
                      timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the ``helm test`` pod's command against the gateway at ``address`` (host:port).

        The pod reaches the gateway by its Service name; here it connects to ``address``
        and, as DNS would leave it, checks the certificate for that Service name (unless
        the pod names another with --tls-server-name)."""
        pod = helm_test_pod(docs)
        spec = pod["spec"]
        container = spec["containers"][0]
        mounts = self.mount("test", spec, container)
        args: List[str] = []
        service_host = ""
        for a in container["args"]:
            flag, _, value = a.partition("=")
            if flag == "--target":
                service_host = value.rsplit(":", 1)[0]
                a = f"--target={address}"
            elif flag in ("--tls-ca", "--tls-cert", "--tls-key"):
                a = f"{flag}={self.local(mounts, value, flag)}"
            args.append(a)
        secure = any(a.startswith("--tls") for a in args)
        if secure and not any(a.startswith("--tls-server-name") for a in args):
            args.append(f"--tls-server-name={service_host}")
        full = dict(os.environ, **(env or {}))
        for e in container.get("env", []):
            ref = e["valueFrom"]["secretKeyRef"]
            full[e["name"]] = self.secret_file(ref["name"], ref["key"]).decode()
        return subprocess.run([sys.executable, "-m", "edgewise.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=full)
