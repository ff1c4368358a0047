"""An idle batching worker holding a request for a fuller batch dispatches it early rather than
let it expire in the queue (docs/design/batching.md#deadlines, rule 3d of cloud/worker/batching.py).

Pure core on an injected (fake) clock: every call takes ``now``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.gateway.balancing import TOO_SHORT_MARK
from cloud.worker.batching import BUSY_MARK, Batcher, BatchPolicy
from edgewise.errors import DeadlineExceededError, OverloadedError

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


# -- rule 3f: a batch is no slower than its members' deadlines ---------------------------------

def cpu_batcher() -> Batcher[str]:
    """The probe's CPU worker with batching on: batch 1 about 40 ms, batch 4 about 160 ms."""
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=0.005))
    b.observe(1, 0.040, warmup=True)
    b.observe(4, 0.160, warmup=True)
    return b


def serve_busy(b: Batcher[str], deadlines: dict[str, float]) -> tuple[list[tuple[str, ...]], list[str], list[str]]:
    """The shell with a model whose batches take exactly their estimates: batches formed, members
    answered after their deadline (computed for nothing), members expired in the queue."""
    batches, late, expired = [], [], []
    now = 0.0
    while b.depth:
        batch = b.next_batch(now)
        expired += b.expired(now)
        if batch is None:
            wake = b.next_wakeup(now)
            now = wake if wake is not None and wake > now else now + 1e-4
            continue
        batches.append(batch.items)
        now += b._batch_time(len(batch))
        late += [r for r in batch.items if now > deadlines[r]]
    return batches, late, expired


def test_a_burst_is_batched_only_as_large_as_its_members_deadlines_allow():
    b = cpu_batcher()
    deadlines = {f"r{i}": 0.150 for i in range(12)}
    refused = []
    for r, d in deadlines.items():
        try:
            b.submit(r, 0.0, deadline=d)  # a batch of one (40 ms) makes 150 ms, not behind 3 others
        except OverloadedError as exc:
            assert BUSY_MARK in str(exc)
            refused.append(r)
    batches, late, expired = serve_busy(b, deadlines)
    # before: a batch of 4 (160 ms) ran and all four were answered after their deadline; then
    # 9 were admitted to expire in the queue (the gateway counted each against the worker)
    assert late == []
    assert [len(x) for x in batches] == [3]  # 120 ms by the line from t(1) to t(4); then 30 ms are left
    assert expired == [] and len(refused) == 9  # refused at once, as load: another worker may make it


def test_the_cut_keeps_priority_order_and_follows_the_earliest_deadline_taken():
    b = cpu_batcher()
    deadlines = {"loose0": 9.0, "loose1": 9.0, "urgent": 0.090, "loose2": 9.0}
    for r in ("loose0", "loose1", "loose2"):
        b.submit(r, 0.0, deadline=deadlines[r])
    b.submit("urgent", 0.0, priority=5, deadline=deadlines["urgent"])
    batches, late, expired = serve_busy(b, deadlines)
    assert batches[0] == ("urgent", "loose0") and late == [] and expired == []  # 80 ms < 90 ms
    assert batches[1] == ("loose1", "loose2")


def test_loose_deadlines_keep_full_batches():
    b = cpu_batcher()
    deadlines = {f"r{i}": 2.0 for i in range(12)}
    for r, d in deadlines.items():
        b.submit(r, 0.0, deadline=d)
    batches, late, expired = serve_busy(b, deadlines)
    assert [len(x) for x in batches] == [4, 4, 4] and late == [] and expired == []


def test_under_load_where_batching_pays_the_cut_keeps_batches_that_answer_more_in_time():
    """A GPU-like model (a batch of 8 costs little more than one): a queue of 8 whose oldest can
    make only a small batch. Cutting to what every member makes sent 1 and let the other 7 wait
    into their deadlines; the batch of 8 answers 7 in time."""
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=8, max_queue_delay_s=0.005))
    b.observe(1, 0.010, warmup=True)
    b.observe(8, 0.024, warmup=True)
    deadlines = {"oldest": 0.015, **{f"r{i}": 0.040 for i in range(7)}}
    for r, d in deadlines.items():
        b.submit(r, 0.0, deadline=d)
    batch = b.next_batch(0.0, flush=True)
    assert batch is not None and len(batch) == 8  # 24 ms: 7 of 8 in time (the old cut: a batch of 1)


def _reference_size(b: Batcher[int], queued: list[tuple[int, int, float | None]], size: int, now: float) -> int:
    """Rule 3f by brute force: of the prefixes of the queue in dispatch order, the largest with
    the most members that need this batch (in time now, late after one more), then the fewest late."""
    order = sorted(queued, key=lambda q: (-q[1], q[0]))[:size]
    best, key = 1, None
    for k in range(1, len(order) + 1):
        t = b._batch_time(k)
        ds = [float("inf") if d is None else d for _, _, d in order[:k]]
        late = sum(d <= now + t for d in ds)
        needing = sum(now + t < d <= now + 2 * t for d in ds)
        if key is None or (needing, -late) >= key:
            best, key = k, (needing, -late)
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.none(), st.floats(0.05, 0.5))), min_size=1, max_size=12),
       st.floats(0.0, 0.01))
