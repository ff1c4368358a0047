"""Hardness signals: cheap per-frame scores of how likely the edge model is wrong.

Used by the edge daemon (to decide escalation with :mod:`edgewise.policy`) and by
the offline evaluator. See :mod:`edgewise.hardness.signals` for each signal and
the paper or system it follows.
"""

from __future__ import annotations

from edgewise.hardness.cost import measure_cost
from edgewise.hardness.signals import (
    COMBINE_MODES,
    SIGNAL_NAMES,
    SignalConfig,
    combine,
    compute_signals,
)
from edgewise.hardness.tracking import TrackerState

__all__ = [
    "COMBINE_MODES",
    "SIGNAL_NAMES",
    "SignalConfig",
    "TrackerState",
    "combine",
    "compute_signals",
    "measure_cost",
]
