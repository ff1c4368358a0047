"""Validation metrics (numpy): matching and AP against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise_tools.train.metrics import ap_per_class, evaluate, match_predictions, postprocess

GT = np.array([[0, 10, 10, 30, 40], [0, 60, 60, 80, 90]], np.float32)  # cls, xyxy


def test_match_predictions_per_iou_threshold() -> None:
    det = np.array([
        [10, 10, 30, 40, 0.9, 0],  # exact: TP at every threshold
        [60, 60, 80, 84, 0.8, 0],  # IoU 0.8 with the second box: TP up to 0.8
        [60, 60, 80, 90, 0.7, 1],  # right box, wrong class: never TP
        [10, 10, 30, 40, 0.6, 0],  # duplicate of the first: the first already took that label
    ], np.float32)
    c = match_predictions(det, GT, np.array([0.5, 0.75, 0.85]))
    assert c.tolist() == [[True, True, True], [True, True, False], [False, False, False],
                          [False, False, False]]


def test_ap_hand_computed() -> None:
    # TP (0.9), FP (0.8), TP (0.7) for 2 labels: precision envelope 1 up to recall 0.5, 2/3 to 1
    tp = np.array([[1], [0], [1]], bool)
    res = ap_per_class(tp, np.array([0.9, 0.8, 0.7]), np.zeros(3), np.zeros(2), nc=1)
    assert res["ap"][0, 0] == pytest.approx(0.5 * 1 + 0.5 * 2 / 3, abs=0.01)
    # a perfect ranking scores ~1 (101-point interpolation loses the last half step)
    res = ap_per_class(np.array([[1], [1]], bool), np.array([0.9, 0.8]), np.zeros(2), np.zeros(2), nc=1)
    assert res["ap"][0, 0] == pytest.approx(1.0, abs=0.01)


def test_evaluate_and_postprocess_end_to_end() -> None:
    # decoded model output rows: cx, cy, w, h, obj, cls0, cls1
    pred = np.array([
        [20, 25, 20, 30, 0.95, 0.9, 0.1],
        [20.5, 25, 20, 30, 0.90, 0.9, 0.1],  # NMS removes this duplicate
        [70, 75, 20, 30, 0.80, 0.8, 0.3],
        [150, 150, 20, 20, 0.0005, 0.9, 0.1],  # below conf
    ], np.float32)
    det = postprocess(pred, conf_thres=0.001, iou_thres=0.6)
    assert len(det) == 2 and set(det[:, 5].tolist()) == {0.0}
    m = evaluate([det], [GT], nc=2)
    assert m["map50"] == pytest.approx(1.0, abs=0.01) and m["labels"] == 2
    m = evaluate([det[:1]], [GT], nc=2)  # one of two found
    # Ultralytics' sentinel (recall 1, precision 0) ramps linearly from (0.5, 1): 0.5 + 0.25
    assert m["map50"] == pytest.approx(0.75, abs=0.01)
