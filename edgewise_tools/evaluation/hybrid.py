"""Replaying escalation decisions over the collected frames, and the comparisons.

``evaluate`` scores one selection (which frames went to the cloud) the way the
literature does: against ground truth (F1 at the operating threshold, mAP@0.5)
and against the cloud model's own output on every frame (DDS / NoScope / DCSB).
``at_rates`` puts every policy at the same escalation rates; ``run_policy``
replays an operator's policy file with its thresholds, cooldown and budget on
the stream timeline; ``threshold_sweep`` traces the curve of the combined
hardness threshold.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

from edgewise.detections import Detections
from edgewise.merging import merge
from edgewise.policy import Escalator, Policy
from edgewise_tools.evaluation.frames import FrameRecord
from edgewise_tools.evaluation.metrics import Counts, match_counts, mean_ap


def _final(r: FrameRecord, up: bool, strategy: str, iou: float, low: bool) -> Detections:
    edge, cloud = (r.edge_all, r.cloud_all) if low else (r.edge, r.cloud)
    return merge(edge, cloud, strategy, iou) if up else edge


def evaluate(
    records: Sequence[FrameRecord], mask: np.ndarray, nc: int, strategy: str = "replace", iou: float = 0.5
) -> Dict[str, float]:
    """Metrics of the hybrid that escalates exactly the frames in ``mask``."""
    vs_gt, vs_cloud = Counts(), Counts()
    preds, gts = [], []
    for r, up in zip(records, mask):
        d = _final(r, bool(up), strategy, iou, low=False)
        vs_gt += match_counts(d.boxes, d.class_ids, d.scores, r.gt_boxes, r.gt_cls)
        vs_cloud += match_counts(d.boxes, d.class_ids, d.scores, r.cloud.boxes, r.cloud.class_ids)
        lo = _final(r, bool(up), strategy, iou, low=True)
        preds.append((lo.boxes, lo.class_ids, lo.scores))
        gts.append((r.gt_boxes, r.gt_cls))
    m_ap, _ = mean_ap(preds, gts, nc)
    sent = int(sum(r.jpeg_bytes for r, up in zip(records, mask) if up))
    total = int(sum(r.jpeg_bytes for r in records))
    return {
        "escalated": float(np.mean(mask)) if len(mask) else 0.0,
        "f1": vs_gt.f1, "precision": vs_gt.precision, "recall": vs_gt.recall,
        "map50": m_ap, "f1_vs_cloud": vs_cloud.f1,
        "uplink_bytes": sent, "uplink_saved": 1.0 - sent / total if total else 0.0,
    }


def top_fraction(scores: np.ndarray, rate: float, seed: int = 0) -> np.ndarray:
    """Mask of the ``round(rate * N)`` highest scores; ties broken by a seeded shuffle."""
    n = len(scores)
    k = int(round(rate * n))
    mask = np.zeros(n, dtype=bool)
    if k <= 0:
        return mask
    tiebreak = np.random.default_rng(seed).random(n)
    order = np.lexsort((tiebreak, -np.asarray(scores, np.float64)))
    mask[order[:k]] = True
    return mask


def at_rates(
    records: Sequence[FrameRecord],
    scores: Mapping[str, Sequence[np.ndarray]],
    rates: Sequence[float],
    nc: int,
    strategy: str = "replace",
    iou: float = 0.5,
) -> Dict[str, List[Dict[str, float]]]:
    """Each policy at each rate; a policy with several score vectors (random seeds) is averaged."""
    out: Dict[str, List[Dict[str, float]]] = {}
    for name, vectors in scores.items():
        rows = []
        for rate in rates:
            runs = [evaluate(records, top_fraction(v, rate, seed=i), nc, strategy, iou)
                    for i, v in enumerate(vectors)]
            row = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
            row["rate"] = rate
            rows.append(row)
        out[name] = rows
    return out


def run_policy(records: Sequence[FrameRecord], policy: Policy, fps: float) -> np.ndarray:
    """Replay the policy file on the stream timeline (frame / fps seconds): thresholds,
    cooldown, budget and priority all apply, exactly as in the daemon."""
    esc = Escalator(policy, clock=lambda: 0.0)
    mask = np.zeros(len(records), dtype=bool)
    for i, r in enumerate(records):
        d = esc.decide(f"s{r.stream}", r.frame, r.edge, r.signals, now=r.frame / fps)
        mask[i] = d.escalate
    return mask


def threshold_sweep(
    records: Sequence[FrameRecord], hardness: np.ndarray, thresholds: Sequence[float], nc: int,
    strategy: str = "replace", iou: float = 0.5,
) -> List[Dict[str, Any]]:
    """Escalate every frame with hardness >= t (no budget): the policy's threshold curve."""
    rows = []
    for t in thresholds:
        row: Dict[str, Any] = dict(evaluate(records, hardness >= t, nc, strategy, iou))
        row["threshold"] = float(t)
        rows.append(row)
    return rows
