"""Property tests of the balancer core: the ten properties of docs/design/balancing.md#properties-the-tests-check."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.gateway.balancing import (
    FAIR_WINDOW_S,
    Balancer,
    BalancerConfig,
    NoPick,
    Outcome,
    RetryBudget,
    Share,
    Ticket,
    outcome_of,
    should_retry,
)
from cloud.worker.batching import EXPIRED_MARK
from edgewise import status
from edgewise.v1 import detect_pb2


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(weights, clock=None, seed=0, **kw) -> tuple[Balancer, FakeClock]:
    clock = clock or FakeClock()
    kw.setdefault("slow_start_window_s", 0.0)
    b = Balancer(BalancerConfig(**kw), clock=clock, rng=random.Random(seed))
    b.set_endpoints([(f"w{i}", float(w), f"w{i}", False) for i, w in enumerate(weights)])
    return b, clock


def must(t: Ticket | NoPick) -> Ticket:
    assert isinstance(t, Ticket), t
    return t


# 1. Idle-first: with nothing in flight, picks follow the weights exactly per cycle.
@given(st.lists(st.integers(1, 5), min_size=2, max_size=5))
def test_idle_first_shares_by_weight_each_cycle(weights):
    b, _ = make(weights, idle_first=True)
    cycle = sum(weights)
    for _ in range(3):
        got = Counter()
        for _ in range(cycle):
            t = must(b.pick())
            got[t.address] += 1
            t.release(Outcome.OK)
        assert got == Counter({f"w{i}": w for i, w in enumerate(weights)})


def test_idle_first_three_to_one_interleaves():
    b, _ = make([3, 1], idle_first=True)
    seq = []
    for _ in range(8):
        t = must(b.pick())
        seq.append(t.address)
        t.release(Outcome.OK)
    assert seq.count("w0") == 6 and seq.count("w1") == 2
    assert seq[:4].count("w1") == 1  # smooth: w1 inside every cycle of 4, not at the end


def test_default_key_prefers_capacity_when_idle():
    # Without idle-first, the key is HAProxy's load after assignment: the 3x endpoint
    # finishes a request sooner even with one queued, until (n+1)/3 > 1.
    b, _ = make([3, 1], idle_first=False)
    held = [must(b.pick()) for _ in range(2)]
    assert {t.address for t in held} == {"w0"}
    assert must(b.pick()).address == "w1" or b.endpoints["w0"].in_flight == 3


# 2. Proportional steady state with requests that never finish.
@given(st.lists(st.integers(1, 8), min_size=1, max_size=6), st.integers(1, 200), st.booleans())
def test_proportional_steady_state(weights, n, idle_first):
    b, _ = make(weights, idle_first=idle_first)
    for _ in range(n):
        must(b.pick())
    total = sum(weights)
    for i, w in enumerate(weights):
        inflight = b.endpoints[f"w{i}"].in_flight
        assert abs(inflight - n * w / total) <= len(weights), (weights, n, i, inflight)
    # load-after-assignment balance: each endpoint's last request went where the key
    # was minimal, so in_flight_i / w_i <= (in_flight_j + 1) / w_j for every pair
    # (within one request of equality); idle-first may hand one extra to idle ones.
    floor = 2 if idle_first else 1
    for i, wi in enumerate(weights):
        ni = b.endpoints[f"w{i}"].in_flight
        if ni < floor:
            continue
        for j, wj in enumerate(weights):
            nj = b.endpoints[f"w{j}"].in_flight
            assert ni / wi <= (nj + 1) / wj + 1e-9, (weights, n, i, j)


# 3. Argmin over candidates, from random states (in-flight, weights, capacity, slow start).
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.floats(0.1, 10), st.one_of(st.none(), st.floats(1, 100)),
                  st.floats(0, 60)),
        min_size=1, max_size=8),
    st.booleans(),
)
@settings(max_examples=200)
def test_pick_is_argmin_of_key(states, idle_first):
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(idle_first=idle_first, slow_start_window_s=30.0), clock=clock,
                 rng=random.Random(1))
    b.set_endpoints([(f"w{i}", w, "", False) for i, (_, w, _, _) in enumerate(states)])
    for i, (inflight, _, cap, age) in enumerate(states):
        ep = b.endpoints[f"w{i}"]
        ep.in_flight = inflight
        ep.slow_start_t0 = -age
        b.report_load(ep.address, cap)
    now = clock()
    keys = {a: b.key(ep, now) for a, ep in b.endpoints.items()}
    t = must(b.pick())
    assert keys[t.address] <= min(keys.values()) * (1 + 1e-9) + 1e-15


# 4. No leaks whatever the outcome.
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(list(Outcome)), st.integers(0, 3)), max_size=300),
       st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_no_leaks(ops, weights):
    b, clock = make(weights, consecutive_failures=2, base_ejection_s=1.0, max_ejection_s=2.0,
                    max_ejection_percent=100.0)
    live: list[Ticket] = []
    for start, outcome, priority in ops:
        clock.t += 0.1
        if start:
            t = b.pick(priority=priority)
            if isinstance(t, Ticket):
                live.append(t)
        elif live:
            t = live.pop(0)
            t.release(outcome)
            t.release(outcome)  # a second release must not double-decrement
    for t in live:
        t.release(Outcome.CANCELLED)
    assert b.total_in_flight() == 0
    assert all(ep.in_flight == 0 and not ep.levels for ep in b.endpoints.values())


# 5. Caps: never above max_in_flight; all full -> SATURATED.
@given(st.integers(1, 5), st.lists(st.integers(1, 4), min_size=1, max_size=4), st.integers(0, 40))
def test_caps_hold(cap, weights, n):
    b, _ = make(weights, max_in_flight=cap)
    results = [b.pick() for _ in range(n)]
    for ep in b.endpoints.values():
        assert ep.in_flight <= cap
    granted = sum(isinstance(r, Ticket) for r in results)
    assert granted == min(n, cap * len(weights))
    if n > cap * len(weights):
        assert results[-1] is NoPick.SATURATED


def test_overloaded_counts_as_load_not_failure():
    b, clock = make([1, 1], overload_hold_s=1.0, consecutive_failures=1)
    a = [must(b.pick()) for _ in range(4)]  # 2 each
    victim = a[0].address
    a[0].release(Outcome.OVERLOADED)
    ep = b.endpoints[victim]
    assert ep.consecutive_failures == 0 and not ep.ejected(clock())
    # capped at what it held minus the rejected one: no new picks while at the cap
    picks = [must(b.pick()).address for _ in range(3)]
    assert victim not in picks
    clock.t += 1.5
    assert b.endpoints[victim].overload_cap is not None
    must(b.pick())
    assert b.endpoints[victim].overload_cap is None


def test_deadline_admission_treats_slow_queue_as_full():
    b, _ = make([1])
    b.report_load("w0", capacity=10.0)  # 10 img/s -> 0.1 s per request ahead
    for _ in range(5):
        must(b.pick())
    assert b.pick(deadline_s=0.3) is NoPick.SATURATED
    assert isinstance(b.pick(deadline_s=1.0), Ticket)


def test_admission_counts_only_the_work_a_worker_serves_before_the_requests_priority():
    """docs/design/balancing.md#priority: the worker serves higher priority first, so a
    high-priority request waits behind its equals and at most one running lower request; on the
    real gateway a burst of 100 priority-0 requests among 10 of priority 90 saw 28 of 30 of
    those refused while the priority-0 ones took the workers."""
    b, _ = make([1])
    b.report_load("w0", capacity=10.0)  # 0.1 s per request ahead
    for _ in range(5):
        must(b.pick(priority=0))
    assert b.pick(deadline_s=0.3, priority=0) is NoPick.SATURATED  # 0.5 s ahead: shed
    for _ in range(3):  # 1 running priority-0 request, then 0, 1, 2 of its own level ahead
        must(b.pick(deadline_s=0.3, priority=90))
    assert b.pick(deadline_s=0.3, priority=90) is NoPick.SATURATED  # 3 of its level + 1: 0.4 s
    assert isinstance(b.pick(deadline_s=0.3, priority=95), Ticket)
    assert b.pick(deadline_s=0.8, priority=0) is NoPick.SATURATED  # all 9 ahead of a priority-0 one


def test_admission_counts_a_devices_place_on_a_worker_that_serves_devices_in_turn():
    """docs/design/balancing.md#fair-share-across-devices: a worker that reports serving the
    devices of one priority in turn (``WorkerLoad.devices_in_turn``) serves a light device's
    request after one of each other device, not after a heavy device's whole share, and the
    prediction follows; an older worker serves in arrival order and is predicted so."""
    b, _ = make([1])
    b.report_load("w0", capacity=10.0)  # 0.1 s per request ahead, arrival order
    for _ in range(6):
        must(b.pick(device="heavy"))
    assert b.pick(deadline_s=0.5, device="light") is NoPick.SATURATED  # 0.7 s with its own
    b.report_load("w0", capacity=10.0, devices_in_turn=True)
    first = must(b.pick(deadline_s=0.5, device="light"))  # behind heavy's first: 0.2 s
    assert first.expected_s == pytest.approx(0.2)
    second = must(b.pick(deadline_s=0.5, device="light"))  # behind heavy's two and its first: 0.4 s
    assert second.expected_s == pytest.approx(0.4)
    assert b.pick(deadline_s=0.5, priority=0) is NoPick.SATURATED  # a pick naming no device: all 8
    first.release(Outcome.OK)
    second.release(Outcome.OK)
    assert b.endpoints["w0"].levels[0].devices == {"heavy": [6.0, 6.0]}


@settings(max_examples=50, deadline=None)
@given(picks=st.lists(st.tuples(st.sampled_from([0, 0, 50, 90]), st.booleans()), max_size=30),
       device=st.text(max_size=6))
def test_with_one_device_a_worker_serving_devices_in_turn_is_predicted_as_before(picks, device):
    """One device (or requests naming none): the same predicted wait at every priority."""
    b, _ = make([1])
    b.report_load("w0", capacity=10.0, devices_in_turn=True)
    tickets = []
    for prio, release in picks:
        tickets.append(must(b.pick(priority=prio, device=device)))
        if release:
            tickets.pop(0).release(Outcome.OK)
    ep = b.endpoints["w0"]
    for prio in (0, 50, 90, 95):
        assert Balancer._ahead(ep, prio, device) == pytest.approx(Balancer._ahead(ep, prio))


def test_a_request_the_worker_expired_in_its_queue_is_never_held_against_it():
    """The worker answered, alive: its queue was overtaken (a burst, a higher priority sent after
    it) or its estimate erred short. Counted as failures, 5 such expiries in a burst on busy
    cores ejected a healthy worker for 30 s (2-3 ejections with 500 ms deadlines)."""
    b, clock = make([1], consecutive_failures=1, max_ejection_percent=100.0)
    expired = outcome_of(status.DEADLINE_EXCEEDED, f"worker w0: DEADLINE_EXCEEDED: deadline could not be met: "
                                                   f"{EXPIRED_MARK}")
    assert expired is Outcome.EXPIRED
    low = must(b.pick(priority=0))
    must(b.pick(priority=90))  # the worker serves this one first
    low.release(expired)
    after = must(b.pick(priority=0))  # sent after the priority-90 one: nothing overtook it
    after.release(expired)
    ep = b.endpoints["w0"]
    assert not ep.ejected(clock()) and ep.consecutive_failures == 0 and ep.ejections == 0


def test_a_hop_that_ran_out_counts_though_a_higher_priority_overtook_it():
    """The worker answered nothing (hung): being overtaken does not explain that, and with the
    edge's priorities (hardness percentiles) nearly every request is overtaken."""
    b, clock = make([1], consecutive_failures=1, max_ejection_percent=100.0)
    low = must(b.pick(priority=0))
    must(b.pick(priority=90))
    low.release(outcome_of(status.DEADLINE_EXCEEDED, "worker w0: DEADLINE_EXCEEDED: Deadline Exceeded"))
    assert b.endpoints["w0"].ejected(clock())


