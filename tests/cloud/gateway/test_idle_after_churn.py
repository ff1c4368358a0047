"""Every piece of the gateway's per-request bookkeeping is back at idle after a few hundred
requests ended every way a request ends (real gateway, real grpc.aio test workers, real
clients over sockets, a real Mosquitto broker restarted mid-request).

A slot taken at a request's start and not given back on one rare exit path shrinks the
gateway's capacity a little each time, until it refuses everything (``all workers are
saturated``, a device's ``limits.max_calls_per_device`` spent) weeks later. So after the churn:
the balancer's in-flight count, work and per-priority levels of every worker are 0, no device
holds a call slot or a DetectStream, the health service counts no watcher
(``cloud.binding.HealthServicer``), ``edgewise_gateway_stream_pending`` and
``edgewise_gateway_worker_in_flight`` read 0 on ``/metrics``, the MQTT bridge holds no request
and waits for no PUBACK, and a full ``limits.max_calls_per_device`` of new calls is served.
"""

from __future__ import annotations

import asyncio
import random

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.test_gateway import http_get, run, started
from tests.cloud.gateway.test_mqtt_bridge import Edge, bridged_gateway
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import async_wait_until

CAP = 8  # limits.max_calls_per_device
TOKENS = {"cam-1": "t1", "cam-2": "t2"}


def _md(device: str, token: str | None = None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token or TOKENS[device]}"), ("x-edgewise-device", device))


def _held(gw) -> dict:
    """What the gateway holds for requests in flight (all empty or 0 at idle)."""
    b = gw.pool.balancer
    return {"balancer": {a: (ep.in_flight, ep.work, dict(ep.levels)) for a, ep in b.endpoints.items()
                         if ep.in_flight or ep.work or ep.levels},
            "call slots": dict(gw.interceptor.slots.open), "streams": dict(gw.streams_of),
            "stream_pending": gw.metrics.stream_pending._value.get(),
            "health watchers": (dict(gw.health._watching), len(gw.health._server_watchers))}


IDLE = {"balancer": {}, "call slots": {}, "streams": {}, "stream_pending": 0.0, "health watchers": ({}, 0)}


async def _settles(now, idle: dict, what: str, timeout: float = 10.0) -> None:
    """Wait for ``now()`` to equal ``idle``; fail showing what is still held."""
    try:
        await async_wait_until(lambda: now() == idle, timeout, what)
    except AssertionError:
        raise AssertionError(f"{what}: still held after {timeout:g} s: {now()}") from None


