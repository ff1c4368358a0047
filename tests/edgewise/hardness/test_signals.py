"""Every hardness signal on hand-built detections, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewise.detections import Detections
from edgewise.hardness import SIGNAL_NAMES, SignalConfig, combine, compute_signals, measure_cost
from edgewise.hardness.signals import (
    confidence_signals,
    entropy_signal,
    margin_signal,
    missed_object_signal,
    small_boxes_signal,
    uncertain_signals,
)


def make(boxes=None, scores=(), class_ids=None, class_scores=None, names=("a", "b", "c", "d"),
         missed=0.0):
    n = len(scores)
    if boxes is None:
        boxes = [[10 * i, 0, 10 * i + 8, 8] for i in range(n)]
    return Detections(
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        scores=np.asarray(scores, np.float32),
        class_ids=np.asarray(class_ids if class_ids is not None else [0] * n, np.int32),
        class_scores=None if class_scores is None else np.asarray(class_scores, np.float32),
        names=tuple(names),
        source="edge",
        missed_objectness=missed,
    )


CFG = SignalConfig(band_low=0.25, band_high=0.6, uncertain_saturation=3)


def test_uncertain_count_and_fraction_hand_computed():
    d = make(scores=[0.9, 0.5, 0.3, 0.1])  # 0.5 and 0.3 are in [0.25, 0.6]
    count, frac = uncertain_signals(d, CFG)
    assert count == pytest.approx(2 / 3)
    assert frac == pytest.approx(2 / 4)


def test_uncertain_band_edges_are_inclusive_and_count_saturates():
    d = make(scores=[0.25, 0.6, 0.6, 0.4, 0.61, 0.24])  # four in band
    count, frac = uncertain_signals(d, CFG)
    assert count == 1.0  # 4 / 3 capped
    assert frac == pytest.approx(4 / 6)


def test_per_class_band_overrides_global_band():
    cfg = SignalConfig(band_low=0.25, band_high=0.6, class_bands={"b": (0.8, 0.95)},
                       uncertain_saturation=4)
    # class a 0.5 (global band: in), class b 0.5 (own band: out), class b 0.9 (own band: in)
    d = make(scores=[0.5, 0.5, 0.9], class_ids=[0, 1, 1])
    count, frac = uncertain_signals(d, cfg)
    assert count == pytest.approx(2 / 4)
    assert frac == pytest.approx(2 / 3)


def test_mean_and_min_confidence():
    d = make(scores=[0.9, 0.5, 0.3, 0.1])
    mean_c, min_c = confidence_signals(d)
    assert mean_c == pytest.approx(1 - 0.45)
    assert min_c == pytest.approx(1 - 0.1)


def test_entropy_normalised_max_over_boxes():
    d = make(
        scores=[0.5, 0.9, 0.2],
        class_scores=[[0.25, 0.25, 0.0, 0.0],  # p = (.5, .5, 0, 0): H = ln2 / ln4 = 0.5
                      [0.9, 0.0, 0.0, 0.0],    # certain: 0
                      [0.1, 0.1, 0.1, 0.0]],   # p = 1/3 x3: ln3 / ln4
    )
    assert entropy_signal(d) == pytest.approx(math.log(3) / math.log(4), abs=1e-6)
    uniform = make(scores=[0.2], class_scores=[[0.05, 0.05, 0.05, 0.05]])
    assert entropy_signal(uniform) == pytest.approx(1.0, abs=1e-6)


def test_margin_is_one_minus_smallest_top2_margin():
    d = make(
        scores=[0.6, 0.9],
        class_scores=[[0.6, 0.3, 0.1, 0.0],     # margin 0.3 -> 0.7
                      [0.9, 0.05, 0.05, 0.0]],  # margin 0.85 -> 0.15
    )
    assert margin_signal(d) == pytest.approx(0.7, abs=1e-6)
    # scale invariant: objectness x class prob has the same distribution
    scaled = make(scores=[0.3], class_scores=[[0.3, 0.15, 0.05, 0.0]])
    assert margin_signal(scaled) == pytest.approx(0.7, abs=1e-6)


def test_class_signals_zero_without_class_scores_or_with_one_class():
    assert entropy_signal(make(scores=[0.4])) == 0.0
    assert margin_signal(make(scores=[0.4])) == 0.0
    one = make(scores=[0.4], class_scores=[[0.4]], names=("a",))
    assert entropy_signal(one) == 0.0 and margin_signal(one) == 0.0


def test_small_boxes_fraction_of_frame_area():
    boxes = [[0, 0, 5, 5],      # 25 px  < 100: small
             [0, 0, 20, 20],    # 400 px
             [0, 0, 9, 11],     # 99 px: small
             [0, 0, 10, 10]]    # 100 px: not strictly below
    d = make(boxes=boxes, scores=[0.9] * 4)
    assert small_boxes_signal(d, 0.01, (100, 100)) == pytest.approx(0.5)
    assert small_boxes_signal(d, 0.01, None) == 0.0


def test_missed_object_is_clipped_objectness():
    assert missed_object_signal(make(missed=0.7)) == pytest.approx(0.7)
    assert missed_object_signal(make(missed=1.5)) == 1.0
    assert missed_object_signal(make(missed=float("nan"))) == 0.0


def test_empty_frame_box_signals_zero_but_missed_object_escalatable():
    d = make(missed=0.8)
    signals, _ = compute_signals(d, None, SignalConfig(frame_size=(640, 480)))
    assert set(signals) == set(SIGNAL_NAMES)
    for name in ("uncertain_count", "uncertain_fraction", "mean_conf", "min_conf", "entropy",
                 "margin", "small_boxes", "tracker_disagreement"):
        assert signals[name] == 0.0, name
    assert signals["missed_object"] == pytest.approx(0.8)
    assert combine(signals, {"uncertain_count": 1.0, "missed_object": 1.0}) == pytest.approx(0.8)


def test_compute_signals_hand_computed_frame():
    d = make(
        boxes=[[0, 0, 5, 5], [0, 0, 50, 50]],
        scores=[0.4, 0.8],
        class_scores=[[0.2, 0.2, 0.0, 0.0], [0.8, 0.0, 0.0, 0.0]],
        missed=0.1,
    )
    s, _ = compute_signals(d, None, SignalConfig(uncertain_saturation=2), frame_size=(100, 100))
    assert s["uncertain_count"] == pytest.approx(0.5)
    assert s["uncertain_fraction"] == pytest.approx(0.5)
    assert s["mean_conf"] == pytest.approx(0.4)
    assert s["min_conf"] == pytest.approx(0.6)
    assert s["entropy"] == pytest.approx(0.5, abs=1e-6)
    assert s["margin"] == pytest.approx(1.0, abs=1e-6)
    assert s["small_boxes"] == pytest.approx(0.5)
    assert s["tracker_disagreement"] == 0.0  # first frame: warm-up
    assert s["missed_object"] == pytest.approx(0.1)


def test_combine_weighted_max_and_mean():
    s = {"a": 0.5, "b": 0.9, "c": 0.2}
    w = {"a": 1.0, "b": 0.5}
    assert combine(s, w) == pytest.approx(0.5)  # max(0.5, 0.45)
    assert combine(s, w, "mean") == pytest.approx((0.5 + 0.45) / 1.5)
    assert combine(s, {"zzz": 1.0}) == 0.0  # missing signal counts 0
    assert combine(s, {"a": 0.0}) == 0.0
    assert combine({"a": 7.0}, {"a": 1.0}) == 1.0  # clipped
    assert combine({"a": float("nan")}, {"a": 1.0}) == 0.0
    with pytest.raises(ValueError, match="max"):
        combine(s, w, "median")


boxes_st = st.lists(
    st.tuples(st.floats(0, 600), st.floats(0, 400), st.floats(0.5, 200), st.floats(0.5, 200)),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(boxes_st, st.data())
def test_all_signals_in_unit_interval(raw, data):
    n = len(raw)
    boxes = [[x, y, x + w, y + h] for x, y, w, h in raw]
    scores = data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
    cs = data.draw(st.lists(st.lists(st.floats(0, 1), min_size=4, max_size=4), min_size=n, max_size=n))
    d = make(boxes=boxes, scores=scores, class_scores=cs if n else None,
             class_ids=[0] * n, missed=data.draw(st.floats(0, 1)))
    state = None
    for _ in range(3):
        s, state = compute_signals(d, state, SignalConfig(frame_size=(640, 480)))
        assert set(s) == set(SIGNAL_NAMES)
        for k, v in s.items():
            assert 0.0 <= v <= 1.0, (k, v)


def test_measure_cost_reports_microseconds_per_frame():
    r = measure_cost(n_frames=200, n_boxes=20, nc=80)
    assert 0 < r["signals_us"] and 0 < r["policy_us"]
    assert r["total_us"] == pytest.approx(r["signals_us"] + r["policy_us"])
    assert r["total_us"] < 20000  # generous: the target is 1000 on an idle core


def test_measure_cost_with_motion_at_camera_resolution():
    r = measure_cost(n_frames=40, n_boxes=20, nc=80, frame_size=(1280, 720))
    assert r["motion_us"] > 0
    assert r["total_us"] == pytest.approx(r["signals_us"] + r["motion_us"] + r["policy_us"])
    assert measure_cost(n_frames=20)["motion_us"] == 0.0


def test_a_frame_of_another_size_starts_the_tracker_afresh():
    # a stream that changes resolution (a camera reconfigured, a folder of mixed sizes): the
    # tracker's boxes are in the old frame's pixels, so the same objects at the new scale must
    # not "vanish" and make the frame hard (they did: tracker_disagreement 1.0, one spurious
    # escalation per size change under the shipped policy)
    small = make(boxes=[[100, 100, 140, 160], [400, 300, 440, 360]], scores=[0.9, 0.9])
    big = make(boxes=[[150, 150, 210, 240], [600, 450, 660, 540]], scores=[0.9, 0.9])
    cfg = SignalConfig()
    state = None
    for _ in range(4):
        s, state = compute_signals(small, state, cfg, frame_size=(1280, 720))
    assert s["tracker_disagreement"] == 0.0
    s, state = compute_signals(big, state, cfg, frame_size=(1920, 1080))
    assert s["tracker_disagreement"] == 0.0
    assert state.frames == 1 and state.size == (1920, 1080)
    for _ in range(3):  # the new size's tracks are followed as before
        s, state = compute_signals(big, state, cfg, frame_size=(1920, 1080))
    assert s["tracker_disagreement"] == 0.0
    s, state = compute_signals(make(boxes=[[150, 150, 210, 240]], scores=[0.9]), state, cfg, frame_size=(1920, 1080))
    assert s["tracker_disagreement"] > 0.0  # an object that vanishes at one size still counts