# 6. Ejection, its growth, the cap and panic.
def fail(b: Balancer, address: str, n: int) -> None:
    for _ in range(n):
        ep = b.endpoints[address]
        ep.in_flight += 1
        Ticket(address, b).release(Outcome.FAILURE)


def test_panic_counts_a_paused_worker_as_unhealthy():
    """One worker ejected, the other paused (killed: its load poll fails): nothing was
    pickable although the ejected one was healthy, and every request failed for 30-300 s."""
    b, clock = make([1, 1])
    b.report_load("w1", capacity=None, serving=False)
    assert b.endpoints["w1"].paused
    fail(b, "w0", 5)
    assert b.endpoints["w0"].ejected(clock()) and b.in_panic()
    assert must(b.pick()).address == "w0"


def test_a_deadline_too_short_for_any_answer_does_not_eject_a_healthy_worker():
    """A client sending 5 ms deadlines to a worker that answers in 50 ms: its timeouts say
    nothing about the worker; a deadline that gave the worker time does count."""
    b, clock = make([1, 1])
    b.report_load("w0", capacity=20.0)  # 50 ms per image
    b.report_load("w1", capacity=20.0)
    for _ in range(10):
        t = must(b.pick(exclude=["w1"], deadline_s=0.005))
        assert t.hopeless()
        t.release(Outcome.TIMED_OUT)
    assert not b.endpoints["w0"].ejected(clock()) and b.endpoints["w0"].consecutive_failures == 0
    for _ in range(5):
        t = must(b.pick(exclude=["w1"], deadline_s=2.0))
        assert not t.hopeless()
        t.release(Outcome.TIMED_OUT)
    assert b.endpoints["w0"].ejected(clock())


