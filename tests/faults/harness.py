"""The fault suite's harness: ``edgewise edge run`` as a real process, its settings,
and the accounting of every escalated frame across the sinks.

``edge_settings`` writes the daemon's settings (two synthetic streams: one whose
frames are all escalated, one never); ``tests.processes.EdgeProcess`` runs it. ``account`` reads what the sinks received (the JSON Lines file,
and the MQTT detections topic when the case has one) and the spool left at the
end, and counts per fault: frames, escalated, answered live, answered late,
edge-only fallbacks, lost and duplicated. Definitions:

* a frame is a key ``device/stream/frame_seq`` with a non-late record;
* **lost**: a frame accepted into the spool (``outcome: spooled``) with no late record
  that is no longer in the spool; a frame number missing inside a run that ended
  cleanly; a JSON Lines record missing from the MQTT topic;
* **duplicated**: a key with two non-late records or two late records, in any sink;
* **unrecorded at kill -9**: frame numbers missing inside a run that was killed: frames
  in memory (in the pipeline or waiting for the cloud) when the process died, which
  no process can keep; reported, not counted as lost;
* **pending**: spooled frames still in the spool after the final clean stop (durable,
  replayed at the next start).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml
from tests.processes import EdgeProcess
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "faultdev"


@dataclass
class Row:
    """One line of the fault table."""

    fault: str
    frames: int
    escalated: int
    answered: int
    late: int
    edge_only: int
    lost: int
    duplicated: int
    unrecorded_at_kill: int = 0
    pending: int = 0


def edge_settings(tmp: Path, cloud: Dict[str, Any], transport: str = "grpc", mqtt_sink: bool = False,
                  spool_dir: Optional[Path] = None, fps: float = 10.0, deadline_ms: int = 800,
                  hard_size: str = "160x120", jsonl_dir: Optional[Path] = None) -> Path:
    """Settings + policy files of the faulted daemon; returns the settings path. The
    ``hard`` stream's frames (``hard_size``) are all escalated, the ``easy`` one's never."""
    policy = tmp / "policy.yaml"
    policy.write_text(policy_yaml("faults", {"hard": "always", "easy": "never"}, transport=transport,
                                  deadline_ms=deadline_ms))
    sinks: Dict[str, Any] = {"jsonl": str((jsonl_dir or tmp) / "out.jsonl")}
    if mqtt_sink:
        sinks.update(mqtt=True, mqtt_outbox=str(tmp / "outbox.db"))
    return settings_yaml(
        tmp / "edge.yaml", device_id=DEVICE,
        streams=[{"id": "hard", "kind": "synthetic", "uri": hard_size, "fps": fps},
                 {"id": "easy", "kind": "synthetic", "uri": "160x120", "fps": fps}],
        model={"path": str(ROOT / ".cache" / "test-models" / "yolov5n-160-10.onnx"), "max_batch": 2},
        policy_file=str(policy), policy_poll_s=3600, cloud=cloud,
        spool={"path": str((spool_dir or tmp) / "spool.db"), "replay_interval_s": 0.3},
        sinks=sinks, metrics={"port": -1}, shutdown_grace_s=2.0,
    )


def key(r: Dict[str, Any]) -> str:
    return f"{r['device']}/{r['stream']}/{r['frame_seq']}"


class Sinks:
    """What the sinks of one case hold, read on demand."""

    def __init__(self, jsonl: Path, mqtt: Any = None) -> None:
        self.jsonl = jsonl
        self.mqtt = mqtt  # a tests.conftest.TopicRecorder, or None

    def records(self) -> List[Dict[str, Any]]:
        return read_jsonl(self.jsonl)

    def outcome(self, outcome: str) -> List[Dict[str, Any]]:
        return [r for r in self.records() if r.get("outcome") == outcome and not r.get("late")]

    def late_keys(self) -> Set[str]:
        return {key(r) for r in self.records() if r.get("late")}

    def spooled_keys(self) -> Set[str]:
        return {key(r) for r in self.outcome("spooled")}

    def running_epoch(self) -> int:
        """The epoch (frame_seq >> 32) of the newest run that wrote a record."""
        return max((r["frame_seq"] >> 32 for r in self.records() if not r.get("late")), default=0)

    def wait_all_spooled_late(self, edge: EdgeProcess, timeout: float = 90.0) -> None:
        wait_until(lambda: edge.check() and self.spooled_keys() <= self.late_keys(), timeout,
                   "every spooled escalation answered late")


def spool_keys(path: Path) -> Set[str]:
    from edge.spool import Spool

    if not path.exists():
        return set()
    sp = Spool(path, max_bytes=1 << 40, max_age_s=1e9)
    try:
        return {item.key for item in sp.peek(1_000_000)}
    finally:
        sp.close()


def _dupes(pairs: Iterable[Tuple[str, bool]]) -> int:
    return sum(n - 1 for n in Counter(pairs).values() if n > 1)


def cut_at_kill(records: Sequence[Dict[str, Any]], killed_epochs: Sequence[int]) -> Set[Tuple[str, bool]]:
    """The record each kill -9 may have caught between the sinks: the last one the killed run
    wrote to the JSON Lines file (the one before the next run's first live record; and, should
    the next run have replayed before its first frame, the killed run's last live record). The
    file and the MQTT outbox are written one after the other (no transaction spans both), so a
    kill between the two leaves that record in the file only."""
    out: Set[Tuple[str, bool]] = set()
    for epoch in killed_epochs:
        own = [r for r in records if not r.get("late") and r["frame_seq"] >> 32 == epoch]
        if own:
            out.add((key(own[-1]), False))
        nxt = next((i for i, r in enumerate(records) if not r.get("late") and r["frame_seq"] >> 32 > epoch), None)
        if nxt:
            out.add((key(records[nxt - 1]), bool(records[nxt - 1].get("late"))))
    return out


def account(fault: str, sinks: Sinks, spool: Path, killed_epochs: Sequence[int] = ()) -> Row:
    """Count every escalated frame across the sinks (see the module doc for the terms)."""
    records = sinks.records()
    live = [r for r in records if not r.get("late")]
    late = [r for r in records if r.get("late")]
    dup = _dupes((key(r), False) for r in live) + _dupes((key(r), True) for r in late)
    final: Dict[str, Dict[str, Any]] = {key(r): r for r in live}
    late_keys = {key(r) for r in late}
    escalated = [k for k, r in final.items() if r.get("escalated")]
    left = spool_keys(spool)
    lost = sum(1 for k in escalated if final[k]["outcome"] == "spooled" and k not in late_keys and k not in left)
    # Frame numbers missing inside a run: in memory at a kill -9, or lost otherwise.
    seqs: Dict[Tuple[str, int], List[int]] = defaultdict(list)
    for r in live:
        seqs[(r["stream"], r["frame_seq"] >> 32)].append(r["frame_seq"] & 0xFFFFFFFF)
    unrecorded = 0
    for (_, epoch), got in seqs.items():
        missing = max(got) + 1 - len(set(got))
        if epoch in killed_epochs:
            unrecorded += missing
        else:
            lost += missing
    if sinks.mqtt is not None:
        on_topic = Counter((key(r), bool(r.get("late"))) for r in sinks.mqtt.json())
        dup += sum(n - 1 for n in on_topic.values() if n > 1)
        off_topic = {(key(r), bool(r.get("late"))) for r in records} - set(on_topic)
        at_kill = off_topic & cut_at_kill(records, killed_epochs)
        unrecorded += len(at_kill)  # on the topic's side: in memory at the kill, as a frame is
        lost += len(off_topic - at_kill)
    return Row(
        fault=fault,
        frames=len(final),
        escalated=len(escalated),
        answered=sum(1 for k in escalated if final[k]["outcome"] == "cloud"),
        late=sum(1 for r in late if r.get("outcome") == "cloud"),
        # the live record's edge result, or a replay the cloud refused for good (late edge_only)
        edge_only=sum(1 for k in escalated if final[k]["outcome"] == "edge_only" and k not in late_keys)
        + sum(1 for r in late if r.get("outcome") == "edge_only"),
        lost=lost,
        duplicated=dup,
        unrecorded_at_kill=unrecorded,
        pending=sum(1 for k in escalated if final[k]["outcome"] == "spooled" and k not in late_keys and k in left),
    )


def render(rows: Sequence[Row]) -> str:
    """The fault table as Markdown."""
    head = ("fault", "frames", "escalated", "answered", "late", "edge-only fallback", "lost", "duplicated",
            "unrecorded at kill -9", "pending in spool")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r.fault} | {r.frames} | {r.escalated} | {r.answered} | {r.late} | {r.edge_only} | "
                     f"{r.lost} | {r.duplicated} | {r.unrecorded_at_kill} | {r.pending} |")
    return "\n".join(lines) + "\n"

