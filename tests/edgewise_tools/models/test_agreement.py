"""Agreement metric on hand-built detections (pure logic)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise_tools.models.agreement import compare, match_frame


def dets(boxes, scores, classes):
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    return Detections(
        boxes=b,
        scores=np.asarray(scores, np.float32),
        class_ids=np.asarray(classes, np.int32),
        names=("a", "b"),
    )


def test_identical_detections_agree_fully():
    d = dets([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.5], [0, 1])
    a = compare([d], [d])
    assert a.f1 == 1.0 and a.precision == 1.0 and a.recall == 1.0
    assert a.score_drift == 0.0 and a.abs_score_drift == 0.0


def test_hand_computed_case():
    ref = dets([[0, 0, 10, 10], [20, 20, 40, 40], [50, 50, 60, 60]], [0.9, 0.8, 0.7], [0, 1, 0])
    cand = dets(
        [
            [0, 0, 10, 12],  # IoU 100/120 = 0.83 with ref 0, same class -> match
            [20, 20, 40, 40],  # same box as ref 1 but class 0 -> no match
            [50, 50, 56, 60],  # IoU 0.6 with ref 2 -> match
            [100, 100, 110, 110],  # nothing there
        ],
        [0.85, 0.8, 0.6, 0.3],
        [0, 0, 0, 1],
    )
    a = compare([ref], [cand])
    assert (a.matched, a.ref_boxes, a.cand_boxes) == (2, 3, 4)
    assert a.f1 == pytest.approx(2 * 2 / 7)
    assert a.precision == pytest.approx(0.5) and a.recall == pytest.approx(2 / 3)
    # drifts: 0.85-0.9 and 0.6-0.7
    assert a.score_drift == pytest.approx((-0.05 - 0.1) / 2, abs=1e-6)
    assert a.abs_score_drift == pytest.approx(0.075, abs=1e-6)


def test_greedy_by_candidate_score():
    ref = dets([[0, 0, 10, 10]], [0.9], [0])
    # Two candidates overlap the one reference; the higher-scored one takes it.
    cand = dets([[0, 0, 10, 11], [0, 0, 10, 10]], [0.4, 0.8], [0, 0])
    assert match_frame(ref, cand) == [(1, 0)]


def test_empty_frames():
    e = dets(np.zeros((0, 4)), [], [])
    a = compare([e, e], [e, e])
    assert a.frames == 2 and math.isnan(a.f1) and a.per_frame_f1 == [1.0, 1.0]
    d = dets([[0, 0, 10, 10]], [0.9], [0])
    a = compare([d], [e])
    assert a.f1 == 0.0 and a.recall == 0.0 and math.isnan(a.precision)


def test_frame_count_mismatch():
    d = dets([[0, 0, 10, 10]], [0.9], [0])
    with pytest.raises(ValueError, match="1 reference frames but 2"):
        compare([d], [d, d])
