"""The gateway's worker pool: the async shell around the balancer core.

One gRPC channel per worker (gRPC Python has no least-request policy, so the
gateway picks in Python: docs/design/balancing.md#why-the-gateway-picks-in-python), created and closed as
discovery changes; a draining worker's channel closes once its last request
ends. ``forward`` picks, sends ``Worker.Infer`` with the request's own bytes and a gRPC
deadline a little before the client's (``balancing.hop_timeout``: the hop expires first, so
the gateway sees its DEADLINE_EXCEEDED, counts it against the worker and answers the client
itself; the worker takes the earlier of it and the request's ``deadline_unix_ns``;
docs/design/balancing.md#a-lean-hop), classifies the
answer once (``balancing.outcome_of`` of its wire status, a gRPC error being turned
into the same kind of reply first), and retries once on
another worker for a retryable status (``edgewise.status``: UNAVAILABLE), or after a worker's
refusal of a deadline closer than its batch of one or for its own load when another worker may
answer in time (``balancing.wants_retry``), within the deadline and the retry budget
(docs/design/balancing.md#retries-and-the-retry-budget). When the
client gives up (the edge cancels, a stream ends), the call to the worker is cancelled in gRPC
Core rather than through the task awaiting it (that leaks native memory per call in grpc.aio,
grpc/grpc#43360), its worker slot is released at once and nothing is retried. A poller reads
``Worker.Load`` to feed reported capacity, queue depth and serving state into
the effective weights. Every answer is a ``Reply`` (``cloud.gateway.envelope``: the
worker's serialized ``DetectResponse``, or one made here for a failure, with its status
and message; the gRPC servicer turns those into status codes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from cloud.discovery.base import Endpoint, EndpointState
from cloud.gateway.balancing import (
    Balancer,
    NoPick,
    Outcome,
    RetryBudget,
    Ticket,
    hop_timeout,
    outcome_of,
    refused_here,
    should_retry,
    wants_retry,
)
from cloud.gateway.envelope import Reply, RequestHead, error_reply, reply_of
from cloud.gateway.metrics import GatewayMetrics
from cloud.gateway.settings import GatewaySettings, quote_id
from edgewise import status
from edgewise.v1 import detect_pb2, service_pb2, service_pb2_grpc

log = logging.getLogger("edgewise.gateway.pool")
_WORKER = service_pb2.DESCRIPTOR.services_by_name["Worker"]
INFER_PATH = f"/{_WORKER.full_name}/{_WORKER.methods_by_name['Infer'].name}"


@dataclass
class _Channel:
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.WorkerStub
    infer: Any  # Worker.Infer taking and returning serialized messages (no protobuf work here)


class WorkerPool:
    """Channels, balancer, forwarding and load polling for one gateway."""

    def __init__(self, settings: GatewaySettings, metrics_registry: Any = None,
                 balancer: Balancer | None = None) -> None:
        self.settings = settings
        self.balancer = balancer or Balancer(settings.balancer)
        self.metrics = GatewayMetrics(self.balancer, metrics_registry)
        r = settings.retry
        self.budget = RetryBudget(r.budget_ratio, r.min_per_s, r.window_s)
        self._channels: dict[str, _Channel] = {}
        self._queue_ms: deque[tuple[float, float]] = deque(maxlen=20000)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.ready = asyncio.Event()  # set once discovery delivered a first set
        self.requests_total = 0  # requests offered to the pool (the autoscaler's arrival rate)
        #: this process's name in ``/pool``: whose ``requests_total`` it is, so the autoscaler never
        #: differences two gateways' counters (a URL that reaches a different replica each poll)
        self.instance = secrets.token_hex(8)

    # ---- membership -----------------------------------------------------------------------
    def _channel_options(self) -> list[tuple[str, Any]]:
        m = self.settings.limits.max_message_bytes
        return [
            ("grpc.max_send_message_length", m),
            ("grpc.max_receive_message_length", m),
            ("grpc.enable_retries", 0),       # retries are ours (one, budgeted, other host)
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]

    def apply(self, endpoints: Iterable[Endpoint]) -> None:
        """Make the pool match a full endpoint set from discovery."""
        eps = list(endpoints)
        closable = self.balancer.set_endpoints(
            (e.address, e.weight, e.name or e.address, e.state is EndpointState.DRAINING) for e in eps)
        for e in eps:
            if e.state is EndpointState.READY and e.address not in self._channels:
                ch = grpc.aio.insecure_channel(e.address, options=self._channel_options())
                self._channels[e.address] = _Channel(ch, service_pb2_grpc.WorkerStub(ch),
                                                     ch.unary_unary(INFER_PATH, _registered_method=True))
                log.info("worker added: %s (weight %g)", e.address, e.weight)
        for address in closable:
            self._close_channel(address)
        self.ready.set()

    def _close_channel(self, address: str) -> None:
        """A worker left the pool (drained, or removed by discovery): close its channel and
        drop its metric series."""
        self.metrics.forget_workers({ep.name for ep in self.balancer.endpoints.values()})
        ch = self._channels.pop(address, None)
        if ch is not None:
            log.info("worker removed, channel closed: %s", address)
            self._spawn(ch.channel.close())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def follow(self, updates: AsyncIterator[frozenset[Endpoint]]) -> None:
        """Apply every endpoint set a discovery source yields (runs until cancelled)."""
        async for endpoints in updates:
            try:
                self.apply(endpoints)
            except ValueError as exc:  # a bad weight from discovery: keep the old set
                log.error("discovery update ignored: %s", exc)

    async def poll_loads(self) -> None:
        """Poll Worker.Load on every worker forever (capacity, queue depth, serving)."""
        interval = self.settings.load_poll_interval_s
        while True:
            await asyncio.gather(*(self._poll_one(a, c) for a, c in list(self._channels.items())),
                                 return_exceptions=True)
            self.balancer.refresh()  # ejections that ended show (and are logged) now, not at the next pick
            await asyncio.sleep(interval)

    async def _poll_one(self, address: str, ch: _Channel) -> None:
        timeout = min(1.0, self.settings.load_poll_interval_s)
        try:
            load = await ch.stub.Load(detect_pb2.LoadRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            # Active health check (Envoy's complement to outlier ejection): a worker we
            # cannot reach gets no picks until a poll reaches it again. Without this a
            # restarted worker whose ejection ran out while its channel was still
            # reconnecting took picks, failed them fast and was ejected again, for
            # longer each time. A slow poll (deadline) is load, not absence, but a few in a
            # row say the worker is hung (SIGSTOP, a wedged loop): the balancer pauses it.
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.balancer.mark_unreachable(address)
            elif exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.balancer.load_timed_out(address)
            return
        limit = load.max_batch_size + load.max_queue_size if load.max_queue_size else 0
        self.balancer.report_load(address, load.capacity, load.queue_depth, limit, load.serving,
                                  load.peak_capacity, load.pixel_rate, load.devices_in_turn)

    # ---- forwarding -----------------------------------------------------------------------
    async def forward(self, req: RequestHead, timeout_s: float, transport: str = "grpc", pixels: int = 0) -> Reply:
        """Send one request to a worker (retrying once on another, ``_retry``); always returns a
        reply. ``pixels``: the image's declared pixels, what it costs on workers whose time grows
        with it."""
        t_start = time.perf_counter()
        deadline = t_start + timeout_s
        self.budget.record_request()
        self.requests_total += 1
        tried: list[str] = []
        waited = 0.0
        reply: Reply | None = None
        in_time = False  # the retry after a worker's own refusal: only a worker that may make it
        while True:
            remaining = deadline - time.perf_counter()
            hop = hop_timeout(remaining)  # expires first: the timeout is ours to see, count and answer
            if hop <= 0:
                reply = error_reply(req, status.DEADLINE_EXCEEDED,
                                    f"deadline passed, or too close to reach a worker ({remaining * 1000:.1f} ms "
                                    f"left), {_attempts(tried)}; send a later deadline")
                if not tried:  # refused before forwarding, like the gateway's other refusals
                    self.metrics.rejected.labels(reason="deadline_exceeded").inc()
                break
            pick = self.balancer.pick(exclude=tried, deadline_s=hop, pixels=pixels, in_time=in_time,
                                      priority=req.rank, device=req.device_id, replay=req.replay)
            if not isinstance(pick, Ticket):
                if reply is None:  # else no other worker to retry on: answer with the first failure
                    reply = self._no_pick_reply(req, pick, remaining, hop)
                break
            t0 = time.perf_counter()
            reply = await self._attempt(pick, req, hop)
            waited += time.perf_counter() - t0
            tried.append(pick.address)
            if not self._retry(reply, tried, deadline - time.perf_counter(), pixels, req.rank, req.device_id):
                break
            in_time = refused_here(reply.status, reply.error)
        total = time.perf_counter() - t_start
        self.metrics.answered(transport, status.name(reply.status), total)
        if waited > 0:
            self.metrics.overhead.observe(max(0.0, total - waited))
        return reply.stamped(total * 1000.0)

    async def _attempt(self, pick: Ticket, req: RequestHead, remaining: float) -> Reply:
        """One call to the picked worker. A gRPC error and a non-OK answer become the same
        kind of reply, classified once for the balancer; the ticket is always released."""
        ep = self.balancer.endpoints.get(pick.address)
        name = ep.name if ep is not None else pick.address
        ch = self._channels.get(pick.address)
        if ch is None:  # discovery raced us: the worker is not to blame
            pick.release(Outcome.CANCELLED)
            return error_reply(req, status.UNAVAILABLE, f"worker {name}: removed by discovery")
        call = ch.infer(req.body, timeout=remaining)
        try:
            await _finished(call)  # then awaiting the call returns at once
            reply = reply_of(await call, req, name)
        except grpc.aio.AioRpcError as exc:
            reply = _hop_error(req, name, exc)
        except BaseException:  # client cancelled: the worker isn't to blame, nothing is retried
            _cancel_call(call)
            self._done(pick, Outcome.CANCELLED)
            raise
        if not status.is_ok(reply.status):  # counted before the release, which may forget the worker
            self.metrics.worker_error(name, status.name(reply.status))
        self._done(pick, outcome_of(reply.status, reply.error))
        if reply.queue_ms is not None and reply.queue_ms >= 0:
            self._queue_ms.append((time.monotonic(), reply.queue_ms))
        return reply

    def _retry(self, reply: Reply, tried: list[str], left: float, pixels: int, priority: int = 0,
               device: str | None = None) -> bool:
        """Whether to send the request again to another worker than ``tried``, with ``left``
        seconds to go (``balancing.should_retry``; counted in the metrics: ``denied`` is a
        retry wanted but refused by the time left or the budget)."""
        if not self.settings.retry.enabled:
            return False

        asked: dict[tuple[float, bool], bool] = {}  # wants_retry and should_retry ask the same: one scan

        def may_pick(within_s: float, in_time: bool) -> bool:
            if (within_s, in_time) not in asked:
                asked[within_s, in_time] = self.balancer.may_answer_within(within_s, tried, pixels, in_time,
                                                                           priority, device)
            return asked[within_s, in_time]

        def elsewhere(within_s: float) -> bool:  # a worker that may answer in time
            return may_pick(within_s, True)

        def anywhere(within_s: float) -> bool:  # any worker a pick would find
            return may_pick(within_s, False)

        if not wants_retry(reply.status, reply.error, left, elsewhere, anywhere):
            return False
        if should_retry(reply.status, len(tried), left, self.settings.retry.min_attempt_ms / 1000.0,
                        self.budget, reply.error, elsewhere, anywhere):
            self.metrics.retries.labels(result="sent").inc()
            return True
        if len(tried) == 1:
            self.metrics.retries.labels(result="denied").inc()
        return False

    def _done(self, ticket: Ticket, outcome: Outcome) -> None:
        if ticket.release(outcome):
            self._close_channel(ticket.address)

    def _no_pick_reply(self, req: RequestHead, why: NoPick, remaining: float, hop: float) -> Reply:
        self.metrics.rejected.labels(reason=why.name.lower()).inc()
        b = self.balancer
        n = len(b.endpoints)
        if why is NoPick.OVER_SHARE:
            standing = b.share(req.device_id, hop)
            held = (f" (it holds {standing.held} requests in flight; its share is {standing.share:.1f} of the "
                    f"workers' room for {standing.room:.0f} in its deadline, with {standing.active} active devices)"
                    if standing is not None else "")
            return error_reply(
                req, why.status,
                f"device {quote_id(req.device_id)} is over its fair share of the workers{held} while other "
                f"devices wait for room: keep fewer requests in flight (the edge's cloud.max_in_flight), retry "
                f"later, spool, or use the edge result")
        if why is NoPick.SATURATED:
            replay = (" (a replay is sent only while a worker holds less than half its limit: the rest is kept "
                      "for live requests)") if req.replay else ""
            return error_reply(
                req, why.status,
                f"all {n} workers are saturated ({b.total_in_flight()} requests in flight, "
                f"{remaining * 1000:.0f} ms left){replay}: retry later, spool, or use the edge result")
        return error_reply(req, why.status,
                           f"no worker can take requests now ({n} known, none ready): check the worker pool")

    # ---- views ----------------------------------------------------------------------------
    def queue_wait_p90_ms(self, window_s: float = 30.0) -> float:
        cutoff = time.monotonic() - window_s
        vals = sorted(v for t, v in self._queue_ms if t >= cutoff)
        if not vals:
            return 0.0
        return vals[min(len(vals) - 1, int(0.9 * len(vals)))]

    def snapshot(self) -> dict[str, Any]:
        """The ``GET /pool`` document the autoscaler reads."""
        b = self.balancer
        b.refresh()  # an ejection that ended shows as such, with its slow-start weight
        now = b.clock()
        workers = []
        capacity = 0.0
        for ep in b.endpoints.values():
            state = "draining" if ep.draining else "ejected" if ep.ejected(now) else \
                "not_serving" if ep.paused else "ready"
            workers.append({
                "name": ep.name, "address": ep.address, "state": state, "in_flight": ep.in_flight,
                "queue_depth": ep.queue_depth, "capacity": ep.capacity or 0.0,
                "peak_capacity": ep.peak_capacity or 0.0, "pixel_rate": ep.pixel_rate or 0.0,
                "work": round(ep.work, 6),
                "weight": round(b.effective_weight(ep, now), 6), "ejected": ep.ejected(now),
            })
            if state == "ready":
                capacity += ep.capacity or 0.0
        return {"workers": workers, "in_flight": b.total_in_flight(), "capacity": capacity,
                "queue_wait_ms_p90": self.queue_wait_p90_ms(), "requests_total": self.requests_total,
                "instance": self.instance}

    async def close(self) -> None:
        for address in list(self._channels):
            self._close_channel(address)
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._tasks, return_exceptions=True)


def _finished(call: Any) -> asyncio.Future[None]:
    """A future done once ``call`` is (its batch completed in gRPC Core and freed). The forwarding
    task awaits this rather than the call: a cancellation of the forwarding task (the client gave
    up) then cancels only this future, never the call's own task in the middle of its batch,
    which leaks the batch's native op array (grpc/grpc#43360); the call is cancelled by
    ``_cancel_call`` instead."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def finished(_: Any) -> None:
        if not done.done():
            done.set_result(None)
    call.add_done_callback(finished)
    return done


