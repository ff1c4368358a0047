"""What an escalation carries, as pure functions: the ``DetectRequest`` of a frame,
the crop around its uncertain boxes, the boxes of a frame record, and the
metadata stored with a spooled escalation.

``build_request`` turns a frame, its edge detections and the policy's decision into a
``DetectRequest`` (JPEG at the policy quality; the full frame or one padded crop
around the uncertain boxes, with ``offset_x/y`` and the source size).
Callers: ``edge.escalating`` (the async shell that sends, spools and replays),
``edge.pipeline`` (record boxes).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from edge.records import FrameRecord
from edge.sources.base import Frame
from edgewise.detections import Detections
from edgewise.hardness.signals import RECORD_DECIMALS
from edgewise.policy.deciding import Decision
from edgewise.policy.schema import Merge, Policy


def crop_region(
    dets: Detections, size: Tuple[int, int], band: Tuple[float, float], padding: float
) -> Optional[Tuple[int, int, int, int]]:
    """(x1, y1, x2, y2) of one crop holding every uncertain box (score in ``band``),
    each padded by ``padding`` x its size; None when no box is uncertain (then
    the full frame is sent: a missed object can be anywhere)."""
    if len(dets) == 0:
        return None
    lo, hi = band
    mask = (dets.scores >= lo) & (dets.scores <= hi)
    if not mask.any():
        return None
    b = dets.boxes[mask].astype(np.float64)
    w = b[:, 2] - b[:, 0]
    h = b[:, 3] - b[:, 1]
    x1 = float(np.min(b[:, 0] - padding * w))
    y1 = float(np.min(b[:, 1] - padding * h))
    x2 = float(np.max(b[:, 2] + padding * w))
    y2 = float(np.max(b[:, 3] + padding * h))
    W, H = size
    ix1, iy1 = max(0, int(np.floor(x1))), max(0, int(np.floor(y1)))
    ix2, iy2 = min(W, int(np.ceil(x2))), min(H, int(np.ceil(y2)))
    if ix2 - ix1 < 2 or iy2 - iy1 < 2:
        return None
    return ix1, iy1, ix2, iy2


def build_request(
    device_id: str, frame: Frame, dets: Detections, decision: Decision, policy: Policy
) -> Tuple[Any, Optional[Tuple[int, int, int, int]]]:
    """The ``DetectRequest`` of one escalation under ``policy``, and the crop region
    sent (None = the full frame)."""
    from edgewise.v1 import detect_pb2
    from edgewise.wire import detections_to_proto, encode_image

    spec = policy.spec
    h, w = frame.image.shape[:2]
    region = None
    if spec.payload.mode == "crops":
        region = crop_region(dets, (w, h), (spec.band.low, spec.band.high), spec.payload.crop_padding)
    if region is None:
        img = encode_image(frame.image, "jpeg", spec.payload.jpeg_quality)
    else:
        x1, y1, x2, y2 = region
        img = encode_image(np.ascontiguousarray(frame.image[y1:y2, x1:x2]), "jpeg", spec.payload.jpeg_quality)
        img.offset_x, img.offset_y = x1, y1
    img.source_width, img.source_height = w, h
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
    return req, region


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
        """Read back ``to_meta``'s dict from the spool; ValueError when it is not one."""
        try:
            record, merge = meta["record"], meta["merge"]
            deadline_ms, transport = int(meta["deadline_ms"]), str(meta["transport"])
            if not isinstance(record, dict) or not isinstance(merge, dict) or deadline_ms < 1:
                raise ValueError("wrong types")
            return cls(FrameRecord.from_dict(record), Merge(**merge), deadline_ms, transport)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"spool metadata is not an escalation's ({exc!r})") from None
