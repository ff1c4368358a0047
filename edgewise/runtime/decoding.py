"""YOLOv5 head decode: raw ``[B, N, 5+nc]`` output -> ``Detections`` per image.

Follows Ultralytics YOLOv5 ``utils/general.py::non_max_suppression`` (v7.0):
candidates are first filtered on objectness (``xc = pred[..., 4] > conf_thres``),
then ``conf = obj * cls``, best class (or every class above threshold with
``multi_label``), ``conf > conf_thres``, at most ``max_nms`` boxes by score,
class-aware NMS, at most ``max_det`` kept. Boxes are ``xywh`` in network-input
pixels (the Detect layer of an Ultralytics export already applies the sigmoid
and the grid/anchor transform). Kept boxes are mapped back to source pixels
with the letterbox meta and clipped.

Beyond YOLOv5 we keep, per box, the per-class scores ``obj * cls`` and the
objectness (hardness signals need them), and compute ``missed_objectness``:
the highest objectness among head rows that were *not* kept and do not
overlap any kept box with IoU >= 0.5 (see ``Detections``).

Only the candidate subset is ever copied; no Python loop touches candidates.

A head row whose box is not finite or has no positive width and height (a float16 engine
that overflowed on one frame: the model check, ``metadata.check_output``, refuses a model
that does it on the frames it is shown) is no candidate and no missed object; a score
``obj * cls`` a little over 1 (each factor within the check's tolerance) is clipped to 1, so
every detection decoded is one the wire accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from edgewise.detections import Detections
from edgewise.errors import ModelError
from edgewise.runtime.letterbox import LetterboxMeta, scale_boxes
from edgewise.runtime.nms import nms

FIRST_CHUNK = 512


@dataclass(frozen=True)
class DecodeParams:
    """Thresholds of the decode stage.

    Attributes:
        conf_thres: minimum objectness, then minimum ``obj * cls`` (YOLOv5: 0.25).
        iou_thres: NMS IoU threshold (YOLOv5: 0.45).
        max_det: boxes kept per image after NMS (YOLOv5: 300).
        multi_label: one box per class above threshold (YOLOv5 val) instead of the best class.
        agnostic: class-agnostic NMS.
        max_nms: boxes entering NMS at most, best scores first (YOLOv5: 30000).
        missed_iou: a non-kept row overlapping a kept box with IoU >= this is not "missed".
        missed_floor: rows with objectness <= this are ignored for ``missed_objectness``.
    """

    conf_thres: float = 0.25
    iou_thres: float = 0.45
    max_det: int = 300
    multi_label: bool = False
    agnostic: bool = False
    max_nms: int = 30000
    missed_iou: float = 0.5
    missed_floor: float = 0.01

    def __post_init__(self) -> None:
        if not 0.0 <= self.conf_thres <= 1.0:
            raise ValueError(f"conf_thres must be in [0, 1], got {self.conf_thres}")
        if not 0.0 <= self.iou_thres <= 1.0:
            raise ValueError(f"iou_thres must be in [0, 1], got {self.iou_thres}")
        if self.max_det < 1:
            raise ValueError(f"max_det must be >= 1, got {self.max_det}")
        if self.max_nms < 1:
            raise ValueError(f"max_nms must be >= 1, got {self.max_nms}")


def xywh2xyxy(xywh: np.ndarray) -> np.ndarray:
    """Centre/size boxes ``[N, 4]`` -> corner boxes (new float32 array)."""
    out = np.empty(xywh.shape, np.float32)
    half = xywh[:, 2:4] * 0.5
    np.subtract(xywh[:, 0:2], half, out=out[:, 0:2])
    np.add(xywh[:, 0:2], half, out=out[:, 2:4])
    return out


def _missed_objectness(
    pred: np.ndarray, obj: np.ndarray, kept_rows: np.ndarray, kept_xyxy: np.ndarray, p: DecodeParams
) -> float:
    """Max objectness of rows not kept and not overlapping a kept box (IoU >= missed_iou)."""
    above = obj > p.missed_floor
    above[kept_rows] = False
    rows = np.flatnonzero(above)
    if rows.size == 0:
        return 0.0
    vals = obj[rows].astype(np.float32)
    if kept_xyxy.shape[0] == 0:
        best = int(vals.argmax())
        if _usable_boxes(pred[rows[best : best + 1], :4])[0]:
            return float(vals[best])
        usable = _usable_boxes(pred[rows, :4])  # rare: the top row holds no box
        return float(vals[usable].max()) if usable.any() else 0.0
    # Rows in descending objectness: most high-objectness rows sit on kept
    # boxes, so check the top FIRST_CHUNK rows (found by an O(R) partial sort)
    # in one [chunk x K] IoU pass; only if all overlap, walk the rest in order.
    chunk = FIRST_CHUNK
    if rows.size <= chunk:
        first = np.argsort(-vals, kind="stable")
    else:
        first = np.argpartition(-vals, chunk - 1)[:chunk]
        first = first[np.argsort(-vals[first], kind="stable")]
    found = _first_free(pred, rows, vals, first, kept_xyxy, p.missed_iou)
    if found is not None or rows.size <= chunk:
        return 0.0 if found is None else found
    # Ties at the chunk boundary: the rest is everything not in ``first``.
    mask = np.ones(rows.size, bool)
    mask[first] = False
    rest = np.flatnonzero(mask)
    rest = rest[np.argsort(-vals[rest], kind="stable")]
    for start in range(0, rest.size, 4096):
        found = _first_free(pred, rows, vals, rest[start : start + 4096], kept_xyxy, p.missed_iou)
        if found is not None:
            return found
    return 0.0


def _usable_boxes(xywh: np.ndarray) -> np.ndarray:
    """Which rows of ``xywh`` [M,4] hold a box: finite, with positive width and height."""
    return np.asarray(np.isfinite(xywh).all(axis=1) & (xywh[:, 2] > 0) & (xywh[:, 3] > 0))


def _first_free(
    pred: np.ndarray,
    rows: np.ndarray,
    vals: np.ndarray,
    sel: np.ndarray,
    kept_xyxy: np.ndarray,
    missed_iou: float,
) -> Optional[float]:
    """Objectness of the first row of ``sel`` (already sorted) holding a box that overlaps no
    kept box."""
    xywh = pred[rows[sel], :4].astype(np.float32)
    free = np.flatnonzero(_usable_boxes(xywh) & ~_overlaps_any(xywh2xyxy(xywh), kept_xyxy, missed_iou))
    return float(vals[sel[free[0]]]) if free.size else None


def _overlaps_any(a: np.ndarray, b: np.ndarray, thres: float) -> np.ndarray:
    """For each box of ``a`` [M,4]: IoU >= ``thres`` with some box of ``b`` [K,4].

    Tested as ``inter * (1 + t) >= t * (area_a + area_b)`` on [M,K] float32
    planes (no division, no [M,K,2] temporaries).
    """
    t = np.float32(thres)
    ax1, ay1, ax2, ay2 = (a[:, i : i + 1] for i in range(4))
    bx1, by1, bx2, by2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    w = np.minimum(ax2, bx2)
    w -= np.maximum(ax1, bx1)
    np.maximum(w, 0, out=w)
    h = np.minimum(ay2, by2)
    h -= np.maximum(ay1, by1)
    np.maximum(h, 0, out=h)
    inter = np.multiply(w, h, out=w)
    inter *= np.float32(1.0) + t
    aa = np.maximum(a[:, 2] - a[:, 0], 0) * np.maximum(a[:, 3] - a[:, 1], 0) * t
    ab = np.maximum(bx2 - bx1, 0) * np.maximum(by2 - by1, 0) * t
    over = inter >= np.add(aa[:, None], ab[None, :], out=h)
    over &= inter > 0  # two empty boxes do not overlap
    return np.asarray(over.any(axis=1))


def decode_one(
    pred: np.ndarray,
    meta: Optional[LetterboxMeta],
    names: Sequence[str],
    params: DecodeParams = DecodeParams(),
    source: str = "",
) -> Detections:
    """Decode one image's head output ``[N, 5+nc]`` into source-pixel detections.

    ``meta`` maps boxes back to source pixels (and clips); ``None`` leaves them
    in network-input pixels.
    """
    if pred.ndim != 2 or pred.shape[1] < 6:
        raise ValueError(f"head output must be [N, 5+nc] with nc >= 1, got {pred.shape}")
    nc = pred.shape[1] - 5
    p = params
    # YOLOv5 non_max_suppression: xc = prediction[..., 4] > conf_thres (candidates).
    obj = np.ascontiguousarray(pred[:, 4])  # one strided pass over the head
    cand_rows = np.flatnonzero(obj > p.conf_thres)
    cand_rows = cand_rows[_usable_boxes(pred[cand_rows, :4])]
    cand = pred[cand_rows].astype(np.float32, copy=False)
    cls_scores = cand[:, 5:] * cand[:, 4:5]  # conf = obj_conf * cls_conf
    np.minimum(cls_scores, np.float32(1.0), out=cls_scores)
    if p.multi_label:
        ii, jj = np.nonzero(cls_scores > p.conf_thres)
        conf = cls_scores[ii, jj]
    else:
        jj = cls_scores.argmax(axis=1)
        conf = cls_scores[np.arange(cls_scores.shape[0]), jj]
        ii = np.flatnonzero(conf > p.conf_thres)
        jj = jj[ii]
        conf = conf[ii]
    if conf.size > p.max_nms:  # sort by confidence and keep the best max_nms
        top = np.argsort(-conf, kind="stable")[: p.max_nms]
        ii, jj, conf = ii[top], jj[top], conf[top]
    boxes = xywh2xyxy(cand[ii, :4])
    keep = nms(boxes, conf, None if p.agnostic else jj, p.iou_thres, p.max_det)
    kept_boxes = boxes[keep]
    kept_rows = cand_rows[ii[keep]]
    missed = _missed_objectness(pred, obj, kept_rows, kept_boxes, p)
    out_boxes = kept_boxes.copy()
    if meta is not None:
        scale_boxes(out_boxes, meta, clip=True)
    return Detections(
        boxes=out_boxes,
        scores=conf[keep].astype(np.float32, copy=False),
        class_ids=jj[keep].astype(np.int32),
        class_scores=cls_scores[ii[keep]].reshape(-1, nc),
        objectness=cand[ii[keep], 4].astype(np.float32, copy=False),
        names=tuple(names),
        source=source,
        missed_objectness=missed,
    )


def decode(
    raw: np.ndarray,
    metas: Sequence[Optional[LetterboxMeta]],
    names: Sequence[str],
    params: DecodeParams = DecodeParams(),
    source: str = "",
) -> List[Detections]:
    """Decode a batch ``[B, N, 5+nc]``; ``metas[i]`` maps image ``i`` back to source pixels."""
    if raw.ndim != 3:
        raise ValueError(f"head output must be [B, N, 5+nc], got shape {raw.shape}")
    if len(metas) != raw.shape[0]:
        raise ValueError(f"got {len(metas)} letterbox metas for a batch of {raw.shape[0]}")
    if names and raw.shape[2] != 5 + len(names):
        # the model disagrees with its own class names: a model error (ModelError is a ValueError)
        raise ModelError(
            f"head output has {raw.shape[2]} columns but {len(names)} class names "
            f"(expected 5 + nc = {5 + len(names)}); fix the names metadata or re-export the model"
        )
    return [decode_one(raw[i], metas[i], names, params, source) for i in range(raw.shape[0])]
