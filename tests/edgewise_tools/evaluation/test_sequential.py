"""Selections replayed frame by frame: a score that reads the carry state, at an equal budget."""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from edge.deciding import Decider
from edgewise.carrying import CarryConfig
from edgewise.hardness.carrystate import CARRY_FEATURES
from edgewise.hardness.learned import FEATURE_NAMES, GainModel
from edgewise.policy import Policy
from edgewise.policy.loading import parse_policy
from edgewise_tools.evaluation import hybrid
from edgewise_tools.evaluation.carryreplay import CarryReplay
from edgewise_tools.evaluation.sequential import FrameViews, _run, select
from tests.edgewise_tools.evaluation.test_hybrid import D, rec

CFG = CarryConfig(frames=1000, min_match=0.5)


def _streams(n_streams: int, n: int):
    box = [10, 10, 30, 30]
    out = []
    for s in range(n_streams):
        for i in range(n):
            r = rec(i, D([box], [0], [0.4], "edge"), D([box], [0], [0.9], "cloud"), [box], [0])
            r.stream = s
            r.carried = {"full": [D([box], [0], [0.9], "carried")] * 3}
            out.append(r)
    return out


def _staleness(i, replay, carried) -> float:
    """Prefers frames long after their stream's last escalation (a stream's first frame most)."""
    age = replay.age()
    return 1.0 if age is None else min(age, 10) / 10.0


def test_a_state_dependent_score_is_replayed_to_the_budget() -> None:
    recs = _streams(2, 10)
    mask = select(recs, _staleness, 4, 0, 1, CFG, hybrid.mode_of("full"))
    assert int(mask.sum()) == 4
    for s in (0, 1):
        picked = [r.frame for r, m in zip(recs, mask) if m and r.stream == s]
        # each stream's first frame, then one far enough from it that a third would not fit
        assert len(picked) == 2 and picked[0] == 0 and picked[1] >= 5
    # a static ranking of the same first-pass scores could not spread them: every frame after the
    # first scores as if nothing had been escalated since (age counted from the stream's start)
    assert select(recs, _staleness, 0, 0, 1, CFG, hybrid.mode_of("full")).sum() == 0


def test_the_cooldown_holds_and_a_budget_it_cannot_reach_ends_short() -> None:
    recs = _streams(1, 10)
    mask = select(recs, lambda i, replay, carried: 1.0, 9, 3, 1, CFG, hybrid.mode_of("full"))
    assert np.flatnonzero(mask).tolist() == [0, 3, 6, 9]  # 4 of the 9 asked: the cooldown's most


def test_the_replay_forks_and_keys_its_state() -> None:
    recs = _streams(1, 6)
    replay = CarryReplay(recs, 1, CFG)
    assert replay.at(0) is None and replay.age() is None
    replay.escalate(0, "full")
    twin = replay.copy()
    assert replay.at(1) is not None and replay.age() == 1 and replay.key() == (0, ((0, "full"),))
    assert twin.at(1) is not None  # the fork moved on its own
    twin.escalate(1, "full")
    assert replay.at(2) is not None and replay.key() == (0, ((0, "full"),)) and twin.at(2) is not None
    assert twin.key() == (1, ((1, "full"),))


def _policy(tmp_path, name: str, carry: bool = True, region_min: int = 8, cooldown_s: float = 0.0) -> Policy:
    """A regions policy: carry-aware (a gain model fitted on the carry features, older answers
    scoring higher) or the combined hardness at threshold 0 (escalates whatever the cooldown allows)."""
    model = tmp_path / "carry.json"
    if carry and not model.exists():
        rows = np.random.default_rng(0).random((200, len(FEATURE_NAMES)))
        GainModel.fit(rows, rows[:, FEATURE_NAMES.index("answer_age")], {}, features=FEATURE_NAMES).save(model)
    policy = parse_policy(f"apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {{name: {name}}}\n"
                          f"spec:\n  threshold: {0.5 if carry else 0.0}\n"
                          + ("  signals: {learnedModel: carry.json}\n" if carry else "")
                          + f"  payload: {{mode: regions, regionMin: {region_min}}}\n  cooldownSeconds: {cooldown_s}\n"
                          "  merge: {strategy: replace, carryFrames: 30}\n"
                          "  budget: {maxFraction: 1.0, maxPerSecond: 1000, burst: 1000}\n", str(tmp_path / f"{name}.yaml"))
    assert policy.uses_carry() == carry
    return policy


