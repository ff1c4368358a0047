"""DetectStream backpressure against a client that stops reading its answers (real gateway,
real grpc.aio test worker, real client over a socket).

``limits.max_stream_in_flight`` bounds what one stream holds in the gateway: frames at a
worker plus answers not yet written back. A client that sends and never reads used to get
its answers queued without limit (the gateway's memory grew for as long as it sent); now the
gateway stops reading the stream, and gRPC flow control stops the client's writes.
"""

from __future__ import annotations

import logging
import time

import grpc

from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.test_gateway import run, started
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import async_wait_until

LIMIT = 4
# the client's receive window stays at HTTP/2's 64 KiB (no BDP growth): the gateway's writes
# stall after about a thousand small answers rather than tens of thousands
CLIENT_OPTIONS = [("grpc.http2.bdp_probe", 0)]


def test_a_client_that_stops_reading_holds_at_most_the_limit_and_is_stopped(caplog):
    async def main():
        w = TestWorker("a", 0.001, concurrency=8)
        gw = await started([(w, 1)], **{"limits.max_stream_in_flight": LIMIT})
        sent = 0
        highest = 0.0

        def pending() -> float:
            nonlocal highest
            v = gw.metrics.registry.get_sample_value("edgewise_gateway_stream_pending") or 0.0
            highest = max(highest, v)
            return v

        async def reqs():
            nonlocal sent
            for i in range(100_000):
                yield request(seq=i)
                sent += 1

        async def held_still(seconds: float = 1.0) -> None:
            """Until neither the frames the client sent nor the worker's calls move for ``seconds``."""
            last, since = None, time.monotonic()

            def still() -> bool:
                nonlocal last, since
                now = (sent, w.calls, pending())
                if now != last:
                    last, since = now, time.monotonic()
                return time.monotonic() - since >= seconds
            await async_wait_until(still, 30, "the stream to stall with the client not reading")

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=CLIENT_OPTIONS) as ch:
                call = service_pb2_grpc.EscalationStub(ch).DetectStream(reqs(), timeout=60)
                await held_still()
                assert pending() == LIMIT and highest <= LIMIT
                assert w.in_flight == 0  # the held frames are answered, waiting to be written
                stalled_at = w.calls
                # reading again lets the stream move on, still within the limit
                got = [await call.read() for _ in range(2000)]
                assert len({r.frame_seq for r in got}) == 2000 and all(r.worker_id == "a" for r in got)
                await async_wait_until(lambda: w.calls > stalled_at, 10, "the stream to move on")
                await held_still()  # not reading again: stalled again, the gateway's write waiting
                assert pending() == LIMIT and highest <= LIMIT
                call.cancel()  # the client leaves while the gateway waits to write to it
            await async_wait_until(lambda: pending() == 0 and gw.pool.balancer.total_in_flight() == 0, 10,
                                   "the cancelled stream to hold nothing")
            assert highest <= LIMIT
        finally:
            await gw.stop(0)
            await w.stop()
    with caplog.at_level("DEBUG"):
        run(main())
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_every_frame_of_a_stream_is_answered_and_released():
    async def main():
        w = TestWorker("a", 0.002, concurrency=4)
        gw = await started([(w, 1)], **{"limits.max_stream_in_flight": 2})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def reqs():
                    for i in range(50):
                        yield request(seq=i, data=b"bad" if i % 10 == 3 else None)
                got = [r.frame_seq async for r in stub.DetectStream(reqs(), timeout=30)]
            assert sorted(got) == list(range(50))
            assert w.max_seen_in_flight <= 2
            await async_wait_until(
                lambda: gw.metrics.registry.get_sample_value("edgewise_gateway_stream_pending") == 0, 5,
                "the finished stream to hold nothing")
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())
