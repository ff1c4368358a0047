"""Gateway against real grpc.aio Worker servers (test workers with set latency/capacity/failures).

Everything runs over real sockets: a real gateway (``Gateway``), real worker
servers on port 0, real gRPC clients; only inference is replaced by a sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc
import pytest

from cloud.gateway.envelope import read_request
from cloud.gateway.server import Gateway, passed_deadline
from cloud.gateway.settings import load_settings
from edgewise.errors import ConfigError
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.cloud.gateway.pki import Pki
from tests.cloud.gateway.workers import TestWorker, request, serving
from tests.processes import DEFAULT_HUP
from tests.waiting import async_wait_until


def settings_for(workers, **over):
    base = {"listen": "127.0.0.1:0", "metrics_host": "127.0.0.1", "metrics_port": 0,
            "load_poll_interval_s": 0.2, "balancer.slow_start_window_s": 0,
            "discovery.static": [f"{w.address}={weight}" for w, weight in workers]}
    base.update(over)
    return load_settings(None, base, env={})


async def started(workers, **over) -> Gateway:
    for w, _ in workers:
        if not w.port:
            await w.start()
    gw = Gateway(settings_for(workers, **over))
    await gw.start()
    return gw


async def http_get(url: str) -> bytes:
    """GET from a thread: the side port is served by this test's own event loop."""
    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read()
    return await asyncio.to_thread(get)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _detect(stub, req, timeout=5.0, metadata=None):
    try:
        resp = await stub.Detect(req, timeout=timeout, metadata=metadata)
        return "OK", resp
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details()


def test_weighted_least_connections_follows_capacity():
    async def main():
        ws = [(TestWorker("fast", 0.02, concurrency=4), 4), (TestWorker("mid", 0.02, concurrency=2), 2),
              (TestWorker("slow", 0.02, concurrency=1), 1)]
        gw = await started(ws)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                sem = asyncio.Semaphore(7)

                async def one(i):
                    async with sem:
                        return await _detect(stub, request(seq=i))
                results = await asyncio.gather(*(one(i) for i in range(210)))
            assert all(r[0] == "OK" for r in results)
            by = Counter(r[1].worker_id for r in results)
            assert by["fast"] > by["mid"] > by["slow"] > 0
            assert by["fast"] / by["slow"] >= 2.5, by
            # the slow worker never had more than ~its share queued
            assert ws[2][0].max_seen_in_flight <= 2
            assert all(r[1].timing.gateway_ms > 0 for r in results)
        finally:
            await gw.stop(0)
            for w, _ in ws:
                await w.stop()
    run(main())


def test_unavailable_is_retried_elsewhere_and_worker_ejected():
    async def main():
        bad = TestWorker("bad", fail=grpc.StatusCode.UNAVAILABLE)
        good = TestWorker("good", 0.002, concurrency=8)
        gw = await started([(bad, 1), (good, 1)], **{"retry.min_per_s": 100})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                results = [await _detect(stub, request(seq=i)) for i in range(40)]
            assert all(r[0] == "OK" and r[1].worker_id == "good" for r in results), results[:3]
            assert bad.calls == 5  # ejected after 5 consecutive failures, then never picked
            snap = gw.pool.snapshot()
            states = {w["name"]: w["state"] for w in snap["workers"]}
            assert states[bad.address] == "ejected"
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            assert 'edgewise_gateway_retries_total{result="sent"} 5.0' in text
            assert "edgewise_gateway_worker_ejections_total" in text
        finally:
            await gw.stop(0)
            await bad.stop()
            await good.stop()
    run(main())


def test_retry_budget_exhausted_returns_clear_unavailable():
    async def main():
        bad = TestWorker("bad", fail=grpc.StatusCode.UNAVAILABLE)
        bad2 = TestWorker("bad2", fail=grpc.StatusCode.UNAVAILABLE)
        gw = await started([(bad, 1), (bad2, 1)], **{
            "retry.min_per_s": 0.1, "retry.window_s": 10, "retry.budget_ratio": 0.0,
            "balancer.consecutive_failures": 100})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                results = [await _detect(stub, request(seq=i)) for i in range(4)]
            assert all(r[0] == "UNAVAILABLE" for r in results)
            assert "configured to fail" in results[0][1]
            assert bad.calls + bad2.calls == 4 + 1  # exactly one retry allowed by the budget
        finally:
            await gw.stop(0)
            await bad.stop()
            await bad2.stop()
    run(main())


def test_no_retry_is_counted_or_budgeted_when_no_other_worker_can_be_picked():
    """A worker answers UNAVAILABLE and the only other one reports not serving (all workers
    killed but one, a pool of one): there is nowhere to retry. Such a retry was counted as
    sent and taken from the retry budget although no second worker was ever called (after
    every worker of three was SIGKILLed: 130 retries "sent", 2 picks more than requests)."""
    async def main():
        bad = TestWorker("bad", fail=grpc.StatusCode.UNAVAILABLE)
        down = TestWorker("down", serving=False)
        gw = await started([(bad, 1), (down, 1)], **{"balancer.consecutive_failures": 100,
                                                      "retry.min_per_s": 0.5})  # 5 retries per 10 s
        try:
            b = gw.pool.balancer
            while not b.endpoints[down.address].paused:
                await asyncio.sleep(0.02)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                results = [await _detect(stub, request(seq=i)) for i in range(8)]
            assert all(r[0] == "UNAVAILABLE" and "configured to fail" in r[1] for r in results), results
            assert bad.calls == 8 and down.calls == 0
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            for result in ("sent", "denied"):  # neither (both exported at 0 from the start)
                assert f'edgewise_gateway_retries_total{{result="{result}"}} 0.0' in text, text
            assert gw.pool.budget.try_acquire()  # the budget's 5 retries are all left
        finally:
            await gw.stop(0)
            await bad.stop()
            await down.stop()
    run(main())