def _alongside(recs, decider: Decider, policy: Policy, frames, replay: CarryReplay) -> List[int]:
    """Decide ``frames`` with the daemon's Decider and check, frame by frame, that its carry
    features are the evaluation's replay's under ``policy`` (the one in force); the escalated."""
    views = FrameViews(recs, policy)
    escalated = []
    for i in frames:
        r = recs[i]
        carried = replay.at(i)
        ours = views.features(recs, i, replay, carried)
        d = decider.decide("s0", r.frame, r.edge, (r.width, r.height), now=float(i), carried=carried).decision
        if policy.uses_carry():
            assert {k: ours[k] for k in CARRY_FEATURES} == {k: d.signals[k] for k in CARRY_FEATURES}, i
        if d.escalate:
            replay.escalate(i, "regions")
            escalated.append(i)
    return escalated


def test_the_evaluations_carry_features_are_the_daemons(tmp_path) -> None:
    # one rule: the daemon's Decider, given the same carried boxes, computes the features the
    # evaluation's replay gives a gain model, escalation after escalation
    policy = _policy(tmp_path, "p")
    recs = _streams(1, 12)
    recs[2].edge = D([[10, 10, 30, 30], [60, 60, 80, 80]], [0, 0], [0.4, 0.3], "edge")
    decider = Decider(policy, clock=lambda: 0.0)
    escalated = _alongside(recs, decider, policy, range(len(recs)), CarryReplay(recs, 1, policy.spec.merge.carry()))
    assert 0 < len(escalated) < len(recs)  # the model (older answers score higher) escalated some, not all
    # and the evaluation's replay of the policy file (its policy row, check-policy --data) decides the same
    assert np.flatnonzero(hybrid.run_policy(recs, policy, fps=1.0)).tolist() == escalated


def test_the_carry_features_stay_the_replays_across_policy_swaps(tmp_path) -> None:
    # the last escalation's regions are the ones the policy in force proposes on that frame,
    # whichever policy escalated it, as the replay of the policy in force reads them: escalations
    # under a policy that does not read the carry state (their regions were not kept: a whole
    # frame, covering nothing after 5 frames) and under a carry-aware one with another payload
    # (its regions were kept, not the new policy's) read otherwise
    static, carry, wide = (_policy(tmp_path, "static", carry=False), _policy(tmp_path, "carry"),
                           _policy(tmp_path, "wide", region_min=60))
    recs = _streams(1, 40)
    for i in (*range(8, 12), *range(21, 27), *range(33, 37)):
        # a box whose centre the wide payload's region of [10, 10, 30, 30] covers, the narrow one's not
        recs[i].edge = D([[40, 40, 50, 50]], [0], [0.4], "edge")
    replay = CarryReplay(recs, 1, carry.spec.merge.carry())
    decider = Decider(static, clock=lambda: 0.0)
    # carry-blind -> carry-aware: frames 6-16 come 6-16 frames after the static policy's escalation
    assert _alongside(recs, decider, static, [0], replay) == [0]
    decider.swap(carry)
    assert _alongside(recs, decider, carry, range(1, 21), replay) == [17]
    decider.swap(wide)  # another payload: frame 17's regions are the wide payload's
    assert _alongside(recs, decider, wide, range(21, 27), replay) == []
    # carry-aware -> carry-blind -> carry-aware: the static policy escalates frame 27
    decider.swap(static)
    assert _alongside(recs, decider, static, [27], replay) == [27]
    decider.swap(carry)
    assert _alongside(recs, decider, carry, range(28, 40), replay) == []