def test_ejection_after_five_failures_and_duration_grows():
    b, clock = make([1] * 10)
    fail(b, "w3", 4)
    assert not b.endpoints["w3"].ejected(clock())
    fail(b, "w3", 1)
    ep = b.endpoints["w3"]
    assert ep.ejected(clock()) and ep.ejected_until == pytest.approx(clock() + 30)
    for _ in range(200):
        t = must(b.pick())
        assert t.address != "w3"
        t.release(Outcome.OK)
    clock.t += 30.01
    seen = set()
    for _ in range(200):
        t = must(b.pick())
        seen.add(t.address)
        t.release(Outcome.OK)
    assert "w3" in seen
    fail(b, "w3", 5)
    assert b.endpoints["w3"].ejected_until == pytest.approx(clock() + 60)  # 2nd: 2 x base
    clock.t += 60.01
    b.pick()
    clock.t += 25  # two healthy intervals lower the count
    b.pick()
    assert b.endpoints["w3"].ejection_count == 0


def test_ejection_cap_ten_percent():
    b, clock = make([1] * 10)
    fail(b, "w0", 5)
    fail(b, "w1", 5)
    ejected = [a for a, ep in b.endpoints.items() if ep.ejected(clock())]
    assert ejected == ["w0"]  # max(1, 10% of 10) = 1


def test_max_ejection_capped_at_max_time():
    b, clock = make([1] * 2, base_ejection_s=30, max_ejection_s=50, max_ejection_percent=100,
                    panic_threshold_percent=0)
    for _ in range(3):
        fail(b, "w0", 5)
        ep = b.endpoints["w0"]
        assert ep.ejected_until - clock() <= 50 + 1e-9
        clock.t = ep.ejected_until + 0.001
        b.pick()


def test_panic_below_half_healthy():
    b, clock = make([1] * 4, max_ejection_percent=100)
    fail(b, "w0", 5)
    fail(b, "w1", 5)
    assert not b.in_panic()  # 2/4 healthy = 50%, not below
    picks = {must(b.pick()).address for _ in range(20)}
    assert picks <= {"w2", "w3"}
    fail(b, "w2", 5)
    assert b.in_panic()  # 1/4 healthy: ignore ejection, use all
    picks = set()
    for _ in range(40):
        t = must(b.pick())
        picks.add(t.address)
    assert picks == {"w0", "w1", "w2", "w3"}


def test_all_ejected_without_panic_is_unavailable():
    b, _ = make([1], max_ejection_percent=100, panic_threshold_percent=0)
    fail(b, "w0", 5)
    assert b.pick() is NoPick.NO_ENDPOINTS


