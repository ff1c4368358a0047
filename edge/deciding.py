"""Per-frame decision of the edge daemon: hardness signals, then the escalation policy.

Thin stateful wrapper around the pure cores ``edgewise.hardness.signals.recorded_signals``
and ``edgewise.policy.Escalator``: keeps each stream's tracker state and the
policy in force. ``swap`` replaces the policy atomically; the pipeline calls
``decide`` and ``swap`` from the event-loop thread only, so a new policy always
takes effect between two frames, and every verdict names the policy generation
that produced it. The policy's ``Decision`` is passed through whole (its
detail, threshold and origin reach the frame record), next to the generation and
what deciding cost. When the policy uses motion (a motion weight, a gain model fitted
on it, or a region payload, ``Policy.uses_motion``) each stream also keeps a
``MotionDetector`` fed with the frame's pixels: its signals join the others and its
unexplained blobs go with the verdict, for the region payload. A stream back from an outage
(``resumed``) starts its tracker and motion model afresh. When the policy's gain model
reads the carry state (``Policy.uses_carry``), the stream's carried boxes (``carried``, from
``edge.carrying``), the frames since its last escalation (under whichever policy) and the
regions the policy in force proposes on that escalation's frame give the carry-state features
(:mod:`edgewise.hardness.carrystate`), which join the signals. The policy decides on
the signals (motion ones included) at the record's precision, and the verdict carries
everything else it read (the clock value, the facts of the edge boxes, the policy's
digest), so the frame record holds the whole input of the decision and
``edgewise edge check-policy --replay`` reproduces it exactly (docs/records.md).
Callers: ``edge.pipeline``, ``edge.daemon`` (hot reload).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from edgewise.detections import Detections
from edgewise.hardness.carrystate import carry_features
from edgewise.hardness.motion import MotionConfig, MotionDetector
from edgewise.hardness.signals import (
    SignalConfig,
    as_recorded,
    combine,
    recorded_signals,
    score_bands,
)
from edgewise.hardness.tracking import TrackerState
from edgewise.policy.deciding import Decision, Escalator, FrameFacts, frame_facts
from edgewise.policy.digest import policy_digest
from edgewise.policy.schema import Policy

#: Without a policy file nothing is escalated; hardness is still measured, with
#: the policy schema's default band, signals and weights.
NO_POLICY = Policy()


#: ``Decision.reason`` of every frame while no policy file is configured.
NO_POLICY_REASON = "no policy"


@dataclass(frozen=True)
class Verdict:
    """The policy's decision for one frame, the generation of the policy that made it,
    the milliseconds signals (motion included) + decision took (the per-frame cost the
    bench reports), and the motion blobs no detection explains ([k, 4] frame pixels;
    None when the policy does not use motion); ``now`` (the decision clock), ``facts``
    and ``policy_digest`` are the rest of what the decision read, for the frame record."""

    decision: Decision
    policy_generation: int
    cost_ms: float
    now: float = 0.0
    facts: FrameFacts = FrameFacts((), 0, 0.0)
    policy_digest: str = ""
    motion_blobs: Optional[np.ndarray] = None


class LastEscalation:
    """A stream's last escalation, kept whatever the policy in force: its frame number, what
    the region proposals read (the edge's boxes, the motion blobs found then: None when the
    policy then in force ran no motion detector, and the frame size), and the regions the
    policy of generation ``generation`` proposes on it (computed when a carry-aware policy
    first reads them; generation 0: not yet)."""

    __slots__ = ("seq", "dets", "blobs", "size", "generation", "regions")

    def __init__(self, seq: int, dets: Detections, blobs: Optional[np.ndarray], size: Tuple[int, int],
                 generation: int = 0, regions: Optional[np.ndarray] = None) -> None:
        self.seq, self.dets, self.blobs, self.size = seq, dets, blobs, size
        self.generation, self.regions = generation, regions


def _motion_config(policy: Optional[Policy]) -> Optional[MotionConfig]:
    """The motion detector's settings under ``policy`` (None: it does not use motion)."""
    return policy.spec.signals.motion.config() if policy is not None and policy.uses_motion() else None


