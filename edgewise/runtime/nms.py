"""Box IoU and class-aware greedy NMS in vectorised numpy.

Semantics follow ``torchvision.ops.batched_nms`` as YOLOv5's
``utils/general.py::non_max_suppression`` calls it: boxes sorted by score
(descending, ties by index), a box is dropped when its IoU with an already kept
box *of the same class* is strictly greater than ``iou_thres``; at most
``max_det`` boxes are kept. YOLOv5 makes NMS class-aware by offsetting boxes by
``class * max_wh``; we instead mask the IoU row by class equality, which gives
the same answer without the float32 precision loss of adding 7680*c to
coordinates. The loop runs once per *kept* box (≤ ``max_det``), each step a
handful of numpy ops over the remaining candidates.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

# Up to this many boxes NMS builds the full overlap matrix (K*K bools); above, it iterates.
MATRIX_MAX = 512


def box_area(boxes: np.ndarray) -> np.ndarray:
    """Area of xyxy boxes ``[..., 4]`` (zero for inverted boxes)."""
    return np.clip(boxes[..., 2] - boxes[..., 0], 0, None) * np.clip(
        boxes[..., 3] - boxes[..., 1], 0, None
    )


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: ``a`` [N,4], ``b`` [M,4] -> [N,M] (float64).

    ``inter / (area_a + area_b - inter)``, like YOLOv5's ``box_iou`` but without
    its 1e-7 eps (which would bias tiny boxes); two empty boxes get IoU 0.
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: Optional[np.ndarray] = None,
    iou_thres: float = 0.45,
    max_det: int = 300,
) -> np.ndarray:
    """Indices of kept boxes, highest score first.

    Args:
        boxes: ``[N, 4]`` xyxy.
        scores: ``[N]``.
        class_ids: ``[N]`` ints; ``None`` = class-agnostic.
        iou_thres: suppress when IoU with a kept box of the same class > this.
        max_det: keep at most this many.
    """
    n = int(scores.shape[0])
    if n == 0 or max_det <= 0:
        return np.zeros((0,), np.int64)
    b = np.asarray(boxes, np.float64)
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    cls = None if class_ids is None else np.asarray(class_ids)
    if n > MATRIX_MAX:
        return _nms_iterative(b, cls, iou_thres, max_det, order)
    bs = b[order].astype(np.float32)
    if cls is not None:
        cs = cls[order]
        grouped = _nms_grouped(bs, cs, iou_thres, max_det, order)
        if grouped is not None:
            return grouped
        return _nms_matrix(bs, cs, iou_thres, max_det, order)
    return _nms_matrix(bs, None, iou_thres, max_det, order)


def _suppression(b: np.ndarray, iou_thres: float) -> np.ndarray:
    """``over[..., i, j]`` = IoU(b_i, b_j) > t for float32 boxes ``b [..., G, 4]``.

    Tested as ``inter * (1 + t) > t * (area_i + area_j)`` (no division); decisions
    can differ from exact arithmetic only for IoUs within float32 rounding of t.
    """
    t = np.float32(iou_thres)
    x1, y1, x2, y2 = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    areas_t = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0) * t
    w = np.minimum(x2[..., :, None], x2[..., None, :])
    w -= np.maximum(x1[..., :, None], x1[..., None, :])
    np.maximum(w, 0, out=w)
    h = np.minimum(y2[..., :, None], y2[..., None, :])
    h -= np.maximum(y1[..., :, None], y1[..., None, :])
    np.maximum(h, 0, out=h)
    inter = np.multiply(w, h, out=w)
    inter *= np.float32(1.0) + t
    return np.asarray(inter > np.add(areas_t[..., :, None], areas_t[..., None, :], out=h))


def _nms_matrix(
    b: np.ndarray, cls: Optional[np.ndarray], iou_thres: float, max_det: int, order: np.ndarray
) -> np.ndarray:
    """Boxes sorted by score: overlap matrix + Cluster-NMS fixed point.

    ``over[i, j]`` (i before j, same class) says box i would suppress box j. The
    greedy result is the fixed point of ``keep = ~any(over[keep], axis=0)``
    (Cluster-NMS, Zheng et al. 2021, equal to greedy NMS: after pass t the first
    t boxes are final); it converges in a few matrix passes instead of one
    Python step per kept box.
    """
    k = b.shape[0]
    over = _suppression(b, iou_thres)
    if cls is not None:
        over &= cls[:, None] == cls[None, :]
    over &= _upper(k)
    keep = np.ones(k, bool)
    for _ in range(k):
        new = np.asarray(~over[keep].any(axis=0))
        if np.array_equal(new, keep):
            break
        keep = new
    return order[np.flatnonzero(keep)[:max_det]]


def _nms_grouped(
    b: np.ndarray, cls: np.ndarray, iou_thres: float, max_det: int, order: np.ndarray
) -> Optional[np.ndarray]:
    """Class-aware NMS as C independent [G,G] problems batched in one [C,G,G] array.

    Boxes of different classes never interact, so instead of a [K,K] matrix
    masked by class we pad each class's boxes (score order kept) to the largest
    group size G. Returns ``None`` when that would not be at least 2x less work.
    """
    k = b.shape[0]
    g = np.argsort(cls, kind="stable")  # grouped index -> score-order position
    cg = cls[g]
    starts = np.flatnonzero(np.concatenate(([True], cg[1:] != cg[:-1])))
    counts = np.diff(np.append(starts, k))
    c, gmax = len(starts), int(counts.max())
    if c < 2 or 2 * c * gmax * gmax > k * k:
        return None
    grp = np.repeat(np.arange(c), counts)
    rank = np.arange(k) - np.repeat(starts, counts)
    boxes = np.zeros((c, gmax, 4), np.float32)
    boxes[grp, rank] = b[g]
    valid = np.zeros((c, gmax), bool)
    valid[grp, rank] = True
    over = _suppression(boxes, iou_thres)
    over &= _upper(gmax)
    keep = valid
    for _ in range(gmax):
        new = np.asarray(valid & ~(over & keep[:, :, None]).any(axis=1))
        if np.array_equal(new, keep):
            break
        keep = new
    pos = np.sort(g[keep[grp, rank]])[:max_det]
    return order[pos]


_UPPER_CACHE: Dict[int, np.ndarray] = {}


def _upper(k: int) -> np.ndarray:
    """Strict upper-triangle mask [k,k] (cached by size, so built once per K)."""
    m = _UPPER_CACHE.get(k)
    if m is None:
        if len(_UPPER_CACHE) > 64:
            _UPPER_CACHE.clear()
        m = np.triu(np.ones((k, k), bool), 1)
        _UPPER_CACHE[k] = m
    return m


def _nms_iterative(
    b: np.ndarray, cls: Optional[np.ndarray], iou_thres: float, max_det: int, order: np.ndarray
) -> np.ndarray:
    """Large inputs: one vectorised IoU row per kept box against the survivors."""
    x1, y1, x2, y2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    areas = np.maximum(x2 - x1, 0) * np.maximum(y2 - y1, 0)
    keep = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        if len(keep) >= max_det:
            break
        rest = order[1:]
        if rest.size == 0:
            break
        w = np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest])
        h = np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest])
        inter = np.maximum(w, 0) * np.maximum(h, 0)
        union = areas[i] + areas[rest] - inter
        drop = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0) > iou_thres
        if cls is not None:
            drop &= cls[rest] == cls[i]
        order = rest[~drop]
    return np.asarray(keep, np.int64)
