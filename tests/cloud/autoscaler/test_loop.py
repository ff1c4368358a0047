"""The autoscaler loop end to end against local HTTP servers: two gateways' /pool and the
Kubernetes scale subresource (through the real ``kubernetes`` client). Asserts the PATCH
bodies sent over a sequence of load changes, partial/failed polls, API errors, dry run."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import socket
import threading
from typing import Any

import pytest

from cloud.autoscaler.kube import DeploymentScale, ScaleState
from cloud.autoscaler.loop import (
    POLL_ERRORS,
    SCALE_OPS,
    ArrivalRate,
    AutoscalerLoop,
    AutoscalerMetrics,
    GatewayPoller,
    _http_get_json,
    aggregate,
    parse_pool,
)
from cloud.autoscaler.scaling import Scaler, ScalerConfig, ScalingPolicy, ScalingRules
from cloud.discovery.kubeclient import KubeAccess, build_api_client
from edgewise.errors import ConfigError, InvalidInputError, UnavailableError
from tests.cloud.autoscaler.servers import PoolServer, ScaleAPI, pool_doc
from tests.listener import TricklingGateway
from tests.waiting import wait_until


@pytest.fixture
def api():
    s = ScaleAPI(namespace="ns", name="edgewise-worker", replicas=2, token="t0k3n")
    yield s
    s.close()


@pytest.fixture
def gateways():
    gs = [PoolServer(), PoolServer()]
    yield gs
    for g in gs:
        g.close()


def make_loop(api, urls, *, dry_run=False, out=None, window=60.0):
    client = build_api_client(KubeAccess(api_server=api.url, token="t0k3n"))
    target = DeploymentScale(client, "ns", "edgewise-worker", dry_run=dry_run, out=out)
    cfg = ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.7,
                       scale_down=ScalingRules(window, (ScalingPolicy("Percent", 100, 15),)))
    clock = [0.0]
    loop = AutoscalerLoop(Scaler(cfg), target, GatewayPoller(urls, timeout_s=2.0), clock=lambda: clock[0])
    return loop, clock


def set_load(gateways, n_workers, *in_flight):
    for g, f in zip(gateways, in_flight):
        g.doc = pool_doc(n_workers, f)


def test_patch_bodies_follow_load(api, gateways):
    loop, clock = make_loop(api, [g.url for g in gateways])
    steps = [  # (t, workers both gateways see, in-flight per gateway) -> expected replicas after
        (0, 2, (20, 8), 4),      # 28/20 = 1.4 vs 0.7: ratio 2 -> 4
        (15, 4, (14, 14), 4),    # 28/40 = 0.7: at target
        (30, 4, (60, 40), 8),    # 100/40 = 2.5: wants 15, rate limit max(+100 %, +4) -> 8
        (45, 8, (2, 2), 8),      # load gone: recommendation 1, held by the 60 s window (15 at t=30)
        (60, 8, (2, 2), 8),
        (75, 8, (2, 2), 8),
        (90, 8, (2, 2), 1),      # t=30 left the window: down to 1 (-100 % per 15 s allowed)
    ]
    for t, n, flights, expect in steps:
        clock[0] = float(t)
        set_load(gateways, n, *flights)
        d = asyncio.run(loop.tick())
        assert d is not None and d.desired == expect, (t, d)
        assert api.replicas == expect
    assert api.patches == [
        {"spec": {"replicas": 4}, "metadata": {"resourceVersion": "1"}},
        {"spec": {"replicas": 8}, "metadata": {"resourceVersion": "2"}},
        {"spec": {"replicas": 1}, "metadata": {"resourceVersion": "3"}},
    ]
    patches = [r for r in api.requests if r[0] == "PATCH"]
    assert all(r[2]["authorization"] == "Bearer t0k3n" for r in patches)
    assert all(r[2]["content-type"] == "application/merge-patch+json" for r in patches)
    metrics = loop.metrics
    assert metrics.desired._value.get() == 1
    assert metrics.decisions.labels("up")._value.get() == 2
    assert metrics.decisions.labels("down")._value.get() == 1


def test_failed_gateway_blocks_scale_down_but_not_up(api, gateways):
    api.replicas = 6
    loop, clock = make_loop(api, [g.url for g in gateways], window=0.0)
    set_load(gateways, 6, 1, 1)
    gateways[1].status = 500
    d = asyncio.run(loop.tick())
    assert d.desired == 6 and "partial" in d.reason
    assert loop.metrics.poll_errors.labels("http_500")._value.get() == 1
    gateways[1].doc = b"{not json"
    gateways[1].status = 200
    set_load(gateways[:1], 6, 60)
    clock[0] = 15.0
    d = asyncio.run(loop.tick())
    assert d.desired == 9 and api.replicas == 9   # ceil(6 * (60/60) / 0.7)
    assert loop.metrics.poll_errors.labels("invalid")._value.get() == 1
    assert api.patches == [{"spec": {"replicas": 9}, "metadata": {"resourceVersion": "1"}}]


def test_a_gateway_answering_garbage_does_not_stop_the_others_from_scaling(api, gateways):
    """One address answers something that is not HTTP, another /pool nested past the JSON
    parser's depth: each is one poll error, and the healthy gateway's load still scales."""
    import socket
    import threading

    junk = socket.socket()
    junk.bind(("127.0.0.1", 0))
    junk.listen()

    def serve():
        for _ in range(2):
            try:
                c, _ = junk.accept()
            except OSError:
                return
            c.recv(4096)
            c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        loop, clock = make_loop(api, [gateways[0].url, gateways[1].url,
                                      f"http://127.0.0.1:{junk.getsockname()[1]}"])
        set_load(gateways[:1], 2, 28)
        gateways[1].doc = ("[" * 100_000 + "]" * 100_000).encode()
        d = asyncio.run(loop.tick())
        assert d.desired == 4 and api.replicas == 4, d  # ceil(2 x (28 / 20) / 0.7)
        assert loop.metrics.poll_errors.labels("invalid")._value.get() == 2
    finally:
        junk.close()


def test_no_gateway_answers_means_hold(api, gateways):
    loop, clock = make_loop(api, ["http://127.0.0.1:9"])  # discard port: connection refused
    d = asyncio.run(loop.tick())
    assert d.desired == d.current == 2 and "no metrics" in d.reason
    assert loop.metrics.poll_errors.labels("connect")._value.get() == 1
    assert not api.patches


def test_a_slow_poll_or_scale_read_makes_the_sample_stale(api, gateways):
    """stale_after_s (45 s here) counts from asking the gateways to deciding: a gateway that
    answers late or an API server slow to give the scale ages the sample, and the decision
    holds (it used to be stamped and decided with one clock reading, so its age was always 0)."""
    loop, clock = make_loop(api, [g.url for g in gateways])
    set_load(gateways, 2, 20, 8)  # 28/20 = 1.4 vs 0.7: would scale 2 -> 4

    def late():
        clock[0] += 50.0

    gateways[1].on_get = late
    d = asyncio.run(loop.tick())
    assert d.desired == d.current == 2 and "stale (50 s old > 45 s)" in d.reason, d
    gateways[1].on_get = None
    real_read = loop.target.read

    def slow_read():
        clock[0] += 46.0
        return real_read()

    loop.target.read = slow_read
    d = asyncio.run(loop.tick())
    assert d.desired == 2 and "stale" in d.reason, d
    loop.target.read = real_read
    clock[0] += 15.0
    d = asyncio.run(loop.tick())
    assert d.desired == 4 and api.replicas == 4, d


def test_pool_gauges_go_blank_while_no_gateway_answers(api, gateways):
    """With no sample the decision holds; the pool gauges must not keep showing the last pool."""
    loop, clock = make_loop(api, [g.url for g in gateways])
    set_load(gateways, 2, 10, 4)
    asyncio.run(loop.tick())
    m = loop.metrics
    assert m.ready._value.get() == 2 and m.utilization._value.get() == pytest.approx(14 / 20)
    assert m.recommendation._value.get() == 2
    for g in gateways:
        g.status = 503
    clock[0] = 15.0
    d = asyncio.run(loop.tick())
    assert "no metrics" in d.reason
    for gauge in (m.ready, m.utilization, m.load, m.queue_wait, m.recommendation):
        assert math.isnan(gauge._value.get()), gauge
    assert m.current._value.get() == m.desired._value.get() == 2  # what is known stays
    for g in gateways:
        g.status = 200
    clock[0] = 30.0
    asyncio.run(loop.tick())
    assert m.ready._value.get() == 2


def test_dry_run_prints_and_never_patches(api, gateways):
    lines = []
    loop, clock = make_loop(api, [g.url for g in gateways], dry_run=True, out=lines.append)
    set_load(gateways, 2, 20, 8)
    for t in (0.0, 15.0):
        clock[0] = t
        d = asyncio.run(loop.tick())
        assert d.desired == 4
    assert [r[0] for r in api.requests] == ["GET", "GET"]
    assert api.replicas == 2 and not api.patches
    decisions = [json.loads(x) for x in lines]
    assert decisions[0]["dry_run"] is True and decisions[0]["from"] == 2 and decisions[0]["to"] == 4
    assert "utilization" in decisions[0]["reason"]


def test_api_errors_say_what_to_fix(api):
    bad_token = DeploymentScale(build_api_client(KubeAccess(api_server=api.url, token="wrong")),
                                "ns", "edgewise-worker")
    with pytest.raises(ConfigError, match=r"unauthorized \(401\): the API server rejected the token"):
        bad_token.read()
    client = build_api_client(KubeAccess(api_server=api.url, token="t0k3n"))
    with pytest.raises(ConfigError, match="not found.*--deployment"):
        DeploymentScale(client, "ns", "nope").read()
    target = DeploymentScale(client, "ns", "edgewise-worker")
    state = target.read()
    assert state == ScaleState(2, 2, "1")
    api.bump(5)  # an operator scaled meanwhile: our precondition fails, nothing is overwritten
    with pytest.raises(UnavailableError, match="409"):
        target.apply(3, state, "test")
    assert api.replicas == 5


def test_conflict_is_counted_and_retried_next_tick(api, gateways, caplog):
    caplog.set_level(logging.INFO, logger="cloud.autoscaler")
    loop, clock = make_loop(api, [g.url for g in gateways])
    set_load(gateways, 2, 20, 8)
    real_read = loop.target.read

    def racing_read():
        s = real_read()
        api.bump(api.replicas)  # resourceVersion changes between our read and patch
        return s

    loop.target.read = racing_read
    d = asyncio.run(loop.tick())
    assert d.desired == 4 and api.replicas == 2
    assert loop.metrics.apply_errors.labels("patch")._value.get() == 1
    # an expected outcome of a concurrent change, not a fault: a warning, not an error
    (conflict,) = [r for r in caplog.records if "409" in r.getMessage()]
    assert conflict.levelno == logging.WARNING and "next tick re-reads" in conflict.getMessage()
    loop.target.read = real_read
    clock[0] = 15.0
    asyncio.run(loop.tick())
    assert api.replicas == 4


def test_a_controller_holding_the_target_out_of_bounds_does_not_grow_the_scale_history(api, gateways):
    """Another controller (a GitOps sync, a second HPA) that keeps setting the replicas above
    max_replicas: each tick brings the target back down without reaching the rate limits, and
    each of those scales was kept for good (one event per tick, for as long as it went on)."""
    loop, clock = make_loop(api, [g.url for g in gateways])
    set_load(gateways, 4, 14, 14)
    for i in range(200):  # 50 minutes of ticks
        clock[0] = 15.0 * i
        api.bump(25)
        d = asyncio.run(loop.tick())
        assert d is not None and d.desired == 20 and api.replicas == 20
    # only the events the rate-limit periods (15 s here) still reach back to are kept
    assert len(loop.scaler._events) <= 2, len(loop.scaler._events)
    # and once the other controller stops, the loop decides from the load again
    clock[0] += 15.0
    set_load(gateways, 20, 140, 140)  # at target: holds at 20
    assert asyncio.run(loop.tick()).desired == 20


@pytest.mark.parametrize("op", ["read", "patch"])
def test_the_next_call_waits_for_the_retry_after_of_a_shed_one(api, gateways, caplog, op):
    """The API server shed a read or a patch of the scale (429, Retry-After: 1) and the loop
    called it again one ``interval_s`` later (0.1 s here), whatever it asked. The next tick now
    comes no sooner than the Retry-After (the tick's own time is counted in the interval, not in
    the wait), the shed call is a warning, counted, and the one after it scales."""
    import time

    from cloud.autoscaler.loop import next_tick_in

    assert next_tick_in(15.0, 2.0) == 13.0 and next_tick_in(15.0, 2.0, 20.0) == 20.0
    assert next_tick_in(0.1, 0.5) == 0.0
    caplog.set_level(logging.INFO, logger="cloud.autoscaler")
    client = build_api_client(KubeAccess(api_server=api.url, token="t0k3n"))
    cfg = ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.7,
                       scale_down=ScalingRules(60.0, (ScalingPolicy("Percent", 100, 15),)))
    loop = AutoscalerLoop(Scaler(cfg), DeploymentScale(client, "ns", "edgewise-worker"),
                          GatewayPoller([g.url for g in gateways], timeout_s=2.0), interval_s=0.1)
    set_load(gateways, 2, 20, 8)  # 4 replicas wanted
    method = "GET" if op == "read" else "PATCH"
    api.shed = [(429, "1", method)]

    async def run():
        task = asyncio.create_task(loop.run())
        t0 = time.monotonic()
        while api.replicas != 4 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.02)
        loop.stop()
        await task
    asyncio.run(run())
    assert api.replicas == 4
    shed_at = next(i for i, r in enumerate(api.requests) if r[0] == method)
    gap = api.times[shed_at + 1] - api.times[shed_at]
    assert gap >= 1.0, f"the call after the shed one came {gap:.2f} s later; Retry-After asked for 1 s"
    assert loop.metrics.apply_errors.labels(op)._value.get() == 1
    (shed,) = [r for r in caplog.records if "429" in r.getMessage()]
    assert shed.levelno == logging.WARNING and "the next call waits 1 s" in shed.getMessage()


def test_aggregate_sums_load_dedupes_capacity():
    a = parse_pool(pool_doc(3, 12.0, qw=20.0), "gw-a")
    b = parse_pool(pool_doc(3, 6.0, qw=35.0), "gw-b")   # the same 3 workers seen by another replica
    s = aggregate([a, b], expected=2, now=5.0)
    assert (s.in_flight, s.capacity, s.ready_workers, s.queue_wait_ms_p90, s.complete) == (18.0, 30.0, 3, 35.0, True)
    doc = pool_doc(3, 0.0)
    doc["workers"][0]["state"] = "draining"
    doc["workers"][1]["ejected"] = True
    s = aggregate([parse_pool(doc, "gw")], expected=2, now=0.0)
    assert s.ready_workers == 1 and s.capacity == 10.0 and not s.complete
    assert aggregate([], expected=1, now=0.0) is None


def test_arrival_rate_differences_each_gateways_counter():
    def gw(source, total):
        doc = pool_doc(2, 0.0)
        if total is not None:
            doc["requests_total"] = total
        return parse_pool(doc, source)

    r = ArrivalRate(forget_after_s=100.0)
    assert r.observe([gw("a", 100), gw("b", 50)], 0.0) is None          # no previous value yet
    assert r.observe([gw("a", 400), gw("b", 200)], 15.0) == 30.0        # 300/15 + 150/15
    assert r.observe([gw("a", 700)], 30.0) == 20.0                      # b did not answer: a alone
    assert r.observe([gw("a", 10), gw("b", 500)], 45.0) is None         # a restarted (counter went back)
    assert r.observe([gw("a", 160), gw("b", 800)], 60.0) == 30.0        # b: 300 over the 30 s since it answered
    assert r.observe([gw("a", 160), gw("c", None)], 75.0) is None       # a gateway without the counter
    assert r.observe([], 80.0) is None
    assert r.observe([gw("b", 900)], 200.0) is None                     # b forgotten after 100 s: starts again
    assert parse_pool({**pool_doc(1, 0.0), "instance": "0f3a"}, "a").instance == "0f3a"
    with pytest.raises(InvalidInputError, match="instance must be a string of 1 to 64 characters"):
        parse_pool({**pool_doc(1, 0.0), "instance": 7}, "a")
    s = aggregate([gw("a", 1)], expected=1, now=0.0, arrivals_per_s=12.5)
    assert s.arrivals_per_s == 12.5 and s.peak_capacity == s.capacity == 20.0  # no peak reported: capacity
    doc = pool_doc(2, 0.0)
    doc["workers"][0]["peak_capacity"] = 35.0
    assert aggregate([parse_pool(doc, "a")], expected=1, now=0.0).peak_capacity == 45.0


def test_the_load_target_is_known_with_an_interval_longer_than_forget_after_s(api):
    """interval_s may be up to an hour, but each gateway's previous counter was forgotten 600 s
    after it was read: with ``--interval 900`` every poll found none, the arrival rate was never
    known and the autoscaler held the pool at its size for good ("arrival rate not reported").
    A gateway that answered the previous poll is remembered however long ago that was."""
    gw = PoolServer()
    try:
        client = build_api_client(KubeAccess(api_server=api.url, token="t0k3n"))
        cfg = ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=None, target_load=0.8,
                           scale_down=ScalingRules(0.0, (ScalingPolicy("Percent", 100, 15),)))
        clock = [0.0]
        loop = AutoscalerLoop(Scaler(cfg), DeploymentScale(client, "ns", "edgewise-worker"),
                              GatewayPoller([gw.url], timeout_s=2.0), interval_s=900.0, clock=lambda: clock[0])
        for t, total in ((0.0, 0), (900.0, 900), (1800.0, 1800)):  # 1 request/s on 2 workers of 10/s
            clock[0] = t
            gw.doc = {**pool_doc(2, 0.0), "requests_total": total, "instance": "gw-1"}
            d = asyncio.run(loop.tick())
        assert d is not None and d.metrics["load"] == pytest.approx(0.05)
        assert api.replicas == 1
        r = ArrivalRate(forget_after_s=100.0)  # one absent from the previous poll is still forgotten
        doc = {**pool_doc(2, 0.0), "instance": "gw-1"}
        assert r.observe([parse_pool({**doc, "requests_total": 0}, "a")], 0.0) is None
        assert r.observe([], 50.0) is None
        assert r.observe([parse_pool({**doc, "requests_total": 500}, "a")], 500.0) is None
    finally:
        gw.close()


def test_a_url_that_reaches_another_gateway_each_poll_never_differences_their_counters():
    """A ClusterIP Service (or an https URL, or resolve_gateways off) sends each poll to any
    replica: one gateway's requests_total was differenced against another's, and two gateways
    offered 10 requests/s each read as 543/s when the poll changed replica (the load target
    scaled up on it). Each counter is differenced only against the same gateway process's
    (``instance`` in /pool): one gateway's rate, the undercount the setting's doc says, never
    a made-up one."""
    first = {"A": 10_000, "B": 2_000}  # requests each gateway was offered before the first poll
    clock = [0.0]
    order = iter("AABABBBAAB")
    seen = []

    def answer() -> None:  # the Service picks a replica for this connection
        gw = next(order)
        seen.append(gw)
        doc = pool_doc(2, 0.0)
        doc.update(requests_total=first[gw] + 10.0 * clock[0], instance=f"gateway-{gw}")
        server.doc = doc

    server = PoolServer()
    server.on_get = answer
    try:
        poller = GatewayPoller([server.url], resolve=False)
        rates = []
        for i in range(10):
            clock[0] = 15.0 * i
            sample = asyncio.run(poller.poll(clock[0]))
            assert sample is not None
            rates.append(sample.arrivals_per_s)
    finally:
        server.close()
    assert seen == list("AABABBBAAB")
    assert {r for r in rates if r is not None} == {10.0}, rates  # each gateway's own rate, never another's
    assert rates[:3] == [None, 10.0, None]  # A seen twice, then B for the first time


def test_a_gateway_answering_at_two_addresses_counts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dual-stack headless Service lists each gateway's IPv4 and IPv6 address: the gateway was
    polled at both and counted twice (in flight 8 for its 4, arrivals 20/s for its 10), and one
    address that did not answer kept every sample partial (no scale-down, ever). Answers naming
    one ``instance`` are one gateway."""
    server = PoolServer(host="::")
    real = asyncio.AbstractEventLoop.getaddrinfo

    async def dual_stack(self, host, port, *args, **kwargs):  # the cluster DNS's A and AAAA records
        if host != "gateways.test":
            return await real(self, host, port, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", dual_stack)
    try:
        poller = GatewayPoller([f"http://gateways.test:{server.port}"])
        samples = []
        for i, total in enumerate((100, 250)):
            server.doc = dict(pool_doc(2, 4.0), requests_total=total, instance="gw-1")
            samples.append(asyncio.run(poller.poll(15.0 * i)))
    finally:
        server.close()
    assert server.hits == 4  # both addresses asked, each poll
    last = samples[-1]
    assert (last.in_flight, last.capacity, last.ready_workers, last.complete) == (4.0, 20.0, 2, True)
    assert last.arrivals_per_s == 10.0


def test_load_sample_from_a_real_gateway_and_worker(tiny_model):
    """The path a deployment takes: a real worker reports its peak capacity over Worker.Load,
    the real gateway counts the requests offered to it in /pool, and the autoscaler's poller
    turns two polls into an arrival rate."""
    import time

    import grpc
    import numpy as np

    from edgewise import wire
    from edgewise.v1 import detect_pb2, service_pb2_grpc
    from tests.conftest import in_process_cloud_class

    with in_process_cloud_class()(tiny_model, gateway={"metrics_port": 0, "metrics_host": "127.0.0.1"}) as cloud:
        cloud.wait_answering()
        poller = GatewayPoller([f"http://127.0.0.1:{cloud.gateway.metrics_port}"], resolve=False)
        t0 = time.monotonic()
        first = asyncio.run(poller.poll(t0))
        assert first is not None and first.arrivals_per_s is None  # one poll is no rate yet
        assert first.ready_workers == 1 and first.capacity > 0 and first.peak_capacity > 0

        async def send(n):
            image = wire.encode_image(np.zeros((64, 64, 3), np.uint8), "jpeg")
            async with grpc.aio.insecure_channel(cloud.address) as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                for i in range(n):
                    await stub.Detect(detect_pb2.DetectRequest(device_id="cam", stream_id="s", frame_seq=i,
                                                               image=image), timeout=10)

        asyncio.run(send(20))
        t1 = time.monotonic()
        second = asyncio.run(poller.poll(t1))
        assert second.arrivals_per_s == pytest.approx(20 / (t1 - t0))


def test_load_target_scales_on_the_gateways_request_counters(api, gateways):
    client = build_api_client(KubeAccess(api_server=api.url, token="t0k3n"))
    cfg = ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=None, target_load=0.5)
    clock = [0.0]
    loop = AutoscalerLoop(Scaler(cfg), DeploymentScale(client, "ns", "edgewise-worker"),
                          GatewayPoller([g.url for g in gateways], timeout_s=2.0), clock=lambda: clock[0])
    totals = [0, 0]
    for t, per_s, expect in ((0, (0, 0), 2), (15, (20, 10), 6), (30, (20, 10), 6)):
        # 2 workers of 10 req/s; gateways offered 20 + 10 req/s: load 1.5 vs 0.5 -> ceil(2 * 3) = 6
        clock[0] = float(t)
        for i, g in enumerate(gateways):
            totals[i] += per_s[i] * 15
            g.doc = {**pool_doc(api.replicas, 0.0), "requests_total": totals[i]}
        d = asyncio.run(loop.tick())
        assert d is not None and d.desired == expect, (t, d)
    assert api.patches == [{"spec": {"replicas": 6}, "metadata": {"resourceVersion": "1"}}]
    assert loop.metrics.load._value.get() == pytest.approx(30.0 / 60.0)


