"""Helpers of the edge tests: policy files, settings files, reading a JSONL sink."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from edge.records import FrameRecord


def policy_yaml(name: str, stream_modes: Optional[Dict[str, str]] = None, transport: Optional[str] = "grpc",
                on_unavailable: str = "spool", deadline_ms: int = 2000, mode: str = "full",
                threshold: float = 0.5) -> str:
    """An escalation policy; ``stream_modes`` maps stream id -> auto|always|never; ``transport``
    None: unset (the device's ``cloud.transport``)."""
    doc: Dict[str, Any] = {
        "apiVersion": "edgewise/v1",
        "kind": "EscalationPolicy",
        "metadata": {"name": name},
        "spec": {
            "threshold": threshold,
            "budget": {"maxFraction": 1.0, "maxPerSecond": None, "burst": 10000},
            "transport": transport,
            "deadlineMs": deadline_ms,
            "onCloudUnavailable": on_unavailable,
            "payload": {"jpegQuality": 80, "mode": mode},
            "merge": {"strategy": "fuse", "iou": 0.5},
            "streams": {sid: {"mode": m} for sid, m in (stream_modes or {}).items()},
        },
    }
    if transport is None:
        del doc["spec"]["transport"]
    return yaml.safe_dump(doc, sort_keys=False)


def settings_yaml(path: Path, **tree: Any) -> Path:
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line torn by kill -9
    return out


def frame_record(stream: str, seq: int, device: str = "dev", reason: str = "hard") -> FrameRecord:
    """The record the pipeline would have built for an escalated frame."""
    return FrameRecord(device=device, stream=stream, frame_seq=seq, capture_unix_ns=0, emit_unix_ns=0,
                       width=64, height=48, detections=[], escalated=True, reason=reason, hardness=0.8,
                       outcome="pending")


def hold_write_lock(path: Path) -> subprocess.Popen[str]:
    """Another process (an operator's ``sqlite3`` shell left in a transaction) holding the
    SQLite file's write lock until ``let_go``."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys\n"
        f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "db.execute('BEGIN IMMEDIATE')\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def held_behind_a_lock(sinks: Any, outbox: Path, n: int) -> None:
    """Write ``n`` records (``frame_record("cam", 0..n-1)``) while another process holds
    ``outbox``'s write lock: the MQTT sink refuses each one (held in memory), then the lock is let go."""
    holder = hold_write_lock(outbox)
    try:
        for seq in range(n):
            assert sinks.write(frame_record("cam", seq)) is False
    finally:
        let_go(holder)


def let_go(holder: subprocess.Popen[str]) -> None:
    """End a ``hold_write_lock`` process (its transaction rolled back)."""
    assert holder.stdin is not None and holder.stdout is not None
    if not holder.stdin.closed:
        holder.stdin.close()
    holder.wait(10)
    holder.stdout.close()
