"""The cloud worker's gRPC server: an async shell around the batcher core.

``Worker`` service (``Infer``, ``Load``) plus the standard ``grpc.health.v1``
service on one grpc.aio server. Division of labour:

* the event loop only moves requests: handlers validate, hand the image to the
  decode pool, ``submit`` to the ``Batcher`` and await a future;
* one scheduling task asks the batcher for a batch whenever the model is free
  (on every submit, on the batcher's ``next_wakeup`` and after each batch) and
  answers requests it expired with DEADLINE_EXCEEDED, while a batch runs too
  (``Batcher.next_expiry``, unless the batch stalled);
* the model runs in a dedicated single-thread executor (ONNX Runtime releases
  the GIL), so one batch runs at a time, as one Triton model instance.

Lifecycle (``docs/design/batching.md#lifecycle``, ``docs/design/conventions.md#graceful-shutdown``): health is
NOT_SERVING until warm-up batches ran at every batch size the batcher may send
first and the worker decided from their timings whether batching pays on this
backend (``batching.decide_batching``; if not, batch 1 without queue delay); then SERVING. ``drain(grace)`` (SIGTERM): health NOT_SERVING, new Infer
calls get UNAVAILABLE, everything accepted is finished, then the server stops;
all within ``grace`` seconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from cloud.binding import (
    HealthServicer,
    add_health,
    grpc_port,
    parsed,
    server_options,
    socket_port_async,
    unless_client_gone,
)
from cloud.worker.batching import (
    BUSY_MARK,
    EXPIRED_MARK,
    TOO_SHORT_MARK,
    Batch,
    Batcher,
    BatchingDecision,
    decide_batching,
)
from cloud.worker.budget import PixelBudget
from cloud.worker.metrics import WorkerMetrics
from cloud.worker.runner import ModelRunner, Prepared
from cloud.worker.settings import WorkerSettings
from edgewise import status
from edgewise.addresses import format_address
from edgewise.detections import Detections
from edgewise.errors import (
    DeadlineExceededError,
    EdgewiseError,
    InvalidInputError,
    OverloadedError,
    UnavailableError,
)
from edgewise.runtime.firstframe import batch_failure
from edgewise.v1 import detect_pb2, service_pb2, service_pb2_grpc
from edgewise.wire import check_image, detections_to_proto, queue_rank

log = logging.getLogger(__name__)

SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
LISTENING_TAG = "EDGEWISE_WORKER_LISTENING"
SERVING_TAG = "EDGEWISE_WORKER_SERVING"
STREAM_GRACE_S = 0.5  # for RPCs other than Infer once the drain is over
AUTO_WARMUP_ROUNDS = 3  # batching.mode auto: one cold round, then two timed rounds per size
#: A call cancelled with at most this long left on its deadline ended by its deadline: the caller's
#: copy of the deadline runs out first (this worker's began when the call's headers arrived) and
#: its cancellation can beat this worker's own timer. On loopback, 10 of 38 calls whose 0.5 s
#: deadline passed in the queue arrived so, 0.2 to 3.7 ms early, and were counted CANCELLED.
DEADLINE_LAG_S = 0.02
#: The refusals while this worker does not serve: each carries cloud.worker.batching.NOT_SERVING_MARK,
#: on which the gateway pauses it (tested).
SHUTTING_DOWN = "worker is shutting down, not serving; retry on another worker"
WARMING_UP = "worker is warming up, not serving yet; retry on another worker"
T = TypeVar("T")
Clock = Callable[[], float]


@dataclass(eq=False)
class _Job:
    """One accepted request on its way through the batcher."""

    prepared: Prepared
    future: asyncio.Future[tuple[Detections, float, float, int]]
    accepted: float


@dataclass
class WorkerService(service_pb2_grpc.WorkerServicer):
    """``Worker`` servicer, scheduler and lifecycle of one worker process."""

    settings: WorkerSettings
    runner: ModelRunner
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    clock: Clock = time.monotonic
    health: HealthServicer = field(default_factory=HealthServicer)

    def __post_init__(self) -> None:
        policy = self.settings.batching.policy()
        if self.settings.batching.mode == "off":
            policy = policy.unbatched()
        self.batcher: Batcher[_Job] = Batcher(policy, pixel_cost=self.runner.pixel_cost)
        self.batching: BatchingDecision | None = None  # set by warmup()
        self._infer_pool = ThreadPoolExecutor(1, thread_name_prefix="ew-infer")
        self._decode_pool = ThreadPoolExecutor(
            self.settings.decode_threads, thread_name_prefix="ew-decode"
        )
        self.decode_budget = PixelBudget(self.settings.decode_pixel_budget,
                                         self.settings.batching.max_queue_size)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        self._serving = False
        self._draining = False
        self._scheduler: asyncio.Task[None] | None = None
        # The health servicer starts with "" = SERVING: not true until warm-up ran.
        self.health._server_status[""] = health_pb2.HealthCheckResponse.NOT_SERVING
        self.health._server_status[SERVICE_NAME] = health_pb2.HealthCheckResponse.NOT_SERVING

    # -- lifecycle ----------------------------------------------------------------
    async def start(self) -> None:
        """Start the scheduler, warm the model up, then report SERVING."""
        self._scheduler = asyncio.create_task(self._schedule_guarded(), name="ew-batch-scheduler")
        await self.warmup()
        self._serving = True
        self.metrics.serving.set(1)
        for svc in ("", SERVICE_NAME):
            await self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)

    async def warmup(self) -> None:
        """Run dummy batches at every size the batcher may form first, then decide batching.

        ONNX Runtime (and TensorRT) are slow on the first call of each new
        shape (Triton #7776, docs/design/batching.md#warm-up): sizes 1, each preferred size and the max are
        run ``warmup_rounds`` times, round by round so that the sizes' timings see the same
        load on the machine; all but the first round seed the batch-time and capacity
        estimates, and their fastest time per size decides whether batching pays
        (docs/design/batching.md#batching-where-it-pays).
        """
        pol = self.batcher.policy
        sizes = sorted({1, *pol.preferred_batch_sizes, pol.max_batch_size})
        rounds = self.settings.warmup_rounds
        if self.settings.batching.mode == "auto" and rounds and len(sizes) > 1:
            rounds = max(rounds, AUTO_WARMUP_ROUNDS)
        dummy = await self._in_pool(self._decode_pool, self.runner.dummy)
        fastest: dict[int, float] = {}
        unbatchable: BatchingDecision | None = None
        for rnd in range(rounds):
            for size in sizes:
                try:  # the first round as one call per size: a batch that fails is not hidden
                    outs, secs = await self._in_pool(self._infer_pool, self.runner.run, [dummy] * size, rnd == 0)
                except Exception as exc:
                    log.debug("warm-up failure", exc_info=exc)
                    if size == 1:
                        raise self.runner.warmup_error(exc) from None
                    failure = batch_failure(self.runner.detector.info, size, exc, "batching.max_batch_size")
                    if self.settings.batching.mode != "auto":  # `on` asked for batches it cannot have
                        raise failure from None
                    log.warning("%s; batching.mode auto serves one image per call", failure)
                    unbatchable = BatchingDecision(False, 0.0, 0, f"batch 1, no queue delay: a batch of {size} "
                                                                  "fails (batching.mode auto)")
                    sizes = [1]
                    break
                bad = [o for o in outs if isinstance(o, Exception)]
                if bad:  # one line naming the model and the cause, not the runtime's traceback
                    log.debug("warm-up failure", exc_info=bad[0])
                    raise self.runner.warmup_error(bad[0]) from None
                if rnd > 0 or rounds == 1:
                    self.batcher.observe(size, secs, size * dummy.meta.src_shape[0] * dummy.meta.src_shape[1],
                                         warmup=True)
                    fastest[size] = min(secs, fastest.get(size, secs))
        probe = await self._in_pool(self._decode_pool, self.runner.native_probe)
        if probe is not None:  # native sizes vary: one that is not a multiple of the true stride fails
            outs, _ = await self._in_pool(self._infer_pool, self.runner.run, [probe])
            if isinstance(outs[0], Exception):
                log.debug("warm-up failure", exc_info=outs[0])
                raise self.runner.warmup_error(outs[0], probe) from None
        b = self.settings.batching
        self.batching = unbatchable or decide_batching(b.mode, fastest, b.min_gain, b.max_batch_size)
        if not self.batching.batch:
            self.batcher.set_policy(pol.unbatched())
        self.metrics.batching.set(1 if self.batching.batch else 0)
        self.metrics.batching_gain.set(self.batching.gain)
        self.metrics.capacity.set(self.batcher.capacity)
        log.info("warm-up done: sizes %s, %.1f images/s; %s", sizes, self.batcher.capacity, self.batching.reason)

    async def drain(self, grace: float) -> None:
        """Stop taking work, finish what was accepted (at most ``grace`` s)."""
        end = self.clock() + grace
        self._draining = True
        self._serving = False
        self.metrics.serving.set(0)
        await self.health.enter_graceful_shutdown()
        self._wake.set()  # queued requests go now, without waiting for their delay
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, end - self.clock()))
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            log.warning("grace period over with %d requests in flight", self._in_flight)

    async def close(self) -> None:
        """Stop the scheduler and the pools (after ``drain``)."""
        if self._scheduler is not None:
            self._scheduler.cancel()
            try:
                await self._scheduler
            except asyncio.CancelledError:
                pass
        # Anything still queued is answered, never left hanging.
        for job in self.batcher.expired(float("inf")):
            self._fail(job, UnavailableError("worker stopped"))
        self._infer_pool.shutdown(wait=False, cancel_futures=True)
        self._decode_pool.shutdown(wait=False, cancel_futures=True)

    # -- RPCs --------------------------------------------------------------------
    async def infer_bytes(self, body: bytes, context: grpc.aio.ServicerContext) -> detect_pb2.DetectResponse:
        """``Infer`` on the serialized request: bytes that are no ``DetectRequest`` get
        INVALID_ARGUMENT. (gRPC's own deserializer answers UNKNOWN, which the gateway counts
        against this worker; the gateway forwards requests it has read only in part,
        docs/design/balancing.md#a-lean-hop.)"""
        try:
            request = detect_pb2.DetectRequest.FromString(body)
        except DecodeError as exc:
            self.metrics.requests.labels(grpc.StatusCode.INVALID_ARGUMENT.name).inc()
            with unless_client_gone("its INVALID_ARGUMENT answer", log):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request is not a serialized DetectRequest: {exc}")
            raise AssertionError("unreachable: abort raises") from exc
        return await self.Infer(request, context)

    async def Infer(
        self, request: detect_pb2.DetectRequest, context: grpc.aio.ServicerContext
    ) -> detect_pb2.DetectResponse:
        t0 = self.clock()
        self._enter()
        code = grpc.StatusCode.OK
        try:
            return await self._infer(request, context)
        except asyncio.CancelledError:
            # gRPC cancels the handler when the caller gives up and when the call's deadline
            # passes (the gateway's hop expiring while the request was decoded or computed, a
            # worker that was stopped): the caller sees DEADLINE_EXCEEDED then, counted as such,
            # also when the caller's copy of the deadline ran out first (DEADLINE_LAG_S)
            left = context.time_remaining()
            code = grpc.StatusCode.DEADLINE_EXCEEDED if left is not None and left <= DEADLINE_LAG_S \
                else grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:  # nothing crashes the daemon: every failure is answered
            st = status.status_of(exc)
            if not isinstance(exc, EdgewiseError):
                log.exception("Infer failed unexpectedly")
            message = str(exc) if isinstance(exc, EdgewiseError) else f"internal error: {exc}"
            code = status.grpc_code(st)
        finally:
            self._leave()
            self.metrics.requests.labels(code.name).inc()
            self.metrics.latency.observe(self.clock() - t0)
        with unless_client_gone(f"its {code.name} answer", log):
            await context.abort(code, message)
        raise AssertionError("unreachable: abort raises")

    async def _infer(
        self, request: detect_pb2.DetectRequest, context: grpc.aio.ServicerContext
    ) -> detect_pb2.DetectResponse:
        if self._draining:
            raise UnavailableError(SHUTTING_DOWN)
        if not self._serving:
            raise UnavailableError(WARMING_UP)
        if not request.HasField("image"):
            raise InvalidInputError("request.image is missing")
        deadline = self._deadline(request, context)
        rank = queue_rank(int(request.priority), request.replay)
        if self.batcher.depth >= self.batcher.policy.max_queue_size:  # shed before decoding
            lowest = self.batcher.lowest_rank()
            if lowest is None or lowest >= rank:  # else one ranked below gives way (_make_room)
                raise OverloadedError(self._full_message())
        arrived = self.clock()
        prepared, decode_s = await self._decode(request.image, deadline)
        loop = asyncio.get_running_loop()
        job = _Job(prepared, loop.create_future(), self.clock())
        h, w = prepared.meta.src_shape[:2]
        if self.batcher.depth >= self.batcher.policy.max_queue_size:
            self._make_room(rank)
        try:
            self.batcher.submit(job, self.clock(), priority=rank, deadline=deadline, pixels=h * w,
                                device=request.device_id)
        except DeadlineExceededError as exc:
            need = self.batcher.need_s(h * w)
            if deadline is None or deadline - need <= arrived:
                raise  # too close already when it came: the client's deadline (TOO_SHORT_MARK)
            if deadline - need - decode_s <= arrived:
                # too close for this image's own decoding (no wait for it): still the client's deadline
                raise DeadlineExceededError(
                    f"decoding the image took {1e3 * decode_s:.0f} ms: {1e3 * (deadline - job.accepted):.1f} ms "
                    f"were left of the deadline, a batch takes about {1e3 * need:.1f} ms; {TOO_SHORT_MARK}"
                ) from exc
            # it came with time enough and spent it waiting for this worker's decoding: load,
            # like a decode budget that stays full (PixelBudget), not a deadline to send later
            raise OverloadedError(
                f"this worker took {1e3 * (job.accepted - arrived):.0f} ms to decode the image (its decode backlog; "
                f"the decode itself {1e3 * decode_s:.0f} ms): {1e3 * (deadline - job.accepted):.1f} ms were left of "
                f"the deadline, a batch takes about {1e3 * need:.1f} ms; {BUSY_MARK}") from None
        self.metrics.queue_depth.set(self.batcher.depth)
        self._wake.set()
        try:
            det, queue_s, compute_s, batch_size = await job.future
        except asyncio.CancelledError:
            if self.batcher.cancel(job):  # the caller went away: free its slot
                self.metrics.queue_depth.set(self.batcher.depth)
            raise
        return detect_pb2.DetectResponse(
            status=detect_pb2.OK,
            device_id=request.device_id,
            stream_id=request.stream_id,
            frame_seq=request.frame_seq,
            trace_id=request.trace_id,
            detections=detections_to_proto(det, self.runner.name),
            model_name=self.runner.name,
            model_version=self.runner.version,
            worker_id=self.settings.worker_id,
            timing=detect_pb2.Timing(
                queue_ms=1e3 * queue_s, compute_ms=1e3 * compute_s, batch_size=batch_size
            ),
        )

    async def _decode(self, image: detect_pb2.Image, deadline: float | None) -> tuple[Prepared, float]:
        """Check the image's header (no decoding), wait for room in the decode budget for the
        pixels it declares, then decode and letterbox it in the decode pool. Returns the image
        and the seconds its decoding itself took (not the wait for the budget or the pool)."""
        header = check_image(image, self.settings.max_image_pixels)
        pixels = 0 if header.encoding == "raw" else header.pixels  # RAW: nothing to inflate
        timeout = None if deadline is None else max(0.0, deadline - self.clock())
        try:
            held = await self.decode_budget.acquire(pixels, timeout)
        except OverloadedError:
            self.metrics.decode_refused.inc()
            raise
        self.metrics.decode_pixels.set(self.decode_budget.in_use)
        job: Future[Prepared] | None = None
        started: list[float] = []  # when a decode thread took the image up

        def prepare() -> Prepared:
            started.append(self.clock())
            return self.runner.prepare(image, self.settings.max_image_pixels)

        try:
            job = self._decode_pool.submit(contextvars.copy_context().run, prepare)
            decoding = asyncio.wrap_future(job)
            prepared = await asyncio.shield(decoding)
            return prepared, self.clock() - started[0]
        except asyncio.CancelledError:
            # The client gave up. A decode still queued is not run; one running in its thread
            # cannot be stopped: its pixels stay counted until it ends, or the budget would let
            # more decode at once than it allows.
            if job is not None and not job.cancel():
                decoding.add_done_callback(functools.partial(self._decode_ended, held))
                held = 0
            raise
        except EdgewiseError:
            raise
        except Exception as exc:
            raise InvalidInputError(f"image could not be decoded: {exc}") from exc
        finally:
            if held:
                self._decode_ended(held)

    def _decode_ended(self, held: int, done: asyncio.Future[Any] | None = None) -> None:
        """A decode's pixels back to the budget; ``done``: the decode of a call given up on,
        whose outcome nobody reads (retrieved here so that asyncio does not log it)."""
        if done is not None and not done.cancelled():
            done.exception()
        self.decode_budget.release(held)
        self.metrics.decode_pixels.set(self.decode_budget.in_use)

    async def Load(self, body: bytes, context: grpc.aio.ServicerContext) -> detect_pb2.WorkerLoad:
        await _parse_load(body, context)  # nothing in it is read: a LoadRequest has no fields yet
        return self.load()

    def load(self) -> detect_pb2.WorkerLoad:
        """Current load, as reported to the gateway and the autoscaler."""
        pol = self.batcher.policy
        return detect_pb2.WorkerLoad(
            worker_id=self.settings.worker_id,
            in_flight=self._in_flight,
            queue_depth=self.batcher.depth,
            capacity=self.batcher.capacity,
            peak_capacity=self.batcher.peak_capacity,
            max_batch_size=pol.max_batch_size,
            max_queue_size=pol.max_queue_size,
            model_name=self.runner.name,
            model_version=self.runner.version,
            serving=self._serving,
            pixel_rate=self.batcher.pixel_rate if self.runner.pixel_cost else 0.0,
            devices_in_turn=True,  # the batcher's rule 2 (cloud.worker.batching._Rank)
        )

    # -- scheduling ----------------------------------------------------------------
    async def _schedule_guarded(self) -> None:
        while True:
            try:
                await self._schedule()
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not leave requests hanging forever
                log.exception("batch scheduler failed; restarting it")
                await asyncio.sleep(0.01)

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            now = self.clock()
            batch = self.batcher.next_batch(now, flush=self._draining)
            self._answer_expired(now)
            if batch is not None:
                await self._run_answering_expired(batch)
                continue
            wake = self.batcher.next_wakeup(now)
            timer = None if wake is None else loop.call_later(max(0.0, wake - now), self._wake.set)
            await self._wake.wait()
            if timer is not None:
                timer.cancel()

    def _answer_expired(self, now: float) -> None:
        for job in self.batcher.expired(now):
            self._fail(job, DeadlineExceededError(f"deadline could not be met: {EXPIRED_MARK}"))
        self.metrics.queue_depth.set(self.batcher.depth)

    async def _run_answering_expired(self, batch: Batch[_Job]) -> None:
        """Run ``batch``; meanwhile answer each queued request as its deadline goes out of reach
        (``Batcher.next_expiry``), unless the batch has stalled (``Batcher.stalled``). Between
        batches only, a request whose deadline passed during a batch was answered by the hop
        running out, which the gateway counts against this worker: a healthy worker overtaken
        by a burst was ejected. A stalled batch (a wedged model) leaves them to their hops, so
        that such a worker is still ejected."""
        loop = asyncio.get_running_loop()
        run = asyncio.ensure_future(self._run(batch))
        run.add_done_callback(lambda _: self._wake.set())
        try:
            while not run.done():
                self._wake.clear()
                now = self.clock()
                timer = None
                if not self.batcher.stalled(now):
                    self._answer_expired(now)
                    due = self.batcher.next_expiry()
                    if due is not None:
                        timer = loop.call_later(max(0.0, due - now), self._wake.set)
                await self._wake.wait()
                if timer is not None:
                    timer.cancel()
            await run
        finally:
            run.cancel()  # the scheduler was cancelled (close): the batch goes with it

    async def _run(self, batch: Batch[_Job]) -> None:
        try:
            await self._compute(batch)
        finally:
            self.batcher.finished()

    async def _compute(self, batch: Batch[_Job]) -> None:
        live = [(j, w) for j, w in zip(batch.items, batch.queue_waits, strict=True) if not j.future.done()]
        if not live:
            return
        try:
            outs, secs = await self._in_pool(self._infer_pool, self.runner.run, [j.prepared for j, _ in live])
        except Exception as exc:
            log.exception("batch of %d failed", len(live))
            for j, _ in live:
                self._fail(j, EdgewiseError(f"inference failed: {exc}"))
            return
        n = len(live)
        pixels = sum(j.prepared.meta.src_shape[0] * j.prepared.meta.src_shape[1] for j, _ in live)
        self.batcher.observe(n, secs, pixels)
        for calls in self.runner.call_sizes([j.prepared for j, _ in live]):  # native: one call per image size
            self.metrics.batch_size.observe(calls)
        self.metrics.compute.observe(secs)
        self.metrics.capacity.set(self.batcher.capacity)
        for (job, wait), out in zip(live, outs, strict=True):
            self.metrics.queue_wait.observe(wait)
            if isinstance(out, Exception):
                self._fail(job, status.error_of(status.status_of(out), f"inference failed for this image: {out}"))
            elif not job.future.done():
                job.future.set_result((out, wait, secs, n))

    # -- helpers -------------------------------------------------------------------
    def _deadline(self, request: detect_pb2.DetectRequest, context: grpc.aio.ServicerContext) -> float | None:
        """The earlier of the request's own deadline and the gRPC deadline, on our clock.
        ``DeadlineExceededError`` naming the clocks when the request's ``deadline_unix_ns`` (wall
        time) has passed on this worker's clock while the call (a relative timeout, which the
        gateway derives from that same deadline on its clock) still has time: the clocks
        disagree, and "send a later deadline" alone sent the client after a deadline that was right."""
        now = self.clock()
        cands: list[float] = []
        remaining = context.time_remaining()
        if remaining is not None:
            cands.append(now + remaining)
        if request.deadline_unix_ns > 0:
            left = (request.deadline_unix_ns - time.time_ns()) / 1e9
            if left <= 0 and remaining is not None and remaining > 0:
                raise DeadlineExceededError(
                    f"the request's deadline_unix_ns is {-left:.3f} s before this worker's clock while its call has "
                    f"{remaining * 1000:.0f} ms left: a clock is off, this worker's or the client's (deadline_unix_ns "
                    f"is wall time; sync them with NTP), or until then {TOO_SHORT_MARK}")
            cands.append(now + left)
        return min(cands) if cands else None

    def _full_message(self) -> str:
        pol = self.batcher.policy
        return f"worker queue full ({self.batcher.depth}/{pol.max_queue_size} requests waiting); {BUSY_MARK}"

    def _make_room(self, rank: int) -> None:
        """In a full queue, the last request to leave of those queued below ``rank`` (a replay, for
        a live request) gives way to one of ``rank`` (``Batcher.displace``); it is answered as refused
        for load, as if it had found the queue full."""
        displaced = self.batcher.displace(rank)
        if displaced is not None:
            full = self.batcher.policy.max_queue_size
            self._fail(displaced, OverloadedError(
                f"worker queue full ({full}/{full} requests waiting) and a request served before this one took its "
                f"place (a replay gives way to live requests); {BUSY_MARK}"))
            self.metrics.queue_depth.set(self.batcher.depth)

    def _fail(self, job: _Job, failure: EdgewiseError) -> None:
        if not job.future.done():
            job.future.set_exception(failure)

    def _enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.set(self._in_flight)

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
        self.metrics.in_flight.set(self._in_flight)

    async def _in_pool(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(
            pool, functools.partial(ctx.run, fn, *args)
        )


@dataclass
class WorkerServer:
    """A bound gRPC server with its ``WorkerService`` and metrics endpoint."""

    grpc_server: grpc.aio.Server
    service: WorkerService
    port: int
    metrics_port: int | None = None

    async def bind(self) -> None:
        """Start answering RPCs (health NOT_SERVING until ``service.start``) and metrics."""
        await self.grpc_server.start()
        st = self.service.settings
        if st.metrics_port >= 0:
            try:
                self.metrics_port = await socket_port_async(
                    lambda: self.service.metrics.serve_http(st.metrics_host, st.metrics_port),
                    format_address(st.metrics_host, st.metrics_port), "metrics_host/metrics_port")
            except BaseException:
                await self.grpc_server.stop(0)  # nothing served yet: close before the error leaves the loop
                raise

    async def start(self) -> None:
        """``bind``, warm up, then report SERVING; a failed warm-up stops what was started."""
        await self.bind()
        try:
            await self.service.start()
        except BaseException:
            await self.stop(0)
            raise

    async def stop(self, grace: float | None = None) -> None:
        """Drain (NOT_SERVING, finish in-flight), then stop; all within ``grace`` s."""
        g = self.service.settings.grace_s if grace is None else grace
        end = time.monotonic() + g
        await self.service.drain(g)
        # Infer calls are done (or the grace is spent); what is left are health
        # Watch streams and quick Check/Load calls: don't let a watcher hold the
        # exit until the end of the grace period.
        await self.grpc_server.stop(min(STREAM_GRACE_S, max(0.0, end - time.monotonic())))
        await self.service.close()
        await self.service.metrics.close()
        self.service.runner.close()


_parse_load = parsed(detect_pb2.LoadRequest, "edgewise.v1.LoadRequest")


def create_server(settings: WorkerSettings, runner: ModelRunner | None = None) -> tuple[WorkerServer, int]:
    """Load the model and bind the gRPC port (0 = any free port); call inside a running loop.

    Returns the server (not started: ``await server.start()``) and the bound port.
    """
    settings.validate()
    runner = runner if runner is not None else ModelRunner.from_settings(settings)
    service = WorkerService(settings, runner)
    limit = settings.max_message_bytes
    server = grpc.aio.server(options=server_options(limit))
    handlers = {
        "Infer": grpc.unary_unary_rpc_method_handler(  # parses the request itself: infer_bytes
            service.infer_bytes, response_serializer=detect_pb2.DetectResponse.SerializeToString),
        "Load": grpc.unary_unary_rpc_method_handler(  # parses the request itself: cloud.binding.parsed
            service.Load, response_serializer=detect_pb2.WorkerLoad.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    add_health(service.health, server)
    # an IPv6 host in brackets (``[::1]:port``): ``::1:0`` is no address gRPC can bind
    port = grpc_port(server, format_address(settings.host.strip("[]"), settings.port), "host/port")
    return WorkerServer(server, service, port), port


async def serve(settings: WorkerSettings, announce: Callable[[str], None] | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT (or SIGHUP: it reloads nothing, so it drains as on
    SIGTERM, with a WARNING), then drain within ``settings.grace_s``; exit status.

    ``announce`` receives machine-readable lines (default: print to stdout):
    ``EDGEWISE_WORKER_LISTENING port=N metrics_port=M worker_id=ID`` once bound,
    ``EDGEWISE_WORKER_SERVING port=N`` after warm-up.
    """
    say = announce or (lambda line: print(line, flush=True, file=sys.stdout))
    server, port = create_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def hangup() -> None:  # a reload asked of a process that reloads nothing (or a closed terminal)
        if not stop.is_set():
            log.warning("worker %s: SIGHUP: a worker reloads nothing (its settings are read at start); it drains "
                        "and exits as on SIGTERM: start it again to apply new settings", settings.worker_id)
        stop.set()

    # SIGHUP's default ended the worker at once, dropping the requests in its queue and model
    loop.add_signal_handler(signal.SIGHUP, hangup)
    await server.bind()
    say(f"{LISTENING_TAG} port={port} metrics_port={-1 if server.metrics_port is None else server.metrics_port} "
        f"worker_id={settings.worker_id}")
    warm = asyncio.create_task(server.service.start(), name="ew-warmup")
    stopped = asyncio.create_task(stop.wait(), name="ew-stop-signal")
    try:
        await asyncio.wait({warm, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if warm.done():
            warm.result()  # a failed warm-up is an error exit (after the clean stop below)
            say(f"{SERVING_TAG} port={port}")
            log.info("worker %s serving on port %d", settings.worker_id, port)
            await stopped
        else:
            warm.cancel()
    finally:
        stopped.cancel()
        log.info("worker %s draining (grace %.1f s)", settings.worker_id, settings.grace_s)
        t0 = time.monotonic()
        await server.stop(settings.grace_s)
        log.info("worker %s stopped after %.2f s", settings.worker_id, time.monotonic() - t0)
    return 0