# 7. Slow start: the new endpoint's share ramps as max(0.1, t/window).
@pytest.mark.parametrize("t", [0.0, 1.0, 6.0, 15.0, 24.0, 30.0, 45.0])
def test_slow_start_share(t):
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(slow_start_window_s=30.0), clock=clock, rng=random.Random(0))
    b.set_endpoints([("old", 1.0, "", False)])
    clock.t = 100.0
    b.set_endpoints([("old", 1.0, "", False), ("new", 1.0, "", False)])
    clock.t = 100.0 + t
    n = 2000
    for _ in range(n):
        must(b.pick())
    expected = max(0.1, min(1.0, t / 30.0))
    ratio = b.endpoints["new"].in_flight / b.endpoints["old"].in_flight
    assert ratio == pytest.approx(expected, rel=0.05, abs=0.002)


def test_slow_start_restarts_after_ejection():
    b, clock = make([1, 1], slow_start_window_s=30.0, max_ejection_percent=100)
    clock.t += 100
    fail(b, "w0", 5)
    clock.t += 30.5
    b.pick()
    assert b.slow_start_factor(b.endpoints["w0"], clock()) == pytest.approx(0.1)


# 8. P2C sampling mode: distinct always picks the lower-loaded of two; with replacement
# picks the busy one ~25% of the time.
def test_p2c_distinct_vs_with_replacement():
    for distinct, lo, hi in ((True, 0.0, 0.0), (False, 0.22, 0.28)):
        b, _ = make([1, 1], mode="p2c", p2c_distinct=distinct, seed=7)
        b.endpoints["w0"].in_flight = 5
        busy = 0
        n = 4000
        for _ in range(n):
            t = must(b.pick())
            busy += t.address == "w0"
            b.endpoints[t.address].in_flight -= 1
        assert lo <= busy / n <= hi, (distinct, busy / n)


# 9. Draining: no new picks; closable once in-flight reaches 0.
def test_draining_endpoint():
    b, _ = make([1, 1])
    held = [must(b.pick()) for _ in range(4)]
    on_w1 = [t for t in held if t.address == "w1"]
    assert len(on_w1) == 2
    closable = b.set_endpoints([("w0", 1.0, "w0", False), ("w1", 1.0, "w1", True)])
    assert closable == []
    for _ in range(10):
        assert must(b.pick()).address == "w0"
    assert on_w1[0].release(Outcome.OK) is False
    assert on_w1[1].release(Outcome.OK) is True
    assert "w1" not in b.endpoints
    # w0 still holds the 10 requests picked above: it drains before it is closable
    assert b.set_endpoints([]) == []
    assert b.endpoints["w0"].draining
    # an idle endpoint removed from the set is closable at once
    b2, _ = make([1, 1])
    assert b2.set_endpoints([("w0", 1.0, "", False)]) == ["w1"]


@pytest.mark.parametrize("mode", ["rr", "random", "wrr", "lc", "p2c", "wp2c", "wlc"])
def test_every_mode_skips_draining_and_spreads(mode):
    b, _ = make([4, 2, 1], mode=mode)
    b.set_endpoints([("w0", 4.0, "", False), ("w1", 2.0, "", False), ("w2", 1.0, "", True)])
    got = Counter()
    held = []
    for _ in range(300):
        t = must(b.pick())
        got[t.address] += 1
        held.append(t)
        if len(held) > 6:  # a few in flight so load-aware modes see load
            held.pop(0).release(Outcome.OK)
    assert "w2" not in got and got["w0"] > 0 and got["w1"] > 0


def test_wrr_mode_is_static_weights():
    b, _ = make([4, 2, 1], mode="wrr")
    got = Counter()
    for _ in range(70):
        got[must(b.pick()).address] += 1  # never released: wrr ignores load
    assert got == Counter({"w0": 40, "w1": 20, "w2": 10})


def test_capacity_scales_weight():
    b, _ = make([1, 1])
    b.report_load("w0", 30.0)
    b.report_load("w1", 10.0)
    for _ in range(40):
        must(b.pick())
    assert b.endpoints["w0"].in_flight == 30 and b.endpoints["w1"].in_flight == 10


def test_reported_capacity_replaces_the_weight_instead_of_multiplying_it():
    """Weights 4:2:1 that match the measured speeds give 4:2:1, not 16:4:1."""
    b, _ = make([4, 2, 1])
    for addr, cap in (("w0", 40.0), ("w1", 20.0), ("w2", 10.0)):
        b.report_load(addr, cap)
    for _ in range(70):
        must(b.pick())
    assert [b.endpoints[a].in_flight for a in ("w0", "w1", "w2")] == [40, 20, 10]
    assert [b.base_weight(b.endpoints[a]) for a in ("w0", "w1", "w2")] == [40.0, 20.0, 10.0]


def test_unreported_worker_is_placed_on_the_measured_scale_by_its_weight():
    b, _ = make([2, 1])
    b.report_load("w0", 50.0)  # 25 images/s per weight unit
    assert b.base_weight(b.endpoints["w1"]) == pytest.approx(25.0)


def test_configured_weights_alone_when_capacity_is_not_used():
    b, _ = make([1, 3], use_reported_capacity=False)
    b.report_load("w0", 90.0)
    b.report_load("w1", 10.0)
    for _ in range(40):
        must(b.pick())
    assert b.endpoints["w0"].in_flight == 10 and b.endpoints["w1"].in_flight == 30


