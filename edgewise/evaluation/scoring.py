"""What each escalation policy ranks frames by (higher = escalate first).

Compared at equal escalation rates (the top ``rate`` fraction of frames by score
is escalated), so the comparison is about *which* frames each policy picks:

* ``random``: uniform sampling (Sedna's ``Random`` filter; the floor to beat).
* ``sedna_threshold``: Sedna ``Threshold`` — hard when the mean box score is low;
  ranked by 1 - mean score. Frames without boxes are never hard in Sedna, so they
  rank last (``shared/reference/anchors-joint-inference.md`` §2.1).
* ``sedna_ibt``: Sedna ``IBT`` — share of boxes scoring <= ``threshold_box``;
  empty frames rank last for the same reason.
* ``combined``: edgewise's combined hardness (the policy's signal weights).
* ``learned``: a "gain regressor" on the edge signals, trained on logged edge/cloud
  pairs of a labelled training split: ridge regression of each frame's F1 gain from
  escalating (:func:`f1_gain`, against that split's ground truth) — the ORIC / DCSB
  practice of predicting the benefit of offloading (``shared/reference/numbers.md``,
  "Suggested practice"). Predicting mere disagreement with the cloud is weaker: where
  the cloud differs it is often not right either.
* ``oracle``: ranked by :func:`f1_gain` on the evaluated frames themselves, which no
  policy knows before asking. Not a policy: about the upper bound of any frame
  selector at each rate, so a report can tell "the policies are weak" from "the target
  is out of reach for this model pair". Never chosen as the best policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

import numpy as np

from edgewise.detections import Detections
from edgewise.evaluation.frames import FrameRecord
from edgewise.evaluation.metrics import Counts, match_counts
from edgewise.hardness import SIGNAL_NAMES, combine
from edgewise.merging import merge

NEVER = -1.0  # score of frames a filter can never call hard
ORACLE = "oracle"


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
    """Edge-side features only (what the daemon knows before asking the cloud)."""
    rows = []
    for r in records:
        n = len(r.edge)
        rows.append([r.signals.get(s, 0.0) for s in SIGNAL_NAMES]
                    + [math.log1p(n), float(n == 0), float(r.edge.scores.max()) if n else 0.0])
    return np.asarray(rows, np.float64)


def f1_gain(records: Sequence[FrameRecord], strategy: str = "replace", iou: float = 0.5) -> np.ndarray:
    """Each frame's F1 gain from escalating it alone, linearised around edge-only.

    F1 = 2TP / (TP + FP + N) over all frames (N ground-truth objects), so a frame that
    changes the counts by (dTP, dFP) moves F1 in proportion to dTP (FP + N) - dFP TP.
    Ranking by it is the greedy selection: exact while few frames are escalated.
    """
    def counts(d: Detections, r: FrameRecord) -> Counts:
        return match_counts(d.boxes, d.class_ids, d.scores, r.gt_boxes, r.gt_cls)

    edge = [counts(r.edge, r) for r in records]
    hybrid = [counts(merge(r.edge, r.cloud, strategy, iou), r) for r in records]
    tp, fp = sum(c.tp for c in edge), sum(c.fp for c in edge)
    n = sum(len(r.gt_cls) for r in records)
    return np.array([(h.tp - e.tp) * (fp + n) - (h.fp - e.fp) * tp for e, h in zip(edge, hybrid)], np.float64)


@dataclass
class GainPredictor:
    """Ridge regression of :func:`f1_gain` on standardised edge features (closed form)."""

    mean: np.ndarray
    std: np.ndarray
    coef: np.ndarray  # [1 + n_features], intercept first

    @classmethod
    def fit(cls, records: Sequence[FrameRecord], strategy: str = "replace", iou: float = 0.5,
            l2: float = 10.0) -> GainPredictor:
        x = features(records)
        gain = f1_gain(records, strategy, iou)
        y = gain / max(float(np.abs(gain).max()), 1e-12)  # scale-free target
        mean, std = x.mean(axis=0), x.std(axis=0)
        std[std < 1e-9] = 1.0
        z = np.hstack([np.ones((len(x), 1)), (x - mean) / std])
        reg = np.full(z.shape[1], l2)
        reg[0] = 0.0  # the intercept is not shrunk
        beta = np.linalg.solve(z.T @ z + np.diag(reg + 1e-9), z.T @ y)
        return cls(mean=mean, std=std, coef=beta)

    def predict(self, records: Sequence[FrameRecord]) -> np.ndarray:
        """Predicted relative F1 gain of escalating each frame (higher: escalate first)."""
        z = (features(records) - self.mean) / self.std
        return np.asarray(self.coef[0] + z @ self.coef[1:], np.float64)

    def importance(self) -> Dict[str, float]:
        names: List[str] = list(SIGNAL_NAMES) + ["log_n_boxes", "empty", "max_score"]
        return {n: round(float(c), 4) for n, c in zip(names, self.coef[1:])}