def test_each_batch_is_the_size_that_answers_the_most_that_need_it(reqs, now):
    b = cpu_batcher()
    queued = []
    for i, (prio, d) in enumerate(reqs):
        try:
            b.submit(i, 0.0, priority=prio, deadline=d)
            queued.append((i, prio, d))
        except (DeadlineExceededError, OverloadedError):  # too close alone, or behind those queued
            pass
    waiting = [(i, p, d) for i, p, d in queued if d is None or d - b.need_s() > now]  # what a purge keeps
    batch = b.next_batch(now, flush=True)
    if batch is None:
        assert not waiting
        return
    assert len(batch) == _reference_size(b, waiting, 4, now)


# -- rule 5: what the queue ahead and the batch running leave ----------------------------------

def test_the_wait_counts_the_batch_running_and_only_the_requests_that_leave_first():
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=1, max_queue_delay_s=0.0))
    b.observe(1, 0.040, warmup=True)
    b.submit("running", 0.0, deadline=9.0)
    assert b.next_batch(0.0) is not None  # 40 ms in the model from 0
    for i in range(3):
        b.submit(f"low{i}", 0.010, deadline=9.0)
    assert abs(b.wait_s(0.010) - (0.030 + 4 * 0.040)) < 1e-9  # 30 ms left, 3 queued, its own
    assert abs(b.wait_s(0.010, priority=5) - (0.030 + 0.040)) < 1e-9  # it leaves before those
    b.submit("urgent", 0.010, priority=5, deadline=0.100)  # makes 70 ms: not refused for the queue
    try:
        b.submit("late", 0.010, deadline=0.150)  # alone 40 ms, behind them 230 ms
    except OverloadedError as exc:
        assert BUSY_MARK in str(exc) and "4 requests queued ahead" in str(exc)
    else:
        raise AssertionError("a request that cannot make its deadline behind the queue was accepted")
    b.finished()
    assert abs(b.wait_s(0.010, priority=5) - 2 * 0.040) < 1e-9  # nothing running: urgent, then it


def test_expiry_is_due_while_a_batch_runs_unless_that_batch_stalled():
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=1, max_queue_delay_s=0.0))
    b.observe(1, 0.040, warmup=True)
    b.submit("running", 0.0, deadline=9.0)
    assert b.next_batch(0.0) is not None
    b.submit("queued", 0.0, deadline=0.150)
    assert abs(b.next_expiry() - 0.110) < 1e-9  # out of reach 40 ms before its deadline
    assert b.expired(0.111) == ["queued"] and b.next_expiry() is None
    assert not b.stalled(0.160) and b.stalled(0.161)  # 4 times the 40 ms it was expected to take
    b.finished()
    assert not b.stalled(10.0)


def test_a_batching_native_worker_waits_a_small_image_by_its_pixels_not_the_large_frames_time():
    """A native-input worker that batches (max_batch_size 4) and served 1920x1080 frames (670 ms
    each alone) takes a 640x360 one with 448 ms to go on an idle queue, as ``need_s`` judges it
    (test_batching's batch-1 case): ``wait_s`` took a batch of one at the large frames' 670 ms and
    refused it as load. Behind large frames queued ahead it is still refused, and a large frame
    with as little time is refused as too close, as before."""
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=0.0), pixel_cost=True)
    big, small = 1920 * 1080, 640 * 360
    for _ in range(3):
        b.observe(1, 0.670, big)
    b.observe(4, 1.0, 4 * big)
    assert b.wait_s(10.0, pixels=small) == pytest.approx(b.need_s(small))  # about 75 ms, not 670
    b.submit("small", 10.0, deadline=10.448, pixels=small)
    assert b.wait_s(10.0, pixels=small) == pytest.approx(2 * b.need_s(small))  # a batch of two small ones
    with pytest.raises(DeadlineExceededError, match="a batch takes about 670.0 ms"):
        b.submit("big", 10.0, deadline=10.448, pixels=big)
    for i in range(4):
        b.submit(f"big{i}", 10.0, deadline=20.0, pixels=big)
    with pytest.raises(OverloadedError, match=BUSY_MARK):  # behind a full batch of large frames
        b.submit("small2", 10.0, deadline=10.448, pixels=small)
    # a fixed-size model's time does not follow pixels: the batch-of-one time rules
    fixed: Batcher[str] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=0.0))
    for _ in range(3):
        fixed.observe(1, 0.670, big)
    assert fixed.wait_s(10.0, pixels=small) == pytest.approx(0.670)


def test_a_small_image_running_is_waited_for_by_its_pixels_not_the_large_frames_time():
    """The rest of the batch running counts at its least time, as the queue ahead: a small image
    in the model on a native-input worker that served 1920x1080 frames takes about 75 ms, and a
    request behind it with 448 ms to go is not refused for the 670 ms a large frame took. Whether
    the batch stalled is still judged against the larger, expected time (rule 8)."""
    b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=4, max_queue_delay_s=0.0), pixel_cost=True)
    big, small = 1920 * 1080, 640 * 360
    for _ in range(3):
        b.observe(1, 0.670, big)
    b.observe(4, 1.0, 4 * big)
    b.submit("running", 10.0, deadline=20.0, pixels=small)
    assert b.next_batch(10.0) is not None
    assert b.wait_s(10.0, pixels=small) == pytest.approx(2 * b.need_s(small))
    b.submit("next", 10.0, deadline=10.448, pixels=small)
    assert not b.stalled(10.0 + 4 * 0.670) and b.stalled(10.0 + 4 * 0.670 + 1e-6)
