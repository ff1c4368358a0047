"""The autoscaler's one settings object: the dataclasses, their cross-field rules, the flags.

Loaded by the shared mechanism of :mod:`edgewise.settings`: defaults < YAML file
(``--config``) < environment ``EDGEWISE_AUTOSCALER__KEY`` (``__`` between nested
keys: ``EDGEWISE_AUTOSCALER__KUBERNETES__NAMESPACE=prod``; lists comma-separated)
< ``--set`` < the named flags below. A typo stops the process at start with a
message instead of silently scaling on defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cloud.autoscaler.scaling import (
    DEFAULT_TARGET_LOAD,
    ScalerConfig,
    ScalingRules,
    default_scale_down,
    default_scale_up,
)
from cloud.discovery.kubeclient import read_token_file
from edgewise.errors import ConfigError
from edgewise.settings import Flag, Invalid, Schema, setting

HTTP = ("http://", "https://")
#: the most workers, the largest target ratios and queue-wait target the settings take: the
#: Helm chart's bounds (charts/edgewise/values.schema.json, autoscaling.*; tests/charts hold
#: them equal). Unbounded, `--max 99999999999999` was taken and every patch of the scale was
#: refused by the API server (replicas is an int32), and `--target-load 1e300` scaled nothing
MAX_REPLICAS = 10000
MAX_TARGET_RATIO = 10.0
MAX_QUEUE_WAIT_SLO_MS = 600000.0


@dataclass
class KubeSettings:
    """Which Deployment to scale and how to reach the API server."""

    namespace: str = setting("Namespace of the worker Deployment.", "default")
    deployment: str = setting("Name of the worker Deployment whose `scale` subresource is read and patched.",
                              "edgewise-worker")
    api_server: str | None = setting("Explicit API server URL (out of cluster, or a local test server). Unset: "
                                     "in-cluster config when `KUBERNETES_SERVICE_HOST` is set, else the "
                                     "kubeconfig.", None)
    token: str | None = setting("Bearer token for `api_server` (prefer `token_file` or the environment "
                                "variable).", None, secret=True)
    token_file: str | None = setting("File holding the bearer token for `api_server`.", None)
    ca_file: str | None = setting("CA bundle to verify `api_server`'s certificate.", None)
    verify_tls: bool = setting("Verify the API server certificate (only turn off against a local test "
                               "server).", True)
    kubeconfig: str | None = setting("Kubeconfig path (default: `$KUBECONFIG` or `~/.kube/config`).", None)
    context: str | None = setting("Kubeconfig context (default: current context).", None)
    request_timeout_s: float = setting("Time budget of each API call (read or patch of the scale), seconds: one "
                                       "attempt, no retries inside it (the next tick tries again), so a hung API "
                                       "server holds a tick, or a SIGTERM, at most this long.", 10.0, lo=0,
                                       lo_open=True, hi=600)


@dataclass
class AutoscalerSettings:
    """Everything ``edgewise cloud autoscaler`` needs."""

    gateway_urls: tuple[str, ...] = setting("Base URLs of the gateways' side port (`http://gw:9100`); `/pool` "
                                            "is appended.", ())
    resolve_gateways: bool = setting("Poll every address a gateway host resolves to (a headless Service lists "
                                     "every replica; a ClusterIP resolves to one address and hits one replica "
                                     "per poll).", True)
    gateway_timeout_s: float = setting("Timeout of each `GET /pool`, seconds.", 2.0, lo=0, lo_open=True, hi=600)
    target_load: float | None = setting(
        "Target requests/s offered to the gateways / sum of the ready workers' peak capacity (images/s at "
        f"their best batch size). {DEFAULT_TARGET_LOAD} when no target is set (bench/fleet.py's tuned value).",
        None, lo=0, lo_open=True, hi=MAX_TARGET_RATIO)
    target_utilization: float | None = setting("Target sum of in-flight / sum of capacity of the pool "
                                               "(seconds of queued work per worker).", None, lo=0, lo_open=True,
                                               hi=MAX_TARGET_RATIO)
    queue_wait_slo_ms: float | None = setting("Target p90 queue wait in ms. With both targets the larger "
                                              "recommendation wins.", None, lo=0, lo_open=True,
                                              hi=MAX_QUEUE_WAIT_SLO_MS)
    #: >= 1 because GPU cold starts take minutes (docs/design/autoscaling.md#cold-starts)
    min_replicas: int = setting("Never fewer workers (>= 1: GPU cold starts take minutes).", 1, lo=1,
                                hi=MAX_REPLICAS)
    max_replicas: int = setting("Never more workers (at least `min_replicas`).", 10, lo=1, hi=MAX_REPLICAS)
    interval_s: float = setting("Seconds between decisions (HPA's sync period; 0.1 s to 1 h).", 15.0, lo=0.1, hi=3600)
    tolerance: float = setting("No change while |metric/target - 1| <= tolerance (HPA default 0.1).", 0.1,
                               lo=0, hi=1, hi_open=True)
    stale_after_s: float | None = setting("Metrics older than this when the decision is made are ignored (no "
                                          "change), seconds; their age counts from asking the gateways, so a slow "
                                          "poll or a slow read of the Deployment's scale ages them. Default: "
                                          "3 x interval_s.", None, lo=0, lo_open=True)
    scale_up: ScalingRules = setting("HPA `behavior.scaleUp`: stabilization window, policies, select policy "
                                     "(default: no window, max of +100 % and +4 pods per 15 s).",
                                     factory=default_scale_up)
    scale_down: ScalingRules = setting("HPA `behavior.scaleDown` (default: 300 s window, -100 % per 15 s).",
                                       factory=default_scale_down)
    dry_run: bool = setting("Print decisions instead of patching the Deployment.", False)
    metrics_host: str = setting("Address of the Prometheus metrics listener (`::`: every IPv6 and IPv4 address).", "0.0.0.0")
    metrics_port: int | None = setting("Port of the Prometheus metrics listener and of `/healthz` (503 once the "
                                       "loop has not finished a tick for twice its longest; the chart's liveness "
                                       "probe) (0: any free port; -1, as for the other processes, or null: no "
                                       "listener).", 9102, lo=-1, hi=65535)
    kubernetes: KubeSettings = setting("The scale target and API access.", factory=KubeSettings)

    def metrics_listen_port(self) -> int | None:
        """The metrics listener's port, or None for none (``metrics_port`` -1 or null)."""
        return None if self.metrics_port is None or self.metrics_port < 0 else self.metrics_port

    def scaler_config(self) -> ScalerConfig:
        load = self.target_load
        if load is None and self.target_utilization is None and self.queue_wait_slo_ms is None:
            load = DEFAULT_TARGET_LOAD
        return ScalerConfig(
            min_replicas=self.min_replicas, max_replicas=self.max_replicas, target_load=load,
            target_utilization=self.target_utilization, queue_wait_slo_ms=self.queue_wait_slo_ms,
            tolerance=self.tolerance,
            stale_after_s=self.stale_after_s if self.stale_after_s is not None else 3 * self.interval_s,
            scale_up=self.scale_up, scale_down=self.scale_down)


