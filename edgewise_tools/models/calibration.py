"""Frames for INT8 calibration and agreement checks: a folder of images or a video file.

``open_frames`` validates the source (missing, unreadable, empty or undecodable ->
``InvalidInputError`` naming the path). ``split_indices`` picks calibration frames and
*different* held-out frames spread over the whole source (held-out ones are the tail,
so they are not the calibration frames' neighbours where the source allows).
``FrameSource.read`` streams frames in index order without holding them in memory
(500 frames of 768x576 would be 660 MB); ``CalibrationReader`` feeds them, letterboxed as
the runtime does, to ONNX Runtime's calibrators batch by batch.

Images are read as the edge daemon's folder source reads them
(``edgewise.imagefiles.read_image_file``: header check, pixel limit, no partial decode
of a damaged file, EXIF orientation applied, 16-bit scaled by its depth), in natural name
order without hidden files; a video by the daemon's rule (a frame that does not decode
before the stated end is skipped: ``edgewise.imagefiles.video_ended``), and a short read
is logged and noted in ``skipped``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

from edgewise.errors import InvalidInputError
from edgewise.imagefiles import (
    IMAGE_SUFFIXES,
    dataset_hint,
    hidden,
    natural_key,
    read_image_file,
    shown,
    video_ended,
)

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
#: progress(stage, done, total): stage is "calibrate" or "agreement".
Progress = Callable[[str, int, int], None]


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
        self.skipped: List[str] = []  # unreadable images (or video frames) met while reading

    def __repr__(self) -> str:
        return f"FrameSource({str(self.path)!r}, kind={self.kind}, count={self.count})"

    def read(self, indices: Sequence[int]) -> Iterator[Tuple[int, np.ndarray]]:
        """Yield ``(index, frame)`` for increasing ``indices``; unreadable ones are skipped."""
        wanted = sorted(set(int(i) for i in indices))
        if self.kind == "images":
            for i in wanted:
                try:
                    im = read_image_file(self.files[i])
                except InvalidInputError as exc:
                    self.skipped.append(str(self.files[i]))
                    log.warning("skipping unreadable image: %s", exc)
                    continue
                yield i, im
            return
        yield from self._read_video(wanted)

    def _read_video(self, wanted: List[int]) -> Iterator[Tuple[int, np.ndarray]]:
        cap = cv2.VideoCapture(str(self.path))
        count = self.count or 0
        got, bad, pos, run = 0, 0, 0, 0

        def failed() -> bool:
            """One more failed read at ``pos``; True when the video has ended (the daemon's rule)."""
            nonlocal run
            run += 1
            return video_ended(count, pos, run)

        def short() -> None:
            if got < len(wanted):  # the video ended (or had bad frames) before the last one wanted
                log.warning("video %s: read %d of the %d frames wanted (%d undecodable skipped, ended at "
                            "frame %d%s)", shown(self.path), got, len(wanted), bad, pos,
                            f" of {count}" if count else "")

        try:
            for i in wanted:
                while pos < i:  # grab() decodes less than read()
                    ok = cap.grab()
                    pos += 1
                    if ok:
                        run = 0
                    elif failed():
                        short()
                        return
                ok, frame = cap.read()
                pos += 1
                if not ok or frame is None:
                    bad += 1
                    self.skipped.append(f"{self.path} frame {i}")
                    if failed():
                        short()
                        return
                    continue
                run = 0
                got += 1
                yield i, frame
            short()
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
            entries = sorted((n for n in os.listdir(p) if not hidden(n)), key=natural_key)
        except OSError as e:
            raise InvalidInputError(
                f"{what} folder {p} cannot be read: {e.strerror or e}"
            ) from None
        files = [p / n for n in entries if n.lower().endswith(IMAGE_SUFFIXES) and (p / n).is_file()]
        if not files:
            raise InvalidInputError(
                f"{what} folder {p} has no images ({', '.join(IMAGE_SUFFIXES)}){dataset_hint(p) or '; ' + hint}"
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
    if p.suffix.lower() in IMAGE_SUFFIXES:
        try:
            read_image_file(p)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{what}: {exc}; {hint}") from None
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


class CalibrationReader:
    """ONNX Runtime ``CalibrationDataReader``: batches of letterboxed frames, streamed.

    ``set_range`` is how ``quantize_static`` (option ``CalibStridedMinMax``) feeds the
    calibrator one batch per ``collect_data`` call, which keeps histogram memory bounded.
    """

    def __init__(
        self,
        source: FrameSource,
        indices: Sequence[int],
        input_name: str,
        imgsz: Tuple[int, int],
        stride: int,
        batch: int,
        progress: Optional[Progress],
        fixed_batch: bool = False,
    ) -> None:
        self.source = source
        self.indices = list(indices)
        self.input_name = input_name
        self.imgsz = imgsz
        self.stride = stride
        self.batch = max(1, batch)
        self.fixed_batch = fixed_batch
        self.progress = progress
        self.n_batches = (len(self.indices) + self.batch - 1) // self.batch
        self.frames_used = 0
        self._it: Optional[Iterator[Tuple[int, np.ndarray]]] = None
        self._next = 0  # next batch number get_next serves
        self._end = self.n_batches
        self._pulled = 0  # batches pulled from the frame stream
        self._last: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return self.n_batches

    def set_range(self, start_index: int, end_index: int) -> None:
        self._next, self._end = int(start_index), min(int(end_index), self.n_batches)

    def rewind(self) -> None:
        self._it, self._pulled, self._next, self._end = None, 0, 0, self.n_batches

    def _pull(self, k: int) -> Optional[np.ndarray]:
        from edgewise.runtime.letterbox import preprocess_batch

        if self._it is None or k < self._pulled:  # restart the stream (only if asked out of order)
            self._it = self.source.read(self.indices)
            self._pulled = 0
        while self._pulled <= k:
            frames = []
            for _ in range(self.batch):
                nxt = next(self._it, None)
                if nxt is None:
                    break
                frames.append(nxt[1])
            self._pulled += 1
            if self._pulled <= k:
                continue
            if not frames:
                # The source ended early (a video header over-stating its length, or
                # unreadable images): repeat the last batch so ORT never collects an
                # empty chunk; min/max is unchanged by it and frames_used stays exact.
                return self._last
            n_real = len(frames)
            if self.fixed_batch and n_real < self.batch:  # a fixed-batch model needs full batches
                frames += [frames[k % n_real] for k in range(self.batch - n_real)]
            x, _ = preprocess_batch(frames, self.imgsz, auto=False, stride=self.stride)
            self._last = x
            self.frames_used += n_real
            if self.progress is not None:
                self.progress(
                    "calibrate", min(self.frames_used, len(self.indices)), len(self.indices)
                )
            return x
        return None

    def get_next(self) -> Optional[Dict[str, np.ndarray]]:
        if self._next >= self._end:
            return None
        x = self._pull(self._next)
        self._next += 1
        return None if x is None else {self.input_name: x}


def calib_batch_size(imgsz: Tuple[int, int], method: str) -> int:
    # Histogram methods keep every activation of a batch in memory (~200 MB per
    # 640x640 frame for YOLOv5s): small batches there; min/max only keeps reductions.
    per_640 = 2 if method != "minmax" else 8
    return max(1, min(16, int(per_640 * 640 * 640 / (imgsz[0] * imgsz[1]))))