def test_the_pool_a_gateway_starts_with_skips_slow_start():
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(slow_start_window_s=30.0), clock=clock, rng=random.Random(0))
    b.set_endpoints([("a", 1.0, "", False), ("b", 1.0, "", False)])
    assert all(b.slow_start_factor(ep, 0.0) == 1.0 for ep in b.endpoints.values())
    # a worker reporting NOT_SERVING then SERVING while nobody else serves: still no ramp
    b.report_load("a", 10.0, serving=False)
    b.report_load("b", 10.0, serving=False)
    clock.t = 5.0
    b.report_load("a", 10.0, serving=True)
    assert b.slow_start_factor(b.endpoints["a"], 5.0) == 1.0
    # b, a worker the gateway started with, first serving while a serves: no ramp either
    # (balancing.STARTUP_S: it never served yet, so it is not "joining" anything)
    b.report_load("b", 10.0, serving=True)
    assert b.slow_start_factor(b.endpoints["b"], 5.0) == 1.0
    # ... but once it served, a pause and a return ramp; so does a worker added later
    b.report_load("b", 10.0, serving=False)
    b.report_load("b", 10.0, serving=True)
    assert b.slow_start_factor(b.endpoints["b"], 5.0) == pytest.approx(0.1)
    b.set_endpoints([("a", 1.0, "", False), ("b", 1.0, "", False), ("c", 1.0, "", False)])
    assert b.slow_start_factor(b.endpoints["c"], 5.0) == pytest.approx(0.1)


def test_bad_config_named():
    with pytest.raises(ValueError, match="balancer.mode"):
        Balancer(BalancerConfig(mode="fastest"))
    with pytest.raises(ValueError, match="weight"):
        Balancer().set_endpoints([("a:1", 0.0, "", False)])


# Retry budget and decision.
def test_retry_budget_ratio_and_floor():
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=0.2, min_per_s=0.3, window_s=10.0, clock=clock)
    # floor: 0.3/s x 10 s = 3 retries with no traffic
    assert [budget.try_acquire() for _ in range(4)] == [True, True, True, False]
    for _ in range(100):
        budget.record_request()
    granted = sum(budget.try_acquire() for _ in range(50))
    assert granted == 20 - 3  # 20% of 100 requests, 3 already used
    clock.t += 10.5  # window slides: old requests and retries forgotten
    assert sum(budget.try_acquire() for _ in range(10)) == 3


def test_should_retry_rules():
    clock = FakeClock(0.0)
    budget = RetryBudget(ratio=0.0, min_per_s=1.0, window_s=1.0, clock=clock)
    assert not should_retry(detect_pb2.RESOURCE_EXHAUSTED, 1, 1.0, 0.01, budget)
    assert not should_retry(detect_pb2.INVALID_ARGUMENT, 1, 1.0, 0.01, budget)
    assert not should_retry(detect_pb2.UNAVAILABLE, 2, 1.0, 0.01, budget)
    assert not should_retry(detect_pb2.UNAVAILABLE, 1, 0.005, 0.01, budget)
    assert should_retry(detect_pb2.UNAVAILABLE, 1, None, 0.01, budget)
    assert not should_retry(detect_pb2.UNAVAILABLE, 1, 1.0, 0.01, budget)  # budget spent


def test_outcome_of_every_wire_status():
    expected = {
        detect_pb2.STATUS_UNSPECIFIED: Outcome.FAILURE,  # an answer that does not say is a fault
        detect_pb2.OK: Outcome.OK,
        detect_pb2.INVALID_ARGUMENT: Outcome.OK,  # the request's fault, the worker works
        detect_pb2.RESOURCE_EXHAUSTED: Outcome.OVERLOADED,
        detect_pb2.UNAVAILABLE: Outcome.FAILURE,
        detect_pb2.DEADLINE_EXCEEDED: Outcome.TIMED_OUT,  # a failure, unless the deadline was hopeless
        detect_pb2.UNAUTHENTICATED: Outcome.OK,
        detect_pb2.INTERNAL: Outcome.FAILURE,
    }
    assert set(expected) == set(detect_pb2.Status.values())
    for wire, outcome in expected.items():
        assert outcome_of(wire) is outcome, detect_pb2.Status.Name(wire)
    assert outcome_of(99) is Outcome.FAILURE  # a value from a newer peer counts as INTERNAL


def test_retry_excludes_tried_host():
    b, _ = make([1, 1])
    first = must(b.pick())
    second = must(b.pick(exclude=[first.address]))
    assert second.address != first.address
    assert b.pick(exclude=["w0", "w1"]) is NoPick.NO_ENDPOINTS


def test_idle_first_does_not_bypass_slow_start():
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(slow_start_window_s=30.0, idle_first=True), clock=clock, rng=random.Random(0))
    b.set_endpoints([("old", 1.0, "", False)])
    clock.t = 100.0
    b.set_endpoints([("old", 1.0, "", False), ("new", 1.0, "", False)])
    clock.t = 103.0  # 10% into the window: the idle new endpoint is not key 0
    got = Counter()
    for _ in range(100):  # one request at a time, each finished before the next
        t = must(b.pick())
        got[t.address] += 1
        t.release(Outcome.OK)
    assert got["new"] <= 15, got  # ~share of WRR ties 1:0.1, not half


def test_unreachable_worker_gets_no_picks_until_a_poll_reaches_it():
    b, _ = make([1, 1])
    b.mark_unreachable("w1")
    picks = []
    for _ in range(6):
        t = must(b.pick())
        picks.append(t.address)
        t.release(Outcome.OK)
    assert set(picks) == {"w0"}
    b.report_load("w1", capacity=10.0, serving=True)  # a Load poll reached it again
    seen = set()
    for _ in range(6):
        t = must(b.pick())
        seen.add(t.address)
        t.release(Outcome.OK)
    assert seen == {"w0", "w1"}


