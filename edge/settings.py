"""Settings of the edge daemon: one root object of nested, documented dataclasses.

Built from defaults ← YAML file ← environment (``EDGEWISE_EDGE_<PATH>``, ``__``
between levels, e.g. ``EDGEWISE_EDGE_CLOUD__TOKEN``) ← command-line overrides
(``--set cloud.token=...``), validated at load. Unknown keys are rejected with a
message naming the file and the key path (kopf's ``configuration.py`` layering,
hypercorn's sentinel merge; see docs/design/conventions.md#settings). Callers:
``edge.daemon`` (the process) and ``edge.cli`` (``edgewise edge run``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from edgewise.config import read_yaml_mapping
from edgewise.errors import ConfigError

SOURCE_KINDS = ("file", "folder", "rtsp", "http", "camera", "gstreamer", "synthetic")
LIVE_KINDS = ("rtsp", "http", "camera", "gstreamer")
DROP_POLICIES = ("drop_oldest", "wait")
TRANSPORTS = ("grpc", "mqtt")
ENV_PREFIX = "EDGEWISE_EDGE_"


@dataclass
class StreamSettings:
    """One frame source."""

    id: str = ""
    """Stream id, unique in the daemon; part of every idempotency key."""
    kind: str = "synthetic"
    """One of file | folder | rtsp | http | camera | gstreamer | synthetic."""
    uri: str = ""
    """file: video path; folder: directory of images; rtsp/http: URL; camera: device
    index (``0``) or path (``/dev/video0``); gstreamer: a pipeline string ending in
    ``appsink``; synthetic: empty or ``WxH`` (e.g. ``640x480``) for the built-in
    pattern, or ``digits[:DIFFICULTY[:WxH]]`` for ``edgewise.synth`` camera scenes
    (DIFFICULTY: easy | medium | hard | reference | episodes, or a difficulty YAML/JSON file)."""
    loop: bool = False
    """file/folder/synthetic: start again at the end instead of ending the stream."""
    fps: float = 0.0
    """Frame-rate cap in frames/s; 0 = as fast as the source and pipeline allow."""
    queue_size: int = 0
    """Frames buffered between capture and inference; 0 = per-kind default
    (live: 2, file/folder/synthetic: 8)."""
    drop_policy: str = ""
    """What capture does when the queue is full: ``drop_oldest`` (discard the oldest
    queued frame; counted) or ``wait`` (block capture). Empty = per-kind default
    (live kinds: drop_oldest; file/folder/synthetic: wait)."""
    max_frames: int = 0
    """Stop the stream after this many frames (0 = no limit); for tests and benchmarks."""
    reconnect_min_s: float = 0.5
    """First reconnect delay of a live stream, seconds (doubles up to ``reconnect_max_s``)."""
    reconnect_max_s: float = 30.0
    """Largest reconnect delay, seconds."""

    def resolved_queue_size(self) -> int:
        return self.queue_size or (2 if self.kind in LIVE_KINDS else 8)

    def resolved_drop_policy(self) -> str:
        return self.drop_policy or ("drop_oldest" if self.kind in LIVE_KINDS else "wait")


@dataclass
class ModelSettings:
    """The edge detector."""

    path: str = "models/yolov5s-int8.onnx"
    """YOLOv5 ONNX (Ultralytics export layout) or TensorRT engine file."""
    backend: str = "auto"
    """Runtime backend: auto (TensorRT when usable, else ONNX Runtime) | onnxruntime | tensorrt."""
    conf_thres: float = 0.25
    """Minimum final score of a kept box."""
    iou_thres: float = 0.45
    """NMS IoU threshold."""
    max_det: int = 300
    """Most boxes kept per frame."""
    threads: int = 0
    """Intra-op threads of the runtime; 0 = runtime default."""
    max_batch: int = 4
    """Most frames (from all streams) run in one inference call."""


@dataclass
class MqttSettings:
    """The MQTT broker used by the MQTT transport and the MQTT sink."""

    host: str = ""
    """Broker host; empty = MQTT disabled."""
    port: int = 1883
    """Broker port."""
    tls: bool = False
    """Use TLS (with ``cloud.tls_ca`` / ``tls_cert`` / ``tls_key`` when set)."""
    username: str = ""
    """Username (optional)."""
    password: str = ""
    """Password (optional; prefer the env var EDGEWISE_EDGE_CLOUD__MQTT__PASSWORD)."""
    keepalive_s: int = 30
    """MQTT keepalive, seconds."""
    topic_prefix: str = "edgewise"
    """Topics are ``<prefix>/<device>/escalate|response/<client>|detections``."""


@dataclass
class CloudSettings:
    """How to reach the cloud tier."""

    endpoints: List[str] = field(default_factory=list)
    """gRPC gateway addresses ``host:port``, tried in order (fail-over on UNAVAILABLE)."""
    transport: str = "grpc"
    """Default transport when the policy does not choose one: grpc | mqtt."""
    tls_ca: str = ""
    """PEM CA bundle; set to use TLS for gRPC (and MQTT when ``mqtt.tls``)."""
    tls_cert: str = ""
    """PEM client certificate for mutual TLS (with ``tls_key``)."""
    tls_key: str = ""
    """PEM client key for mutual TLS."""
    token: str = ""
    """Bearer token sent as ``authorization`` metadata (prefer the env var
    EDGEWISE_EDGE_CLOUD__TOKEN)."""
    keepalive_s: float = 20.0
    """gRPC keepalive ping interval, seconds."""
    max_in_flight: int = 16
    """Most escalations waiting for the cloud at once; more are spooled/dropped per policy."""
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    """MQTT broker settings."""


@dataclass
class SpoolSettings:
    """Durable on-disk queue of escalations that could not be delivered."""

    path: str = "/var/lib/edgewise/spool.db"
    """SQLite file of the spool."""
    max_bytes: int = 256 * 1024 * 1024
    """Byte cap of the spooled payloads; beyond it new entries are refused and counted."""
    max_age_s: float = 24 * 3600.0
    """Entries older than this are expired (counted, logged)."""
    replay_interval_s: float = 2.0
    """How often the replay task tries the cloud while the spool is non-empty, seconds."""
    replay_batch: int = 8
    """Entries taken from the spool per replay round."""


@dataclass
class SinkSettings:
    """Where per-frame records go."""

    jsonl: str = ""
    """JSON Lines file (appended); empty = off."""
    mqtt: bool = False
    """Publish each record to ``<prefix>/<device>/detections`` (needs ``cloud.mqtt.host``)."""
    stdout: bool = False
    """Print each record as one JSON line on stdout."""
    fsync: bool = False
    """fsync the JSON Lines file after each record (slower; survives power loss)."""
    mqtt_outbox: str = ""
    """SQLite file where the MQTT sink keeps each record until the broker acknowledged it
    (survives broker outages and daemon restarts); empty = ``mqtt-outbox.db`` next to
    ``spool.path``."""
    mqtt_outbox_max: int = 50000
    """Most records the MQTT sink keeps while the broker is unreachable (about 1 KB each);
    beyond it the oldest are dropped, counted in ``edgewise_edge_sink_dropped_total``."""


@dataclass
class MetricsSettings:
    """Prometheus ``/metrics`` and ``/healthz`` HTTP endpoint."""

    host: str = "127.0.0.1"
    """Bind address."""
    port: int = 9108
    """Port; 0 = pick a free one (logged); -1 = off."""


@dataclass
class EdgeSettings:
    """Root settings of one edge daemon process."""

    device_id: str = "edge-0"
    """Device id, part of every idempotency key and MQTT topic."""
    streams: List[StreamSettings] = field(default_factory=list)
    """Frame sources (at least one)."""
    model: ModelSettings = field(default_factory=ModelSettings)
    """The edge detector."""
    policy_file: str = ""
    """Escalation policy YAML (``kind: EscalationPolicy``); empty = never escalate."""
    policy_poll_s: float = 1.0
    """How often the policy file is checked for changes, seconds (SIGHUP also reloads)."""
    cloud: CloudSettings = field(default_factory=CloudSettings)
    """How to reach the cloud tier."""
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    """Durable spool."""
    sinks: SinkSettings = field(default_factory=SinkSettings)
    """Per-frame record sinks."""
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    """Metrics and health endpoint."""
    shutdown_grace_s: float = 5.0
    """On SIGTERM, how long in-flight escalations may finish before they are spooled."""

    def validate(self, where: str = "settings") -> None:
        """Raise ConfigError naming the first invalid field."""
        if not self.device_id or "/" in self.device_id or "+" in self.device_id or "#" in self.device_id:
            _fail(where, "device_id", f"must be non-empty without '/', '+', '#', got {self.device_id!r}")
        if not self.streams:
            _fail(where, "streams", "needs at least one stream")
        seen = set()
        for i, s in enumerate(self.streams):
            p = f"streams[{i}]"
            if not s.id:
                _fail(where, f"{p}.id", "is required")
            if s.id in seen:
                _fail(where, f"{p}.id", f"duplicate stream id {s.id!r}")
            seen.add(s.id)
            if s.kind not in SOURCE_KINDS:
                _fail(where, f"{p}.kind", f"must be one of {', '.join(SOURCE_KINDS)}, got {s.kind!r}")
            if s.kind != "synthetic" and not s.uri:
                _fail(where, f"{p}.uri", f"is required for kind {s.kind!r}")
            if s.kind == "synthetic":
                _check_synthetic_uri(where, f"{p}.uri", s.uri)
            if s.drop_policy and s.drop_policy not in DROP_POLICIES:
                _fail(where, f"{p}.drop_policy", f"must be one of {', '.join(DROP_POLICIES)}, got {s.drop_policy!r}")
            for name in ("fps", "queue_size", "max_frames"):
                if getattr(s, name) < 0:
                    _fail(where, f"{p}.{name}", "must be >= 0")
            if not 0 < s.reconnect_min_s <= s.reconnect_max_s:
                _fail(where, f"{p}.reconnect_min_s", "must be > 0 and <= reconnect_max_s")
        m = self.model
        if not m.path:
            _fail(where, "model.path", "is required")
        for name in ("conf_thres", "iou_thres"):
            v = getattr(m, name)
            if not 0.0 <= v <= 1.0:
                _fail(where, f"model.{name}", f"must be within [0, 1], got {v}")
        if m.max_batch < 1 or m.max_det < 1 or m.threads < 0:
            _fail(where, "model", "max_batch and max_det must be >= 1, threads >= 0")
        c = self.cloud
        if c.transport not in TRANSPORTS:
            _fail(where, "cloud.transport", f"must be one of {', '.join(TRANSPORTS)}, got {c.transport!r}")
        for i, ep in enumerate(c.endpoints):
            host, _, port = ep.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                _fail(where, f"cloud.endpoints[{i}]", f"must be host:port, got {ep!r} (port 1..65535)")
        if bool(c.tls_cert) != bool(c.tls_key):
            _fail(where, "cloud.tls_cert", "tls_cert and tls_key must be given together")
        if c.max_in_flight < 1:
            _fail(where, "cloud.max_in_flight", "must be >= 1")
        if not 0 < c.mqtt.port < 65536:
            _fail(where, "cloud.mqtt.port", f"must be 1..65535, got {c.mqtt.port}")
        if c.keepalive_s <= 0 or c.mqtt.keepalive_s <= 0:
            _fail(where, "cloud.keepalive_s", "cloud.keepalive_s and cloud.mqtt.keepalive_s must be > 0")
        prefix = c.mqtt.topic_prefix
        if not prefix or any(ch in prefix for ch in "+#") or prefix.startswith("/") or prefix.endswith("/"):
            _fail(where, "cloud.mqtt.topic_prefix",
                  f"must be a non-empty topic without '+', '#' or a leading/trailing '/', got {prefix!r}")
        if self.sinks.mqtt_outbox_max < 1:
            _fail(where, "sinks.mqtt_outbox_max", f"must be >= 1, got {self.sinks.mqtt_outbox_max}")
        if self.sinks.mqtt and not c.mqtt.host:
            _fail(where, "sinks.mqtt", "needs cloud.mqtt.host")
        if self.spool.max_bytes < 1 or self.spool.max_age_s <= 0:
            _fail(where, "spool", "max_bytes must be >= 1 and max_age_s > 0")
        if self.spool.replay_batch < 1 or self.spool.replay_interval_s <= 0:
            _fail(where, "spool", f"replay_batch must be >= 1 and replay_interval_s > 0, got "
                  f"{self.spool.replay_batch} and {self.spool.replay_interval_s}")
        if self.metrics.port < -1 or self.metrics.port > 65535:
            _fail(where, "metrics.port", "must be -1 (off), 0 (any) or 1..65535")
        if self.policy_poll_s <= 0 or self.shutdown_grace_s < 0:
            _fail(where, "policy_poll_s", "policy_poll_s must be > 0 and shutdown_grace_s >= 0")


def _fail(where: str, path: str, what: str) -> None:
    raise ConfigError(f"{where}: {path} {what}")


def _check_synthetic_uri(where: str, path: str, uri: str) -> None:
    from edge.sources.synthetic import parse_uri

    try:
        spec = parse_uri(uri)
    except ValueError as exc:
        _fail(where, path, f"is not a synthetic scene: {exc}")
        return
    if spec.scene != "digits":
        return
    try:
        from edgewise.synth import load_difficulty
    except ImportError:
        return  # the source falls back to the built-in pattern, and says so
    try:
        load_difficulty(spec.difficulty)
    except ConfigError as exc:
        _fail(where, path, f"names no usable difficulty: {exc}")


# --------------------------------------------------------------------------- loading

def _type_name(f: dataclasses.Field[Any]) -> str:
    t = f.type
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


_NESTED: Dict[str, Any] = {
    "StreamSettings": StreamSettings,
    "ModelSettings": ModelSettings,
    "MqttSettings": MqttSettings,
    "CloudSettings": CloudSettings,
    "SpoolSettings": SpoolSettings,
    "SinkSettings": SinkSettings,
    "MetricsSettings": MetricsSettings,
}


def _convert(value: Any, tname: str, where: str, path: str) -> Any:
    if tname in _NESTED:
        return _build(_NESTED[tname], value, where, path)
    if tname.startswith("List["):
        inner = tname[5:-1]
        if isinstance(value, str) and inner == "str":
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: {path} must be a list, got {type(value).__name__}")
        return [_convert(v, inner, where, f"{path}[{i}]") for i, v in enumerate(value)]
    if tname == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: {path} must be true or false, got {value!r}")
    if tname in ("int", "float"):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: {path} must be a number, got {value!r}")
        try:
            num = float(value) if tname == "float" else int(str(value), 0) if isinstance(value, str) else value
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {path} must be a{'n integer' if tname == 'int' else ' number'}, got {value!r}") from None
        if tname == "int" and (not isinstance(num, int) or isinstance(num, bool)):
            raise ConfigError(f"{where}: {path} must be an integer, got {value!r}")
        return num
    if tname == "str":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {path} must be a string, got {type(value).__name__}")
        return value
    raise AssertionError(f"unsupported settings type {tname}")


def _build(cls: Any, data: Any, where: str, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: {path or 'top level'} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown key {sub!r} (allowed here: {', '.join(sorted(fields))})"
            )
        kwargs[key] = _convert(value, _type_name(fields[key]), where, sub)
    return cls(**kwargs)


def _to_dict(obj: Any) -> Any:
    return dataclasses.asdict(obj)


def _set_path(tree: Dict[str, Any], path: str, value: Any, where: str) -> None:
    parts = path.split(".")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{where}: {path}: index {part!r} out of range")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: {path}: {'.'.join(parts[:i])} is not a mapping")
        if last:
            node[part] = value
        else:
            node = node.setdefault(part, {})


def load_settings(
    path: Optional[str] = None,
    overrides: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
) -> EdgeSettings:
    """Build and validate the settings.

    Args:
        path: YAML file (optional).
        overrides: ``key.path=value`` strings (values parsed as YAML scalars/lists),
            applied last; list items by index (``streams.0.fps=5``).
        env: environment mapping (default ``os.environ``); ``EDGEWISE_EDGE_CLOUD__TOKEN``
            sets ``cloud.token``.

    Raises:
        ConfigError: naming file and key path of the first problem.
    """
    env = os.environ if env is None else env
    tree: Dict[str, Any] = {}
    where = "settings"
    if path:
        where = str(path)
        tree = read_yaml_mapping(path, "edge settings")
        # Validate the file's own keys first so the message names the file.
        _build(EdgeSettings, tree, where, "")
    layered: List[Tuple[str, str, str]] = []
    for name in sorted(env):
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX):].lower().replace("__", ".")
            layered.append((f"environment {name}", key, env[name]))
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        layered.append((f"--set {key}", key.strip(), value))
    for src, key, raw in layered:
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if key.split(".")[0] == "streams" and not tree.get("streams"):
            raise ConfigError(f"{src}: no streams to override; define streams in the file")
        base = _to_dict(_build(EdgeSettings, tree, where, ""))
        merged = _merge(base, tree)
        _set_path(merged, key, value, src)
        _build(EdgeSettings, merged, src, "")  # names the flag/env var on error
        tree = merged
    settings: EdgeSettings = _build(EdgeSettings, tree, where, "")
    settings.validate(where)
    return settings


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _merge(base.get(k), v) if k in base else v
        return out
    return over


def describe() -> str:
    """Every settings key with its type, default and documentation (for ``--help-settings``)."""
    lines: List[str] = []
    _describe(EdgeSettings, "", lines)
    return "\n".join(lines)


def _describe(cls: Any, prefix: str, lines: List[str]) -> None:
    from edgewise.config import attribute_docs  # the docs page reads them the same way

    docs = attribute_docs(cls)
    for f in dataclasses.fields(cls):
        tname = _type_name(f)
        key = f"{prefix}{f.name}"
        if tname in _NESTED:
            _describe(_NESTED[tname], f"{key}.", lines)
        elif tname == "List[StreamSettings]":
            _describe(StreamSettings, f"{key}[].", lines)
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
            )
            lines.append(f"{key} ({tname}, default {default!r}): {docs.get(f.name, '')}")
