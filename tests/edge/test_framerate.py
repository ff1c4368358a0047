"""``edgewise_edge_fps``: the rate of a stream as of the scrape, for streams slower than one
frame per window and for streams that stopped (``edge.pipeline.FrameRate``)."""

from __future__ import annotations

import asyncio
import time
from typing import List

import pytest

from edge.deciding import Decider
from edge.metrics import EdgeMetrics
from edge.pipeline import FrameRate, Pipeline
from edge.sources.capturing import FrameQueue


def ticked(times: List[float]) -> FrameRate:
    r = FrameRate(window_s=5.0)
    for t in times:
        r.tick(t)
    return r


def test_a_steady_stream_reads_its_rate_between_frames() -> None:
    r = ticked([i / 10.0 for i in range(100)])  # 10 fps for 10 s, last frame at 9.9
    assert r.rate(9.9) == pytest.approx(10.0)
    assert r.rate(9.95) == pytest.approx(10.0)  # between two frames
    assert len(r.times) <= 52  # the window and the frame before it, not the whole run


@pytest.mark.parametrize("fps", [0.1, 0.02])
def test_a_stream_slower_than_one_frame_per_window_is_not_zero(fps: float) -> None:
    period = 1.0 / fps
    r = ticked([i * period for i in range(4)])
    last = 3 * period
    assert r.rate(last) == pytest.approx(fps)
    assert r.rate(last + period / 2) == pytest.approx(fps)  # its next frame is not due yet


def test_a_stream_that_stopped_falls_towards_zero() -> None:
    r = ticked([i / 10.0 for i in range(100)])
    assert r.rate(9.9 + 1.0) < 9.0
    assert r.rate(9.9 + 10.0) == pytest.approx(1 / 10.0, rel=0.05)
    assert r.rate(9.9 + 60.0) < 0.02
    assert ticked([]).rate(1.0) == 0.0
    assert ticked([3.0]).rate(4.0) == 0.0


def test_the_gauge_is_read_at_the_scrape() -> None:
    async def build() -> Pipeline:
        ready = asyncio.Event()
        return Pipeline("dev", None, [], {"s": FrameQueue(2, "wait", ready)}, ready, Decider(None),
                        None, lambda rec: None, metrics)

    metrics = EdgeMetrics()
    pipeline = asyncio.run(build())
    try:
        def gauge() -> float:
            value = metrics.registry.get_sample_value("edgewise_edge_fps", {"stream": "s"})
            assert value is not None
            return value

        assert gauge() == 0.0
        now = time.monotonic()
        for i in range(30):  # 10 fps until 3 s ago
            pipeline.rates["s"].tick(now - 6.0 + i / 10.0)
        assert gauge() < 5.0  # silent for 3 s: not the 10 fps it had
        pipeline.rates["s"].tick(time.monotonic())
        assert gauge() > 0.0
    finally:
        pipeline.executor.shutdown(wait=True)
