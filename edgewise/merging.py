"""Merge the cloud's detections of a frame with the edge's.

Two strategies (policy ``spec.merge.strategy``):

* ``replace``: the cloud boxes are the result (what Sedna and Rocket do).
* ``fuse``: weighted box fusion (WBF; Solovyev, Wang & Gabruseva, "Weighted
  boxes fusion: ensembling boxes from different object detection models",
  arXiv:1910.13302, 2019) of edge/cloud pairs of the same class whose IoU is
  >= ``iou``: the fused box is the confidence-weighted average of the two
  boxes' coordinates and its score the (model-weighted) average of the two
  scores. Unmatched cloud boxes are kept (the big model found something the
  small one missed); unmatched edge boxes are kept only when their score is >=
  ``edge_floor`` (the big model looked and did not confirm a low-confidence box).

Every output box says which model produced it in ``Detections.sources``:
``"edge"``, ``"cloud"`` or ``"fused"``.

Classes are matched by *name* when both sides carry names (the edge and cloud
models may order their classes differently); output names are the cloud's
names followed by edge-only names. When a crop payload was sent, pass the crop
``regions``: edge boxes whose centre lies outside every region were never seen
by the cloud and are kept as they are, whatever the strategy. An edge box a region cuts
(centre inside, part outside) is matched by the part the cloud saw with a cloud box cut at the
region's border where the edge box crosses it (the worker clips the cloud's box of that
object to the region); the fused box keeps the edge's sides that lie beyond the region.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np

from edgewise.detections import Detections
from edgewise.hardness.tracking import greedy_match, iou_matrix

STRATEGIES = ("replace", "fuse")
#: How near a region's border (pixels) a cloud box's side must lie to be taken as cut there,
#: as the worker clips a box found in a region to it (a model's box of a cut object may also
#: stop a pixel or two short of the border)
CUT_TOLERANCE_PX = 4.0


def unify_names(edge: Detections, cloud: Detections) -> Tuple[Tuple[str, ...], np.ndarray, np.ndarray]:
    """(output names, edge class ids remapped, cloud class ids remapped)."""
    if not edge.names or not cloud.names:
        return cloud.names or edge.names, edge.class_ids.astype(np.int32), cloud.class_ids.astype(np.int32)
    names: List[str] = list(cloud.names)
    index: Dict[str, int] = {n: i for i, n in enumerate(names)}
    remap = np.zeros(len(edge.names), np.int32)
    for i, n in enumerate(edge.names):
        if n not in index:
            index[n] = len(names)
            names.append(n)
        remap[i] = index[n]
    cids = edge.class_ids.astype(np.int64)
    ok = (cids >= 0) & (cids < len(remap))
    edge_ids = np.where(ok, remap[np.clip(cids, 0, max(0, len(remap) - 1))], -1).astype(np.int32)
    return tuple(names), edge_ids, cloud.class_ids.astype(np.int32)


def _centres_in(boxes: np.ndarray, r: np.ndarray) -> np.ndarray:
    """[N, M] whether box i's centre lies in region j (borders included)."""
    cx = (boxes[:, 0] + boxes[:, 2]) / 2.0
    cy = (boxes[:, 1] + boxes[:, 3]) / 2.0
    inside: np.ndarray = (
        (cx[:, None] >= r[None, :, 0]) & (cx[:, None] <= r[None, :, 2])
        & (cy[:, None] >= r[None, :, 1]) & (cy[:, None] <= r[None, :, 3])
    )
    return inside


def outside_regions(boxes: np.ndarray, regions: Optional[np.ndarray]) -> np.ndarray:
    """Mask of boxes whose centre is outside every region (all False without regions: the
    whole frame was seen). The one test of "the cloud did not look there", for the merge and
    for carrying (:func:`edgewise.carrying.layered`)."""
    if regions is None or len(boxes) == 0:
        return np.zeros(len(boxes), bool)
    r = np.asarray(regions, np.float64).reshape(-1, 4)
    if len(r) == 0:
        return np.ones(len(boxes), bool)
    out: np.ndarray = ~np.any(_centres_in(boxes, r), axis=1)
    return out


def seen_parts(boxes: np.ndarray, regions: Optional[np.ndarray]) -> np.ndarray:
    """Each box cut to the first region holding its centre: the part of it the cloud saw, as a
    worker clips a box found in a region to that region (:func:`edgewise.regions.tiles_to_frame`).
    A box no region holds, or every box without regions (the whole frame), is left whole."""
    out = np.array(boxes, np.float64).reshape(-1, 4)
    r = np.asarray(regions if regions is not None else (), np.float64).reshape(-1, 4)
    if len(out) == 0 or len(r) == 0:
        return out
    inside = _centres_in(out, r)
    held = inside.any(axis=1)
    reg = r[inside.argmax(axis=1)[held]]  # the first region holding each centre
    out[held] = np.clip(out[held], reg[:, [0, 1, 0, 1]], reg[:, [2, 3, 2, 3]])
    return out


