"""What gRPC clients can hold open in the gateway is bounded (real gateway on port 0, real grpc.aio
test worker, real clients over sockets): ``limits.max_concurrent_rpcs`` calls in all,
``limits.max_streams_per_connection`` per connection, ``limits.max_streams_per_device``
DetectStreams per device, and a DetectStream idle for ``limits.stream_idle_timeout_s`` is ended.

Before these limits a client could open calls without end (110k idle DetectStreams took the
gateway's memory past the chart's 1 GiB limit)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud.gateway.server import CONCURRENT_RPC_LIMIT_MESSAGE, SERVICE_NAME
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.cloud.gateway.test_gateway import http_get, run, started
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import async_wait_until

#: a channel whose connection is its own (channels with the same target and options share one)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


async def _frames(stop: asyncio.Event, first: detect_pb2.DetectRequest | None = None
                  ) -> AsyncIterator[detect_pb2.DetectRequest]:
    """A stream's requests: ``first`` (if any), then nothing until ``stop``."""
    if first is not None:
        yield first
    await stop.wait()


async def _code(coro) -> str:
    try:
        await asyncio.wait_for(coro, 5)
        return "OK"
    except grpc.aio.AioRpcError as exc:
        return exc.code().name


def test_calls_beyond_max_concurrent_rpcs_are_refused():
    """With 3 calls open, a 4th gets RESOURCE_EXHAUSTED from gRPC at once; once one ends, calls
    are served again."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.max_concurrent_rpcs": 3})
        stop = asyncio.Event()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                calls = [stub.DetectStream(_frames(stop, request(seq=i))) for i in range(3)]
                for c in calls:  # each answered once: all three are open in the gateway
                    assert (await asyncio.wait_for(c.read(), 5)).frame_seq >= 0
                try:
                    await stub.Detect(request(seq=9), timeout=5)
                    raise AssertionError("a 4th call was served")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert CONCURRENT_RPC_LIMIT_MESSAGE in (exc.details() or "")
                # the gRPC health check shares the limit (it is one more call), the side port's
                # /healthz does not: why the chart's liveness probe asks the latter
                health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert await _code(health) == "RESOURCE_EXHAUSTED"
                assert await http_get(f"http://127.0.0.1:{gw.metrics_port}/healthz") == b"ok\n"
                calls[0].cancel()

                async def served() -> bool:  # gRPC frees the slot once the cancel reached the gateway:
                    return await _code(stub.Detect(request(seq=10), timeout=5)) == "OK"  # not a fixed 0.3 s
                await async_wait_until(served, 10, "a call served once one ended")
                stop.set()
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_calls_beyond_max_streams_per_connection_wait_on_the_client():
    """Two streams open on one connection with a limit of 2: a third call on that connection
    waits on the client (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS) until one ends; a call on another
    connection is served meanwhile."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.max_streams_per_connection": 2})
        stop = asyncio.Event()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=OWN_CONNECTION) as other:
                stub = service_pb2_grpc.EscalationStub(ch)
                calls = [stub.DetectStream(_frames(stop, request(seq=i))) for i in range(2)]
                for c in calls:
                    await asyncio.wait_for(c.read(), 5)
                third = asyncio.ensure_future(_code(stub.Detect(request(seq=9), timeout=30)))
                await asyncio.sleep(1.0)
                assert not third.done() and w.calls == 2  # waits on the client's side
                assert await _code(service_pb2_grpc.EscalationStub(other).Detect(request(seq=8), timeout=5)) == "OK"
                stop.set()  # the two streams end (their status read): the waiting call goes out
                for c in calls:
                    assert await asyncio.wait_for(c.code(), 5) == grpc.StatusCode.OK
                assert await asyncio.wait_for(third, 5) == "OK"
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_an_idle_stream_is_ended_with_unavailable():
    """A stream that sends no frame for ``stream_idle_timeout_s`` is ended with UNAVAILABLE
    (the edge's retryable status), not counted as a rejection; one that keeps sending is not ended."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.stream_idle_timeout_s": 0.5})
        stop = asyncio.Event()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def busy() -> AsyncIterator[detect_pb2.DetectRequest]:
                    for i in range(8):  # 1.6 s of frames, 0.2 s apart: never idle for 0.5 s
                        yield request(seq=i)
                        await asyncio.sleep(0.2)

                answers = [r async for r in stub.DetectStream(busy(), timeout=10)]
                assert len(answers) == 8

                idle = stub.DetectStream(_frames(stop, request(seq=0)), timeout=10)
                assert (await asyncio.wait_for(idle.read(), 5)).frame_seq == 0
                t0 = time.monotonic()
                try:
                    await asyncio.wait_for(idle.read(), 5)
                    raise AssertionError("the idle stream was not ended")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    assert "limits.stream_idle_timeout_s" in (exc.details() or "")
                assert time.monotonic() - t0 < 3
                # housekeeping, not a refusal: it does not feed the rejection-ratio alert
                assert gw.metrics.registry.get_sample_value("edgewise_gateway_rejected_total",
                                                            {"reason": "stream_idle"}) is None
                stop.set()
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_streams_per_device_are_capped():
    """A device with ``max_streams_per_device`` streams open gets RESOURCE_EXHAUSTED for one
    more; another device does not; once one closes, the device may open one again."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.max_streams_per_device": 2})
        stop = asyncio.Event()
        cam1 = (("x-edgewise-device", "cam-1"),)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                open_ = [stub.DetectStream(_frames(stop, request(seq=i)), metadata=cam1) for i in range(2)]
                for c in open_:
                    await asyncio.wait_for(c.read(), 5)
                third = stub.DetectStream(_frames(stop, request(seq=5)), metadata=cam1)
                try:
                    await asyncio.wait_for(third.read(), 5)
                    raise AssertionError("a third stream of cam-1 was served")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert "limits.max_streams_per_device" in (exc.details() or "")
                other = stub.DetectStream(_frames(stop, request(device="cam-2", seq=6)),
                                          metadata=(("x-edgewise-device", "cam-2"),))
                assert (await asyncio.wait_for(other.read(), 5)).frame_seq == 6
                open_[0].cancel()
                # the cancel reached the gateway and its stream ended there (a fixed 0.3 s: not on a
                # loaded machine, and the next one was refused, counted a second time)
                await async_wait_until(lambda: gw.streams_of.get("cam-1", 0) < 2, 10, "the cancelled stream closed")
                again = stub.DetectStream(_frames(stop, request(seq=7)), metadata=cam1)
                assert (await asyncio.wait_for(again.read(), 5)).frame_seq == 7
                assert gw.metrics.registry.get_sample_value("edgewise_gateway_rejected_total",
                                                            {"reason": "too_many_streams"}) == 1
                stop.set()
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


