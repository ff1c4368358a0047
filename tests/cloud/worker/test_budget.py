"""The decode pixel budget: the pure semaphore, then a real worker holding it while decoding."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest

from cloud.worker.budget import PixelBudget
from cloud.worker.runner import ModelRunner, Prepared
from edgewise.errors import OverloadedError
from edgewise.imagefiles import DEFAULT_MAX_PIXELS
from edgewise.v1 import detect_pb2
from tests.cloud.worker.test_server import call, jpeg_request, make_settings, photo, running
from tests.waiting import async_wait_until


def test_budget_admits_in_arrival_order_within_the_limit():
    async def main():
        b = PixelBudget(100, max_waiting=3)
        assert await b.acquire(60, None) == 60
        order = []

        async def take(n, tag):
            await b.acquire(n, None)
            order.append(tag)

        t1 = asyncio.ensure_future(take(50, "big"))
        t2 = asyncio.ensure_future(take(10, "small"))  # fits now, but waits behind "big": FIFO
        await asyncio.sleep(0)
        assert b.waiting == 2 and order == []
        b.release(60)
        await asyncio.gather(t1, t2)
        assert order == ["big", "small"] and b.in_use == 60
    asyncio.run(main())


def test_budget_clamps_refuses_and_times_out():
    async def main():
        b = PixelBudget(100, max_waiting=1)
        assert await b.acquire(500, None) == 100  # larger than the budget: runs alone
        waiter = asyncio.ensure_future(b.acquire(1, None))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError, match="1 decodes already waiting"):
            await b.acquire(1, None)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(OverloadedError, match="deadline passed while waiting"):
            await b.acquire(1, 0.01)
        assert b.waiting == 0 and b.in_use == 100
        b.release(100)
        assert b.in_use == 0 and await b.acquire(100, 0) == 100
    asyncio.run(main())


class GatedRunner(ModelRunner):
    """The real runner; ``prepare`` of the first image waits for ``gate`` (holding the budget)."""

    def __init__(self, model: Path) -> None:
        real = ModelRunner.from_settings(make_settings(model))
        super().__init__(real.detector)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.in_use: list[int] = []
        self.budget: PixelBudget | None = None
        self._lock = threading.Lock()
        self.decoding = 0
        self.most_at_once = 0  # decodes running at the same time, at most

    def prepare(self, image: detect_pb2.Image, max_pixels: int = DEFAULT_MAX_PIXELS) -> Prepared:
        with self._lock:
            self.decoding += 1
            self.most_at_once = max(self.most_at_once, self.decoding)
        try:
            if self.budget is not None:
                self.in_use.append(self.budget.in_use)
            if not self.entered.is_set():
                self.entered.set()
                assert self.gate.wait(20)
            return super().prepare(image, max_pixels)
        finally:
            with self._lock:
                self.decoding -= 1


def test_worker_holds_decodes_within_the_budget(tiny_model):
    im = photo()[:400, :500]  # 200,000 pixels
    settings = make_settings(tiny_model)
    settings.decode_pixel_budget = 300_000  # one such image at a time, not two

    async def main():
        runner = GatedRunner(tiny_model)
        async with running(settings, runner) as (server, stub, _):
            runner.budget = server.service.decode_budget
            first = asyncio.ensure_future(call(stub, jpeg_request(im, 0)))
            assert await asyncio.to_thread(runner.entered.wait, 10)
            # the budget is held by the first decode: this one waits, then its deadline passes
            short = jpeg_request(im, 1, deadline_unix_ns=time.time_ns() + 300_000_000)  # the wait's bound
            code, msg = await call(stub, short, timeout=10)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "decode budget full: 200000 of 300000" in msg
            others = [asyncio.ensure_future(call(stub, jpeg_request(im, i))) for i in range(2, 6)]
            await async_wait_until(lambda: runner.budget.waiting == 4, 10, "the 4 decodes waiting for the budget")
            runner.gate.set()
            results = await asyncio.gather(first, *others)
            assert [r[0] for r in results] == [grpc.StatusCode.OK] * 5
            assert max(runner.in_use) <= settings.decode_pixel_budget  # never two at once
            refused = server.service.metrics.registry.get_sample_value("edgewise_worker_decode_budget_refused_total")
            assert refused == 1.0
            assert server.service.decode_budget.in_use == 0
    asyncio.run(main())


def test_a_decode_whose_client_gave_up_holds_the_budget_until_it_ends(tiny_model):
    """A decode runs on in its thread after its client gives up (deadline, cancel): its pixels
    were handed back at once, so the next image decoded beside it, past the budget (two 8K
    decodes at once on a budget of one, found by a probe)."""
    im = photo()[:400, :500]  # 200,000 pixels
    settings = make_settings(tiny_model)
    settings.decode_pixel_budget = 300_000  # one such image at a time

    async def main():
        runner = GatedRunner(tiny_model)
        async with running(settings, runner) as (server, stub, _):
            budget = runner.budget = server.service.decode_budget
            code, _ = await call(stub, jpeg_request(im, 0), timeout=0.5)  # the client gives up mid-decode
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED and runner.entered.is_set()
            await asyncio.sleep(0.2)
            assert budget.in_use == 200_000  # still decoding: still counted
            second = asyncio.ensure_future(call(stub, jpeg_request(im, 1)))
            await async_wait_until(lambda: budget.waiting == 1, 10, "the next decode waiting for the budget")
            runner.gate.set()
            assert (await second)[0] == grpc.StatusCode.OK
            assert runner.most_at_once == 1
            await async_wait_until(lambda: budget.in_use == 0, 10, "the budget handed back")
            assert server.service.metrics.registry.get_sample_value("edgewise_worker_decode_pixels") == 0
    asyncio.run(main())


def test_a_queued_decode_whose_client_gave_up_is_not_run(tiny_model):
    """With the decode threads busy, a request waits in the pool's queue; its client giving up
    takes it out of the queue (found by a review: the shield above let it run anyway)."""
    im = photo()[:100, :100]
    settings = make_settings(tiny_model)
    settings.decode_threads = 1  # one decode at a time: the second waits in the pool's queue

    async def main():
        runner = GatedRunner(tiny_model)
        async with running(settings, runner) as (server, stub, _):
            budget = runner.budget = server.service.decode_budget
            first = asyncio.ensure_future(call(stub, jpeg_request(im, 0)))
            assert await asyncio.to_thread(runner.entered.wait, 10)
            code, _ = await call(stub, jpeg_request(im, 1), timeout=0.5)  # queued behind it, gives up
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            # the first's pixels only: the second's go back once the worker sees its call cancelled
            await async_wait_until(lambda: budget.in_use == 10_000, 10, "the abandoned request's pixels back")
            runner.gate.set()
            assert (await first)[0] == grpc.StatusCode.OK
            await async_wait_until(lambda: budget.in_use == 0, 10, "the budget handed back")
            assert len(runner.in_use) == 1  # prepare ran once: the abandoned one never
    asyncio.run(main())
