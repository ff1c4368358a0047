"""Agreement of two detectors' outputs on the same frames (INT8 vs float after quantization).

The float model is the reference. Per frame, candidate detections are matched greedily
by descending score: each one takes the unmatched reference box of the *same class*
with the highest IoU, if that IoU >= ``iou_thres`` (0.5), as in the matching step of
the COCO/VOC evaluators. Totals give precision, recall and F1 = 2·TP / (n_cand + n_ref),
and the mean score drift over matched pairs (candidate score - reference score).
Pure functions over ``Detections``; no model runs here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from edgewise.detections import Detections
from edgewise.runtime.nms import box_iou


def match_frame(ref: Detections, cand: Detections, iou_thres: float = 0.5) -> List[Tuple[int, int]]:
    """Matched ``(cand_index, ref_index)`` pairs of one frame, greedy by candidate score."""
    n_c, n_r = len(cand.scores), len(ref.scores)
    if n_c == 0 or n_r == 0:
        return []
    iou = box_iou(cand.boxes, ref.boxes)
    iou[cand.class_ids[:, None] != ref.class_ids[None, :]] = -1.0
    taken = np.zeros(n_r, bool)
    pairs: List[Tuple[int, int]] = []
    for i in np.argsort(-cand.scores, kind="stable"):
        row = np.where(taken, -1.0, iou[i])
        j = int(row.argmax())
        if row[j] >= iou_thres:
            taken[j] = True
            pairs.append((int(i), j))
    return pairs


@dataclass
class Agreement:
    """How well candidate detections reproduce reference detections.

    Attributes:
        frames: frames compared.
        ref_boxes: reference (float model) detections in total.
        cand_boxes: candidate (INT8 model) detections in total.
        matched: matched pairs (same class, IoU >= iou_thres).
        iou_thres: matching IoU.
        score_drift: mean candidate-minus-reference score of matched pairs (NaN if none).
        abs_score_drift: mean absolute score difference of matched pairs (NaN if none).
        per_frame_f1: F1 of each frame (1.0 when both are empty).
    """

    frames: int = 0
    ref_boxes: int = 0
    cand_boxes: int = 0
    matched: int = 0
    iou_thres: float = 0.5
    score_drift: float = float("nan")
    abs_score_drift: float = float("nan")
    per_frame_f1: List[float] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return self.matched / self.cand_boxes if self.cand_boxes else float("nan")

    @property
    def recall(self) -> float:
        return self.matched / self.ref_boxes if self.ref_boxes else float("nan")

    @property
    def f1(self) -> float:
        total = self.ref_boxes + self.cand_boxes
        return 2.0 * self.matched / total if total else float("nan")

    def summary(self) -> str:
        return (
            f"agreement on {self.frames} held-out frames: F1@{self.iou_thres:g} {self.f1:.3f} "
            f"(precision {self.precision:.3f}, recall {self.recall:.3f}; "
            f"{self.matched} matched of {self.ref_boxes} float / {self.cand_boxes} int8 boxes), "
            f"mean score drift {self.score_drift:+.4f} (|drift| {self.abs_score_drift:.4f})"
        )

    def as_dict(self) -> dict:  # type: ignore[type-arg]
        def num(x: float) -> Optional[float]:
            return None if x != x else round(float(x), 6)

        return {
            "frames": self.frames,
            "ref_boxes": self.ref_boxes,
            "cand_boxes": self.cand_boxes,
            "matched": self.matched,
            "iou_thres": self.iou_thres,
            "precision": num(self.precision),
            "recall": num(self.recall),
            "f1": num(self.f1),
            "score_drift": num(self.score_drift),
            "abs_score_drift": num(self.abs_score_drift),
        }


def compare(
    refs: Sequence[Detections], cands: Sequence[Detections], iou_thres: float = 0.5
) -> Agreement:
    """Agreement over frames; ``refs[i]`` and ``cands[i]`` are the same frame."""
    if len(refs) != len(cands):
        raise ValueError(f"compare: {len(refs)} reference frames but {len(cands)} candidate frames")
    out = Agreement(iou_thres=iou_thres)
    drifts: List[float] = []
    for ref, cand in zip(refs, cands):
        pairs = match_frame(ref, cand, iou_thres)
        out.frames += 1
        out.ref_boxes += len(ref.scores)
        out.cand_boxes += len(cand.scores)
        out.matched += len(pairs)
        drifts.extend(float(cand.scores[i]) - float(ref.scores[j]) for i, j in pairs)
        n = len(ref.scores) + len(cand.scores)
        out.per_frame_f1.append(2.0 * len(pairs) / n if n else 1.0)
    if drifts:
        d = np.asarray(drifts)
        out.score_drift = float(d.mean())
        out.abs_score_drift = float(np.abs(d).mean())
    return out