async def _no_request(never: asyncio.Event) -> AsyncIterator[bytes]:
    """A call's requests that never come: its headers go out, no message until ``never`` is set."""
    await never.wait()
    yield b""


def test_calls_without_a_known_token_are_refused_before_their_request_and_free_their_slot():
    """A client that opens Detect calls and never sends their request held one of
    ``limits.max_concurrent_rpcs`` each, for ever: four of them froze a gateway allowing four
    (every edge then got RESOURCE_EXHAUSTED). Without a token, or with one no device has, such
    a call is now refused UNAUTHENTICATED from its headers alone (``TokenAuth.screen``), counted
    like any refusal, and the slot is free at once; a device's call is served."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.max_concurrent_rpcs": 4,
                                        "auth.tokens": [{"device": "cam-1", "token": "s3cret"}]})
        never = asyncio.Event()

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as attacker, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=OWN_CONNECTION) as edge:
                detect = attacker.stream_unary(f"/{SERVICE_NAME}/Detect")
                held = [detect(_no_request(never), metadata=md) for md in
                        [()] * 2 + [(("authorization", "Bearer guessed"),), (("authorization", "Basic s3cret"),)]]
                assert [await _code(c) for c in held] == ["UNAUTHENTICATED"] * 4
                # the health service shares the bound: Watch streams (held open for ever) and a
                # Check without a token are refused too; with a device's token a Check is answered
                health = health_pb2_grpc.HealthStub(attacker)
                watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(4)]
                assert [await _code(w.read()) for w in watches] == ["UNAUTHENTICATED"] * 4
                assert await _code(health.Check(health_pb2.HealthCheckRequest(), timeout=5)) == "UNAUTHENTICATED"
                checked = await health_pb2_grpc.HealthStub(edge).Check(
                    health_pb2.HealthCheckRequest(), timeout=5, metadata=(("authorization", "Bearer s3cret"),))
                assert checked.status == health_pb2.HealthCheckResponse.SERVING
                req = request(seq=1, device="cam-1")
                answer = await service_pb2_grpc.EscalationStub(edge).Detect(
                    req, timeout=5, metadata=(("authorization", "Bearer s3cret"),))
                assert answer.status == detect_pb2.OK
            count = gw.metrics.registry.get_sample_value
            assert count("edgewise_gateway_rejected_total", {"reason": "unauthenticated"}) == 4 + 5
            # health calls are not requests: only the 4 Detect calls are in requests_total
            assert count("edgewise_gateway_requests_total", {"transport": "grpc", "status": "UNAUTHENTICATED"}) == 4
            assert w.calls == 1
        finally:
            never.set()
            await gw.stop(0)
            await w.stop()
    run(main())


def test_one_device_cannot_hold_every_call_slot():
    """A device with a valid token that opened Detect calls and never sent their requests held
    every one of ``limits.max_concurrent_rpcs`` (200 of 200 in a probe), and every other device
    was refused RESOURCE_EXHAUSTED. Its calls now hold at most ``limits.max_calls_per_device``:
    one more (a Detect, a health Watch) is refused, counted and logged, while another device's
    calls of every kind are served; a slot comes back when a call ends however it ends, and no
    count is left behind."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.max_concurrent_rpcs": 8, "limits.max_calls_per_device": 3,
                                        "auth.tokens": [{"device": "cam-1", "token": "tok1"},
                                                        {"device": "cam-2", "token": "tok2"}]})
        never, stop = asyncio.Event(), asyncio.Event()
        cam1, cam2 = (("authorization", "Bearer tok1"),), (("authorization", "Bearer tok2"),)

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as attacker, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=OWN_CONNECTION) as edge:
                held = [attacker.stream_unary(f"/{SERVICE_NAME}/Detect")(_no_request(never), metadata=cam1)
                        for _ in range(3)]
                await async_wait_until(lambda: gw.interceptor.slots.open.get("cam-1") == 3, 10, "the calls counted")
                stub = service_pb2_grpc.EscalationStub(attacker)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Detect(request(seq=1, device="cam-1"), timeout=5, metadata=cam1)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "device 'cam-1' already holds 3 gRPC calls" in (refused.value.details() or "")
                assert "limits.max_calls_per_device" in (refused.value.details() or "")
                watch = health_pb2_grpc.HealthStub(attacker).Watch(health_pb2.HealthCheckRequest(), metadata=cam1)
                assert await _code(watch.read()) == "RESOURCE_EXHAUSTED"
                # another device: Detect, a health Check and Watch, a DetectStream, all through its slots
                other = service_pb2_grpc.EscalationStub(edge)
                answer = await other.Detect(request(seq=2, device="cam-2"), timeout=5, metadata=cam2)
                assert answer.status == detect_pb2.OK and answer.frame_seq == 2
                health = health_pb2_grpc.HealthStub(edge)
                checked = await health.Check(health_pb2.HealthCheckRequest(), timeout=5, metadata=cam2)
                assert checked.status == health_pb2.HealthCheckResponse.SERVING
                watching = health.Watch(health_pb2.HealthCheckRequest(), metadata=cam2)
                assert (await asyncio.wait_for(watching.read(), 5)).status == health_pb2.HealthCheckResponse.SERVING
                stream = other.DetectStream(_frames(stop, request(seq=3, device="cam-2")),
                                            metadata=cam2 + (("x-edgewise-device", "cam-2"),))
                assert (await asyncio.wait_for(stream.read(), 5)).frame_seq == 3
                assert gw.interceptor.slots.open == {"cam-1": 3, "cam-2": 2}
                held[0].cancel()  # a call ended before its request came: its slot comes back
                await async_wait_until(lambda: gw.interceptor.slots.open.get("cam-1") == 2, 10, "the calls counted")
                answer = await stub.Detect(request(seq=4, device="cam-1"), timeout=5, metadata=cam1)
                assert answer.status == detect_pb2.OK and answer.frame_seq == 4
                watching.cancel()
                stop.set()
                assert await asyncio.wait_for(stream.code(), 5) == grpc.StatusCode.OK
                for c in held[1:]:
                    c.cancel()
                await async_wait_until(lambda: gw.interceptor.slots.open == {}, 10, "the calls counted")
            count = gw.metrics.registry.get_sample_value
            assert count("edgewise_gateway_rejected_total", {"reason": "too_many_calls"}) == 2
            # the refused Detect is an answered request; the refused Watch is not a request
            assert count("edgewise_gateway_requests_total",
                         {"transport": "grpc", "status": "RESOURCE_EXHAUSTED"}) == 1
            assert w.calls == 3
        finally:
            never.set()
            await gw.stop(0)
            await w.stop()
    run(main())


