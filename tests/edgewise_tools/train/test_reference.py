"""Reference-pair scoring: ignore regions and the hard/easy split (pure numpy cases)."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise_tools.train.camera import edge_shape
from edgewise_tools.train.reference import _map50, is_hard

LAB = np.array([[3, 10, 10, 30, 40], [8, 60, 60, 70, 75]], np.float32)  # cls, xyxy


def test_detection_on_an_ignore_region_is_neither_tp_nor_fp() -> None:
    dets = [np.array([[10, 10, 30, 40, 0.9, 3], [100, 100, 120, 130, 0.8, 5]], np.float32)]
    ign = [np.array([[100, 100, 120, 130]], np.float32)]
    m, pr = _map50(dets, [LAB[:1]], ign, nc=10)
    assert m == pytest.approx(1.0, abs=0.01)
    assert pr["precision@0.25"] == 1.0 and pr["recall@0.25"] == 1.0
    # without the ignore region the second detection is a false positive
    m, pr = _map50(dets, [LAB[:1]], [np.zeros((0, 4), np.float32)], nc=10)
    assert pr["precision@0.25"] == 0.5


def test_wrong_class_counts_as_miss_and_false_positive() -> None:
    dets = [np.array([[10, 10, 30, 40, 0.9, 3], [60, 60, 70, 75, 0.8, 3]], np.float32)]  # 8 read as 3
    m, pr = _map50(dets, [LAB], [np.zeros((0, 4), np.float32)], nc=10)
    assert pr["recall@0.25"] == 0.5 and pr["precision@0.25"] == 0.5
    assert m == pytest.approx((1.0 + 0.0) / 2, abs=0.01)  # class 3: its one label found first; class 8: AP 0


def test_own_threshold_scores_beside_yolov5s_default() -> None:
    dets = [np.array([[10, 10, 30, 40, 0.9, 3], [100, 100, 120, 130, 0.3, 5], [60, 60, 70, 75, 0.4, 8]], np.float32)]
    m, pr = _map50(dets, [LAB], [np.zeros((0, 4), np.float32)], nc=10, conf=0.5)
    assert pr["precision@0.25"] == pytest.approx(2 / 3, abs=1e-3) and pr["recall@0.25"] == 1.0
    assert pr["op"] == {"conf": 0.5, "precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3, abs=1e-3)}
    assert "op" not in _map50(dets, [LAB], [np.zeros((0, 4), np.float32)], nc=10)[1]


@pytest.mark.parametrize("imgsz, frame, shape", [(320, (720, 1280), (192, 320)), (416, (720, 1280), (256, 416)),
                                                 (640, (1080, 1920), (384, 640)), (416, (1280, 720), (416, 256)),
                                                 (320, (640, 640), (320, 320))])
def test_edge_export_shape_keeps_the_frames_aspect(imgsz: int, frame: tuple, shape: tuple) -> None:
    assert edge_shape(imgsz, frame) == shape


def test_hard_rule() -> None:
    easy = {"size_px": 30.0, "contrast": 0.5, "visible": 1.0}
    assert not is_hard(easy)
    assert is_hard({**easy, "size_px": 12.0})
    assert is_hard({**easy, "contrast": 0.1})
    assert is_hard({**easy, "visible": 0.6})