@pytest.mark.parametrize("doc, msg", [
    ([], "JSON object"),
    ({"workers": {}}, "workers must be a list"),
    ({"in_flight": -1}, "in_flight"),
    ({"in_flight": 1, "capacity": "lots"}, "capacity"),
    ({"in_flight": 1, "capacity": 1, "workers": [{"state": "ready"}]}, "address"),
    ({"in_flight": 1, "capacity": 1, "queue_wait_ms_p90": float("nan")}, "queue_wait"),
    ({"in_flight": 1, "capacity": 1, "requests_total": -5}, "requests_total"),
    ({"in_flight": 1, "capacity": 1, "requests_total": 10**400}, "requests_total"),  # past float range
    ({"in_flight": 1e300, "capacity": 1}, r"in_flight must be a number in \[0, 1e\+12\]"),
    ({"in_flight": 1, "capacity": 1, "workers": [{"address": "w:1", "ejected": "false"}]},
     r"workers\[0\]: ejected must be true or false, got 'false'"),
])
def test_parse_pool_rejects_bad_documents(doc, msg):
    with pytest.raises(InvalidInputError, match=msg):
        parse_pool(doc, "gw")


def test_gateway_host_expands_to_every_address():
    poller = GatewayPoller(["http://localhost:9100/"])
    targets = asyncio.run(poller._targets("http://localhost:9100/"))
    urls = {u for u, _ in targets}
    assert urls & {"http://127.0.0.1:9100/pool", "http://[::1]:9100/pool"}
    assert all(h == "localhost:9100" for _, h in targets)
    assert asyncio.run(poller._targets("http://10.1.2.3:9100")) == [("http://10.1.2.3:9100/pool", None)]
    off = GatewayPoller([], resolve=False)
    assert asyncio.run(off._targets("http://gw:9100")) == [("http://gw:9100/pool", None)]


