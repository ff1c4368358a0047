"""The gRPC transport's fail-over between the gateways of ``cloud.endpoints``, against real gRPC
servers on real ports: the escalations in flight when the first gateway goes away (a rolling
restart's SIGTERM, a kill), and the way back to it once it is up again."""

from __future__ import annotations

import asyncio
from typing import List

import grpc
import pytest

from edge.transports import TransportError
from edge.transports.grpc import FAILBACK_S, UNANSWERED_FAILOVER, GrpcTransport
from edgewise.v1 import detect_pb2
from tests.waiting import async_wait_until

SERVICE = "edgewise.v1.Escalation"


def request(seq: int) -> detect_pb2.DetectRequest:
    return detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=seq)


class Gateway:
    """A real gRPC server of the Escalation service that answers OK, or, ``refusing``, answers
    UNAVAILABLE after ``frame_seq * delay_s`` (a gateway going away while calls reach it)."""

    def __init__(self, refusing: bool = False, delay_s: float = 0.0, hung: bool = False,
                 late: bool = False) -> None:
        self.refusing = refusing
        self.late = late  # answers DEADLINE_EXCEEDED at once, as the gateway a request too late for it
        self.hung = hung  # takes every call and never answers (its process stuck, its connection up)
        self.delay_s = delay_s
        self.answered: List[int] = []
        self.calls = 0  # tries that reached it, refused ones included
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def detect(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        req = detect_pb2.DetectRequest.FromString(body)
        self.calls += 1
        if self.hung:
            await asyncio.Event().wait()
        if self.late:  # cloud.gateway.server's answer to a request whose deadline had passed
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                "the request's deadline had already passed at the gateway: ...")
        if self.refusing:
            await asyncio.sleep(req.frame_seq * self.delay_s)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gateway is shutting down")
        self.answered.append(req.frame_seq)
        return detect_pb2.DetectResponse(status=detect_pb2.OK, device_id=req.device_id,
                                         frame_seq=req.frame_seq).SerializeToString()

    async def start(self, port: int = 0) -> str:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, {"Detect": grpc.unary_unary_rpc_method_handler(self.detect)}),))
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)


