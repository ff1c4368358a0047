"""Selections that depend on earlier decisions, replayed as the daemon makes them.

A policy that reads the carry state (:mod:`edgewise.hardness.carrystate`) scores a frame by
what the stream's earlier escalations left in force, so its scores cannot be ranked once
for the whole set (``hybrid.top_fraction``). :func:`select` replays it as the daemon runs it:
per stream in frame order, a frame is escalated when its score reaches one threshold and
the cooldown allows, and the carry state then follows (:class:`.carryreplay.CarryReplay`);
the threshold is bisected so the set escalates ``floor(rate * N)`` frames, the same budget every
static policy gets at that rate; the count is not monotone in the threshold, so the thresholds
next to the bisection's bracket are then scanned one distinct selection at a time
(:func:`select`), and a set no threshold brings to the budget gets the closest count below. Ties are broken by a
seeded jitter far below any score difference, one draw per seed.

:class:`CarryScores` is such a score: a gain model over the frame's signals joined by its
carry-state features, computed by :func:`edgewise.hardness.carrystate.carry_features`, the
daemon's function (``edge.deciding``), from the replayed state.
"""

from __future__ import annotations

from typing import Callable, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from edgewise.carrying import CarryConfig
from edgewise.detections import Detections
from edgewise.hardness.carrystate import carry_features
from edgewise.hardness.learned import GainModel
from edgewise.hardness.signals import as_recorded, score_bands
from edgewise.policy import Policy
from edgewise.policy.schema import WholeFrames
from edgewise_tools.evaluation.carryreplay import CarryReplay
from edgewise_tools.evaluation.frames import FrameRecord, stream_id

#: a state-dependent score: (record, the replay moved to it, the boxes carried onto it) -> score
StateScore = Callable[[int, CarryReplay, Optional[Detections]], float]
#: the payload mode of an escalation: (the stream's whole-frame refresh state, its record) -> mode
ModeOf = Callable[[WholeFrames, FrameRecord], str]
#: bisection steps of the threshold (the scores' range halves each time)
STEPS = 48
#: runs of the scan after the bisection, half above its bracket and half below: each run is
#: one more distinct selection (:func:`select`)
SCAN = 24


class FrameViews:
    """Per record, what the carry-state features read besides the state: the uncertain boxes
    (the policy's band for the stream) and the regions a region payload would send."""

    def __init__(self, records: Sequence[FrameRecord], policy: Policy) -> None:
        self.uncertain: List[np.ndarray] = []
        self.proposed: List[Optional[np.ndarray]] = []
        for r in records:
            size = (r.width, r.height)
            band = score_bands(r.edge, policy.signal_config(stream_id(r.stream), size))
            self.uncertain.append(r.edge.scored_within(*band))
            self.proposed.append(policy.spec.payload.proposals(r.edge, r.blobs, size, band))

    def features(self, records: Sequence[FrameRecord], i: int, replay: CarryReplay,
                 carried: Optional[Detections]) -> Dict[str, float]:
        """Record ``i``'s signals joined by its carry-state features at the replay's state (at
        the record's precision, as the daemon records them)."""
        r = records[i]
        last = replay.last_record
        out = dict(r.signals)
        out.update(as_recorded(carry_features(r.edge, self.uncertain[i], carried, replay.age(), r.blobs,
                                              self.proposed[i], None if last is None else self.proposed[last])))
        return out


class CarryScores:
    """A gain model's predicted gain of each record at the replayed carry state, memoised by
    (record, state): the bisection of :func:`select` meets the same states many times."""

    def __init__(self, records: Sequence[FrameRecord], policy: Policy, model: GainModel) -> None:
        self.records, self.model = records, model
        self.views = FrameViews(records, policy)
        self.memo: Dict[Tuple[int, Hashable], float] = {}

    def __call__(self, i: int, replay: CarryReplay, carried: Optional[Detections]) -> float:
        key = (i, replay.key())
        got = self.memo.get(key)
        if got is None:
            r = self.records[i]
            n = len(r.edge)
            got = self.memo[key] = self.model.predicted_of(self.views.features(self.records, i, replay, carried), n,
                                                           float(r.edge.scores.max()) if n else 0.0)
        return got


class Pass(NamedTuple):
    """One replay under threshold ``t``: its selection, the lowest and highest score it met, and
    the met scores closest to ``t`` on either side (``below`` < t <= ``above``; -inf / inf: none).
    Any threshold in (``below``, ``above``] makes every decision of the pass the same way, so it
    selects the same frames: the thresholds fall into intervals of equal selections."""

    mask: np.ndarray
    low: float
    high: float
    below: float
    above: float

    @property
    def escalated(self) -> int:
        """Frames it escalates."""
        return int(self.mask.sum())


