"""The autoscaler's one settings object: defaults < YAML file < environment < flags.

Every field is documented below; the loader rejects unknown keys (naming the
file or variable and the key path), converts types strictly and validates
ranges, so a typo stops the process at start with a message instead of
silently scaling on defaults.

Environment variables are ``EDGEWISE_AUTOSCALER_<KEY>`` with ``__`` between
nested keys (``EDGEWISE_AUTOSCALER_KUBERNETES__NAMESPACE=prod``); list values
are comma-separated; values are parsed as YAML scalars.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cloud.autoscaler.scaling import (
    ScalerConfig,
    ScalingRules,
    default_scale_down,
    default_scale_up,
)
from edgewise.config import read_yaml_mapping
from edgewise.errors import ConfigError

ENV_PREFIX = "EDGEWISE_AUTOSCALER_"


@dataclass
class KubeSettings:
    """Which Deployment to scale and how to reach the API server."""

    namespace: str = "default"
    """Namespace of the worker Deployment."""
    deployment: str = "edgewise-worker"
    """Name of the worker Deployment whose ``scale`` subresource is read and patched."""
    api_server: str | None = None
    """Explicit API server URL (out of cluster, or a local test server). Unset: in-cluster
    config when ``KUBERNETES_SERVICE_HOST`` is set, else the kubeconfig."""
    token: str | None = None
    """Bearer token for ``api_server`` (prefer ``token_file`` or the env variable)."""
    token_file: str | None = None
    """File holding the bearer token for ``api_server``."""
    ca_file: str | None = None
    """CA bundle to verify ``api_server``'s certificate."""
    verify_tls: bool = True
    """Verify the API server certificate (only turn off against a local test server)."""
    kubeconfig: str | None = None
    """Kubeconfig path (default: ``$KUBECONFIG`` or ``~/.kube/config``)."""
    context: str | None = None
    """Kubeconfig context (default: current context)."""
    request_timeout_s: float = 10.0
    """Timeout of each API call."""

    def __post_init__(self) -> None:
        for name in ("namespace", "deployment"):
            v = getattr(self, name)
            if not v or not all(c.isalnum() or c in "-." for c in v) or v.lower() != v:
                raise ConfigError(f"{name} {v!r} is not a valid Kubernetes name (lowercase, digits, '-', '.')")
        if self.api_server is not None and not self.api_server.startswith(("http://", "https://")):
            raise ConfigError(f"api_server {self.api_server!r} must start with http:// or https://")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")


@dataclass
class AutoscalerSettings:
    """Everything ``edgewise cloud autoscaler`` needs."""

    gateway_urls: tuple[str, ...] = ()
    """Base URLs of the gateways' side port (``http://gw:9100``); ``/pool`` is appended."""
    resolve_gateways: bool = True
    """Poll every address a gateway host resolves to (a headless Service lists every replica;
    a ClusterIP resolves to one address and hits one replica per poll)."""
    gateway_timeout_s: float = 2.0
    """Timeout of each ``GET /pool``."""
    target_utilization: float | None = None
    """Target Σ in-flight / Σ capacity of the pool. 0.7 when neither target is set."""
    queue_wait_slo_ms: float | None = None
    """Target p90 queue wait in ms. With both targets the larger recommendation wins."""
    min_replicas: int = 1
    """Never fewer workers (>= 1: GPU cold starts take minutes, docs/design/autoscaling.md#cold-starts)."""
    max_replicas: int = 10
    """Never more workers."""
    interval_s: float = 15.0
    """Seconds between decisions (HPA's sync period)."""
    tolerance: float = 0.1
    """No change while |metric/target - 1| <= tolerance (HPA default 0.1)."""
    stale_after_s: float | None = None
    """Metrics older than this are ignored (no change). Default: 3 × interval_s."""
    scale_up: ScalingRules = field(default_factory=default_scale_up)
    """HPA ``behavior.scaleUp``: stabilization window, policies, select policy."""
    scale_down: ScalingRules = field(default_factory=default_scale_down)
    """HPA ``behavior.scaleDown``; default 300 s window, -100 % per 15 s."""
    dry_run: bool = False
    """Print decisions instead of patching the Deployment."""
    metrics_host: str = "0.0.0.0"
    """Address of the Prometheus metrics listener."""
    metrics_port: int | None = 9102
    """Port of the Prometheus metrics listener (0: any free port; null: no listener)."""
    kubernetes: KubeSettings = field(default_factory=KubeSettings)
    """The scale target and API access."""

    def __post_init__(self) -> None:
        for u in self.gateway_urls:
            if not u.startswith(("http://", "https://")):
                raise ConfigError(f"gateway_urls: {u!r} must start with http:// or https://")
        if self.interval_s <= 0 or self.gateway_timeout_s <= 0:
            raise ConfigError("interval_s and gateway_timeout_s must be > 0")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port {self.metrics_port} is outside 0..65535")
        self.scaler_config()  # validates targets, ranges, tolerance

    def scaler_config(self) -> ScalerConfig:
        util = self.target_utilization
        if util is None and self.queue_wait_slo_ms is None:
            util = 0.7
        return ScalerConfig(
            min_replicas=self.min_replicas, max_replicas=self.max_replicas,
            target_utilization=util, queue_wait_slo_ms=self.queue_wait_slo_ms,
            tolerance=self.tolerance,
            stale_after_s=self.stale_after_s if self.stale_after_s is not None else 3 * self.interval_s,
            scale_up=self.scale_up, scale_down=self.scale_down)