def test_active_key_is_nginx_least_conn_with_ties_to_the_fastest():
    b, _ = make([4, 2, 1], key="active")
    # idle: all key 0, the fastest first; then w1 and w2 tie at 0 and the faster w1 wins
    assert [must(b.pick()).address for _ in range(4)] == ["w0", "w1", "w2", "w0"]
    # keys now 2/4, 1/2, 1/1: w0 and w1 tie at 0.5 and w0 (faster) wins
    assert must(b.pick()).address == "w0"


def test_active_key_spreads_equal_endpoints():
    b, _ = make([1, 1, 1], key="active")
    tickets = [must(b.pick()) for _ in range(6)]
    assert Counter(t.address for t in tickets) == {"w0": 2, "w1": 2, "w2": 2}
    for t in tickets:
        t.release(Outcome.OK)
    # idle again: smooth WRR keeps rotating instead of always the first in the list
    assert len({must(b.pick()).address for _ in range(3)}) == 3


def test_active_key_gives_a_slow_starting_endpoint_one_at_a_time():
    clock = FakeClock()
    b = Balancer(BalancerConfig(key="active", slow_start_window_s=30.0), clock=clock, rng=random.Random(0))
    b.set_endpoints([("old", 1.0, "old", False)])
    clock.t += 60  # the pool serves; a scale-up joins in slow start (10% weight)
    b.set_endpoints([("old", 1.0, "old", False), ("new", 1.0, "new", False)])
    picks = Counter(must(b.pick()).address for _ in range(10))
    assert picks["new"] == 1 and picks["old"] == 9


# ---- work, not requests (docs/design/balancing.md#work-not-requests) ------------------------------
def _pixel_pool(**kw) -> tuple[Balancer, FakeClock]:
    b, clock = make([1, 1], idle_first=False, **kw)
    for a in ("w0", "w1"):
        b.report_load(a, 10.0, pixel_rate=1e6)
    return b, clock


def test_a_whole_frame_counts_as_the_small_payloads_it_costs():
    b, _ = _pixel_pool()
    small, big = 100_000, 900_000
    for _ in range(50):  # the recent mean: settles near 100k
        b.pick(pixels=small).release(Outcome.OK)
    frame = b.pick(pixels=big)
    assert isinstance(frame, Ticket) and frame.cost > 4  # ~ 9 small payloads' worth, not 1 request
    others = [b.pick(pixels=small) for _ in range(6)]
    # by request counts the pool is 1 vs 6 after the frame; by work the frame's endpoint is still busier
    assert all(t.address != frame.address for t in others)
    assert b.endpoints[frame.address].in_flight == 1
    assert b.endpoints[frame.address].work == pytest.approx(frame.cost)
    frame.release(Outcome.OK)
    assert b.endpoints[frame.address].work == 0.0
    for t in others:
        t.release(Outcome.OK)
    assert all(ep.work == 0.0 and ep.in_flight == 0 for ep in b.endpoints.values())


def test_requests_cost_one_where_time_does_not_grow_with_pixels():
    b, _ = make([1, 1], idle_first=False)
    b.report_load("w0", 10.0)  # a letterboxing worker: every image costs one model run
    b.report_load("w1", 10.0, pixel_rate=1e6)
    b.pick(pixels=100)
    t = b.pick(pixels=10_000)
    costs = {a: b.cost(ep, 10_000) for a, ep in b.endpoints.items()}
    assert costs["w0"] == 1.0 and costs["w1"] > 1.0 and isinstance(t, Ticket)
    rb, _ = _pixel_pool(cost="requests")  # the operator's switch: nginx's unit costs everywhere
    rb.pick(pixels=100)
    assert all(rb.cost(ep, 10_000) == 1.0 for ep in rb.endpoints.values())
    assert b.cost(b.endpoints["w1"], 0) == 1.0  # no pixel count known: one request


def test_cost_is_clamped_and_the_mean_follows_the_traffic():
    b, _ = _pixel_pool(cost_window=10)
    b.pick(pixels=1000).release(Outcome.OK)
    assert b.cost(b.endpoints["w0"], 10**9) == 16.0 and b.cost(b.endpoints["w0"], 1) == 1 / 16
    for _ in range(100):
        b.pick(pixels=4000).release(Outcome.OK)
    assert b.cost(b.endpoints["w0"], 4000) == pytest.approx(1.0, rel=0.01)


def test_admission_predicts_the_wait_from_work():
    b, _ = _pixel_pool()
    for _ in range(20):
        b.pick(pixels=100_000).release(Outcome.OK)
    b.pick(pixels=1_600_000)  # 16 payloads' worth on one endpoint, 10 images/s: 1.6 s of work
    b.pick(pixels=1_600_000)
    assert b.pick(pixels=100_000, deadline_s=1.0) is NoPick.SATURATED
    assert isinstance(b.pick(pixels=100_000, deadline_s=2.0), Ticket)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3_000_000), st.booleans()), min_size=1, max_size=60))
def test_work_returns_to_zero_whatever_the_order(seq):
    b, _ = _pixel_pool()
    held = []
    for px, release_now in seq:
        t = b.pick(pixels=px)
        assert isinstance(t, Ticket)
        held.append(t)
        if release_now:
            held.pop(0).release(Outcome.OK)
        assert all(ep.work >= 0.0 for ep in b.endpoints.values())
    for t in held:
        t.release(Outcome.FAILURE)
    assert all(ep.work == 0.0 and ep.in_flight == 0 for ep in b.endpoints.values())