def test_saturated_pool_answers_resource_exhausted_at_once():
    async def main():
        w = TestWorker("w", 1.0, concurrency=2)
        gw = await started([(w, 1)], **{"balancer.max_in_flight": 2})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                slow = [asyncio.ensure_future(_detect(stub, request(seq=i))) for i in range(2)]
                await async_wait_until(lambda: gw.pool.balancer.total_in_flight() == 2, 10, "2 requests held")
                t0 = time.perf_counter()
                code, msg = await _detect(stub, request(seq=9))
                assert code == "RESOURCE_EXHAUSTED" and "saturated" in msg
                assert time.perf_counter() - t0 < 0.3
                assert [r[0] for r in await asyncio.gather(*slow)] == ["OK", "OK"]
            # the refused request was offered load too: the autoscaler's arrival rate counts it
            assert gw.pool.snapshot()["requests_total"] == 3
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_a_high_priority_request_is_admitted_past_the_lower_priority_work_a_worker_holds():
    """The request's priority reaches admission (docs/design/balancing.md#priority): behind five
    priority-0 requests at 10/s, a priority-0 request with 0.4 s to go is refused at once, a
    priority-90 one is sent (the worker serves it first)."""
    async def main():
        w = TestWorker("w", 1.0, concurrency=16, capacity=10.0)
        gw = await started([(w, 1)])
        try:
            ep = gw.pool.balancer.endpoints[w.address]
            await async_wait_until(lambda: ep.capacity == 10.0, 10, "the capacity reported")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                held = [asyncio.ensure_future(_detect(stub, request(seq=i))) for i in range(5)]
                await async_wait_until(lambda: w.calls == 5, 10, "5 requests at the worker")
                code, msg = await _detect(stub, request(seq=10), timeout=0.4)
                assert code == "RESOURCE_EXHAUSTED" and "saturated" in msg
                urgent = request(seq=11)
                urgent.priority = 90
                code, msg = await _detect(stub, urgent, timeout=0.4)
                assert w.calls == 6, (code, msg)  # sent: this test worker holds it 1 s, past its deadline
                await asyncio.gather(*held)
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_replays_of_any_priority_are_not_counted_ahead_of_a_live_request():
    """A replay from an edge's spool waits below every live request (``edgewise.wire.queue_rank``):
    behind five priority-90 replays at 10/s, a live priority-0 request with 0.4 s to go is sent,
    where behind five live priority-90 requests it is refused at once. Before, a replay kept the
    priority it was first sent with, and after an outage the replays of a fleet had every live
    escalation refused as saturated."""
    async def main():
        w = TestWorker("w", 1.0, concurrency=16, capacity=10.0)
        gw = await started([(w, 1)])
        try:
            ep = gw.pool.balancer.endpoints[w.address]
            await async_wait_until(lambda: ep.capacity == 10.0, 10, "the capacity reported")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                def ahead(seq: int, replay: bool) -> detect_pb2.DetectRequest:
                    req = request(device=f"cam-{seq}", seq=seq)
                    req.priority, req.replay = 90, replay
                    return req
                held = [asyncio.ensure_future(_detect(stub, ahead(i, replay=True))) for i in range(5)]
                await async_wait_until(lambda: w.calls == 5, 10, "5 replays at the worker")
                code, msg = await _detect(stub, request(seq=10), timeout=0.4)
                assert w.calls == 6, (code, msg)  # sent: this test worker holds it 1 s, past its deadline
                await asyncio.gather(*held)
                held = [asyncio.ensure_future(_detect(stub, ahead(i, replay=False))) for i in range(5)]
                await async_wait_until(lambda: w.calls == 11, 10, "5 live requests at the worker")
                code, msg = await _detect(stub, request(seq=11), timeout=0.4)
                assert code == "RESOURCE_EXHAUSTED" and "saturated" in msg and w.calls == 11
                await asyncio.gather(*held)
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_deadline_propagates_to_worker_and_expires():
    async def main():
        w = TestWorker("w", 0.5)
        gw = await started([(w, 1)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                t0 = time.time_ns()
                code, _ = await _detect(stub, request(), timeout=0.2)
                assert code == "DEADLINE_EXCEEDED"
                assert 0 < w.deadlines[-1] - t0 <= 0.25e9
                req = request(seq=2)
                req.deadline_unix_ns = time.time_ns() + int(0.1e9)  # request deadline tighter than call's
                t1 = time.perf_counter()
                code, _ = await _detect(stub, req, timeout=5)
                assert code == "DEADLINE_EXCEEDED" and time.perf_counter() - t1 < 0.5
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_a_client_clock_behind_the_gateways_is_named_with_how_far():
    """deadline_unix_ns is wall time read on the gateway's clock: a client 5 minutes behind (a
    device not yet synced by NTP) had every request refused with "the request's deadline had
    already passed at the gateway" and nothing more, as if the link were slow."""
    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                behind = request()
                behind.deadline_unix_ns = time.time_ns() - 300 * 10**9 + 2 * 10**9  # 2 s ahead on its clock
                code, msg = await _detect(stub, behind, timeout=5)
                assert code == "DEADLINE_EXCEEDED" and "the request's deadline had already passed at the gateway" in msg
                late = float(msg.split("deadline_unix_ns was ")[1].split(" s before")[0])
                assert 297.0 < late < 299.0, msg
                assert "client's clock" in msg and "deadline_unix_ns 0" in msg
                assert w.calls == 0
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_a_call_whose_own_deadline_passed_is_not_blamed_on_clocks():
    head = read_request(request().SerializeToString(), 100)
    msg = passed_deadline(head, 0.0, time.time_ns())
    assert "the call's own deadline had passed" in msg and "clock" not in msg
    head.deadline_unix_ns = time.time_ns() - 10**9  # both passed: the call's is the one the client set
    assert "the call's own deadline had passed" in passed_deadline(head, -0.5, time.time_ns())
    assert "1.000 s before the gateway's clock" in passed_deadline(head, None, head.deadline_unix_ns + 10**9)


def test_a_request_deadline_passed_by_a_little_is_not_blamed_on_the_clocks_alone():
    """A deadline_unix_ns passed by 50 ms when the request arrived is as likely a trip longer
    than the deadline (clocks that agree) as a client clock behind: the message said only the
    latter ("a client whose clock is behind ... sync the client's clock"), sending an operator
    whose clocks agree after NTP."""
    head = read_request(request().SerializeToString(), 100)
    head.deadline_unix_ns = time.time_ns()
    msg = passed_deadline(head, 2.0, head.deadline_unix_ns + 50 * 10**6)
    assert "0.050 s before the gateway's clock" in msg
    assert "the request took longer to arrive than its deadline allowed" in msg and "a later deadline" in msg
    assert "client's clock is behind" in msg  # the other cause, still named


def test_bad_input_gets_clear_status():
    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)], **{"limits.max_image_bytes": 100_000,
                                        "limits.max_message_bytes": 200_000})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                code, msg = await _detect(stub, request(data=b"\x00\x01garbage-not-a-jpeg"))
                assert code == "INVALID_ARGUMENT" and "JPEG" in msg
                code, msg = await _detect(stub, request(data=b"\xff\xd8\xff\xe0" + b"\x00" * 100))
                assert code == "INVALID_ARGUMENT" and "truncated" in msg
                code, msg = await _detect(stub, request(device=""))
                assert code == "INVALID_ARGUMENT" and "device_id" in msg
                code, msg = await _detect(stub, request(data=b"\xff\xd8\xff" + b"\x00" * 150_000 + b"\xff\xd9"))
                # too big for this gateway is permanent for this request: not spooled, not retried
                assert code == "INVALID_ARGUMENT" and "limit of 100000 bytes" in msg
                code, msg = await _detect(stub, request(data=b"\xff\xd8\xff" + b"\x00" * 300_000 + b"\xff\xd9"))
                assert code == "RESOURCE_EXHAUSTED" and "larger than max" in msg.lower()
                past = request()
                past.deadline_unix_ns = -5  # invalid, not "passed": DEADLINE_EXCEEDED would be spooled
                code, msg = await _detect(stub, past)
                assert code == "INVALID_ARGUMENT" and "deadline_unix_ns is -5" in msg
                raw = request(data=b"\x00" * 10, encoding=detect_pb2.Image.RAW)
                raw.image.shape[:] = [4, 4, 3]
                code, msg = await _detect(stub, raw)
                assert code == "INVALID_ARGUMENT" and "needs 48" in msg
                assert w.calls == 0
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_request_bytes_go_to_the_worker_as_sent_and_malformed_ones_go_nowhere():
    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                detect = ch.unary_unary("/edgewise.v1.Escalation/Detect")  # bytes in, bytes out
                req = request(seq=3)
                req.edge_detections.add(x1=1, y1=2, x2=3, y2=4, class_name="car", class_scores=[0.5, 0.25])
                req.hardness.score = 0.75
                req.reason = "uncertain"
                body = req.SerializeToString() + b"\xf8\x06\x01"  # and a field this build does not know
                answer = detect_pb2.DetectResponse.FromString(await detect(body, timeout=5))
                assert w.bodies == [body]  # not parsed and encoded again on the way
                assert answer.frame_seq == 3 and answer.worker_id == "w"
                # gateway_ms is appended to the worker's timing, which keeps what the worker set
                assert answer.timing.gateway_ms > 0 and answer.timing.compute_ms == pytest.approx(5.0)
                assert answer.timing.batch_size == 1
                for junk, needle in [(b"\x0a\x05ab", "runs past the end"),
                                     (b"\x0a\x02\xff\xfe", "device_id is not UTF-8"),
                                     (b"\x0b", "wire type 3"), (b"\x08\xff", "bad varint")]:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await detect(junk, timeout=5)
                    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, junk
                    assert "not a serialized DetectRequest" in err.value.details()
                    assert needle in err.value.details(), err.value.details()
            assert len(w.bodies) == 1
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            assert 'edgewise_gateway_requests_total{status="INVALID_ARGUMENT",transport="grpc"} 4.0' in text
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def _padded(req: detect_pb2.DetectRequest, size: int) -> bytes:
    """``req`` serialized with an unknown length-delimited field (number 100) of ``size`` bytes:
    a message that big whose head is valid (the gateway forwards unknown fields as they came)."""
    from google.protobuf.internal.encoder import _VarintBytes

    return req.SerializeToString() + b"\xa2\x06" + _VarintBytes(size) + b"\0" * size


