"""What an escalation carries, as pure functions: the ``DetectRequest`` of a frame,
what it sent (noted in the frame's record), the boxes of a frame record, and the
metadata stored with a spooled escalation.

``build_request`` turns a frame, its edge detections, the policy's decision and the
motion no detection explains into a ``DetectRequest``: the payload the policy's
``spec.payload.mode`` asks for (``edgewise.regions.plan_payload``: the whole frame, one
crop, the frame downscaled, or full-resolution regions packed into one image with its
``tiles``), as JPEG at the policy's quality, with the source size. One request per
escalated frame, whatever the mode: the idempotency key, the spool and exactly-once
delivery are the same for all. Callers: ``edge.escalating`` (the async shell that sends,
spools and replays), ``edge.pipeline`` (record boxes).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.records import FrameRecord, known_fields
from edge.sources.base import Frame
from edgewise.detections import Detections
from edgewise.hardness.signals import RECORD_DECIMALS, score_bands
from edgewise.policy.deciding import Decision
from edgewise.policy.schema import Merge, Policy
from edgewise.regions import PayloadPlan


def build_request(
    device_id: str, frame: Frame, dets: Detections, decision: Decision, policy: Policy,
    motion_blobs: Optional[np.ndarray] = None, mode: Optional[str] = None,
) -> Tuple[Any, PayloadPlan]:
    """The ``DetectRequest`` of one escalation under ``policy`` in payload ``mode`` (default:
    the policy's), and the payload plan it sent (its ``regions``: the frame rectangles the
    cloud saw; None = all of it)."""
    from edgewise.v1 import detect_pb2
    from edgewise.wire import detections_to_proto, encode_image, tiles_to_proto

    spec = policy.spec
    h, w = frame.image.shape[:2]
    # each box's band (the stream's, or its class's): the signals' own test of "uncertain"
    plan = spec.payload.plan(frame.image, dets, motion_blobs, score_bands(dets, policy.signal_config(frame.stream_id)),
                             mode)
    img = encode_image(np.ascontiguousarray(plan.image), "jpeg", spec.payload.jpeg_quality)
    img.offset_x, img.offset_y = plan.offset
    img.source_width, img.source_height = w, h
    img.tiles.extend(tiles_to_proto(plan.tiles))
    req = detect_pb2.DetectRequest(
        device_id=device_id,
        stream_id=frame.stream_id,
        frame_seq=frame.seq,
        capture_time_unix_ns=frame.capture_unix_ns,
        priority=max(0, int(decision.priority)),
        trace_id=uuid.uuid4().hex,
        reason=decision.reason,
    )
    req.image.CopyFrom(img)
    req.edge_detections.extend(detections_to_proto(dets))
    req.hardness.score = float(decision.hardness)
    for k, v in decision.signals.items():
        req.hardness.signals[k] = float(v)
    return req, plan


def note_payload(record: FrameRecord, req: Any, plan: PayloadPlan, mode: str) -> None:
    """Write what an escalation sent into its record: the payload mode and its bytes, and
    the frame rectangles the cloud saw when it did not see the whole frame (``crop`` for
    the one crop of ``crops``, ``regions`` for a region payload); the merge reads them back
    (:func:`seen_regions`), also after a replay from the spool."""
    record.payload = mode
    record.payload_bytes = len(req.image.data)
    if plan.regions is None:
        return
    rects = [[int(round(float(v))) for v in r] for r in np.asarray(plan.regions).reshape(-1, 4)]
    if mode == "crops":
        record.crop = rects[0]
    else:
        record.regions = rects


def seen_regions(record: FrameRecord) -> Optional[np.ndarray]:
    """[k, 4] frame rectangles the cloud saw for this record (None: the whole frame): edge
    boxes outside them were never seen and are kept as they are by the merge."""
    if record.regions:
        return np.asarray(record.regions, np.float64).reshape(-1, 4)
    if record.crop:
        return np.asarray([record.crop], np.float64)
    return None


def detections_json(dets: Detections) -> List[Dict[str, Any]]:
    """Boxes of a record: xyxy, score, class, and the model that produced each."""
    out = []
    srcs = dets.box_sources()
    for i in range(len(dets)):
        cid = int(dets.class_ids[i])
        out.append({
            "box": [round(float(v), 2) for v in dets.boxes[i]],
            "score": round(float(dets.scores[i]), RECORD_DECIMALS),
            "class_id": cid,
            "class_name": dets.names[cid] if 0 <= cid < len(dets.names) else str(cid),
            "source": srcs[i] or "edge",
        })
    return out


class Spooled:
    """What a spooled escalation carries besides its ``DetectRequest`` (the policy
    may change or the daemon restart before the replay): the frame's record, and
    the merge, deadline and transport of the policy that escalated it."""

    def __init__(self, record: FrameRecord, merge: Merge, deadline_ms: int, transport: str) -> None:
        self.record = record
        self.merge = merge
        self.deadline_ms = deadline_ms
        self.transport = transport

    def to_meta(self) -> Dict[str, Any]:
        return {"record": self.record.to_dict(), "merge": dataclasses.asdict(self.merge),
                "deadline_ms": self.deadline_ms, "transport": self.transport}

    @classmethod
    def from_meta(cls, meta: Dict[str, Any]) -> Spooled:
        """Read back ``to_meta``'s dict from the spool, also one an older or a newer daemon
        wrote (a merge setting this one does not know is ignored: ``known_fields``); ValueError
        when it is not one."""
        try:
            record, merge = meta["record"], meta["merge"]
            deadline_ms, transport = int(meta["deadline_ms"]), str(meta["transport"])
            if not isinstance(record, dict) or not isinstance(merge, dict) or deadline_ms < 1:
                raise ValueError("wrong types")
            return cls(FrameRecord.from_dict(record), Merge(**known_fields(Merge, merge)), deadline_ms, transport)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"spool metadata is not an escalation's ({exc!r})") from None
