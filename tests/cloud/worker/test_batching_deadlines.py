"""An idle batching worker holding a request for a fuller batch dispatches it early rather than
let it expire in the queue (docs/design/batching.md#deadlines, rule 3d of cloud/worker/batching.py).

Pure core on an injected (fake) clock: every call takes ``now``.
"""

from __future__ import annotations

from cloud.gateway.balancing import TOO_SHORT_MARK
from cloud.worker.batching import Batcher, BatchPolicy
from edgewise.errors import DeadlineExceededError

BATCH1_S = 0.0073  # the probe's measured batch-of-one time


def idle_batcher(delay_s: float = 0.300) -> Batcher[str]:
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=8, max_queue_delay_s=delay_s))
    b.observe(1, BATCH1_S, warmup=True)
    b.observe(8, 0.030, warmup=True)
    return b


def drive(b: Batcher[str], until: float) -> tuple[list[tuple[float, tuple[str, ...], str]], list[str]]:
    """The shell: sleep until ``next_wakeup``, ask for a batch, collect expiries (model idle)."""
    batches, expired = [], []
    now = 0.0
    while now <= until:
        batch = b.next_batch(now)
        expired += b.expired(now)
        if batch is not None:
            batches.append((now, batch.items, batch.reason))
        wake = b.next_wakeup(now)
        if wake is None:
            break
        now = wake if wake > now else now + 1e-6
    return batches, expired


def test_a_100ms_deadline_is_served_by_an_idle_worker_holding_for_300ms():
    b = idle_batcher()
    b.submit("r", 0.0, deadline=0.100)
    batches, expired = drive(b, 1.0)
    assert expired == []
    assert len(batches) == 1
    t, items, reason = batches[0]
    assert items == ("r",) and reason == "deadline"
    # it goes late enough to wait for company, early enough to finish in time
    assert 0.05 < t and t + BATCH1_S < 0.100


def test_the_earliest_deadline_counts_not_the_oldest_request():
    b = idle_batcher()
    b.submit("old", 0.0)                      # no deadline: would wait 300 ms
    b.submit("urgent", 0.010, deadline=0.060)
    batches, expired = drive(b, 1.0)
    assert expired == []
    (t, items, reason), = batches
    assert set(items) == {"old", "urgent"} and reason == "deadline" and t + BATCH1_S < 0.060


def test_nothing_goes_early_without_a_deadline_at_risk():
    b = idle_batcher(delay_s=0.050)
    b.submit("r", 0.0, deadline=10.0)
    (t, _, reason), = drive(b, 1.0)[0]
    assert reason == "delay" and abs(t - 0.050) < 1e-9


def test_the_up_front_refusal_says_what_the_gateway_reads_as_not_the_workers_fault():
    b = idle_batcher()
    try:
        b.submit("r", 0.0, deadline=0.004)
    except DeadlineExceededError as exc:
        assert TOO_SHORT_MARK in str(exc)
    else:
        raise AssertionError("a deadline closer than a batch of one was accepted")
