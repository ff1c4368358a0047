"""The edge daemon's side of carrying the cloud's boxes between escalations.

Per stream it remembers the pixels of the frames whose escalation is on its way (the
templates are cut from the frame the cloud saw), seeds the tracker when an answer comes
back, and on every later frame the pipeline publishes the edge's boxes combined with the
carried ones (:mod:`edgewise.carrying`, the same functions ``edgewise eval`` measures).
A newer answer replaces an older one; an answer that comes back after a newer one is in
force, or from the spool's replay, is not carried (it is older than what the edge has).
The frames between are stepped over in one go: the search window widens with the frames
elapsed. Pure bookkeeping on the event loop; callers: ``edge.pipeline`` (``sent``,
``apply``) and ``edge.escalating`` (``answered``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Tuple

import numpy as np

from edgewise.carrying import CarryConfig, CarryState, combine, grey, seed, step
from edgewise.detections import Detections

#: escalated frames per stream whose pixels are kept for their answer (the oldest go first)
MAX_WAITING = 8


class Carrier:
    """Which answer each stream carries, and where its boxes are now."""

    def __init__(self) -> None:
        self._waiting: Dict[str, OrderedDict[int, np.ndarray]] = {}
        self._state: Dict[str, Tuple[int, CarryState]] = {}

    def sent(self, stream: str, seq: int, image: np.ndarray, cfg: CarryConfig) -> None:
        """Frame ``seq`` of ``stream`` was escalated: keep its pixels (grey, a third of the
        bytes; the templates are grey) for the answer, when the policy carries answers."""
        if not cfg.enabled:
            return
        waiting = self._waiting.setdefault(stream, OrderedDict())
        waiting[seq] = grey(image)
        while len(waiting) > MAX_WAITING:
            waiting.popitem(last=False)

    def answered(self, stream: str, seq: int, cloud: Detections, cfg: CarryConfig) -> None:
        """The cloud's boxes for frame ``seq``: carry them from that frame on."""
        image = self._waiting.get(stream, OrderedDict()).pop(seq, None)
        current = self._state.get(stream)
        if image is None or not cfg.enabled or (current is not None and current[0] >= seq):
            return
        self._state[stream] = (seq, seed(image, cloud, cfg))

    def apply(self, stream: str, seq: int, image: np.ndarray, dets: Detections, cfg: CarryConfig) -> Detections:
        """Frame ``seq``'s boxes to publish: the edge's with the carried ones, found on ``image``."""
        current = self._state.get(stream)
        if current is None or seq <= current[0]:
            return dets
        at, state = current
        state = step(state, image, cfg, frames=seq - at)
        if not len(state):
            del self._state[stream]
            return dets
        self._state[stream] = (seq, state)
        return combine(dets, state.detections())

    def carrying(self, stream: str) -> int:
        """Boxes carried on ``stream`` now."""
        current = self._state.get(stream)
        return len(current[1]) if current is not None else 0