#: what an HTTP/2 client sends first (RFC 9113 section 3.4): the preface and an empty SETTINGS frame
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (what it sent first, its SETTINGS, read and dropped)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_connections_beyond_max_connections_are_closed_and_the_open_ones_served():
    """Anyone who reaches the gRPC port could hold connections that never call (no token is
    needed to connect): 2,000 idle TLS connections took 85 MB of a gateway (43 KB each), so
    about 24,000 of them, from one address, filled the chart's 1 GiB pod and every edge's
    call died with it. ``limits.max_connections`` bounds them: one more is closed as it
    arrives, and an edge already connected keeps being answered."""
    async def main():
        w = TestWorker("a", 0.001)
        gw = await started([(w, 1)], **{"limits.max_connections": 3})
        idle: list[socket.socket] = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=OWN_CONNECTION) as edge:
                stub = service_pb2_grpc.EscalationStub(edge)
                assert (await stub.Detect(request(seq=1), timeout=5)).status == detect_pb2.OK
                for _ in range(5):  # the edge holds 1 of the 3: 2 of these are taken, 3 closed
                    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
                    sock.sendall(HTTP2_PREFACE)
                    sock.setblocking(False)
                    idle.append(sock)
                await async_wait_until(lambda: sum(_closed_by_peer(s) for s in idle) >= 3, 10,
                                       "the connections over the bound closed")
                assert (await stub.Detect(request(seq=2), timeout=5)).status == detect_pb2.OK
            for sock in idle:
                sock.close()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}", options=OWN_CONNECTION) as later:
                async def served() -> bool:
                    return await _code(service_pb2_grpc.EscalationStub(later).Detect(request(seq=3), timeout=5)) == "OK"

                # once the idle connections are gone, new ones are taken again
                await async_wait_until(served, 10, "a new connection served")
        finally:
            for sock in idle:
                sock.close()
            await gw.stop(0)
            await w.stop()
    run(main())


