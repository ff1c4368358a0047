"""The rules of the tools' numeric command-line options (``edgewise eval``, ``edgewise edge
check-policy --data``, ``edgewise train``): one line naming the flag, the value and the rule."""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

from edgewise.errors import ConfigError
from edgewise_tools.evaluation.bootstrap import MAX_SAMPLES, MIN_SAMPLES

#: What a numeric option may be, by the words its error says it in (:func:`check_option`).
RULES: Dict[str, Callable[[float], bool]] = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    ">= 1": lambda v: v >= 1,
    f">= {MIN_SAMPLES}": lambda v: v >= MIN_SAMPLES,
    f"<= {MAX_SAMPLES}": lambda v: v <= MAX_SAMPLES,
    "in (0, 1]": lambda v: 0 < v <= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
}


def check_option(flag: str, value: Optional[float], rule: str, meaning: str = "") -> None:
    """Refuse a numeric option that breaks ``rule`` (a key of :data:`RULES`) as one line,
    ``--fps 0: must be > 0``; a value not given (None) passes. The one place the numeric
    options of ``edgewise eval``, ``edgewise edge check-policy --data`` and ``edgewise train``
    (``TrainConfig.validate``) are checked."""
    if value is not None and not (math.isfinite(value) and RULES[rule](value)):
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise ConfigError(f"{flag} {shown}: must be {rule}" + (f" ({meaning})" if meaning else ""))
