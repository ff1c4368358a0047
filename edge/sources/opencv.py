"""Frame sources read through OpenCV: video file, image folder, live capture.

Live capture covers RTSP/HTTP URLs, V4L2 cameras (index or ``/dev/videoN``) and
GStreamer pipeline strings (``CAP_GSTREAMER``, as used on Jetson with
``nvarguscamerasrc`` / ``nvv4l2decoder``), each drained by a
``edge.sources.latest.LatestFrameReader`` and opened as ``edge.sources.live``
decides (backend, FFmpeg options, appsink properties). Corrupt frames raise
``CorruptFrameError`` (skipped, counted); a truncated video ends early with a
warning. Image files are checked header first (``edgewise.imagefiles``), the
same check the gateway and the workers apply to escalated images. Callers:
``edge.sources.making``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import cv2
import numpy as np

from edge.sources.answers import stream_answer, why_unopened
from edge.sources.base import CorruptFrameError, SourceAwayError, SourceError
from edge.sources.clock import frame_period
from edge.sources.latest import LatestFrameReader
from edge.sources.live import (
    REACH_TIMEOUT_S,
    choose_backend,
    ffmpeg_options,
    hardware_decoder,
    latest_appsink,
    opencv_video_io,
    redact_uri,
    rtsp_pipeline,
    stall_timeout,
    why_camera_unopened,
)
from edgewise.errors import InvalidInputError
from edgewise.filereads import FileIdentity, file_identity
from edgewise.imagefiles import (
    DEFAULT_MAX_PIXELS,
    IMAGE_SUFFIXES,
    ImageLimitError,
    dataset_hint,
    hidden,
    natural_key,
    read_image_file,
    read_image_header,
    shown,
    video_ended,
)

log = logging.getLogger(__name__)

FFMPEG_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
#: Folder images whose headers ``local_source_problem`` reads (at most) to find a readable one.
FOLDER_PROBE_FILES = 32


class RefusedFrameError(CorruptFrameError):
    """A frame refused by a limit (an image over the pixel or byte limit), not damaged:
    skipped and counted like a corrupt one, logged as what it is."""

    refused = True


def list_images(folder: str) -> List[Path]:
    """The images of ``folder`` in natural name order (``frame2`` before ``frame10``),
    without hidden files (``.name``, macOS AppleDouble ``._name`` twins); OSError if it
    cannot be listed."""
    files = [p for p in Path(folder).iterdir()
             if p.suffix.lower() in IMAGE_SUFFIXES and not hidden(p.name)]
    return sorted(files, key=lambda p: natural_key(p.name))


def _no_images(path: str) -> str:
    """What a folder stream without images is told (the probe's and the quick check's words)."""
    return (f"image folder {shown(path)} has no images ({', '.join(IMAGE_SUFFIXES)}; hidden files are "
            f"skipped){dataset_hint(path)}")


def _probe_folder(path: str) -> Optional[str]:
    files = list_images(path)
    if not files:
        return _no_images(path)
    why = ""
    for f in files[:FOLDER_PROBE_FILES]:
        try:
            read_image_header(f)
            return None
        except InvalidInputError as exc:
            why = why or str(exc)
    checked = min(len(files), FOLDER_PROBE_FILES)
    return f"no readable image in {shown(path)} (the first {checked} checked; e.g. {why})"


def _probe_video(path: str) -> Optional[str]:
    with _OPTIONS_GATE.holding(None):
        cap = cv2.VideoCapture(path)
    try:
        if not cap.isOpened():
            return f"cannot open video {shown(path)} (not a video, or no decoder)"
        ok, img = cap.read()
        if not ok or img is None or img.size == 0:
            hint = " (for images use kind: folder)" if Path(path).suffix.lower() in IMAGE_SUFFIXES else ""
            return f"video {shown(path)} yielded no frames (empty, or not decodable){hint}"
    except cv2.error as exc:
        return f"video {shown(path)}: {exc}"
    finally:
        cap.release()
    return None


def local_source_problem(kind: str, path: str, probe: bool = True) -> Optional[str]:
    """What keeps a local ``file`` (video) or ``folder`` (images) source from opening; None
    when nothing does. One rule for the source and ``edgewise edge check-config``; with
    ``probe`` (check-config) a video is opened and its first frame decoded, and the headers
    of a folder's first images (at most ``FOLDER_PROBE_FILES``) are read until one passes."""
    p = Path(path)
    name = shown(path)
    if kind == "file":
        if p.is_dir():
            return f"video file {name} is a folder (for a folder of images use kind: folder)"
        if not p.is_file():
            if p.exists():  # a FIFO, a socket, a device: not a file OpenCV can seek in
                return f"video file {name} is not a regular file (a pipe, socket or device); give a video file"
            if p.is_symlink():
                return f"video file {name} is a symbolic link to nothing (or to itself)"
            return f"video file {name} does not exist"
        if p.stat().st_size == 0:
            return f"video file {name} is empty"
        return _probe_video(path) if probe else None
    if kind == "folder":
        if not p.is_dir():
            return f"image folder {name} does not exist or is not a folder"
        try:
            if probe:
                return _probe_folder(path)
            if not list_images(path):
                return _no_images(path)
        except OSError as exc:
            return f"image folder {name} cannot be read: {exc.strerror or exc}"
    return None