def _k8s_name(value: str) -> bool:
    return bool(value) and value.lower() == value and all(c.isalnum() or c in "-." for c in value)


def _url_problem(url: str) -> str:
    """What keeps ``url`` from being a gateway's side-port URL ("" when nothing)."""
    if not url.startswith(HTTP):
        return "must start with http:// or https://"
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError: not a number, or out of 0..65535
        host = parts.hostname or ""
        if host and not host.startswith("[") and ":" not in host:
            host.encode("idna")  # UnicodeError: a label longer than 63 characters, ...
    except ValueError as exc:  # UnicodeError is one
        return f"is not a URL ({exc})"
    if not host or any(c.isspace() for c in url):
        return "names no host"
    if port == 0:
        return "has port 0"
    return ""


def validate(s: AutoscalerSettings) -> None:
    """The rules that span fields or need more than a range; raises :class:`Invalid`."""
    if not s.gateway_urls:
        raise Invalid("gateway_urls", "no gateway to poll: pass --gateway-url http://GATEWAY:9100 (or "
                                      "gateway_urls in the config file, or EDGEWISE_AUTOSCALER__GATEWAY_URLS)")
    for i, url in enumerate(s.gateway_urls):
        problem = _url_problem(url)
        if problem:
            raise Invalid(f"gateway_urls[{i}]", f"{url!r} {problem} (example: http://gateway:9100)")
    if s.max_replicas < s.min_replicas:
        raise Invalid("max_replicas", f"need min_replicas <= max_replicas, got min={s.min_replicas} "
                                      f"max={s.max_replicas}", also=("min_replicas",))
    k = s.kubernetes
    for name in ("namespace", "deployment"):
        if not _k8s_name(getattr(k, name)):
            raise Invalid(f"kubernetes.{name}", f"{getattr(k, name)!r} is not a valid Kubernetes name "
                                                "(lowercase, digits, '-', '.')")
    if k.api_server is not None and not k.api_server.startswith(HTTP):
        raise Invalid("kubernetes.api_server", f"{k.api_server!r} must start with http:// or https://")


