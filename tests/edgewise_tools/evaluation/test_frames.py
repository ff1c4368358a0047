"""``set_signals``: a collected set's signals computed again under another policy (what
``check-policy --data`` does per policy), the motion signals kept as collected."""

from __future__ import annotations

import numpy as np

from edgewise.detections import Detections
from edgewise.hardness import MOTION_SIGNALS
from edgewise.policy import parse_policy
from edgewise_tools.evaluation.frames import FrameRecord, set_signals

POLICY = """apiVersion: edgewise/v1
kind: EscalationPolicy
metadata: {name: p}
spec:
  threshold: 0.5
  band: {low: %s, high: 0.6}
"""


def _record(frame: int, score: float, motion: float) -> FrameRecord:
    edge = Detections(boxes=np.asarray([[10, 10, 30, 30]], np.float32), scores=np.asarray([score], np.float32),
                      class_ids=np.asarray([0], np.int32), names=("a",), source="edge")
    return FrameRecord(stream=0, frame=frame, width=100, height=100, gt_boxes=np.zeros((0, 4), np.float32),
                       gt_cls=np.zeros((0,), np.int32), edge=edge, cloud=edge, edge_all=edge, cloud_all=edge,
                       jpeg_bytes=100, signals={"motion": motion, "motion_blobs": motion / 2})


def test_box_signals_follow_the_policy_motion_signals_stay_as_collected() -> None:
    records = [_record(i, 0.3, 0.1 * i) for i in range(4)]
    set_signals(records, parse_policy(POLICY % 0.25))
    assert all(r.signals["uncertain_count"] > 0 for r in records)  # 0.3 is inside [0.25, 0.6]
    assert [r.signals["motion"] for r in records] == [0.1 * i for i in range(4)]
    assert [r.signals["motion_blobs"] for r in records] == [0.05 * i for i in range(4)]
    set_signals(records, parse_policy(POLICY % 0.4))
    assert all(r.signals["uncertain_count"] == 0 for r in records)  # now below the band
    assert [r.signals["motion"] for r in records] == [0.1 * i for i in range(4)]
    assert set(MOTION_SIGNALS) <= set(records[0].signals)
