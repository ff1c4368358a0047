"""The per-frame record of the edge daemon: one typed value per frame.

The pipeline builds a ``FrameRecord`` once per frame from the frame, its edge
boxes and the policy's ``Decision`` (edgewise.policy.deciding), with the
decision's whole explanation (reason, detail, threshold and where it came from,
suppressed_by, priority, policy name and generation, signals, hardness). An
escalated frame's record is completed by ``edge.escalating`` (outcome, merged
boxes, cloud round trip, error) and written once it is settled. ``Sinks``
serialise it once (``to_json``) and hand every sink the record and its bytes.

JSON field names are those of the JSON Lines files written before this type
existed (``edgewise_tools.demo``, ``bench/`` and the tests read them); fields are
only ever added. ``error``, ``crop``, ``cloud_model``, ``regions``, ``payload`` and
``payload_bytes`` appear only when set. The decision's whole input is recorded (signals,
motion ones included, ``decided_s``, ``edge_boxes``/``edge_classes``/``edge_max_score``,
``policy_digest``) so ``edgewise edge check-policy --replay`` can decide every frame again.
The schema is documented in docs/records.md. A spooled escalation stores its
record (``to_dict``) and the replay reads it back (``from_dict``), also from a
spool written by an older daemon that lacks the newer fields, or by a newer one
(a downgrade) that has fields this one does not know (``known_fields``).
Callers: ``edge.pipeline`` (builds), ``edge.escalating`` (completes),
``edge.payloads`` (spool metadata), ``edge.sinks`` (writes).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

#: Fields written only when they are set (not None).
OPTIONAL_FIELDS = ("error", "crop", "cloud_model", "regions", "payload", "payload_bytes", "source_file",
                   "source_index")


def known_fields(cls: Any, data: Mapping[str, Any]) -> Dict[str, Any]:
    """The entries of ``data`` that name a field of dataclass ``cls``: what the spool keeps of
    a dataclass is read back so that a daemon reads a newer one's (a release that adds a field,
    then a downgrade: every spooled escalation was dropped as unreadable) as well as an older
    one's (its missing fields defaulted)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def idempotency_key(device_id: str, stream_id: str, seq: int) -> str:
    """The key that makes a replayed escalation the same frame: ``device/stream/frame_seq``
    (the spool's key, and what the sinks de-duplicate late records by)."""
    return f"{device_id}/{stream_id}/{seq}"


def epoch_of_key(key: str) -> int:
    """The run (``frame_seq >> 32``, see ``edge.daemon.boot_epoch``) an idempotency key
    belongs to; -1 for a key that does not end in a frame number."""
    try:
        return int(key.rsplit("/", 1)[-1]) >> 32
    except ValueError:
        return -1


@dataclass
class FrameRecord:
    """What the sinks get for one frame (see docs/records.md for every field)."""

    device: str
    stream: str
    frame_seq: int
    capture_unix_ns: int
    emit_unix_ns: int
    width: int
    height: int
    detections: List[Dict[str, Any]]
    escalated: bool
    reason: str
    hardness: float
    signals: Dict[str, float] = field(default_factory=dict)
    suppressed_by: str = ""
    detail: str = ""
    threshold: float = 0.0
    origin: str = ""
    priority: int = 0
    policy: str = ""
    policy_generation: int = 0
    latency_ms: Dict[str, float] = field(default_factory=dict)
    outcome: str = "edge"
    late: bool = False
    cloud_rtt_ms: Optional[float] = None
    error: Optional[str] = None
    crop: Optional[List[int]] = None
    cloud_model: Optional[str] = None
    read_unix_ns: int = 0
    capture_clock: str = "read"
    decided_s: float = 0.0
    edge_boxes: int = 0
    edge_classes: List[str] = field(default_factory=list)
    edge_max_score: float = 0.0
    policy_digest: str = ""
    regions: Optional[List[List[int]]] = None
    payload: Optional[str] = None
    payload_bytes: Optional[int] = None
    source_file: Optional[str] = None
    source_index: Optional[int] = None

    @property
    def key(self) -> str:
        """The frame's idempotency key (``device/stream/frame_seq``)."""
        return idempotency_key(self.device, self.stream, self.frame_seq)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object of the record (optional fields only when set)."""
        out = dataclasses.asdict(self)
        for name in OPTIONAL_FIELDS:
            if out[name] is None:
                del out[name]
        return out

    def to_json(self) -> bytes:
        """The record as one compact JSON document (no trailing newline)."""
        return json.dumps(self.to_dict(), separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FrameRecord:
        """Read back ``to_dict``'s object (unknown keys ignored, newer fields defaulted);
        ValueError when required fields are missing or of the wrong kind."""
        try:
            rec = cls(**known_fields(cls, data))
        except TypeError as exc:
            raise ValueError(f"not a frame record: {exc}") from None
        if not isinstance(rec.frame_seq, int) or not isinstance(rec.stream, str) or not isinstance(rec.device, str):
            raise ValueError("not a frame record: device, stream and frame_seq have the wrong types")
        return rec
