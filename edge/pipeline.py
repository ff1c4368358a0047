"""The edge pipeline: capture → preprocess → infer → postprocess → hardness →
policy → sinks / escalation, as an asyncio shell around one inference thread.
A frame that is not escalated is published with the boxes carried from its stream's
latest cloud answer (``edge.carrying``), until its stream's next outage (its first frame
after one also starts the stream's tracker and motion model afresh, ``Decider.resumed``).

Frames wait in one bounded queue per stream (named drop policy, see
``edge.sources.capturing.FrameQueue``). The batcher takes the frames that are
ready across streams, round-robin, up to ``max_batch``, and runs preprocess +
infer + postprocess in a single worker thread; while that thread works on batch
k+1 the event loop decides and emits batch k (a bounded hand-off of 2 batches).
Decisions happen in the loop thread, frame after frame, so a policy swap lands
between two frames. Every stage's latency is measured and recorded per frame.
Style: docs/design/conventions.md#graceful-shutdown and
docs/design/conventions.md#bounded-queues (guarded tasks, executor for blocking work,
bounded queues, producers observe the stop event). Callers: ``edge.daemon``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from edge.carrying import publish
from edge.deciding import Decider, Verdict
from edge.escalating import Escalating
from edge.framememory import FrameMemory
from edge.payloads import detections_json
from edge.records import FrameRecord
from edge.sources.base import Frame
from edge.sources.capturing import Capturer, FrameQueue
from edgewise.carrying import Looked
from edgewise.hardness.signals import RECORD_DECIMALS
from edgewise.observability import LogThrottle

log = logging.getLogger(__name__)

Batch = Tuple[List[Frame], List[Any], Dict[str, float]]


def run_detector(detector: Any, frames: Sequence[Frame]) -> Tuple[List[Any], Dict[str, float]]:
    """Preprocess, infer and postprocess one batch (runs in the inference thread)."""
    t0 = time.perf_counter()
    batch, metas = detector.preprocess([f.image for f in frames])
    t1 = time.perf_counter()
    raw = detector.infer(batch)
    t2 = time.perf_counter()
    dets = detector.postprocess(raw, metas)
    t3 = time.perf_counter()
    n = max(1, len(frames))
    # Per-frame share of the batch's stage times.
    return list(dets), {
        "preprocess": (t1 - t0) * 1000.0 / n,
        "infer": (t2 - t1) * 1000.0 / n,
        "postprocess": (t3 - t2) * 1000.0 / n,
    }


class FrameRate:
    """Frames/s of one stream over a sliding window, as of any moment (``rate``: the
    ``edgewise_edge_fps`` gauge reads it at each scrape, from the metrics server's thread).

    The frames of the last ``window_s`` over the time they span, counted from the newest
    frame before the window (at least the last two frames are kept), so a stream slower than
    one frame per window shows its rate rather than 0. Once the stream has been silent for
    longer than its mean frame interval, that silence counts as its latest interval, so the
    rate of a stream that stopped (ended, down, a wedged pipeline) falls towards 0 instead of
    showing its last value for ever."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self.times: Deque[float] = collections.deque()
        self.lock = threading.Lock()

    def tick(self, now: float) -> None:
        """A frame at ``now``."""
        with self.lock:
            self.times.append(now)
            while len(self.times) > 2 and now - self.times[1] >= self.window_s:
                self.times.popleft()

    def rate(self, now: Optional[float] = None) -> float:
        """Frames/s at ``now`` (``time.monotonic()`` when None); 0 before two frames."""
        if now is None:
            now = time.monotonic()
        with self.lock:
            times = self.times
            first = 0
            while len(times) - first > 2 and now - times[first + 1] >= self.window_s:
                first += 1  # out of the window by now: the next frame is in or before it
            n = len(times) - first
            if n < 2:
                return 0.0
            start, last = times[first], times[-1]
        span = last - start
        if span <= 0:
            return 0.0
        silence = now - last
        interval = span / (n - 1)
        if silence > interval:  # nothing since: the current interval is at least this long
            span += silence - interval
        return (n - 1) / span


def _held_back(held: int) -> str:
    return f" ({held} more such failures in the last minute not logged)" if held else ""


class Pipeline:
    """Runs capturers, the batcher and the decider/emitter until stopped or all sources end."""

    def __init__(
        self,
        device_id: str,
        detector: Any,
        capturers: List[Capturer],
        queues: Dict[str, FrameQueue],
        ready: asyncio.Event,
        decider: Decider,
        escalating: Optional[Escalating],
        write: Callable[[FrameRecord], None],
        metrics: Any,
        max_batch: int = 4,
        memory: Optional[FrameMemory] = None,
    ) -> None:
        self.device_id = device_id
        self.detector = detector
        self.capturers = capturers
        self.queues = queues
        self.ready = ready
        self.decider = decider
        self.escalating = escalating
        self.write = write
        self.metrics = metrics
        self.max_batch = max(1, max_batch)
        self.memory = memory  # warned once when the frames held could exhaust the device
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="inference")
        self.rates: Dict[str, FrameRate] = {sid: FrameRate() for sid in queues}
        for sid, rate in self.rates.items():  # read at each scrape: a stream that stops falls to 0
            metrics.fps.labels(sid).set_function(rate.rate)
        self.by_stream: Dict[str, Capturer] = {c.stream_id: c for c in capturers}
        #: per stream, the capture shell's ``cut_seq`` as of its last frame emitted: a new one is an outage
        self._cuts: Dict[str, int] = {}
        #: per stream, the decision clock as of its last frame, and where a video file's timeline starts on it
        self._decided: Dict[str, float] = {}
        self._media_origin: Dict[str, float] = {}
        self.frames_done = 0
        self.stop_capture = asyncio.Event()
        self.sources_done = asyncio.Event()
        #: after ``stop``: the monotonic time from which frames still queued are dropped, not inferred
        self.drop_queued_at: Optional[float] = None
        self._rr = 0
        #: the last inference call failed (``/healthz`` is degraded until one succeeds): a model that
        #: fails on every batch processed nothing while the daemon said ``ok``
        self.inference_failing = False
        #: a batch is at the model (its call has not returned); with ``waiting``, what tells a
        #: wedged pipeline from a stream that sends nothing for a while (``EdgeDaemon._note_progress``)
        self.inferring = False
        # a failure that repeats on every batch (or frame) is a traceback each time: a few a minute
        self._infer_log = LogThrottle(60.0, burst=3)
        self._emit_log = LogThrottle(60.0, burst=3)

    # ------------------------------------------------------------------ batching
    def _take_batch(self) -> List[Frame]:
        ids = list(self.queues)
        frames: List[Frame] = []
        progressed = True
        while len(frames) < self.max_batch and progressed:
            progressed = False
            for k in range(len(ids)):
                sid = ids[(self._rr + k) % len(ids)]
                f = self.queues[sid].get_nowait()
                if f is not None:
                    if self.memory is not None:
                        self.memory.seen(sid, f.image.shape)
                    frames.append(f)
                    progressed = True
                    if len(frames) >= self.max_batch:
                        break
        self._rr = (self._rr + 1) % max(1, len(ids))
        return frames

    async def _batcher(self, out: asyncio.Queue[Optional[Batch]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self.drop_queued_at is not None and time.monotonic() >= self.drop_queued_at:
                    self._drop_queued()
                    return
                frames = self._take_batch()
                if not frames:
                    if self.sources_done.is_set():
                        return
                    self.ready.clear()
                    # Re-check after clearing: a put between take and clear is not lost.
                    frames = self._take_batch()
                    if not frames:
                        waiter = asyncio.ensure_future(self.ready.wait())
                        done = asyncio.ensure_future(self.sources_done.wait())
                        left = None if self.drop_queued_at is None else max(0.0, self.drop_queued_at - time.monotonic())
                        try:
                            await asyncio.wait([waiter, done], timeout=left, return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            waiter.cancel()
                            done.cancel()
                        continue
                dequeued = time.monotonic()
                self.inferring = True
                try:
                    dets, stage_ms = await loop.run_in_executor(self.executor, run_detector, self.detector, frames)
                except Exception as exc:
                    self.inference_failing = True
                    held = self._infer_log.allow()
                    if held is not None:
                        log.exception("inference failed on a batch of %d frames; frames dropped%s", len(frames),
                                      _held_back(held))
                    for f in frames:
                        self.metrics.drops.labels(f.stream_id, f"inference_error:{type(exc).__name__}").inc()
                    continue
                finally:
                    self.inferring = False
                self.inference_failing = False
                self.metrics.batch_size.observe(len(frames))
                await out.put((frames, dets, dict(stage_ms, dequeued=dequeued)))
        finally:
            await out.put(None)

    def waiting(self) -> bool:
        """A frame is at the model or queued for it: frames should be done, whatever the streams'
        rates (a stream capped at one frame a minute leaves nothing waiting in between)."""
        return self.inferring or any(len(q) for q in self.queues.values())

    # ------------------------------------------------------------------ deciding
    async def _emitter(self, inp: asyncio.Queue[Optional[Batch]]) -> None:
        while True:
            item = await inp.get()
            if item is None:
                return
            frames, dets_list, stage_ms = item
            dequeued = stage_ms.pop("dequeued")
            for frame, dets in zip(frames, dets_list):
                try:
                    self._emit(frame, dets, stage_ms, dequeued)
                except Exception:
                    held = self._emit_log.allow()
                    if held is not None:
                        log.exception("frame %s/%d failed after inference; skipped%s", frame.stream_id, frame.seq,
                                      _held_back(held))
                    self.metrics.drops.labels(frame.stream_id, "emit_error").inc()
            await asyncio.sleep(0)  # let escalation tasks and captures run between batches

    def apply_policy(self, policy: Any) -> int:
        """Swap the policy in; called from the loop thread, so between two frames."""
        gen = self.decider.swap(policy)
        log.info("policy generation %d in force from the next frame", gen)
        return gen

    def _decision_time(self, frame: Frame) -> float:
        """The policy's clock for ``frame``: the daemon's, or, for a video file read as fast as
        it can be (``Frame.media_s``), the recording's own timeline, placed where the stream's
        first such frame was decided. A stream's cooldown, ``maxPerSecond`` and whole-frame
        refresh are times in its recording then: read at 40 fps, a 10 fps recording's 2 per
        second are 20% of its frames, not 5%, as ``edgewise eval`` counts them (frame / fps).
        A stream's clock never goes back (a file replaced by one without a stated rate falls
        back to the daemon's clock behind the timeline)."""
        sid = frame.stream_id
        now = self.decider.clock()
        if frame.media_s is not None:
            now = self._media_origin.setdefault(sid, now - frame.media_s) + frame.media_s
        now = max(now, self._decided.get(sid, now))
        self._decided[sid] = now
        return now

    def _emit(self, frame: Frame, dets: Any, stage_ms: Dict[str, float], dequeued: float) -> None:
        cap = self.by_stream.get(frame.stream_id)
        if cap is not None and frame.seq < cap.cut_seq:
            # Read before its stream went down: never emitted after the outage is known.
            self.metrics.drops.labels(frame.stream_id, "stale").inc()
            return
        if cap is not None and self._cuts.setdefault(frame.stream_id, cap.cut_seq) != cap.cut_seq:
            # The first frame after the stream's outage: not compared with the frames before it
            # (tracker, motion model), and the answers it carried are of those frames
            # (merge.carryFrames counts frames, and frame numbers run on), not carried on.
            self._cuts[frame.stream_id] = cap.cut_seq
            self.decider.resumed(frame.stream_id)
            if self.escalating is not None:
                self.escalating.carrier.forget(frame.stream_id)
        h, w = frame.image.shape[:2]
        policy = self.decider.policy
        carried = None
        looked: Looked = ()
        carry = policy.spec.merge.carry() if policy is not None else None
        if self.escalating is not None and carry is not None:
            # The latest cloud answers' boxes, found again on this frame (edge.carrying): the
            # carry state the policy may read, and what a frame not escalated publishes.
            carried, looked = self.escalating.carrier.in_force(frame.stream_id, frame.seq, frame.image, carry)
        verdict: Verdict = self.decider.decide(frame.stream_id, frame.seq, dets, (w, h),
                                               now=self._decision_time(frame), frame=frame.image, carried=carried)
        d = verdict.decision
        published = dets if carried is None or carry is None or d.escalate else publish(dets, carried, looked, carry)
        lat = {
            "read": round(frame.read_ms, 3),
            "queue": round((dequeued - frame.capture_mono) * 1000.0, 3),
            "preprocess": round(stage_ms["preprocess"], 3),
            "infer": round(stage_ms["infer"], 3),
            "postprocess": round(stage_ms["postprocess"], 3),
            "hardness_policy": round(verdict.cost_ms, 3),
        }
        for stage, ms in lat.items():
            self.metrics.stage.labels(stage).observe(ms / 1000.0)
        age_s = frame.age_s(dequeued)
        self.metrics.frame_age.labels(frame.stream_id).observe(age_s)
        lat["frame_age"] = round(age_s * 1000.0, 3)
        self.metrics.hardness.observe(d.hardness)
        now_mono = time.monotonic()
        lat["total"] = round((now_mono - frame.capture_mono) * 1000.0, 3)
        self.metrics.frame_latency.observe(now_mono - frame.capture_mono)
        self.metrics.frames.labels(frame.stream_id).inc()
        self.rates[frame.stream_id].tick(now_mono)
        self.frames_done += 1
        record = FrameRecord(
            device=self.device_id,
            stream=frame.stream_id,
            frame_seq=frame.seq,
            capture_unix_ns=frame.capture_unix_ns,
            read_unix_ns=frame.read_unix_ns,
            capture_clock=frame.clock,
            emit_unix_ns=time.time_ns(),
            width=w,
            height=h,
            detections=detections_json(published),
            escalated=d.escalate,
            reason=d.reason,
            hardness=round(d.hardness, 4),
            signals=d.signals,  # at the record's precision already (edge.deciding)
            suppressed_by=d.suppressed_by or "",
            detail=d.detail,
            threshold=round(d.threshold, 4),
            origin=d.origin,
            priority=d.priority,
            policy=d.policy_name,
            policy_generation=verdict.policy_generation,
            latency_ms=lat,
            decided_s=verdict.now,
            edge_boxes=verdict.facts.boxes,
            edge_classes=list(verdict.facts.classes),
            edge_max_score=round(verdict.facts.max_score, RECORD_DECIMALS),
            policy_digest=verdict.policy_digest,
            source_file=frame.source_file,
            source_index=frame.source_index,
        )
        if d.escalate and self.escalating is not None and policy is not None:
            record.outcome = "pending"
            self.escalating.carrier.sent(frame.stream_id, frame.seq, frame.image, policy.spec.merge.carry())
            self.escalating.submit(frame, dets, d, policy, record, verdict.motion_blobs)
        else:
            if d.escalate:
                record.outcome = "edge_only"
                record.error = "no transport configured"
            self.write(record)

    # ------------------------------------------------------------------ running
    async def run(self) -> None:
        """Run until every source ended or ``stop()``; returns after the queues drained."""
        handoff: asyncio.Queue[Optional[Batch]] = asyncio.Queue(maxsize=2)
        caps = [asyncio.ensure_future(c.run(self.stop_capture)) for c in self.capturers]

        async def watch_caps() -> None:
            await asyncio.gather(*caps, return_exceptions=True)
            for c, t in zip(self.capturers, caps):
                if t.exception() is not None:
                    log.error("capture of %s crashed: %r", c.stream_id, t.exception())
            self.sources_done.set()

        watcher = asyncio.ensure_future(watch_caps())
        batcher = asyncio.ensure_future(self._batcher(handoff))
        emitter = asyncio.ensure_future(self._emitter(handoff))
        try:
            await asyncio.gather(batcher, emitter)
        finally:
            self.stop_capture.set()
            for t in (batcher, emitter):
                if not t.done():
                    t.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            self.executor.shutdown(wait=True)

    def stop(self, drop_queued_at: Optional[float] = None) -> None:
        """Stop capturing; frames already queued are still processed, until the monotonic
        time ``drop_queued_at`` when given (the daemon's shutdown grace): those still queued
        then are dropped, counted as ``shutdown`` drops, so a stop behind a slow model or
        many streams stays bounded. The first call's time holds."""
        if drop_queued_at is not None and self.drop_queued_at is None:
            self.drop_queued_at = drop_queued_at
        self.stop_capture.set()
        self.ready.set()  # a batcher waiting for frames looks at the time again

    def _drop_queued(self) -> None:
        dropped = {sid: n for sid, n in ((sid, q.purge()) for sid, q in self.queues.items()) if n}
        for sid, n in dropped.items():
            self.metrics.drops.labels(sid, "shutdown").inc(n)
        if dropped:
            log.warning("stopping: %d queued frame(s) dropped, not inferred, after shutdown_grace_s (%s)",
                        sum(dropped.values()), ", ".join(f"{sid}: {n}" for sid, n in sorted(dropped.items())))
