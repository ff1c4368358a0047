"""When a live frame was taken: the source's own timestamps mapped to the wall clock.

A pure core (docs/design/edge-runtime.md#live-sources). A live source stamps each
frame on its own clock: RTP timestamps turned into stream PTS by FFmpeg
(``cv2.CAP_PROP_POS_MSEC``, RFC 3550 section 5.1), GStreamer buffer running time, or
the V4L2 driver's ``CLOCK_MONOTONIC`` capture time. ``SourceClock`` maps that clock
to ours with one offset, ``read_unix_ns - source_ns``, estimated as its minimum over
the frames of a connection: every observation is the true offset plus a delay
(network, decode, buffering) that is never negative, so the smallest one is the
least-delayed frame, the filter NTP applies to its samples (RFC 5905 section 10).
A reader that falls behind therefore shows up as a growing frame age instead of
being absorbed into the offset. The estimate may rise by ``drift`` seconds per
second (1000 ppm, ten times a typical crystal's tolerance), so a camera clock that
runs slower than ours does not read as a growing delay over days.

The mapping is kept against the monotonic clock, not the wall clock: an NTP step
of the wall clock (a Jetson that boots without network time and is set later)
would otherwise read as seconds of delay on every frame until the next reconnect,
since the offset only rises by ``drift``. A frame's wall time is its monotonic
capture time plus the wall-minus-monotonic difference at its read, so records
follow the wall clock as it is now while ages never jump.

A source clock that runs much slower than ours is not a clock but made-up
numbers (FFmpeg numbers the parts of an MJPEG stream at a nominal 25 fps whatever
the camera's rate; ``edge.sources.opencv`` already ignores those for MJPEG over
HTTP): followed by ``drift`` only, every frame would read as older than the last,
without bound. So when, ``SLOW_WINDOW_S`` or more after a connection's anchor, the
source clock has advanced by less than ``1 - SLOW_FRACTION`` of the monotonic time
passed, the stream's frames are stamped with their read time from then on, for the
rest of the run (``slow`` says why; the capture shell logs it once). A reader that
truly falls that far behind (25 % of wall time over 10 s) would be hidden by this;
``LatestFrameReader`` drains the stream, so that is not a state it stays in.

A frame without a usable timestamp (none, or not later than the previous one: a
stream restart, a wrap, a backend that reports 0) is stamped with its read time and
the mapping starts again from it. Nothing here reads a clock: callers pass the
read times. Callers: ``edge.sources.capturing``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

#: Clock names in records: the frame's time came from the source, or is its read time.
STREAM = "stream"
READ = "read"
#: Seconds after a connection's anchor before its clock rate is judged.
SLOW_WINDOW_S = 10.0
#: A source clock behind the monotonic one by more than this fraction of the time
#: passed (over at least ``SLOW_WINDOW_S``) is not trusted: read times are used instead.
SLOW_FRACTION = 0.25


def frame_period(fps: float) -> Optional[float]:
    """Seconds per frame of a source's nominal rate (a container's or a camera's), None when
    the rate is unknown: 0, not a number, or 1000 fps and above (a backend's time base, not a
    rate: FFmpeg states a WebM recording without a frame rate, as a browser writes one, at its
    1 ms time base, 1000 fps)."""
    if not (0.0 < fps < 1000.0):  # NaN fails it too
        return None
    return 1.0 / fps


class SourceClock:
    """Maps one connection's source timestamps to the monotonic clock, and so to Unix nanoseconds."""

    def __init__(self, drift: float = 1e-3) -> None:
        self.drift = drift
        self.offset_ns: Optional[int] = None
        self.last_source_ns: Optional[int] = None
        self.last_read_mono_ns = 0
        self.anchor: Optional[Tuple[int, int]] = None  # (monotonic ns, source ns) of the anchor
        self.slow: Optional[str] = None
        """Why the source clock was given up (it ran too slow), None while it is used."""

    def reset(self) -> None:
        """Forget the mapping (a new connection: its timestamps start afresh). A source
        clock given up as too slow stays given up."""
        self.offset_ns = None
        self.last_source_ns = None
        self.anchor = None

    def stamp(self, source_ms: Optional[float], read_unix_ns: int,
              read_mono_ns: Optional[int] = None) -> Tuple[int, str]:
        """``(capture_unix_ns, clock)`` of a frame read at ``read_unix_ns`` (wall clock)
        and ``read_mono_ns`` (monotonic; None: the wall clock is taken as steady) whose
        source timestamp is ``source_ms`` (None when the source has none)."""
        mono = read_unix_ns if read_mono_ns is None else read_mono_ns
        if self.slow is not None:
            return read_unix_ns, READ
        if source_ms is None or not math.isfinite(source_ms) or (source_ms <= 0.0 and self.last_source_ns is None):
            # None, NaN or infinite, or a first timestamp of 0 (OpenCV's "unknown") cannot anchor a mapping.
            self.reset()
            return read_unix_ns, READ
        source_ns = int(round(source_ms * 1e6))
        observed = mono - source_ns
        if self.offset_ns is None or self.last_source_ns is None or source_ns <= self.last_source_ns:
            self.offset_ns = observed  # (re-)anchor: this frame's time is its read time
            self.anchor = (mono, source_ns)
            stamped, clock = read_unix_ns, READ
        elif self._too_slow(mono, source_ns):
            self.reset()
            return read_unix_ns, READ
        else:
            allowed = self.offset_ns + int(self.drift * max(0, mono - self.last_read_mono_ns))
            self.offset_ns = min(allowed, observed)
            stamped, clock = read_unix_ns - (mono - (source_ns + self.offset_ns)), STREAM
        self.last_source_ns = source_ns
        self.last_read_mono_ns = mono
        return stamped, clock

    def _too_slow(self, mono: int, source_ns: int) -> bool:
        """Whether the source clock, since the anchor, ran slower than ours by more than
        ``SLOW_FRACTION`` over at least ``SLOW_WINDOW_S``; if so it is given up (``slow``)."""
        if self.anchor is None:
            return False
        passed = mono - self.anchor[0]
        advanced = source_ns - self.anchor[1]
        if passed < SLOW_WINDOW_S * 1e9 or passed - advanced <= SLOW_FRACTION * passed:
            return False
        self.slow = (f"its clock advanced {advanced / 1e9:.1f} s in {passed / 1e9:.1f} s "
                     f"(more than {SLOW_FRACTION:.0%} slow)")
        return True
