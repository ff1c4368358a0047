"""Frame sources read through OpenCV: video file, image folder, live capture.

Live capture covers RTSP/HTTP URLs, V4L2 cameras (index or ``/dev/videoN``) and
GStreamer pipeline strings (``CAP_GSTREAMER``, as used on Jetson with
``nvarguscamerasrc`` / ``nvv4l2decoder``). Corrupt frames raise
``CorruptFrameError`` (skipped, counted); a truncated video ends early with a
warning. Image files are checked header first (``edgewise.imagefiles``), the
same check the gateway and the workers apply to escalated images. Callers: ``edge.sources.make_source``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, List, Optional

import cv2
import numpy as np

from edge.sources.base import CorruptFrameError, SourceError
from edgewise.errors import InvalidInputError
from edgewise.imagefiles import DEFAULT_MAX_PIXELS, read_image_file

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm")


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
    """A video file, optionally looped. A file shorter than its header says is
    reported as truncated (``truncated`` counts it) and ends (or loops)."""

    live = False

    def __init__(self, path: str, loop: bool = False) -> None:
        self.path = path
        self.loop = loop
        self.cap: Optional[Any] = None
        self.expected = 0
        self.read_count = 0
        self.truncated = 0

    def open(self) -> None:
        if not os.path.isfile(self.path):
            raise SourceError(f"video file {self.path} does not exist")
        cap = cv2.VideoCapture(self.path)
        if not cap.isOpened():
            raise SourceError(f"cannot open video {self.path} (not a video, or no decoder)")
        self.cap = cap
        self.expected = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self.read_count = 0

    def _end(self) -> bool:
        """Handle end of file; True when the source should go on (looping)."""
        if self.expected and self.read_count < self.expected:
            self.truncated += 1
            log.warning(
                "video %s ended after %d of %d frames: truncated or corrupt tail",
                self.path, self.read_count, self.expected,
            )
        if not self.loop or self.read_count == 0:
            return False
        self.close()
        self.open()
        return True

    def read(self) -> Optional[np.ndarray]:
        if self.cap is None:
            self.open()
        for _ in range(2):
            try:
                ok, img = self.cap.read()  # type: ignore[union-attr]
            except cv2.error as exc:
                raise CorruptFrameError(f"decode error in {self.path}: {exc}") from None
            if ok:
                self.read_count += 1
                return _to_bgr(img)
            if not self._end():
                return None
        return None

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None


class ImageFolderSource:
    """The images of a folder in name order, each through the core's header-first check
    (``edgewise.imagefiles.read_image_file``): a file over the pixel limit, truncated or
    structurally damaged is a corrupt frame naming the file, never decoded partially."""

    live = False
    truncated = 0

    def __init__(self, path: str, loop: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.path = path
        self.loop = loop
        self.max_pixels = max_pixels
        self.files: List[Path] = []
        self.pos = 0

    def open(self) -> None:
        d = Path(self.path)
        if not d.is_dir():
            raise SourceError(f"image folder {self.path} does not exist or is not a directory")
        self.files = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not self.files:
            raise SourceError(f"image folder {self.path} has no images ({', '.join(IMAGE_SUFFIXES)})")
        self.pos = 0

    def read(self) -> Optional[np.ndarray]:
        if not self.files:
            self.open()
        if self.pos >= len(self.files):
            if not self.loop:
                return None
            self.pos = 0
        p = self.files[self.pos]
        self.pos += 1
        try:  # header first: a decompression bomb or a damaged file is refused before decoding
            img = read_image_file(p, self.max_pixels)
        except InvalidInputError as exc:
            raise CorruptFrameError(str(exc)) from None
        except cv2.error as exc:
            raise CorruptFrameError(f"{p}: {exc}") from None
        return _to_bgr(img)

    def close(self) -> None:
        self.files = []


class CaptureSource:
    """A live stream through ``cv2.VideoCapture``: URL, camera or GStreamer pipeline.

    ``read`` failing means the stream dropped: SourceError, and the capture shell
    reconnects with exponential backoff.
    """

    live = True
    truncated = 0

    def __init__(self, kind: str, uri: str) -> None:
        self.kind = kind
        self.uri = uri
        self.cap: Optional[Any] = None

    def _capture(self) -> Any:
        if self.kind == "gstreamer":
            return cv2.VideoCapture(self.uri, cv2.CAP_GSTREAMER)
        if self.kind == "camera":
            target: Any = int(self.uri) if self.uri.isdigit() else self.uri
            return cv2.VideoCapture(target, cv2.CAP_V4L2) if isinstance(target, int) else cv2.VideoCapture(target)
        return cv2.VideoCapture(self.uri, cv2.CAP_FFMPEG)

    def open(self) -> None:
        try:
            cap = self._capture()
        except cv2.error as exc:
            raise SourceError(f"{self.kind} {self.uri}: {exc}") from None
        if not cap.isOpened():
            cap.release()
            raise SourceError(f"cannot open {self.kind} source {self.uri}")
        self.cap = cap

    def read(self) -> Optional[np.ndarray]:
        if self.cap is None:
            raise SourceError(f"{self.kind} source {self.uri} is not open")
        try:
            ok, img = self.cap.read()
        except cv2.error as exc:
            raise SourceError(f"{self.kind} {self.uri}: {exc}") from None
        if not ok:
            raise SourceError(f"{self.kind} source {self.uri} stopped delivering frames")
        return _to_bgr(img)

    def close(self) -> None:
        if self.cap is not None:
            self.cap.release()
            self.cap = None
