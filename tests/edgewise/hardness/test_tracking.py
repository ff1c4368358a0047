"""The IoU tracker behind ``tracker_disagreement``: appear/vanish, min-hits, max-age."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.hardness import SignalConfig, compute_signals
from edgewise.hardness.tracking import TrackerState, greedy_match, iou_matrix, track_step

A = [0, 0, 10, 10]
B = [100, 100, 120, 120]
C = [300, 300, 330, 330]
CFG = SignalConfig(track_iou=0.3, track_min_hits=2, track_max_age=2)


def frame(*boxes):
    n = len(boxes)
    return Detections(
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        scores=np.full(n, 0.9, np.float32),
        class_ids=np.zeros(n, np.int32),
    )


def run(frames):
    state = None
    out = []
    for f in frames:
        s, state = compute_signals(f, state, CFG)
        out.append(s["tracker_disagreement"])
    return out, state


def test_iou_matrix_hand_computed():
    iou = iou_matrix(np.array([[0, 0, 10, 10]], float), np.array([[5, 0, 15, 10], [20, 20, 30, 30]], float))
    assert iou[0, 0] == pytest.approx(50 / 150)
    assert iou[0, 1] == 0.0


def test_greedy_match_takes_best_pairs_first():
    iou = np.array([[0.9, 0.8], [0.85, 0.1]])
    # (0,0)=0.9 first; (1,0) and (0,1) reuse a taken index; (1,1)=0.1 is below 0.3
    assert greedy_match(iou, 0.3) == [(0, 0)]
    assert greedy_match(np.array([[0.9, 0.0], [0.0, 0.5]]), 0.3) == [(0, 0), (1, 1)]
    assert greedy_match(np.array([[0.2]]), 0.3) == []


def test_vanish_appear_sequence():
    moved_a = [1, 1, 11, 11]
    seq = [
        frame(A, B),            # 0: warm-up -> 0
        frame(moved_a, B),      # 1: warm-up (1 frame seen < min_hits 2) -> 0
        frame(A, B),            # 2: all matched -> 0
        frame(A),               # 3: B (confirmed) vanishes -> (0+1)/(1+1)
        frame(A),               # 4: B coasting, already counted -> 0
        frame(A, B),            # 5: B back within max_age -> matched -> 0
        frame(A, B, C),         # 6: C appears -> 1/3
    ]
    out, _ = run(seq)
    assert out == pytest.approx([0, 0, 0, 0.5, 0, 0, 1 / 3])


def test_empty_frame_after_confirmed_tracks_is_fully_disagreeing():
    out, _ = run([frame(A, B), frame(A, B), frame(A, B), frame()])
    assert out[-1] == 1.0


def test_one_frame_flicker_is_counted_once_not_twice():
    out, _ = run([frame(A), frame(A), frame(A), frame(A, C), frame(A)])
    assert out[3] == pytest.approx(1 / 2)  # C appears
    assert out[4] == 0.0  # C had 1 hit < min_hits: its vanishing is noise


def test_track_dies_after_max_age_and_reappearance_counts():
    out, state = run([frame(A, B), frame(A, B), frame(A, B), frame(A), frame(A), frame(A), frame(A, B)])
    assert out[3] == pytest.approx(0.5)
    assert out[6] == pytest.approx(0.5)  # B dropped after 3 misses > max_age 2, so it "appears"
    assert len(state) == 2


def test_track_step_state_is_a_new_value():
    s0 = TrackerState()
    u1 = track_step(np.array([A], np.float32), s0)
    assert len(s0) == 0 and len(u1.state) == 1 and u1.appeared == 1 and u1.vanished == 0
    u2 = track_step(np.array([A], np.float32), u1.state)
    assert int(u1.state.hits[0]) == 1 and int(u2.state.hits[0]) == 2
