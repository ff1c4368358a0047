"""Sinks of per-frame records: JSON Lines file, MQTT topic, stdout.

One record per frame (see ``FrameRecord`` fields in ``edge.pipeline``): device,
stream, frame_seq, timestamps, detections with the producing model per box,
escalation decision and outcome, hardness and signals, per-stage latency, cloud
round trip, and ``late`` for results that arrived from the spool replay.

The JSON Lines sink keeps the idempotency keys of late records it has written
(reloaded from the file's tail on start), so a replay repeated after a crash
between "written" and "acknowledged" never writes a late result twice.
Callers: ``edge.daemon`` builds them, ``edge.pipeline`` / ``edge.escalating`` write.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
from typing import Any, Deque, Dict, List, Optional, Set

try:
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]

log = logging.getLogger(__name__)

Record = Dict[str, Any]
TAIL_BYTES = 64 * 1024 * 1024


def idempotency_key(device_id: str, stream_id: str, seq: int) -> str:
    """The key that makes a replayed escalation the same frame: ``device/stream/frame_seq``
    (the spool's key, and what the JSON Lines sink de-duplicates late records by)."""
    return f"{device_id}/{stream_id}/{seq}"


def record_key(rec: Record) -> str:
    """Idempotency key of a record."""
    return idempotency_key(rec.get("device", ""), rec.get("stream", ""), rec.get("frame_seq", -1))


class Sink(Protocol):
    """Somewhere records go."""

    name: str

    def write(self, rec: Record) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per line; flushed per record (fsync optional)."""

    name = "jsonl"

    def __init__(self, path: str, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self.late_keys: Set[str] = self._load_late_keys()
        self.f = open(path, "a", encoding="utf-8")

    def _load_late_keys(self) -> Set[str]:
        keys: Set[str] = set()
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return keys
        with open(self.path, "rb") as f:
            if size > TAIL_BYTES:
                f.seek(size - TAIL_BYTES)
                f.readline()
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line torn by a crash
                if isinstance(rec, dict) and rec.get("late"):
                    keys.add(record_key(rec))
        return keys

    def write(self, rec: Record) -> None:
        if rec.get("late"):
            key = record_key(rec)
            if key in self.late_keys:
                log.info("late result %s already written; duplicate replay ignored", key)
                return
            self.late_keys.add(key)
        self.f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.f.flush()
        if self.fsync:
            os.fsync(self.f.fileno())

    def close(self) -> None:
        self.f.close()


class StdoutSink:
    """One JSON line per record on stdout."""

    name = "stdout"

    def write(self, rec: Record) -> None:
        sys.stdout.write(json.dumps(rec, separators=(",", ":")) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


class MqttSink:
    """Publishes each record (JSON, QoS 1) to ``<prefix>/<device>/detections``
    through a connected paho client owned elsewhere."""

    name = "mqtt"

    def __init__(self, client: Any, topic: str, close_timeout_s: float = 3.0) -> None:
        self.client = client
        self.topic = topic
        self.close_timeout_s = close_timeout_s
        self.unacked: Deque[Any] = collections.deque(maxlen=1000)

    def write(self, rec: Record) -> None:
        info = self.client.publish(self.topic, json.dumps(rec, separators=(",", ":")), qos=1)
        if info.rc != 0:
            raise OSError(f"MQTT publish to {self.topic} failed (rc={info.rc}); broker unreachable?")
        self.unacked.append(info)

    def close(self) -> None:
        """Wait (bounded) until the broker acknowledged the last records."""
        deadline = time.monotonic() + self.close_timeout_s
        while self.unacked:
            info = self.unacked[0]
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("%d MQTT records not acknowledged by the broker at shutdown", len(self.unacked))
                return
            try:
                if not info.is_published():
                    info.wait_for_publish(timeout=left)
            except (RuntimeError, ValueError):
                pass  # not connected / queue full: nothing more to wait for
            if info.is_published() or time.monotonic() >= deadline:
                self.unacked.popleft()


class Sinks:
    """Fan-out to every configured sink; one failing sink never stops the others."""

    def __init__(self, sinks: List[Sink], on_error: Optional[Any] = None) -> None:
        self.sinks = sinks
        self.on_error = on_error

    def write(self, rec: Record) -> None:
        for s in self.sinks:
            try:
                s.write(rec)
            except Exception as exc:
                log.warning("sink %s failed to write a record: %s", s.name, exc)
                if self.on_error is not None:
                    self.on_error(s.name)

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:
                log.exception("closing sink %s", s.name)
