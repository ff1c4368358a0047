"""A worker's refusals about itself, between real workers: a deadline closer than its batch of
one, and its queue full (another gateway's requests fill it); the gateway sends the request on
to a worker that may make it, and holds nothing against the one that refused
(docs/design/balancing.md#retries-and-the-retry-budget).

Real in-process workers (the worker's own server, batcher and refusal; YOLOv5n at 160 px on ONNX
Runtime) behind a real gateway, every one on port 0, a real gRPC client. One worker is made slow
by sleeping in its inference thread, as a CPU worker is slow beside a GPU one: its warm-up
measures the sleep, so it refuses every deadline closer than that, as a slow worker does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import AsyncIterator, Tuple

import grpc

from cloud.gateway.server import Gateway
from cloud.gateway.settings import load_settings
from cloud.worker.runner import ModelRunner
from cloud.worker.server import WorkerServer, create_server
from cloud.worker.settings import BatchingSettings, WorkerSettings
from edgewise.runtime.detector import Detector
from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.workers import request
from tests.waiting import async_wait_until

SLOW_S = 1.0  # the slow worker's batch of one
DEADLINE_S = 0.6  # shorter than that, far longer than the fast worker's


class SlowRunner(ModelRunner):
    """The real model, ``slow_s`` slower per batch."""

    slow_s = SLOW_S

    def _run_batch(self, items):
        time.sleep(self.slow_s)
        return super()._run_batch(items)


class BusyRunner(SlowRunner):
    """Slow enough for a request to be seen waiting behind the one it runs."""

    slow_s = 3.0


def worker_settings(model: Path, worker_id: str, max_queue_size: int = 64) -> WorkerSettings:
    return WorkerSettings(model=str(model), host="127.0.0.1", port=0, metrics_port=-1, worker_id=worker_id,
                          threads=1, warmup_rounds=1, grace_s=2,
                          batching=BatchingSettings(max_batch_size=1, mode="off", max_queue_size=max_queue_size))


@contextlib.asynccontextmanager
async def preferred_and_other(model: Path, first: WorkerSettings, runner: ModelRunner,
                              other_id: str) -> AsyncIterator[Tuple[WorkerServer, str, Gateway]]:
    """A worker the gateway picks first (``first`` with ``runner``, weight 50), a plain one
    (``other_id``, weight 1), and a real gateway in front of both, once it has both workers'
    load: (the preferred worker, its address, the gateway)."""
    preferred, first_port = create_server(first, runner)
    other, other_port = create_server(worker_settings(model, other_id))
    await asyncio.gather(preferred.start(), other.start())
    first_addr = f"127.0.0.1:{first_port}"
    gw = Gateway(load_settings(None, {
        "listen": "127.0.0.1:0", "metrics_port": -1, "load_poll_interval_s": 0.2,
        "balancer.slow_start_window_s": 0, "balancer.use_reported_capacity": False,
        "discovery.static": [f"{first_addr}=50", f"127.0.0.1:{other_port}=1"]}, env={}))
    await gw.start()
    try:
        eps = gw.pool.balancer.endpoints
        await async_wait_until(lambda: all(ep.capacity for ep in eps.values()), 10, "both workers' load")
        yield preferred, first_addr, gw
    finally:
        await gw.stop(0)
        await asyncio.gather(preferred.stop(1), other.stop(1))


def test_a_refused_too_short_deadline_is_answered_by_a_worker_that_makes_it(tiny_model):
    """Worker `slow` refuses a 600 ms deadline up front (its batch takes 1 s); worker `fast` has
    time enough. The gateway picks `slow` first (weight 50 to 1) and used to answer the client
    with `slow`'s refusal: now every request is answered by `fast`, `slow` is not counted as
    failing (no ejection), and each retry is counted as sent."""

    async def main():
        async with preferred_and_other(tiny_model, worker_settings(tiny_model, "slow"),
                                       SlowRunner(Detector.from_file(tiny_model, threads=1)), "fast") as (slow, slow_addr, gw):
            eps = gw.pool.balancer.endpoints
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                answers = []
                for seq in range(3):
                    try:
                        answers.append((await stub.Detect(request(seq=seq), timeout=DEADLINE_S)).worker_id)
                    except grpc.aio.AioRpcError as exc:
                        answers.append(f"{exc.code().name}: {exc.details()}")
            refused = slow.service.metrics.registry.get_sample_value(
                "edgewise_worker_requests_total", {"status": grpc.StatusCode.DEADLINE_EXCEEDED.name})
            retried = gw.metrics.registry.get_sample_value("edgewise_gateway_retries_total", {"result": "sent"})
            return answers, refused, retried, eps[slow_addr].consecutive_failures, eps[slow_addr].ejections

    answers, refused, retried, failures, ejections = asyncio.run(asyncio.wait_for(main(), 120))
    assert answers == ["fast"] * 3, answers
    assert refused == 3  # each went to `slow` first, which refused it
    assert retried == 3
    assert (failures, ejections) == (0, 0)  # the refusal is not held against `slow`


def test_a_full_worker_queue_is_answered_by_a_worker_with_room(tiny_model):
    """Worker `busy` (1 s a batch, room for one request waiting) is kept full by another
    gateway's requests, which this gateway cannot see; this gateway picks it first (weight 50 to
    1) and used to answer the client with its "worker queue full" refusal: now the request goes
    on to `idle`, and the refusal is counted as load on `busy`, not as a failure. A
    RESOURCE_EXHAUSTED without the worker's mark is not retried (balancing.refused_busy)."""

    async def main():
        async with preferred_and_other(tiny_model, worker_settings(tiny_model, "busy", max_queue_size=1),
                                       BusyRunner(Detector.from_file(tiny_model, threads=1)), "idle") as (busy, busy_addr, gw):
            eps = gw.pool.balancer.endpoints
            async with grpc.aio.insecure_channel(busy_addr) as other, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                other_gateway = service_pb2_grpc.WorkerStub(other)
                # one request running (3 s), then one waiting: the queue of one is full
                held = [asyncio.ensure_future(other_gateway.Infer(request(seq=100), timeout=20))]
                await async_wait_until(lambda: busy.service.batcher.depth == 0 and busy.service.metrics.registry
                                       .get_sample_value("edgewise_worker_in_flight") == 1,
                                       10, "busy running the other gateway's first request")
                held.append(asyncio.ensure_future(other_gateway.Infer(request(seq=101), timeout=20)))
                await async_wait_until(lambda: busy.service.batcher.depth == 1, 10, "busy's queue full")
                stub = service_pb2_grpc.EscalationStub(ch)
                try:
                    answer = (await stub.Detect(request(seq=1), timeout=5)).worker_id
                except grpc.aio.AioRpcError as exc:
                    answer = f"{exc.code().name}: {exc.details()}"
                await asyncio.gather(*held, return_exceptions=True)
            refused = busy.service.metrics.registry.get_sample_value(
                "edgewise_worker_requests_total", {"status": grpc.StatusCode.RESOURCE_EXHAUSTED.name})
            retried = gw.metrics.registry.get_sample_value("edgewise_gateway_retries_total", {"result": "sent"})
            return answer, refused, retried, eps[busy_addr].consecutive_failures, eps[busy_addr].ejections

    answer, refused, retried, failures, ejections = asyncio.run(asyncio.wait_for(main(), 120))
    assert answer == "idle", answer
    assert refused == 1  # it went to `busy` first, which refused it
    assert retried == 1
    assert (failures, ejections) == (0, 0)
