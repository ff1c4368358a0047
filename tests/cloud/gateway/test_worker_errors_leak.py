"""``edgewise_gateway_worker_errors_total`` forgets a worker that left the pool (real gateway,
real grpc.aio test workers, /metrics over HTTP).

The other per-worker series come from the balancer at scrape time and vanish with their
worker; the error counter kept a series per worker ever seen, so with Kubernetes discovery
(a new pod name per rollout) /metrics grew forever. A worker's error series now goes when
the worker leaves: at once when it had nothing in flight, else when its last request ends
(that request's own error included).
"""

from __future__ import annotations

import asyncio
import time

import grpc

from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.test_gateway import _detect, http_get, run, started
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import async_wait_until


def _expiring(seq: int, after_s: float):
    """A request whose own deadline passes at the worker (the client's call lasts longer, so
    the gateway answers it, with DEADLINE_EXCEEDED counted against the worker)."""
    req = request(seq=seq)
    req.deadline_unix_ns = time.time_ns() + int(after_s * 1e9)
    return req


def test_a_departed_workers_error_series_leave_with_it():
    async def main():
        slow = TestWorker("slow", 30.0, concurrency=4)  # never answers in time: DEADLINE_EXCEEDED
        refusing = TestWorker("refusing", fail=grpc.StatusCode.INVALID_ARGUMENT)
        brief = TestWorker("brief", fail=grpc.StatusCode.INVALID_ARGUMENT)
        await refusing.start()
        await brief.start()
        gw = await started([(slow, 1)])

        async def series() -> dict[str, set[str]]:
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            out: dict[str, set[str]] = {}
            for line in text.splitlines():
                if line.startswith("edgewise_gateway_worker_") and 'worker="' in line:
                    worker = line.split('worker="', 1)[1].split('"', 1)[0]
                    out.setdefault(worker, set()).add(line.split("{", 1)[0])
            return out

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                assert (await _detect(stub, _expiring(1, 0.2), timeout=10))[0] == "DEADLINE_EXCEEDED"
                assert "edgewise_gateway_worker_errors_total" in (await series())[slow.address]
                # removed with a request in flight: it drains, and that request fails too
                pending = asyncio.ensure_future(_detect(stub, _expiring(2, 1.0), timeout=10))
                await async_wait_until(lambda: slow.in_flight == 1, 10, "a request at the slow worker")
                gw.reload_workers([f"{refusing.address}=1"])
                assert (await _detect(stub, request(seq=3)))[0] == "INVALID_ARGUMENT"
                assert (await pending)[0] == "DEADLINE_EXCEEDED"
                await async_wait_until(lambda: slow.address not in gw.pool.balancer.endpoints, 10,
                                       "the slow worker to drain and leave")
                got = await series()
                assert slow.address not in got, got[slow.address]
                assert "edgewise_gateway_worker_errors_total" in got[refusing.address]
                # a worker that leaves with nothing in flight goes at once; the others keep theirs
                gw.reload_workers([f"{refusing.address}=1", f"{brief.address}=1"])
                await async_wait_until(lambda: brief.address in gw.pool._channels, 10, "the brief worker added")
                for i in range(10):
                    await _detect(stub, request(seq=10 + i))
                assert brief.calls > 0
                assert "edgewise_gateway_worker_errors_total" in (await series())[brief.address]
                gw.reload_workers([f"{refusing.address}=1"])
                await async_wait_until(lambda: brief.address not in gw.pool.balancer.endpoints, 10,
                                       "the brief worker to leave")
                got = await series()
                assert set(got) == {refusing.address}, got
                text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
                assert text.count("edgewise_gateway_worker_errors_total{") == 1
        finally:
            await gw.stop(0)
            for w in (slow, refusing, brief):
                await w.stop()
    run(main())