def test_polls_the_real_gateway_side_port():
    """Contract test with the gateway's own HTTP side port (cloud.gateway.http.SidePort)."""
    from prometheus_client import CollectorRegistry

    from cloud.gateway.http import SidePort

    async def scenario():
        side = SidePort(CollectorRegistry(), lambda: pool_doc(3, 12.0, qw=7.0), lambda: True)
        port = await side.start("127.0.0.1", 0)
        try:
            return await GatewayPoller([f"http://127.0.0.1:{port}"]).poll(1.0)
        finally:
            await side.stop()

    s = asyncio.run(scenario())
    assert (s.in_flight, s.capacity, s.ready_workers, s.queue_wait_ms_p90, s.complete) == (12.0, 30.0, 3, 7.0, True)


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_gateway_costs_one_timeout_and_no_thread(api: ScaleAPI, where: str) -> None:
    """Each read waited at most the timeout, but the answer as a whole had no bound: the poll's
    thread kept reading a trickling gateway after ``wait_for`` gave up on it, and a few such threads
    filled the default executor, so the scale read queued behind them and a tick took 50 s."""
    import threading
    import time

    gw = TricklingGateway(where, seconds=30.0)  # a thread left reading would outlive the wait below
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no complete answer within 0.3 s"):
            _http_get_json(gw.url + "/pool", None, 0.3)
        assert time.monotonic() - t0 < 1.0
        loop, clock = make_loop(api, [gw.url] * 8)
        loop.poller.timeout = 0.3
        threads = threading.active_count()
        for i in range(3):  # 24 polls of the trickling gateway: more than the default executor's threads
            t0 = time.monotonic()
            d = asyncio.run(loop.tick())
            assert d is not None and "no metrics" in d.reason, d  # the scale was read: a decision was made
            assert time.monotonic() - t0 < 2.0, f"tick {i} took {time.monotonic() - t0:.1f} s"
        assert loop.metrics.poll_errors.labels("timeout")._value.get() == 24
        # the shut sockets' threads (the poll's, and the gateway's answering them) end within a
        # send or two: waited for, not a fixed 0.2 s, which a loaded machine may outlast
        wait_until(lambda: threading.active_count() <= threads + 1, 10, "no poll thread left reading")
    finally:
        gw.close()