def test_escalations_in_flight_when_the_first_gateway_fails_all_fail_over_to_the_second():
    """Each try of a call read the preferred endpoint again: once one call had failed over and
    made the second gateway preferred, the calls still on the first one went, for their next
    try, to (preferred + 1) % 2, the first gateway again, and failed without trying the second.
    Measured with two real gateway processes and 100 escalations a second: 15 of 200 failed
    UNAVAILABLE naming the first gateway when it got SIGTERM, 14 when it was killed. Now every
    call goes through the endpoints in order from the one preferred when it began."""
    async def run():
        first, second = Gateway(refusing=True, delay_s=0.1), Gateway()
        endpoints = [await first.start(), await second.start()]
        t = GrpcTransport(endpoints)
        await t.start()
        try:
            calls = []
            for seq in range(6):  # each still on the first gateway when an earlier one has failed over
                calls.append(asyncio.ensure_future(t.detect(request(seq), 10.0)))
                await asyncio.sleep(0.01)
            results = await asyncio.gather(*calls, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed, failed
            assert sorted(second.answered) == list(range(6))
        finally:
            await t.close()
            await first.stop()
            await second.stop()
    asyncio.run(run())


def test_the_edge_goes_back_to_the_first_gateway_once_it_is_up_again():
    """``cloud.endpoints`` are tried in order, but after one fail-over the transport stayed on the
    second gateway for good, until that one failed too: a primary gateway restarted (or a cell
    back from an outage) got no escalation again from the devices that had failed over, measured
    with two real gateway processes (the first killed and started again on its port: 0 of 107
    escalations over the next 12 s). Now an earlier endpoint whose connection is up again is used
    again, looked at once ``FAILBACK_S`` has passed since the fail-over."""
    now = [0.0]

    async def run():
        first, second = Gateway(), Gateway()
        endpoints = [await first.start(), await second.start()]
        t = GrpcTransport(endpoints, clock=lambda: now[0])
        await t.start()
        try:
            await t.detect(request(0), 5.0)
            assert first.answered == [0]
            await first.stop()
            await t.detect(request(1), 5.0)  # fails over
            assert second.answered == [1]
            back = Gateway()
            await back.start(first.port)  # the first gateway, restarted on its port
            for seq in range(2, 6):  # within FAILBACK_S of the fail-over: the second stays preferred
                await t.detect(request(seq), 5.0)
            assert back.answered == []
            now[0] += FAILBACK_S

            async def on_first() -> bool:
                await t.detect(request(100), 5.0)
                return bool(back.answered)
            await async_wait_until(on_first, 15.0, "an escalation on the first gateway again", interval=0.1)
            await back.stop()
            # gone again: failed over again at once, nothing lost
            resp = await t.detect(request(200), 5.0)
            assert resp.frame_seq == 200 and second.answered[-1] == 200
        finally:
            await t.close()
            await second.stop()
    asyncio.run(run())


def test_a_first_gateway_that_is_connected_but_refuses_costs_one_fail_over_per_interval():
    """The way back is tried on a connection that is up, but a gateway may be up and refuse every
    call (UNAVAILABLE: none of its workers up): that costs one call's fail-over each FAILBACK_S,
    not every call's."""
    now = [0.0]

    async def run():
        first, second = Gateway(refusing=True), Gateway()
        endpoints = [await first.start(), await second.start()]
        t = GrpcTransport(endpoints, clock=lambda: now[0])
        try:
            await t.detect(request(0), 5.0)  # refused by the first, answered by the second
            tried = first.calls
            assert tried >= 1 and second.answered == [0]

            async def tries_first(seq: int) -> bool:
                before = first.calls
                await t.detect(request(seq), 5.0)  # answered by the second either way
                return first.calls > before
            now[0] += FAILBACK_S  # its connection is up (it answered): tried again, once
            await async_wait_until(lambda: tries_first(1), 10.0, "the first gateway tried again", interval=0.1)
            tried = first.calls
            for seq in range(2, 8):
                await t.detect(request(seq), 5.0)
            assert first.calls == tried  # not each call
            now[0] += FAILBACK_S
            assert await tries_first(9)
        finally:
            await t.close()
            await first.stop()
            await second.stop()
    asyncio.run(run())


def test_a_hung_first_gateway_is_failed_over_from_after_a_few_unanswered_calls():
    """A gateway whose process hangs (SIGSTOP; a frozen node, a stuck event loop) keeps its
    connection up, so its calls are never UNAVAILABLE: they run out their deadline. Measured with
    two real gateway processes, the first stopped: 39 of 39 escalations over 42 s failed
    DEADLINE_EXCEEDED on it, and the second got none. Now UNANSWERED_FAILOVER calls in a row
    without an answer move the calls to the next endpoint."""
    now = [0.0]

    async def run():
        first, second = Gateway(hung=True), Gateway()
        endpoints = [await first.start(), await second.start()]
        t = GrpcTransport(endpoints, clock=lambda: now[0])
        try:
            for seq in range(UNANSWERED_FAILOVER):
                with pytest.raises(TransportError) as ei:
                    await t.detect(request(seq), 0.3)
                assert ei.value.status == detect_pb2.DEADLINE_EXCEEDED and endpoints[0] in ei.value.message
            for seq in range(10, 15):
                assert (await t.detect(request(seq), 0.3)).frame_seq == seq
            assert second.answered == list(range(10, 15))
            tried = first.calls
            now[0] += FAILBACK_S  # its connection is still up: tried once, then left again
            with pytest.raises(TransportError):
                await t.detect(request(20), 0.3)
            assert first.calls == tried + 1
            for seq in range(21, 25):
                assert (await t.detect(request(seq), 0.3)).frame_seq == seq
            assert first.calls == tried + 1
        finally:
            await t.close()
            await first.stop()
            await second.stop()
    asyncio.run(run())


def test_a_call_still_raises_the_last_endpoints_error_when_every_gateway_refuses():
    async def run():
        a, b = Gateway(refusing=True), Gateway(refusing=True)
        endpoints = [await a.start(), await b.start()]
        t = GrpcTransport(endpoints)
        try:
            with pytest.raises(TransportError) as ei:
                await t.detect(request(0), 5.0)
            assert ei.value.status == detect_pb2.UNAVAILABLE and endpoints[1] in ei.value.message
        finally:
            await t.close()
            await a.stop()
            await b.stop()
    asyncio.run(run())


def test_a_gateway_that_answers_deadline_exceeded_is_not_failed_over_from():
    """A gateway ends a call it cannot answer in time with DEADLINE_EXCEEDED and its own message
    (``cloud.gateway.server``: a request whose deadline had passed on arrival, an edge clock
    behind the gateway's; a hop that expired on a busy worker). Counted as silence, those answers
    moved the calls to the next gateway every UNANSWERED_FAILOVER calls, with a warning that the
    first answered none of them; only calls that run out their deadline without an answer count."""
    async def run():
        first, second = Gateway(late=True), Gateway()
        endpoints = [await first.start(), await second.start()]
        t = GrpcTransport(endpoints)
        try:
            for seq in range(3 * UNANSWERED_FAILOVER):
                with pytest.raises(TransportError) as ei:
                    await t.detect(request(seq), 2.0)
                assert ei.value.status == detect_pb2.DEADLINE_EXCEEDED and "already passed" in ei.value.message
            assert t.preferred == 0 and first.calls == 3 * UNANSWERED_FAILOVER and second.calls == 0
        finally:
            await t.close()
            await first.stop()
            await second.stop()
    asyncio.run(run())


def test_the_way_back_to_a_hung_gateway_is_tried_by_one_call_not_by_every_call_in_flight():
    """``FAILBACK_S`` after a fail-over, every call that began before the first of them had its
    answer went back to the earlier endpoint: with that gateway still hung, all of them ran out
    their deadline there (an edge escalating 100 a second with a 1 s deadline lost about 100
    each interval, not the one call the docs say). One call tries the way back; the others stay
    where the calls go until it answers."""
    now = [0.0]

    async def run():
        first, second = Gateway(hung=True), Gateway()
        endpoints = [await first.start(), await second.start()]
        t = GrpcTransport(endpoints, clock=lambda: now[0])
        try:
            for seq in range(UNANSWERED_FAILOVER):
                with pytest.raises(TransportError):
                    await t.detect(request(seq), 0.3)
            assert t.preferred == 1
            tried = first.calls
            now[0] += FAILBACK_S
            results = await asyncio.gather(*(t.detect(request(seq), 0.3) for seq in range(10, 20)),
                                           return_exceptions=True)
            assert first.calls == tried + 1
            assert sum(isinstance(r, TransportError) for r in results) == 1
        finally:
            await t.close()
            await first.stop()
            await second.stop()
    asyncio.run(run())
