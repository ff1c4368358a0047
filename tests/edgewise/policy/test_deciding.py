"""The Escalator: precedence, cooldown, budget caps, hardest-first, swap mid-run."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewise.detections import Detections
from edgewise.hardness import SignalConfig, compute_signals
from edgewise.policy import Escalator, parse_policy

HEAD = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: %s}\n"
NAMES = ("car", "person", "bike")


def policy(spec: str, name: str = "p"):
    return parse_policy(HEAD % name + "spec:\n" + spec)


# hardness == the "uncertain_count" signal we pass in
LINEAR = "  signals: {combine: max, weights: {uncertain_count: 1.0}}\n"
OPEN_BUDGET = "  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: null, priority: fifo}\n"


def dets(*classes: str) -> Detections:
    n = len(classes)
    return Detections(
        boxes=np.tile(np.array([[0, 0, 10, 10]], np.float32), (n, 1)),
        scores=np.full(n, 0.5, np.float32),
        class_ids=np.array([NAMES.index(c) for c in classes], np.int32),
        names=NAMES,
    )


def sig(h: float):
    return {"uncertain_count": h}


def test_threshold_precedence_stream_over_class_over_global():
    p = policy(
        LINEAR + OPEN_BUDGET
        + "  threshold: 0.5\n"
        + "  classes:\n    person: {threshold: 0.3}\n    bike: {threshold: 0.8}\n"
        + "  streams:\n    strict: {threshold: 0.9}\n"
    )
    esc = Escalator(p, clock=lambda: 0.0)
    d = esc.decide("a", 1, dets("car"), sig(0.4), now=0)
    assert (d.escalate, d.reason, d.threshold, d.origin) == (False, "below_threshold", 0.5, "global")
    d = esc.decide("a", 2, dets("car", "person"), sig(0.4), now=1)
    assert (d.escalate, d.reason, d.origin) == (True, "hard", "class person")
    # a higher class threshold only applies when it is the most sensitive class present
    assert esc.decide("a", 3, dets("bike"), sig(0.6), now=2).escalate is False
    assert esc.decide("a", 4, dets("bike", "car"), sig(0.6), now=3).escalate is True
    d = esc.decide("strict", 1, dets("person"), sig(0.85), now=4)
    assert (d.escalate, d.threshold, d.origin) == (False, 0.9, "stream strict")
    assert esc.decide("strict", 2, dets("person"), sig(0.95), now=5).escalate is True


def test_stream_modes_always_and_never():
    p = policy(LINEAR + OPEN_BUDGET + "  streams:\n    dock: {mode: always}\n    lobby: {mode: never}\n")
    esc = Escalator(p)
    d = esc.decide("dock", 1, dets(), sig(0.0), now=0)
    assert (d.escalate, d.reason) == (True, "always")
    d = esc.decide("lobby", 1, dets(), sig(1.0), now=0)
    assert (d.escalate, d.reason, d.suppressed_by) == (False, "stream_never", None)


def test_empty_frame_with_missed_object_escalates_under_default_policy():
    """Sedna's Threshold/IBT never escalate an empty frame; we must."""
    p = policy("  {}\n")
    esc = Escalator(p)
    empty = Detections.empty(NAMES, nc=3)
    empty = Detections(empty.boxes, empty.scores, empty.class_ids, names=NAMES, missed_objectness=0.8)
    signals, _ = compute_signals(empty, None, p.signal_config("cam"))
    d = esc.decide("cam", 1, empty, signals, now=0.0)
    assert d.escalate and d.reason == "hard" and d.hardness == pytest.approx(0.8)


def test_cooldown_per_stream():
    p = policy(LINEAR + OPEN_BUDGET + "  cooldownSeconds: 2.0\n  streams:\n    fast: {cooldownSeconds: 0}\n")
    esc = Escalator(p)
    times = [i * 0.5 for i in range(12)]  # 0 .. 5.5 s
    out = [esc.decide("a", i, dets(), sig(1.0), now=t) for i, t in enumerate(times)]
    assert [t for t, d in zip(times, out) if d.escalate] == [0.0, 2.0, 4.0]
    assert {d.suppressed_by for d in out if not d.escalate} == {"cooldown"}
    fast = [esc.decide("fast", i, dets(), sig(1.0), now=t).escalate for i, t in enumerate(times)]
    assert all(fast)


