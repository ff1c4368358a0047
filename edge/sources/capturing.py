"""Async capture shell: runs a blocking ``FrameSource`` in its own thread, paces it,
reconnects live streams with exponential backoff and feeds a bounded queue.
A looping file or folder that is away for a moment (``SourceAwayError``: a sync job
re-copying it) backs off the same way and is read again; it does not end.

States (connecting / streaming / backoff / ended) are logged on every change and
reported through ``on_state``; corrupt frames and drops are counted, never fatal.
Corrupt frames are logged at most 5 times per 10 s per stream (then with the
count held back). A finite source (folder, video file) skips them and reads straight on
(a skipped frame does not use up the ``fps`` period: the next read takes it);
if it loops, only a whole pass (``pass_length`` frames, when the source knows it) without one good
frame backs off like a reconnect, so a looping folder of bad files cannot spin a CPU
core on warnings while a folder that starts with bad files is not held up. A live
source, or one that does not know its pass, backs off after ``CORRUPT_RUN_LIMIT`` in a
row. A frame refused by a limit (``refused``: an image over the pixel limit) is logged as
refused, not as corrupt. A change of resolution is logged at most once a minute.
Each frame is stamped with when it was taken (``edge.sources.clock``) beside when it
was read; a source clock that runs too slow is given up for read times, logged
once. A live source may count corrupt frames itself (``corrupt``: the latest-frame
reader skips a part whose grab failed and reads on); they are counted and logged
here like the ones ``read`` raises for. When a live stream goes down (it failed or stalled) the frames still
queued from before are discarded and counted (``on_stale``), and ``cut_seq`` tells
the pipeline which frames in flight are from before the outage: none of them is
emitted after it is detected (docs/design/edge-runtime.md#live-sources).
Bounded queues follow docs/design/conventions.md#bounded-queues (roboflow ``video_source.py``, with a
stop event so shutdown cannot hang). Callers: ``edge.pipeline``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Deque, Optional, Tuple

from edge.sources.base import (
    CorruptFrameError,
    Frame,
    FrameSource,
    SourceAwayError,
    SourceError,
    SourceState,
)
from edge.sources.clock import SourceClock
from edgewise.observability import LogThrottle

log = logging.getLogger(__name__)


#: Corrupt frames in a row after which a stream backs off instead of reading on at once.
CORRUPT_RUN_LIMIT = 8
#: Per stream, at most ``CORRUPT_LOG_BURST`` "corrupt frame" lines per this many seconds.
CORRUPT_LOG_INTERVAL_S = 10.0
CORRUPT_LOG_BURST = 5
#: Per stream, at most one "resolution changed" line per this many seconds.
SHAPE_LOG_INTERVAL_S = 60.0


class FrameQueue:
    """Bounded FIFO of frames with a named full policy: ``drop_oldest`` or ``wait``.

    ``ready`` is shared between the queues of one pipeline so the batcher can wait
    for a frame from any stream.
    """

    def __init__(self, maxsize: int, policy: str, ready: asyncio.Event) -> None:
        if maxsize < 1 or policy not in ("drop_oldest", "wait"):
            raise ValueError(f"bad queue settings {maxsize} {policy}")
        self.maxsize = maxsize
        self.policy = policy
        self.items: Deque[Frame] = collections.deque()
        self.ready = ready
        self.space = asyncio.Event()
        self.space.set()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.items)

    async def put(self, frame: Frame, stop: asyncio.Event) -> Optional[Frame]:
        """Queue ``frame``; returns the frame dropped to make room, if any.
        Under ``wait`` blocks until there is room or ``stop`` is set; a frame read before the
        stop is then queued over the bound (one per stream at most: capture ends), so the
        stop's drain infers it or counts it as a ``shutdown`` drop instead of losing it unseen."""
        dropped = None
        while len(self.items) >= self.maxsize:
            if self.policy == "drop_oldest":
                dropped = self.items.popleft()
                self.dropped += 1
                break
            self.space.clear()
            waiter = asyncio.ensure_future(self.space.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
            if stop.is_set():
                break
        self.items.append(frame)
        self.ready.set()
        return dropped

    def purge(self) -> int:
        """Discard every queued frame; returns how many."""
        n = len(self.items)
        self.items.clear()
        self.space.set()
        return n

    def get_nowait(self) -> Optional[Frame]:
        if not self.items:
            return None
        f = self.items.popleft()
        self.space.set()
        return f


class Capturer:
    """One stream's capture loop."""

    def __init__(
        self,
        stream_id: str,
        source: FrameSource,
        queue: FrameQueue,
        fps: float = 0.0,
        max_frames: int = 0,
        reconnect_min_s: float = 0.5,
        reconnect_max_s: float = 30.0,
        on_state: Optional[Callable[[str, SourceState], None]] = None,
        on_corrupt: Optional[Callable[[str], None]] = None,
        on_drop: Optional[Callable[[str], None]] = None,
        start_seq: int = 0,
        on_truncated: Optional[Callable[[str], None]] = None,
        on_skipped: Optional[Callable[[str, int], None]] = None,
        on_stale: Optional[Callable[[str, int], None]] = None,
    ) -> None:
        self.stream_id = stream_id
        self.source = source
        self.queue = queue
        self.fps = fps
        self.max_frames = max_frames
        self.reconnect_min_s = reconnect_min_s
        self.reconnect_max_s = reconnect_max_s
        self.on_state = on_state
        self.on_corrupt = on_corrupt
        self.on_drop = on_drop
        self.on_truncated = on_truncated
        self.on_skipped = on_skipped
        self.on_stale = on_stale
        self.truncated = 0
        self.skipped = 0
        self.cut_seq = start_seq
        """Frames with a lower ``seq`` were read before the stream's last outage."""
        self.clock = SourceClock()
        self.shape: Optional[Tuple[int, ...]] = None
        self.state: Optional[SourceState] = None
        self.seq = start_seq
        self.frames = 0
        self.corrupt = 0
        self.corrupt_run = 0  # corrupt frames since the last good one
        self._corrupt_delay = reconnect_min_s
        self._away_delay = reconnect_min_s
        self._run_at_backoff = 0  # corrupt_run when the stream last backed off for it
        self._shape_log = LogThrottle(SHAPE_LOG_INTERVAL_S)
        self._corrupt_log = LogThrottle(CORRUPT_LOG_INTERVAL_S, CORRUPT_LOG_BURST)
        self._source_corrupt = 0  # the source's own corrupt count, as last seen
        self._slow_logged = False
        self.reconnects = 0
        #: the stream backed off (an open, read or stall failure, a looping file or folder away
        #: for a moment, corrupt frames in a row) or ended failing (``_failed``) and has not
        #: delivered a frame since: ``/healthz`` says degraded while any stream is down. Set in
        #: ``_set_state`` and ``_failed``, cleared by a frame.
        self.down = False
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"capture-{stream_id}")

    def __repr__(self) -> str:
        return f"<Capturer {self.stream_id} state={self.state and self.state.value} frames={self.frames}>"

    def _set_state(self, state: SourceState, why: str = "") -> None:
        if state is SourceState.BACKOFF:
            self.down = True  # cleared by the next frame delivered, not by leaving the back-off
        if state is self.state:
            return
        self.state = state
        level = logging.WARNING if state is SourceState.BACKOFF else logging.INFO  # an outage
        log.log(level, "stream %s: %s%s", self.stream_id, state.value, f" ({why})" if why else "")
        if self.on_state is not None:
            self.on_state(self.stream_id, state)

    def _failed(self, why: str) -> None:
        """A finite source that cannot go on (a video that cannot be opened or read, none of its
        frames good) ends down: a restart would not bring it back either, and ``/healthz``
        said "ok" beside the streams that work while this one never delivered a frame."""
        log.error("stream %s: %s", self.stream_id, why)
        self.down = True

    async def _call(self, fn: Callable[[], object]) -> object:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn)

    async def run(self, stop: asyncio.Event) -> None:
        """Capture until the source ends, ``max_frames`` is reached or ``stop`` is set."""
        backoff = self.reconnect_min_s
        waker = asyncio.ensure_future(self._interrupt_on(stop))
        try:
            while not stop.is_set():
                self._set_state(SourceState.CONNECTING)
                try:
                    await self._call(self.source.open)
                except Exception as exc:
                    why = str(exc) if isinstance(exc, SourceError) else self._unexpected("open", exc)
                    if stop.is_set():  # an open the stop waited for: not an outage, no retry
                        log.debug("stream %s: open ended by the stop: %s", self.stream_id, why)
                        break
                    if not self.source.live:
                        self._failed(why)
                        break
                    backoff = await self._backoff(stop, backoff, why)
                    continue
                self._set_state(SourceState.STREAMING)
                reason = await self._stream(stop)
                try:
                    await self._call(self.source.close)
                except Exception as exc:  # the next open makes a new connection all the same
                    self._unexpected("close", exc)
                if reason is None:  # ended or stopped
                    break
                backoff = self.reconnect_min_s if self._streamed_ok else backoff
                backoff = await self._backoff(stop, backoff, reason)
        finally:
            waker.cancel()
            if self._corrupt_log.held:  # said before the stream ends: none goes unreported
                log.warning("stream %s: %d more corrupt frame(s) skipped and not logged; %d corrupt in all",
                            self.stream_id, self._corrupt_log.held, self.corrupt)
                self._corrupt_log.held = 0
            self._set_state(SourceState.ENDED)
            try:
                await self._call(self.source.close)
            except Exception:  # pragma: no cover - best effort on shutdown
                log.exception("stream %s: close failed", self.stream_id)
            self.executor.shutdown(wait=False)

    def _unexpected(self, call: str, exc: Exception) -> str:
        """A source's ``open`` or ``close`` raised what is not a ``SourceError`` (a bug in a backend,
        a synthetic scene's difficulty file gone since the settings were read): said now, with
        its traceback, and handled as that call's failure. It ended the capture task instead, the
        stream "ended" with ``/healthz`` saying ok, said only once the daemon stopped (found by
        a review). Returns why, for the state change."""
        why = f"{call} failed: {exc!r}"
        if call == "close":
            log.error("stream %s: %s", self.stream_id, why, exc_info=exc)
        else:  # the state change or ``_failed`` says why; the traceback is said here
            log.error("stream %s: unexpected error from the source's %s", self.stream_id, call, exc_info=exc)
        return why

    async def _interrupt_on(self, stop: asyncio.Event) -> None:
        """On stop, wake a read blocked in the capture thread (a frozen camera would hold it
        for the backend's read timeout or its stall timeout). An open in progress is not
        interrupted: it ends within ``open_timeout_s``."""
        await stop.wait()
        try:
            self.source.interrupt()
        except Exception:  # pragma: no cover - best effort on shutdown
            log.exception("stream %s: interrupt failed", self.stream_id)

    async def _backoff(self, stop: asyncio.Event, delay: float, why: str) -> float:
        self.reconnects += 1
        self._set_state(SourceState.BACKOFF, f"{why}; retrying in {delay:.1f} s")
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except asyncio.TimeoutError:
            pass
        return min(delay * 2.0, self.reconnect_max_s)

    def _check_skipped(self) -> None:
        n = self.source.skipped - self.skipped
        if n > 0:
            self.skipped += n
            if self.on_skipped is not None:
                self.on_skipped(self.stream_id, n)

    def _check_source_corrupt(self) -> None:
        # Corrupt frames a live source skipped on its own (a failed grab, the stream went on).
        n = int(getattr(self.source, "corrupt", 0)) - self._source_corrupt
        if n <= 0:
            return
        self._source_corrupt += n
        self.corrupt += n
        if self.on_corrupt is not None:
            for _ in range(n):
                self.on_corrupt(self.stream_id)
        held = self._corrupt_log.allow()
        if held is not None:
            more = f" ({held} more corrupt frames not logged)" if held else ""
            log.warning("stream %s: %d corrupt frame(s) skipped by the reader, the stream goes on%s",
                        self.stream_id, n, more)

    def _went_down(self, why: str) -> str:
        """A live stream failed or stalled: frames from before it must not be emitted."""
        self.cut_seq = self.seq
        n = self.queue.purge()
        if n:
            log.warning("stream %s: %d queued frame(s) from before the outage discarded", self.stream_id, n)
            if self.on_stale is not None:
                self.on_stale(self.stream_id, n)
        return why

    def _check_shape(self, shape: Tuple[int, ...]) -> None:
        if self.shape is not None and shape != self.shape:
            held = self._shape_log.allow()
            if held is not None:
                more = f" ({held} more changes not logged)" if held else ""
                log.warning("stream %s: resolution changed from %dx%d to %dx%d%s", self.stream_id,
                            self.shape[1], self.shape[0], shape[1], shape[0], more)
        self.shape = shape

    def _count_corrupt(self) -> None:
        self.corrupt += 1
        self.corrupt_run += 1
        if self.on_corrupt is not None:
            self.on_corrupt(self.stream_id)

    def _barren(self) -> bool:
        """Whether the corrupt frames in a row call for a back-off: for a finite source that
        knows its pass, a whole pass of them since the last back-off; else ``CORRUPT_RUN_LIMIT``.
        One that does not loop never backs off (it ends after its one pass)."""
        if not self.source.live and not getattr(self.source, "loop", True):
            return False
        n = 0 if self.source.live else int(getattr(self.source, "pass_length", 0) or 0)
        if n <= 0:
            return self.corrupt_run >= CORRUPT_RUN_LIMIT
        return self.corrupt_run - self._run_at_backoff >= n

    async def _corrupt_frame(self, stop: asyncio.Event, why: str, refused: bool = False) -> bool:
        """Count a corrupt (or ``refused``) frame and log it (at most ``CORRUPT_LOG_BURST`` lines per
        ``CORRUPT_LOG_INTERVAL_S`` per stream, then with how many were not logged); when
        ``_barren``, back off (``reconnect_min_s`` doubling to ``reconnect_max_s``) instead of
        spinning on a folder of bad files. True when ``stop`` was set meanwhile."""
        self._count_corrupt()
        held = self._corrupt_log.allow()
        if held is not None:
            more = f" ({held} more corrupt frames not logged)" if held else ""
            what = "frame refused by a limit and skipped" if refused else "corrupt frame skipped"
            log.warning("stream %s: %s: %s%s", self.stream_id, what, why, more)
        if not self._barren():
            return False
        self._run_at_backoff = self.corrupt_run
        delay = self._corrupt_delay
        self._corrupt_delay = min(delay * 2.0, self.reconnect_max_s)
        self._set_state(SourceState.BACKOFF, f"{self.corrupt_run} corrupt frames in a row; "
                                             f"next read in {delay:.1f} s")
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
            return True
        except asyncio.TimeoutError:
            pass
        self._set_state(SourceState.STREAMING)
        return False

    def _check_truncated(self) -> None:
        # A video shorter than its header says (logged by the source) is counted here.
        while self.truncated < self.source.truncated:
            self.truncated += 1
            if self.on_truncated is not None:
                self.on_truncated(self.stream_id)

    async def _stream(self, stop: asyncio.Event) -> Optional[str]:
        """Read frames; returns None at the end, or why a live stream dropped."""
        self._streamed_ok = False
        self.clock.reset()  # a new connection: its timestamps start afresh
        period = 1.0 / self.fps if self.fps > 0 else 0.0
        next_t = time.monotonic()
        while not stop.is_set():
            if self.max_frames and self.frames >= self.max_frames:
                return None
            if period:
                delay = next_t - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=delay)
                        return None
                    except asyncio.TimeoutError:
                        pass
                slot = next_t
                next_t = max(next_t + period, time.monotonic() - period)
            t0 = time.monotonic()
            try:
                img = await self._call(self.source.read)
            except CorruptFrameError as exc:
                if await self._corrupt_frame(stop, str(exc), bool(getattr(exc, "refused", False))):
                    return None
                if period:  # a skipped frame delivered nothing: the next read may take its period
                    next_t = slot
                continue
            except SourceAwayError as exc:  # a looping file or folder away for a moment
                self._away_delay = await self._backoff(stop, self._away_delay, str(exc))
                if stop.is_set():
                    return None
                self._set_state(SourceState.CONNECTING)  # read again: streaming at the next frame
                continue
            except SourceError as exc:
                if stop.is_set():  # interrupted by the stop, not a failure
                    return None
                if self.source.live:
                    self._check_skipped()
                    self._check_source_corrupt()
                    return self._went_down(str(exc))
                self._failed(str(exc))
                return None
            except Exception as exc:  # a decoder bug must not kill the daemon
                log.exception("stream %s: read failed: %s", self.stream_id, exc)
                if self.source.live:
                    self._count_corrupt()
                    return self._went_down(f"read failed: {exc}")
                if await self._corrupt_frame(stop, f"read failed: {exc}"):
                    return None
                continue
            self._check_truncated()
            self._check_skipped()
            self._check_source_corrupt()
            if img is None:
                if not self.source.live and self.frames == 0 and self.corrupt:
                    self._failed(f"ended without one good frame ({self.corrupt} corrupt or refused)")
                return None
            self._streamed_ok = True
            self.down = False
            self._set_state(SourceState.STREAMING)
            self.corrupt_run = self._run_at_backoff = 0
            self._corrupt_delay = self._away_delay = self.reconnect_min_s
            mono_ns = time.monotonic_ns()
            now_mono = mono_ns / 1e9
            read_ns = time.time_ns()
            capture_ns, clock = self.clock.stamp(self.source.last_source_ms, read_ns, mono_ns)
            if self.clock.slow is not None and not self._slow_logged:
                self._slow_logged = True
                log.warning("stream %s: source timestamps not used, frames are stamped with their read "
                            "time from now on: %s", self.stream_id, self.clock.slow)
            self._check_shape(img.shape)  # type: ignore[attr-defined]
            frame = Frame(
                stream_id=self.stream_id,
                seq=self.seq,
                image=img,  # type: ignore[arg-type]
                capture_unix_ns=capture_ns,
                capture_mono=now_mono,
                read_ms=(now_mono - t0) * 1000.0,
                read_unix_ns=read_ns,
                clock=clock,
                source_file=self.source.last_file,
                source_index=self.source.last_index,
                # paced by fps, a file is replayed as a camera at that rate: the daemon's clock
                media_s=None if period else self.source.last_media_s,
            )
            self.seq += 1
            self.frames += 1
            dropped = await self.queue.put(frame, stop)
            if dropped is not None and self.on_drop is not None:
                self.on_drop(self.stream_id)
        return None
