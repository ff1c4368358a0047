"""The carry-state features: what a stream's carried answers already explain."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.hardness.carrystate import (
    AGE_FRAMES,
    CARRY_FEATURES,
    COUNT_CAP,
    WHOLE_FRESH,
    carry_features,
    new_regions,
)


def _dets(boxes, scores=None) -> Detections:
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    s = np.asarray(scores if scores is not None else [0.9] * len(b), np.float32)
    return Detections(boxes=b, scores=s, class_ids=np.zeros(len(b), np.int32), names=("a",), source="edge")


EDGE = _dets([[0, 0, 10, 10], [100, 100, 120, 120], [200, 200, 220, 220]], [0.9, 0.4, 0.5])
UNCERTAIN = np.array([False, True, True])


def test_nothing_carried_nothing_explained() -> None:
    f = carry_features(EDGE, UNCERTAIN, None, None, None, None, None)
    assert tuple(f) == CARRY_FEATURES
    assert f["answer_age"] == 1.0 and f["carried_boxes"] == 0.0
    assert f["unexplained_boxes"] == 3 / COUNT_CAP and f["unexplained_uncertain"] == 2 / COUNT_CAP
    assert f["blobs"] == f["unexplained_blobs"] == 0.0
    assert f["new_regions"] == 1.0  # the frame would go whole, and no escalation yet
    assert all(0.0 <= v <= 1.0 for v in f.values())


def test_carried_boxes_explain_the_edge_boxes_and_blobs_they_cover() -> None:
    carried = _dets([[1, 1, 11, 11], [99, 99, 121, 121], [500, 500, 540, 540]])
    blobs = np.array([[505, 505, 535, 535], [700, 10, 710, 20]], np.float32)  # one over a carried box
    f = carry_features(EDGE, UNCERTAIN, carried, 4, blobs, np.zeros((0, 4)), None)
    assert f["answer_age"] == pytest.approx(4 / AGE_FRAMES)
    assert f["carried_boxes"] == 3 / COUNT_CAP
    # the box at 200 is the only one no carried box covers (IoU >= 0.3), and it is uncertain
    assert f["unexplained_boxes"] == 1 / COUNT_CAP and f["unexplained_uncertain"] == 1 / COUNT_CAP
    assert f["blobs"] == 2 / COUNT_CAP and f["unexplained_blobs"] == 1 / COUNT_CAP
    assert f["new_regions"] == 0.0  # no region proposed at all
    # saturation: ages and counts stay in [0, 1]
    many = _dets([[i * 30, 0, i * 30 + 20, 20] for i in range(50)])
    f = carry_features(many, np.zeros(50, bool), None, 10 * AGE_FRAMES, None, None, None)
    assert f["answer_age"] == 1.0 and f["unexplained_boxes"] == 1.0


def test_new_regions_is_the_share_outside_what_the_last_escalation_proposed() -> None:
    proposed = np.array([[0, 0, 100, 100], [400, 400, 500, 500]], np.float64)
    assert new_regions(proposed, None, None) == 1.0  # no escalation yet
    assert new_regions(proposed, np.array([[0, 0, 120, 120]]), 12) == 0.5
    # the last one went whole: it saw every region, for WHOLE_FRESH frames
    assert new_regions(proposed, None, WHOLE_FRESH) == 0.0 and new_regions(proposed, None, WHOLE_FRESH + 1) == 1.0
    assert new_regions(proposed, np.zeros((0, 4)), 2) == 1.0  # it proposed no region
    assert new_regions(None, None, 1) == 1.0  # this one would go whole
    assert new_regions(np.zeros((0, 4)), None, None) == 0.0  # nothing worth a region


def test_a_model_reading_new_regions_runs_the_motion_detector(tmp_path) -> None:
    # new_regions compares the regions a region payload would send, motion blobs included
    # (Payload.proposals): the evaluation reads the recorded blobs for them, so the daemon must
    # run its motion detector for such a model even under a whole-frame payload, or it proposes
    # from the edge boxes alone and decides on another new_regions than the evaluation's
    from edgewise.hardness.learned import FEATURE_NAMES, FRAME_FEATURES, GainModel
    from edgewise.hardness.motion import MOTION_SIGNALS
    from edgewise.policy.loading import parse_policy

    rows = np.random.default_rng(0).random((50, len(FEATURE_NAMES)))
    features = tuple(n for n in FRAME_FEATURES if n not in MOTION_SIGNALS) + ("new_regions",)
    GainModel.fit(rows, rows[:, FEATURE_NAMES.index("new_regions")], {}, features=features).save(
        tmp_path / "m.json")
    policy = parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\n"
                          "spec:\n  signals: {learnedModel: m.json}\n  payload: {mode: full}\n",
                          str(tmp_path / "p.yaml"))
    assert policy.uses_carry() and policy.uses_motion()


def test_explain_says_a_carry_aware_threshold_is_no_rate(tmp_path) -> None:
    from edgewise.hardness.learned import FEATURE_NAMES, FRAME_FEATURES, GainModel
    from edgewise.policy.explaining import explain
    from edgewise.policy.loading import parse_policy

    rows = np.random.default_rng(0).random((100, len(FEATURE_NAMES)))
    head = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\nspec:\n  threshold: 0.8\n"
    for name, features in (("carry", FEATURE_NAMES), ("frame", FRAME_FEATURES)):
        GainModel.fit(rows, rows[:, 0], {}, features=features).save(tmp_path / f"{name}.json")
        text = explain(parse_policy(head + f"  signals: {{learnedModel: {name}.json}}\n", str(tmp_path / "p.yaml")))
        assert ("reads the carry state" in text) == (name == "carry"), text
