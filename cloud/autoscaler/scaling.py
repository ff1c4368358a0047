"""The autoscaler's decision core: Kubernetes HPA v2's algorithm on our pool metrics.

Pure and clock-injected: :meth:`Scaler.decide` takes ``now``, the Deployment's
current replicas and a :class:`PoolSample`, and returns a :class:`Decision`;
:meth:`Scaler.record_scale` is told when a change was applied. No I/O.

Every rule follows the HPA controller (docs/design/autoscaling.md#the-hpa-algorithm; kubernetes
``pkg/controller/podautoscaler/horizontal.go`` and ``replica_calculator.go``):

1. **Inactive at zero.** Current replicas 0 with min ≥ 1 → do nothing (HPA sets
   ScalingActive=False, so an operator can pause a Deployment by scaling it to 0).
2. **Out of range first.** current > max → max; current < min → min, before any
   metric is read (``reconcileAutoscaler``).
3. **Core formula.** desired = ceil(n × metric / target) where n is the number of
   workers with metrics, no change if |metric/target − 1| ≤ tolerance (0.1,
   ``--horizontal-pod-autoscaler-tolerance``).
4. **Missing metrics are conservative.** Replicas the Deployment has but the
   gateways do not report (starting, missing) count as 100 % of target when the
   ratio says "down" and 0 % when it says "up"; if that correction flips the
   direction or lands inside the tolerance, no change (``calcPlainMetricReplicas``).
5. **Several metrics → the largest recommendation** (load, utilization and queue
   wait may be set together). **Stale or absent metrics → no change**; **partial metrics**
   (a gateway did not answer) → scale-up allowed, scale-down skipped (HPA skips
   scaling when a metric fails and the rest suggest scale-down).
6. **Stabilization.** Current replicas are raised to the min of the raw
   recommendations within the scale-up window and lowered to the max of those
   within the scale-down window (defaults: 0 s up, 300 s down).
   The window is seeded with the current replicas when the scaler starts
   (``maybeInitScaleDownStabilizationWindow``), so a restart never scales down at once.
7. **Rate limits.** Policies limit the change per period relative to the replica
   count at the start of the period (current − added + removed within it); Percent
   rounds up on scale-up and down on scale-down; selectPolicy Max picks the policy
   allowing the largest change, Min the smallest, Disabled forbids that direction.
   Defaults: up = max(+100 %, +4 pods) per 15 s; down = −100 % per 15 s.
8. **min/max** clamp last (``convertDesiredReplicasWithBehaviorRate``).

Load mode: metric = arrivals per second / peak capacity (the fraction of what
the ready workers can serve at their best batch size that the offered requests
use). Unlike in-flight / capacity, which stays near 0 with headroom and
explodes near saturation (queueing multiplies it), it scales as 1 / replicas,
which is what the core formula assumes, and it is a rate over the whole interval
rather than an instant's count. The denominator is the peak, not the measured
capacity, because the latter follows the batch sizes the load happens to form:
low when lightly loaded, so the ratio would rise and fall with batching rather
than with demand.

Queue-wait mode: metric = observed p90 queue wait, target = the SLO; a queue wait
is not linear in replicas and is ~0 whenever there is headroom, so on its own it
recommends min replicas in quiet periods (held back only by the 300 s window).
Pair it with a load target (rule 5) to keep a floor.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from edgewise.errors import ConfigError
from edgewise.settings import Invalid, check, setting

#: The shipped target of the autoscaler (``target_load`` when no target is configured, and the
#: chart's ``autoscaling.targetLoad``): the cheapest load target that kept every tuning day of
#: the fleet simulation within half its SLO budget (``python bench/fleet.py --tune``).
DEFAULT_TARGET_LOAD = 0.8

PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]


@dataclass(frozen=True)
class ScalingPolicy:
    """At most ``value`` pods (or percent) of change per ``period_s`` seconds."""

    type: PolicyType = setting("Pods: change by at most `value` pods; Percent: by `value` percent of the "
                               "replicas at the start of the period.")
    value: int = setting("Most pods, or percent, of change per period.", lo=1)
    period_s: float = setting("Length of the period, seconds (HPA periodSeconds).", lo=0, hi=1800, lo_open=True)

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class ScalingRules:
    """One direction's behaviour (HPA ``behavior.scaleUp`` / ``scaleDown``)."""

    stabilization_window_s: float = setting(
        "Stabilization window, seconds: scale up to the lowest (down to the highest) recommendation "
        "within it.", lo=0, hi=3600)
    policies: tuple[ScalingPolicy, ...] = setting("Rate limits of this direction.")
    select_policy: SelectPolicy = setting("Max: the policy allowing the largest change wins; Min: the "
                                          "smallest; Disabled: never scale in this direction.", "Max")

    def __post_init__(self) -> None:
        check(self)
        if not self.policies and self.select_policy != "Disabled":
            raise Invalid("policies", "at least one scaling policy is needed unless select_policy is Disabled")