def _fused_pairs(eb: np.ndarray, e_ids: np.ndarray, cb: np.ndarray, c_ids: np.ndarray, unseen: np.ndarray,
                 regions: Optional[np.ndarray], iou: float
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[Tuple[int, int]]]:
    """The (edge, cloud) pairs ``fuse`` fuses: same class, IoU >= ``iou``, greedily, edge boxes
    the cloud did not see (``unseen``) left out. A cloud box of an object a region cuts is cut
    there too (the worker clips it to the region): it lies on the region's border wherever the
    edge box crosses it, and such a pair is matched by the part of the edge box the cloud saw.
    Also returned: that part (``seen``), which of its sides the region cut (``cut`` [N, 4]) and
    which pairs are matched by it (``by_part`` [N, M])."""
    seen = seen_parts(eb, regions)
    cut = seen != eb
    on_border = (~cut[:, None, :] | (np.abs(seen[:, None, :] - cb[None, :, :]) <= CUT_TOLERANCE_PX)).all(axis=2)
    by_part = on_border & cut.any(axis=1)[:, None]
    if not len(eb) or not len(cb):
        return seen, cut, by_part, []
    ious = np.where(by_part, iou_matrix(seen, cb), iou_matrix(eb, cb))
    ious[e_ids[:, None] != c_ids[None, :]] = 0.0  # same class only
    ious[unseen] = 0.0
    return seen, cut, by_part, [(int(e), int(c)) for e, c in greedy_match(ious, iou)]


def carried_boxes(edge: Detections, cloud: Detections, strategy: str, iou: float = 0.55,
                  regions: Optional[np.ndarray] = None) -> Detections:
    """The cloud's boxes as the edge carries them into the stream's next frames
    (:mod:`edgewise.carrying`). Under ``fuse``, a box a region cut is given back the sides of
    the edge box it is fused with, where the region cut it: the fused box of the escalated frame
    keeps them, and a carried box cut at the border overlapped the edge's box of the same object
    too little to be taken for it, so the next frames showed that object twice. Under ``replace``
    the cloud's boxes are the result, cut or not."""
    if strategy != "fuse" or not len(edge) or not len(cloud) or regions is None:
        return cloud
    _, e_ids, c_ids = unify_names(edge, cloud)
    eb = edge.boxes.astype(np.float64).reshape(-1, 4)
    cb = cloud.boxes.astype(np.float64).reshape(-1, 4)
    _, cut, by_part, pairs = _fused_pairs(eb, e_ids, cb, c_ids, outside_regions(eb, regions), regions, iou)
    boxes = cb.copy()
    for ei, ci in pairs:
        if by_part[ei, ci]:
            boxes[ci] = np.where(cut[ei], eb[ei], cb[ci])
    return dataclasses.replace(cloud, boxes=boxes.astype(np.float32))


def merge(
    edge: Detections,
    cloud: Detections,
    strategy: str,
    iou: float = 0.55,
    edge_floor: float = 0.5,
    edge_weight: float = 1.0,
    cloud_weight: float = 1.0,
    regions: Optional[np.ndarray] = None,
) -> Detections:
    """The frame's final detections from the edge's and the cloud's (see module doc).

    ``edge_weight``/``cloud_weight`` are WBF's per-model weights (1/1 = plain
    WBF). ``regions`` [M,4] xyxy are the crops the cloud saw (None = full frame).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"merge strategy must be one of {STRATEGIES}, got {strategy!r}")
    names, e_ids, c_ids = unify_names(edge, cloud)
    eb = edge.boxes.astype(np.float64).reshape(-1, 4)
    cb = cloud.boxes.astype(np.float64).reshape(-1, 4)
    es = edge.scores.astype(np.float64)
    cs = cloud.scores.astype(np.float64)
    unseen = outside_regions(eb, regions)

    out_boxes: List[np.ndarray] = []
    out_scores: List[float] = []
    out_ids: List[int] = []
    out_src: List[str] = []

    def emit(box: np.ndarray, score: float, cid: int, src: str) -> None:
        out_boxes.append(box)
        out_scores.append(score)
        out_ids.append(cid)
        out_src.append(src)

    matched_e = np.zeros(len(eb), bool)
    matched_c = np.zeros(len(cb), bool)
    if strategy == "fuse":
        seen, cut, by_part, pairs = _fused_pairs(eb, e_ids, cb, c_ids, unseen, regions, iou)
        for ei, ci in pairs:
            # weights are never negative, whatever the inputs: a negative score would make the
            # "average" an extrapolation (a box outside both, or inverted)
            we = max(es[ei], 0.0) * max(edge_weight, 0.0)
            wc = max(cs[ci], 0.0) * max(cloud_weight, 0.0)
            tot = we + wc
            e = seen[ei] if by_part[ei, ci] else eb[ei]
            box = (e * we + cb[ci] * wc) / tot if tot > 0 else (e + cb[ci]) / 2.0
            box = np.where(cut[ei] & by_part[ei, ci], eb[ei], box)
            score = (es[ei] * edge_weight + cs[ci] * cloud_weight) / (edge_weight + cloud_weight)
            emit(box, float(score), int(c_ids[ci]), "fused")
            matched_e[ei] = True
            matched_c[ci] = True
    for ci in range(len(cb)):
        if not matched_c[ci]:
            emit(cb[ci], float(cs[ci]), int(c_ids[ci]), "cloud")
    for ei in range(len(eb)):
        if matched_e[ei]:
            continue
        keep = bool(unseen[ei]) or (strategy == "fuse" and es[ei] >= edge_floor)
        if keep:
            emit(eb[ei], float(es[ei]), int(e_ids[ei]), "edge")

    n = len(out_scores)
    order = np.argsort(-np.asarray(out_scores, np.float64), kind="stable") if n else np.zeros(0, int)
    boxes = np.asarray(out_boxes, np.float32).reshape(-1, 4)[order]
    return Detections(
        boxes=boxes,
        scores=np.asarray(out_scores, np.float32)[order],
        class_ids=np.asarray(out_ids, np.int32)[order],
        names=names,
        source="merged",
        sources=tuple(out_src[int(i)] for i in order),
        missed_objectness=float(cloud.missed_objectness),
    )