@pytest.mark.parametrize("fps,cooldown,frames", [(10, 0.3, 3), (30, 0.3, 9), (5, 0.2, 1), (25, 0.2, 5),
                                                  (10, 0.1, 1), (15, 0.2, 3), (12.5, 0.4, 5)])
def test_a_cooldown_of_whole_frame_periods_lets_the_frame_that_many_periods_on_go(fps, cooldown, frames):
    """On a stream timeline of ``frame / fps`` seconds (``edgewise eval``'s policy row,
    ``check-policy --data``) a cooldown of whole frame periods ("0.3 s: 3 frames at 10 fps",
    examples/policy.yaml) ends at the frame that many periods on, as the evaluation's baseline
    rows count it (``ceil(cooldown * fps)``): float rounding of ``(k + 3) / 10 - k / 10`` (just
    under 0.3 for over half the k) held that frame back too, so a 0.3 s cooldown at 10 fps spaced
    escalations 4 frames apart 63% of the time."""
    p = policy(LINEAR + OPEN_BUDGET + f"  cooldownSeconds: {cooldown}\n")
    esc = Escalator(p)
    went = [i for i in range(600) if esc.decide("a", i, dets(), sig(1.0), now=i / fps).escalate]
    assert set(np.diff(went)) == {frames}
    # the rule is one: the whole-frame refresh on the same timeline is due as many periods on
    refresh = policy(LINEAR + f"  payload: {{mode: regions, wholeFrameEverySeconds: {cooldown}}}\n").spec.payload
    assert all(refresh.whole_frame_due(k / fps, (k + frames) / fps) for k in range(600))
    assert not any(refresh.whole_frame_due(k / fps, (k + frames - 1) / fps) for k in range(600))


def test_token_bucket_burst_then_rate():
    p = policy(LINEAR + "  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: 1.0, burst: 3, priority: fifo}\n")
    esc = Escalator(p)
    first = [esc.decide("a", i, dets(), sig(1.0), now=0.0) for i in range(5)]
    assert [d.escalate for d in first] == [True, True, True, False, False]
    assert first[3].suppressed_by == "budget_rate"
    assert esc.decide("a", 5, dets(), sig(1.0), now=0.5).escalate is False
    assert esc.decide("a", 6, dets(), sig(1.0), now=1.0).escalate is True


def test_max_fraction_over_sliding_window():
    p = policy(LINEAR + "  budget: {maxFraction: 0.2, windowFrames: 10, maxPerSecond: null, priority: fifo}\n")
    esc = Escalator(p)
    out = [esc.decide("a", i, dets(), sig(1.0), now=i * 0.1) for i in range(30)]
    flags = [d.escalate for d in out]
    assert flags[:10] == [True, True] + [False] * 8
    assert flags[10:12] == [True, True]  # frames 0, 1 left the window
    assert {d.suppressed_by for d in out if not d.escalate} == {"budget_fraction"}
    for i in range(len(flags) - 9):
        assert sum(flags[i:i + 10]) <= 2


def test_audit_fraction_is_deterministic_and_close_to_target():
    p = policy(LINEAR + OPEN_BUDGET + "  threshold: 0.9\n  auditFraction: 0.1\n")
    run1 = [Escalator(p).decide("s", i, dets(), sig(0.0), now=0).reason for i in range(1)]
    esc = Escalator(p)
    reasons = [esc.decide("s", i, dets(), sig(0.0), now=i).reason for i in range(2000)]
    assert 150 <= reasons.count("audit") <= 250
    assert run1[0] == reasons[0]
    esc2 = Escalator(p)
    assert [esc2.decide("s", i, dets(), sig(0.0), now=i).reason for i in range(2000)] == reasons