def test_a_message_over_the_workers_limit_is_the_requests_fault_not_overload():
    async def main():
        w = TestWorker("w")  # a plain grpc.aio server: it receives at most 4 MiB
        gw = await started([(w, 1)])  # the gateway's default limit is 8 MiB on both hops
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                detect = ch.unary_unary("/edgewise.v1.Escalation/Detect")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await detect(_padded(request(seq=1), 5 << 20), timeout=5)
                # not RESOURCE_EXHAUSTED: the edge would spool and replay what can never pass
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "larger than" in err.value.details() and "max_message_bytes" in err.value.details()
                ep = gw.pool.balancer.endpoints[w.address]
                assert ep.in_flight == 0 and ep.overload_cap is None and not ep.ejected(gw.pool.balancer.clock())
                stub = service_pb2_grpc.EscalationStub(ch)
                assert (await _detect(stub, request(seq=2)))[0] == "OK"  # the worker is not held back
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_bearer_tokens_and_rate_limit(caplog):
    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)], **{
            "auth.tokens": [{"device": "cam-1", "token": "s3cret"}, {"device": "cam-2", "token": "t2"}],
            "limits.rate_per_device": 1, "limits.burst_per_device": 3})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                good = (("authorization", "Bearer s3cret"),)
                assert (await _detect(stub, request(), metadata=good))[0] == "OK"
                code, msg = await _detect(stub, request())
                assert code == "UNAUTHENTICATED" and "Bearer" in msg
                code, msg = await _detect(stub, request(device="cam-9"), metadata=good)
                assert code == "UNAUTHENTICATED" and msg.startswith("unknown device or bad token for device 'cam-9'")
                code, msg = await _detect(stub, request(), metadata=(("authorization", "Bearer t2"),))
                assert code == "UNAUTHENTICATED" and msg.startswith("unknown device or bad token for device 'cam-1'")
                # a 20 KB device id: the answer quotes it cut short (it overflowed the metadata before)
                code, msg = await _detect(stub, request(device="d" * 20_000), metadata=good)
                assert code == "UNAUTHENTICATED" and len(msg) < 300, (code, len(msg))
                code, msg = await _detect(stub, request(device="cam-1"),
                                          metadata=(("authorization", "Bearer t2"), ("x-edgewise-device", "cam-2")))
                assert code == "UNAUTHENTICATED" and "does not match" in msg
                codes = [(await _detect(stub, request(seq=i), metadata=good))[0] for i in range(4)]
                assert codes[:2] == ["OK", "OK"] and codes[-1] == "RESOURCE_EXHAUSTED"
        finally:
            await gw.stop(0)
            await w.stop()
    with caplog.at_level("WARNING", logger="edgewise.gateway"):
        run(main())
    # refused authentications are logged (throttled): reason, detail, peer, device; never a token
    refused = [r.getMessage() for r in caplog.records if "refused unauthenticated" in r.getMessage()]
    assert len(refused) == 5, refused  # one line for each of the 5 refusals (at most 5 per 10 s)
    assert any("for device 'cam-9'" in m and "[device not in auth.tokens" in m and "ipv4:127.0.0.1:" in m
               for m in refused), refused
    assert any("for device 'cam-1'" in m and "[token does not match]" in m for m in refused), refused
    assert any(repr("d" * 64) + "…" in m and len(m) < 600 for m in refused), refused
    assert not any("s3cret" in m or "t2" in m for m in refused), refused


