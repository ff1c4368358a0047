"""Micro-benchmark of the batcher's cost: the core per request, and the shell's
timer overshoot beyond ``max_queue_delay`` (target: under ~1 ms per request).

Run with ``-s`` to see the figures:
``.venv/bin/pytest tests/cloud/worker/test_overhead.py -q -s``. Bounds are loose
on purpose (the test machine is shared); the printed numbers are the measurement.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from cloud.worker.batching import Batcher, BatchPolicy
from tests.cloud.worker.test_server import jpeg_request, make_settings, photo, running


def test_core_costs_microseconds_per_request():
    b: Batcher[int] = Batcher(BatchPolicy(max_batch_size=8, max_queue_delay_s=0.005,
                                          preferred_batch_sizes=(4, 8), max_queue_size=64))
    n = 20_000
    t0 = time.perf_counter()
    now = 0.0
    for i in range(n):
        now += 0.0001
        b.submit(i, now, priority=i % 3, deadline=now + 1.0)
        batch = b.next_batch(now)
        if batch is None:
            b.next_wakeup(now)
        b.expired(now)
    per_req_us = (time.perf_counter() - t0) / n * 1e6
    print(f"\nbatcher core: {per_req_us:.1f} us per request (submit + next_batch + wakeup + expired)")
    assert per_req_us < 200


def test_shell_adds_under_a_millisecond_beyond_max_delay(tiny_model):
    delay_ms = 5.0
    settings = make_settings(tiny_model, max_batch_size=8, max_queue_delay_ms=delay_ms)

    async def main():
        async with running(settings) as (_, stub, _ch):
            req = jpeg_request(photo())
            waits, rest = [], []
            for _ in range(40):  # one at a time: each waits alone for the full delay
                t0 = time.perf_counter()
                r = await stub.Infer(req, timeout=10)
                total_ms = 1e3 * (time.perf_counter() - t0)
                assert r.timing.batch_size == 1
                waits.append(r.timing.queue_ms - delay_ms)
                rest.append(total_ms - r.timing.queue_ms - r.timing.compute_ms)
            return waits, rest

    over, rest = asyncio.run(main())
    over.sort()
    print(f"\noutside queue and model (gRPC both ways, JPEG decode, letterbox, executor hops): "
          f"p50 {statistics.median(rest):.3f} ms")
    p50, p90 = statistics.median(over), over[int(0.9 * len(over)) - 1]
    print(f"\nshell overshoot beyond max delay: p50 {p50:.3f} ms, p90 {p90:.3f} ms, max {over[-1]:.3f} ms")
    assert min(over) >= -0.01  # never sent before its delay (a lone request waits for company)
    # Measured here: p50 0.24-0.35 ms at load average 13 on 2 cores. The bound
    # leaves room for that machine yet fails on a real bug (an extra delay or a
    # coarse polling loop costs >= max delay = 5 ms).
    assert p50 < 3.0