SCHEMA: Schema[AutoscalerSettings] = Schema(
    "autoscaler", AutoscalerSettings, command="edgewise cloud autoscaler", validate=validate,
    flags=(
        Flag("--gateway-url", "gateway_urls", repeat=True, metavar="URL",
             help="gateway side-port base URL, e.g. http://gw:9100 (repeatable)"),
        Flag("--namespace", "kubernetes.namespace"),
        Flag("--deployment", "kubernetes.deployment"),
        Flag("--target-load", "target_load", metavar="RATIO"),
        Flag("--target-utilization", "target_utilization", metavar="RATIO"),
        Flag("--queue-wait-slo-ms", "queue_wait_slo_ms", metavar="MS"),
        Flag("--min", "min_replicas", metavar="N"),
        Flag("--max", "max_replicas", metavar="N"),
        Flag("--interval", "interval_s", metavar="SECONDS"),
        Flag("--tolerance", "tolerance", metavar="RATIO"),
        Flag("--scale-down-stabilization", "scale_down.stabilization_window_s", metavar="SECONDS"),
        Flag("--dry-run", "dry_run", switch=True),
        Flag("--metrics-port", "metrics_port", metavar="PORT"),
        Flag("--metrics-host", "metrics_host", metavar="HOST"),
        Flag("--api-server", "kubernetes.api_server", metavar="URL"),
        Flag("--token-file", "kubernetes.token_file", metavar="FILE"),
        Flag("--kubeconfig", "kubernetes.kubeconfig", metavar="FILE"),
        Flag("--context", "kubernetes.context"),
    ),
)


def load_settings(config_file: str | Path | None = None, overrides: Sequence[str] | Mapping[str, Any] = (),
                  environ: Mapping[str, str] | None = None) -> AutoscalerSettings:
    """Validated settings (see the module docstring); reads ``kubernetes.token_file`` when no
    token is given."""
    settings = SCHEMA.load(config_file, overrides, environ)
    return with_token(settings)


def with_token(settings: AutoscalerSettings) -> AutoscalerSettings:
    """``settings`` with ``kubernetes.token`` read from ``kubernetes.token_file`` when unset."""
    k = settings.kubernetes
    if k.token_file and k.token is None:
        try:
            k.token = read_token_file(k.token_file)
        except ConfigError as exc:
            raise ConfigError(f"kubernetes.token_file {k.token_file}: cannot read it ({exc})") from None
    return settings
