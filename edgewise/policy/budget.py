"""Per-stream escalation budget: token bucket, sliding-window fraction, hardest-first gate.

Pure bookkeeping driven by the caller's ``now``; no clocks, no I/O. Three
limits, all per stream:

* **Token bucket** (``maxPerSecond``, ``burst``): over any interval of ``T``
  seconds a stream escalates at most ``burst + maxPerSecond * T`` frames.
* **Max fraction** (``maxFraction`` over ``windowFrames``): in any
  ``windowFrames`` consecutive frames at most ``floor(maxFraction *
  windowFrames)`` are escalated. The window counts frames seen by ``decide``
  (not sequence numbers, so gaps in ``frame_seq`` do not open the budget).
  Which of the last :data:`MAX_WINDOW_FRAMES` frames escalated is kept too (a bit
  each), so after a reload to a larger window its cap holds over the frames before
  the reload.
* **Hardest first** (``priority: hardest``): the hard caps alone would spend the
  budget on whichever hard frames come first. So we also keep the hardness of
  recent *candidates* (frames over the threshold) in the window and the
  allowance ``k`` the caps give that window, ``k = min(maxFraction * W,
  maxPerSecond * W * frame_interval)``. When candidates outnumber ``k``, a
  frame is admitted only if its hardness is within the top ``k`` of the recent
  candidates (a running top-k / quantile gate). Reducto (SIGCOMM'20) found
  static thresholds fail and that they must adapt per video; this gate adapts
  the effective threshold to the recent hardness distribution, and ORIC
  (SEC'24) likewise offloads the highest-gain images under a budget.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Deque, List, Optional, Tuple

#: The largest ``budget.windowFrames`` (the schema's bound): how many frames back escalations
#: are remembered, whatever the window in force, for a reload to a larger one.
MAX_WINDOW_FRAMES = 100000
#: Seconds by which a span of the decision clock may fall short of a period and still count as
#: it (:func:`elapsed`): on a ``frame / fps`` timeline (``edgewise eval``) ``(k + 3) / 10 - k / 10``
#: is just under 0.3 for over half the k, which would hold a 0.3 s cooldown one frame longer.
CLOCK_SLACK_S = 1e-9


def elapsed(since: float, now: float, period: float) -> bool:
    """Whether ``period`` seconds have passed from ``since`` to ``now`` on the decision clock
    (up to float rounding, :data:`CLOCK_SLACK_S`): the one rule of the cooldown and the
    whole-frame refresh (``Payload.whole_frame_due``)."""
    return now - since >= period - CLOCK_SLACK_S


def fraction_cap(max_fraction: float, window_frames: int) -> int:
    """Escalations ``maxFraction`` allows in any ``window_frames`` frames (0: never)."""
    return int(math.floor(max_fraction * window_frames + 1e-9))


@dataclass(frozen=True)
class Limits:
    """The effective budget of one stream (resolved from the policy)."""

    max_fraction: float
    window_frames: int
    max_per_second: Optional[float]
    burst: int
    hardest_first: bool


class StreamBudget:
    """Budget state of one stream (not thread-safe; the Escalator holds a lock)."""

    def __init__(self, limits: Limits, now: float) -> None:
        self.limits = limits
        self.tokens = float(limits.burst)
        self.refilled_at = now
        self.frame = -1  # index of the current frame (frames seen - 1)
        self.escalated: Deque[int] = deque()  # frame indices of escalations in window
        # which of the last MAX_WINDOW_FRAMES frames escalated, one bit each in a ring (12.5 KB,
        # made at the first escalation): a reload to a larger window finds the earlier ones there
        self._marks: Optional[bytearray] = None
        self.cands: Deque[Tuple[int, float]] = deque()  # (frame index, hardness)
        self.sorted_h: List[float] = []  # hardness of cands, sorted
        self.last_escalation: Optional[float] = None
        self.last_frame_at: Optional[float] = None
        self.frame_interval: Optional[float] = None  # EWMA seconds between frames

    # --- per frame ------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Count one frame at ``now``: advance the window and refill the bucket."""
        self.frame += 1
        w = self.limits.window_frames
        if self._marks is not None:  # the ring's slot now holds this frame, not one MAX_WINDOW_FRAMES back
            slot = self.frame % MAX_WINDOW_FRAMES
            self._marks[slot >> 3] &= ~(1 << (slot & 7)) & 0xFF
        self._window_escalations(w)
        while self.cands and self.cands[0][0] <= self.frame - w:
            _, h = self.cands.popleft()
            del self.sorted_h[bisect.bisect_left(self.sorted_h, h)]
        if self.last_frame_at is not None and now > self.last_frame_at:
            dt = now - self.last_frame_at
            fi = self.frame_interval
            self.frame_interval = dt if fi is None else 0.9 * fi + 0.1 * dt
        self.last_frame_at = now if self.last_frame_at is None else max(now, self.last_frame_at)
        self.refill(now)

    def _window_escalations(self, w: int) -> None:
        """Keep in ``escalated`` only the escalations of the last ``w`` frames."""
        start = self.frame - w
        while self.escalated and self.escalated[0] <= start:
            self.escalated.popleft()

    def _widen(self, old_w: int, w: int) -> None:
        """A reload widened the window from ``old_w`` to ``w`` frames: the escalations of the
        frames the old one no longer covered come back from the ring."""
        marks = self._marks
        if marks is None or w <= old_w:
            return
        earlier = []
        for f in range(max(self.frame - w + 1, 0), max(self.frame - old_w + 1, 0)):
            slot = f % MAX_WINDOW_FRAMES
            if marks[slot >> 3] >> (slot & 7) & 1:
                earlier.append(f)
        self.escalated.extendleft(reversed(earlier))

    def refill(self, now: float) -> None:
        """Add tokens for the time since the last refill (a clock going back adds none). Without
        a rate the bucket is full: a reload that sets one again starts from ``burst``, not from
        what was left when an earlier reload took the rate away."""
        rate = self.limits.max_per_second
        if rate is None:
            self.tokens = float(self.limits.burst)
        elif now > self.refilled_at:
            self.tokens = min(float(self.limits.burst), self.tokens + (now - self.refilled_at) * rate)
        self.refilled_at = max(now, self.refilled_at)

    def add_candidate(self, hardness: float) -> int:
        """Record a candidate's hardness; return its percentile rank 0..100 in the window."""
        self.cands.append((self.frame, hardness))
        bisect.insort(self.sorted_h, hardness)
        n = len(self.sorted_h)
        return int(round(100.0 * bisect.bisect_right(self.sorted_h, hardness) / n))

    # --- checks -------------------------------------------------------------

    def fraction_cap(self) -> int:
        """Escalations allowed in any window of ``window_frames`` frames."""
        return fraction_cap(self.limits.max_fraction, self.limits.window_frames)

    def allowance(self) -> float:
        """Escalations the caps allow over one window (for the hardest-first gate)."""
        k = float(self.fraction_cap())
        rate = self.limits.max_per_second
        if rate is not None and self.frame_interval is not None:
            k = min(k, rate * self.limits.window_frames * self.frame_interval)
        return max(1.0, k)

    def priority_ok(self, hardness: float) -> bool:
        """Hardest-first gate: within the top ``allowance`` of recent candidates."""
        if not self.limits.hardest_first:
            return True
        k = int(math.floor(self.allowance()))
        n = len(self.sorted_h)
        if n <= k:
            return True
        return hardness >= self.sorted_h[n - k]

    def fraction_ok(self) -> bool:
        """Room left under maxFraction in the current window."""
        return len(self.escalated) + 1 <= self.fraction_cap()

    def tokens_ok(self) -> bool:
        """A whole token is available (or there is no rate limit)."""
        return self.limits.max_per_second is None or self.tokens >= 1.0 - 1e-9

    def in_cooldown(self, now: float, cooldown_s: float) -> bool:
        """Whether the last escalation is less than ``cooldown_s`` ago."""
        return (
            cooldown_s > 0
            and self.last_escalation is not None
            and not elapsed(self.last_escalation, now, cooldown_s)
        )

    def admit(self, now: float) -> None:
        """Spend the budget for one escalation at ``now``."""
        if self.limits.max_per_second is not None:
            self.tokens -= 1.0
        self.escalated.append(self.frame)
        if self._marks is None:
            self._marks = bytearray((MAX_WINDOW_FRAMES + 7) // 8)
        slot = self.frame % MAX_WINDOW_FRAMES
        self._marks[slot >> 3] |= 1 << (slot & 7)
        self.last_escalation = now

    # --- reload -------------------------------------------------------------

    def relimit(self, limits: Limits, now: float, keep_candidates: bool) -> None:
        """Apply new limits at ``now`` keeping history (tokens clipped to the new burst)."""
        self.refill(now)
        old_w = self.limits.window_frames
        self.limits = limits
        self.tokens = min(self.tokens, float(limits.burst))
        w = limits.window_frames
        self._window_escalations(w)
        self._widen(old_w, w)
        if not keep_candidates:
            self.cands.clear()
            self.sorted_h.clear()
        while self.cands and self.cands[0][0] <= self.frame - w:
            _, h = self.cands.popleft()
            del self.sorted_h[bisect.bisect_left(self.sorted_h, h)]
