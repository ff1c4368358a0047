"""A tiny greedy IoU tracker whose only job is the ``tracker_disagreement`` signal.

Temporal inconsistency as an escalation trigger follows Glimpse (SenSys'15,
trigger frames when tracking and detection disagree) and Liu et al. (MobiCom'19,
tracking + adaptive offload); see ``docs/design/escalation.md#hardness-signals``. We do
not need identities to be right, only a cheap, noise-resistant answer to "did
boxes appear or vanish compared with what the previous frames showed?".

Rules (all pure; the state is an immutable value returned to the caller):

* Matching is greedy by descending IoU, class-agnostic, IoU >= ``match_iou``.
* A track is *confirmed* after ``min_hits`` matched frames; only confirmed
  tracks count as "vanished" so a one-frame flicker is not counted twice.
* An unmatched track coasts for up to ``max_age`` frames before it is dropped,
  so a box missing in one frame and back in the next matches its old track and
  is not counted as "appearing".
* A detection that matches no live track "appears"; a confirmed track that was
  matched in the previous frame and is unmatched now "vanishes" (counted once,
  on the first frame it is missing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np


def _empty_boxes() -> np.ndarray:
    return np.zeros((0, 4), np.float64)


def _empty_ints() -> np.ndarray:
    return np.zeros((0,), np.int64)


@dataclass(frozen=True)
class TrackerState:
    """Tracker memory carried from frame to frame.

    Treated as an immutable value: every step builds new arrays. ``boxes``
    [T,4] xyxy of the live tracks, ``hits`` matched frames, ``misses``
    consecutive unmatched frames, ``frames`` frames seen, ``size`` the (width, height)
    of the frames its boxes are in (None: not known).
    """

    boxes: np.ndarray = field(default_factory=_empty_boxes)
    hits: np.ndarray = field(default_factory=_empty_ints)
    misses: np.ndarray = field(default_factory=_empty_ints)
    frames: int = 0
    size: Optional[Tuple[int, int]] = None

    def __len__(self) -> int:
        return int(self.hits.shape[0])


@dataclass(frozen=True)
class TrackUpdate:
    """Result of one tracker step: counts for the signal and the next state."""

    appeared: int
    vanished: int
    state: TrackerState


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every xyxy box in ``a`` [N,4] against every box in ``b`` [M,4] -> [N,M]."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)), np.float64)
    a = a.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    ix1 = np.maximum(a[:, None, 0], b[None, :, 0])
    iy1 = np.maximum(a[:, None, 1], b[None, :, 1])
    ix2 = np.minimum(a[:, None, 2], b[None, :, 2])
    iy2 = np.minimum(a[:, None, 3], b[None, :, 3])
    # np.maximum, not np.clip: clip costs ~10x more per call on small arrays.
    inter = np.maximum(ix2 - ix1, 0.0) * np.maximum(iy2 - iy1, 0.0)
    area_a = np.maximum(a[:, 2] - a[:, 0], 0.0) * np.maximum(a[:, 3] - a[:, 1], 0.0)
    area_b = np.maximum(b[:, 2] - b[:, 0], 0.0) * np.maximum(b[:, 3] - b[:, 1], 0.0)
    union = area_a[:, None] + area_b[None, :] - inter
    out: np.ndarray = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
    return out


def greedy_match(iou: np.ndarray, min_iou: float) -> List[Tuple[int, int]]:
    """Pairs (row, col) matched greedily by descending IoU, each index used once."""
    if iou.size == 0:
        return []
    rows, cols = np.nonzero(iou >= min_iou)
    if len(rows) == 0:
        return []
    order = np.argsort(-iou[rows, cols], kind="stable")
    used_r = set()
    used_c = set()
    pairs: List[Tuple[int, int]] = []
    for r, c in zip(rows[order].tolist(), cols[order].tolist()):
        if r in used_r or c in used_c:
            continue
        used_r.add(r)
        used_c.add(c)
        pairs.append((r, c))
    return pairs


def track_step(
    boxes: np.ndarray,
    prev: TrackerState,
    match_iou: float = 0.3,
    min_hits: int = 2,
    max_age: int = 2,
) -> TrackUpdate:
    """Advance the tracker by one frame of detections ``boxes`` [N,4] xyxy."""
    dets = np.asarray(boxes, np.float64).reshape(-1, 4)
    n, t = len(dets), len(prev)
    pairs = greedy_match(iou_matrix(dets, prev.boxes), match_iou) if n and t else []
    det_matched = np.zeros(n, bool)
    trk_matched = np.zeros(t, bool)
    tboxes = prev.boxes.copy()
    hits = prev.hits.copy()
    misses = prev.misses.copy()
    if pairs:
        d_idx = np.array([p[0] for p in pairs], np.int64)
        t_idx = np.array([p[1] for p in pairs], np.int64)
        det_matched[d_idx] = True
        trk_matched[t_idx] = True
        tboxes[t_idx] = dets[d_idx]
        hits[t_idx] += 1
        misses[t_idx] = 0
    lost = ~trk_matched
    vanished = int(np.count_nonzero(lost & (prev.hits >= min_hits) & (prev.misses == 0)))
    misses[lost] += 1
    alive = misses <= max_age
    new = ~det_matched
    appeared = int(np.count_nonzero(new))
    state = TrackerState(
        boxes=np.concatenate([tboxes[alive], dets[new]]),
        hits=np.concatenate([hits[alive], np.ones(appeared, np.int64)]),
        misses=np.concatenate([misses[alive], np.zeros(appeared, np.int64)]),
        frames=prev.frames + 1,
    )
    return TrackUpdate(appeared, vanished, state)
