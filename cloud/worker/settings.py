"""Settings of one cloud worker process: one validated object from YAML + env + flags.

Layering, lowest first: field defaults <- YAML file (``--config``) <- environment
(``EDGEWISE_WORKER_<KEY>``, nested keys joined by ``__``, e.g.
``EDGEWISE_WORKER_BATCHING__MAX_BATCH_SIZE=4``) <- command-line flags the user
actually gave. Unknown keys are rejected with their file and key path, every
value is type-checked and range-checked at load (``docs/design/conventions.md#settings``).
Callers: ``cloud.worker.cli`` builds it; ``cloud.worker.server`` consumes it.
"""

import dataclasses
import os
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from cloud.worker.batching import BatchPolicy
from edgewise.config import read_yaml_mapping
from edgewise.errors import ConfigError

ENV_PREFIX = "EDGEWISE_WORKER_"


@dataclass
class BatchingSettings:
    """Dynamic batcher knobs (Triton's names in ``docs/design/batching.md#knobs``)."""

    max_batch_size: int = 8
    """Most images in one model call."""
    max_queue_delay_ms: float = 5.0
    """Longest a request waits for a fuller batch, milliseconds (0 = never wait)."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """Batch sizes sent as soon as they can be formed (e.g. TensorRT profiles)."""
    max_queue_size: int = 64
    """Most requests waiting; the next one gets RESOURCE_EXHAUSTED at once."""

    def policy(self) -> BatchPolicy:
        """The batcher core's policy (validates the ranges)."""
        return BatchPolicy(
            max_batch_size=self.max_batch_size,
            max_queue_delay_s=self.max_queue_delay_ms / 1e3,
            preferred_batch_sizes=tuple(self.preferred_batch_sizes),
            max_queue_size=self.max_queue_size,
        )