@pytest.mark.parametrize("where, close", [("headers", False), ("body", False), ("body", True)])
def test_a_trickling_api_server_holds_a_call_no_longer_than_its_timeout(where: str, close: bool) -> None:
    """urllib3's timeout bounds each read: an API server (or a proxy) trickling its answer held a
    read of the scale for 76 s with a 2 s timeout, and the autoscaler's SIGTERM with it. Now each
    call ends at ``request_timeout_s``, its socket shut, and no thread is left reading."""
    import threading
    import time

    from cloud.discovery.kubeclient import KubeAccess, build_api_client

    slow = TricklingGateway(where, seconds=30.0, close=close)  # close: http.client hands the socket on
    try:
        target = DeploymentScale(build_api_client(KubeAccess(api_server=slow.url, token="t")), "ns", "w",
                                 request_timeout_s=0.5)
        threads = threading.active_count()
        for call in (target.read, lambda: target.apply(3, ScaleState(2, 2, "1"), "test")):
            t0 = time.monotonic()
            with pytest.raises(UnavailableError, match=r"deployment ns/w scale: no answer within "
                                                       r"kubernetes.request_timeout_s \(0.5 s"):
                call()
            assert time.monotonic() - t0 < 1.5
        assert slow.connections == 2 and not target._calls
        wait_until(lambda: threading.active_count() <= threads, 10, "no thread left reading")  # the server's 30 s
    finally:
        slow.close()


