"""Frames for INT8 calibration and agreement checks: a folder of images or a video file.

``open_frames`` validates the source (missing, unreadable, empty or undecodable ->
``InvalidInputError`` naming the path). ``split_indices`` picks calibration frames and
*different* held-out frames spread over the whole source (held-out ones are the tail,
so they are not the calibration frames' neighbours where the source allows).
``FrameSource.read`` streams frames in index order without holding them in memory
(500 frames of 768x576 would be 660 MB).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from edgewise.errors import InvalidInputError

log = logging.getLogger(__name__)

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
PathLike = Union[str, "os.PathLike[str]"]


class FrameSource:
    """Numbered BGR uint8 frames from a folder (sorted by name) or a video file.

    ``count`` is the number of frames, or ``None`` for a video whose length the
    container does not state (then frames are read sequentially until the end).
    """

    def __init__(
        self, path: Path, kind: str, files: Sequence[Path] = (), count: Optional[int] = None
    ):
        self.path = path
        self.kind = kind
        self.files = list(files)
        self.count = count
        self.skipped: List[str] = []  # unreadable images met while reading

    def __repr__(self) -> str:
        return f"FrameSource({str(self.path)!r}, kind={self.kind}, count={self.count})"

    def read(self, indices: Sequence[int]) -> Iterator[Tuple[int, np.ndarray]]:
        """Yield ``(index, frame)`` for increasing ``indices``; unreadable ones are skipped."""
        wanted = sorted(set(int(i) for i in indices))
        if self.kind == "images":
            for i in wanted:
                im = cv2.imread(str(self.files[i]), cv2.IMREAD_COLOR)
                if im is None or im.size == 0:
                    self.skipped.append(str(self.files[i]))
                    log.warning("skipping unreadable image %s", self.files[i])
                    continue
                yield i, im
            return
        cap = cv2.VideoCapture(str(self.path))
        try:
            pos = 0
            for i in wanted:
                while pos < i:  # grab() decodes less than read()
                    if not cap.grab():
                        return
                    pos += 1
                ok, frame = cap.read()
                pos += 1
                if not ok or frame is None:
                    return
                yield i, frame
        finally:
            cap.release()


def open_frames(path: PathLike, what: str = "calibration source") -> FrameSource:
    """Validate and open ``path`` (folder of images or video) as a ``FrameSource``."""
    p = Path(path)
    hint = "pass a folder of images (.jpg/.png/...) or a video file OpenCV can decode"
    if not p.exists():
        raise InvalidInputError(f"{what} {p} does not exist; {hint}")
    if p.is_dir():
        try:
            entries = sorted(os.listdir(p))
        except OSError as e:
            raise InvalidInputError(
                f"{what} folder {p} cannot be read: {e.strerror or e}"
            ) from None
        files = [p / n for n in entries if n.lower().endswith(IMAGE_EXTS) and (p / n).is_file()]
        if not files:
            raise InvalidInputError(
                f"{what} folder {p} has no images ({', '.join(IMAGE_EXTS)}); {hint}"
            )
        unreadable = [f for f in files if not os.access(f, os.R_OK)]
        if len(unreadable) == len(files):
            raise InvalidInputError(
                f"{what} folder {p}: none of its {len(files)} images can be read (permissions)"
            )
        return FrameSource(
            p,
            "images",
            files=[f for f in files if f not in unreadable],
            count=len(files) - len(unreadable),
        )
    if not os.access(p, os.R_OK):
        raise InvalidInputError(f"{what} {p} cannot be read (permission denied)")
    if p.suffix.lower() in IMAGE_EXTS:
        if cv2.imread(str(p), cv2.IMREAD_COLOR) is None:
            raise InvalidInputError(f"{what} {p} is not an image OpenCV can decode; {hint}")
        return FrameSource(p, "images", files=[p], count=1)
    cap = cv2.VideoCapture(str(p))
    try:
        ok = cap.isOpened()
        first = cap.read()[1] if ok else None
        n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if ok else 0
    finally:
        cap.release()
    if first is None or first.size == 0:
        raise InvalidInputError(
            f"{what} {p} is not a video OpenCV can decode (or it has no frames); {hint}"
        )
    return FrameSource(p, "video", count=n if n > 0 else None)


def split_indices(
    count: Optional[int], samples: int, holdout: int
) -> Tuple[List[int], List[int], str]:
    """Calibration and held-out frame indices, disjoint, plus a note when the source is short.

    With enough frames, ``samples + holdout`` indices are spread evenly over the
    source; the first ``samples`` calibrate and the last ``holdout`` (the end of the
    source) check agreement. A short source keeps at most half for held-out frames.
    """
    if samples < 1:
        raise InvalidInputError(f"--samples {samples}: need at least 1 calibration frame")
    if holdout < 0:
        raise InvalidInputError(f"--holdout {holdout}: must be >= 0")
    if count is None:  # unknown length: sequential
        return list(range(samples)), list(range(samples, samples + holdout)), ""
    note = ""
    if count >= samples + holdout:
        idx = (
            np.floor(np.linspace(0, count, samples + holdout, endpoint=False)).astype(int).tolist()
        )
        return idx[:samples], idx[samples:], note
    hold = min(holdout, count // 2)
    calib = min(samples, count - hold)
    note = (
        f"source has {count} frames, fewer than --samples {samples} + --holdout {holdout}: "
        f"calibrating on {calib}, checking agreement on {hold}"
    )
    return list(range(calib)), list(range(count - hold, count)), note
