"""Motion the edge model cannot explain: cheap change evidence for what it cannot see.

A small edge model that runs on a downscaled frame misses far objects entirely: they
leave no box, no low score, nothing for the box-based signals to point at. They still
*change pixels*. :class:`MotionDetector` keeps, per stream, OpenCV's MOG2 background
subtractor (Zivkovic, "Improved adaptive Gaussian mixture model for background
subtraction", ICPR 2004; Zivkovic and van der Heijden, Pattern Recognition Letters 27(7),
2006) on a grey copy of the frame a few hundred pixels wide, and reports the foreground
blobs that no edge detection covers. This is the change evidence Reducto and Glimpse
compute on the camera (docs/design/escalation.md#motion-signal), turned into two signals
and into regions worth sending at full resolution (DDS's feedback regions,
:mod:`edgewise.regions`):

* ``motion``: foreground area outside every detection (grown by ``explain_margin``), as a
  fraction of the frame, divided by ``area_saturation`` and capped at 1;
* ``motion_blobs``: unexplained blobs no larger than ``small_blob`` of the frame (far
  objects are small; a walking person or a moving pole is a large blob), divided by
  ``blob_saturation`` and capped at 1.

The mask is dilated once (3x3) so the fragments of one object count as one blob. Both
signals are 0 for the first ``warmup_frames`` frames of a stream, while the model learns
the background. Cost: a resize (INTER_LINEAR) and MOG2 on about 160x90 pixels, well under
a millisecond for a 1280x720 frame (``bench/edge.py`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import cv2
import numpy as np

from edgewise.detections import Detections

#: the signals this module adds to :data:`edgewise.hardness.signals.SIGNAL_NAMES`
MOTION_SIGNALS: Tuple[str, ...] = ("motion", "motion_blobs")


@dataclass(frozen=True)
class MotionConfig:
    """Parameters of :class:`MotionDetector` (the policy's ``signals.motion`` section).

    Attributes:
        width: width in pixels of the grey copy the subtractor runs on (height keeps the
            frame's aspect).
        history: frames of MOG2's background model.
        var_threshold: MOG2's squared Mahalanobis distance above which a pixel is
            foreground (OpenCV's default is 16; 25 ignores more sensor noise).
        warmup_frames: frames of a stream before the signals count.
        explain_margin: a detection box is grown by this fraction of the frame width on
            each side before it explains a blob.
        small_blob: largest blob area, as a fraction of the frame, counted by
            ``motion_blobs``.
        area_saturation: unexplained foreground fraction at which ``motion`` reaches 1.
        blob_saturation: small unexplained blobs at which ``motion_blobs`` reaches 1.
    """

    width: int = 160
    history: int = 100
    var_threshold: float = 25.0
    warmup_frames: int = 5
    explain_margin: float = 0.01
    small_blob: float = 0.002
    area_saturation: float = 0.01
    blob_saturation: int = 8


@dataclass
class MotionResult:
    """One frame's motion evidence.

    Attributes:
        signals: ``{"motion": .., "motion_blobs": ..}`` in [0, 1].
        blobs: [k, 4] xyxy float32 boxes, in frame pixels, of the unexplained blobs.
    """

    signals: Dict[str, float]
    blobs: np.ndarray


NO_MOTION = MotionResult({name: 0.0 for name in MOTION_SIGNALS}, np.zeros((0, 4), np.float32))


class MotionDetector:
    """Background subtraction for one stream; call :meth:`update` with every frame in order."""

    def __init__(self, cfg: MotionConfig = MotionConfig()) -> None:
        if cfg.width < 16 or cfg.history < 1:
            raise ValueError("motion width must be >= 16 and history >= 1")
        self.cfg = cfg
        self.frames = 0
        self._size: Tuple[int, int] = (0, 0)
        self._mog: Any = None
        self._kernel = np.ones((3, 3), np.uint8)

    def _reset(self, size: Tuple[int, int]) -> None:
        self._size = size
        self.frames = 0
        self._mog = cv2.createBackgroundSubtractorMOG2(history=self.cfg.history,
                                                       varThreshold=self.cfg.var_threshold, detectShadows=False)

    def update(self, frame: np.ndarray, dets: Detections) -> MotionResult:
        """Feed one BGR (or grey) frame and its edge detections; a new frame size restarts
        the background model."""
        cfg = self.cfg
        h, w = frame.shape[:2]
        if (w, h) != self._size:
            self._reset((w, h))
        sw = min(cfg.width, w)
        sh = max(1, int(round(h * sw / w)))
        small = cv2.resize(frame, (sw, sh), interpolation=cv2.INTER_LINEAR)
        if small.ndim == 3:
            small = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY)
        mask = self._mog.apply(small)
        self.frames += 1
        if self.frames <= cfg.warmup_frames:
            return MotionResult(dict(NO_MOTION.signals), NO_MOTION.blobs)
        mask = cv2.dilate(mask, self._kernel)
        n, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        sx, sy = w / sw, h / sh
        if n <= 1:
            return MotionResult(dict(NO_MOTION.signals), NO_MOTION.blobs)
        st = stats[1:].astype(np.float64)
        boxes = np.stack([st[:, 0] * sx, st[:, 1] * sy, (st[:, 0] + st[:, 2]) * sx, (st[:, 1] + st[:, 3]) * sy], 1)
        area = st[:, 4] / float(sw * sh)
        unexplained = ~_covered(boxes, dets.boxes, cfg.explain_margin * w)
        small_blobs = int(np.count_nonzero(unexplained & (area <= cfg.small_blob)))
        signals = {
            "motion": min(1.0, float(area[unexplained].sum()) / max(cfg.area_saturation, 1e-9)),
            "motion_blobs": min(1.0, small_blobs / max(cfg.blob_saturation, 1)),
        }
        return MotionResult(signals, boxes[unexplained].astype(np.float32))


def _covered(blobs: np.ndarray, dets: np.ndarray, margin: float) -> np.ndarray:
    """Mask of blobs that overlap a detection box grown by ``margin`` pixels."""
    if len(dets) == 0 or len(blobs) == 0:
        return np.zeros(len(blobs), bool)
    d = np.asarray(dets, np.float64).reshape(-1, 4)
    x0, y0 = d[:, 0] - margin, d[:, 1] - margin
    x1, y1 = d[:, 2] + margin, d[:, 3] + margin
    hit = ((blobs[:, None, 0] < x1[None]) & (blobs[:, None, 2] > x0[None])
           & (blobs[:, None, 1] < y1[None]) & (blobs[:, None, 3] > y0[None]))
    return np.asarray(hit.any(axis=1), bool)
