"""Carrying the cloud's boxes forward between escalations.

An escalation buys the cloud's view of one frame. Objects that only the cloud sees (far,
small, faint) usually stay in view for many frames, so instead of forgetting them on the
next frame the edge *tracks* each box the cloud returned and keeps publishing it until the
object is lost or the answer is too old. This is how Glimpse (Chen et al., SenSys 2015)
and Liu et al. ("Edge Assisted Real-time Object Detection for Mobile Augmented Reality",
MobiCom 2019) keep a server's detections alive on the device between offloaded frames;
docs/design/escalation.md#carrying-the-clouds-answer.

The tracker is deliberately small and cheap (microseconds per box):

* :func:`seed` cuts a grey template of each cloud box from the escalated frame, shrunk by
  the smallest whole factor that brings its longer side to at most ``template_px`` pixels
  (a far digit keeps its full resolution, a near one is matched coarsely; whole factors
  keep OpenCV's area resampling on its fast path, several times cheaper than a fractional
  scale);
* :func:`step` looks for each template in a window around the box's last position (its
  size x ``search``, at least ``min_search_px``, widened by the frames elapsed) with
  normalised cross-correlation; a best match below ``min_match`` means the object left,
  was occluded or changed: the box is dropped, never guessed. After ``frames`` frames the
  whole answer is dropped.
* :func:`combine` adds the carried boxes to the edge's: a carried box that an edge box
  overlaps (IoU >= ``iou``, any class) is the same object: the edge's fresh box with the
  cloud's class (the bigger model tells look-alikes apart); the rest are kept as they are,
  but for the edge's boxes under ``CarryConfig.edge_floor`` (policy ``merge.carryEdgeFloor``)
  where an answer in force looked: the cloud saw that place and found nothing there, as the
  merge's ``edgeFloor`` rules on the escalated frame itself.

Which answers are carried (``CarryConfig.scope``, policy ``merge.carryScope``): with
``answer`` a newer answer replaces the older one's boxes; with ``regions`` a newer answer
that saw only some regions of the frame (a region payload) replaces the older boxes only
inside those regions and the older ones go on being carried elsewhere, each until its own
``frames`` run out (:func:`stacked`, :func:`layered`; the regions test is the merge's,
:func:`edgewise.merging.outside_regions`). So a whole frame's far objects are not forgotten
at the next region answer, which looked only around the edge's uncertain boxes and motion.

Pure functions over an immutable :class:`CarryState`; the edge pipeline and the
evaluation (:mod:`edgewise_tools.evaluation.frames`) both use them, so what is measured is
what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, TypeVar

import cv2
import numpy as np

from edgewise.detections import Detections
from edgewise.hardness.tracking import greedy_match, iou_matrix
from edgewise.merging import outside_regions, unify_names

#: ``Detections.sources`` tag of a box the edge keeps from an earlier cloud answer.
CARRIED = "carried"

#: what a newer answer replaces (module doc): all the carried boxes, or those in its regions
SCOPES = ("answer", "regions")

#: answers carried at once per stream under scope ``regions`` (the oldest go first)
MAX_LAYERS = 8

_T = TypeVar("_T")


@dataclass(frozen=True)
class CarryConfig:
    """How the cloud's boxes are carried; ``frames`` and ``min_match`` come from the policy
    (``spec.merge.carryFrames`` / ``carryMatch``, :meth:`edgewise.policy.schema.Merge.carry`).

    Attributes:
        frames: frames after the cloud's answer during which its boxes are carried (0: off).
        min_match: normalised cross-correlation in [-1, 1] below which a box is lost.
        scope: what a newer answer replaces (:data:`SCOPES`, module doc).
        template_px: the longer side of a template, in pixels, at most.
        search: the search window's margin around the box, as a fraction of its longer side.
        min_search_px: the margin's floor in frame pixels.
        edge_floor: between answers, an edge box no carried box overlaps, whose centre lies
            where an answer in force looked, is kept only with a score >= this (0: all kept;
            ``Merge.edge_floor`` when the policy's ``merge.carryEdgeFloor`` is on).
    """

    frames: int
    min_match: float
    scope: str = "answer"
    template_px: int = 32
    search: float = 0.5
    min_search_px: float = 6.0
    edge_floor: float = 0.0

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"carry scope {self.scope!r}: use one of {', '.join(SCOPES)}")

    @property
    def enabled(self) -> bool:
        return self.frames > 0


@dataclass(frozen=True)
class _Track:
    box: Tuple[float, float, float, float]
    template: np.ndarray  # grey, shrunk ``factor`` times
    factor: int
    class_id: int
    score: float


@dataclass(frozen=True)
class CarryState:
    """The boxes carried from one cloud answer, ``age`` frames after it, in the pixels of
    frames of ``size`` (height, width; None: not known)."""

    tracks: Tuple[_Track, ...] = ()
    names: Tuple[str, ...] = ()
    age: int = 0
    size: Optional[Tuple[int, int]] = None

    def __len__(self) -> int:
        return len(self.tracks)

    def detections(self) -> Detections:
        """The carried boxes, in frame pixels (source ``carried``)."""
        n = len(self.tracks)
        return Detections(
            boxes=np.asarray([t.box for t in self.tracks], np.float32).reshape(n, 4),
            scores=np.asarray([t.score for t in self.tracks], np.float32),
            class_ids=np.asarray([t.class_id for t in self.tracks], np.int32),
            names=self.names, source=CARRIED,
        )


def grey(patch: np.ndarray) -> np.ndarray:
    """``patch`` in grey (BGR converted, grey as it is): what templates are cut from and matched on."""
    return cv2.cvtColor(patch, cv2.COLOR_BGR2GRAY) if patch.ndim == 3 else patch


def _shrunk(patch: np.ndarray, factor: int) -> np.ndarray:
    """``patch`` (trimmed to whole multiples of ``factor``) shrunk ``factor`` times by area."""
    if factor == 1:
        return patch
    h, w = (patch.shape[0] // factor) * factor, (patch.shape[1] // factor) * factor
    return cv2.resize(patch[:h, :w], (w // factor, h // factor), interpolation=cv2.INTER_AREA)


def seed(image: np.ndarray, cloud: Detections, cfg: CarryConfig) -> CarryState:
    """Templates of the cloud's boxes cut from the frame the cloud saw (BGR or grey)."""
    if not cfg.enabled:
        return CarryState(names=cloud.names)
    h, w = image.shape[:2]
    tracks: List[_Track] = []
    for box, cid, score in zip(cloud.boxes.astype(np.float64), cloud.class_ids, cloud.scores):
        x0, y0 = max(0, int(round(box[0]))), max(0, int(round(box[1])))
        x1, y1 = min(w, int(round(box[2]))), min(h, int(round(box[3])))
        if x1 - x0 < 3 or y1 - y0 < 3:
            continue  # (almost) outside the frame: nothing to track
        factor = max(1, -(-max(x1 - x0, y1 - y0) // cfg.template_px))
        tpl = _shrunk(grey(image[y0:y1, x0:x1]), factor)
        if tpl.shape[0] < 3 or tpl.shape[1] < 3 or float(tpl.std()) < 1e-3:
            continue  # a flat patch matches anywhere
        tracks.append(_Track((float(x0), float(y0), float(x1), float(y1)), tpl, factor, int(cid), float(score)))
    return CarryState(tuple(tracks), cloud.names, 0, (h, w))


def _follow(t: _Track, image: np.ndarray, cfg: CarryConfig, frames: int) -> Optional[_Track]:
    h, w = image.shape[:2]
    x0, y0, x1, y1 = t.box
    margin = max(cfg.min_search_px, cfg.search * max(x1 - x0, y1 - y0)) * max(1, frames)
    wx0, wy0 = int(max(0.0, x0 - margin)), int(max(0.0, y0 - margin))
    wx1, wy1 = int(min(float(w), x1 + margin)), int(min(float(h), y1 + margin))
    if wx1 <= wx0 or wy1 <= wy0:
        return None
    window = _shrunk(grey(image[wy0:wy1, wx0:wx1]), t.factor)
    th, tw = t.template.shape[:2]
    if window.shape[0] < th or window.shape[1] < tw:
        return None  # pushed against the frame's edge: leaving the view
    res = cv2.matchTemplate(window, t.template, cv2.TM_CCOEFF_NORMED)
    _, best, _, at = cv2.minMaxLoc(res)
    if not np.isfinite(best) or best < cfg.min_match:
        return None
    bw, bh = x1 - x0, y1 - y0
    # the match's place at template scale, back in frame pixels (kept inside the frame: the
    # template covers the box trimmed to whole multiples of the factor, so a match at the
    # window's edge can put the box a few pixels past the border)
    nx = min(max(0.0, wx0 + at[0] * t.factor), w - bw)
    ny = min(max(0.0, wy0 + at[1] * t.factor), h - bh)
    return _Track((nx, ny, nx + bw, ny + bh), t.template, t.factor, t.class_id, t.score)


def fits(state: CarryState, image: np.ndarray) -> bool:
    """Whether the answer behind ``state`` was for frames of ``image``'s size (unknown: yes): one
    for another size (a stream that changed resolution) carries nothing onto it, and where it
    looked is in the old frame's pixels (:func:`step`, ``merge.carryEdgeFloor``)."""
    return state.size in (None, image.shape[:2])


def step(state: CarryState, image: np.ndarray, cfg: CarryConfig, frames: int = 1) -> CarryState:
    """The state ``frames`` frames later, on ``image``: each box found again or dropped; all
    of them dropped once the answer is older than ``cfg.frames``, or when ``image`` is of
    another size than the frame the answer was for (a stream that changed resolution: its
    boxes are in the old frame's pixels, its templates at the old scale)."""
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    age = state.age + frames
    if age > cfg.frames or not state.tracks or not fits(state, image):
        return CarryState((), state.names, age, state.size)
    kept = tuple(k for k in (_follow(t, image, cfg, frames) for t in state.tracks) if k is not None)
    return CarryState(kept, state.names, age, state.size)


#: where the answers in force looked: each one's regions (None: the whole frame); empty: no
#: answer is in force
Looked = Sequence[Optional[np.ndarray]]


def looked_at(boxes: np.ndarray, looked: Looked) -> np.ndarray:
    """Mask of ``boxes`` ([N, 4]) whose centre lies where one of the answers in force looked
    (the merge's test, :func:`edgewise.merging.outside_regions`)."""
    seen = np.zeros(len(boxes), bool)
    for regions in looked:
        seen |= ~outside_regions(boxes, regions) if regions is not None else True
    return seen


def combine(edge: Detections, carried: Detections, iou: float = 0.5, edge_floor: float = 0.0,
            looked: Looked = ()) -> Detections:
    """The edge's boxes with the carried ones (module doc). Names are unified like a merge.
    With ``edge_floor`` > 0 an edge box no carried box overlaps is dropped when its score is
    under the floor and its centre lies where an answer in force looked (``looked``): the
    cloud saw that place and did not find it, as the merge's ``edgeFloor`` rules on the
    escalated frame."""
    doubtful = np.zeros(len(edge), bool)
    if edge_floor > 0 and looked and len(edge):
        doubtful = looked_at(edge.boxes.astype(np.float64).reshape(-1, 4), looked) & ~edge.scored_within(
            edge_floor, np.inf)
    if len(carried) == 0:
        return edge.select(~doubtful) if doubtful.any() else edge
    names, e_ids, c_ids = unify_names(edge, carried)
    eb = edge.boxes.astype(np.float64).reshape(-1, 4)
    cb = carried.boxes.astype(np.float64).reshape(-1, 4)
    matched_e = np.zeros(len(eb), bool)
    matched_c = np.zeros(len(cb), bool)
    boxes: List[np.ndarray] = []
    scores: List[float] = []
    ids: List[int] = []
    srcs: List[str] = []
    if len(eb):
        for ei, ci in greedy_match(iou_matrix(eb, cb), iou):
            matched_e[ei] = matched_c[ci] = True
            boxes.append(eb[ei])
            scores.append(max(float(edge.scores[ei]), float(carried.scores[ci])))
            ids.append(int(c_ids[ci]))
            srcs.append("fused")
    for k in np.flatnonzero(~matched_c):
        boxes.append(cb[k])
        scores.append(float(carried.scores[k]))
        ids.append(int(c_ids[k]))
        srcs.append(CARRIED)
    edge_src = edge.sources
    for k in np.flatnonzero(~matched_e & ~doubtful):
        boxes.append(eb[k])
        scores.append(float(edge.scores[k]))
        ids.append(int(e_ids[k]))
        srcs.append(edge_src[k] if edge_src is not None else (edge.source or "edge"))
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    return Detections(
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4)[order],
        scores=np.asarray(scores, np.float32)[order],
        class_ids=np.asarray(ids, np.int32)[order],
        names=names, source="merged", sources=tuple(srcs[int(i)] for i in order),
        missed_objectness=float(edge.missed_objectness),
    )


def stacked(layers: Sequence[_T], new: _T, regions: Optional[np.ndarray], cfg: CarryConfig) -> List[_T]:
    """The answers a stream carries, newest first, once ``new`` (an answer that saw
    ``regions`` of its frame; None: the whole frame) comes in over ``layers``: ``new`` alone
    under scope ``answer`` or after a whole frame, else ``new`` over the older ones (at most
    :data:`MAX_LAYERS`)."""
    if cfg.scope == "answer" or regions is None:
        return [new]
    return [new, *layers[:MAX_LAYERS - 1]]


def layered(layers: Sequence[Tuple[Detections, Optional[np.ndarray]]]) -> Detections:
    """The carried boxes of several answers, newest first, each with the regions its
    request covered (None: the whole frame): an answer's boxes count only where no newer
    answer looked (centre outside every newer answer's regions). Source ``carried``."""
    if not layers:
        return Detections.empty(source=CARRIED)
    out, looked = layers[0][0], [layers[0][1]]
    for dets, regions in layers[1:]:
        if any(r is None for r in looked):
            break
        boxes = dets.boxes.astype(np.float64).reshape(-1, 4)
        keep = np.ones(len(dets), bool)
        for r in looked:
            keep &= outside_regions(boxes, r)
        looked.append(regions)
        if not keep.any():
            continue
        older = dets.select(keep)
        names, older_ids, ids = unify_names(older, out)
        out = Detections(
            boxes=np.concatenate([out.boxes, older.boxes]).astype(np.float32),
            scores=np.concatenate([out.scores, older.scores]).astype(np.float32),
            class_ids=np.concatenate([ids, older_ids]).astype(np.int32),
            names=names, source=CARRIED,
        )
    return out
