"""NMS and box IoU against brute-force pure-Python references (hypothesis)."""

from __future__ import annotations

import importlib
from typing import List, Optional

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from edgewise.runtime.nms import box_iou, nms

# the package re-exports the function ``nms``, so fetch the module itself
nms_mod = importlib.import_module("edgewise.runtime.nms")


def iou_ref(a: List[float], b: List[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    aa = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1])
    ab = max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])
    union = aa + ab - inter
    return inter / union if union > 0 else 0.0


def nms_ref(boxes: np.ndarray, scores: np.ndarray, cls: Optional[np.ndarray], thr: float, max_det: int) -> List[int]:
    """Greedy NMS, literally: best first, drop if IoU > thr with a kept box of the same class."""
    order = sorted(range(len(scores)), key=lambda k: (-float(scores[k]), k))
    keep: List[int] = []
    for k in order:
        if len(keep) >= max_det:
            break
        ok = all(
            (cls is not None and int(cls[j]) != int(cls[k]))
            or iou_ref(boxes[k].tolist(), boxes[j].tolist()) <= thr
            for j in keep
        )
        if ok:
            keep.append(k)
    return keep


@st.composite
def box_sets(draw, max_n: int = 60):
    n = draw(st.integers(0, max_n))
    # Few distinct centres so that many boxes overlap; integer-ish coords make
    # exact IoU ties with the threshold possible, which the test then avoids.
    coords = st.floats(0, 100, allow_nan=False, allow_infinity=False, width=32)
    # sizes: empty boxes, or at least 0.01 px (pixel boxes; float32 areas of
    # sub-1e-20 px boxes underflow, which no detector produces)
    size = st.one_of(st.just(0.0), st.floats(0.01, 60))
    rows = draw(st.lists(st.tuples(coords, coords, size, size), min_size=n, max_size=n))
    boxes = np.array([(x, y, x + w, y + h) for x, y, w, h in rows], np.float32).reshape(n, 4)
    scores = np.array(draw(st.lists(st.floats(0, 1, width=32), min_size=n, max_size=n)), np.float32)
    cls = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.int64)
    return boxes, scores, cls


def _away_from_threshold(boxes: np.ndarray, thr: float) -> bool:
    if len(boxes) < 2:
        return True
    iou = box_iou(boxes, boxes)
    return bool((np.abs(iou - thr) > 1e-4).all())


@settings(max_examples=80, deadline=None)
@given(data=box_sets(), thr=st.sampled_from([0.3, 0.45, 0.5, 0.7]), max_det=st.integers(1, 80),
       agnostic=st.booleans())
def test_nms_matches_brute_force(data, thr, max_det, agnostic):
    boxes, scores, cls = data
    assume(_away_from_threshold(boxes, thr))
    c = None if agnostic else cls
    got = nms(boxes, scores, c, iou_thres=thr, max_det=max_det).tolist()
    assert got == nms_ref(boxes, scores, c, thr, max_det)


@settings(max_examples=40, deadline=None)
@given(data=box_sets(max_n=40), thr=st.sampled_from([0.45, 0.6]))
def test_matrix_and_iterative_paths_agree(data, thr):
    boxes, scores, cls = data
    assume(_away_from_threshold(boxes, thr))
    old = nms_mod.MATRIX_MAX
    try:
        nms_mod.MATRIX_MAX = 0
        iterative = nms(boxes, scores, cls, thr, 300).tolist()
        nms_mod.MATRIX_MAX = 10**9
        matrix = nms(boxes, scores, cls, thr, 300).tolist()
    finally:
        nms_mod.MATRIX_MAX = old
    assert iterative == matrix


@settings(max_examples=50, deadline=None)
@given(data=box_sets(max_n=20))
def test_box_iou_matches_reference(data):
    boxes, _, _ = data
    got = box_iou(boxes, boxes[::-1])
    ref = [[iou_ref(a, b) for b in boxes[::-1].tolist()] for a in boxes.tolist()]
    np.testing.assert_allclose(got, np.array(ref).reshape(got.shape), rtol=0, atol=1e-9)


def test_nms_known_case_class_aware_and_max_det():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [50, 50, 60, 60]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.6], np.float32)
    cls = np.array([0, 0, 1, 0])
    assert nms(boxes, scores, cls, 0.45).tolist() == [0, 2, 3]  # box 2 is another class
    assert nms(boxes, scores, None, 0.45).tolist() == [0, 3]  # agnostic
    assert nms(boxes, scores, cls, 0.45, max_det=2).tolist() == [0, 2]
    assert nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32)).shape == (0,)


def test_nms_large_input_uses_iterative_path_and_stops_at_max_det():
    rng = np.random.default_rng(1)
    n = nms_mod.MATRIX_MAX + 200
    xy = rng.uniform(0, 2000, (n, 2))
    boxes = np.hstack([xy, xy + 10]).astype(np.float32)
    scores = rng.uniform(0, 1, n).astype(np.float32)
    keep = nms(boxes, scores, None, 0.45, max_det=50)
    assert keep.tolist() == nms_ref(boxes, scores, None, 0.45, 50)