def _cancel_call(call: Any) -> None:
    """Cancel a forwarded call whose client gave up: the worker stops on it at once, and the
    call's batch still completes in gRPC Core and is freed by the call's own task. Only
    ``Call._cancel`` does just that; the public ``cancel()`` also cancels that task, which leaks
    the batch's native op array (grpc/grpc#43360, about 0.8 KB per call), so it is only the
    fallback for a grpcio without ``_cancel``."""
    cancel = getattr(call, "_cancel", None)
    if callable(cancel):
        cancel("the gateway's client gave up on this request")
    else:
        call.cancel()


def _hop_error(req: RequestHead, name: str, exc: grpc.aio.AioRpcError) -> Reply:
    """The reply for a worker call that failed in gRPC. A message over a size limit of the hop
    (the gateway's channel, or the worker's server with a lower ``max_message_bytes``) is the
    request's fault, not load (``status.from_grpc``): the balancer does not hold the worker as
    overloaded and the edge does not spool and replay a request that can never pass."""
    details = exc.details() or ""
    st = status.from_grpc(exc.code(), details)
    if st == status.INVALID_ARGUMENT and exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return error_reply(req, st, f"worker {name}: the request ({len(req.body)} bytes) is larger than the hop "
                                    f"allows ({details}); send a smaller image, or give the gateway and the "
                                    f"workers the same max_message_bytes")
    return error_reply(req, st, f"worker {name}: {exc.code().name}: {details}")


def _attempts(tried: list[str]) -> str:
    """How far a request got before its deadline ran out, for its error message."""
    return f"after {len(tried)} attempt(s) ({', '.join(tried)})" if tried else "before any worker was tried"
