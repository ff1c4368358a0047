"""Per-frame hardness signals: how likely is the edge model wrong on this frame?

Every signal is a float in [0, 1], higher = harder, computed from one frame's
:class:`~edgewise.detections.Detections` (plus the tracker state carried from
the previous frames). Which system or paper each follows is in the docstring of
its function; the survey is ``docs/design/escalation.md#hardness-signals`` and the
Sedna filters are in ``docs/design/escalation.md#sedna-baselines``.

Frames with **no detections**: the box-based signals (``uncertain_count``,
``uncertain_fraction``, ``mean_conf``, ``min_conf``, ``entropy``, ``margin``,
``small_boxes``) are 0 — there is no low-confidence box to point at, and
reporting 1 would escalate every empty scene (an empty car park at night, all
night). Empty frames are made escalatable by the two signals designed for them:
``missed_object`` (the head saw something with high objectness that NMS/threshold
dropped) and ``tracker_disagreement`` (confirmed objects vanished). This fixes
Sedna's gap, whose ``Threshold``/``IBT`` filters return "not hard" for an empty
list so a missed object is never sent to the cloud.

Class-score signals (``entropy``, ``margin``) normalise each box's class-score
row to a distribution first (YOLOv5 class scores are independent sigmoids times
objectness, so they need not sum to 1); boxes without ``class_scores`` give 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from edgewise.detections import Detections
from edgewise.hardness.motion import MOTION_SIGNALS
from edgewise.hardness.tracking import TrackerState, track_step

#: The signals computed from a frame's detections (and the tracker), in a stable order.
BOX_SIGNALS: Tuple[str, ...] = (
    "uncertain_count",
    "uncertain_fraction",
    "mean_conf",
    "min_conf",
    "entropy",
    "margin",
    "small_boxes",
    "tracker_disagreement",
    "missed_object",
)
#: Every signal ``compute_signals`` returns: the box signals, then the motion signals of
#: :mod:`edgewise.hardness.motion` (pixels the detections do not explain; 0 when no
#: motion evidence is passed in).
SIGNAL_NAMES: Tuple[str, ...] = BOX_SIGNALS + MOTION_SIGNALS

#: How ``combine`` merges weighted signals.
COMBINE_MODES: Tuple[str, ...] = ("max", "mean")

#: Decimals of the signals and box scores in the edge's frame records. The daemon's
#: policy decides on the signals at this precision (:func:`as_recorded`), so replaying
#: the records (``edgewise.policy.replay``) computes exactly the daemon's hardness.
RECORD_DECIMALS = 4


@dataclass(frozen=True)
class SignalConfig:
    """Parameters of the signals (the policy builds one per stream).

    Attributes:
        band_low: lower edge of the uncertainty band (score >= band_low).
        band_high: upper edge of the uncertainty band (score <= band_high).
        class_bands: per-class-name (low, high) bands overriding the band for
            boxes of that class.
        uncertain_saturation: number of in-band boxes at which
            ``uncertain_count`` reaches 1 (count / saturation, capped at 1).
        small_area: a box is small when its area is below this fraction of the
            frame area (DDS uses 4% for its feedback regions; COCO "small" is
            32x32 px = 0.25% of a 640x640 frame).
        frame_size: (width, height) of the source frames in pixels; needed by
            ``small_boxes`` (0 when unknown). ``compute_signals(frame_size=)``
            overrides it per call.
        track_iou: IoU needed to match a detection to a track.
        track_min_hits: matched frames before a track is confirmed (only
            confirmed tracks count as vanished).
        track_max_age: frames an unmatched track coasts before it is dropped.
    """

    band_low: float = 0.25
    band_high: float = 0.6
    class_bands: Mapping[str, Tuple[float, float]] = field(default_factory=dict)
    uncertain_saturation: int = 3
    small_area: float = 0.01
    frame_size: Optional[Tuple[int, int]] = None
    track_iou: float = 0.3
    track_min_hits: int = 2
    track_max_age: int = 2


def score_bands(dets: Detections, cfg: SignalConfig) -> Tuple[np.ndarray, np.ndarray]:
    """Each box's uncertainty band (low, high): the stream's, or its class's from
    ``class_bands``; float32 like the scores (see :meth:`Detections.scored_within`)."""
    n = len(dets)
    low = np.full(n, cfg.band_low, np.float32)
    high = np.full(n, cfg.band_high, np.float32)
    if cfg.class_bands and dets.names:
        for i in range(n):
            cid = int(dets.class_ids[i])
            if 0 <= cid < len(dets.names):
                band = cfg.class_bands.get(dets.names[cid])
                if band is not None:
                    low[i], high[i] = band
    return low, high


def uncertain_signals(dets: Detections, cfg: SignalConfig) -> Tuple[float, float]:
    """(``uncertain_count``, ``uncertain_fraction``) of boxes whose score is in the band.

    The band follows NoScope's two-threshold cascade (escalate only when the
    small model's confidence lies between c_low and c_high) and Sedna's ``IBT``
    filter (fraction of boxes scoring <= threshold_box). ``uncertain_count`` is
    count / ``uncertain_saturation`` capped at 1, so one uncertain box among 40
    confident ones still registers (the fraction, IBT-style, would be 0.025).
    """
    n = len(dets)
    if n == 0:
        return 0.0, 0.0
    k = int(np.count_nonzero(dets.scored_within(*score_bands(dets, cfg))))
    sat = max(1, cfg.uncertain_saturation)
    return min(1.0, k / sat), k / n


def confidence_signals(dets: Detections) -> Tuple[float, float]:
    """(``mean_conf``, ``min_conf``): 1 - mean and 1 - min box score (0 with no boxes).

    ``mean_conf`` is Sedna's ``Threshold`` filter (hard if the mean box score is
    below a threshold) as a score; the literature rates it the weakest signal
    (docs/design/escalation.md#default-weights).
    """
    if len(dets) == 0:
        return 0.0, 0.0
    s = dets.scores
    mean = min(1.0, max(0.0, float(s.mean())))
    low = min(1.0, max(0.0, float(s.min())))
    return 1.0 - mean, 1.0 - low


def class_distribution(dets: Detections) -> Optional[np.ndarray]:
    """Each box's class scores normalised to sum 1 (rows summing to 0 dropped), or None."""
    cs = dets.class_scores
    if cs is None or len(dets) == 0 or cs.shape[1] < 2:
        return None
    p = np.maximum(cs.astype(np.float32, copy=False), np.float32(0.0))
    tot = p.sum(axis=1, keepdims=True)
    ok = tot[:, 0] > 0
    if not ok.any():
        return None
    out: np.ndarray = p[ok] / tot[ok]
    return out


def entropy_signal(dets: Detections, p: Optional[np.ndarray] = None) -> float:
    """Max over boxes of the normalised Shannon entropy H(p) / log K of the class scores.

    Sedna's ``CrossEntropy`` filter (confidence = 1 + sum p log p / log K) and
    the per-instance entropy of ENMS (active learning for detection, CVPR'22).
    """
    if p is None:
        p = class_distribution(dets)
    if p is None:
        return 0.0
    k = p.shape[1]
    plogp = p * np.log(np.where(p > 0, p, np.float32(1.0)))  # 0 log 0 = 0
    h = float((-plogp.sum(axis=1)).max())
    return min(1.0, max(0.0, h / math.log(k)))


def margin_signal(dets: Detections, p: Optional[np.ndarray] = None) -> float:
    """Max over boxes of 1 - (p1 - p2), the top-2 margin of the class distribution.

    DDS scores segmentation feedback with 1 + max1 - max2; Big/LITTLE DNN
    (Park et al., CODES+ISSS'15) escalates on a small score margin.
    """
    if p is None:
        p = class_distribution(dets)
    if p is None:
        return 0.0
    top2 = np.partition(p, p.shape[1] - 2, axis=1)[:, -2:]
    margin = float(np.abs(top2[:, 1] - top2[:, 0]).min())
    return min(1.0, max(0.0, 1.0 - margin))


def small_boxes_signal(
    dets: Detections, small_area: float, frame_size: Optional[Tuple[int, int]]
) -> float:
    """Fraction of boxes whose area is below ``small_area`` x frame area.

    DDS (SIGCOMM'20): small, uncertain objects are where the small model fails
    (its feedback regions are < 4% of the frame); YOLOv5s trails YOLOv5x most
    on small objects. 0 with no boxes or unknown frame size.
    """
    if len(dets) == 0 or frame_size is None:
        return 0.0
    w, h = frame_size
    if w <= 0 or h <= 0:
        return 0.0
    b = dets.boxes.astype(np.float64, copy=False)
    area = np.maximum(b[:, 2] - b[:, 0], 0.0) * np.maximum(b[:, 3] - b[:, 1], 0.0)
    return float(np.count_nonzero(area < small_area * w * h) / len(dets))


def missed_object_signal(dets: Detections) -> float:
    """``Detections.missed_objectness`` clipped to [0, 1].

    The highest objectness among head candidates that were dropped and do not
    overlap a kept box: DDS's objectness-map feedback regions (regions the
    server should look at although no box was kept). This is what makes a frame
    with zero detections escalatable.
    """
    m = float(dets.missed_objectness)
    if not math.isfinite(m):
        return 0.0
    return min(1.0, max(0.0, m))


def compute_signals(
    dets: Detections,
    prev: Optional[TrackerState],
    cfg: SignalConfig,
    frame_size: Optional[Tuple[int, int]] = None,
    motion: Optional[Mapping[str, float]] = None,
) -> Tuple[Dict[str, float], TrackerState]:
    """All signals of one frame, and the tracker state to pass with the next frame.

    ``prev`` is the state returned for the previous frame of the same stream
    (``None`` for the first frame). ``motion`` holds the frame's motion signals
    (:class:`edgewise.hardness.motion.MotionDetector`), 0 when not given: they need the
    pixels, which only the caller has. ``tracker_disagreement`` is
    (appeared + vanished) / (detections + vanished): 0 on the first frame and
    until the tracker has seen ``track_min_hits`` frames (warm-up), so a stream
    start is not "hard". A frame of another size than ``prev``'s starts the tracker
    afresh (warm-up included): boxes in the old frame's pixels say nothing about the new
    frame's, so a stream that changes resolution is not "hard" for it.
    """
    state = prev if prev is not None and (frame_size is None or prev.size in (None, frame_size)) else TrackerState()
    unc_count, unc_frac = uncertain_signals(dets, cfg)
    mean_c, min_c = confidence_signals(dets)
    dist = class_distribution(dets)
    upd = track_step(
        dets.boxes, state, cfg.track_iou, cfg.track_min_hits, cfg.track_max_age
    )
    if state.frames < max(1, cfg.track_min_hits):
        disagreement = 0.0
    else:
        denom = len(dets) + upd.vanished
        disagreement = (upd.appeared + upd.vanished) / denom if denom else 0.0
    signals = {
        "uncertain_count": unc_count,
        "uncertain_fraction": unc_frac,
        "mean_conf": mean_c,
        "min_conf": min_c,
        "entropy": entropy_signal(dets, dist),
        "margin": margin_signal(dets, dist),
        "small_boxes": small_boxes_signal(
            dets, cfg.small_area, frame_size if frame_size is not None else cfg.frame_size
        ),
        "tracker_disagreement": float(disagreement),
        "missed_object": missed_object_signal(dets),
    }
    for name in MOTION_SIGNALS:
        signals[name] = float(motion.get(name, 0.0)) if motion is not None else 0.0
    return signals, replace(upd.state, size=frame_size) if frame_size is not None else upd.state


def combine(
    signals: Mapping[str, float], weights: Mapping[str, float], mode: str = "max"
) -> float:
    """One hardness in [0, 1] from weighted signals; only signals named in ``weights`` count.

    ``mode="max"`` (default): max over signals of weight x signal, weights in
    [0, 1]. One strong signal is enough to make a frame hard — in particular an
    empty frame with a high ``missed_object`` is not averaged away by the box
    signals that are 0 on empty frames. ``mode="mean"``: sum(w x s) / sum(w),
    a smoother score when several weak signals should add up. A missing signal
    counts as 0; no positive weight gives 0.
    """
    if mode not in COMBINE_MODES:
        raise ValueError(f"combine mode must be one of {COMBINE_MODES}, got {mode!r}")
    best = 0.0
    num = 0.0
    den = 0.0
    get = signals.get
    for name, w in weights.items():  # per frame, and per recorded frame in a replay: kept lean
        if w <= 0:
            continue
        s = float(get(name, 0.0))
        if not 0.0 <= s <= 1.0:  # out of [0, 1], infinite or NaN
            s = min(1.0, max(0.0, s)) if math.isfinite(s) else 0.0
        ws = w * s
        num += ws
        den += w
        if ws > best:
            best = ws
    value = best if mode == "max" else (num / den if den > 0 else 0.0)
    return min(1.0, max(0.0, value))


def as_recorded(signals: Mapping[str, float]) -> Dict[str, float]:
    """The signals at the precision the frame record keeps (:data:`RECORD_DECIMALS`)."""
    return {k: round(float(v), RECORD_DECIMALS) for k, v in signals.items()}


def recorded_signals(
    dets: Detections,
    prev: Optional[TrackerState],
    cfg: SignalConfig,
    frame_size: Optional[Tuple[int, int]] = None,
    motion: Optional[Mapping[str, float]] = None,
) -> Tuple[Dict[str, float], TrackerState]:
    """:func:`compute_signals` at the precision the frame record keeps (:func:`as_recorded`):
    what a policy decides on, in the daemon (``edge.deciding``) and in every replay of its
    records (``edgewise eval``, ``check-policy --data``), so a frame on the threshold goes the
    same way in each."""
    raw, state = compute_signals(dets, prev, cfg, frame_size, motion)
    return as_recorded(raw), state
