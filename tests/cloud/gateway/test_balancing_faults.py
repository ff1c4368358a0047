"""Balancer core under worker faults, on an injected clock: the hop margin, a worker's up-front
refusal (and its retry where another worker may make it), the batch-of-one estimate, hung Load polls, slow start under light load and after an
ejection, and the workers a gateway starts with (docs/design/balancing.md)."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from cloud.gateway.balancing import (
    HOP_MARGIN_MAX_S,
    HOP_MARGIN_MIN_S,
    LOAD_TIMEOUTS_TO_PAUSE,
    STARTUP_S,
    Balancer,
    BalancerConfig,
    NoPick,
    Outcome,
    RetryBudget,
    hop_timeout,
    outcome_of,
    should_retry,
)
from edgewise import status
from tests.cloud.gateway.test_balancing import FakeClock, make, must


def test_the_hop_expires_a_little_before_the_client():
    assert hop_timeout(2.0) == pytest.approx(2.0 - HOP_MARGIN_MAX_S)  # capped
    assert hop_timeout(0.1) == pytest.approx(0.09)                      # 10%
    assert hop_timeout(0.006) == pytest.approx(0.006 - HOP_MARGIN_MIN_S)  # floor
    assert hop_timeout(0.002) == 0.0                                     # no time for a worker


def test_a_workers_refusal_of_a_too_short_deadline_is_not_its_fault():
    refusal = "worker w: DEADLINE_EXCEEDED: deadline is 4.2 ms away but a batch takes about 7.3 ms; send a later deadline"
    assert outcome_of(status.DEADLINE_EXCEEDED, refusal) is Outcome.CANCELLED
    assert outcome_of(status.DEADLINE_EXCEEDED, "worker w: DEADLINE_EXCEEDED: Deadline Exceeded") is Outcome.TIMED_OUT
    assert outcome_of(status.DEADLINE_EXCEEDED) is Outcome.TIMED_OUT


REFUSAL = "worker w0: DEADLINE_EXCEEDED: deadline is 180.0 ms away but a batch takes about 400.0 ms; send a later deadline"


def test_a_too_short_refusal_is_retried_only_on_a_worker_that_may_answer_in_time():
    """A worker's refusal of a deadline closer than its batch of one says nothing of the others:
    the request goes again to one that may make it (never measured, or expected to answer
    sooner), and to none when every other one is known to be slower than the time left."""
    b, clock = make([1, 1, 1])
    t = must(b.pick(exclude=["w0", "w2"]))  # w1: an idle pick answered in 500 ms, its batch of one
    clock.t += 0.5
    t.release(Outcome.OK)
    assert b.may_answer_within(0.2, exclude=["w0"])  # w2: nothing measured, it may
    for _ in range(3):  # the pick of a retry: never w1
        t = must(b.pick(exclude=["w0"], deadline_s=0.2, in_time=True))
        assert t.address == "w2"
        t.release(Outcome.CANCELLED)
    t = must(b.pick(exclude=["w0", "w2"], deadline_s=0.2))  # other picks: as before
    assert t.address == "w1"
    t.release(Outcome.CANCELLED)
    assert b.may_answer_within(0.6, exclude=["w0", "w2"])  # w1 makes 600 ms
    b.report_load("w2", capacity=2.0)  # w2: idle, but 500 ms an image
    assert not b.may_answer_within(0.2, exclude=["w0"])
    assert b.pick(exclude=["w0"], deadline_s=0.2, in_time=True) is NoPick.SATURATED

    budget = RetryBudget(ratio=0.0, min_per_s=100.0, window_s=1.0, clock=clock)
    asked: list[float] = []

    def elsewhere(yes: bool):
        def ask(within_s: float) -> bool:
            asked.append(within_s)
            return yes
        return ask

    assert should_retry(status.DEADLINE_EXCEEDED, 1, 0.2, 0.005, budget, REFUSAL, elsewhere(True))
    assert asked == [pytest.approx(hop_timeout(0.2))]  # the time the retry's hop would have
    assert not should_retry(status.DEADLINE_EXCEEDED, 1, 0.2, 0.005, budget, REFUSAL, elsewhere(False))
    assert not should_retry(status.DEADLINE_EXCEEDED, 1, 0.2, 0.005, budget, REFUSAL)  # no pool to ask
    assert not should_retry(status.DEADLINE_EXCEEDED, 2, 0.2, 0.005, budget, REFUSAL, elsewhere(True))  # one retry
    assert not should_retry(status.DEADLINE_EXCEEDED, 1, 0.004, 0.005, budget, REFUSAL, elsewhere(True))
    # a hop that ran out (the worker took the request and did not make it) is not retried
    expired = "worker w0: DEADLINE_EXCEEDED: deadline could not be met: removed from the queue before inference"
    assert not should_retry(status.DEADLINE_EXCEEDED, 1, 0.2, 0.005, budget, expired, elsewhere(True))
    assert should_retry(status.UNAVAILABLE, 1, 0.2, 0.005, budget, "", elsewhere(False))  # as before


def test_a_workers_refusal_for_its_own_load_is_retried_where_another_has_room():
    """A worker's queue full or decode budget spent (its mark) goes on to a worker that may
    answer in time; gRPC's own RESOURCE_EXHAUSTED (a message over the size limit) would fail
    anywhere and is not retried; the refusal is load on the worker, never a failure."""
    _, clock = make([1, 1])
    budget = RetryBudget(ratio=0.0, min_per_s=100.0, window_s=1.0, clock=clock)
    full = "worker w0: RESOURCE_EXHAUSTED: worker queue full (64/64 requests waiting); retry on another worker or later"
    spent = ("worker w0: RESOURCE_EXHAUSTED: decode budget full: 9000000 of 9000000 pixels being decoded, this "
             "image needs 921600 (waited 10 ms); retry on another worker or later")
    too_big = "worker w0: RESOURCE_EXHAUSTED: Received message larger than max (40000000 vs. 33554432)"
    for busy in (full, spent):
        assert should_retry(status.RESOURCE_EXHAUSTED, 1, 0.5, 0.005, budget, busy, lambda within_s: True)
        assert not should_retry(status.RESOURCE_EXHAUSTED, 1, 0.5, 0.005, budget, busy, lambda within_s: False)
        assert outcome_of(status.RESOURCE_EXHAUSTED, busy) is Outcome.OVERLOADED
    assert not should_retry(status.RESOURCE_EXHAUSTED, 1, 0.5, 0.005, budget, too_big, lambda within_s: True)


def test_hopeless_uses_the_measured_batch_of_one_round_trip():
    """The reported capacity of a batching worker is its images/s at its batch sizes (1/capacity
    = 2 ms here), far less than the 8 ms a batch of one takes through the hop: deadlines under
    those 8 ms must not count against it."""
    b, clock = make([1, 1])
    b.report_load("w0", capacity=500.0)
    b.report_load("w1", capacity=500.0)
    t = must(b.pick(exclude=["w1"], deadline_s=0.005))
    assert not t.hopeless()  # nothing measured yet but the rate
    clock.t += 0.008
    t.release(Outcome.OK)  # an idle pick answered in 8 ms: the batch-of-one round trip
    for _ in range(10):
        t = must(b.pick(exclude=["w1"], deadline_s=0.005))
        assert t.hopeless()
        t.release(Outcome.TIMED_OUT)
    assert b.endpoints["w0"].consecutive_failures == 0 and not b.endpoints["w0"].ejected(clock())
    t = must(b.pick(exclude=["w1"], deadline_s=0.5))
    assert not t.hopeless()


def test_load_polls_timing_out_in_a_row_pause_the_worker_until_one_answers(caplog):
    caplog.set_level(logging.INFO, logger="edgewise.gateway.balancer")
    b, _ = make([1, 1])
    for _ in range(LOAD_TIMEOUTS_TO_PAUSE - 1):
        b.load_timed_out("w1")
    b.report_load("w1", capacity=10.0)  # one answer breaks the streak
    for _ in range(LOAD_TIMEOUTS_TO_PAUSE - 1):
        b.load_timed_out("w1")
    assert not b.endpoints["w1"].paused
    b.load_timed_out("w1")
    assert b.endpoints["w1"].paused
    assert {must(b.pick()).address for _ in range(4)} == {"w0"}
    b.report_load("w1", capacity=10.0)
    assert not b.endpoints["w1"].paused
    msgs = [r.getMessage() for r in caplog.records]
    assert any("w1 paused" in m and "timed out" in m for m in msgs), msgs
    assert any("w1 readmitted" in m for m in msgs), msgs


def test_slow_start_under_light_load_follows_the_ramp():
    """One request at a time (each finished before the next): the joining worker's share
    among idle workers follows its ramped weight, not zero."""
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(slow_start_window_s=30.0), clock=clock, rng=random.Random(0))
    b.set_endpoints([("old", 1.0, "", False)])
    clock.t = 100.0
    b.set_endpoints([("old", 1.0, "", False), ("new", 1.0, "", False)])
    for at, factor in ((100.0, 0.1), (115.0, 0.5), (127.0, 0.9)):
        clock.t = at
        got = Counter()
        for _ in range(1000):
            t = must(b.pick())
            got[t.address] += 1
            t.release(Outcome.OK)
        assert got["new"] / got["old"] == pytest.approx(factor, rel=0.05), (at, got)


def test_an_idle_worker_in_slow_start_alone_idle_keeps_its_ramped_key():
    """Under load (the others busy) an idle joining worker is not key 0: it would take every
    request it can and the ramp would mean nothing."""
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(slow_start_window_s=30.0), clock=clock, rng=random.Random(0))
    b.set_endpoints([("old", 1.0, "", False)])
    clock.t = 100.0
    b.set_endpoints([("old", 1.0, "", False), ("new", 1.0, "", False)])
    b.endpoints["old"].in_flight = b.endpoints["old"].work = 3
    assert b.key(b.endpoints["new"], clock()) == pytest.approx(10.0)  # (0 + 1) / 0.1
    assert must(b.pick()).address == "old"


def test_the_ramp_starts_when_the_ejection_ends_and_views_see_it(caplog):
    caplog.set_level(logging.INFO, logger="edgewise.gateway.balancer")
    b, clock = make([1, 1], slow_start_window_s=30.0, max_ejection_percent=100)
    clock.t += 100
    for _ in range(5):
        must(b.pick(exclude=["w1"])).release(Outcome.FAILURE)
    ep = b.endpoints["w0"]
    until = ep.ejected_until
    assert until is not None and any("w0 ejected" in r.getMessage() for r in caplog.records)
    clock.t = until + 15.0  # back for 15 s, no pick since
    # the weight a scrape or /pool reads is already the ramp's, from the end of the ejection
    assert b.effective_weight(ep) == pytest.approx(0.5)
    b.refresh()
    assert not ep.ejected(clock()) and b.slow_start_factor(ep, clock()) == pytest.approx(0.5)
    assert any("w0 readmitted" in r.getMessage() for r in caplog.records)


def test_a_worker_the_gateway_starts_with_skips_slow_start_when_it_first_serves():
    """Discovered with the first set (or within STARTUP_S of it), unreachable or warming up at
    the first polls and serving later while its peer serves: no ramp. Once it has served, a
    return ramps; a worker discovered later ramps."""
    clock = FakeClock(0.0)
    b = Balancer(BalancerConfig(slow_start_window_s=30.0), clock=clock, rng=random.Random(0))
    b.set_endpoints([("a", 1.0, "", False)])
    clock.t = STARTUP_S / 2
    b.set_endpoints([("a", 1.0, "", False), ("b", 1.0, "", False)])
    b.report_load("a", 10.0)
    b.mark_unreachable("b")  # its channel still connecting at the first poll
    clock.t = 8.0
    b.report_load("b", 10.0)
    assert b.slow_start_factor(b.endpoints["b"], clock()) == 1.0
    b.mark_unreachable("b")
    b.report_load("b", 10.0)
    assert b.slow_start_factor(b.endpoints["b"], clock()) == pytest.approx(0.1)
    b.set_endpoints([("a", 1.0, "", False), ("b", 1.0, "", False), ("c", 1.0, "", False)])
    assert b.slow_start_factor(b.endpoints["c"], clock()) == pytest.approx(0.1)


def _fail_streak(b: Balancer, address: str, n: int) -> None:
    for _ in range(n):
        t = must(b.pick(exclude=[a for a in b.endpoints if a != address]))
        t.release(Outcome.FAILURE)


def test_a_failing_worker_the_ejection_cap_keeps_in_the_pool_is_no_least_loaded_magnet():
    """Two failing workers of four: the 10% cap ejects one; the other failed at once, had nothing
    in flight and so took most of the traffic (64% of it on real workers, with the two healthy
    ones nearly idle). Its streak now counts as load: it takes a request only when its peers
    have that many in flight, and a success brings it back."""
    b, clock = make([1, 1, 1, 1])
    _fail_streak(b, "w0", 5)
    _fail_streak(b, "w1", 5)
    assert b.endpoints["w0"].ejected(clock()) and not b.endpoints["w1"].ejected(clock())  # the cap held
    held = [must(b.pick()) for _ in range(10)]  # w2 and w3 up to 5 in flight each: keys below w1's 6
    assert Counter(t.address for t in held) == {"w2": 5, "w3": 5}
    tied = [must(b.pick()) for _ in range(3)]  # then all three key 6: w1 takes its turn
    assert Counter(t.address for t in tied) == {"w1": 1, "w2": 1, "w3": 1}
    next(t for t in tied if t.address == "w1").release(Outcome.OK)  # a success ends the streak
    assert b.endpoints["w1"].consecutive_failures == 0
    for t in held + tied:
        t.release(Outcome.OK)
    assert Counter(must(b.pick()).address for _ in range(3)) == {"w1": 1, "w2": 1, "w3": 1}  # idle-first again


def test_in_panic_a_readmitted_ejected_worker_is_no_least_loaded_magnet():
    """Three workers: one ejected, one paused (its pod down): panic readmits the ejected one,
    which failed at once and so took 74% of the traffic beside an idle healthy worker."""
    b, clock = make([1, 1, 1])
    b.report_load("w2", capacity=None, serving=False)
    _fail_streak(b, "w0", 5)
    assert b.endpoints["w0"].ejected(clock()) and b.in_panic()
    held = [must(b.pick()) for _ in range(5)]
    assert {t.address for t in held} == {"w1"}  # w1 up to 5 in flight before w0 gets one
    assert Counter(must(b.pick()).address for _ in range(2)) == {"w0": 1, "w1": 1}  # then they tie