def _tls(pki: Pki, **over) -> dict:
    base = {"tls.cert_file": pki.path("server.pem"), "tls.key_file": pki.path("server.key"),
            "tls.client_ca_file": pki.path("ca.pem"), "tls.require_client_cert": True}
    return {**base, **over}


async def _call_as(gw: Gateway, pki: Pki, cert: str | None, device: str, token: str | None = None):
    """One Detect over TLS to ``gw`` with client certificate ``cert`` (None: none) as ``device``."""
    key, chain = pki.read(cert) if cert else (None, None)
    creds = grpc.ssl_channel_credentials((pki.d / "ca.pem").read_bytes(), key, chain)
    md = (("authorization", f"Bearer {token}"),) if token else None
    async with grpc.aio.secure_channel(f"localhost:{gw.port}", creds) as ch:
        return await _detect(service_pb2_grpc.EscalationStub(ch), request(device=device), timeout=5, metadata=md)


def test_mtls_binds_the_certificate_to_the_device_and_token(tmp_path):
    pki = Pki(tmp_path)
    pki.server()
    pki.issue("cam1", "cam-1")
    pki.issue("old", "cam-1", start="20200101000000Z", end="20200102000000Z")
    pki.self_signed("forged", "cam-1")

    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)], **_tls(pki), **{
            "auth.tokens": [{"device": "cam-1", "token": "tok1"}, {"device": "cam-2", "token": "tok2"}]})
        try:
            assert (await _call_as(gw, pki, "cam1", "cam-1", "tok1"))[0] == "OK"
            assert (await _call_as(gw, pki, "cam1", "cam-1"))[0] == "UNAUTHENTICATED"  # a cert is not a token
            # cam-1's certificate with cam-2's (valid) token and id: refused
            code, msg = await _call_as(gw, pki, "cam1", "cam-2", "tok2")
            assert code == "UNAUTHENTICATED" and "not a name of the client certificate ('cam-1'" in msg
            # no, expired or self-signed client certificate: the handshake is refused
            for cert in (None, "old", "forged"):
                assert (await _call_as(gw, pki, cert, "cam-1", "tok1"))[0] == "UNAVAILABLE", cert
            # plaintext against a TLS port fails too
            async with grpc.aio.insecure_channel(f"localhost:{gw.port}") as ch:
                code, _ = await _detect(service_pb2_grpc.EscalationStub(ch), request(), timeout=3)
                assert code == "UNAVAILABLE"
            assert w.calls == 1
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_a_stream_counts_under_a_name_of_its_certificate(tmp_path):
    """mTLS without tokens: cam-1's certificate opened DetectStreams labelled cam-2, filled
    cam-2's limits.max_streams_per_device and kept them open with its own frames; cam-2 was
    then refused every stream (found by a probe). The label must be a name of the stream's
    certificate, and a stream without one counts under the certificate's name."""
    pki = Pki(tmp_path)
    pki.server()
    pki.issue("cam1", "cam-1")
    pki.issue("cam2", "cam-2")

    async def open_stream(gw: Gateway, cert: str, label: str | None):
        key, chain = pki.read(cert)
        ch = grpc.aio.secure_channel(f"localhost:{gw.port}", grpc.ssl_channel_credentials(
            (pki.d / "ca.pem").read_bytes(), key, chain))
        q: asyncio.Queue = asyncio.Queue()

        async def frames():
            while (m := await q.get()) is not None:
                yield m
        md = (("x-edgewise-device", label),) if label else None
        call = service_pb2_grpc.EscalationStub(ch).DetectStream(frames(), metadata=md)
        q.put_nowait(request(device=cert.replace("cam", "cam-")))
        try:
            first = await call.read()
            return ch, call, q, ("OK" if first.status == detect_pb2.OK else str(first.status))
        except grpc.aio.AioRpcError as exc:
            return ch, call, q, exc.code().name

    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)], **_tls(pki), **{"limits.max_streams_per_device": 1})
        opened = []
        try:
            ch, call, q, got = await open_stream(gw, "cam1", "cam-2")  # another device's label
            opened.append((ch, q))
            assert got == "UNAUTHENTICATED", got
            ch, call, q, got = await open_stream(gw, "cam1", None)  # no label: counted as cam-1
            opened.append((ch, q))
            assert got == "OK" and gw.streams_of == {"cam-1": 1}
            ch, call, q, got = await open_stream(gw, "cam2", "cam-2")  # cam-2's own slot is free
            opened.append((ch, q))
            assert got == "OK" and gw.streams_of == {"cam-1": 1, "cam-2": 1}
        finally:
            for ch, q in opened:
                q.put_nowait(None)
                await ch.close()
            await gw.stop(0)
            await w.stop()
    run(main())


