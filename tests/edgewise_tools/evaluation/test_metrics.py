"""Eval metrics against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgewise_tools.evaluation.metrics import (
    Counts,
    average_precision,
    match,
    match_counts,
    mean_ap,
)


def B(*rows):
    return np.asarray(rows, np.float32).reshape(-1, 4)


def test_match_greedy_by_score_and_class() -> None:
    gt = B([0, 0, 10, 10], [20, 20, 30, 30])
    gt_cls = np.array([1, 2])
    # p0: perfect on gt0 (score .9); p1: duplicate of gt0 (score .8) -> FP;
    # p2: right place of gt1 but wrong class -> FP; p3: IoU 0.47 with gt1, right class -> FP at 0.5
    pred = B([0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30], [22, 22, 32, 32])
    cls = np.array([1, 1, 1, 2])
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    assert match(pred, cls, scores, gt, gt_cls).tolist() == [True, False, False, False]
    c = match_counts(pred, cls, scores, gt, gt_cls)
    assert (c.tp, c.fp, c.fn) == (1, 3, 1)
    assert c.f1 == pytest.approx(2 / (2 + 3 + 1))
    # A lower threshold admits p3 (IoU = 64/136 = 0.4706).
    assert match_counts(pred, cls, scores, gt, gt_cls, iou_thres=0.45).tp == 2


def test_higher_score_wins_the_ground_truth() -> None:
    gt = B([0, 0, 10, 10])
    pred = B([1, 0, 11, 10], [0, 0, 10, 10])  # the better-placed box has the lower score
    m = match(pred, np.array([0, 0]), np.array([0.9, 0.5]), gt, np.array([0]))
    assert m.tolist() == [True, False]


def test_counts_edge_cases() -> None:
    assert Counts().f1 == 1.0  # nothing to find, nothing found
    assert Counts(fn=3).f1 == 0.0 and Counts(fp=2).precision == 0.0
    total = Counts(1, 1, 0)
    total += Counts(1, 0, 1)
    assert (total.tp, total.fp, total.fn) == (2, 1, 1)


def test_average_precision_hand_computed() -> None:
    # scores .9 TP, .8 FP, .7 TP with 3 GT: precision 1, .5, .667 at recall 1/3, 1/3, 2/3
    # envelope: 1.0 up to 1/3, 0.667 up to 2/3, 0 beyond -> AP = 1/3 + 0.667/3 = 0.5556
    ap = average_precision([0.9, 0.8, 0.7], [True, False, True], 3)
    assert ap == pytest.approx(1 / 3 + (2 / 3) / 3)
    assert average_precision([], [], 2) == 0.0
    assert math.isnan(average_precision([0.5], [False], 0))
    assert average_precision([0.2, 0.9], [True, True], 2) == pytest.approx(1.0)


def test_mean_ap_over_frames_and_classes() -> None:
    gts = [(B([0, 0, 10, 10]), np.array([0])), (B([0, 0, 10, 10]), np.array([1]))]
    preds = [(B([0, 0, 10, 10]), np.array([0]), np.array([0.9])),
             (B([50, 50, 60, 60]), np.array([1]), np.array([0.9]))]
    m, per = mean_ap(preds, gts, nc=3)
    assert per == {0: pytest.approx(1.0), 1: pytest.approx(0.0)}  # class 2 has no GT: not averaged
    assert m == pytest.approx(0.5)
