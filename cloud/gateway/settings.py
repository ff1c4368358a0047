"""Gateway settings: one nested dataclass tree built from YAML, then env, then flags.

Precedence: defaults < YAML file (``--config``) < environment
(``EDGEWISE_GATEWAY__SECTION__KEY=value``) < command-line flags (``--set
section.key=value`` and the named shortcuts). Unknown keys are rejected with the
file and key path; every value is type-checked and range-checked in
``validate()`` so a bad file fails at start, not at the first request.
See ``cloud/gateway/gateway.example.yaml`` for a documented example.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cloud.gateway.balancing import BalancerConfig
from edgewise.config import read_yaml_mapping
from edgewise.errors import ConfigError

ENV_PREFIX = "EDGEWISE_GATEWAY__"


@dataclass
class TlsSettings:
    """Server TLS. Empty cert_file = plaintext (only for local runs / inside a mesh)."""

    cert_file: str = ""          # PEM server certificate chain
    key_file: str = ""           # PEM private key
    client_ca_file: str = ""     # PEM CA bundle that signs client certificates (mTLS)
    require_client_cert: bool = False  # mTLS: reject clients without a valid certificate


@dataclass
class DeviceToken:
    """One device allowed to call the gateway, with its bearer token."""

    device: str = ""
    token: str = ""


@dataclass
class AuthSettings:
    """Per-device bearer tokens. No tokens = authentication off (log says so)."""

    tokens: list[DeviceToken] = field(default_factory=list)
    #: YAML file holding a list of {device, token}; merged with ``tokens``
    tokens_file: str = ""


@dataclass
class LimitSettings:
    """Input limits, deadlines and per-device rate limits."""

    max_message_bytes: int = 8 * 1024 * 1024    # gRPC receive/send limit, both hops
    max_image_bytes: int = 6 * 1024 * 1024      # encoded image payload
    max_image_pixels: int = 4096 * 4096         # RAW images: height × width
    max_id_length: int = 128                    # device_id / stream_id / trace_id
    max_edge_detections: int = 1000
    default_deadline_s: float = 5.0             # when neither the call nor the request sets one
    max_deadline_s: float = 60.0
    rate_per_device: float = 0.0                # requests/s per device; 0 = unlimited
    burst_per_device: float = 20.0              # token-bucket depth
    max_stream_in_flight: int = 64              # concurrent frames per DetectStream


@dataclass
class RetrySettings:
    """One retry on another worker for UNAVAILABLE, bounded by a budget (docs/design/balancing.md#retries-and-the-retry-budget)."""

    enabled: bool = True
    budget_ratio: float = 0.2       # retries ≤ 20% of requests over the window
    min_per_s: float = 3.0          # …but always allow this many retries per second
    window_s: float = 10.0
    min_attempt_ms: float = 5.0     # don't retry with less time than this left


@dataclass
class DiscoverySettings:
    """Where the workers come from."""

    kind: str = "static"                 # static | dns | kubernetes
    #: static: "host:port" or "host:port=weight"
    static: list[str] = field(default_factory=list)
    #: dns / kubernetes: options passed to cloud.discovery.dns / .kubernetes
    dns: dict[str, Any] = field(default_factory=dict)
    kubernetes: dict[str, Any] = field(default_factory=dict)


@dataclass
class MqttSettings:
    """MQTT v5 bridge: shared subscription to edgewise/+/escalate."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 1883
    group: str = "edgewise-gateway"      # shared-subscription group: replicas split the load
    topic_prefix: str = "edgewise"
    client_id: str = ""                  # default: gateway-<hostname>-<pid>
    username: str = ""
    password: str = ""
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    keepalive_s: int = 30
    max_in_flight: int = 64              # concurrent requests from MQTT
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0


@dataclass
class GatewaySettings:
    """Everything one gateway process needs."""

    listen: str = "0.0.0.0:50051"
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9100             # /metrics, /pool, /healthz; -1 = off, 0 = any free port
    load_poll_interval_s: float = 1.0    # Worker.Load polling
    shutdown_grace_s: float = 10.0
    tls: TlsSettings = field(default_factory=TlsSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    retry: RetrySettings = field(default_factory=RetrySettings)
    discovery: DiscoverySettings = field(default_factory=DiscoverySettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)

    def validate(self) -> None:
        """Raise ConfigError naming the bad key."""
        if ":" not in self.listen:
            raise ConfigError(f"listen: {self.listen!r} is not host:port (example 0.0.0.0:50051)")
        try:
            self.balancer.validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        checks = [
            ("load_poll_interval_s", self.load_poll_interval_s > 0),
            ("shutdown_grace_s", self.shutdown_grace_s >= 0),
            ("metrics_port", -1 <= self.metrics_port <= 65535),
            ("limits.max_message_bytes", self.limits.max_message_bytes >= 1024),
            ("limits.max_image_bytes", 0 < self.limits.max_image_bytes <= self.limits.max_message_bytes),
            ("limits.max_id_length", self.limits.max_id_length >= 1),
            ("limits.default_deadline_s", 0 < self.limits.default_deadline_s <= self.limits.max_deadline_s),
            ("limits.rate_per_device", self.limits.rate_per_device >= 0),
            ("limits.burst_per_device", self.limits.burst_per_device >= 1),
            ("limits.max_stream_in_flight", self.limits.max_stream_in_flight >= 1),
            ("retry.budget_ratio", 0 <= self.retry.budget_ratio <= 1),
            ("retry.window_s", self.retry.window_s > 0),
            ("mqtt.port", 1 <= self.mqtt.port <= 65535),
            ("mqtt.max_in_flight", self.mqtt.max_in_flight >= 1),
        ]
        for key, ok in checks:
            if not ok:
                raise ConfigError(f"{key}: value {_get(self, key)!r} is out of range")
        if self.discovery.kind not in ("static", "dns", "kubernetes"):
            raise ConfigError(f"discovery.kind: {self.discovery.kind!r} is not static, dns or kubernetes")
        if self.discovery.kind == "static" and not self.discovery.static:
            raise ConfigError("discovery.static: list at least one worker 'host:port[=weight]' "
                              "(or use --worker)")
        if bool(self.tls.cert_file) != bool(self.tls.key_file):
            raise ConfigError("tls: set both cert_file and key_file, or neither")
        if self.tls.require_client_cert and not self.tls.client_ca_file:
            raise ConfigError("tls.require_client_cert: needs tls.client_ca_file")
        for i, t in enumerate(self.auth.tokens):
            if not t.device or not t.token:
                raise ConfigError(f"auth.tokens[{i}]: both device and token must be non-empty")
        if self.mqtt.enabled and not self.mqtt.group.strip():
            raise ConfigError("mqtt.group: must be non-empty")

    def device_tokens(self) -> dict[str, str]:
        """device → token, from ``auth.tokens`` and ``auth.tokens_file``."""
        out = {t.device: t.token for t in self.auth.tokens}
        if self.auth.tokens_file:
            where = self.auth.tokens_file
            try:
                data = yaml.safe_load(Path(where).read_text()) or []
            except (OSError, yaml.YAMLError) as exc:
                raise ConfigError(f"auth.tokens_file {where}: cannot read: {exc}") from None
            if not isinstance(data, list):
                raise ConfigError(f"auth.tokens_file {where}: expected a list of {{device, token}}")
            for i, item in enumerate(data):
                tok = _build(DeviceToken, item, f"{where}: [{i}]")
                if not tok.device or not tok.token:
                    raise ConfigError(f"{where}: [{i}]: device and token must be non-empty")
                out[tok.device] = tok.token
        return out


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Check/convert one value to the annotated type, naming ``where`` on error."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value) if not isinstance(value, float) or value.is_integer() else _bad(where, value, "an integer")
        except (TypeError, ValueError):
            return _bad(where, value, "an integer")
    if tp is float:
        if isinstance(value, bool):
            return _bad(where, value, "a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            return _bad(where, value, "a number")
    if tp is str:
        if isinstance(value, (dict, list)):
            return _bad(where, value, "a string")
        return str(value)
    return value


def _bad(where: str, value: Any, what: str) -> Any:
    raise ConfigError(f"{where}: expected {what}, got {value!r}")


def _build(cls: Any, data: Any, where: str) -> Any:
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{_join(where, key)}: unknown key; allowed: {', '.join(sorted(names))}")
        kwargs[key] = _coerce(hints[key], value, _join(where, key))
    return cls(**kwargs)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where and not where.endswith(": ") else f"{where}{key}"


def _set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    if not parts:
        raise ConfigError(f"override {path!r}: empty key path")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {path!r}: {p} is not a section")
    node[parts[-1]] = value


def load_settings(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Build validated settings from a YAML file, the environment and key-path overrides.

    ``overrides`` maps dotted key paths ("balancer.mode") to values (YAML-parsed
    when they are strings, so "3" is an int and "[a, b]" a list).
    """
    tree: dict[str, Any] = {}
    source = "settings"
    if path:
        source = str(path)
        tree = read_yaml_mapping(path, "gateway settings")
    env = os.environ if env is None else env
    for key, value in sorted(env.items()):
        if key.startswith(ENV_PREFIX):
            _set_path(tree, key[len(ENV_PREFIX):].lower().replace("__", "."), _yaml_scalar(value))
    for key, value in (overrides or {}).items():
        _set_path(tree, key, _yaml_scalar(value) if isinstance(value, str) else value)
    try:
        settings = _build(GatewaySettings, tree, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        settings.validate()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return settings


def _yaml_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
