"""Synthetic frames, for benchmarks, demos and tests where no camera exists.

Two scenes, chosen by the stream's ``uri``:

* ``""`` or ``WxH`` (e.g. ``640x480``): a small built-in pattern, moving shapes
  and digits on a noise background; cheap, needs nothing else.
* ``digits``, ``digits:DIFFICULTY``, ``digits:DIFFICULTY:WxH``: the procedural
  camera scenes of ``edgewise.synth.StreamGenerator`` (handwritten digits over
  real video/photos, occluders, low light), with a difficulty preset
  (``easy``/``medium``/``hard``/``reference``, the default) or a difficulty
  YAML/JSON file; the held-out ``test`` assets, so what the models were trained
  on is not what the camera shows. When ``edgewise.synth`` or its assets (Debian's
  opencv-doc) are missing on the device, the stream logs why and falls back to
  the built-in pattern.

Deterministic per stream id. Callers: ``edge.sources.make_source``,
``edge.settings`` (``parse_uri`` validates ``streams[].uri``).
"""

from __future__ import annotations

import logging
import re
import zlib
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import cv2
import numpy as np

log = logging.getLogger(__name__)

SCENES = ("pattern", "digits")
DEFAULT_SIZE = (640, 480)
_SIZE = re.compile(r"^(\d+)x(\d+)$")


@dataclass(frozen=True)
class SyntheticUri:
    """A parsed synthetic ``uri``."""

    scene: str
    difficulty: str
    width: int
    height: int


def _size(text: str, uri: str) -> Tuple[int, int]:
    m = _SIZE.match(text.lower())
    if m is None or not all(16 <= int(v) <= 8192 for v in m.groups()):
        raise ValueError(f"synthetic size must be WxH with 16..8192 pixels each, got {text!r} in {uri!r}")
    return int(m.group(1)), int(m.group(2))


def parse_uri(uri: str) -> SyntheticUri:
    """``""`` | ``WxH`` | ``digits[:DIFFICULTY[:WxH]]``; ValueError says what is wrong."""
    if uri.split(":", 1)[0] != "digits":
        w, h = _size(uri, uri) if uri else DEFAULT_SIZE
        return SyntheticUri("pattern", "", w, h)
    parts = uri.split(":")
    if len(parts) > 3:
        raise ValueError(f"synthetic uri must be digits[:DIFFICULTY[:WxH]], got {uri!r}")
    difficulty = parts[1] if len(parts) > 1 and parts[1] else "reference"
    w, h = _size(parts[2], uri) if len(parts) > 2 else DEFAULT_SIZE
    return SyntheticUri("digits", difficulty, w, h)


def _digits_scene(spec: SyntheticUri, seed: int) -> Optional[Any]:
    """An ``edgewise.synth.StreamGenerator`` for ``spec``; None (logged) when the
    generator or its assets are not on this device."""
    try:
        from edgewise.synth import StreamGenerator, load_difficulty
    except ImportError as exc:
        log.warning("synthetic digits scenes need edgewise.synth (%s); using the built-in pattern", exc)
        return None
    from edgewise.errors import ConfigError

    difficulty = load_difficulty(spec.difficulty)  # checked by the settings already
    try:
        return StreamGenerator(spec.width, spec.height, difficulty, "test", seed=seed, stream=0)
    except ConfigError as exc:  # the opencv-doc assets are missing
        log.warning("synthetic digits scenes unavailable (%s); using the built-in pattern", exc)
        return None


class SyntheticSource:
    """Generated frames of ``width`` x ``height``, endless (``streams[].max_frames``
    is the capture shell's business)."""

    live = False
    skipped = 0
    last_source_ms: Optional[float] = None
    last_media_s: Optional[float] = None  # paced like a camera: the daemon's clock
    last_file: Optional[str] = None
    last_index: Optional[int] = None
    truncated = 0

    def __init__(self, stream_id: str, uri: str = "") -> None:
        self.spec = parse_uri(uri)
        self.width, self.height = self.spec.width, self.spec.height
        self.seed = zlib.crc32(stream_id.encode())
        self.t = 0
        self.scene: Optional[Any] = None  # the digits StreamGenerator, made in open()
        self.rng = np.random.default_rng(self.seed)
        self.background = self.rng.integers(40, 90, (self.height, self.width, 3), dtype=np.uint8)
        self.objects: List[Tuple[float, float, float, float, int, Tuple[int, int, int]]] = []
        for _ in range(int(self.rng.integers(2, 6))):
            x = float(self.rng.uniform(0, self.width))
            y = float(self.rng.uniform(0, self.height))
            vx = float(self.rng.uniform(-6, 6))
            vy = float(self.rng.uniform(-6, 6))
            digit = int(self.rng.integers(0, 10))
            color = tuple(int(c) for c in self.rng.integers(120, 255, 3))
            self.objects.append((x, y, vx, vy, digit, color))  # type: ignore[arg-type]

    def open(self) -> None:
        # Runs in the capture thread: building a digits scene loads its assets (~1 s).
        self.t = 0
        if self.spec.scene == "digits":
            self.scene = _digits_scene(self.spec, self.seed)

    def read(self) -> Optional[np.ndarray]:
        self.t += 1
        if self.scene is not None:
            img: np.ndarray = self.scene.next_frame()[0]
            return img
        return self._pattern(self.t - 1)

    def _pattern(self, t: int) -> np.ndarray:
        img = self.background.copy()
        scale = max(1.0, self.height / 160.0)
        for i, (x, y, vx, vy, digit, color) in enumerate(self.objects):
            px = int((x + vx * t) % self.width)
            py = int((y + vy * t) % self.height)
            r = int(8 * scale)
            if i % 2:
                cv2.rectangle(img, (px - r, py - r), (px + r, py + r), color, -1)
            else:
                cv2.circle(img, (px, py), r, color, -1)
            cv2.putText(img, str(digit), (px - r, py + r), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 2)
        return img

    def interrupt(self) -> None:
        """Nothing to wake: a generated frame takes milliseconds."""

    def close(self) -> None:
        pass