@pytest.mark.parametrize("identity, cert_device, device, expected", [
    ("san_dns", "cam-1", "cam-1", "OK"),
    ("san_dns", "cam-1", "cam-2", "UNAUTHENTICATED"),
    ("san_uri", "cam-1", "spiffe://edgewise/device/cam-1", "OK"),
    ("san_uri", "cam-1", "cam-1", "UNAUTHENTICATED"),
    ("cn", "other", "cam-1", "UNAUTHENTICATED"),
    ("none", "cam-1", "cam-2", "OK"),  # no binding: any valid certificate, any device
])
def test_client_identity_modes(tmp_path, identity, cert_device, device, expected):
    pki = Pki(tmp_path)
    pki.server()
    pki.issue("client", "other", f"DNS:{cert_device},URI:spiffe://edgewise/device/{cert_device}")

    async def main():
        w = TestWorker("w")
        gw = await started([(w, 1)], **_tls(pki, **{"tls.client_identity": identity}))
        try:
            code, msg = await _call_as(gw, pki, "client", device)
            assert code == expected, msg
        finally:
            await gw.stop(0)
            await w.stop()
    run(main())


def test_tls_files_are_checked_at_start(tmp_path, caplog):
    pki = Pki(tmp_path)
    pki.server()
    pki.issue("other", "other")
    pki.issue("expired", "server", "DNS:localhost,IP:127.0.0.1", start="20200101000000Z", end="20200102000000Z")

    async def main():
        w = TestWorker("w")
        await w.start()
        try:
            # a key that is not the certificate's: one line naming both files, not "Failed to bind"
            gw = Gateway(settings_for([(w, 1)], **{"tls.cert_file": pki.path("server.pem"),
                                                   "tls.key_file": pki.path("other.key")}))
            with pytest.raises(ConfigError, match=r"tls.cert_file .*server.pem and tls.key_file .*other.key: "
                                                  r"the key does not belong to the certificate"):
                await gw.start()
            # a client CA without require_client_cert would be ignored by gRPC: refused at load
            with pytest.raises(ConfigError, match="tls.client_ca_file: set tls.require_client_cert: true"):
                settings_for([(w, 1)], **_tls(pki, **{"tls.require_client_cert": False}))
            with pytest.raises(ConfigError, match="'email' is not allowed; allowed: cn | san_dns | san_uri | none"):
                settings_for([(w, 1)], **_tls(pki, **{"tls.client_identity": "email"}))
            # an expired server certificate: a warning, and the gateway still serves
            gw = await started([(w, 1)], **{"tls.cert_file": pki.path("expired.pem"),
                                            "tls.key_file": pki.path("expired.key")})
            await gw.stop(0)
        finally:
            await w.stop()
    with caplog.at_level("WARNING", logger="edgewise.gateway"):
        run(main())
    assert any("expired.pem expired on 2020-01-02 00:00:00 UTC" in r.getMessage() for r in caplog.records)


