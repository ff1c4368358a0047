"""The escalation decision core: should this frame go to the cloud, and why (not)?

Pure logic over the policy, the per-stream budget state and the caller's
``now`` (or the injected clock); the daemon's pipeline calls :meth:`Escalator.decide`
once per frame and the policy watcher calls :meth:`Escalator.swap`.

Order of checks for one frame of a stream:

1. hardness = ``combine(signals, weights, mode)`` of the policy, or the learned
   hardness when it names a gain model (:mod:`edgewise.hardness.learned`).
   Besides the signals the policy reads only :class:`FrameFacts` of the edge boxes
   (class names, count, highest score), which the frame record keeps, so
   :meth:`Escalator.decide_facts` replays a recorded frame through this same code
   (``edgewise.policy.replay``).
2. stream ``mode: never`` -> not escalated (reason ``stream_never``);
   ``mode: always`` -> candidate (reason ``always``).
3. threshold (per-stream > per-class > global; the lowest threshold of the
   classes present wins) -> candidate (reason ``hard``); otherwise a
   deterministic ``auditFraction`` of easy frames are candidates (reason
   ``audit``), else not escalated (reason ``below_threshold``).
4. a candidate is suppressed (``escalate=False``, ``suppressed_by`` set) by, in
   this order, ``cooldown``, ``priority`` (hardest-first gate), ``budget_fraction``
   (maxFraction over the window) or ``budget_rate`` (token bucket).

**Reload** (:meth:`Escalator.swap`): the policy reference changes under the same
lock ``decide`` holds, so a frame sees either the old or the new policy, never
a mix. Budget state survives the swap: each stream's tokens are refilled up to its
last frame at the old rate and clipped to the new burst; the escalation window keeps its
history (a shrunken window drops what falls out of it, a larger one counts the escalations
before the swap it covers); the time of the last
escalation is kept so the *new* cooldown is measured from it; the recent
candidate hardness used by the hardest-first gate is kept unless the
``signals`` section or the gain model it names changed (hardness values are then on a
different scale).
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from edgewise.detections import Detections
from edgewise.hardness.signals import combine
from edgewise.policy.budget import Limits, StreamBudget
from edgewise.policy.digest import learned_digest
from edgewise.policy.schema import Policy

Clock = Callable[[], float]

#: ``Decision.reason`` values (stable: used as metric labels).
REASONS = ("hard", "always", "audit", "below_threshold", "stream_never")
#: The reasons an escalated frame carries (label ``reason`` of ``edgewise_edge_escalations_total``).
ESCALATING_REASONS = ("hard", "always", "audit")
#: ``Decision.suppressed_by`` values.
SUPPRESSORS = ("cooldown", "priority", "budget_fraction", "budget_rate")


@dataclass(frozen=True)
class Decision:
    """Outcome for one frame.

    Attributes:
        escalate: send the frame to the cloud.
        reason: why the frame was (or would have been) escalated, or why not:
            one of :data:`REASONS`.
        hardness: combined hardness in [0, 1].
        signals: the signals the hardness came from.
        priority: percentile 0..100 of this frame's hardness among the stream's
            recent candidates (100 = hardest); 0 for frames that are not
            candidates. Transports and the spool may use it to order work.
        suppressed_by: for a candidate that was not escalated, which limit
            stopped it (one of :data:`SUPPRESSORS`); ``None`` otherwise.
        detail: a human-readable sentence for logs and sinks.
        threshold: the threshold applied; ``origin`` names where it came from.
        policy_name: ``metadata.name`` of the policy that decided.
    """

    escalate: bool
    reason: str
    hardness: float
    signals: Dict[str, float]
    priority: int = 0
    suppressed_by: Optional[str] = None
    detail: str = ""
    threshold: float = 0.0
    origin: str = "global"
    policy_name: str = ""
    stream_id: str = ""
    frame_seq: int = 0


def _limits(policy: Policy, stream_id: str) -> Limits:
    rate, burst = policy.rate_for(stream_id)
    return Limits(
        max_fraction=policy.fraction_for(stream_id),
        window_frames=policy.spec.budget.window_frames,
        max_per_second=rate,
        burst=burst,
        hardest_first=policy.spec.budget.priority == "hardest",
    )


def audit_pick(stream_id: str, frame_seq: int, fraction: float) -> bool:
    """Deterministic pseudo-random choice of ``fraction`` of frames (reproducible runs)."""
    if fraction <= 0:
        return False
    h = zlib.crc32(f"{stream_id}\x00{frame_seq}".encode()) / 0xFFFFFFFF
    return h < fraction


def _class_names(dets: Detections) -> List[str]:
    if not dets.names or len(dets) == 0:
        return []
    seen = []
    for cid in set(int(c) for c in dets.class_ids):
        if 0 <= cid < len(dets.names):
            seen.append(dets.names[cid])
    return sorted(seen)


class FrameFacts(NamedTuple):
    """What the policy reads of a frame's edge boxes besides the signals.

    Attributes:
        classes: the distinct class names present, sorted (per-class thresholds).
        boxes: how many boxes (a learned-model feature).
        max_score: the highest box score, 0 without boxes (a learned-model feature).
    """

    classes: Tuple[str, ...]
    boxes: int
    max_score: float


def frame_facts(dets: Detections) -> FrameFacts:
    """The :class:`FrameFacts` of a frame's edge detections."""
    n = len(dets)
    return FrameFacts(tuple(_class_names(dets)), n, float(dets.scores.max()) if n else 0.0)


