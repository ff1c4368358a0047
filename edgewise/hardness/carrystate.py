"""What a stream's carried cloud answers already explain: the carry-state features.

Once the cloud's boxes are carried into the frames after an answer (:mod:`edgewise.carrying`),
the worth of escalating a frame depends on what is in force: a frame whose edge boxes and
moving blobs the carried answer already covers adds little, a frame with a box or a blob no
answer explains, or long after the last answer, adds much. Per-frame hardness cannot see
that; these features can, and a gain model fitted on them
(:func:`edgewise_tools.evaluation.scoring.fit_carry_model`) ranks frames by what escalating
them adds *given the stream's state*, the marginal gain. The idea is Reducto's and Glimpse's
(send a frame when it differs from the last one *sent*, Li et al. SIGCOMM 2020, Chen et al.
SenSys 2015), applied to the boxes and blobs the answer explains rather than to pixels.

Every feature is in [0, 1]; counts are capped at :data:`COUNT_CAP` and divided by it:

* ``answer_age``: frames since the stream's last escalation, capped at :data:`AGE_FRAMES`
  and divided by it (1: none yet);
* ``carried_boxes``: boxes carried onto this frame;
* ``unexplained_boxes``: edge boxes no carried box covers (IoU >= :data:`BOX_IOU`; all of
  them when nothing is carried);
* ``unexplained_uncertain``: those of them whose score lies in the uncertainty band;
* ``blobs``: moving blobs no edge box explains (:mod:`edgewise.hardness.motion`);
* ``unexplained_blobs``: those of them no carried box touches (IoU >= :data:`BLOB_IOU`);
* ``new_regions``: the share of the regions a region payload would send now
  (:meth:`edgewise.policy.schema.Payload.proposals`) whose centre lies outside every region
  the stream's last escalation proposed (1 when none yet, when the last one proposed none
  and when this frame would go whole; 0 when it proposes no region). A last escalation that
  would have gone whole covers every region for :data:`WHOLE_FRESH` frames and none after:
  on the development sets this rule kept 1-3 points of cloud F1 more than a whole frame
  covering for ever, or every escalation covering for those frames only
  (docs/design/escalation.md#carry-aware-gain-model).

They join the frame's signals under these names (not weighted by ``combine``: only a gain
model reads them), so the frame record keeps them and a replay of the records decides as the
daemon did. The daemon computes them from its carrier (``edge.deciding``), ``edgewise eval``
from its replay of the carried answers (``hybrid.CarryReplay``): one function, this one.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from edgewise.detections import Detections
from edgewise.hardness.tracking import iou_matrix

#: the features this module adds to a frame's signals, in a stable order
CARRY_FEATURES: Tuple[str, ...] = (
    "answer_age",
    "carried_boxes",
    "unexplained_boxes",
    "unexplained_uncertain",
    "blobs",
    "unexplained_blobs",
    "new_regions",
)
#: the features that read the motion detector's blobs (``new_regions`` through the region
#: proposals, which include them: the daemon must run the detector for any of these)
CARRY_MOTION: Tuple[str, ...] = ("blobs", "unexplained_blobs", "new_regions")
#: frames since the last escalation at which ``answer_age`` saturates (3 s at 10 fps: the
#: carried answers' usual horizon)
AGE_FRAMES = 30
#: counts at which the count features saturate
COUNT_CAP = 20
#: IoU at which a carried box explains an edge box (the tracker's matching IoU)
BOX_IOU = 0.3
#: frames a whole frame's answer counts as having seen every region (``new_regions``)
WHOLE_FRESH = 5
#: IoU at which a carried box explains a blob (a far object's blob is a fraction of its box)
BLOB_IOU = 0.1


def _covered(boxes: np.ndarray, by: np.ndarray, iou: float) -> np.ndarray:
    """Mask of ``boxes`` [N, 4] that some box of ``by`` overlaps with IoU >= ``iou``."""
    if len(boxes) == 0 or len(by) == 0:
        return np.zeros(len(boxes), bool)
    return np.asarray((iou_matrix(boxes, by) >= iou).any(axis=1), bool)


def _count(n: float) -> float:
    return min(float(n), COUNT_CAP) / COUNT_CAP


def new_regions(proposed: Optional[np.ndarray], last: Optional[np.ndarray], age: Optional[int]) -> float:
    """Share of ``proposed`` regions ([k, 4]; None: the frame would go whole) whose centre lies
    outside every region the stream's last escalation proposed (``last``; None: it would have
    gone whole), ``age`` frames ago (None: no escalation yet). A whole frame's answer covers
    every region for :data:`WHOLE_FRESH` frames, then none."""
    if proposed is None:
        return 1.0
    reg = np.asarray(proposed, np.float64).reshape(-1, 4)
    if not len(reg):
        return 0.0
    if age is None:
        return 1.0
    if last is None:
        return 1.0 if age > WHOLE_FRESH else 0.0
    seen = np.asarray(last, np.float64).reshape(-1, 4)
    if not len(seen):
        return 1.0
    cx, cy = (reg[:, 0] + reg[:, 2]) / 2, (reg[:, 1] + reg[:, 3]) / 2
    inside = ((cx[:, None] >= seen[None, :, 0]) & (cx[:, None] <= seen[None, :, 2])
              & (cy[:, None] >= seen[None, :, 1]) & (cy[:, None] <= seen[None, :, 3])).any(axis=1)
    return float((~inside).mean())


def carry_features(dets: Detections, uncertain: np.ndarray, carried: Optional[Detections],
                   age: Optional[int], blobs: Optional[np.ndarray], proposed: Optional[np.ndarray],
                   last_proposed: Optional[np.ndarray]) -> Dict[str, float]:
    """The carry-state features of one frame.

    Args:
        dets: the edge's boxes on the frame (operating threshold).
        uncertain: mask of ``dets`` in the uncertainty band (:func:`edgewise.hardness.signals.score_bands`).
        carried: the boxes the stream carries onto this frame (None or empty: none).
        age: frames since the stream's last escalation (None: none yet).
        blobs: the frame's moving blobs no edge box explains ([k, 4] frame pixels; None: no motion).
        proposed, last_proposed: this frame's and the last escalation's proposed regions (None:
            it would go whole; :func:`new_regions`).
    """
    edge = np.asarray(dets.boxes, np.float64).reshape(-1, 4)
    held = np.zeros((0, 4)) if carried is None else np.asarray(carried.boxes, np.float64).reshape(-1, 4)
    bl = np.zeros((0, 4)) if blobs is None else np.asarray(blobs, np.float64).reshape(-1, 4)
    free = ~_covered(edge, held, BOX_IOU)
    unc = np.asarray(uncertain, bool).reshape(-1)
    return {
        "answer_age": 1.0 if age is None else min(max(int(age), 0), AGE_FRAMES) / AGE_FRAMES,
        "carried_boxes": _count(len(held)),
        "unexplained_boxes": _count(int(free.sum())),
        "unexplained_uncertain": _count(int((free & unc).sum()) if len(unc) == len(free) else 0),
        "blobs": _count(len(bl)),
        "unexplained_blobs": _count(int((~_covered(bl, held, BLOB_IOU)).sum())),
        "new_regions": new_regions(proposed, last_proposed, age),
    }