def test_a_state_the_first_pass_never_met_cannot_empty_the_selection() -> None:
    # the first pass (escalate whatever the cooldown allows) meets only ages 0 and the cooldown's,
    # so every score it meets is <= 0.2; a threshold above that still escalates every third frame
    # (ages 3 and a stream's third frame never met), more than the budget: the upper end of the
    # bisection was no bound, and the selection came back empty with 3 frames reachable
    recs = _streams(1, 20)

    def aging(i, replay, carried) -> float:
        age = replay.age()
        return replay.pos / 10 if age is None else age / 10

    mask = select(recs, aging, 3, 2, 1, CFG, hybrid.mode_of("full"))
    assert np.flatnonzero(mask).tolist() == [5, 10, 15]


#: (frame, frames since the stream's last escalation: None when none yet) -> score; frames 1-2 score
#: high while nothing has been escalated (stale), so escalating frame 0 takes both away
_NON_MONOTONE = {(0, None): 0.5, (1, None): 0.7, (1, 1): 0.3, (2, None): 0.9, (2, 1): 0.7, (2, 2): 0.25,
                 (3, None): 0.0, (3, 1): 0.1, (3, 2): 0.2, (3, 3): 0.2}


def _counts(recs, table) -> Dict[float, int]:
    """Frames escalated at every threshold that matters (each distinct score, and above them all)."""
    return {t: int(_run(recs, lambda i, replay, carried: table[i, replay.age()], t, 0, 1, CFG, hybrid.mode_of("full"),
                        np.zeros(len(recs)))[0].sum()) for t in sorted(set(table.values())) + [1.0]}


def test_a_count_the_bisection_steps_over_is_found_next_to_it() -> None:
    # escalated frames by threshold: above 0.9 none; (0.7, 0.9] frame 2; (0.5, 0.7] frames 1 and 2;
    # (0.3, 0.5] frame 0, which leaves frames 1-3 too fresh; (0.1, 0.3] 0, 1, 2; below, all 4. The
    # bisection closes in on 0.3, where the count jumps from 3 to 1, and stopped at 1 of the 2 asked
    recs = _streams(1, 4)
    assert list(_counts(recs, _NON_MONOTONE).values()) == [4, 4, 3, 3, 3, 1, 2, 1, 0]
    for seed in (0, 1, 2):
        mask = select(recs, lambda i, replay, carried: _NON_MONOTONE[i, replay.age()], 2, 0, 1, CFG,
                      hybrid.mode_of("full"), seed=seed)
        assert np.flatnonzero(mask).tolist() == [1, 2], seed


def test_a_count_no_threshold_gives_ends_at_the_closest_below() -> None:
    # frame 3 right after frame 2's escalation scores 0.4: 4 frames up to 0.3, then 1, 2, 1, 0; 3 is
    # reachable by no threshold, and the bisection's bracket (4 | 1) is not the closest below it (2)
    table = dict(_NON_MONOTONE)
    table[3, 1] = 0.4
    recs = _streams(1, 4)
    counts = _counts(recs, table)
    assert 3 not in counts.values() and max(c for c in counts.values() if c < 3) == 2
    mask = select(recs, lambda i, replay, carried: table[i, replay.age()], 3, 0, 1, CFG, hybrid.mode_of("full"))
    assert np.flatnonzero(mask).tolist() == [1, 2]


def test_a_tie_finer_than_the_bisection_is_split_by_the_scan() -> None:
    # frames 1 and 2 tie at 0.5, told apart only by the jitter (< 1e-9); with scores spread over
    # 2e6, 48 halvings leave a bracket ~7e-9 wide, so the bisection ends on two passes that are not
    # next to each other (3 frames | 1), the interval between them (2 frames) unvisited: the scan
    # must walk it before walking away from the bracket
    table = [1e6, 0.5, 0.5, -1e6]
    recs = _streams(1, 4)
    for seed in (0, 1, 2):
        mask = select(recs, lambda i, replay, carried: table[i], 2, 0, 1, CFG, hybrid.mode_of("full"), seed=seed)
        picked = np.flatnonzero(mask).tolist()
        assert len(picked) == 2 and picked[0] == 0 and picked[1] in (1, 2), (seed, picked)
        assert np.array_equal(mask, select(recs, lambda i, replay, carried: table[i], 2, 0, 1, CFG,
                                           hybrid.mode_of("full"), seed=seed))  # one draw per seed
