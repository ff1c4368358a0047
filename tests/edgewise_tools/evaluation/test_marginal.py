"""The carry-aware model's targets: what one more escalation adds to what a stream carries."""

from __future__ import annotations

import numpy as np

from edgewise.carrying import CarryConfig
from edgewise.hardness.learned import FEATURE_NAMES
from edgewise.policy.loading import parse_policy
from edgewise.policy.schema import Merge
from edgewise_tools.evaluation import hybrid
from edgewise_tools.evaluation.frames import ModeResult
from edgewise_tools.evaluation.marginal import fit_carry_model, marginal_gains
from edgewise_tools.evaluation.sequential import FrameViews
from tests.edgewise_tools.evaluation.test_hybrid import D, rec

POLICY = parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\n"
                      "spec:\n  merge: {strategy: replace, carryFrames: 30}\n  cooldownSeconds: 0\n")
MERGE = Merge(strategy="replace", iou=0.5, carry_frames=30)
CFG = CarryConfig(frames=30, min_match=0.5)
AGE = FEATURE_NAMES.index("answer_age")
CARRIED = FEATURE_NAMES.index("carried_boxes")


def _stream(n=6, carries=3):
    """Only the cloud sees the object; each frame's answer is carried ``carries`` frames."""
    box = [10, 10, 30, 30]
    recs = [rec(i, D([], [], [], "edge"), D([box], [0], [0.9], "cloud"), [box], [0]) for i in range(n)]
    for r in recs:
        r.carried = {"full": [D([box], [0], [0.9], "carried")] * carries}
    return recs


def test_a_frames_gain_counts_the_frames_it_carries_into_until_the_next_escalation() -> None:
    recs = _stream()
    views = FrameViews(recs, POLICY)
    # nothing else escalated: frame 0 finds the object on itself and, carried, on frames 1-3;
    # edge-only has no true or false positive, so each found object is worth N = 6
    x, y = marginal_gains(recs, np.zeros(6, bool), MERGE, hybrid.mode_of("full"), 1, CFG, views)
    assert y.tolist() == [24.0, 24.0, 24.0, 18.0, 12.0, 6.0]
    assert x.shape == (6, len(FEATURE_NAMES)) and (x[:, AGE] == 1.0).all() and (x[:, CARRIED] == 0.0).all()
    # frame 2 escalated by the reference: frame 0's gain stops there (frames 0 and 1), and frames 3-5
    # already carry frame 2's answer, so escalating one of them adds nothing
    ref = np.array([False, False, True, False, False, False])
    x, y = marginal_gains(recs, ref, MERGE, hybrid.mode_of("full"), 1, CFG, views)
    assert y.tolist() == [12.0, 6.0, 24.0, 0.0, 0.0, 0.0]
    assert x[3, AGE] == round(1 / 30, 4) and x[3, CARRIED] > 0 and x[5, AGE] == round(3 / 30, 4)  # as recorded


def test_the_fitted_model_reads_the_carry_state() -> None:
    recs = []
    for s in range(8):
        for r in _stream(12):
            r.stream = s
            recs.append(r)
    model = fit_carry_model(recs, POLICY, "full", 1, 0.25, 0)
    assert model.uses_carry() and model.info["rounds"] == 2
    # an escalation where an answer is in force is worth less than one where none is
    fresh = dict.fromkeys(FEATURE_NAMES, 0.0)
    fresh.update(answer_age=1.0)
    carried = dict(fresh, answer_age=1 / 30, carried_boxes=1 / 20)
    assert model.predicted_of(fresh, 0, 0.0) > model.predicted_of(carried, 0, 0.0)


def test_an_answer_still_on_its_way_keeps_the_earlier_one_carried() -> None:
    # answers come 2 frames after their escalation: the reference's escalation of frame 2 is
    # answered at frame 4, so frame 3 still carries frame 0's answer, and escalating frame 0 is
    # worth its own frame and frame 3 (frame 1 comes before its answer, frame 2 has its own); the
    # target stopped at the reference's next escalation and missed frame 3
    recs = _stream(carries=5)
    ref = np.array([False, False, True, False, False, False])
    _, y = marginal_gains(recs, ref, MERGE, hybrid.mode_of("full"), 2, CFG, FrameViews(recs, POLICY))
    assert y[0] == 12.0


def test_under_carry_scope_regions_an_answer_outlives_a_newer_one_outside_its_regions() -> None:
    # frame 0's whole answer (objects A and B) stays carried outside the regions the reference's
    # escalation of frame 2 sent (A's only), so escalating frame 0 is also worth B on frames 3-5
    a, b = [10, 10, 30, 30], [60, 60, 80, 80]
    recs = [rec(i, D([], [], [], "edge"), D([a, b], [0, 0], [0.9, 0.9], "cloud"), [a, b], [0, 0]) for i in range(6)]
    for r in recs:
        r.carried = {"full": [D([a, b], [0, 0], [0.9, 0.9], "carried")] * 5}
    recs[2].modes["regions"] = ModeResult(D([a], [0], [0.9], "cloud"), D([a], [0], [0.9], "cloud"), 50,
                                          np.array([[0, 0, 40, 40]], np.float32))
    recs[2].carried["regions"] = [D([a], [0], [0.9], "carried")] * 5
    cfg = CarryConfig(frames=30, min_match=0.5, scope="regions")
    ref = np.array([False, False, True, False, False, False])

    def sending(whole, r) -> str:
        return "regions" if r.frame == 2 else "full"

    _, y = marginal_gains(recs, ref, MERGE, sending, 1, cfg, FrameViews(recs, POLICY))
    # N = 12 objects, nothing found at the edge: each object found is worth 12
    assert y[0] == 2 * 12 + 2 * 12 + 3 * 12