def test_idle_first_is_for_requests_of_one_cost():
    """An idle slow worker is no place for a whole frame when a fast one finishes it sooner."""
    b, _ = make([4, 1])  # idle_first on (the default)
    b.report_load("w0", 40.0, pixel_rate=4e6)
    b.report_load("w1", 10.0, pixel_rate=1e6)
    for _ in range(10):
        b.pick(pixels=100_000).release(Outcome.OK)
    first = b.pick(pixels=100_000)
    assert isinstance(first, Ticket) and first.address == "w0"
    # w1 is idle, but the frame would take it 0.9 s; w0 finishes both in 0.25 s
    frame = b.pick(pixels=900_000)
    assert isinstance(frame, Ticket) and frame.address == "w0"
    u, _ = make([4, 1])  # unit costs: the idle worker keys 0 and takes the second request
    assert [t.address for t in (u.pick(), u.pick())] == ["w0", "w1"]


def test_a_retry_does_not_count_its_pixels_in_the_mean_again():
    b, _ = _pixel_pool()
    b.pick(pixels=1000).release(Outcome.OK)
    first = b.pick(pixels=5000)
    assert isinstance(first, Ticket)
    mean = b._mean_pixels
    first.release(Outcome.FAILURE)
    retry = b.pick(pixels=5000, exclude=[first.address])  # the same request on another worker
    assert isinstance(retry, Ticket) and retry.address != first.address
    assert b._mean_pixels == mean and retry.cost == pytest.approx(5000 / mean)


# Fair share across devices (docs/design/balancing.md#fair-share-across-devices)
def _limited(limit: int = 20) -> tuple[Balancer, FakeClock]:
    b, clock = make([1])
    b.report_load("w0", None, limit=limit)  # room: the worker's limit (no rate measured yet)
    return b, clock


def test_one_device_is_never_refused_for_its_share():
    """With one device (the common case), picks are those of a pool that names no device: it
    fills the worker's limit and is then refused as saturated, as before."""
    b, _ = _limited()
    anonymous, _ = _limited()
    for _ in range(25):
        assert type(b.pick(device="cam")) is type(anonymous.pick())
    assert b.pick(device="cam") is NoPick.SATURATED


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("pick", "release", "tick", "load")), st.integers(0, 30)),
                max_size=120))
