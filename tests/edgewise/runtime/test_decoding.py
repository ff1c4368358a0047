"""YOLOv5 head decode on hand-built head tensors with answers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.runtime.decoding import DecodeParams, decode, decode_one, xywh2xyxy
from edgewise.runtime.letterbox import letterbox_shape

NAMES = ("a", "b", "c")


def _head() -> np.ndarray:
    rows = [
        # x,  y,  w,  h,  obj,  cls a, b, c
        [10, 10, 10, 10, 0.9, 0.9, 0.1, 0.1],  # 0: kept, a, 0.81
        [11, 10, 10, 10, 0.8, 0.8, 0.1, 0.1],  # 1: a 0.64, IoU 0.818 with 0 -> suppressed
        [11, 10, 10, 10, 0.8, 0.1, 0.9, 0.1],  # 2: b 0.72 -> kept (other class)
        [40, 40, 8, 8, 0.2, 1.0, 0.0, 0.0],  # 3: objectness under conf -> not a candidate
        [50, 50, 4, 4, 0.5, 0.3, 0.3, 0.3],  # 4: score 0.15 -> dropped; free -> missed = 0.5
        [30, 30, 4, 4, 0.005, 1.0, 1.0, 1.0],  # 5: under the missed floor
        [62, 10, 6, 6, 1.0, 0.6, 0.7, 0.0],  # 6: b 0.7 (multi-label: a 0.6 too); spills past x=64
    ]
    return np.array(rows, np.float32)


def _meta():
    # a 128x128 source letterboxed to 64: ratio 0.5, no padding
    return letterbox_shape((128, 128), 64, auto=False)[3]


def test_known_answer():
    d = decode_one(_head(), _meta(), NAMES, DecodeParams(conf_thres=0.25, iou_thres=0.45), source="edge")
    order = np.argsort(-d.scores)
    assert d.scores[order].tolist() == pytest.approx([0.81, 0.72, 0.7])
    assert d.class_ids[order].tolist() == [0, 1, 1]
    # input boxes (5,5,15,15), (6,5,16,15), (59,7,65,13) -> x2 source pixels, clipped to 128
    np.testing.assert_allclose(
        d.boxes[order], [[10, 10, 30, 30], [12, 10, 32, 30], [118, 14, 128, 26]], atol=1e-4
    )
    np.testing.assert_allclose(d.objectness[order], [0.9, 0.8, 1.0], atol=1e-6)
    np.testing.assert_allclose(d.class_scores[order][0], [0.81, 0.09, 0.09], atol=1e-6)
    assert d.class_scores.shape == (3, 3)
    assert d.missed_objectness == pytest.approx(0.5)
    assert d.names == NAMES and d.source == "edge"


@pytest.mark.parametrize("box", [[np.nan, 20, 8, 8], [20, 20, np.inf, 8], [20, 20, -8, 8], [20, 20, 8, 0]])
def test_a_row_without_a_usable_box_is_neither_a_detection_nor_a_missed_object(box):
    """One frame of a float16 engine can overflow: a NaN box reached records as invalid JSON and
    region payloads as a traceback; a negative width became an inverted box."""
    head = _head()
    bad = np.array([box + [0.99, 0.99, 0.0, 0.0]], np.float32)
    d = decode_one(np.vstack([head, bad]), _meta(), NAMES, DecodeParams(conf_thres=0.25, iou_thres=0.45))
    ref = decode_one(head, _meta(), NAMES, DecodeParams(conf_thres=0.25, iou_thres=0.45))
    np.testing.assert_array_equal(d.boxes, ref.boxes)
    assert d.missed_objectness == ref.missed_objectness == pytest.approx(0.5)
    assert np.isfinite(d.boxes).all()


def test_a_score_a_little_over_one_is_clipped_to_one():
    """Objectness and class score each within the model check's tolerance (1.008) made 1.016,
    which the wire refuses: the cloud's whole answer was dropped."""
    head = np.array([[10, 10, 10, 10, 1.008, 1.008, 0.0, 0.0]], np.float32)
    d = decode_one(head, None, NAMES, DecodeParams(conf_thres=0.25))
    assert d.scores.tolist() == [1.0] and d.class_scores.max() == 1.0


