"""Synthetic frames: moving shapes and digits on a textured background.

Used for benchmarks and tests where no camera exists: a small built-in
generator (the richer scene generator ``edgewise.synth`` is not wired in yet).
Deterministic per stream id; ``uri`` may give the size as ``WxH``.
Callers: ``edge.sources.make_source``.
"""

from __future__ import annotations

import zlib
from typing import List, Optional, Tuple

import cv2
import numpy as np


class SyntheticSource:
    """Generated frames of ``width`` x ``height``; endless unless ``max_frames``."""

    live = False
    truncated = 0

    def __init__(self, stream_id: str, size: str = "", max_frames: int = 0) -> None:
        self.width, self.height = _parse_size(size)
        self.seed = zlib.crc32(stream_id.encode())
        self.max_frames = max_frames
        self.t = 0
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
        self.t = 0

    def read(self) -> Optional[np.ndarray]:
        if self.max_frames and self.t >= self.max_frames:
            return None
        img = self.background.copy()
        scale = max(1.0, self.height / 160.0)
        for i, (x, y, vx, vy, digit, color) in enumerate(self.objects):
            px = int((x + vx * self.t) % self.width)
            py = int((y + vy * self.t) % self.height)
            r = int(8 * scale)
            if i % 2:
                cv2.rectangle(img, (px - r, py - r), (px + r, py + r), color, -1)
            else:
                cv2.circle(img, (px, py), r, color, -1)
            cv2.putText(img, str(digit), (px - r, py + r), cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 2)
        self.t += 1
        return img

    def close(self) -> None:
        pass


def _parse_size(size: str) -> Tuple[int, int]:
    if not size:
        return 640, 480
    w, _, h = size.lower().partition("x")
    if not (w.isdigit() and h.isdigit()) or not (16 <= int(w) <= 8192 and 16 <= int(h) <= 8192):
        raise ValueError(f"synthetic size must be WxH (16..8192), got {size!r}")
    return int(w), int(h)