def _run(records: Sequence[FrameRecord], score: StateScore, t: float, gap: int, lag: int, cfg: CarryConfig,
         mode_of: ModeOf, jitter: np.ndarray) -> Pass:
    """The selection under threshold ``t``."""
    mask = np.zeros(len(records), bool)
    low, high, below, above = np.inf, -np.inf, -np.inf, np.inf
    replay = CarryReplay(records, lag, cfg)
    whole = WholeFrames()
    for i, r in enumerate(records):
        carried = replay.at(i)
        age = replay.age()
        if age is not None and age < gap:
            continue
        s = score(i, replay, carried) + jitter[i]
        low, high = min(low, s), max(high, s)
        if s >= t:
            above = min(above, s)
            mask[i] = True
            replay.escalate(i, mode_of(whole, r))
        else:
            below = max(below, s)
    return Pass(mask, low, high, below, above)


def _scan(run: Callable[[float], Pass], budget: int, lo: Pass, hi: Pass, best: np.ndarray) -> np.ndarray:
    """After the bisection (``lo``: a pass above the budget, ``hi``: at or below it), walk the
    intervals of thresholds one pass per interval, at most :data:`SCAN` passes, alternating up
    (from ``lo``) and down (from ``hi``): a non-monotone count may come back to the budget there.
    When the bisection ran out of steps before its bracket was one float wide, intervals lie
    between the two, and each walk crosses them before it steps over the other end (no pass: its
    selection is known) and goes on away from the bracket. Returns the first selection of exactly
    ``budget`` frames, else the largest below it (``best`` included)."""
    ends = [lo, hi]
    k = 0
    while k < SCAN:
        end = ends[k % 2]
        t = float(np.nextafter(end.above, np.inf)) if k % 2 == 0 else end.below  # the next interval
        if not np.isfinite(t):
            k += 1
            continue
        known = next((q for q in (lo, hi) if q.below < t <= q.above), None)
        if known is not None:  # the bracket's other end: step over it
            ends[k % 2] = known
            continue
        ends[k % 2] = p = run(t)
        k += 1
        if p.escalated <= budget and p.escalated > int(best.sum()):
            best = p.mask
            if p.escalated == budget:
                break
    return best


def select(records: Sequence[FrameRecord], score: StateScore, budget: int, gap: int, lag: int, cfg: CarryConfig,
           mode_of: ModeOf, seed: int = 0) -> np.ndarray:
    """The daemon's selection under one threshold, bisected so that it escalates ``budget``
    frames. The count is not monotone in the threshold (fewer early escalations leave more stale
    states later), so when the bisection's two closest passes straddle the budget, the thresholds
    next to them are scanned interval by interval (:func:`_scan`); a set that reaches none
    returns the most below the budget any pass met, and ``hybrid.is_short`` marks a row that fell
    short (a cooldown of ``gap`` frames per stream; answers carried ``lag`` frames after each
    escalation under ``cfg``; ``mode_of`` gives each escalation's payload mode, the policy's
    whole-frame refresh included)."""
    n = len(records)
    best = np.zeros(n, bool)
    if budget <= 0:
        return best
    jitter = np.random.default_rng(seed).random(n) * 1e-9

    def run(t: float) -> Pass:
        return _run(records, score, t, gap, lag, cfg, mode_of, jitter)

    first = run(-np.inf)
    if first.escalated <= budget:
        return first.mask
    # a state the first pass did not meet may score outside its range: above it, the threshold
    # just above the first pass's highest score still escalates more than the budget (frames long
    # after an escalation the first pass never let happen). Raise the upper end past the highest
    # score each such run met until it escalates at most the budget; below the range, the
    # bisection ends at the closest count it can reach below the budget.
    lo, hi = first, None
    t_lo, t_hi = first.low - 1e-6, first.high + 1e-6
    for _ in range(STEPS):
        p = run(t_hi)
        if p.escalated <= budget:
            best, hi = p.mask, p
            break
        lo, t_lo, t_hi = p, t_hi, p.high + 1e-6
    if hi is None:
        return best
    for _ in range(STEPS):
        if int(best.sum()) == budget:
            return best
        mid = (t_lo + t_hi) / 2.0
        if not t_lo < mid < t_hi:  # the bracket is one float wide
            break
        p = run(mid)
        if p.escalated > budget:
            lo, t_lo = p, mid
        else:
            hi, t_hi = p, mid
            if p.escalated > int(best.sum()):
                best = p.mask
    return best if int(best.sum()) == budget else _scan(run, budget, lo, hi, best)
