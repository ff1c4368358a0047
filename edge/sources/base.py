"""The ``FrameSource`` seam: what every frame source implements, and the frame type.

A source is synchronous and blocking (OpenCV decode); ``edge.sources.capturing``
runs it in its own thread and owns reconnects, pacing and state. Callers:
``edge.sources.capturing``, ``edge.pipeline``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np

try:  # Python 3.8 has typing.Protocol
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]


class SourceState(enum.Enum):
    """Lifecycle of a stream, exported as a metric and logged on every change."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    BACKOFF = "backoff"
    ENDED = "ended"


class SourceError(Exception):
    """The source is gone (stream dropped, device lost); a live source reconnects."""


class SourceAwayError(SourceError):
    """A looping file or folder source is away for a moment (its file missing, its folder
    empty or unreadable at a new pass: a sync job replacing it): not the stream's end. The
    capture shell backs off as for a reconnect (the stream is down meanwhile) and reads again."""


class CorruptFrameError(Exception):
    """One frame could not be decoded; it is skipped and counted, the stream goes on."""


@dataclass
class Frame:
    """One captured frame.

    Attributes:
        stream_id: the stream it came from.
        seq: sequence number within the stream, from 0, never reused in one run
            (with ``device_id`` the idempotency key of an escalation).
        image: BGR uint8 ``[H, W, 3]``.
        capture_unix_ns: when the frame was taken, as far as can be known: the
            source's own timestamp mapped to the wall clock (``clock == "stream"``,
            see ``edge.sources.clock``), else the read time (``clock == "read"``).
        capture_mono: ``time.monotonic()`` when the frame was read, for latency.
        read_ms: time spent reading/decoding the frame.
        read_unix_ns: wall-clock time the frame was read (0: same as ``capture_unix_ns``).
        clock: how ``capture_unix_ns`` was derived: ``stream`` or ``read``.
        source_file: the file the frame came from (a folder's image, a video file);
            None for live and generated sources.
        source_index: the frame's index in its video file (from 0, counted from the
            start of the current pass, undecodable frames included); None otherwise.
        media_s: where the frame lies on its recording's timeline (``FrameSource.last_media_s``)
            when the stream reads it as fast as it can (no ``fps``); the policy's decision
            clock then runs on it (``edge.pipeline``). None otherwise.
    """

    stream_id: str
    seq: int
    image: np.ndarray
    capture_unix_ns: int
    capture_mono: float
    read_ms: float = 0.0
    read_unix_ns: int = 0
    clock: str = "read"
    source_file: Optional[str] = None
    source_index: Optional[int] = None
    media_s: Optional[float] = None

    def age_s(self, now_mono: float) -> float:
        """Seconds since the frame was taken (its read age plus how old it was when read)."""
        read_ns = self.read_unix_ns or self.capture_unix_ns
        return now_mono - self.capture_mono + (read_ns - self.capture_unix_ns) / 1e9


class FrameSource(Protocol):
    """A blocking frame source.

    ``open`` connects (raises SourceError when it cannot), ``read`` returns the next
    BGR image (for a live source the newest one), ``None`` at the end of a finite
    source, raises CorruptFrameError for a bad frame and SourceError when the stream
    dropped or stalled; ``close`` releases it; ``interrupt`` wakes a blocked ``read``.
    """

    live: bool
    truncated: int
    """How many times the source ended early (a video shorter than its header says)."""
    @property
    def skipped(self) -> int:
        """Frames a live source drained without handing them on (a newer one was taken)."""

    last_source_ms: Optional[float]
    """The source's own timestamp of the frame ``read`` last returned, ms on its clock; None when it has none."""
    last_media_s: Optional[float]
    """Where the frame ``read`` last returned lies on the recording's own timeline, seconds
    from its first frame and never going back (a video file); None for sources without one
    (live, folders, generated)."""
    last_file: Optional[str]
    """The file the frame ``read`` last returned came from; None for live and generated sources."""
    last_index: Optional[int]
    """That frame's index in its video file (from 0 in the current pass); None for images and live sources."""

    def open(self) -> None: ...

    def read(self) -> Optional[np.ndarray]: ...

    def close(self) -> None: ...

    def interrupt(self) -> None:
        """Make a ``read`` blocked in another thread waiting for a frame return at once (it
        raises SourceError): called from the event loop's thread when the daemon stops, so a
        frozen camera cannot hold the stop for its read or stall timeout. Must not block."""