def test_an_api_server_that_refuses_or_does_not_resolve_is_named_so_not_a_timeout() -> None:
    """urllib3 2 derives its connection errors from its connect timeout: a refused connection or
    a name that does not resolve read as 'no answer within request_timeout_s'."""
    from cloud.discovery.kubeclient import KubeAccess, build_api_client

    for url, said in (("http://127.0.0.1:9", "Connection refused"),
                      ("http://no-such-host.invalid:6443", "no-such-host.invalid")):
        target = DeploymentScale(build_api_client(KubeAccess(api_server=url, token="t")), "ns", "w",
                                 request_timeout_s=5)
        with pytest.raises(UnavailableError, match=rf"cannot connect to the API server \(.*{said}"):
            target.read()


def test_the_deadline_keeps_a_proxy_managers_own_connection_classes() -> None:
    """The tracking replaced the pool classes with plain ones, so a SOCKS proxy manager's
    connections (which take extra arguments) failed every call with a TypeError; it now extends
    whatever classes the manager has, and notes each connection as it connects and requests."""
    import urllib3
    from urllib3.connection import HTTPSConnection
    from urllib3.connectionpool import HTTPSConnectionPool

    from cloud.discovery.kubeclient import track_calls

    class ProxyConnection(HTTPSConnection):
        def __init__(self, *args: Any, _socks_options: Any = None, **kwargs: Any) -> None:
            self.socks_options = _socks_options
            super().__init__(*args, **kwargs)

    class ProxyPool(HTTPSConnectionPool):
        ConnectionCls = ProxyConnection

    class Client:
        class rest_client:  # the kubernetes client's attribute name
            pool_manager = urllib3.PoolManager(_socks_options={"via": "proxy"})

    Client.rest_client.pool_manager.pool_classes_by_scheme = {"https": ProxyPool}
    calls: dict = {}
    track_calls(Client, calls)
    pool = Client.rest_client.pool_manager.connection_from_url("https://127.0.0.1:9/")
    assert isinstance(pool, ProxyPool)
    conn = pool._new_conn()
    assert isinstance(conn, ProxyConnection) and conn.socks_options == {"via": "proxy"}
    from urllib3.exceptions import NewConnectionError

    with pytest.raises(NewConnectionError):
        conn.connect()  # nothing listens on port 9: it noted itself first
    assert list(calls.values()) == [conn]