def default_scale_up() -> ScalingRules:
    """HPA default: no stabilization, max(+100 %, +4 pods) per 15 s."""
    return ScalingRules(0.0, (ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0)), "Max")


def default_scale_down() -> ScalingRules:
    """HPA default: 300 s stabilization, −100 % per 15 s."""
    return ScalingRules(300.0, (ScalingPolicy("Percent", 100, 15.0),), "Max")


@dataclass(frozen=True)
class ScalerConfig:
    """Targets and limits. At least one target must be set."""

    min_replicas: int = 1
    max_replicas: int = 10
    target_utilization: float | None = 0.7
    queue_wait_slo_ms: float | None = None
    target_load: float | None = None
    tolerance: float = 0.1
    stale_after_s: float = 45.0
    scale_up: ScalingRules = field(default_factory=default_scale_up)
    scale_down: ScalingRules = field(default_factory=default_scale_down)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ConfigError(
                f"need 1 <= min_replicas <= max_replicas, got min={self.min_replicas} max={self.max_replicas}")
        if self.target_utilization is None and self.queue_wait_slo_ms is None and self.target_load is None:
            raise ConfigError("set a target: target_load (e.g. 0.8), target_utilization (e.g. 0.1) or "
                              "queue_wait_slo_ms (e.g. 50)")
        for name in ("target_utilization", "queue_wait_slo_ms", "target_load"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        if not 0 <= self.tolerance < 1:
            raise ConfigError(f"tolerance must be in [0, 1), got {self.tolerance!r}")
        if self.stale_after_s <= 0:
            raise ConfigError(f"stale_after_s must be > 0, got {self.stale_after_s!r}")


@dataclass(frozen=True)
class PoolSample:
    """Pool load as the gateways reported it at time ``at``."""

    at: float
    in_flight: float          # Σ in-flight over gateways
    capacity: float           # Σ capacity over distinct READY workers
    ready_workers: int        # distinct READY, non-ejected workers with capacity > 0
    queue_wait_ms_p90: float | None = None  # max over gateways (a p90 cannot be summed)
    complete: bool = True     # every gateway answered
    arrivals_per_s: float | None = None  # Σ requests/s over gateways since the last poll (None: unknown)
    peak_capacity: float = 0.0  # Σ images/s at each ready worker's best batch size (0: use capacity)

    @property
    def load(self) -> float | None:
        """Arrivals per second / peak capacity (None while the rate is unknown or no capacity)."""
        cap = self.peak_capacity or self.capacity
        return None if self.arrivals_per_s is None or cap <= 0 else self.arrivals_per_s / cap


Direction = Literal["up", "down", "none"]


@dataclass(frozen=True)
class Decision:
    """What to do and why. ``desired == current`` means no change."""

    at: float
    current: int
    desired: int
    recommendation: int | None  # raw metric recommendation (None: none computed)
    stabilized: int | None
    reason: str
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def direction(self) -> Direction:
        return "up" if self.desired > self.current else "down" if self.desired < self.current else "none"


def metric_replicas(
    ratio: float, ready: int, current: int, tolerance: float,
) -> tuple[int, str]:
    """HPA ``calcPlainMetricReplicas`` for one metric: ratio = metric/target over ``ready`` pods.

    Pods of ``current`` without metrics (``current - ready``) are assumed at 100 %
    of target when scaling down, 0 % when scaling up.
    """
    if not math.isfinite(ratio * ready):  # a capacity reported as ~0: no replica count follows from it
        return current, f"metric ratio {ratio:g} is not usable: holding"
    missing = max(0, current - ready)
    if missing == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current, "within tolerance"
        return math.ceil(ratio * ready), "metric"
    fill = 1.0 if ratio < 1.0 else 0.0
    new_ratio = (ratio * ready + fill * missing) / (ready + missing)
    if abs(1.0 - new_ratio) <= tolerance or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current, f"within tolerance after assuming {missing} replica(s) without metrics"
    desired = math.ceil(new_ratio * (ready + missing))
    if (new_ratio < 1.0 and desired > current) or (new_ratio > 1.0 and desired < current):
        return current, "direction flipped by replicas without metrics"
    return desired, f"metric ({missing} replica(s) without metrics assumed at {fill:.0%} of target)"


@dataclass
class _Event:
    at: float
    change: int  # replicas added (>0) or removed (<0)


class Scaler:
    """HPA's stateful normalisation: recommendation history and scale events."""

    def __init__(self, config: ScalerConfig) -> None:
        self.config = config
        self._recs: deque[tuple[float, int]] = deque()
        self._events: deque[_Event] = deque()
        self._seeded = False

    # --- public -----------------------------------------------------------------
    def decide(self, now: float, current: int, sample: PoolSample | None) -> Decision:
        cfg = self.config
        if current == 0:
            return Decision(now, 0, 0, None, None, "target has 0 replicas: autoscaling inactive "
                            "(HPA ScalingActive=False); scale it to >= 1 to resume")
        if not self._seeded:  # HPA maybeInitScaleDownStabilizationWindow
            self._seeded = True
            if cfg.scale_down.stabilization_window_s > 0:
                self._recs.append((now, current))
        if current > cfg.max_replicas:
            return Decision(now, current, cfg.max_replicas, None, None, "current above max_replicas")
        if current < cfg.min_replicas:
            return Decision(now, current, cfg.min_replicas, None, None, "current below min_replicas")
        if sample is None:
            return Decision(now, current, current, None, None, "no metrics: holding (HPA does not act without metrics)")
        age = now - sample.at
        if age > cfg.stale_after_s:
            return Decision(now, current, current, None, None,
                            f"metrics stale ({age:.3g} s old > {cfg.stale_after_s:g} s): holding")
        rec, why, metrics = self._recommend(current, sample)
        if rec is None:
            return Decision(now, current, current, None, None, why, metrics)
        if not sample.complete and rec < current:
            rec, why = current, "partial metrics (a gateway did not answer): no scale-down"
        stabilized = self._stabilize(now, current, rec)
        desired, limit_why = self._limit(now, current, stabilized)
        reason = why if stabilized == rec else f"{why}; stabilized {rec}->{stabilized}"
        if limit_why:
            reason += f"; {limit_why}"
        return Decision(now, current, desired, rec, stabilized, reason, metrics)

    def record_scale(self, now: float, before: int, after: int) -> None:
        """Tell the scaler a change was applied (feeds the rate-limit periods). Events older than
        the longest period are forgotten here too, not only when a decision reaches the rate
        limits: a target that another controller keeps moving outside [min_replicas,
        max_replicas] is brought back at every tick by a decision that never gets there, and its
        history grew by one event a tick for as long as that went on."""
        if after != before:
            self._events.append(_Event(now, after - before))
        self._forget_events(now)

    def _forget_events(self, now: float) -> None:
        """Drop the scale events no rate-limit period reaches back to any more."""
        cfg = self.config
        longest = max((p.period_s for r in (cfg.scale_up, cfg.scale_down) for p in r.policies), default=0.0)
        while self._events and self._events[0].at <= now - longest:
            self._events.popleft()

    # --- steps ------------------------------------------------------------------
    def _recommend(self, current: int, s: PoolSample) -> tuple[int | None, str, dict[str, float]]:
        cfg = self.config
        recs: list[tuple[int, str]] = []
        metrics: dict[str, float] = {}
        if s.ready_workers <= 0 or s.capacity <= 0:
            return None, "no ready workers with capacity reported: holding", metrics
        if cfg.target_utilization is not None:
            util = s.in_flight / s.capacity
            metrics["utilization"] = util
            n, why = metric_replicas(util / cfg.target_utilization, s.ready_workers, current, cfg.tolerance)
            recs.append((n, f"utilization {util:.4g} vs target {cfg.target_utilization:g}: {why}"))
        load = s.load
        if cfg.target_load is not None and load is not None:
            metrics["load"] = load
            n, why = metric_replicas(load / cfg.target_load, s.ready_workers, current, cfg.tolerance)
            recs.append((n, f"load {load:.4g} vs target {cfg.target_load:g}: {why}"))
        if cfg.queue_wait_slo_ms is not None and s.queue_wait_ms_p90 is not None:
            qw = s.queue_wait_ms_p90
            metrics["queue_wait_ms_p90"] = qw
            n, why = metric_replicas(qw / cfg.queue_wait_slo_ms, s.ready_workers, current, cfg.tolerance)
            recs.append((n, f"queue wait p90 {qw:.4g} ms vs SLO {cfg.queue_wait_slo_ms:g} ms: {why}"))
        missing = [name for name, target, value in (("arrival rate", cfg.target_load, s.arrivals_per_s),
                                                    ("queue wait p90", cfg.queue_wait_slo_ms, s.queue_wait_ms_p90))
                   if target is not None and value is None]
        if not recs:
            return None, f"{' and '.join(missing)} not reported: holding", metrics
        n, why = max(recs, key=lambda r: r[0])
        if missing and n < current:
            return current, why + f"; {' and '.join(missing)} missing: no scale-down", metrics
        return n, why, metrics

    def _stabilize(self, now: float, current: int, rec: int) -> int:
        # HPA stabilizeRecommendationWithBehaviors (k8s >= 1.22): the up limit is the min
        # of recommendations within the scale-up window, the down limit the max within the
        # scale-down window; current replicas are brought inside [up, down]. An old high
        # recommendation therefore holds a scale-down but never causes a scale-up.
        up_w = self.config.scale_up.stabilization_window_s
        down_w = self.config.scale_down.stabilization_window_s
        keep = max(up_w, down_w)
        while self._recs and self._recs[0][0] < now - keep:
            self._recs.popleft()
        up_rec = down_rec = rec
        for at, r in self._recs:
            if at > now - up_w:
                up_rec = min(up_rec, r)
            if at > now - down_w:
                down_rec = max(down_rec, r)
        self._recs.append((now, rec))
        return min(max(current, up_rec), down_rec)

    def _period_start(self, now: float, current: int, period_s: float) -> int:
        # current - added + removed within the period (HPA getReplicasChangePerPeriod)
        return current - sum(e.change for e in self._events if e.at > now - period_s)

    def _limit(self, now: float, current: int, desired: int) -> tuple[int, str]:
        cfg = self.config
        self._forget_events(now)
        if desired > current:
            limit = self._up_limit(now, current, cfg.scale_up)
            limit = max(limit, current)
            if cfg.max_replicas > limit:
                bound, why = limit, f"scale-up rate limit {limit}"
            else:
                bound, why = cfg.max_replicas, f"max_replicas {cfg.max_replicas}"
            return (bound, why) if desired > bound else (desired, "")
        if desired < current:
            limit = self._down_limit(now, current, cfg.scale_down)
            limit = min(limit, current)
            if cfg.min_replicas < limit:
                bound, why = limit, f"scale-down rate limit {limit}"
            else:
                bound, why = cfg.min_replicas, f"min_replicas {cfg.min_replicas}"
            return (bound, why) if desired < bound else (desired, "")
        return desired, ""

    def _up_limit(self, now: float, current: int, rules: ScalingRules) -> int:
        if rules.select_policy == "Disabled":
            return current
        proposals = []
        for p in rules.policies:
            start = self._period_start(now, current, p.period_s)
            proposals.append(start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100)))
        return max(proposals) if rules.select_policy == "Max" else min(proposals)

    def _down_limit(self, now: float, current: int, rules: ScalingRules) -> int:
        if rules.select_policy == "Disabled":
            return current
        proposals = []
        for p in rules.policies:
            start = self._period_start(now, current, p.period_s)
            proposals.append(start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100)))
        return min(proposals) if rules.select_policy == "Max" else max(proposals)

