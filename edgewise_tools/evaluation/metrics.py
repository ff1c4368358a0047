"""Detection metrics: greedy class-aware matching, precision/recall/F1, AP and mAP@0.5.

Matching follows the PASCAL VOC / COCO protocol (Everingham et al. 2010): predictions
in descending score order each take the unmatched ground-truth box of the same class
with the highest IoU, if that IoU >= the threshold; everything else is a false
positive, unmatched ground truth is a false negative. AP is the area under the
monotone precision envelope over all recall points (VOC 2010+). COCO (pycocotools) and
YOLOv5 (``edgewise_tools.train.metrics``, the model card's figures) sample the envelope at
101 recall points instead, which reads slightly higher where recall steps are coarse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from edgewise.hardness.tracking import iou_matrix


@dataclass
class Counts:
    """True positives, false positives, false negatives."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    def __iadd__(self, other: Counts) -> Counts:
        self.tp += other.tp
        self.fp += other.fp
        self.fn += other.fn
        return self

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0

    @property
    def f1(self) -> float:
        """2TP / (2TP + FP + FN); 1.0 when there is nothing to find and nothing found."""
        den = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / den if den else 1.0


def share_of(f1: float, cloud_f1: float) -> Optional[float]:
    """``f1`` as a share of cloud-only F1; None when cloud-only F1 is 0 (nothing to be a share of)."""
    return f1 / cloud_f1 if cloud_f1 > 0 else None


def match(
    pred_boxes: np.ndarray,
    pred_cls: np.ndarray,
    pred_scores: np.ndarray,
    gt_boxes: np.ndarray,
    gt_cls: np.ndarray,
    iou_thres: float = 0.5,
) -> np.ndarray:
    """Boolean ``is_tp`` per prediction (in the given order), greedy by descending score."""
    n = len(pred_scores)
    is_tp = np.zeros(n, dtype=bool)
    if n == 0 or len(gt_cls) == 0:
        return is_tp
    iou = iou_matrix(np.asarray(pred_boxes, np.float32), np.asarray(gt_boxes, np.float32))
    same = np.asarray(pred_cls)[:, None] == np.asarray(gt_cls)[None, :]
    iou = np.where(same, iou, -1.0)
    taken = np.zeros(len(gt_cls), dtype=bool)
    for i in np.argsort(-np.asarray(pred_scores), kind="stable"):
        row = np.where(taken, -1.0, iou[i])
        j = int(np.argmax(row))
        if row[j] >= iou_thres:
            taken[j] = True
            is_tp[i] = True
    return is_tp


def match_counts(
    pred_boxes: np.ndarray,
    pred_cls: np.ndarray,
    pred_scores: np.ndarray,
    gt_boxes: np.ndarray,
    gt_cls: np.ndarray,
    iou_thres: float = 0.5,
) -> Counts:
    """TP/FP/FN of one image."""
    tp = int(match(pred_boxes, pred_cls, pred_scores, gt_boxes, gt_cls, iou_thres).sum())
    return Counts(tp=tp, fp=len(pred_scores) - tp, fn=len(gt_cls) - tp)


def average_precision(scores: Sequence[float], is_tp: Sequence[bool], n_gt: int) -> float:
    """AP of one class from all its predictions over the dataset (all-point envelope)."""
    if n_gt == 0:
        return float("nan")
    if len(scores) == 0:
        return 0.0
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    tp = np.asarray(is_tp, bool)[order]
    ctp = np.cumsum(tp)
    cfp = np.cumsum(~tp)
    recall = ctp / n_gt
    precision = ctp / np.maximum(ctp + cfp, 1)
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]))


FrameDets = Tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes [N,4], classes [N], scores [N]
FrameGT = Tuple[np.ndarray, np.ndarray]  # boxes [M,4], classes [M]


def mean_ap(
    preds: Iterable[FrameDets], gts: Iterable[FrameGT], nc: int, iou_thres: float = 0.5
) -> Tuple[float, Dict[int, float]]:
    """mAP over classes that have ground truth, and AP per class."""
    scores: List[List[float]] = [[] for _ in range(nc)]
    hits: List[List[bool]] = [[] for _ in range(nc)]
    n_gt = np.zeros(nc, dtype=np.int64)
    for (pb, pc, ps), (gb, gc) in zip(preds, gts):
        tp = match(pb, pc, ps, gb, gc, iou_thres)
        for c, s, t in zip(np.asarray(pc, int), np.asarray(ps, float), tp):
            if 0 <= c < nc:
                scores[c].append(float(s))
                hits[c].append(bool(t))
        for c in np.asarray(gc, int):
            if 0 <= c < nc:
                n_gt[c] += 1
    per_class = {c: average_precision(scores[c], hits[c], int(n_gt[c])) for c in range(nc) if n_gt[c] > 0}
    return (float(np.mean(list(per_class.values()))) if per_class else 0.0), per_class