# ---- generic strict conversion -------------------------------------------------------------------

def _convert(tp: Any, value: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        return build(tp, value, path)
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        item = args[0]
        items = [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported setting type {tp!r}")  # pragma: no cover


def build(cls: type, data: Any, path: str = "") -> Any:
    """Strictly build dataclass ``cls`` from a mapping; unknown keys are errors."""
    where = path or "settings"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"{where}: unknown key {path + '.' if path else ''}{unknown[0]!s}; "
                          f"allowed keys: {', '.join(names)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        tp, f = hints[k], fields[k]
        if dataclasses.is_dataclass(tp) and isinstance(v, Mapping) and f.default_factory is not dataclasses.MISSING:
            v = merge(dataclasses.asdict(f.default_factory()), v)  # partial section: fill from defaults
        kwargs[k] = _convert(tp, v, f"{path + '.' if path else ''}{k}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}; see cloud/autoscaler/settings.py for the keys") from None


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of nested mappings; ``over`` wins."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def _leaf_paths(cls: type, prefix: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """ENV-name suffix -> key path, for every settable field (nested dataclasses except rules)."""
    out: dict[str, tuple[str, ...]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) and tp in (KubeSettings,):
            out.update(_leaf_paths(tp, prefix + (f.name,)))
        else:
            out["__".join(prefix + (f.name,)).upper()] = prefix + (f.name,)
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Nested overrides from ``EDGEWISE_AUTOSCALER_*``; unknown variables are errors."""
    paths = _leaf_paths(AutoscalerSettings)
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):]
        if key not in paths:
            raise ConfigError(f"environment: unknown variable {name}; known: "
                              f"{', '.join(ENV_PREFIX + k for k in sorted(paths))}")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        if key == "GATEWAY_URLS" and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        node = out
        for part in paths[key][:-1]:
            node = node.setdefault(part, {})
        node[paths[key][-1]] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    data = read_yaml_mapping(p, "autoscaler settings")
    _check_keys(AutoscalerSettings, data, f"{p}", "")
    return data


def _check_keys(cls: type, data: Any, where: str, path: str) -> None:
    """Unknown keys anywhere in a file are reported with the file and key path."""
    if not isinstance(data, Mapping):
        return
    hints = typing.get_type_hints(cls)
    for k, v in data.items():
        key = f"{path}.{k}" if path else str(k)
        if k not in hints:
            raise ConfigError(f"{where}: unknown key {key}; allowed here: {', '.join(hints)}")
        tp = hints[k]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            _check_keys(tp, v, where, key)
        elif typing.get_origin(tp) is tuple and isinstance(v, list):
            item = typing.get_args(tp)[0]
            if dataclasses.is_dataclass(item) and isinstance(item, type):
                for i, x in enumerate(v):
                    _check_keys(item, x, where, f"{key}[{i}]")


def load_settings(
    config_file: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> AutoscalerSettings:
    """Defaults < YAML < environment < flags (``flags`` is a nested dict of set options)."""
    data: dict[str, Any] = read_yaml(config_file) if config_file else {}
    data = merge(data, env_overrides(os.environ if environ is None else environ))
    data = merge(data, flags or {})
    try:
        settings: AutoscalerSettings = build(AutoscalerSettings, data)
    except ConfigError as exc:
        src = f"{config_file} + " if config_file else ""
        raise ConfigError(f"autoscaler settings ({src}environment + flags): {exc}") from None
    if not settings.gateway_urls:
        raise ConfigError("no gateway to poll: pass --gateway-url http://GATEWAY:9100 "
                          "(or gateway_urls in the config file, or EDGEWISE_AUTOSCALER_GATEWAY_URLS)")
    if settings.kubernetes.token_file and settings.kubernetes.token is None:
        try:
            token = Path(settings.kubernetes.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"kubernetes.token_file {settings.kubernetes.token_file}: "
                              f"cannot read it ({exc.strerror})") from None
        settings.kubernetes.token = token
    return settings
