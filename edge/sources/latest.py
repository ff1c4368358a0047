"""Latest-frame capture: drain a live stream at its own rate, decode only what is used.

A live camera does not wait for its reader. Reading it at a capped rate (one
``cap.read()`` per pipeline frame) leaves every unread frame in FFmpeg's or the
driver's buffers, so each frame handed on is older than the one before, without
bound, until the buffers overflow. OpenCV splits ``read()`` into ``grab()`` (take
the next frame from the stream: for FFmpeg demux and decode, for V4L2 dequeue the
driver buffer, for GStreamer pull the appsink sample) and ``retrieve()`` (convert
it to BGR; for an MJPEG camera also the JPEG decode). ``LatestFrameReader`` owns
one ``cv2.VideoCapture`` in its own thread and grabs continuously; ``read()`` asks
for a frame and gets the next one grabbed after the request, retrieved then, so
the frame is at most one source frame period old when handed on. Frames grabbed
while nobody asked are ``skipped`` (counted, never converted). A stream that
delivers no new frame for ``stall_timeout_s`` is reported down by ``read()`` right
away, whatever FFmpeg's own timeouts are, so nothing buffered before an outage is
handed on after it.

A failed ``grab()`` is not the end of a stream by itself: FFmpeg's MJPEG-over-HTTP
demuxer fails one grab for one corrupt or oversized JPEG part and reads the next
part fine. The reader grabs on; failed grabs followed by a good one are counted in
``corrupt`` (skipped, the stream goes on). The stream is reported down only when
the failure is sustained: ``GRAB_FAIL_RUN_LIMIT`` failed grabs in a row (a closed
connection fails every grab at once) or no good grab for ``stall_timeout_s``.

The capture object is only ever touched by the reader thread (OpenCV captures are
not thread-safe); ``close()`` asks the thread to stop and returns without waiting
for a blocked ``grab()`` longer than ``wait_s``: the thread releases the capture
when the grab returns (bounded by the backend's read timeout). See
docs/design/edge-runtime.md#live-sources. Callers: ``edge.sources.opencv``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Tuple

from edge.sources.base import CorruptFrameError, SourceError

try:  # Python 3.8 has typing.Protocol
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: Failed grabs in a row after which the stream is down (a closed connection fails
#: every grab at once; a corrupt part on a live stream fails one).
GRAB_FAIL_RUN_LIMIT = 8
#: Pause after a failed grab, so a connection that fails every grab at once cannot spin.
GRAB_FAIL_PAUSE_S = 0.01


class Grabber(Protocol):
    """What the reader needs of a ``cv2.VideoCapture``."""

    def grab(self) -> bool: ...

    def retrieve(self) -> Tuple[bool, Any]: ...

    def release(self) -> None: ...


class LatestFrameReader:
    """One live capture drained by its own thread; ``read()`` returns the newest frame."""

    def __init__(self, cap: Grabber, name: str, stall_timeout_s: float,
                 position_ms: Callable[[], Optional[float]]) -> None:
        self.cap = cap
        self.name = name  # for messages: the redacted URL
        self.stall_timeout_s = stall_timeout_s
        self.position_ms = position_ms  # called in the reader thread, after a grab
        self.grabbed = 0
        self.skipped = 0
        self.corrupt = 0
        """Failed grabs followed by a good one: corrupt frames skipped, the stream went on."""
        self._cond = threading.Condition()
        self._want = False
        self._ready: Optional[Tuple[bool, Any, Optional[float]]] = None
        self._error: Optional[str] = None
        self._closed = False
        self._last_grab = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"grab {name}"[:15], daemon=True)

    def start(self) -> None:
        self._last_grab = time.monotonic()
        self._thread.start()

    def alive(self) -> bool:
        """Whether the reader thread still holds the capture."""
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            failed = 0  # failed grabs since the last good one
            while not self._closed:
                ok = self.cap.grab()
                if self._closed:
                    break
                if not ok:
                    failed += 1
                    idle = time.monotonic() - self._last_grab
                    if failed >= GRAB_FAIL_RUN_LIMIT or idle >= self.stall_timeout_s:
                        self._fail(f"stopped delivering frames ({failed} failed grab(s) in a row, "
                                   f"no good frame for {idle:.1f} s)")
                        break
                    time.sleep(GRAB_FAIL_PAUSE_S)
                    continue
                with self._cond:
                    self._last_grab = time.monotonic()
                    self.grabbed += 1
                    self.corrupt += failed  # the stream went on: those were bad frames
                    failed = 0
                    want = self._want
                    if not want:
                        self.skipped += 1
                if want:
                    self._hand_over()
        except Exception as exc:  # a backend error must end the connection, not the thread silently
            self._fail(f"capture failed: {type(exc).__name__}: {exc}")
        finally:
            try:
                self.cap.release()
            except Exception:  # pragma: no cover - best effort
                log.exception("%s: release failed", self.name)
            with self._cond:
                self._cond.notify_all()

    def _hand_over(self) -> None:
        try:
            ok, img = self.cap.retrieve()
            pos = self.position_ms() if ok else None
        except Exception as exc:  # cv2.error: one bad frame
            ok, img, pos = False, f"{type(exc).__name__}: {exc}", None
        with self._cond:
            self._want = False
            self._ready = (bool(ok), img, pos)
            self._cond.notify_all()

    def _fail(self, why: str) -> None:
        with self._cond:
            if self._error is None:
                self._error = why
            self._cond.notify_all()

    def read(self) -> Tuple[Any, Optional[float]]:
        """The next frame grabbed from now on and its source timestamp (ms or None).

        Raises:
            SourceError: the stream ended, failed, was closed, or delivered no new
                frame for ``stall_timeout_s``.
            CorruptFrameError: the frame could not be decoded.
        """
        with self._cond:
            self._want = True
            while self._ready is None:
                if self._error is not None:
                    raise SourceError(f"{self.name} {self._error}")
                if self._closed:
                    raise SourceError(f"{self.name} is closed")
                idle = time.monotonic() - self._last_grab
                if idle >= self.stall_timeout_s:
                    self._error = (f"delivered no new frame for {idle:.1f} s "
                                   f"(stall_timeout_s {self.stall_timeout_s:g})")
                    raise SourceError(f"{self.name} {self._error}")
                self._cond.wait(self.stall_timeout_s - idle)
            ok, img, pos = self._ready
            self._ready = None
        if not ok:
            raise CorruptFrameError(f"{self.name}: cannot decode frame{f' ({img})' if isinstance(img, str) else ''}")
        return img, pos

    def interrupt(self) -> None:
        """Make a waiting ``read`` raise SourceError now (any thread; does not block)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def close(self, wait_s: float = 0.5) -> bool:
        """Stop the reader; True when its thread ended (and released the capture) within ``wait_s``."""
        self.interrupt()
        if self._thread.ident is None:  # never started
            self.cap.release()
            return True
        self._thread.join(wait_s)
        return not self._thread.is_alive()
