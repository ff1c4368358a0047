"""What every edgewise process exposes the same way: its metrics registry and its logs.

* :func:`process_registry` gives a process its own Prometheus ``CollectorRegistry``
  (never the global default, so tests can run several processes' metrics in one
  interpreter) with the standard process, platform and garbage-collector
  collectors (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
  ``python_info``, ...) and ``edgewise_build_info{process, version, python}`` = 1,
  the conventional way to join a version onto other series in PromQL.
  Counters and histograms export no ``*_created`` series: they double the series
  count and no dashboard or alert of this project reads them.
* :func:`setup_logging` configures the root logger as text (the default) or as
  one JSON object per line (``--log-format json``) for log shippers.
* :class:`LogThrottle` bounds a message that outside input can repeat (a folder
  of corrupt files, a flood of refused MQTT requests) to a few lines per interval,
  each saying how many it held back.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from typing import Any, Callable, Dict, Optional

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from edgewise import __version__

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_GC_PRESENT = GC_COLLECTOR is not None
_HANDLER_NAME = "edgewise"


def process_registry(process: str) -> CollectorRegistry:
    """A new registry for one ``process`` (edge, gateway, worker, autoscaler) with the
    standard collectors and ``edgewise_build_info``."""
    disable_created_metrics()
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    if _GC_PRESENT:
        GCCollector(registry=registry)
    info = Gauge("edgewise_build_info", "Always 1; labels name the process, edgewise version and Python",
                 ["process", "version", "python"], registry=registry)
    info.labels(process, __version__, platform.python_version()).set(1)
    return registry


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, and the
    exception text when there is one."""

    converter = time.gmtime  # type: ignore[assignment]  # UTC timestamps

    def format(self, record: logging.LogRecord) -> str:
        out: Dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Configure the root logger on stderr; ``fmt`` is ``text`` or ``json``.

    Raises:
        ValueError: an unknown level or format (the message names the allowed ones).
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(LOG_FORMATS)}")
    name = str(level).upper()
    if not isinstance(logging.getLevelName(name), int):
        raise ValueError(f"log level {level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:  # ours from an earlier call; others stay (pytest's)
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(name)


class LogThrottle:
    """At most ``burst`` messages per ``interval_s`` window; counts the ones it holds back."""

    def __init__(self, interval_s: float, burst: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self.clock = clock
        self.window_start = float("-inf")
        self.sent = 0
        self.held = 0

    def allow(self) -> Optional[int]:
        """None to stay quiet; else how many messages were held back before this one."""
        now = self.clock()
        if now - self.window_start >= self.interval_s:
            self.window_start, self.sent = now, 0
        if self.sent >= self.burst:
            self.held += 1
            return None
        self.sent += 1
        held, self.held = self.held, 0
        return held