class _OptionsGate:
    """OpenCV's FFmpeg backend reads ``OPENCV_FFMPEG_CAPTURE_OPTIONS`` from the
    environment at every open, so per-stream options mean setting the variable around
    the open. OpenCV also opens one FFmpeg capture at a time per process (a global lock
    around its ``open``), so opens pass this gate one at a time, in arrival order: the wait
    happens here, where an open of a stream that has stopped meanwhile is refused
    (``_refuse_when_stopping``), not inside OpenCV, where each open waiting behind a hung
    camera then ran its own ``open_timeout_s`` (a stop with three hung cameras took three
    opens' timeouts, found by a probe). In arrival order: two dead cameras retrying kept a
    healthy camera with other options waiting for good when same-value opens could join."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.value: Optional[str] = None
        self.count = 0
        self.saved: Optional[str] = None
        self.line: List[Tuple[object, Optional[str]]] = []  # waiting opens, in arrival order

    def _may_enter(self, ticket: object) -> bool:
        return not self.count and self.line[0][0] is ticket  # free: the first in line takes it

    @contextlib.contextmanager
    def holding(self, value: Optional[str]) -> Iterator[None]:
        """Hold the gate for one open with ``value`` in the environment (None: as the process
        has it, for a video file: an open outside the gate waited inside OpenCV behind a hung
        camera and could read that camera's options)."""
        ticket = object()
        with self.cond:
            self.line.append((ticket, value))
            while not self._may_enter(ticket):
                self.cond.wait()
            self.line.remove((ticket, value))
            self.saved = os.environ.get(FFMPEG_OPTIONS_ENV)
            if value is not None:
                os.environ[FFMPEG_OPTIONS_ENV] = value
            self.value = value
            self.count += 1
        try:
            yield
        finally:
            with self.cond:
                self.count -= 1
                if not self.count:
                    if self.saved is None:
                        os.environ.pop(FFMPEG_OPTIONS_ENV, None)
                    else:
                        os.environ[FFMPEG_OPTIONS_ENV] = self.saved
                    self.value = None
                    self.cond.notify_all()


_OPTIONS_GATE = _OptionsGate()


def _position_ms(cap: Any) -> Optional[float]:
    """The grabbed frame's timestamp on the source's clock, ms; None when unknown."""
    try:
        pos = float(cap.get(cv2.CAP_PROP_POS_MSEC))
    except cv2.error:
        return None
    return pos if pos > 0.0 else None


def _fourcc(cap: Any) -> str:
    """The codec of a capture as its four characters (``MJPG``, ``H264``), '' when unknown."""
    try:
        code = int(cap.get(cv2.CAP_PROP_FOURCC) or 0)
    except (cv2.error, TypeError, ValueError):
        return ""
    return "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).strip("\x00 ") if code > 0 else ""


def _invented_timestamps(kind: str, backend: str, fourcc: str) -> bool:
    """Whether a live stream's ``CAP_PROP_POS_MSEC`` is made up rather than the source's:
    MJPEG over HTTP through FFmpeg (the multipart demuxer has no timestamps; FFmpeg numbers
    the parts at a nominal 25 fps). OpenCV 4.5.4 (JetPack 5.1's) names the codec ``mjpe`` where
    5.x says ``MJPG``: with only the latter, the device took FFmpeg's numbers for the camera's
    (found by the Jetson lane)."""
    return kind == "http" and backend == "ffmpeg" and fourcc.upper() in ("MJPG", "MJPE", "MJPEG", "JPEG")


def _to_bgr(img: Any) -> np.ndarray:
    if img is None or not isinstance(img, np.ndarray) or img.size == 0:
        raise CorruptFrameError("empty image")
    if img.dtype != np.uint8:
        raise CorruptFrameError(f"unsupported dtype {img.dtype}")
    if img.ndim == 2:
        return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    if img.ndim == 3 and img.shape[2] == 4:
        return cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
    if img.ndim == 3 and img.shape[2] == 3:
        return img
    raise CorruptFrameError(f"unsupported image shape {img.shape}")


class VideoFileSource:
    """A video file, optionally looped. A frame that does not decode before the end the
    header states is skipped and counted (``corrupt``) and reading goes on, past a corrupt
    stretch too; the video ends when the reads fail to that end (or ``VIDEO_FAIL_RUN_LIMIT``
    in a row) or at its last frame (``edgewise.imagefiles.video_ended``). One shorter
    than its header says is reported as truncated (``truncated`` counts each pass; the
    warning is logged once per source). A video that yields no frame at all is a
    ``SourceError`` naming it. A looping video that delivered frames and then cannot be
    opened again at a new pass, or yields none in it (a sync job re-copying the file), is
    away for a moment (``SourceAwayError``): the capture shell backs off and the next
    ``read`` opens it again, as for a looping folder. A new pass of a file that has not changed
    since it was opened rewinds the open capture instead (``_rewind``).

    ``last_media_s`` places each frame on the recording's own timeline: its index over the
    container's frame rate, from 0 at the first frame, each pass of a loop (and each reopen)
    starting one frame period after the last frame of the one before, so it never goes back.
    None when the container states no usable rate (``edge.sources.clock.frame_period``)."""

    live = False
    skipped = 0
    last_source_ms: Optional[float] = None

    def __init__(self, path: str, loop: bool = False) -> None:
        self.path = path
        self.last_file: Optional[str] = path
        self.last_index: Optional[int] = None
        self.last_media_s: Optional[float] = None
        self.period_s: Optional[float] = None  # the open container's frame period
        self.pass_start_s = 0.0  # where this pass begins on the recording's timeline
        self.shown = shown(path)
        self.loop = loop
        self.cap: Optional[Any] = None
        self.expected = 0
        self.read_count = 0
        self.position = 0  # frames read or failed in this pass
        self.truncated = 0
        self.corrupt = 0  # undecodable frames skipped, all passes
        self.pass_corrupt = 0
        self.total_read = 0  # frames read, all passes
        self._tail_logged = False
        self.identity: Optional[FileIdentity] = None  # the file's, as it was opened
        self.rewound = False  # this pass began by rewinding the open capture
        self.seekable = True  # False once a rewind read nothing: each pass opens the file again

    @property
    def pass_length(self) -> int:
        """Frames in one pass (the header's count; 0 when unknown)."""
        return self.expected

    def open(self) -> None:
        problem = local_source_problem("file", self.path, probe=False)
        if problem:
            raise SourceError(problem)
        self.identity = file_identity(self.path)  # before the open: a change meanwhile shows at the next pass
        with _OPTIONS_GATE.holding(None):  # OpenCV opens one FFmpeg capture at a time (_OptionsGate)
            cap = cv2.VideoCapture(self.path)
        if not cap.isOpened():
            raise SourceError(f"cannot open video {self.shown} (not a video, or no decoder)")
        self.cap = cap
        self.expected = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self._next_pass()
        self.period_s = frame_period(float(cap.get(cv2.CAP_PROP_FPS) or 0.0))
        self.read_count = self.position = self.pass_corrupt = 0
        self.rewound = False

    def _next_pass(self) -> None:
        """The timeline of a new pass (or reopen) begins one frame period after the last frame
        delivered, so ``last_media_s`` runs on across a loop."""
        if self.last_media_s is not None and self.period_s is not None:
            self.pass_start_s = self.last_media_s + self.period_s

    def _away(self) -> bool:
        """Whether a failure to open or read a pass means the file is away for a moment (a
        looping video that delivered frames before) rather than unusable."""
        return self.loop and self.total_read > 0

    def _reopen(self) -> None:
        """Open the video for a new pass of the loop; see ``_away``."""
        try:
            self.open()
        except SourceError as exc:
            if not self._away():
                raise
            raise SourceAwayError(f"{exc}; opened again after a back-off") from None

    def _end(self) -> bool:
        """Handle end of file; True when the source should go on (looping)."""
        if self.read_count == 0:
            if self.rewound:  # the seek said yes and read nothing (a format that does not seek back)
                self.seekable = self.rewound = False
                self.close()
                self._reopen()
                return True
            if self._away():
                self.close()  # the next read opens it again
                raise SourceAwayError(f"video {self.shown} yielded no frames in this pass (being copied?); "
                                      "opened again after a back-off")
            bad = f" ({self.pass_corrupt} undecodable)" if self.pass_corrupt else ""
            hint = " (for images use kind: folder)" if Path(self.path).suffix.lower() in IMAGE_SUFFIXES else ""
            raise SourceError(f"video {self.shown} yielded no frames{bad} (empty, or not decodable){hint}")
        lost = self.expected - self.read_count - self.pass_corrupt
        if self.expected and lost > 0:
            self.truncated += 1
            bad = f"; {self.pass_corrupt} undecodable frame(s) before it were skipped" if self.pass_corrupt else ""
            (log.debug if self._tail_logged else log.warning)(
                "video %s ended after %d of %d frames: the last %d could not be read ("
                "truncated or corrupt tail)%s%s", self.shown, self.read_count, self.expected, lost, bad,
                "" if self._tail_logged else "; said once per source")
            self._tail_logged = True
        if not self.loop:
            return False
        if self._rewind():
            return True
        self.close()
        self._reopen()
        return True

    def _rewind(self) -> bool:
        """Start the next pass on the open capture, when the file is still the one opened
        (``file_identity``; a replaced or rewritten file is opened again). OpenCV's FFmpeg
        backend opens one capture at a time in a process (a global lock around the open), so a
        reopen at every pass waited behind any camera being opened, a hung one for its whole
        ``open_timeout_s``: a looping video fell to a fraction of its rate while an RTSP camera
        of the same daemon reconnected to a host that did not answer (found by a probe)."""
        self.rewound = False
        if (not self.seekable or self.cap is None or self.identity is None
                or file_identity(self.path) != self.identity):
            return False
        try:
            if not self.cap.set(cv2.CAP_PROP_POS_FRAMES, 0):
                return False
        except cv2.error:
            return False
        self._next_pass()
        self.read_count = self.position = self.pass_corrupt = 0
        self.rewound = True
        return True

    def read(self) -> Optional[np.ndarray]:
        if self.cap is None:
            self._reopen()
        for _ in range(3):  # this pass, a rewound one that read nothing, a reopened one
            run = 0
            while True:
                try:
                    ok, img = self.cap.read()  # type: ignore[union-attr]
                except cv2.error as exc:
                    self.position += 1
                    raise CorruptFrameError(f"decode error in {self.shown}: {exc}") from None
                if ok:
                    self.read_count += 1
                    self.total_read += 1
                    self.last_index = self.position
                    self.last_media_s = (None if self.period_s is None
                                         else self.pass_start_s + self.position * self.period_s)
                    self.position += 1
                    self.corrupt += run
                    self.pass_corrupt += run
                    return _to_bgr(img)
                run += 1
                self.position += 1
                # before the end the header states a failed read is one bad frame: read on
                if video_ended(self.expected, self.position, run):
                    break
            if not self._end():
                return None
        return None

    def interrupt(self) -> None:
        """Nothing to wake: a read of a file returns within its decode time."""

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None


class ImageFolderSource:
    """The images of a folder in natural name order (``list_images``: ``frame2`` before
    ``frame10``, hidden and AppleDouble ``._`` files skipped), each through the core's
    header-first check (``edgewise.imagefiles.read_image_file``, which turns photos
    upright by their EXIF orientation): a file truncated or structurally damaged is a
    corrupt frame naming the file, one over the pixel or byte limit a refused frame
    (``RefusedFrameError``), never decoded partially. Without ``loop`` the listing is
    taken at the start; with it the folder is listed again at each pass, so files added
    since are read and deleted ones are no longer tried, and a folder found empty or
    unreadable then (a sync job replacing its files, a network share's hiccup) is away for
    a moment (``SourceAwayError``), listed again after the capture shell's back-off, not
    the stream's end. A file deleted or renamed between the listing and its read is no
    frame at all: skipped (logged at debug), not counted as corrupt."""

    live = False
    skipped = 0
    last_source_ms: Optional[float] = None
    last_media_s: Optional[float] = None  # a folder has no timeline
    last_index: Optional[int] = None
    truncated = 0

    def __init__(self, path: str, loop: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.path = path
        self.shown = shown(path)
        self.loop = loop
        self.max_pixels = max_pixels
        self.files: List[Path] = []
        self.pos = 0
        self.opened = False
        self.last_file: Optional[str] = None

    @property
    def pass_length(self) -> int:
        """Files in one pass (as last listed)."""
        return len(self.files)

    def _list(self) -> None:
        self.files, self.pos = [], 0
        try:
            files = list_images(self.path)
        except OSError as exc:
            raise SourceError(f"image folder {self.shown} cannot be read: {exc.strerror or exc}") from None
        if not files:
            raise SourceError(f"image folder {self.shown} has no images any more")
        self.files = files

    def open(self) -> None:
        problem = local_source_problem("folder", self.path, probe=False)
        if problem:
            raise SourceError(problem)
        self._list()
        self.opened = True

    def read(self) -> Optional[np.ndarray]:
        if not self.opened:
            self.open()
        listed = False
        while True:
            if self.pos >= len(self.files):
                if not self.loop:
                    return None
                if listed:  # every file of a fresh listing was gone before it was read
                    self.files, self.pos = [], 0
                    raise SourceAwayError(f"image folder {self.shown}: its images were gone before they "
                                          "could be read; listed again after a back-off")
                try:  # each pass sees the folder as it is now
                    self._list()
                except SourceError as exc:  # for a moment, maybe: the shell backs off and reads again
                    raise SourceAwayError(f"{exc}; listed again after a back-off") from None
                listed = True
            p = self.files[self.pos]
            self.pos += 1
            try:  # header first: a decompression bomb or a damaged file is refused before decoding
                img = read_image_file(p, self.max_pixels)
            except ImageLimitError as exc:
                raise RefusedFrameError(str(exc)) from None
            except InvalidInputError as exc:
                if not os.path.lexists(p):  # deleted or renamed since the listing: no frame, not a bad one
                    log.debug("image folder %s: %s went away after the listing; skipped", self.shown, shown(p))
                    continue
                raise CorruptFrameError(str(exc)) from None
            except cv2.error as exc:
                raise CorruptFrameError(f"{shown(p)}: {exc}") from None
            self.last_file = str(p)
            return _to_bgr(img)

    def interrupt(self) -> None:
        """Nothing to wake: a read of a file returns within its decode time."""

    def close(self) -> None:
        self.files, self.opened = [], False


class CaptureSource:
    """A live stream through ``cv2.VideoCapture``: URL, camera or GStreamer pipeline,
    drained by a ``LatestFrameReader`` so ``read`` returns the newest frame.

    ``read`` failing means the stream dropped or stalled: SourceError, and the capture
    shell reconnects with exponential backoff. ``last_source_ms`` is the source's own
    timestamp of the frame ``read`` returned (``CAP_PROP_POS_MSEC``: stream PTS for
    FFmpeg, buffer time for GStreamer, driver capture time for V4L2), ``skipped`` the
    frames drained without being used, ``corrupt`` the frames whose grab failed while
    the stream went on (skipped). URLs appear in messages only redacted.

    MJPEG over HTTP (``kind: http`` whose codec FFmpeg reports as ``MJPG``: a
    ``multipart/x-mixed-replace`` stream) carries no timestamps: FFmpeg invents them
    at a nominal 25 fps whatever the real rate, so ``last_source_ms`` is None for it
    and its frames are stamped with their read time (``capture_clock: read``).
    """

    live = True
    truncated = 0
    last_media_s: Optional[float] = None  # live: the policy runs on the daemon's clock

    def __init__(self, kind: str, uri: str, backend: str = "auto", transport: str = "tcp",
                 codec: str = "h264", stall_timeout_s: float = 0.0, open_timeout_s: float = 10.0,
                 io_timeout_s: float = 5.0) -> None:
        self.kind = kind
        self.uri = uri
        self.shown = redact_uri(uri)
        self.transport = transport
        self.codec = codec
        self.stall_timeout_setting = stall_timeout_s
        self.open_timeout_s = open_timeout_s
        self.io_timeout_s = io_timeout_s
        has_gst, self.avformat_major = opencv_video_io()
        self.backend, self.backend_why = choose_backend(kind, backend, has_gst, hardware_decoder())
        self.pipeline, self.appsink_added = latest_appsink(uri) if kind == "gstreamer" else (uri, None)
        self.reader: Optional[LatestFrameReader] = None
        self.last_source_ms: Optional[float] = None
        self.last_file: Optional[str] = None
        self.last_index: Optional[int] = None
        self.stall_timeout_s = stall_timeout(stall_timeout_s, 0.0)
        self._skipped_before = 0  # frames skipped by readers of earlier connections
        self._corrupt_before = 0  # corrupt frames counted by readers of earlier connections
        self.timestamps = True
        """Whether the stream's own timestamps are real (False: MJPEG over HTTP, see above)."""
        self._said_timestamps = False
        self._closing: List[LatestFrameReader] = []  # earlier readers still inside a grab()
        self._open_took_s = 0.0  # how long the last FFmpeg open took (why_unopened: did it time out?)
        self._stopping = False  # set by ``interrupt``: the stream stops, no open may start any more

    @property
    def skipped(self) -> int:
        return self._skipped_before + (self.reader.skipped if self.reader is not None else 0)

    @property
    def corrupt(self) -> int:
        return self._corrupt_before + (self.reader.corrupt if self.reader is not None else 0)

    def describe(self) -> str:
        """``rtsp://user:***@host/path via ffmpeg (auto: ...)``, for the start-up log."""
        added = f"; appsink {self.appsink_added} added" if self.appsink_added else ""
        return f"{self.kind} {self.shown} via {self.backend} ({self.backend_why}{added})"

    def _timeouts(self) -> List[int]:
        params = []
        for name, seconds in (("CAP_PROP_OPEN_TIMEOUT_MSEC", self.open_timeout_s),
                              ("CAP_PROP_READ_TIMEOUT_MSEC", self.io_timeout_s)):
            prop = getattr(cv2, name, None)  # OpenCV >= 4.5.2
            if prop is not None:
                params += [int(prop), int(seconds * 1000)]
        return params

    def _capture(self) -> Any:
        if self.kind == "gstreamer":
            return cv2.VideoCapture(self.pipeline, cv2.CAP_GSTREAMER)
        if self.kind == "camera":
            target: Any = int(self.uri) if self.uri.isdigit() else self.uri
            return cv2.VideoCapture(target, cv2.CAP_V4L2) if isinstance(target, int) else cv2.VideoCapture(target)
        if self.backend == "gstreamer":
            pipeline = rtsp_pipeline(self.uri, self.transport, self.codec, self.io_timeout_s)
            return cv2.VideoCapture(pipeline, cv2.CAP_GSTREAMER)
        options = ffmpeg_options(self.kind, self.transport, self.io_timeout_s, self.avformat_major)
        params = self._timeouts()
        with _OPTIONS_GATE.holding(options):
            self._refuse_when_stopping()  # the stop may have come while this open waited at the gate
            t0 = time.monotonic()  # the open itself, not the wait for the gate
            try:
                if not params:  # OpenCV < 4.5.2: no open/read timeouts, no parameter list
                    return cv2.VideoCapture(self.uri, cv2.CAP_FFMPEG)
                return cv2.VideoCapture(self.uri, cv2.CAP_FFMPEG, params)
            finally:
                self._open_took_s = time.monotonic() - t0

    def _refuse_when_stopping(self) -> None:
        """No open starts once the stream is stopping: a hung camera would hold the stop for
        another ``open_timeout_s``."""
        if self._stopping:
            raise SourceError(f"{self.kind} {self.shown}: not opened, the stream is stopping")

    def open(self) -> None:
        if self.reader is not None:
            # The previous connection's thread may still be inside a grab() that only
            # the backend's read timeout ends; let it finish on its own, but never keep
            # more than one such connection to a camera.
            self.reader.close(0.1)
            self._skipped_before += self.reader.skipped
            self._corrupt_before += self.reader.corrupt
            self._closing = [r for r in self._closing + [self.reader] if r.alive()]
            self.reader = None
        if len(self._closing) > 1:
            raise SourceError(f"{self.kind} {self.shown}: earlier connections are still closing "
                              f"(io_timeout_s {self.io_timeout_s:g})")
        self._refuse_when_stopping()
        try:
            cap = self._capture()
        except cv2.error as exc:
            raise SourceError(f"{self.kind} {self.shown}: {redact_uri(str(exc))}") from None
        if not cap.isOpened():
            cap.release()
            # no reachability check (up to REACH_TIMEOUT_S more) for an open the stop waits for
            if self._stopping:
                why = ""
            elif self.kind == "camera":
                why = why_camera_unopened(self.uri)
            else:
                why = why_unopened(self.uri, min(REACH_TIMEOUT_S, self.io_timeout_s), self._open_took_s,
                                   min(self.open_timeout_s, self.io_timeout_s))
            raise SourceError(f"cannot open {self.kind} source {self.shown}" + (f": {why}" if why else ""))
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0)
        self.timestamps = not _invented_timestamps(self.kind, self.backend, _fourcc(cap))
        if not self.timestamps and not self._said_timestamps:
            self._said_timestamps = True
            log.info("%s %s: MJPEG over HTTP carries no timestamps (FFmpeg's are a nominal %g fps); "
                     "frames are stamped with their read time (capture_clock: read)", self.kind, self.shown, fps)
        # MJPEG over HTTP: FFmpeg's 25 fps is invented, so the rate is unknown (a 0.5 fps camera
        # was declared down after 1 s, before each of its frames)
        self.stall_timeout_s = stall_timeout(self.stall_timeout_setting, fps if self.timestamps else 0.0)
        self.reader = LatestFrameReader(cap, self.shown, self.stall_timeout_s,
                                        lambda: _position_ms(cap))
        self.reader.start()

    def read(self) -> Optional[np.ndarray]:
        if self.reader is None:
            raise SourceError(f"{self.kind} source {self.shown} is not open")
        try:
            img, pos = self.reader.read()
        except SourceError as exc:
            # A connection that ended after at most one frame: an http URL of one image (a snapshot)
            # opens and fails every grab after its image; the answer says so.
            once = self.reader.grabbed <= 1
            why = stream_answer(self.uri) if self.kind == "http" and once and not self._stopping else None
            if why is None:
                raise
            raise SourceError(f"{exc}: the URL {why}") from None
        self.last_source_ms = pos if self.timestamps else None
        return _to_bgr(img)

    def interrupt(self) -> None:
        """The stream stops: wake a ``read`` waiting for the next frame (a frozen camera holds it
        up to the read or stall timeout) and start no open from now on (one in progress ends
        within ``open_timeout_s``, without the reachability check that would explain it); the
        connection is closed by ``close`` afterwards, in the capture thread."""
        self._stopping = True
        reader = self.reader
        if reader is not None:
            reader.interrupt()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
