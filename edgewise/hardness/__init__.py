"""Hardness signals: cheap per-frame scores of how likely the edge model is wrong.

Used by the edge daemon (to decide escalation with :mod:`edgewise.policy`) and by
the offline evaluator. See :mod:`edgewise.hardness.signals` for each signal and
the paper or system it follows, :mod:`edgewise.hardness.motion` for the motion the
detections do not explain.
"""

from __future__ import annotations

from edgewise.hardness.cost import measure_cost
from edgewise.hardness.motion import MOTION_SIGNALS, MotionConfig, MotionDetector, MotionResult
from edgewise.hardness.signals import (
    BOX_SIGNALS,
    COMBINE_MODES,
    SIGNAL_NAMES,
    SignalConfig,
    combine,
    compute_signals,
)
from edgewise.hardness.tracking import TrackerState

__all__ = [
    "BOX_SIGNALS",
    "COMBINE_MODES",
    "MOTION_SIGNALS",
    "MotionConfig",
    "MotionDetector",
    "MotionResult",
    "SIGNAL_NAMES",
    "SignalConfig",
    "TrackerState",
    "combine",
    "compute_signals",
    "measure_cost",
]