def test_best_first_and_no_meta_keeps_input_pixels():
    d = decode_one(_head(), None, NAMES)
    assert d.scores.tolist() == sorted(d.scores.tolist(), reverse=True)
    assert d.boxes[0].tolist() == [5, 5, 15, 15]
    assert d.boxes[2].tolist() == pytest.approx([59, 7, 65, 13])  # not clipped without meta


def test_multi_label_emits_one_box_per_class_above_threshold():
    d = decode_one(_head(), None, NAMES, DecodeParams(multi_label=True))
    pairs = sorted((round(float(s), 4), int(c)) for s, c in zip(d.scores, d.class_ids))
    assert pairs == [(0.6, 0), (0.7, 1), (0.72, 1), (0.81, 0)]


def test_agnostic_nms_suppresses_across_classes():
    d = decode_one(_head(), None, NAMES, DecodeParams(agnostic=True))
    assert sorted(d.scores.tolist()) == pytest.approx([0.7, 0.81])


def test_max_det_and_conf():
    d = decode_one(_head(), None, NAMES, DecodeParams(max_det=1))
    assert d.scores.tolist() == pytest.approx([0.81])
    d = decode_one(_head(), None, NAMES, DecodeParams(conf_thres=0.75))
    assert d.scores.tolist() == pytest.approx([0.81])


def test_missed_objectness_when_nothing_is_kept_and_when_all_overlap():
    head = _head()
    d = decode_one(head, None, NAMES, DecodeParams(conf_thres=0.95))
    assert len(d) == 0 and d.missed_objectness == pytest.approx(1.0)
    only = head[[0, 1]]  # row 1 overlaps the kept row 0 (IoU 0.82)
    d = decode_one(only, None, NAMES)
    assert len(d) == 1 and d.missed_objectness == 0.0


def test_missed_objectness_beyond_the_first_chunk():
    # 600 rows stacked on the kept box (overlapping), then one free row further down.
    rng = np.random.default_rng(0)
    rows = np.tile(_head()[1], (600, 1))
    rows[:, 4] = rng.uniform(0.3, 0.7, 600)
    rows[:, 5:] = 0.1
    free = np.array([[50, 50, 4, 4, 0.29, 0.1, 0.1, 0.1]], np.float32)
    head = np.vstack([_head()[:1], rows, free]).astype(np.float32)
    d = decode_one(head, None, NAMES)
    assert len(d) == 1 and d.missed_objectness == pytest.approx(0.29)


def test_batch_decode_equals_per_image():
    h = _head()
    raw = np.stack([h, h[::-1].copy()])
    out = decode(raw, [_meta(), None], NAMES)
    assert len(out) == 2
    one = decode_one(h, _meta(), NAMES)
    assert np.array_equal(out[0].boxes, one.boxes) and np.array_equal(out[0].scores, one.scores)


def test_empty_and_bad_shapes():
    d = decode_one(np.zeros((10, 8), np.float32), None, NAMES)
    assert len(d) == 0 and d.class_scores.shape == (0, 3) and d.missed_objectness == 0.0
    with pytest.raises(ValueError, match="5 \\+ nc = 8"):
        decode(np.zeros((1, 10, 9), np.float32), [None], NAMES)
    with pytest.raises(ValueError, match="metas"):
        decode(np.zeros((2, 10, 8), np.float32), [None], NAMES)
    with pytest.raises(ValueError, match="conf_thres"):
        DecodeParams(conf_thres=2)


def test_xywh2xyxy():
    assert xywh2xyxy(np.array([[10, 20, 4, 6]], np.float32)).tolist() == [[8, 17, 12, 23]]


def test_float16_head_is_accepted():
    d16 = decode_one(_head().astype(np.float16), None, NAMES)
    d32 = decode_one(_head(), None, NAMES)
    assert d16.class_ids.tolist() == d32.class_ids.tolist()
    assert d16.boxes.dtype == np.float32
