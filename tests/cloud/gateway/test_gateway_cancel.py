"""Calls the edge cancels after the gateway forwarded them (real gateway, real grpc.aio test
workers, real clients over sockets).

A cancelled edge call must cancel its call to the worker (the worker stops on it), free the
worker's slot at once, never be retried elsewhere, and log nothing at ERROR. The call to the
worker is cancelled in gRPC Core, never by cancelling the task that awaits its batch: that
leaks the batch's native memory in grpc.aio (grpc/grpc#43360; ``bench/gateway_cancel_leak.py``
measures it, a figure no test can hold steady).
"""

from __future__ import annotations

import asyncio
import logging
import random

import grpc
import pytest
from grpc._cython.cygrpc import ExecuteBatchError

from cloud.gateway import server
from edgewise import status
from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.test_gateway import run, started
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import async_wait_until


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


def _recording_calls(gw: server.Gateway) -> list[grpc.aio.UnaryUnaryCall]:
    """Every call the gateway makes to a worker, as grpc.aio call objects."""
    made: list[grpc.aio.UnaryUnaryCall] = []
    for ch in gw.pool._channels.values():
        def infer(*args, _infer=ch.infer, **kwargs):
            call = _infer(*args, **kwargs)
            made.append(call)
            return call
        ch.infer = infer
    return made


def _sample(gw: server.Gateway, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


def _retries(gw: server.Gateway) -> float:
    return _sample(gw, "edgewise_gateway_retries_total", result="sent")


def test_a_cancelled_call_cancels_the_workers_call_frees_its_slot_and_is_not_retried(caplog):
    async def main():
        ws = [TestWorker("a", 30.0, concurrency=4), TestWorker("b", 30.0, concurrency=4)]
        gw = await started([(w, 1) for w in ws], **{"retry.min_per_s": 100})
        made = _recording_calls(gw)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                call = service_pb2_grpc.EscalationStub(ch).Detect(request(), timeout=20)
                await async_wait_until(lambda: sum(w.in_flight for w in ws) == 1, 10, "the call at a worker")
                assert gw.pool.balancer.total_in_flight() == 1
                call.cancel()
                # the worker would answer in 30 s: it stopped because its call was cancelled
                await async_wait_until(lambda: sum(w.in_flight for w in ws) == 0, 5, "the worker's call cancelled")
                await async_wait_until(lambda: gw.pool.balancer.total_in_flight() == 0, 5, "the slot freed")
            assert sum(w.calls for w in ws) == 1 and _retries(gw) == 0  # not retried on the other worker
            assert len(made) == 1
            forwarded = made[0]
            await async_wait_until(forwarded._invocation_task.done, 5, "the forwarded call's batch to complete")
            # cancelled in Core, and nothing ever cancelled the call's own task, which awaited the
            # batch (cancelling it leaks the batch's op array)
            assert forwarded.cancelled() and forwarded._invocation_task.cancelling() == 0
            assert not [s for m in gw.metrics.registry.collect() for s in m.samples
                        if s.name == "edgewise_gateway_worker_errors_total"]  # the worker is not to blame
            snap = gw.pool.snapshot()
            assert all(w["state"] == "ready" for w in snap["workers"]) and snap["in_flight"] == 0
            # never answered, so not in requests_total: counted as what it was
            assert _sample(gw, "edgewise_gateway_unanswered_total", transport="grpc") == 1
            assert not [s for m in gw.metrics.registry.collect() for s in m.samples
                        if s.name == "edgewise_gateway_requests_total" and s.value]  # each still at 0
        finally:
            await gw.stop(0)
            for w in ws:
                await w.stop()
    with caplog.at_level("DEBUG"):
        run(main())
    assert not _errors(caplog)


def test_calls_cancelled_at_any_moment_leave_nothing_in_flight_and_log_no_error(caplog):
    """Cancelled before forwarding, at the worker, while the gateway refuses or answers with an
    error: whatever the moment, nothing stays in flight, nothing is retried, nothing is an ERROR."""
    async def main():
        ok = TestWorker("ok", 0.01, concurrency=8)
        refusing = TestWorker("refusing", fail=grpc.StatusCode.INVALID_ARGUMENT)  # answered with abort
        gw = await started([(ok, 1), (refusing, 1)], **{"retry.min_per_s": 100})
        rng = random.Random(7)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def one(i: int) -> None:
                    req = request(seq=i, data=b"bad" if i % 5 == 0 else None)  # every fifth refused at once
                    call = stub.Detect(req, timeout=10)
                    await asyncio.sleep(rng.uniform(0, 0.03))
                    call.cancel()
                    try:
                        await call
                    except (asyncio.CancelledError, grpc.aio.AioRpcError):
                        pass

                for start in range(0, 300, 10):
                    await asyncio.gather(*(one(i) for i in range(start, start + 10)))
            await async_wait_until(lambda: gw.pool.balancer.total_in_flight() == 0 and ok.in_flight == 0, 10,
                                   "every cancelled call released")
            assert ok.calls > 0 and refusing.calls > 0 and _retries(gw) == 0
        finally:
            await gw.stop(0)
            await ok.stop()
            await refusing.stop()
    with caplog.at_level("DEBUG"):
        run(main())
    assert not _errors(caplog)


def test_an_error_answer_for_a_client_already_gone_is_a_debug_line(caplog):
    """The narrow race the servicer cannot see coming: the client leaves between the gateway's
    error answer being decided and sent. gRPC's failed send is a DEBUG line and the call ends
    as cancelled (grpc logged it as an ERROR with a traceback, once per call)."""
    class GoneContext:
        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise ExecuteBatchError('Failed "execute_batch": (SendStatusFromServerOperation,)')

    with caplog.at_level("DEBUG", logger="edgewise.gateway"), pytest.raises(asyncio.CancelledError):
        asyncio.run(server._abort(GoneContext(), status.RESOURCE_EXHAUSTED, "all workers are saturated"))
    assert [(r.levelname, r.getMessage()[:52]) for r in caplog.records] == [
        ("DEBUG", "the client left before its RESOURCE_EXHAUSTED answer")]