class Escalator:
    """Decides per frame, per stream, under an atomically swappable policy."""

    def __init__(self, policy: Policy, clock: Clock = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._lock = threading.Lock()
        self._streams: Dict[str, StreamBudget] = {}
        self.swaps = 0

    @property
    def policy(self) -> Policy:
        """The policy in force."""
        return self._policy

    def decide(
        self,
        stream_id: str,
        frame_seq: int,
        dets: Detections,
        signals: Mapping[str, float],
        now: Optional[float] = None,
    ) -> Decision:
        """Decide one frame; budget state of ``stream_id`` advances by one frame."""
        return self.decide_facts(stream_id, frame_seq, frame_facts(dets), signals, now)

    def decide_facts(
        self,
        stream_id: str,
        frame_seq: int,
        facts: FrameFacts,
        signals: Mapping[str, float],
        now: Optional[float] = None,
    ) -> Decision:
        """:meth:`decide` from the :class:`FrameFacts` of the boxes (what a frame record keeps)."""
        t = self._clock() if now is None else now
        with self._lock:
            return self._decide(self._policy, stream_id, frame_seq, facts, dict(signals), t)

    def _decide(
        self,
        policy: Policy,
        stream_id: str,
        frame_seq: int,
        facts: FrameFacts,
        signals: Dict[str, float],
        now: float,
    ) -> Decision:
        sig = policy.spec.signals
        hardness = (policy.learned.hardness_of(signals, facts.boxes, facts.max_score)
                    if policy.learned is not None else combine(signals, sig.weights, sig.combine))
        st = self._streams.get(stream_id)
        if st is None:
            st = self._streams[stream_id] = StreamBudget(_limits(policy, stream_id), now)
        st.tick(now)
        mode = policy.stream(stream_id).mode
        threshold, origin = policy.threshold_for(stream_id, facts.classes)

        def out(escalate: bool, reason: str, detail: str, priority: int = 0,
                suppressed_by: Optional[str] = None) -> Decision:
            return Decision(
                escalate=escalate, reason=reason, hardness=hardness, signals=signals,
                priority=priority, suppressed_by=suppressed_by, detail=detail,
                threshold=threshold, origin=origin, policy_name=policy.metadata.name,
                stream_id=stream_id, frame_seq=frame_seq,
            )

        if mode == "never":
            return out(False, "stream_never", f"stream {stream_id} has mode never")
        if mode == "always":
            reason, detail = "always", f"stream {stream_id} has mode always"
        elif hardness >= threshold:
            reason = "hard"
            detail = f"hardness {hardness:.3f} >= threshold {threshold:.3f} ({origin})"
        elif audit_pick(stream_id, frame_seq, policy.spec.audit_fraction):
            reason = "audit"
            detail = f"random audit ({policy.spec.audit_fraction:.3f} of frames)"
        else:
            return out(
                False, "below_threshold",
                f"hardness {hardness:.3f} < threshold {threshold:.3f} ({origin})",
            )
        priority = st.add_candidate(hardness)
        cooldown = policy.cooldown_for(stream_id)
        if st.in_cooldown(now, cooldown):
            return out(False, reason, f"{detail}; in cooldown ({cooldown:g}s)", priority, "cooldown")
        if reason != "always" and not st.priority_ok(hardness):
            return out(
                False, reason, f"{detail}; not among the hardest recent frames", priority, "priority"
            )
        if not st.fraction_ok():
            return out(
                False, reason,
                f"{detail}; maxFraction {st.limits.max_fraction:g} of {st.limits.window_frames} "
                "frames used", priority, "budget_fraction",
            )
        if not st.tokens_ok():
            return out(
                False, reason, f"{detail}; rate {st.limits.max_per_second:g}/s used", priority,
                "budget_rate",
            )
        st.admit(now)
        return out(True, reason, detail, priority)

    def swap(self, policy: Policy) -> None:
        """Put ``policy`` in force from the next frame on (budget state kept; see module doc).
        Each stream's bucket is brought up to its own last frame, on its own decision clock:
        streams need not share one (an uncapped video file's runs on its recording's timeline,
        ``edge.pipeline``), so a swap time on another clock would refill one stream for time it
        never had or starve it until its clock caught up."""
        with self._lock:
            # a new gain model at the same learnedModel path is a new hardness scale too
            keep = (policy.spec.signals == self._policy.spec.signals
                    and learned_digest(policy) == learned_digest(self._policy))
            for sid, st in self._streams.items():
                st.relimit(_limits(policy, sid), st.refilled_at, keep_candidates=keep)
            self._policy = policy
            self.swaps += 1

    def budget_state(self, stream_id: str) -> Optional[Dict[str, float]]:
        """Tokens, escalations in window and candidates in window of a stream (for metrics)."""
        with self._lock:
            st = self._streams.get(stream_id)
            if st is None:
                return None
            return {
                "tokens": st.tokens,
                "escalated_in_window": float(len(st.escalated)),
                "candidates_in_window": float(len(st.cands)),
                "frames": float(st.frame + 1),
            }

    def forget(self, stream_id: str) -> None:
        """Drop a removed stream's budget state."""
        with self._lock:
            self._streams.pop(stream_id, None)