@dataclass
class WorkerSettings:
    """Everything one worker process needs; built by ``load_settings``."""

    model: str = ""
    """Path of the YOLOv5 ONNX model (required)."""
    host: str = "0.0.0.0"
    """Address the gRPC server binds."""
    port: int = 50061
    """gRPC port; 0 picks a free one (printed as ``EDGEWISE_WORKER_LISTENING port=N``)."""
    metrics_port: int = 9101
    """Prometheus ``/metrics`` HTTP port; 0 picks a free one, -1 disables it."""
    metrics_host: str = "0.0.0.0"
    """Address the metrics server binds."""
    worker_id: str = ""
    """Name reported in responses and load; default ``<hostname>-<pid>``."""
    threads: int = 0
    """ONNX Runtime intra-op threads; 0 lets ONNX Runtime decide."""
    decode_threads: int = 2
    """Threads decoding and letterboxing incoming images (off the event loop)."""
    grace_s: float = 10.0
    """On SIGTERM: seconds to finish in-flight requests before exiting."""
    max_message_bytes: int = 8 * 1024 * 1024
    """Largest gRPC request accepted, bytes."""
    conf_threshold: float = 0.25
    """Lowest detection score returned."""
    iou_threshold: float = 0.45
    """NMS IoU threshold."""
    max_det: int = 300
    """Most detections returned per image."""
    warmup_rounds: int = 2
    """Dummy batches run at each batch size warmed before reporting SERVING."""
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    """Dynamic batcher knobs."""

    def __post_init__(self) -> None:
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}"

    def validate(self) -> "WorkerSettings":
        """Check every range; raises ``ConfigError`` naming the field."""
        checks: list[tuple[bool, str]] = [
            (bool(self.model), "model: a YOLOv5 ONNX file is required (--model or model: in the YAML)"),
            (0 <= self.port <= 65535, f"port must be in [0, 65535], got {self.port}"),
            (-1 <= self.metrics_port <= 65535, f"metrics_port must be in [-1, 65535], got {self.metrics_port}"),
            (self.threads >= 0, f"threads must be >= 0, got {self.threads}"),
            (self.decode_threads >= 1, f"decode_threads must be >= 1, got {self.decode_threads}"),
            (self.grace_s >= 0, f"grace_s must be >= 0, got {self.grace_s}"),
            (self.max_message_bytes >= 1024, f"max_message_bytes must be >= 1024, got {self.max_message_bytes}"),
            (0 <= self.conf_threshold <= 1, f"conf_threshold must be in [0, 1], got {self.conf_threshold}"),
            (0 < self.iou_threshold <= 1, f"iou_threshold must be in (0, 1], got {self.iou_threshold}"),
            (self.max_det >= 1, f"max_det must be >= 1, got {self.max_det}"),
            (self.warmup_rounds >= 0, f"warmup_rounds must be >= 0, got {self.warmup_rounds}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"worker settings: {msg}")
        try:
            self.batching.policy()
        except ValueError as exc:
            raise ConfigError(f"worker settings: batching: {exc}") from exc
        return self


def load_settings(
    config: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> WorkerSettings:
    """Build and validate settings: defaults <- ``config`` YAML <- ``env`` <- ``overrides``.

    ``overrides`` uses dotted key paths (``{"batching.max_batch_size": 4}``) and
    should hold only the flags the user gave. ``env`` defaults to ``os.environ``.
    """
    data: dict[str, Any] = {}
    if config is not None:
        where = str(config)
        data = read_yaml_mapping(config, "worker settings")
        settings = _build(WorkerSettings, data, where, "")
    else:
        settings = WorkerSettings()
    for key, value in sorted((os.environ if env is None else env).items()):
        if key.startswith(ENV_PREFIX):
            path = key[len(ENV_PREFIX) :].lower().replace("__", ".")
            _set_path(settings, path, value, f"environment variable {key}", from_text=True)
    for path, value in (overrides or {}).items():
        _set_path(settings, path, value, "command line", from_text=isinstance(value, str))
    try:
        return settings.validate()
    except ConfigError as exc:
        if config is None:
            raise
        raise ConfigError(f"{config} (with environment and flags applied): {exc}") from exc


# -- typed construction ---------------------------------------------------------

def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: Mapping[str, Any], where: str, prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'top level'} must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(
                f"{where}: unknown key {prefix}{key!s}; allowed keys here: {', '.join(names)}"
            )
        kwargs[key] = _coerce(hints[key], value, where, f"{prefix}{key}", from_text=False)
    return cls(**kwargs)


def _set_path(obj: Any, path: str, value: Any, where: str, *, from_text: bool) -> None:
    parts = path.split(".")
    target = obj
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(target)]
        if part not in names:
            done = ".".join(parts[:i])
            raise ConfigError(
                f"{where}: unknown key {path}; allowed keys{' under ' + done if done else ''}: "
                + ", ".join(names)
            )
        if i == len(parts) - 1:
            hint = _hints(type(target))[part]
            setattr(target, part, _coerce(hint, value, where, path, from_text=from_text))
        else:
            target = getattr(target, part)
            if not dataclasses.is_dataclass(target):
                raise ConfigError(f"{where}: {'.'.join(parts[: i + 1])} is not a section")


def _coerce(hint: Any, value: Any, where: str, path: str, *, from_text: bool) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _build(hint, value, where, path + ".")
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (from_text and value in ("", "none", "null")):
            return None
        return _coerce(args[0], value, where, path, from_text=from_text)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if from_text and isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {path} must be a list, got {value!r}")
        return tuple(_coerce(item, v, where, f"{path}[{i}]", from_text=from_text) for i, v in enumerate(value))
    return _scalar(hint, value, where, path, from_text)


def _scalar(hint: Any, value: Any, where: str, path: str, from_text: bool) -> Any:
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if from_text and str(value).lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return str(value).lower() in ("1", "true", "yes", "on")
        elif hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if from_text:
                return int(str(value))
        elif hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if from_text:
                return float(str(value))
        elif hint is str:
            if isinstance(value, str):
                return value
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
    except ValueError:
        pass
    raise ConfigError(f"{where}: {path} must be {getattr(hint, '__name__', hint)}, got {value!r}")
