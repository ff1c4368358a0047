"""Motion the detections do not explain: real MOG2 on synthetic frames with known objects."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.hardness import SIGNAL_NAMES, SignalConfig, compute_signals
from edgewise.hardness.motion import MOTION_SIGNALS, MotionConfig, MotionDetector


def dets(*boxes) -> Detections:
    b = np.array(boxes, np.float32).reshape(-1, 4)
    return Detections(boxes=b, scores=np.full(len(b), 0.9, np.float32), class_ids=np.zeros(len(b), np.int32),
                      names=("a",))


def frames(n: int, appear: int, squares, size=(720, 1280), seed: int = 0):
    """Grey noisy background; each square (x, y, side) appears at frame ``appear`` and stays."""
    rng = np.random.default_rng(seed)
    base = rng.integers(60, 120, size + (3,)).astype(np.float32)
    for i in range(n):
        im = base + rng.normal(0, 2.0, base.shape)
        if i >= appear:
            for x, y, s in squares:
                im[y:y + s, x:x + s] = 230.0
        yield np.clip(im, 0, 255).astype(np.uint8)


def run(det: MotionDetector, seq, boxes=()):
    return [det.update(f, dets(*boxes)) for f in seq]


def test_a_new_small_object_is_unexplained_motion_until_a_detection_covers_it() -> None:
    small = [(200, 296, 16), (600, 304, 16), (1000, 320, 24)]  # three far objects, 16-24 px
    out = run(MotionDetector(), frames(20, 12, small))
    assert all(r.signals == {"motion": 0.0, "motion_blobs": 0.0} for r in out[:12])  # warm-up, then nothing
    hit = out[12]
    assert hit.signals["motion_blobs"] == pytest.approx(3 / 8) and 0 < hit.signals["motion"] <= 1
    for x, y, s in small:  # each object lies inside one reported blob (frame pixels)
        inside = ((hit.blobs[:, 0] <= x + 2) & (hit.blobs[:, 2] >= x + s - 2)
                  & (hit.blobs[:, 1] <= y + 2) & (hit.blobs[:, 3] >= y + s - 2))
        assert inside.sum() == 1
    # the same objects with edge detections on them are explained
    covered = run(MotionDetector(), frames(20, 12, small), boxes=[(x, y, x + s, y + s) for x, y, s in small])
    assert covered[12].signals == {"motion": 0.0, "motion_blobs": 0.0} and len(covered[12].blobs) == 0


def test_a_large_blob_counts_as_motion_area_not_as_a_small_blob() -> None:
    out = run(MotionDetector(MotionConfig(area_saturation=0.05)), frames(14, 10, [(300, 200, 200)]))
    assert out[10].signals["motion_blobs"] == 0.0
    assert out[10].signals["motion"] == pytest.approx(min(1.0, (200 / 8) ** 2 / (160 * 90) / 0.05), rel=0.35)


def test_warmup_and_a_new_frame_size_restart_the_background() -> None:
    det = MotionDetector(MotionConfig(warmup_frames=3))
    run(det, frames(6, 100, []))
    assert det.frames == 6
    r = det.update(next(frames(1, 100, [], size=(360, 640))), dets())
    assert det.frames == 1 and r.signals["motion"] == 0.0
    with pytest.raises(ValueError):
        MotionDetector(MotionConfig(width=4))


def test_motion_joins_the_signals_and_is_zero_when_not_measured() -> None:
    assert SIGNAL_NAMES[-2:] == MOTION_SIGNALS
    s, _ = compute_signals(dets(), None, SignalConfig())
    assert set(s) == set(SIGNAL_NAMES) and s["motion"] == s["motion_blobs"] == 0.0
    s, _ = compute_signals(dets(), None, SignalConfig(), motion={"motion": 0.4, "motion_blobs": 1.0})
    assert (s["motion"], s["motion_blobs"]) == (0.4, 1.0)


def test_cost_of_a_1280x720_frame_is_well_under_a_millisecond() -> None:
    import time

    det = MotionDetector()
    seq = list(frames(30, 15, [(200, 300, 24)]))
    t = []
    for f in seq:
        t0 = time.process_time()
        det.update(f, dets())
        t.append(time.process_time() - t0)
    # CPU time, not wall time: neighbours on a shared machine do not count (bench/edge.py measures the rest)
    assert np.median(t) < 0.004, np.median(t)