def _run_budget(frames, rate, burst, fraction, window, cooldown, priority):
    """Drive one stream with (hardness, gap) frames; check every budget invariant."""
    p = policy(
        LINEAR + "  threshold: 0.3\n"
        f"  cooldownSeconds: {cooldown}\n"
        f"  budget: {{maxFraction: {fraction}, windowFrames: {window}, maxPerSecond: {rate},"
        f" burst: {burst}, priority: {priority}}}\n"
    )
    clock_box = [0.0]
    esc = Escalator(p, clock=lambda: clock_box[0])
    times = []
    flags = []
    for i, (h, gap) in enumerate(frames):
        clock_box[0] += gap
        d = esc.decide("s", i, dets("car"), sig(h))
        assert not d.escalate or h >= 0.3
        flags.append(d.escalate)
        if d.escalate:
            times.append(clock_box[0])
    cap = int(fraction * window + 1e-9)
    csum = np.concatenate([[0], np.cumsum(flags)])
    for i in range(len(flags)):  # any window of `window` consecutive frames
        assert csum[i + 1] - csum[max(0, i + 1 - window)] <= cap
    t = np.array(times)
    for a in range(len(t)):  # token bucket: n escalations in [ta, tb] <= burst + rate*(tb-ta)
        n = np.arange(1, len(t) - a + 1)
        assert np.all(n <= burst + rate * (t[a:] - t[a]) + 1e-6)
    assert np.all(np.diff(t) >= cooldown - 1e-9)
    return flags


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(st.tuples(st.floats(0, 1), st.floats(0.0, 0.5)), max_size=300),
    rate=st.floats(0.2, 5.0),
    burst=st.integers(1, 5),
    fraction=st.floats(0.0, 0.6, allow_subnormal=False),  # (a subnormal is refused)
    window=st.integers(1, 60),
    cooldown=st.sampled_from([0.0, 0.3]),
    priority=st.sampled_from(["hardest", "fifo"]),
)
def test_budget_never_exceeded(frames, rate, burst, fraction, window, cooldown, priority):
    _run_budget(frames, rate, burst, fraction, window, cooldown, priority)


@pytest.mark.parametrize("seed", [0, 1])
def test_budget_never_exceeded_long_run(seed):
    rng = np.random.default_rng(seed)
    n = 8000  # about 4.5 minutes of a 30 fps stream
    frames = list(zip(rng.beta(2, 3, n).tolist(), rng.exponential(1 / 30, n).tolist()))
    flags = _run_budget(frames, rate=1.5, burst=3, fraction=0.05, window=300, cooldown=0.0,
                        priority="hardest")
    assert sum(flags) > 0.5 * 0.05 * n  # and the budget is actually used


