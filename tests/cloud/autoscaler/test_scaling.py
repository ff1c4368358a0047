"""The HPA decision core on a fake clock: formula, tolerance, stabilization, rate limits, min/max,
missing/stale metrics, queue-wait mode, plus hypothesis properties over random load sequences."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.autoscaler.scaling import (
    PoolSample,
    Scaler,
    ScalerConfig,
    ScalingPolicy,
    ScalingRules,
    metric_replicas,
)
from edgewise.errors import ConfigError


def sample(now, n, util, *, cap_per_worker=10.0, qw=None, complete=True):
    """A pool of n ready workers at the given utilization (in_flight / capacity)."""
    cap = n * cap_per_worker
    return PoolSample(at=now, in_flight=util * cap, capacity=cap, ready_workers=n,
                      queue_wait_ms_p90=qw, complete=complete)


def load(now, n, in_flight, cap_per_worker=10.0):
    """A pool of n ready workers carrying a fixed in-flight load."""
    return PoolSample(at=now, in_flight=in_flight, capacity=n * cap_per_worker, ready_workers=n)


def run(scaler, steps, current, t=0.0):
    """Apply each (dt, in_flight) step; the pool follows the decisions at once. Returns decisions."""
    out = []
    for dt, in_flight in steps:
        t += dt
        d = scaler.decide(t, current, load(t, current, in_flight))
        scaler.record_scale(t, current, d.desired)
        current = d.desired
        out.append(d)
    return out


def test_core_formula_is_ceil_current_times_ratio():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=100, target_utilization=0.5))
    d = s.decide(0.0, 4, sample(0.0, 4, 0.9))
    assert d.recommendation == math.ceil(4 * 0.9 / 0.5) == 8
    assert d.desired == 8 and d.direction == "up"


def test_tolerance_band_holds_both_ways():
    cfg = ScalerConfig(min_replicas=1, max_replicas=100, target_utilization=0.5, tolerance=0.1)
    s = Scaler(cfg)
    assert s.decide(0.0, 10, sample(0.0, 10, 0.54)).desired == 10   # ratio 1.08: inside
    assert s.decide(1.0, 10, sample(1.0, 10, 0.46)).desired == 10   # ratio 0.92: inside
    assert s.decide(2.0, 10, sample(2.0, 10, 0.56)).desired == 12   # ratio 1.12: ceil(11.2)


def test_scale_down_waits_for_stabilization_window():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.5))
    # 40 in flight at t=0..30 (recommendation ceil(40/(10*0.5)) = 8), then 5 from t=45
    ds = run(s, [(0, 40.0)] + [(15, 40.0)] * 2 + [(15, 5.0)] * 30, current=4)
    assert ds[0].desired == 8
    assert [d.recommendation for d in ds[3:6]] == [1, 1, 1]
    # the last high recommendation was at t=30; HPA keeps it while at > now - 300
    held = [d for d in ds if d.at < 30 + 300]
    assert all(d.desired == 8 for d in held), [(d.at, d.desired) for d in held]
    first_down = next(d for d in ds if d.direction == "down")
    assert first_down.at == 330.0
    assert first_down.desired == 1


def test_fresh_scaler_does_not_scale_down_at_once():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.5))
    d = s.decide(1000.0, 6, sample(1000.0, 6, 0.05))
    assert d.recommendation == 1 and d.desired == 6, d.reason
    d = s.decide(1301.0, 6, sample(1301.0, 6, 0.05))
    assert d.desired == 1


def test_scale_up_rate_limit_max_of_percent_and_pods():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=100, target_utilization=0.1))
    d = s.decide(0.0, 2, sample(0.0, 2, 5.0))            # wants 100
    assert d.recommendation == 100 and d.desired == 6     # max(2*2, 2+4)
    s.record_scale(0.0, 2, 6)
    d = s.decide(5.0, 6, sample(5.0, 6, 5.0))             # same period: start 2 -> limit 6
    assert d.desired == 6 and "rate limit" in d.reason
    d = s.decide(15.0, 6, sample(15.0, 6, 5.0))           # new period: max(12, 10)
    assert d.desired == 12
    s.record_scale(15.0, 6, 12)
    assert s.decide(30.0, 12, sample(30.0, 12, 5.0)).desired == 24


def test_select_policy_min_and_disabled():
    up_min = ScalingRules(0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 1, 15)), "Min")
    s = Scaler(ScalerConfig(max_replicas=100, target_utilization=0.1, scale_up=up_min))
    assert s.decide(0.0, 4, sample(0.0, 4, 5.0)).desired == 5
    off = ScalingRules(0, (), "Disabled")
    s = Scaler(ScalerConfig(max_replicas=100, target_utilization=0.1, scale_up=off))
    assert s.decide(0.0, 4, sample(0.0, 4, 5.0)).desired == 4


def test_scale_down_rate_limit_pods_policy():
    down = ScalingRules(0, (ScalingPolicy("Pods", 2, 60),), "Max")
    s = Scaler(ScalerConfig(max_replicas=100, target_utilization=0.5, scale_down=down))
    assert s.decide(0.0, 10, sample(0.0, 10, 0.05)).desired == 8
    s.record_scale(0.0, 10, 8)
    assert s.decide(30.0, 8, sample(30.0, 8, 0.05)).desired == 8
    assert s.decide(61.0, 8, sample(61.0, 8, 0.05)).desired == 6


def test_min_and_max_bound_the_result():
    s = Scaler(ScalerConfig(min_replicas=2, max_replicas=5, target_utilization=0.1,
                            scale_down=ScalingRules(0, (ScalingPolicy("Percent", 100, 15),))))
    d = s.decide(0.0, 4, sample(0.0, 4, 9.0))
    assert d.desired == 5 and "max_replicas" in d.reason
    d = s.decide(1.0, 4, sample(1.0, 4, 0.0))
    assert d.desired == 2 and "min_replicas" in d.reason
    # out of range before any metric: HPA clamps first, even without metrics
    assert s.decide(2.0, 9, None).desired == 5
    assert s.decide(3.0, 1, None).desired == 2


def test_zero_replicas_means_inactive():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=5))
    d = s.decide(0.0, 0, sample(0.0, 1, 5.0))
    assert d.desired == 0 and "inactive" in d.reason


def test_stale_or_missing_metrics_hold():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.5, stale_after_s=30,
                            scale_down=ScalingRules(0, (ScalingPolicy("Percent", 100, 15),))))
    assert s.decide(100.0, 6, None).desired == 6
    d = s.decide(100.0, 6, sample(60.0, 6, 0.0))          # 40 s old
    assert d.desired == 6 and "stale" in d.reason
    d = s.decide(100.0, 6, sample(60.0, 6, 5.0))          # stale even if it says "up"
    assert d.desired == 6
    d = s.decide(100.0, 6, PoolSample(100.0, 3.0, 0.0, 0))  # no workers with capacity
    assert d.desired == 6 and "no ready workers" in d.reason


def test_partial_metrics_allow_up_not_down():
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.5,
                            scale_down=ScalingRules(0, (ScalingPolicy("Percent", 100, 15),))))
    d = s.decide(0.0, 6, sample(0.0, 6, 0.05, complete=False))
    assert d.desired == 6 and "partial" in d.reason
    d = s.decide(1.0, 6, sample(1.0, 6, 1.0, complete=False))
    assert d.desired == 12


def test_replicas_without_metrics_are_conservative():
    # 5 replicas, gateways see 3: scale-down treats the 2 missing as at target
    assert metric_replicas(0.2, 3, 5, 0.1) == (math.ceil(0.2 * 3 + 2), metric_replicas(0.2, 3, 5, 0.1)[1])
    # scale-up treats the 2 missing as idle: ceil(2.0*3) = 6 rather than ceil(2.0*5)
    assert metric_replicas(2.0, 3, 5, 0.1)[0] == 6
    # ratio 1.5 over 3 seen, 2 missing at 0 % -> 0.9: flips direction -> hold
    assert metric_replicas(1.5, 3, 5, 0.1)[0] == 5


def test_queue_wait_mode_and_both_metrics():
    cfg = ScalerConfig(min_replicas=1, max_replicas=50, target_utilization=None, queue_wait_slo_ms=50)
    s = Scaler(cfg)
    d = s.decide(0.0, 3, sample(0.0, 3, 0.1, qw=120.0))
    assert d.recommendation == math.ceil(3 * 120 / 50) == 8 and d.desired == 7  # rate limit 3+4
    assert d.metrics["queue_wait_ms_p90"] == 120.0
    d = s.decide(1.0, 3, sample(1.0, 3, 0.1, qw=None))
    assert d.desired == 3 and "not reported" in d.reason
    both = Scaler(ScalerConfig(max_replicas=50, target_utilization=0.5, queue_wait_slo_ms=50))
    d = both.decide(0.0, 4, sample(0.0, 4, 1.5, qw=60.0))   # util says 12, queue says 5
    assert d.recommendation == 12


@pytest.mark.parametrize("kwargs", [
    dict(min_replicas=0), dict(min_replicas=5, max_replicas=4),
    dict(target_utilization=None, queue_wait_slo_ms=None), dict(target_utilization=-1),
    dict(tolerance=1.5), dict(stale_after_s=0),
])
def test_config_is_validated(kwargs):
    with pytest.raises(ConfigError):
        ScalerConfig(**kwargs)


def test_policies_are_validated():
    with pytest.raises(ConfigError):
        ScalingPolicy("Pods", 0, 15)
    with pytest.raises(ConfigError):
        ScalingPolicy("Replicas", 1, 15)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ScalingPolicy("Pods", 1, 4000)
    with pytest.raises(ConfigError):
        ScalingRules(0, (), "Max")


# --- properties ---------------------------------------------------------------------------------

steps_st = st.lists(
    st.tuples(st.sampled_from([1.0, 5.0, 7.5, 15.0, 30.0, 61.0, 200.0]),
              st.floats(min_value=0.0, max_value=400.0, allow_nan=False)),
    min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps=steps_st, lo=st.integers(1, 5), span=st.integers(0, 30), start=st.integers(1, 40),
       pods=st.integers(1, 6), pct=st.integers(10, 300))
def test_properties_bounds_window_and_rate(steps, lo, span, start, pods, pct):
    hi = lo + span
    up = ScalingRules(0, (ScalingPolicy("Percent", pct, 15), ScalingPolicy("Pods", pods, 15)), "Max")
    cfg = ScalerConfig(min_replicas=lo, max_replicas=hi, target_utilization=0.6, scale_up=up)
    s = Scaler(cfg)
    t, current = 0.0, start
    history = [(t, current)]          # (time, replicas after)
    recs = [(t, start)]               # seeded window
    for dt, in_flight in steps:
        t += dt
        d = s.decide(t, current, load(t, current, in_flight))
        # 1. never outside [min, max]
        assert lo <= d.desired <= hi
        if d.recommendation is not None:
            recs.append((t, d.recommendation))
            # 2. no scale-down below any recommendation made within the window
            if d.desired < d.current:
                in_window = [r for at, r in recs if at > t - cfg.scale_down.stabilization_window_s]
                assert d.desired >= min(max(in_window), d.current)
            # never scales past the current recommendation (old highs only hold)
            if d.desired > d.current:
                assert d.desired <= d.recommendation
        # 3. never more than the rate limit over any period
        if d.desired > current and current >= lo and current <= hi:
            r0 = [r for at, r in history if at <= t - 15]
            base = r0[-1] if r0 else start
            assert d.desired <= max(math.ceil(base * (1 + pct / 100)), base + pods, current)
        s.record_scale(t, current, d.desired)
        current = d.desired
        history.append((t, current))


def test_old_high_recommendation_holds_but_never_raises():
    # HPA >= 1.22: a high recommendation in the down window holds a scale-down;
    # it does not push replicas up once load has fallen.
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=50, target_utilization=0.5))
    d = s.decide(0.0, 4, load(0.0, 4, 200.0))           # wants 40, limited to 8
    assert (d.recommendation, d.desired) == (40, 8)
    s.record_scale(0.0, 4, 8)
    d = s.decide(15.0, 8, load(15.0, 8, 2.0))           # load gone: rec 1, window max 40
    assert d.recommendation == 1 and d.desired == 8


def test_scale_up_stabilization_window_needs_sustained_load():
    up = ScalingRules(60, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)), "Max")
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=50, target_utilization=0.5, scale_up=up))
    # a 15 s burst is ignored: the min over the last 60 s includes the seeded current replicas
    ds = run(s, [(0, 40.0), (15, 40.0), (15, 10.0), (15, 10.0)], current=4)
    assert [d.desired for d in ds] == [4, 4, 4, 4]
    # sustained load for a whole window: scale up to the smallest recommendation in it
    s = Scaler(ScalerConfig(min_replicas=1, max_replicas=50, target_utilization=0.5, scale_up=up))
    ds = run(s, [(0, 40.0)] + [(15, 40.0)] * 5, current=4)
    assert [d.desired for d in ds] == [4, 4, 4, 4, 8, 8]  # t=60: the t=0 seed left the window


def test_a_huge_reading_is_one_short_number_in_the_decision_reason():
    # a gateway that reported a tiny capacity made a load of 1e300, logged as a 301-digit number
    cfg = ScalerConfig(min_replicas=1, max_replicas=50, target_utilization=None, target_load=0.5)
    d = Scaler(cfg).decide(0.0, 4, PoolSample(0.0, in_flight=0.0, capacity=1e-290, ready_workers=4,
                                              arrivals_per_s=1e10))
    assert "load 1e+300 vs target 0.5" in d.reason and len(d.reason) < 200, d.reason


def test_load_mode_scales_with_the_arrival_rate():
    cfg = ScalerConfig(min_replicas=1, max_replicas=50, target_utilization=None, target_load=0.5)
    s = Scaler(cfg)
    # 4 workers of 10 req/s each offered 30 req/s: load 0.75 vs 0.5 -> ceil(4 * 1.5) = 6
    d = s.decide(0.0, 4, PoolSample(0.0, in_flight=0.0, capacity=40.0, ready_workers=4, arrivals_per_s=30.0))
    assert d.recommendation == 6 and d.metrics["load"] == 0.75 and "load 0.75 vs target 0.5" in d.reason
    # the in-flight count plays no part in load mode
    d = s.decide(1.0, 6, PoolSample(1.0, in_flight=500.0, capacity=60.0, ready_workers=6, arrivals_per_s=30.0))
    assert d.recommendation == 6
    # the rate not known yet (first poll, restarted gateway): hold
    d = s.decide(2.0, 6, PoolSample(2.0, in_flight=0.0, capacity=60.0, ready_workers=6))
    assert d.desired == 6 and d.recommendation is None and "arrival rate not reported" in d.reason
    # with a second metric the larger recommendation wins, but a missing rate never scales down
    both = Scaler(ScalerConfig(max_replicas=50, target_utilization=0.5, target_load=0.5, scale_down=ScalingRules(
        0.0, (ScalingPolicy("Percent", 100, 15.0),))))
    d = both.decide(0.0, 4, PoolSample(0.0, in_flight=1.0, capacity=40.0, ready_workers=4))
    assert d.desired == 4 and "arrival rate missing: no scale-down" in d.reason
    d = both.decide(15.0, 4, PoolSample(15.0, in_flight=1.0, capacity=40.0, ready_workers=4, arrivals_per_s=8.0))
    assert d.desired == 2  # util 0.025 says 1, load 0.2 says ceil(4 * 0.4) = 2
    with pytest.raises(ConfigError):
        ScalerConfig(target_utilization=None, target_load=0.0)
    # a worker reporting a vanishing capacity makes the ratio unusable: hold, never crash the tick
    d = s.decide(30.0, 6, PoolSample(30.0, in_flight=0.0, capacity=1e-320, ready_workers=6, arrivals_per_s=30.0))
    assert d.desired == 6 and "not usable" in d.reason
