"""Offline evaluation of the hybrid: edge-only vs cloud-only vs escalation policies.

``edgewise eval`` runs both models once over a held-out synthetic set (exact
ground truth), then replays escalation decisions offline: the literature's
protocol (DDS, NoScope, DCSB score the hybrid against ground truth *and* against
the big model's output, see docs/design/escalation.md#evaluation-method).

Modules: :mod:`.metrics` (matching, F1, mAP@0.5), :mod:`.frames` (dataset and the
per-frame records of both models), :mod:`.scoring` (what each policy ranks
frames by, including the learned gain predictor), :mod:`.hybrid` (replaying a
selection, sweeps at equal escalation rates), :mod:`.report` (JSON, Markdown, PNG).
"""

from __future__ import annotations

from edgewise_tools.evaluation.metrics import Counts, average_precision, match_counts, mean_ap

__all__ = ["Counts", "average_precision", "match_counts", "mean_ap"]