def test_the_open_file_limit_is_raised_to_what_max_connections_needs_or_said(caplog):
    """systemd's, containerd's (2.0) and podman's default soft open-file limit is 1024: at about
    1,000 edges the gateway's accept failed with EMFILE, far below limits.max_connections
    (4096), and /healthz, /metrics and worker and broker reconnects with it (found by a probe).
    The gateway raises its soft limit to what it needs where the hard limit allows, and says
    when that is not enough."""
    import logging
    import resource

    from cloud.gateway.server import FD_RESERVE

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096 + FD_RESERVE + 1:
        pytest.skip(f"the hard open-file limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        async def main(over: dict) -> None:
            w = TestWorker("a", 0.001)
            gw = await started([(w, 1)], **over)
            await gw.stop()
            await w.stop()

        caplog.set_level(logging.WARNING, "edgewise.gateway")
        run(main({}))  # limits.max_connections 4096 by default
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 4096 + FD_RESERVE
        assert not [r for r in caplog.records if "open-file limit" in r.getMessage()]
        if hard != resource.RLIM_INFINITY:  # more than the hard limit allows: raised to it, and said
            run(main({"limits.max_connections": hard}))
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
            said = [r.getMessage() for r in caplog.records if "open-file limit" in r.getMessage()]
            assert len(said) == 1 and f"limits.max_connections {hard} needs" in said[0], said
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
