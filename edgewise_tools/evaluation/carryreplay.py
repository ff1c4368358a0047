"""Replaying what each stream carries as escalations happen, frame by frame.

:class:`CarryReplay` keeps, for the stream of the frame in hand, the answers on their way
(escalated, answered ``lag`` frames later) and the answers in force (newest first, under
the policy's carry scope: :func:`edgewise.carrying.stacked` and
:func:`~edgewise.carrying.layered`, the daemon's rule, ``edge/carrying.py``), and gives the
boxes carried onto each frame from the answers the collection tracked through the stream's
next frames (``FrameRecord.carried``). ``hybrid.evaluate_frames`` walks it with a fixed
selection; the sequential selection (:mod:`.sequential`) walks it deciding as it goes, so a
policy can read the carry state (:mod:`edgewise.hardness.carrystate`) as the daemon does.
:meth:`CarryReplay.copy` forks it, to measure what one more escalation would change.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from edgewise.carrying import CARRIED, CarryConfig, layered, stacked
from edgewise.detections import Detections
from edgewise_tools.evaluation.frames import FrameRecord

#: an answer in force: (its frame's position in the stream, its record, the payload mode it
#: was sent in, the regions its request covered)
Answer = Tuple[int, int, str, Optional[np.ndarray]]


class CarryReplay:
    """What the stream of the current frame carries; call :meth:`at` for each record in order,
    then :meth:`escalate` for the records escalated. ``lag``: frames from an escalation to its
    answer (>= 1: the escalated frame gets the answer itself)."""

    def __init__(self, records: Sequence[FrameRecord], lag: int, cfg: CarryConfig) -> None:
        if lag < 1:
            raise ValueError(f"carry lag must be >= 1 frame (the escalated frame gets the answer itself), got {lag}")
        self.records, self.lag, self.cfg = records, lag, cfg
        self.stream: Optional[int] = None
        self.pos = -1
        self.last: Optional[int] = None  # position of the stream's last escalation
        self.last_record: Optional[int] = None  # and its record
        self.waiting: List[Tuple[int, int, str]] = []  # escalated, not answered yet: (position, record, mode)
        self.active: List[Answer] = []

    def copy(self) -> CarryReplay:
        twin = CarryReplay.__new__(CarryReplay)
        twin.__dict__.update(self.__dict__)
        twin.waiting, twin.active = list(self.waiting), list(self.active)
        return twin

    def at(self, i: int) -> Optional[Detections]:
        """Move to record ``i`` (the next one in order) and return the boxes its stream carries
        onto it (None: none), whether or not it is escalated."""
        r = self.records[i]
        if r.stream != self.stream:
            self.stream, self.pos, self.last, self.last_record = r.stream, 0, None, None
            self.waiting, self.active = [], []
        else:
            self.pos += 1
        pos = self.pos
        while self.waiting and pos - self.waiting[0][0] >= self.lag:
            p, k, mode = self.waiting.pop(0)
            regions = self.records[k].sent(mode).regions
            self.active = stacked(self.active, (p, k, mode, regions), regions, self.cfg)
        self.active = [a for a in self.active if pos - a[0] <= self.cfg.frames]
        if not self.active:
            return None
        layers = []
        for p, k, mode, regions in self.active:  # an answer with nothing left still hides the older ones in its regions
            lst = self.records[k].carried.get(mode, [])
            dets = lst[pos - p - 1] if pos - p - 1 < len(lst) else Detections.empty(source=CARRIED)
            layers.append((dets, regions))
        carried = layered(layers)
        return carried if len(carried) else None

    def looked(self) -> Tuple[Optional[np.ndarray], ...]:
        """Where the answers in force at the current record looked (each one's regions, None:
        the whole frame; empty: none in force), once :meth:`at` moved to it: what
        ``merge.carryEdgeFloor`` reads (:func:`edgewise.carrying.combine`)."""
        return tuple(a[3] for a in self.active)

    def escalate(self, i: int, mode: str) -> None:
        """Record ``i`` (the one :meth:`at` moved to) is escalated, sending ``mode``."""
        self.last, self.last_record = self.pos, i
        self.waiting.append((self.pos, i, mode))

    def age(self) -> Optional[int]:
        """Frames since the stream's last escalation (None: none yet)."""
        return None if self.last is None else self.pos - self.last

    def key(self) -> Tuple[Optional[int], Tuple[Tuple[int, str], ...]]:
        """What the carry state at this frame depends on, once :meth:`at` moved to it: the last
        escalation's record and the answers in force (records and modes), for memoising a
        state-dependent score."""
        return self.last_record, tuple((a[1], a[2]) for a in self.active)