def test_stream_answers_every_frame_and_reports_bad_ones():
    async def main():
        ws = [(TestWorker("a", 0.01, concurrency=4), 1), (TestWorker("b", 0.01, concurrency=4), 1)]
        gw = await started(ws)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def reqs():
                    for i in range(30):
                        yield request(seq=i, data=b"bad" if i == 7 else None)
                got = {}
                async for resp in stub.DetectStream(reqs(), timeout=20):
                    got[resp.frame_seq] = resp
            assert sorted(got) == list(range(30))
            assert got[7].status == detect_pb2.INVALID_ARGUMENT and "JPEG" in got[7].error
            assert all(got[i].status == detect_pb2.OK for i in got if i != 7)
            assert {got[i].worker_id for i in got if i != 7} == {"a", "b"}
        finally:
            await gw.stop(0)
            for w, _ in ws:
                await w.stop()
    run(main())


def test_pool_document_and_reported_capacity():
    async def main():
        ws = [(TestWorker("a", capacity=30.0, max_queue=5), 1), (TestWorker("b", capacity=10.0), 1)]
        gw = await started(ws)
        try:
            await async_wait_until(lambda: gw.pool.snapshot()["capacity"] == pytest.approx(40.0), 10,
                                   "the Load polls to report both capacities")
            doc = json.loads(await http_get(f"http://127.0.0.1:{gw.metrics_port}/pool"))
            assert set(doc) == {"workers", "in_flight", "capacity", "queue_wait_ms_p90", "requests_total",
                                "instance"}
            assert doc["capacity"] == pytest.approx(40.0) and doc["requests_total"] == 0
            assert doc["instance"] == gw.pool.snapshot()["instance"] != ""  # this process, the same every poll
            by = {w["address"]: w for w in doc["workers"]}
            a = by[ws[0][0].address]
            assert set(a) == {"name", "address", "state", "in_flight", "queue_depth", "capacity", "peak_capacity",
                              "pixel_rate", "work", "weight", "ejected"}
            assert a["pixel_rate"] == 0.0 and a["work"] == 0.0  # a letterboxing worker, nothing in flight
            # the measured images/s replace the configured weights (1 and 1)
            assert a["state"] == "ready" and a["weight"] == pytest.approx(30.0)
            assert by[ws[1][0].address]["weight"] == pytest.approx(10.0)
            assert gw.pool.balancer.endpoints[ws[0][0].address].limit == 6
            health = await http_get(f"http://127.0.0.1:{gw.metrics_port}/healthz")
            assert health == b"ok\n"
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                hs = health_pb2_grpc.HealthStub(ch)
                for svc in ("", "edgewise.v1.Escalation"):
                    r = await hs.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5)
                    assert r.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await gw.stop(0)
            for w, _ in ws:
                await w.stop()
    run(main())


@pytest.mark.parametrize("cost", ["auto", "requests"])
def test_a_whole_frame_weighs_its_pixels_on_native_workers(cost):
    """docs/design/balancing.md#work-not-requests through the real gateway: the pixels come
    from the JPEG header the gateway reads, the workers say their time grows with them."""
    from tests.cloud.gateway.workers import jpeg_bytes

    async def main():
        ws = [(TestWorker(n, 0.4, concurrency=16, capacity=10.0, pixel_rate=1e5), 1) for n in ("a", "b")]
        gw = await started(ws, **{"balancer.cost": cost})
        try:
            await async_wait_until(lambda: all(ep.pixel_rate and ep.capacity for ep in
                                               gw.pool.balancer.endpoints.values()), 10, "the Load polls")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                small = jpeg_bytes(64, 48)
                assert all(r[0] == "OK" for r in await asyncio.gather(
                    *(_detect(stub, request(seq=i, data=small)) for i in range(4))))
                assert gw.pool.balancer._mean_pixels == pytest.approx(64 * 48)
                frame = asyncio.ensure_future(_detect(stub, request(seq=10, data=jpeg_bytes(640, 480))))
                await async_wait_until(lambda: gw.pool.balancer.total_in_flight() == 1, 5, "the frame in flight")
                smalls = await asyncio.gather(*(_detect(stub, request(seq=20 + i, data=small)) for i in range(6)))
                code, big = await frame
            assert code == "OK" and all(r[0] == "OK" for r in smalls)
            beside = Counter(r[1].worker_id for r in smalls)[big.worker_id]
            # by work the frame (100 small images' pixels, counted as 16) outweighs all six;
            # by requests the seven share the pool (3-4 each)
            assert (beside == 0) if cost == "auto" else (beside >= 2), beside
        finally:
            await gw.stop(0)
            for w, _ in ws:
                await w.stop()
    run(main())


def test_not_serving_worker_gets_no_traffic():
    async def main():
        a, b = TestWorker("a", serving=False), TestWorker("b")
        gw = await started([(a, 1), (b, 1)])
        try:
            await async_wait_until(lambda: any(w["address"] == a.address and w["state"] == "not_serving"
                                               for w in gw.pool.snapshot()["workers"]),
                                   10, "the Load poll to find worker a not serving")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                res = [await _detect(stub, request(seq=i)) for i in range(10)]
            assert {r[1].worker_id for r in res} == {"b"}
        finally:
            await gw.stop(0)
            await a.stop()
            await b.stop()
    run(main())