def test_one_device_picks_exactly_as_a_pool_naming_none(ops):
    """Whatever the picks, releases, clock and loads, a balancer told each request's device (one
    device) picks and refuses exactly as one told none: the fair share changes nothing for it."""
    pools = [make([4, 2, 1], seed=3) for _ in range(2)]
    held: list[list[Ticket]] = [[], []]
    for op, n in ops:
        got = []
        for k, (b, clock) in enumerate(pools):
            if op == "pick":
                t = b.pick(deadline_s=0.05 * n or None, device="cam" if k else None, replay=n % 7 == 0,
                           priority=-1 if n % 7 == 0 else n)
                got.append(t.address if isinstance(t, Ticket) else t)
                if isinstance(t, Ticket):
                    held[k].append(t)
            elif op == "release" and held[k]:
                held[k].pop(n % len(held[k])).release(list(Outcome)[n % len(Outcome)])
            elif op == "tick":
                clock.t += n / 10
            elif op == "load":
                b.report_load(f"w{n % 3}", float(n) or None, limit=n // 2)
        assert len(set(map(str, got))) <= 1, (op, got)


def test_a_device_over_its_share_is_refused_while_another_wants_room():
    b, clock = _limited(20)
    heavy = [must(b.pick(device="heavy")) for _ in range(20)]  # alone: the whole limit
    assert b.pick(device="light") is NoPick.SATURATED  # a device under its share got no room: contended
    assert b.pick(device="heavy") is NoPick.OVER_SHARE
    share = b.share("heavy")
    assert share is not None and (share.held, share.share, share.active, share.room) == (20, 10.0, 2, 20.0)
    for t in heavy[:11]:  # heavy's requests end; it is refused new ones until it holds less than its share
        t.release(Outcome.OK)
    assert must(b.pick(device="heavy"))  # 9 -> 10: its share
    assert b.pick(device="heavy") is NoPick.OVER_SHARE
    light = [must(b.pick(device="light")) for _ in range(10)]  # the room left is the light device's
    assert b.pick(device="light") is NoPick.OVER_SHARE  # and it keeps to its share too
    for t in light:
        t.release(Outcome.OK)
    clock.t += 1.0
    assert b.pick(device="heavy") is NoPick.OVER_SHARE  # light is still active: heavy keeps to its share


def test_contention_ends_when_the_other_device_is_gone():
    b, clock = _limited(20)
    heavy = [must(b.pick(device="heavy")) for _ in range(20)]
    assert b.pick(device="light") is NoPick.SATURATED
    for t in heavy[:15]:
        t.release(Outcome.OK)
    assert b.pick(device="heavy") is not NoPick.OVER_SHARE  # 5 held: under its share of 10
    for _ in range(5):
        b.pick(device="heavy")
    assert b.pick(device="heavy") is NoPick.OVER_SHARE
    clock.t += FAIR_WINDOW_S + 0.1  # light asked nothing since: neither active nor contending
    assert b.share("heavy") == Share(10, 20.0, 1, 20.0)
    got = [b.pick(device="heavy") for _ in range(11)]
    assert all(isinstance(t, Ticket) for t in got[:10]) and got[10] is NoPick.SATURATED


def test_a_request_of_a_device_under_its_share_expiring_in_the_queue_is_contention():
    """The gateway's prediction admitted it, but the worker's queue ran it out of time: the
    device under its share got nothing, as if it had been refused."""
    b, _ = _limited(20)
    heavy = [must(b.pick(device="heavy")) for _ in range(15)]
    must(b.pick(device="heavy")).release(Outcome.OK)
    assert must(b.pick(device="heavy"))  # not contended: over its share of 10 and admitted
    must(b.pick(device="light", deadline_s=1.0)).release(Outcome.EXPIRED)
    assert b.pick(device="heavy") is NoPick.OVER_SHARE
    assert must(b.pick(device="light"))
    assert len(heavy) == 15


def test_devices_under_no_contention_use_the_room_they_like():
    """A share is kept only while the pool is contended: with room for everyone, a device may
    hold more than its share (nothing is refused for it)."""
    b, _ = _limited(20)
    assert must(b.pick(device="light"))
    assert all(isinstance(b.pick(device="heavy"), Ticket) for _ in range(15))


def test_a_share_is_at_least_one_request():
    """With more active devices than room, a device with nothing in flight is never over its share."""
    b, _ = _limited(4)
    held = [must(b.pick(device=f"cam-{i}")) for i in range(4)]
    assert b.pick(device="cam-9") is NoPick.SATURATED  # contended
    assert b.pick(device="cam-0") is NoPick.OVER_SHARE  # one held, share max(1, 4/5)
    held[0].release(Outcome.OK)
    assert must(b.pick(device="cam-9"))


def test_a_heavy_device_among_hundreds_of_light_ones_keeps_half_the_free_room():
    """Hundreds of devices asking now and then are all active (each asked in the last
    FAIR_WINDOW_S), so room over active devices is 1 request each; a heavy device was held to
    that 1 while the pool stood mostly empty (a simulated 30 s with 500 light devices: 186
    answers instead of 5,880, 27 of the 64 slots used). It may hold as much as is left free:
    at most half of what the others leave, the other half stays for them."""
    b, _ = _limited(64)
    light = []
    for i in range(500):  # 500 active devices, 25 of them with a request in flight
        t = must(b.pick(device=f"cam-{i}"))
        if i < 25:
            light.append(t)
        else:
            t.release(Outcome.OK)
    heavy = [must(b.pick(device="heavy")) for _ in range(39)]  # no contention: the rest of the room
    assert b.pick(device="cam-999") is NoPick.SATURATED  # a device under its share got none: contended
    for t in heavy:
        t.release(Outcome.OK)
    got = []
    while isinstance(t := b.pick(device="heavy"), Ticket):
        got.append(t)
    assert t is NoPick.OVER_SHARE
    assert len(got) == 20  # each admitted while it held less than was free: not 1 (64 / 502 active)
    assert 64 - len(light) - len(got) == 19  # the other half of the 39 is free for the light devices
    assert all(isinstance(b.pick(device=f"cam-{i}"), Ticket) for i in range(100, 110))


def test_the_share_follows_the_measured_rate_and_the_deadline():
    b, _ = make([1])
    b.report_load("w0", 10.0, limit=100)  # 10 images/s: 1 s of deadline is room for 10
    assert b.share("cam", deadline_s=1.0) == Share(0, 10.0, 1, 10.0)
    assert b.share("cam", deadline_s=30.0).room == 100.0  # the limit caps it
    unknown, _ = make([1])
    assert unknown.share("cam", deadline_s=1.0) is None  # nothing known: nothing to share out


def test_a_pool_with_no_worker_left_answers_so_not_with_a_share():
    b, _ = _limited(4)
    held = [must(b.pick(device=f"cam-{i}")) for i in range(4)]
    assert b.pick(device="cam-9") is NoPick.SATURATED  # contended
    b.report_load("w0", None, serving=False)
    assert b.pick(device="cam-0") is NoPick.NO_ENDPOINTS and b.share("cam-0") is None
    assert len(held) == 4


def test_a_released_request_counts_off_its_device_even_if_its_worker_is_gone():
    b, _ = _limited(20)
    t = must(b.pick(device="cam"))
    b.set_endpoints([])
    t.release(Outcome.OK)
    assert b._held == {}


def test_a_worker_that_takes_one_request_at_a_time_still_takes_replays_when_idle():
    """balancer.max_in_flight: 1 (or a worker's limit held at 1 after an overload): half the cap
    is 0, which refused every replay and left every edge's spool to expire."""
    b, _ = _limited(1)
    first = b.pick(device="cam-0", replay=True, priority=-1)
    assert isinstance(first, Ticket)
    assert b.pick(device="cam-1", replay=True, priority=-1) is NoPick.SATURATED  # not beside another
    first.release(Outcome.OK)
    assert isinstance(b.pick(device="cam-1", replay=True, priority=-1), Ticket)


def test_replays_take_only_the_room_live_requests_leave():
    """A replay is sent only while the worker holds less than half its limit, and is no device's
    share: 30 replays of 30 devices leave the live requests the rest of the limit."""
    b, _ = _limited(20)
    replays = [b.pick(device=f"cam-{i}", replay=True, priority=-1) for i in range(30)]
    assert sum(isinstance(t, Ticket) for t in replays) == 10 and replays[10] is NoPick.SATURATED
    assert b._held == {}
    live = [b.pick(device="live") for _ in range(11)]
    assert all(isinstance(t, Ticket) for t in live[:10]) and live[10] is NoPick.SATURATED
    assert b.pick(device="cam-0", replay=True, priority=-1) is NoPick.SATURATED