class Decider:
    """Hardness + policy for every stream of one daemon; ``policy`` may be None
    (no policy file: nothing is escalated, hardness still measured with defaults)."""

    def __init__(self, policy: Optional[Policy], clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.policy = policy
        self.generation = 1
        self.escalator = Escalator(policy, clock) if policy is not None else None
        self.digest = policy_digest(policy) if policy is not None else ""
        self.tracker: Dict[str, TrackerState] = {}
        self.motion: Dict[str, MotionDetector] = {}
        self._motion_cfg = _motion_config(policy)
        self._carry = policy is not None and policy.uses_carry()  # read once per policy, not per frame
        #: per stream, the frame size its last signal config was made for, and that config: one
        #: entry per stream, whatever the number of distinct frame sizes it brings over time
        self._cfg: Dict[str, Tuple[Tuple[int, int], SignalConfig]] = {}
        #: per stream, its last escalation under any policy, for the carry-state features
        self.escalated: Dict[str, LastEscalation] = {}

    def swap(self, policy: Policy) -> int:
        """Put ``policy`` in force from the next frame on; returns its generation."""
        if self.escalator is None:
            self.escalator = Escalator(policy, self.clock)
        else:
            self.escalator.swap(policy)
        self.policy = policy
        self.digest = policy_digest(policy)
        self._motion_cfg = _motion_config(policy)
        self._carry = policy.uses_carry()
        self._cfg.clear()
        self.generation += 1
        return self.generation

    def resumed(self, stream_id: str) -> None:
        """``stream_id`` came back after an outage: its tracker and motion model start afresh
        (warm-up included), as at a stream's start or a change of resolution. The frames before
        the outage say nothing about its next one: compared with them, what changed while the
        camera was down read as boxes vanished and unexplained motion, a hard frame at every
        reconnect. Its budget and last escalation are kept (the policy's, not the scene's)."""
        self.tracker.pop(stream_id, None)
        self.motion.pop(stream_id, None)

    def _signal_config(self, stream_id: str, size: Tuple[int, int]) -> SignalConfig:
        held = self._cfg.get(stream_id)
        if held is not None and held[0] == size:
            return held[1]
        cfg = (self.policy or NO_POLICY).signal_config(stream_id, size)
        self._cfg[stream_id] = (size, cfg)
        return cfg

    def _last_regions(self, stream_id: str, last: LastEscalation, size: Tuple[int, int],
                      cfg: SignalConfig) -> Optional[np.ndarray]:
        """The regions the policy in force proposes on the stream's last escalation (None: it
        would go whole), once per escalation and policy generation; ``cfg`` is the stream's
        signal config for frames of ``size``."""
        if last.generation != self.generation and self.policy is not None:
            if last.size != size:
                cfg = self.policy.signal_config(stream_id, last.size)
            last.regions = self.policy.spec.payload.proposals(last.dets, last.blobs, last.size,
                                                              score_bands(last.dets, cfg))
            last.generation = self.generation
        return last.regions

    def _motion(self, stream_id: str) -> Optional[MotionDetector]:
        """The stream's motion detector when the policy uses motion (a new one when the
        policy's motion settings changed), else None."""
        cfg = self._motion_cfg
        if cfg is None:
            self.motion.pop(stream_id, None)
            return None
        det = self.motion.get(stream_id)
        if det is None or det.cfg != cfg:
            det = self.motion[stream_id] = MotionDetector(cfg)
        return det

    def decide(self, stream_id: str, seq: int, dets: Detections, frame_size: Tuple[int, int],
               now: Optional[float] = None, frame: Optional[np.ndarray] = None,
               carried: Optional[Detections] = None) -> Verdict:
        """Signals and decision for one frame (``frame_size`` is (width, height); ``frame``,
        its pixels, feeds the motion detector when the policy uses motion; ``carried``, the
        boxes the stream carries onto it, the carry-state features when the policy reads them)."""
        t0 = time.perf_counter()
        now = self.clock() if now is None else now
        cfg = self._signal_config(stream_id, frame_size)
        motion = self._motion(stream_id) if frame is not None else None
        found = motion.update(frame, dets) if motion is not None and frame is not None else None
        signals, self.tracker[stream_id] = recorded_signals(dets, self.tracker.get(stream_id), cfg, frame_size,
                                                            found.signals if found is not None else None)
        proposed = None
        blobs = found.blobs if found is not None else None
        if self._carry and self.policy is not None:
            band = score_bands(dets, cfg)
            proposed = self.policy.spec.payload.proposals(dets, blobs, frame_size, band)
            last = self.escalated.get(stream_id)
            signals.update(as_recorded(carry_features(
                dets, dets.scored_within(*band), carried, None if last is None else seq - last.seq, blobs, proposed,
                None if last is None else self._last_regions(stream_id, last, frame_size, cfg))))
        facts = frame_facts(dets)
        if self.escalator is None:
            sig = NO_POLICY.spec.signals
            d = Decision(False, NO_POLICY_REASON, combine(signals, sig.weights, sig.combine), signals,
                         detail="no policy file: nothing is escalated", origin="", stream_id=stream_id,
                         frame_seq=seq)
        else:
            d = self.escalator.decide_facts(stream_id, seq, facts, signals, now)
            if d.escalate:  # under any policy: a carry-aware one may be put in force later
                self.escalated[stream_id] = LastEscalation(seq, dets, blobs, frame_size,
                                                           self.generation if self._carry else 0, proposed)
        return Verdict(d, self.generation, (time.perf_counter() - t0) * 1000.0, now, facts, self.digest,
                       blobs)