def test_a_worker_added_while_it_warms_up_is_paused_not_ejected():
    """A worker added to the pool is picked before its first Load poll; one still warming up
    refused its first requests ("warming up ... retry on another worker", UNAVAILABLE), which
    counted as failures: it was ejected for 30 s although it served a second later (found by
    a probe in every saturated scale-up of a static pool). It is paused by its refusal, the
    requests go on to another worker, and the Load poll that sees it serving readmits it."""
    async def main():
        a, b = TestWorker("a", 0.005, concurrency=8, serving=False), TestWorker("b", 0.005, concurrency=8)
        await a.start()
        gw = await started([(b, 1)], load_poll_interval_s=1.0)
        try:
            gw.reload_workers([f"{b.address}=1", f"{a.address}=1"])  # before a's first Load poll
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                first = await asyncio.gather(*(_detect(stub, request(seq=i)) for i in range(12)))
                ep = gw.pool.balancer.endpoints[a.address]
                assert a.calls >= 1 and ep.paused and ep.ejections == 0, (a.calls, ep)
                a.serving = True
                await async_wait_until(lambda: not ep.paused, 10, "worker a readmitted by a Load poll")
                later = [await _detect(stub, request(seq=100 + i)) for i in range(10)]
            return first, later
        finally:
            await gw.stop(0)
            await a.stop()
            await b.stop()

    first, later = run(main())
    assert [r[0] for r in first] == ["OK"] * 12, first
    assert all(r[0] == "OK" for r in later) and "a" in {r[1].worker_id for r in later}, later


