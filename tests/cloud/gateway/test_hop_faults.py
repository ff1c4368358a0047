"""The gateway against workers that fail the hop: one that hangs (SIGSTOP-like: connections
accepted, nothing answered) and one that refuses deadlines shorter than its batch of one, as
the real worker does (docs/design/balancing.md#the-hop-expires-first, #outlier-ejection).

Real gateway, real grpc.aio worker servers and clients on real sockets; only inference is a
sleep (or a wait forever).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import Counter
from types import SimpleNamespace

import grpc

from cloud.gateway.server import Gateway
from cloud.worker.batching import Batcher, BatchPolicy
from edgewise.errors import DeadlineExceededError
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.cloud.gateway.test_gateway import _detect, run, settings_for, started
from tests.cloud.gateway.workers import TestWorker, request


class HungWorker(TestWorker):
    """Accepts every Infer and never answers it (a stopped process, a wedged model thread).
    With ``hang_load`` its Load polls are never answered either."""

    def __init__(self, name: str, hang_load: bool = False) -> None:
        super().__init__(name)
        self.hang_load = hang_load
        self._never = asyncio.Event()

    async def Infer(self, request, context):
        self.calls += 1
        await self._never.wait()

    async def Load(self, request, context):
        if self.hang_load:
            await self._never.wait()
        return await super().Load(request, context)


class RefusingWorker(TestWorker):
    """Refuses up front a deadline closer than its batch-of-one time with the real worker's own
    refusal (``Batcher.submit``), answers the others after ``service_s``."""

    async def Infer(self, request, context):
        left = context.time_remaining()
        b: Batcher[str] = Batcher(BatchPolicy(max_batch_size=1, max_queue_delay_s=0.0))
        b.observe(1, self.service_s, warmup=True)
        try:
            b.submit("r", 0.0, deadline=left)
        except DeadlineExceededError as exc:
            self.calls += 1
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        return await super().Infer(request, context)


def sample(gw: Gateway, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_hung_worker_is_ejected_and_every_request_it_loses_is_counted():
    """Requests with a 300 ms gRPC deadline: the hop to the hung worker expires first, the
    gateway answers DEADLINE_EXCEEDED itself and counts it (requests_total, worker_errors), and
    five in a row eject the worker; the good worker then takes everything."""
    async def main():
        good, hung = TestWorker("good", 0.005), HungWorker("hung")
        gw = await started([(good, 1), (hung, 1)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                results = [await _detect(stub, request(seq=i), timeout=0.3) for i in range(16)]
            got = Counter(r[0] for r in results)
            lost = [r for r in results if r[0] != "OK"]
            assert got["DEADLINE_EXCEEDED"] == len(lost) == hung.calls == 5, results
            assert all("worker 127.0.0.1" in r[1] for r in lost), lost  # the gateway's answer, not gRPC's
            assert gw.pool.balancer.endpoints[hung.address].ejected(gw.pool.balancer.clock())
            assert sample(gw, "edgewise_gateway_worker_ejections_total", worker=hung.address) == 1
            assert sample(gw, "edgewise_gateway_requests_total", transport="grpc", status="DEADLINE_EXCEEDED") == 5
            assert sample(gw, "edgewise_gateway_requests_total", transport="grpc", status="OK") == 11
            assert sample(gw, "edgewise_gateway_worker_errors_total", worker=hung.address,
                          status="DEADLINE_EXCEEDED") == 5
            assert gw.pool.balancer.total_in_flight() == 0
        finally:
            await gw.stop(0)
            await good.stop()
            await hung.stop(0)
    run(main())


def test_a_hung_worker_is_ejected_though_each_request_it_holds_was_overtaken_by_a_higher_priority():
    """The edge sends each frame's hardness percentile as its priority, so requests in flight on
    a worker are overtaken by higher ones all the time. A queued request the worker itself
    expired is not held against it (docs/design/balancing.md#priority), but a hop
    that ran out on a worker that answers nothing is: five requests of rising priority, all held
    by a hung worker whose model thread is wedged (Load still answers), eject it. Before, only
    the last, never overtaken, counted and the worker kept its picks."""
    async def main():
        hung = HungWorker("hung")
        gw = await started([(hung, 1)])
        b = gw.pool.balancer
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                calls = []
                for i in range(5):
                    req = request(seq=i)
                    req.priority = 10 * i
                    calls.append(asyncio.ensure_future(_detect(stub, req, timeout=0.6)))
                    while hung.calls <= i:  # picked in this order
                        await asyncio.sleep(0.005)
                results = await asyncio.gather(*calls)
            assert [r[0] for r in results] == ["DEADLINE_EXCEEDED"] * 5, results
            assert b.endpoints[hung.address].ejections == 1
        finally:
            await gw.stop(0)
            await hung.stop(0)
    run(main())


def test_a_worker_whose_load_polls_time_out_is_paused_until_one_answers():
    """Load polls every 0.2 s time out after 0.2 s: after three in a row the worker is paused
    (no picks, not_serving in /pool); a poll that answers brings it back."""
    async def main():
        good, hung = TestWorker("good", 0.005), HungWorker("hung", hang_load=True)
        gw = await started([(good, 1), (hung, 1)])
        b = gw.pool.balancer
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while not b.endpoints[hung.address].paused:
                assert loop.time() < deadline, "the hung worker was never paused"
                await asyncio.sleep(0.05)
            states = {w["name"]: w["state"] for w in gw.pool.snapshot()["workers"]}
            assert states[hung.address] == "not_serving"
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                results = [await _detect(stub, request(seq=i), timeout=1.0) for i in range(6)]
            assert all(r[0] == "OK" and r[1].worker_id == "good" for r in results), results
            hung.hang_load = False  # answers polls again
            deadline = loop.time() + 5
            while b.endpoints[hung.address].paused:
                assert loop.time() < deadline, "the worker stayed paused after a poll answered"
                await asyncio.sleep(0.05)
        finally:
            await gw.stop(0)
            await good.stop()
            await hung.stop(0)
    run(main())


def test_short_client_deadlines_do_not_eject_healthy_workers():
    """One client sending 6 ms deadlines to workers whose batch of one takes 8 ms: the workers
    refuse up front (or the hop expires first), and that is the client's deadline, not the
    workers' fault: nobody is ejected, and later requests are served by both. Each short call
    the gateway saw is counted once: answered DEADLINE_EXCEEDED, or unanswered where the
    client's deadline won the race on a loaded machine (a call that expired in the client or
    in gRPC before reaching the gateway is in neither)."""
    async def main():
        ws = [(RefusingWorker("a", 0.008), 1), (RefusingWorker("b", 0.008), 1)]
        gw = await started(ws)
        b = gw.pool.balancer
        seen: list[str] = []
        one = gw._one

        async def counted(body, transport, caller, remaining):
            seen.append(transport)
            return await one(body, transport, caller, remaining)

        gw._one = counted  # type: ignore[method-assign]
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                for i in range(4):  # the gateway learns the workers' batch-of-one round trip
                    assert (await _detect(stub, request(seq=i), timeout=2.0))[0] == "OK"
                served = [w.calls for w, _ in ws]
                seen.clear()
                short = [await _detect(stub, request(seq=i), timeout=0.006) for i in range(20)]
                assert {r[0] for r in short} == {"DEADLINE_EXCEEDED"}, short
                # enough refusals reached a worker to eject it, had they counted as its failures
                refused = [w.calls - n for (w, _), n in zip(ws, served)]
                assert max(refused) >= gw.settings.balancer.consecutive_failures, refused
                assert all(not ep.ejected(b.clock()) and ep.ejections == 0 for ep in b.endpoints.values())
                after = [await _detect(stub, request(seq=i), timeout=2.0) for i in range(6)]
            assert Counter(r[1].worker_id for r in after) == {"a": 3, "b": 3}, after
            reached = len(seen) - len(after)
            answered = sum(s.value for m in gw.metrics.registry.collect() for s in m.samples
                           if s.name == "edgewise_gateway_requests_total" and s.labels["status"] != "OK")
            assert answered + sample(gw, "edgewise_gateway_unanswered_total", transport="grpc") == reached
            assert answered >= 1
        finally:
            await gw.stop(0)
            for w, _ in ws:
                await w.stop()
    run(main())


def test_an_mqtt_overload_answer_is_counted_like_every_answered_request():
    """The bridge answers RESOURCE_EXHAUSTED itself when ``mqtt.max_in_flight`` requests are in
    the balancer: requests_total{transport=mqtt} and rejected_total count it (docs/metrics.md)."""
    async def main():
        w = TestWorker("a", 0.005)
        await w.start()
        gw = Gateway(settings_for([(w, 1)], **{"mqtt.enabled": True, "mqtt.max_in_flight": 1}))
        from cloud.gateway.mqtt_bridge import MqttBridge
        bridge = MqttBridge(gw.settings.mqtt, gw, gw.metrics.mqtt)
        published = []
        bridge.client.publish = lambda topic, body, qos, properties: (  # type: ignore[method-assign]
            published.append(detect_pb2.DetectResponse.FromString(body)) or SimpleNamespace(rc=0, mid=1))
        bridge._pending[concurrent.futures.Future()] = "cam-2"  # one request in flight: the bridge is full
        msg = SimpleNamespace(topic="edgewise/cam-1/escalate", payload=request().SerializeToString(), retain=False,
                              properties=SimpleNamespace(ResponseTopic="edgewise/cam-1/response/x",
                                                         CorrelationData=b"c1"))
        bridge._accept(msg)
        assert [p.status for p in published] == [detect_pb2.RESOURCE_EXHAUSTED]
        assert sample(gw, "edgewise_gateway_requests_total", transport="mqtt", status="RESOURCE_EXHAUSTED") == 1
        assert sample(gw, "edgewise_gateway_rejected_total", reason="mqtt_overloaded") == 1
        assert bridge.counts == {"overloaded": 1}
        await w.stop()
    run(main())


def test_a_healthy_worker_two_gateways_overfill_is_not_ejected(tiny_model):
    """Two gateways each admit what the worker serves in the deadline, as each sees only its own
    share of its load (docs/design/balancing.md#admission-control): the real worker (its batches
    paced to 40 ms) gets twice that. It queued the excess to expire there, and each gateway
    counted the expiries against it and ejected it for 30 s, though it served all it could. It
    refuses the excess at once as load, answers what it can, and stays in."""
    from cloud.worker.server import create_server
    from tests.cloud.worker.test_server import PacedRunner, make_settings

    async def main():
        worker, port = create_server(make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0,
                                                   max_queue_size=64), PacedRunner(tiny_model, 0.04))
        await worker.start()
        w = SimpleNamespace(address=f"127.0.0.1:{port}")
        gws = [Gateway(settings_for([(w, 1)])) for _ in range(2)]
        for gw in gws:
            await gw.start()
        try:
            await asyncio.sleep(0.5)  # a Load poll: each gateway knows the worker's rate
            chans = [grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") for gw in gws]
            stubs = [service_pb2_grpc.EscalationStub(ch) for ch in chans]
            results = await asyncio.gather(*[_detect(stubs[i % 2], request(seq=i), timeout=0.8) for i in range(60)])
            for ch in chans:
                await ch.close()
            got = Counter(r[0] for r in results)
            assert got["OK"] >= 5, results
            ejections = [gw.pool.balancer.endpoints[w.address].ejections for gw in gws]
            assert ejections == [0, 0], (ejections, got, [r for r in results if r[0] != "OK"])
        finally:
            for gw in gws:
                await gw.stop(0)
            await worker.stop(0)
    run(main())