def test_grpc_calls_ended_every_way_leave_nothing_held():
    async def main():
        rng = random.Random(7)
        fast = TestWorker("fast", 0.005, concurrency=8)
        slow = TestWorker("slow", 0.4, concurrency=4)
        failing = TestWorker("failing", fail=grpc.StatusCode.UNAVAILABLE)  # retried on another worker
        gw = await started([(fast, 1), (slow, 1), (failing, 1)], **{
            "auth.tokens": [{"device": d, "token": t} for d, t in TOKENS.items()],
            "limits.max_calls_per_device": CAP, "limits.max_streams_per_device": 2,
            "limits.max_stream_in_flight": 3, "retry.min_per_s": 1000})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def detect(i: int) -> None:
                    device = rng.choice(list(TOKENS))
                    req = request(device=device, seq=i)
                    req.priority = rng.choice([0, 1, 2])
                    kind = rng.choice(["answered", "deadline", "cancelled", "bad token", "over cap"])
                    token = "wrong" if kind == "bad token" else None
                    timeout = {"deadline": rng.choice([0.01, 0.1, 0.3])}.get(kind, 3.0)
                    call = stub.Detect(req, timeout=timeout, metadata=_md(device, token))
                    if kind == "cancelled":
                        await asyncio.sleep(rng.random() * 0.3)
                        call.cancel()
                    try:
                        await call
                    except (grpc.aio.AioRpcError, asyncio.CancelledError):
                        pass

                async def stream(i: int) -> None:
                    device = rng.choice(list(TOKENS))
                    call = stub.DetectStream(metadata=_md(device), timeout=rng.choice([0.3, 3.0]))
                    try:
                        for k in range(rng.randint(1, 6)):
                            await call.write(request(device=device, seq=1000 * i + k))
                        if rng.random() < 0.5:  # the client leaves with frames in flight
                            await asyncio.sleep(rng.random() * 0.2)
                            call.cancel()
                            return
                        await call.done_writing()
                        async for _ in call:
                            pass
                    except (grpc.aio.AioRpcError, asyncio.CancelledError, asyncio.InvalidStateError):
                        pass

                async def watch(i: int) -> None:  # a health Watch the client leaves
                    call = health_pb2_grpc.HealthStub(ch).Watch(
                        health_pb2.HealthCheckRequest(service=rng.choice(["", "edgewise.v1.Escalation"])),
                        metadata=_md(rng.choice(list(TOKENS))), timeout=rng.choice([0.2, 3.0]))
                    try:
                        await call.read()
                        await asyncio.sleep(rng.random() * 0.3)
                        call.cancel()
                    except (grpc.aio.AioRpcError, asyncio.CancelledError):
                        pass

                for _ in range(3):  # more calls at once than a device may hold: some refused over the cap
                    calls = [detect(i) for i in range(60)] + [stream(i) for i in range(15)] + [watch(i) for i in range(8)]
                    rng.shuffle(calls)
                    await asyncio.gather(*calls)
                await _settles(lambda: _held(gw), IDLE, "the gateway's bookkeeping back at idle")
                metrics = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
                in_flight = [line for line in metrics.splitlines()
                             if line.startswith(("edgewise_gateway_worker_in_flight{", "edgewise_gateway_stream_pending "))]
                assert len(in_flight) == 4 and all(line.endswith(" 0.0") for line in in_flight), in_flight
                # a device's whole allowance is there again: CAP calls at once, all served
                fast.service_s = 0.3
                replies = await asyncio.gather(*(stub.Detect(request(device="cam-1", seq=5000 + i), timeout=5,
                                                             metadata=_md("cam-1")) for i in range(CAP)))
                assert len(replies) == CAP
        finally:
            await gw.stop(0)
            for w in (fast, slow, failing):
                await w.stop()
    run(main())


def test_mqtt_requests_across_broker_restarts_leave_the_bridge_holding_nothing(mosquitto):
    async def main():
        w = TestWorker("a", 0.3, concurrency=8)
        await w.start()
        gw = await bridged_gateway(mosquitto, w, **{"mqtt.max_in_flight": 30, "mqtt.max_in_flight_per_device": 12})
        bridge = gw.bridge
        edges: list[Edge] = []
        try:
            await async_wait_until(bridge.connected.is_set, 15, "the bridge subscribed")
            edges = [await asyncio.to_thread(Edge, mosquitto.host, mosquitto.port, f"edgewise/{d}/response/x")
                     for d in TOKENS]

            def burst(tag: str) -> None:  # over the per-device share: some refused as overloaded
                for i in range(40):
                    device = list(TOKENS)[i % 2]
                    edges[i % 2].send(request(device=device, seq=i).SerializeToString(), f"{tag}{i}".encode(),
                                      device=device, expiry_s=(0, 1, 5)[i % 3])

            for r in range(2):
                await asyncio.to_thread(burst, f"r{r}-")
                await asyncio.sleep(0.1)  # requests at the worker, answers on their way
                await asyncio.to_thread(mosquitto.stop)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(mosquitto.start)
                await async_wait_until(bridge.connected.is_set, 20, "the bridge subscribed again")
                for e in edges:
                    await async_wait_until(e.c.is_connected, 20, "the edge connected again")

            def held() -> dict:
                return {"requests": len(bridge._pending), "per device": dict(bridge._per_device),
                        "unacked answers": len(bridge._unacked), "early PUBACKs": len(bridge._early),
                        "balancer": _held(gw)["balancer"]}

            await _settles(held, {"requests": 0, "per device": {}, "unacked answers": 0, "early PUBACKs": 0,
                                  "balancer": {}}, "the MQTT bridge's bookkeeping back at idle", 15)
            # and it serves: one request per device answered
            await asyncio.to_thread(edges[0].send, request(seq=9).SerializeToString(), b"after")
            await async_wait_until(lambda: b"after" in edges[0].responses, 10, "an answer after the churn")
        finally:
            for e in edges:
                e.close()
            await gw.stop(1)
            await w.stop()
    run(main())