def test_removed_worker_drains_then_channel_closes():
    async def main():
        a, b = TestWorker("a", 0.4, concurrency=8), TestWorker("b", 0.01, concurrency=8)
        gw = await started([(a, 1), (b, 1)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                first = [asyncio.ensure_future(_detect(stub, request(seq=i))) for i in range(6)]
                await async_wait_until(lambda: gw.pool.balancer.endpoints[a.address].in_flight > 0, 10,
                                       "requests held by worker a")
                gw.reload_workers([f"{b.address}=1"])
                await async_wait_until(lambda: {w["address"]: w["state"] for w in gw.pool.snapshot()["workers"]}
                                       .get(a.address) == "draining", 10, "worker a draining")
                later = [await _detect(stub, request(seq=100 + i)) for i in range(5)]
                assert {r[1].worker_id for r in later} == {"b"}
                assert all(r[0] == "OK" for r in await asyncio.gather(*first))  # nothing lost
                await async_wait_until(lambda: a.address not in gw.pool.balancer.endpoints
                                       and a.address not in gw.pool._channels, 10, "worker a forgotten")
        finally:
            await gw.stop(0)
            await a.stop()
            await b.stop()
    run(main())


def test_sighup_puts_rotated_tokens_in_force_and_never_turns_authentication_off(tmp_path, caplog):
    """A rotated token in auth.tokens_file was never picked up, even after SIGHUP: the new
    token was refused and the old one kept working until a restart."""
    import logging
    import os
    import signal

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("- {device: cam-1, token: old-token}\n")

    async def main():
        w = TestWorker("w")
        await w.start()
        over = {"auth.tokens_file": str(tokens), "listen": "127.0.0.1:0"}
        try:
            task, gw = await serving(settings_for([(w, 1)], **over), lambda: settings_for([(w, 1)], **over))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def code(token):
                    return (await _detect(stub, request(), metadata=(("authorization", f"Bearer {token}"),)))[0]

                assert await code("old-token") == "OK"
                tokens.write_text("- {device: cam-1, token: new-token}\n")
                os.kill(os.getpid(), signal.SIGHUP)
                await async_wait_until(lambda: gw.auth.tokens == {"cam-1": "new-token"}, 10, "the reload")
                assert (await code("new-token"), await code("old-token")) == ("OK", "UNAUTHENTICATED")
                tokens.write_text("[]\n")  # emptied: must not open the gateway to anyone
                os.kill(os.getpid(), signal.SIGHUP)
                await async_wait_until(lambda: "lists no device" in caplog.text, 10, "the refusal")
                assert "reload ignored, the workers and tokens in force stay" in caplog.text
                assert (await code("new-token"), await code("anything")) == ("OK", "UNAUTHENTICATED")
                caplog.clear()
                tokens.write_text("- {device: cam-1, token: ' padded '}\n")  # malformed: the table in force stays
                os.kill(os.getpid(), signal.SIGHUP)
                await async_wait_until(lambda: "reload ignored, the workers and tokens in force stay" in caplog.text,
                                       10, "the malformed file refused")
                assert await code("new-token") == "OK"
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(task, 30)
        finally:
            await w.stop()

    with caplog.at_level(logging.INFO, logger="cloud.gateway.server"):
        run(main())


@pytest.mark.parametrize("bad", ["127.0.0.1:5=inf", "127.0.0.1:5=abc", "127.0.0.1", "127.0.0.1:70000"])
def test_a_sighup_with_a_bad_worker_list_keeps_the_workers_and_says_so(tmp_path, caplog, bad):
    """A SIGHUP whose static worker list has a bad entry (a weight of inf or 0, no port, a port
    out of range, a worker listed twice) passed the settings' checks and failed in the signal
    handler: asyncio logged "Exception in callback" with a traceback, the tokens of the same
    reload were not applied either, and nothing said the reload was ignored."""
    import logging
    import os
    import signal

    config = tmp_path / "gateway.yaml"

    async def main():
        w = TestWorker("w")
        await w.start()
        config.write_text(f"listen: 127.0.0.1:0\nmetrics_port: -1\ndiscovery:\n  static: ['{w.address}']\n")
        try:
            task, gw = await serving(load_settings(config, {}, env={}), lambda: load_settings(config, {}, env={}))
            config.write_text(f"listen: 127.0.0.1:0\nmetrics_port: -1\ndiscovery:\n  static: ['{w.address}', '{bad}']\n")
            os.kill(os.getpid(), signal.SIGHUP)
            await async_wait_until(lambda: "reload ignored" in caplog.text or "Exception in callback" in caplog.text,
                                   10, "the reload refused")
            assert "Exception in callback" not in caplog.text, caplog.text
            assert "reload ignored, the workers and tokens in force stay" in caplog.text
            assert "discovery.static: [1]" in caplog.text, caplog.text
            assert set(gw.pool.balancer.endpoints) == {w.address}
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                assert (await _detect(service_pb2_grpc.EscalationStub(ch), request()))[0] == "OK"
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(task, 30)
        finally:
            await w.stop()

    with caplog.at_level(logging.INFO):
        run(main())


def test_a_sighup_after_discovery_moved_to_dns_keeps_the_static_workers_in_force(tmp_path, caplog):
    """The settings file of a static gateway switched to DNS discovery for the next restart (its
    static list removed), then a SIGHUP, to rotate a token say: the WARNING said the change of
    discovery.kind waits for a restart, but the static discovery in force took the now empty
    list, "worker list reloaded: 0 workers", and every escalation was UNAVAILABLE until a restart."""
    import logging
    import os
    import signal

    config = tmp_path / "gateway.yaml"

    async def main():
        w = TestWorker("w")
        await w.start()
        config.write_text(f"listen: 127.0.0.1:0\nmetrics_port: -1\ndiscovery:\n  static: ['{w.address}']\n")
        try:
            task, gw = await serving(load_settings(config, {}, env={}), lambda: load_settings(config, {}, env={}))
            config.write_text("listen: 127.0.0.1:0\nmetrics_port: -1\n"
                              "discovery:\n  kind: dns\n  dns: {name: workers.example, port: 50052}\n")
            os.kill(os.getpid(), signal.SIGHUP)
            await async_wait_until(lambda: "device tokens reloaded" in caplog.text, 10, "the reload")
            assert "discovery.kind is now dns but stays static until a restart" in caplog.text, caplog.text
            assert "worker list reloaded" not in caplog.text, caplog.text
            assert set(gw.pool.balancer.endpoints) == {w.address}
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                assert (await _detect(service_pb2_grpc.EscalationStub(ch), request()))[0] == "OK"
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(task, 30)
        finally:
            await w.stop()

    with caplog.at_level(logging.INFO):
        run(main())


def test_a_deadline_message_says_how_far_the_request_got():
    from cloud.gateway.pool import _attempts

    assert _attempts([]) == "before any worker was tried"  # was "after 0 attempt(s) ()"
    assert _attempts(["w1", "w2"]) == "after 2 attempt(s) (w1, w2)"


def test_a_sighup_while_the_gateway_starts_is_a_reload_once_it_serves(tmp_path):
    """A real `edgewise cloud gateway` process whose start got a SIGHUP (a config reloader
    reacting to a Secret change, say) before its loop's handler existed: noted while it
    started (edgewise/hangup.py), not its end, and the workers and tokens are re-read once
    it serves (the file was edited meanwhile: the reload sees two workers)."""
    root = Path(__file__).resolve().parents[3]
    config = tmp_path / "gateway.yaml"
    config.write_text("listen: 127.0.0.1:0\nmetrics_port: -1\ndiscovery: {static: ['127.0.0.1:9']}\n")
    script = textwrap.dedent("""
        import os, signal, sys
        from edgewise import hangup
        from edgewise.cli import main
        hangup.hold()  # as main() does first thing; the signal comes before the gateway's loop exists
        os.kill(os.getpid(), signal.SIGHUP)
        with open(sys.argv[1], "w") as f:
            f.write("listen: 127.0.0.1:0\\nmetrics_port: -1\\n"
                    "discovery: {static: ['127.0.0.1:9', '127.0.0.1:11']}\\n")
        sys.exit(main(["cloud", "gateway", "--config", sys.argv[1]]))
    """)
    proc = subprocess.Popen([*DEFAULT_HUP, sys.executable, "-c", script, str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        line = proc.stdout.readline() if proc.stdout is not None else ""
        # the side port is off (-1), as the worker's line says it too (it read 0, a port)
        assert line.startswith("EDGEWISE_GATEWAY_LISTENING") and line.split()[-1] == "metrics_port=-1", \
            (line, proc.communicate(timeout=30))
        # until the reload is said (the gateway's SIGTERM handler is in place by then): after a fixed
        # 0.5 s a loaded machine may not have run the start that far, and SIGTERM ended it (-15)
        said = []
        for text in proc.stderr if proc.stderr is not None else ():
            said.append(text)
            if "worker list reloaded" in text:
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        err = "".join(said) + err
        assert proc.returncode == 0, err
        assert "SIGHUP during the start: reloading the workers and tokens" in err, err
        assert "worker list reloaded: 2 workers" in err, err
    finally:
        proc.kill()
        proc.wait(10)