def test_a_gateway_name_the_resolver_does_not_answer_fails_its_poll_in_time(monkeypatch, gateways) -> None:
    """getaddrinfo has no timeout of its own: a resolver that did not answer held the poll, and
    with it every gateway's sample and the scaling, for as long as the lookup took."""
    import threading

    real = socket.getaddrinfo
    release = threading.Event()

    def getaddrinfo(host, *args, **kwargs):
        if host == "gateway.hung.example":
            release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    metrics = AutoscalerMetrics()
    poller = GatewayPoller(["http://gateway.hung.example:9100", gateways[0].url], timeout_s=0.5, metrics=metrics)

    async def poll():
        try:
            return await asyncio.wait_for(poller.poll(0.0), 5)
        finally:
            release.set()

    sample = asyncio.run(poll())
    assert sample is not None and not sample.complete  # the other gateway's sample is taken
    assert metrics.registry.get_sample_value(
        "edgewise_autoscaler_gateway_poll_errors_total", {"reason": "resolve"}) == 1.0


def test_a_hung_lookup_is_awaited_again_not_started_at_every_poll(monkeypatch, gateways) -> None:
    """A lookup given up on at the poll's timeout went on in its executor thread, and the next poll
    started another: one more thread hung in the resolver per tick, until they filled the default
    executor that the /pool fetches and the scale read need. As the gateway's DNS discovery does,
    the lookup still unanswered is awaited again (``OneLookup``), and its late answer is used."""
    import threading

    real = socket.getaddrinfo
    release = threading.Event()
    calls: list[str] = []

    def getaddrinfo(host, *args, **kwargs):
        if host == "gateway.hung.example":
            calls.append(host)
            release.wait(30)
            return real("127.0.0.1", *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    metrics = AutoscalerMetrics()
    port = gateways[0].port
    poller = GatewayPoller([f"http://gateway.hung.example:{port}", gateways[1].url], timeout_s=0.1, metrics=metrics)

    async def polls():
        try:
            samples = [await asyncio.wait_for(poller.poll(float(i)), 5) for i in range(5)]
            release.set()
            await asyncio.sleep(0.2)  # the lookup answers after the fifth poll gave up on it
            samples.append(await asyncio.wait_for(poller.poll(5.0), 5))
            return samples
        finally:
            release.set()

    samples = asyncio.run(polls())
    # each lookup is an executor thread held in the resolver until the release
    assert len(calls) == 1, f"{len(calls)} lookups (threads hung in the resolver) for 5 polls"
    assert all(s is not None and not s.complete for s in samples[:5])  # the other gateway's sample is taken
    assert metrics.registry.get_sample_value(
        "edgewise_autoscaler_gateway_poll_errors_total", {"reason": "resolve"}) == 5.0
    assert samples[5] is not None and samples[5].complete  # the late answer: both gateways polled
    assert gateways[0].hits == 1


def test_error_counters_start_at_zero_with_every_reason_the_loop_counts() -> None:
    """A series that first appears at 1 has no increase() in Prometheus: the first failed poll
    or scale call never fired the documented "autoscaler blind" query."""
    import inspect

    from cloud.autoscaler import loop as loop_module

    registry = AutoscalerMetrics().registry
    for reason in POLL_ERRORS:
        assert registry.get_sample_value("edgewise_autoscaler_gateway_poll_errors_total", {"reason": reason}) == 0
    for op in SCALE_OPS:
        assert registry.get_sample_value("edgewise_autoscaler_scale_errors_total", {"op": op}) == 0
    source = inspect.getsource(loop_module)
    assert set(re.findall(r'_error\("([a-z_]+)"', source)) == set(POLL_ERRORS)
    assert set(re.findall(r'_api_failed\("([a-z_]+)"', source)) == set(SCALE_OPS)


def test_a_tick_stuck_where_no_timeout_reaches_fails_healthz_until_one_ends(api, gateways):
    """The autoscaler had no liveness: a tick stuck where none of its timeouts reach (here the
    scale read blocked in its executor thread, as a lookup glibc never answers holds one) left a
    process that never scaled again, which no probe noticed. ``alive`` (its ``/healthz``) now
    turns false once no tick ended for ``stall_after_s``, and true again when one does."""
    loop, clock = make_loop(api, [g.url for g in gateways])
    loop.interval_s, loop.stall_after_s = 0.01, 100.0
    release = threading.Event()
    read = loop.target.read
    loop.target.read = lambda: (release.wait(30), read())[1]  # type: ignore[method-assign]

    async def main() -> None:
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.3)
        assert loop.alive()  # the clock has not moved: within the bound
        clock[0] = 100.5
        assert not loop.alive()  # the first tick still waits for its read
        release.set()
        for _ in range(500):
            if loop.alive():
                break
            await asyncio.sleep(0.01)
        assert loop.alive()  # the tick ended: the loop turns again
        loop.stop()
        await task

    asyncio.run(main())


def test_the_stall_bound_covers_a_tick_at_its_limits_and_the_wait_after_it():
    """Twice the longest a tick (poll + read + patch) and the wait before the next can take, so a
    slow but bounded tick is never called wedged; the chart's probe then adds 3 x 20 s."""
    from cloud.autoscaler.kube import RETRY_AFTER_MAX_S
    from cloud.autoscaler.loop import stall_after_s

    for interval, gw, req in ((15.0, 2.0, 10.0), (3600.0, 600.0, 60.0), (0.1, 0.1, 0.1)):
        longest = gw + 1.0 + 2 * req + max(interval, RETRY_AFTER_MAX_S)
        assert stall_after_s(interval, gw, req) == 2 * longest