def _admitted(priority: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    hard = rng.uniform(0.5, 1.0, 3000)
    p = policy(
        LINEAR + "  threshold: 0.5\n"
        f"  budget: {{maxFraction: 0.1, windowFrames: 100, maxPerSecond: null, burst: 4, priority: {priority}}}\n"
    )
    esc = Escalator(p)
    got = [h for i, h in enumerate(hard) if esc.decide("s", i, dets(), sig(float(h)), now=i / 10).escalate]
    return np.array(got), hard


def test_hardest_first_spends_budget_on_harder_frames_than_fifo():
    hardest, all_h = _admitted("hardest")
    fifo, _ = _admitted("fifo")
    cap = 0.1 * len(all_h)
    assert len(fifo) == pytest.approx(cap, rel=0.02)
    assert len(hardest) >= 0.6 * cap  # the gate must not starve the budget
    assert hardest.mean() > fifo.mean() + 0.1
    assert np.median(hardest) > np.quantile(all_h, 0.8)


def test_priority_suppression_and_rank():
    # maxFraction 0.1 x windowFrames 20: cap and allowance k = 2 per window
    p = policy(LINEAR + "  threshold: 0.1\n  budget: {maxFraction: 0.1, windowFrames: 20, maxPerSecond: null}\n")
    esc = Escalator(p)
    assert esc.decide("s", 0, dets(), sig(0.9), now=0).escalate
    assert esc.decide("s", 1, dets(), sig(0.8), now=0.1).escalate  # 2 candidates <= k
    d = esc.decide("s", 2, dets(), sig(0.2), now=0.2)  # 3rd candidate, not in the top 2
    assert (d.escalate, d.suppressed_by, d.priority) == (False, "priority", 33)
    d = esc.decide("s", 3, dets(), sig(0.95), now=0.3)  # top 2, but the window's cap is used
    assert (d.escalate, d.suppressed_by, d.priority) == (False, "budget_fraction", 100)


def test_swap_mid_run_applies_from_the_next_frame_and_keeps_budget():
    old = policy(LINEAR + "  threshold: 0.9\n  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: 0.001, burst: 3, priority: fifo}\n", "old")
    new = policy(LINEAR + "  threshold: 0.5\n  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: 0.001, burst: 3, priority: fifo}\n", "new")
    esc = Escalator(old)
    out = []
    for i in range(10):
        if i == 5:
            esc.swap(new)
        out.append(esc.decide("s", i, dets(), sig(0.6), now=i))
    assert [d.policy_name for d in out] == ["old"] * 5 + ["new"] * 5
    assert [d.escalate for d in out] == [False] * 5 + [True, True, True, False, False]
    assert out[8].suppressed_by == "budget_rate"  # tokens spent before/after swap are one budget
    # a smaller burst clips the tokens left
    smaller = policy(LINEAR + "  threshold: 0.5\n  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: 0.001, burst: 1, priority: fifo}\n", "small")
    esc2 = Escalator(old)
    esc2.decide("s", 0, dets(), sig(0.0), now=0)
    esc2.swap(smaller)
    assert [esc2.decide("s", i, dets(), sig(0.6), now=0).escalate for i in range(1, 4)] == [True, False, False]
    assert esc2.swaps == 1


def test_swap_is_atomic_under_concurrent_decides():
    a = policy(LINEAR + OPEN_BUDGET + "  threshold: 0.9\n", "a")
    b = policy(LINEAR + OPEN_BUDGET + "  threshold: 0.1\n", "b")
    esc = Escalator(a)
    stop = threading.Event()

    def swapper():
        flip = False
        while not stop.is_set():
            esc.swap(b if flip else a)
            flip = not flip

    t = threading.Thread(target=swapper)
    t.start()
    try:
        for i in range(3000):
            d = esc.decide("s", i, dets(), sig(0.5), now=i)
            expected = {"a": (False, 0.9), "b": (True, 0.1)}[d.policy_name]
            assert (d.escalate, d.threshold) == expected
    finally:
        stop.set()
        t.join()


def test_signal_config_band_precedence():
    p = policy(
        "  band: {low: 0.2, high: 0.5}\n"
        "  classes:\n    person: {band: {low: 0.3, high: 0.9}}\n"
        "  streams:\n    s2: {band: {low: 0.1, high: 0.2}}\n"
    )
    c1 = p.signal_config("s1")
    assert (c1.band_low, c1.band_high, dict(c1.class_bands)) == (0.2, 0.5, {"person": (0.3, 0.9)})
    c2 = p.signal_config("s2", frame_size=(640, 480))
    assert (c2.band_low, c2.band_high, dict(c2.class_bands), c2.frame_size) == (0.1, 0.2, {}, (640, 480))
    assert isinstance(c2, SignalConfig)


def test_a_new_gain_model_at_the_same_path_restarts_the_hardest_first_ranking(tmp_path):
    """docs/policies.md: after writing a new gain model, change the policy file so the daemon
    re-reads both. The path in ``signals.learnedModel`` is unchanged, so the section compared
    equal and the ranking kept the old model's percentiles, another scale than the new one's;
    reloading the same model keeps it."""
    from pathlib import Path

    from edgewise.policy import parse_policy as parse

    root = Path(__file__).resolve().parents[3] / "models"
    first, second = root / "eval" / "gain-model.json", root / "camera" / "eval" / "gain-model.json"
    assert first.read_bytes() != second.read_bytes()
    model = tmp_path / "gain-model.json"
    text = HEAD % "learned" + ("spec:\n  threshold: 0.0\n  signals: {learnedModel: gain-model.json}\n"
                               "  budget: {maxFraction: 0.5, windowFrames: 20, maxPerSecond: null}\n")
    src = str(tmp_path / "policy.yaml")
    model.write_bytes(first.read_bytes())
    old, same = parse(text, src), parse(text, src)
    model.write_bytes(second.read_bytes())
    new = parse(text, src)
    for swapped, kept in ((same, 5), (new, 0)):
        esc = Escalator(old)
        for i in range(5):
            esc.decide("s", i, dets("car"), {"uncertain_count": i / 5}, now=float(i))
        assert esc.budget_state("s")["candidates_in_window"] == 5
        esc.swap(swapped)
        assert esc.budget_state("s")["candidates_in_window"] == kept


def test_a_reload_to_a_larger_window_holds_its_cap_over_the_frames_before_it():
    """maxFraction 0.5 of 20 frames, then of 200: the daemon (2 streams, a real reload) let 140
    of 200 consecutive frames through, as the escalations that had left the small window were
    forgotten; the new cap, 100 of any 200, holds across the reload now. A shrunken window
    forgets what falls out of it, and a reload back to a larger one finds it again."""
    fifo = "  threshold: 0.0\n  budget: {maxFraction: 0.5, windowFrames: %d, maxPerSecond: null, priority: fifo}\n"
    small, large = policy(LINEAR + fifo % 20, "small"), policy(LINEAR + fifo % 200, "large")
    esc = Escalator(small)
    out = []
    for i in range(400):
        if i == 140:
            esc.swap(large)
        out.append(esc.decide("s", i, dets(), sig(0.9), now=float(i)).escalate)
    assert sum(out[:140]) == 70
    assert max(sum(out[i:i + 200]) for i in range(201)) == 100
    assert sum(out[140:280]) == 100 - sum(out[80:140]) == 70  # the frames before the reload count
    back = Escalator(large)
    for i in range(100):
        back.decide("s", i, dets(), sig(0.9), now=float(i))
    back.swap(small)
    assert back.budget_state("s")["escalated_in_window"] == 20  # all 100 went: the last 20 frames
    back.swap(large)
    assert back.budget_state("s")["escalated_in_window"] == 100


def test_a_rate_taken_away_and_set_again_starts_from_a_full_bucket():
    """maxPerSecond removed by one reload and set again by a later one: without a rate nothing
    refilled the bucket, so the stream came back to what was left at the first reload (empty
    here) and escalated nothing until it refilled, an hour after its last escalation."""
    spec = "  threshold: 0.0\n  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: %s, burst: 3}\n"
    rated, free = policy(LINEAR + spec % "0.001", "rated"), policy(LINEAR + spec % "null", "free")
    esc = Escalator(rated)
    spent = [esc.decide("s", i, dets(), sig(0.9), now=float(i)).escalate for i in range(3)]
    assert spent == [True, True, True] and esc.budget_state("s")["tokens"] < 1
    esc.swap(free)
    assert esc.decide("s", 3, dets(), sig(0.9), now=3.0).escalate
    esc.swap(rated)
    assert esc.budget_state("s")["tokens"] == 3.0
    assert [esc.decide("s", i, dets(), sig(0.9), now=3600.0 + i).escalate for i in range(4, 8)] == [True] * 3 + [False]


def test_the_history_kept_for_a_wider_window_is_a_few_kilobytes_per_stream():
    """Remembering the escalations of the last 100,000 frames for a reload to a larger window
    held one Python int per escalation: 9,990 of them (about 405 KB) for a saturated stream at
    maxFraction 0.1, per stream and per side of a fleet's check-policy --replay. A bit per frame
    is 12.5 KB, and the cap still holds across the widening reload."""
    import tracemalloc

    spec = "  threshold: 0.0\n  budget: {maxFraction: 0.1, windowFrames: %d, maxPerSecond: null, priority: fifo}\n"
    small, large = policy(LINEAR + spec % 300, "small"), policy(LINEAR + spec % 3000, "large")
    esc = Escalator(small)
    esc.decide("s", 0, dets(), sig(0.9), now=0.0)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        out = [esc.decide("s", i, dets(), sig(0.9), now=float(i)).escalate for i in range(1, 50_001)]
        grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename")
                    if s.traceback[0].filename.endswith("budget.py"))
    finally:
        tracemalloc.stop()
    assert sum(out) >= 4_990
    assert grown < 40_000, grown
    esc.swap(large)
    assert esc.budget_state("s")["escalated_in_window"] == 300  # 10% of the last 3,000 frames
    more = [esc.decide("s", i, dets(), sig(0.9), now=float(i)).escalate for i in range(50_001, 50_301)]
    assert sum(more) == 30  # as many as left the 3,000 frames: the new cap holds over the frames before


def test_a_reload_leaves_each_stream_on_its_own_decision_clock():
    """Streams need not share a decision clock: an uncapped video file's runs on its recording's
    timeline (``edge.pipeline``), ahead of or behind the daemon's. A reload brought every
    stream's bucket up to the daemon's clock: a stream behind it was given tokens for time it
    never had, then none until its own clock caught up."""
    spec = "  threshold: 0.0\n  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: 1, burst: 1, priority: fifo}\n"
    esc = Escalator(policy(LINEAR + spec, "a"), clock=lambda: 3000.0)
    assert esc.decide("file", 0, dets(), sig(0.9), now=10.0).escalate
    assert esc.decide("camera", 0, dets(), sig(0.9), now=5000.0).escalate
    esc.swap(policy(LINEAR + spec, "b"))
    for sid, t0 in (("file", 10.0), ("camera", 5000.0)):
        assert [esc.decide(sid, i, dets(), sig(0.9), now=t0 + i / 2).escalate for i in range(1, 6)] == [
            False, True, False, True, False], sid  # one token a second
