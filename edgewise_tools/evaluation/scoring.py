"""What each escalation policy ranks frames by (higher = escalate first).

Compared at equal escalation rates (the top ``rate`` fraction of frames by score
is escalated), so the comparison is about *which* frames each policy picks:

* ``random``: uniform sampling (Sedna's ``Random`` filter; the floor to beat).
* ``sedna_threshold``: Sedna ``Threshold`` — hard when the mean box score is low;
  ranked by 1 - mean score. Frames without boxes are never hard in Sedna, so they
  rank last (``docs/design/escalation.md#sedna-baselines``).
* ``sedna_ibt``: Sedna ``IBT`` — share of boxes scoring <= ``threshold_box``;
  empty frames rank last for the same reason.
* ``combined``: edgewise's combined hardness (the policy's signal weights).
* ``learned``: a "gain regressor" on the edge signals, trained on logged edge/cloud
  pairs of a labelled training split: boosted regression trees of each frame's F1 gain from
  escalating (:func:`f1_gain`, against that split's ground truth) — the ORIC / DCSB
  practice of predicting the benefit of offloading
  (``docs/design/escalation.md#learned-gain-model``). Predicting mere disagreement with
  the cloud is weaker: where the cloud differs it is often not right either.
* ``oracle``: ranked by :func:`f1_gain` on the evaluated frames themselves, which no
  policy knows before asking. Not a policy: about the upper bound of any frame
  selector at each rate, so a report can tell "the policies are weak" from "the target
  is out of reach for this model pair". Never chosen as the best policy.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

import numpy as np

from edgewise.detections import Detections
from edgewise.hardness import combine
from edgewise.hardness.learned import FEATURE_NAMES, GainModel, frame_features
from edgewise.policy.schema import Merge
from edgewise_tools.evaluation.frames import FrameRecord
from edgewise_tools.evaluation.hybrid import REPLACE
from edgewise_tools.evaluation.metrics import Counts, match_counts

NEVER = -1.0  # score of frames a filter can never call hard
ORACLE = "oracle"


def tie_draws(scores: np.ndarray, draws: int) -> List[np.ndarray]:
    """A policy's scores as the vectors :func:`~edgewise_tools.evaluation.hybrid.at_rates`
    averages: ``draws`` copies when frames tie (each copy's ties broken by another seeded
    shuffle, :func:`~edgewise_tools.evaluation.hybrid.top_fraction`), else the one vector. The
    combined hardness saturates at 1.0 on 17-22% of a camera set's frames, so below that rate its
    selection is a draw among them: one draw moved its F1 at 15% by up to 3.6 points over 10
    seeds, as much as the leads it was judged on, while random sampling was averaged over 5."""
    v = np.asarray(scores, np.float64)
    return [v] * draws if len(np.unique(v)) < len(v) else [v]


def random_scores(records: Sequence[FrameRecord], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(len(records))


def sedna_threshold_scores(records: Sequence[FrameRecord]) -> np.ndarray:
    return np.array([1.0 - float(r.edge.scores.mean()) if len(r.edge) else NEVER for r in records])


def sedna_ibt_scores(records: Sequence[FrameRecord], threshold_box: float = 0.5) -> np.ndarray:
    return np.array(
        [float((r.edge.scores <= threshold_box).mean()) if len(r.edge) else NEVER for r in records]
    )


def combined_scores(
    records: Sequence[FrameRecord], weights: Mapping[str, float], mode: str = "max"
) -> np.ndarray:
    return np.array([combine(r.signals, weights, mode) for r in records])


def features(records: Sequence[FrameRecord]) -> np.ndarray:
    """Edge-side feature rows (:func:`~edgewise.hardness.learned.frame_features`)."""
    return np.asarray([frame_features(r.signals, r.edge) for r in records], np.float64).reshape(
        -1, len(FEATURE_NAMES))


def f1_gain(records: Sequence[FrameRecord], merge: Merge = REPLACE, mode: str = "full") -> np.ndarray:
    """Each frame's F1 gain from escalating it alone, linearised around edge-only.

    F1 = 2TP / (TP + FP + N) over all frames (N ground-truth objects), so a frame that
    changes the counts by (dTP, dFP) moves F1 in proportion to dTP (FP + N) - dFP TP.
    Ranking by it is the greedy selection: exact while few frames are escalated. ``mode``
    is the payload mode the frame would be sent in.
    """
    def counts(d: Detections, r: FrameRecord) -> Counts:
        return match_counts(d.boxes, d.class_ids, d.scores, r.gt_boxes, r.gt_cls)

    edge = [counts(r.edge, r) for r in records]
    hybrid = [counts(merge.apply(r.edge, r.sent(mode).cloud, r.sent(mode).regions), r) for r in records]
    tp, fp = sum(c.tp for c in edge), sum(c.fp for c in edge)
    n = sum(len(r.gt_cls) for r in records)
    return np.array([linear_gain(h.tp - e.tp, h.fp - e.fp, tp, fp, n) for e, h in zip(edge, hybrid)], np.float64)


def linear_gain(dtp: float, dfp: float, tp: float, fp: float, n: float) -> float:
    """The F1 change of (``dtp``, ``dfp``) more true and false positives, linearised around
    ``tp`` and ``fp`` over ``n`` ground-truth objects (up to a positive factor: F1 = 2TP /
    (TP + FP + N) moves in proportion to dTP (FP + N) - dFP TP)."""
    return dtp * (fp + n) - dfp * tp


def fit_gain_model(records: Sequence[FrameRecord], merge: Merge = REPLACE,
                   info: Optional[Mapping[str, Any]] = None, mode: str = "full", **params: Any) -> GainModel:
    """The learned policy: boosted trees of :func:`f1_gain` on the edge features of
    labelled frames (``params`` go to :class:`~edgewise.hardness.boosting.BoostedTrees`).
    A few shallow trees capture what a linear score cannot, e.g. that a low mean
    confidence matters on a crowded frame but not on a single box."""
    return GainModel.fit(features(records), f1_gain(records, merge, mode),
                         dict(info or {}, frames=len(records), merge=merge.strategy, mergeIou=merge.iou, payload=mode),
                         **params)
