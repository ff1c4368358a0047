"""Micro-benchmark of the per-frame cost of hardness signals + policy decision.

``measure_cost()`` runs :func:`compute_signals`, :func:`combine` and
:meth:`Escalator.decide` on synthetic frames shaped like YOLOv5 output after
NMS (the target is <= 1 ms per frame for hardness + policy together) and returns
microseconds per frame. With ``frame_size`` it also runs the motion detector
(:mod:`edgewise.hardness.motion`) on noisy frames of that size with moving squares,
as the daemon does when a policy uses motion. ``python -m edgewise.hardness``
prints a table.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from edgewise.detections import Detections


def synthetic_frames(n_frames: int, n_boxes: int, nc: int, seed: int = 0) -> List[Detections]:
    """Frames of ``n_boxes`` drifting random boxes with ``nc``-class scores (640x480)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform([0, 0, 20, 20], [560, 400, 80, 80], size=(n_boxes, 4))
    names = tuple(str(i) for i in range(nc))
    frames = []
    for f in range(n_frames):
        xy = base[:, :2] + f * 0.5 + rng.normal(0, 1.0, (n_boxes, 2))
        boxes = np.concatenate([xy, xy + base[:, 2:]], axis=1).astype(np.float32)
        cs = rng.uniform(0, 1, (n_boxes, nc)).astype(np.float32) ** 4
        obj = rng.uniform(0.3, 1.0, n_boxes).astype(np.float32)
        cs = cs * obj[:, None]
        keep = rng.uniform(size=n_boxes) > 0.1  # some boxes flicker
        frames.append(
            Detections(
                boxes=boxes[keep],
                scores=cs.max(axis=1)[keep],
                class_ids=cs.argmax(axis=1).astype(np.int32)[keep],
                class_scores=cs[keep],
                objectness=obj[keep],
                names=names,
                source="edge",
                missed_objectness=float(rng.uniform(0, 0.6)),
            )
        )
    return frames


def synthetic_pixels(n_frames: int, size: Tuple[int, int], seed: int = 0) -> List[np.ndarray]:
    """Noisy grey-ish BGR frames of ``size`` (width, height) with a few moving squares."""
    rng = np.random.default_rng(seed)
    w, h = size
    base = rng.integers(40, 200, (h, w, 3), dtype=np.uint8)
    out = []
    for f in range(n_frames):
        im = base.copy()
        for k in range(4):
            x, y = int((37 * k + 5 * f) % max(w - 24, 1)), int((h // 3 + 29 * k) % max(h - 24, 1))
            im[y:y + 24, x:x + 24] = 250
        out.append(im)
    return out


def measure_cost(n_frames: int = 2000, n_boxes: int = 20, nc: int = 80,
                 frame_size: Optional[Tuple[int, int]] = None) -> Dict[str, float]:
    """Mean CPU cost in µs/frame of ``signals``, ``motion`` (0 without ``frame_size``),
    ``policy`` (decide) and ``total``."""
    from edgewise.hardness.motion import MotionDetector
    from edgewise.hardness.signals import compute_signals
    from edgewise.policy.deciding import Escalator
    from edgewise.policy.schema import Policy

    frames = synthetic_frames(min(n_frames, 200), n_boxes, nc)
    policy = Policy()
    cfg = policy.signal_config("bench", frame_size=(640, 480))
    esc = Escalator(policy, clock=lambda: 0.0)
    state = None
    sig_s = pol_s = 0.0
    # CPU time of this process: on a shared machine wall time mostly measures
    # the neighbours; process_time counts only the cycles we spent.
    pc = time.process_time
    pixels = synthetic_pixels(30, frame_size) if frame_size is not None else []
    motion = MotionDetector() if pixels else None
    mot_s = 0.0
    for i in range(n_frames):
        d = frames[i % len(frames)]
        t0 = t1 = pc()
        found = None
        if motion is not None:
            found = motion.update(pixels[i % len(pixels)], d).signals
            t1 = pc()
        signals, state = compute_signals(d, state, cfg, motion=found)
        t2 = pc()
        esc.decide("bench", i, d, signals, now=i / 30.0)
        t3 = pc()
        mot_s += t1 - t0
        sig_s += t2 - t1
        pol_s += t3 - t2
    us = 1e6 / n_frames
    return {"signals_us": sig_s * us, "motion_us": mot_s * us, "policy_us": pol_s * us,
            "total_us": (sig_s + mot_s + pol_s) * us, "boxes": float(n_boxes), "classes": float(nc)}
