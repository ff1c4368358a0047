"""Real imagery the generator draws from: handwritten digit sprites and backgrounds.

Everything comes from Debian's ``opencv-doc`` package (``OPENCV_DATA``):
``digits.png`` (5,000 handwritten digits of 20x20, 500 per class, row-major by
class), ``vtest.avi`` (795 frames of pedestrians) and the photographs next to it.

Splits never share handwriting with the test split: a fixed permutation per
class holds out ``HELDOUT_FRACTION`` of each class's samples for ``test``;
``train`` and ``val`` draw from the rest. Backgrounds are split too: the video's
frames are cut in three time ranges and photographs are assigned by name.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import cv2
import numpy as np

from edgewise.errors import ConfigError

OPENCV_DATA = Path(os.environ.get("EDGEWISE_OPENCV_DATA", "/usr/share/doc/opencv-doc/examples/data"))
SPLITS = ("train", "val", "test")
HELDOUT_FRACTION = 0.2
_SPRITE_PERM_SEED = 20261130
#: video frame ranges per split (vtest.avi has 795 frames)
_VIDEO_RANGES = {"train": (0, 560), "val": (560, 670), "test": (670, 795)}
#: photographs that are too small, synthetic or not scene-like are skipped
_PHOTO_SKIP = {"digits.png", "mask.png", "gradient.png", "chessboard.png", "ml.png",
               "opencv-logo.png", "opencv-logo-white.png", "alphabet_36.txt", "notes.png",
               "imageTextN.png", "imageTextR.png", "sudoku.png", "pca_test1.jpg", "detect_blob.png",
               "aloeGT.png", "LinuxLogo.jpg", "WindowsLogo.jpg", "box.png", "cards.png",
               "ellipses.jpg", "squirrel_cls.jpg", "licenseplate_motion.jpg", "smarties.png",
               "pic1.png", "pic2.png", "pic3.png", "pic4.png", "pic5.png", "pic6.png",
               "text_defect.png"}
_PHOTO_EXT = (".jpg", ".png")


def _need(path: Path) -> Path:
    if not path.exists():
        raise ConfigError(
            f"{path} not found: install Debian's opencv-doc package (apt-get install opencv-doc) "
            f"or point EDGEWISE_OPENCV_DATA at a folder with digits.png and vtest.avi")
    return path


def split_of_name(name: str) -> str:
    """Stable split for a photograph: ~70% train, 15% val, 15% test by name hash."""
    h = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16) % 100
    return "train" if h < 70 else ("val" if h < 85 else "test")


@dataclass
class DigitSprites:
    """Per-class digit alpha sprites (float32 in [0,1], 20x20) for one split."""

    by_class: List[np.ndarray]  # class -> [n, 20, 20]


_SPRITE_CACHE: Dict[str, DigitSprites] = {}
_BG_CACHE: Dict[Tuple[str, int], List[np.ndarray]] = {}


def load_sprites(split: str) -> DigitSprites:
    """Digit sprites for ``split``; ``test`` gets the held-out handwriting only."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split in _SPRITE_CACHE:
        return _SPRITE_CACHE[split]
    img = cv2.imread(str(_need(OPENCV_DATA / "digits.png")), cv2.IMREAD_GRAYSCALE)
    if img is None or img.shape != (1000, 2000):
        raise ConfigError(f"{OPENCV_DATA / 'digits.png'}: expected a 1000x2000 grey image")
    cells = img.reshape(50, 20, 100, 20).transpose(0, 2, 1, 3).reshape(5000, 20, 20)
    rng = np.random.default_rng(_SPRITE_PERM_SEED)
    by_class = []
    for c in range(10):
        samples = cells[c * 500:(c + 1) * 500].astype(np.float32) / 255.0
        perm = rng.permutation(500)
        n_test = int(round(500 * HELDOUT_FRACTION))
        idx = perm[:n_test] if split == "test" else perm[n_test:]
        chosen = samples[np.sort(idx)]
        # drop near-empty cells (none expected, but be safe)
        keep = chosen.reshape(len(chosen), -1).max(axis=1) > 0.5
        by_class.append(np.ascontiguousarray(chosen[keep]))
    sprites = DigitSprites(by_class)
    _SPRITE_CACHE[split] = sprites
    return sprites


def _video_frames(split: str, width: int) -> List[np.ndarray]:
    path = _need(OPENCV_DATA / "vtest.avi")
    lo, hi = _VIDEO_RANGES[split]
    cap = cv2.VideoCapture(str(path))
    frames: List[np.ndarray] = []
    i = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if lo <= i < hi:
            h = int(round(frame.shape[0] * width / frame.shape[1]))
            frames.append(cv2.resize(frame, (width, h), interpolation=cv2.INTER_AREA))
        i += 1
        if i >= hi:
            break
    cap.release()
    if not frames:
        raise ConfigError(f"{path}: could not decode frames {lo}..{hi} (is OpenCV built with video I/O?)")
    return frames


def load_video(split: str, width: int) -> List[np.ndarray]:
    """Frames of vtest.avi for ``split``, resized to ``width`` (BGR uint8)."""
    key = ("video:" + split, width)
    if key not in _BG_CACHE:
        _BG_CACHE[key] = _video_frames(split, width)
    return _BG_CACHE[key]


def load_photos(split: str, min_side: int) -> List[np.ndarray]:
    """Photographs for ``split`` (BGR uint8) scaled so the short side is >= ``min_side``."""
    key = ("photo:" + split, min_side)
    if key in _BG_CACHE:
        return _BG_CACHE[key]
    out: List[np.ndarray] = []
    for p in sorted(_need(OPENCV_DATA).iterdir()):
        if p.suffix.lower() not in _PHOTO_EXT or p.name in _PHOTO_SKIP or split_of_name(p.name) != split:
            continue
        if p.name.startswith("right"):  # stereo twins of left*.jpg: same chessboard scenes
            continue
        img: Optional[np.ndarray] = cv2.imread(str(p), cv2.IMREAD_COLOR)
        if img is None or min(img.shape[:2]) < 200:
            continue
        s = min_side / min(img.shape[:2])
        if s > 1.0:
            img = cv2.resize(img, None, fx=s, fy=s, interpolation=cv2.INTER_LINEAR)
        out.append(img)
    _BG_CACHE[key] = out
    return out
