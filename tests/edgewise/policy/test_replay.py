"""The what-if replay's core on records written here the way the daemon writes them
(``edge.records.FrameRecord``, decided by the real Escalator): reading (gzip by content,
file order, the reorder window, what is skipped and said), reproduction, restarts, the
figures (per hour, bytes, saturation, hardest held back), what cannot be reproduced, and
the policy digest. The daemon end to end is in tests/edge/test_whatif.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest

from edge.records import FrameRecord
from edgewise.errors import InvalidInputError
from edgewise.policy import Escalator, parse_policy
from edgewise.policy.deciding import FrameFacts
from edgewise.policy.digest import policy_digest
from edgewise.policy.recorded import Reading, frames, parse
from edgewise.policy.replay import jpeg_bytes_per_pixel, percentile, replay
from edgewise.policy.whatif import gate_failures, human_bytes, table

HEAD = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: %s}\nspec:\n"
LINEAR = "  signals: {combine: max, weights: {uncertain_count: 1.0}}\n"
T0 = 1_767_571_200  # 2026-01-05 00:00 UTC


def policy(spec: str, name: str = "p") -> Any:
    return parse_policy(HEAD % name + LINEAR + spec)


def daemon_records(pol: Any, hardness: Sequence[float], stream: str = "cam", fps: float = 10.0, epoch: int = 0,
                   t0: float = T0, classes: Sequence[str] = ("car",), payload: int = 50_000,
                   reload: Optional[Tuple[int, Any]] = None) -> List[Dict[str, Any]]:
    """The records a daemon deciding under ``pol`` writes for frames of these hardnesses
    (``reload``: (frame index, policy) put in force by a live reload just before that frame)."""
    esc = Escalator(pol)
    out = []
    generation = 1
    for i, h in enumerate(hardness):
        if reload is not None and i == reload[0]:
            pol, generation = reload[1], generation + 1
            esc.swap(pol)
        seq = (epoch << 32) + i
        sig = {"uncertain_count": round(h, 4), "mean_conf": 0.5}
        facts = FrameFacts(tuple(classes), len(classes), 0.9 if classes else 0.0)
        now = 100.0 + i / fps
        d = esc.decide_facts(stream, seq, facts, sig, now)
        cap = int((t0 + i / fps) * 1e9)
        rec = FrameRecord(
            device="dev", stream=stream, frame_seq=seq, capture_unix_ns=cap, emit_unix_ns=cap, width=640,
            height=480, detections=[{"box": [1, 2, 3, 4], "score": 0.9, "class_id": 0, "class_name": c,
                                     "source": "edge"} for c in classes],
            escalated=d.escalate, reason=d.reason, hardness=round(d.hardness, 4), signals=sig,
            suppressed_by=d.suppressed_by or "", detail=d.detail, threshold=d.threshold, origin=d.origin,
            priority=d.priority, policy=pol.metadata.name, policy_generation=generation, latency_ms={"total": 1.0},
            decided_s=now, edge_boxes=facts.boxes, edge_classes=list(facts.classes),
            edge_max_score=facts.max_score, policy_digest=policy_digest(pol),
            payload_bytes=payload if d.escalate else None, outcome="cloud" if d.escalate else "edge")
        out.append(rec.to_dict())
    return out


def write(path: Path, recs: Sequence[Dict[str, Any]], gz: bool = False) -> str:
    data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs).encode()
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return str(path)


BUSY = policy("  threshold: 0.5\n  budget: {maxFraction: 0.3, windowFrames: 10, maxPerSecond: 2, burst: 1}\n"
              "  streams: {cam: {cooldownSeconds: 0.25}}\n", "busy")
WAVE = [0.9 if i % 3 else 0.2 for i in range(200)]


# --------------------------------------------------------------------------- reading

def test_fast_parse_reads_what_the_full_parse_reads_for_the_daemons_layout() -> None:
    recs = daemon_records(BUSY, WAVE[:20])
    assert any(r["escalated"] for r in recs)
    for rec in recs:
        line = json.dumps(rec, separators=(",", ":"))
        fast, full = parse(line), json.loads(line)
        assert "detections" not in fast and "latency_ms" not in fast and "detail" not in fast  # the cut was taken
        assert {k: v for k, v in full.items() if k in fast} == fast
        for key in ("stream", "frame_seq", "signals", "decided_s", "edge_classes", "escalated", "policy_digest"):
            assert fast[key] == full[key]
    # records the cut must not hide things from: late, crop, older daemons, torn lines
    late = dict(recs[0], late=True)
    assert parse(json.dumps(late, separators=(",", ":")))["late"] is True
    crop = dict(recs[0], crop=[1, 2, 30, 40])
    assert parse(json.dumps(crop, separators=(",", ":")))["crop"] == [1, 2, 30, 40]
    old = {k: v for k, v in recs[0].items() if k not in ("edge_classes", "edge_boxes", "decided_s")}
    assert parse(json.dumps(old, separators=(",", ":")))["detections"] == old["detections"]
    assert parse(json.dumps(recs[0])[:-40]) is None


def test_files_gzip_by_content_any_order_reordered_and_what_is_skipped(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE[:60])
    first, second = recs[:30], recs[30:]
    second = second[3:6] + second[:3] + second[6:]  # written out of order (escalations settle late)
    junk = ['{"torn": ', "[1, 2]", json.dumps({"stream": "cam"}), json.dumps(dict(recs[40], late=True)),
            json.dumps(recs[41])]  # a duplicate of frame 41
    p1 = write(tmp_path / "rotated.1", first, gz=True)  # gzip'd, no .gz in the name
    p2 = tmp_path / "current.jsonl"
    write(p2, second)
    with open(p2, "a") as f:
        f.write("\n".join(junk) + "\n")
    reading = Reading()
    got = [d["frame_seq"] for d in frames([str(p2), p1], reading)]
    assert got == list(range(60))
    assert reading.files == [p1, str(p2)]
    assert (reading.not_json, reading.not_records, reading.late, reading.duplicates) == (2, 1, 1, 1)
    assert reading.lines == 60 + len(junk)


def test_a_record_later_than_the_window_is_decided_where_it_came_and_counted(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE[:40])
    late = recs.pop(5)
    path = write(tmp_path / "r.jsonl", recs + [late])
    reading = Reading()
    got = [d["frame_seq"] for d in frames([path], reading, window=8)]
    assert sorted(got) == list(range(40)) and got != sorted(got) and reading.beyond_window == 1
    assert [s for s in got if s != 5] == [s for s in range(40) if s != 5]
    reading = Reading()
    assert [d["frame_seq"] for d in frames([path], reading, window=64)] == list(range(40))


def test_unreadable_inputs_are_one_clear_error_a_cut_gzip_a_best_effort(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="records file not found"):
        list(frames([str(tmp_path / "none")], Reading()))
    with pytest.raises(InvalidInputError, match="is a folder"):
        list(frames([str(tmp_path)], Reading()))
    cut = tmp_path / "cut.gz"
    packed = gzip.compress("".join(json.dumps({"n": i * 7919 % 10007}) + "\n" for i in range(5000)).encode())
    cut.write_bytes(packed[: len(packed) // 2])
    reading = Reading()
    got = list(frames([str(cut)], reading))  # a gzip cut short: what is before the cut, and a note
    assert reading.lines > 0 and len(reading.cut_short) == 1
    assert reading.cut_short[0].startswith(f"{cut}: cannot read past line {reading.lines} ")
    assert got == []  # those lines are no frame records


# --------------------------------------------------------------------------- reproduction

def test_same_policy_reproduces_every_decision_budget_and_cooldown_included(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE)
    held = {r["suppressed_by"] for r in recs}
    assert {"cooldown", "budget_rate"} <= held  # the limits bite
    rep = replay([write(tmp_path / "r.jsonl", recs)], BUSY)
    mine, recorded = rep["sides"]
    assert mine["reproduction"] == {"checked": 200, "agreed": 200, "share": 1.0, "mismatches": [],
                                    "after_reload": {"compared": 0, "agreed": 0}}
    assert mine["overall"]["escalated"] == recorded["overall"]["escalated"] == sum(r["escalated"] for r in recs)
    assert mine["overall"]["suppressed"] == recorded["overall"]["suppressed"]
    assert gate_failures(rep, [], None, None, False) == []


def test_a_daemon_restart_resets_the_budget_as_the_daemon_did(tmp_path: Path) -> None:
    """Two runs (epochs): the second starts with a full token bucket. Replayed as one run the
    first frames of the second would be held back; the replay sees the epoch and agrees."""
    strict = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: 0.1, burst: 2}\n", "strict")
    run1 = daemon_records(strict, [0.9] * 10)
    run2 = daemon_records(strict, [0.9] * 10, epoch=1, t0=T0 + 2)
    assert sum(r["escalated"] for r in run2) == 2
    rep = replay([write(tmp_path / "r.jsonl", run1 + run2)], strict)
    assert rep["records"]["daemon_runs"] == {"cam": 2}
    assert rep["sides"][0]["reproduction"]["share"] == 1.0


def test_a_live_reload_is_no_failed_reproduction_of_the_policy_it_put_in_force(tmp_path: Path) -> None:
    """The daemon keeps the budget across a reload (docs/policies.md), so after it the new policy
    decided from the old one's tokens, window and cooldown, which the records do not hold: a
    token bucket out of phase differs for the rest of the run, not only right after it. Those
    frames are compared and counted apart, not a failed gate (check-policy exited 1 on every
    day of records with a reload in it, though the daemon did what the docs say); a run that
    starts with the new policy is still checked, and the old policy's frames before it too."""
    old = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: 2, burst: 4}\n", "old")
    new = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: 0.7, burst: 2}\n", "new")
    hard = [0.9 if i % 4 else 0.2 for i in range(200)]
    live = daemon_records(old, hard, reload=(60, new))
    assert [r["policy_generation"] for r in live[59:61]] == [1, 2]
    path = write(tmp_path / "r.jsonl", live)
    plain = replay([path], new)  # what differs: the replay's tokens at the reload are the new policy's
    mine = plain["sides"][0]
    assert mine["reproduction"]["checked"] == 0 and mine["reproduction"]["after_reload"]["compared"] == 140
    assert mine["reproduction"]["after_reload"]["agreed"] < 140  # the daemon's state was not reproducible
    assert gate_failures(plain, [], None, None, False) == []
    assert any("after a live reload from another version" in n for n in plain["notes"])
    assert "140 more after a live reload from another version (not checked" in table(plain)
    assert "NOT reproduced" not in table(plain)
    before = replay([path], old)["sides"][0]["reproduction"]  # the frames before the reload are checked
    assert (before["checked"], before["agreed"]) == (60, 60)
    # a restart under the new policy starts afresh: that run is checked again, and reproduced
    restarted = daemon_records(new, hard, epoch=1, t0=T0 + 30)
    rep = replay([write(tmp_path / "two.jsonl", live + restarted)], new)
    r = rep["sides"][0]["reproduction"]
    assert (r["checked"], r["agreed"], r["after_reload"]["compared"]) == (200, 200, 140)
    assert gate_failures(rep, [], None, None, False) == []


def test_escalations_dropped_by_the_policy_are_said_to_be_missing_from_the_records(tmp_path: Path) -> None:
    """onCloudUnavailable: drop writes no record of an escalation the cloud could not take
    (tests/edge/test_pipeline.py), so the replay cannot see the budget it spent: the records of
    a real daemon with its cloud away were 'NOT reproduced' and the recorded decisions counted
    no escalation, with no word of why. The note says why."""
    dropping = policy("  threshold: 0.5\n  onCloudUnavailable: drop\n"
                      "  budget: {maxFraction: 1.0, maxPerSecond: 1, burst: 1}\n", "dropping")
    recs = [r for r in daemon_records(dropping, [0.9] * 50) if not r["escalated"]]  # the cloud was away
    rep = replay([write(tmp_path / "r.jsonl", recs)], dropping)
    r = rep["sides"][0]["reproduction"]
    assert r["agreed"] < r["checked"]  # what the replay cannot know
    assert any("onCloudUnavailable: drop" in n and "has no record" in n for n in rep["notes"])
    kept = replay([write(tmp_path / "all.jsonl", daemon_records(dropping, [0.9] * 50))], dropping)
    assert not any("onCloudUnavailable: drop" in n for n in kept["notes"])  # reproduced: nothing to say


def test_devices_naming_a_stream_alike_are_two_streams_each_reproduced(tmp_path: Path) -> None:
    """frame_seqs and budgets are a device's: two devices' stream ``cam`` (same frame_seqs, one
    file interleaved as a fleet collector writes it, or a file each) are two streams, not one
    stream whose frames repeat."""
    one = daemon_records(BUSY, WAVE)
    two = [dict(r, device="dev2") for r in daemon_records(BUSY, WAVE[::-1])]
    mixed = [r for pair in zip(one, two) for r in pair]
    for paths in ([write(tmp_path / "both.jsonl", mixed)],
                  [write(tmp_path / "a.jsonl", one), write(tmp_path / "b.jsonl", two)]):
        rep = replay(paths, BUSY)
        assert rep["records"]["frames"] == 400 and rep["records"]["streams"] == 2
        assert rep["records"]["daemon_runs"] == {"dev/cam": 1, "dev2/cam": 1}
        assert rep["sides"][0]["reproduction"]["agreed"] == 400
        assert set(rep["sides"][0]["streams"]) == {"dev/cam", "dev2/cam"}
        assert not any("duplicate" in n for n in rep["notes"])


def test_the_same_records_twice_beyond_the_window_are_duplicates_not_decided_again(tmp_path: Path) -> None:
    """A glob that catches a .gz.tmp next to its source (or a file under two names) gives the
    records twice, the second copy long after the reorder window: all of it is duplicates."""
    recs = daemon_records(BUSY, WAVE)
    plain = write(tmp_path / "r.jsonl", recs)
    gz = write(tmp_path / "r.jsonl.gz.tmp", recs, gz=True)
    reading = Reading()
    assert [d["frame_seq"] for d in frames([plain, gz], reading, window=8)] == list(range(200))
    assert (reading.duplicates, reading.beyond_window) == (200, 0)
    late = recs.pop(5)  # a frame truly late beyond the window is decided, once
    reading = Reading()
    path = write(tmp_path / "late.jsonl", recs + [late, late])
    assert sorted(d["frame_seq"] for d in frames([path], reading, window=8)) == list(range(200))
    assert (reading.duplicates, reading.beyond_window) == (1, 1)
    rep = replay([plain, gz], BUSY)
    assert rep["sides"][0]["reproduction"]["agreed"] == rep["records"]["frames"] == 200


def test_what_cannot_be_reproduced_is_said(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE[:50])
    for r in recs[:10]:
        del r["decided_s"]
    for r in recs[10:20]:
        del r["edge_classes"], r["edge_boxes"], r["edge_max_score"]
    recs[20]["signals"] = {"mean_conf": 0.5}
    recs[21]["signals"] = {"uncertain_count": "high"}
    recs[30]["capture_unix_ns"] -= 5 * 10**9
    rep = replay([write(tmp_path / "r.jsonl", recs)], BUSY)
    notes = "\n".join(rep["notes"])
    assert "10 record(s) lack decided_s" in notes and "run on capture time" in notes
    assert "10 record(s) lack edge_classes" in notes
    assert "1 record(s) lack signal uncertain_count" in notes
    assert "1 record(s) have signals or edge facts that are not numbers" in notes
    assert "capture time goes backwards 1 time(s) (at most 4.9 s" in notes
    assert rep["records"]["frames"] == 49


def test_records_of_another_version_are_a_what_if_and_the_change_counts_add_up(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE)
    stricter = policy("  threshold: 0.95\n  budget: {maxFraction: 0.3, windowFrames: 10, maxPerSecond: 2, burst: 1}\n"
                      "  streams: {cam: {cooldownSeconds: 0.25}}\n", "busy")  # same name, another version
    path = write(tmp_path / "r.jsonl", recs)
    rep = replay([path], stricter)
    mine, recorded = rep["sides"]
    assert "reproduction" not in mine and mine["overall"]["escalated"] == 0
    assert rep["changes"]["no_longer_escalated"] == recorded["overall"]["escalated"]
    assert rep["records"]["policies"] == [
        {"name": "busy", "digest": policy_digest(BUSY), "frames": 200, "generations": [1]}]
    # --against the policy that recorded them: that side is checked, both are replayed
    rep = replay([path], stricter, BUSY, label="new.yaml", against_label="old.yaml")
    assert [s["label"] for s in rep["sides"]] == ["new.yaml", "old.yaml"]
    assert rep["sides"][1]["reproduction"]["share"] == 1.0
    text = table(rep)
    assert "old.yaml decided 200 of these frames" in text and "reproduced exactly" in text


# --------------------------------------------------------------------------- figures

def test_per_hour_percentiles_bytes_saturation_and_hardest(tmp_path: Path) -> None:
    lax = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n", "lax")
    # 3 hours at 1 fps: 10, 20 and 30 hard frames per hour
    hard = [1.0 if (i % 360) < (10 * (1 + i // 3600)) else 0.0 for i in range(3 * 3600)]
    recs = daemon_records(lax, hard, fps=1.0)
    rep = replay([write(tmp_path / "r.jsonl", recs)], lax)
    fig = rep["sides"][0]["overall"]
    assert fig["escalated"] == 10 * 10 + 10 * 20 + 10 * 30
    assert (fig["per_hour_p50"], fig["per_hour_p95"], fig["hours"]) == (200.0, 300.0, 3)
    # every escalation has its recorded size: 50 kB x 600 in 3 h -> per day
    assert fig["uplink_bytes"] == 600 * 50_000
    assert fig["uplink_bytes_per_day"] == 600 * 50_000 * 8
    assert fig["budget_saturated"]["episodes"] == 0
    # a tight rate: saturated while hard frames queue up; the hardest held back are listed
    tight = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: 0.2, burst: 1, priority: fifo}\n",
                   "tight")
    recs = daemon_records(lax, [0.6 + 0.001 * (i % 50) if i < 100 else 0.0 for i in range(200)], fps=1.0)
    rep = replay([write(tmp_path / "t.jsonl", recs)], tight, top=3)
    sat = rep["sides"][0]["overall"]["budget_saturated"]
    assert sat["episodes"] == 20 and 70 <= sat["seconds"] <= 100  # 4 of every 5 s held back
    hardest = rep["sides"][0]["hardest_suppressed"]
    assert [h["hardness"] for h in hardest] == [0.649, 0.649, 0.648] and hardest[0]["suppressed_by"] == "budget_rate"
    # two streams saturated alike at the same time: overall, the same share of the time (not twice it)
    two = recs + daemon_records(lax, [0.6 + 0.001 * (i % 50) if i < 100 else 0.0 for i in range(200)], stream="cam2",
                                fps=1.0)
    rep = replay([write(tmp_path / "two.jsonl", two)], tight)
    per_stream = rep["sides"][0]["streams"]["cam"]["budget_saturated"]
    overall = rep["sides"][0]["overall"]["budget_saturated"]
    assert per_stream["share_of_time"] == sat["share_of_time"] and 0.3 < sat["share_of_time"] < 0.6
    assert overall["share_of_time"] == pytest.approx(sat["share_of_time"], abs=1e-3)
    assert overall["episodes"] == 40 and overall["seconds"] == pytest.approx(2 * sat["seconds"], abs=0.2)


def test_uplink_is_estimated_from_the_frame_size_and_the_payload_settings(tmp_path: Path) -> None:
    lax = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n", "lax")
    recs = daemon_records(lax, [1.0] * 20)
    for r in recs:
        del r["payload_bytes"]  # an older daemon: no sizes recorded
    path = write(tmp_path / "r.jsonl", recs)
    rep = replay([path], lax)
    assert rep["sides"][0]["overall"]["uplink_bytes"] == round(20 * 640 * 480 * jpeg_bytes_per_pixel(85))
    low = policy("  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n  payload: {jpegQuality: 50}\n")
    assert replay([path], low)["sides"][0]["overall"]["uplink_bytes"] == round(20 * 640 * 480 * 0.103)
    # recorded sizes at a known quality are scaled to another quality
    sized = write(tmp_path / "s.jsonl", daemon_records(lax, [1.0] * 20, payload=61_440))  # 0.2 B/px
    rep = replay([sized], low, lax)
    assert rep["sides"][1]["overall"]["uplink_bytes"] == 20 * 61_440
    assert rep["sides"][0]["overall"]["uplink_bytes"] == pytest.approx(20 * 61_440 * 0.103 / 0.2, rel=1e-6)
    assert "scaled from jpegQuality 85 to 50" in rep["sides"][0]["overall"]["uplink_basis"]


def test_region_payloads_calibrate_on_their_area_and_each_side_sends_its_mode(tmp_path: Path) -> None:
    """payload_bytes is the image sent: a region payload's bytes are of its regions' pixels, a
    downscaled frame's of fewer pixels than the frame's (counted, not calibrated on)."""
    budget = "  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n"
    regions = policy(budget + "  payload: {mode: regions}\n", "regions")
    recs = daemon_records(regions, [1.0] * 20, payload=6_000)
    for r in recs:  # two regions of 100x100 and 100x200 pixels: 0.2 B/px
        r.update(payload="regions", regions=[[0, 0, 100, 100], [200, 0, 300, 200]])
    path = write(tmp_path / "r.jsonl", recs)
    full = policy(budget, "full")
    rep = replay([path], full, regions)
    assert rep["sides"][1]["overall"]["uplink_bytes"] == 20 * 6_000
    assert rep["sides"][0]["overall"]["uplink_bytes"] == pytest.approx(20 * 640 * 480 * 0.2, rel=1e-6)
    down = policy(budget + "  payload: {mode: downscaled, downscaleWidth: 320}\n", "down")
    assert replay([path], down, regions)["sides"][0]["overall"]["uplink_bytes"] == pytest.approx(
        20 * 320 * 240 * 0.2, rel=1e-6)
    # a 640-wide frame under low+regions at downscaleWidth 640 goes whole, as the daemon sends it
    # (edgewise.regions.low_is_frame): not the frame plus its regions again
    low = policy(budget + "  payload: {mode: low+regions, downscaleWidth: 640}\n", "low")
    assert replay([path], low, regions)["sides"][0]["overall"]["uplink_bytes"] == pytest.approx(
        20 * 640 * 480 * 0.2, rel=1e-6)
    low = policy(budget + "  payload: {mode: low+regions, downscaleWidth: 320}\n", "low")
    assert replay([path], low, regions)["sides"][0]["overall"]["uplink_bytes"] == pytest.approx(
        20 * (320 * 240 + 30_000) * 0.2, rel=1e-6)
    for r in recs:
        del r["regions"]
        r["payload"] = "downscaled"
    rep = replay([write(tmp_path / "d.jsonl", recs)], full, regions)
    assert rep["sides"][1]["overall"]["uplink_bytes"] == 20 * 6_000  # what was sent
    assert "rule of thumb for jpegQuality 85" in rep["sides"][0]["overall"]["uplink_basis"]


def test_a_whole_frame_refresh_is_counted_as_whole_frames_when_due(tmp_path: Path) -> None:
    """A policy with payload.wholeFrameEverySeconds sends the whole frame when its rule (the
    daemon's, on the records' decision clock) says so: 20 escalations 0.1 s apart under a 1 s
    refresh are 2 whole frames and 18 regions, at the recorded regions' 0.2 B/px."""
    budget = "  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n"
    regions = policy(budget + "  payload: {mode: regions}\n", "regions")
    recs = daemon_records(regions, [1.0] * 20, payload=6_000)
    for r in recs:  # 30,000 pixels of regions, 6,000 bytes: 0.2 B/px
        r.update(payload="regions", regions=[[0, 0, 100, 100], [200, 0, 300, 200]])
    path = write(tmp_path / "r.jsonl", recs)
    refresh = policy(budget + "  payload: {mode: regions, wholeFrameEverySeconds: 1.0}\n", "refresh")
    rep = replay([path], refresh, regions)
    assert rep["sides"][0]["overall"]["uplink_bytes"] == pytest.approx((2 * 640 * 480 + 18 * 30_000) * 0.2, rel=1e-6)
    assert rep["sides"][1]["overall"]["uplink_bytes"] == 20 * 6_000


def test_a_daemon_restart_sends_its_first_escalation_whole_and_the_replay_counts_it(tmp_path: Path) -> None:
    """A restarted daemon starts with no whole frame sent (edge.escalating keeps them per run),
    so under payload.wholeFrameEverySeconds its first escalation goes whole whatever the run
    before sent; a restart on the same host keeps the monotonic decision clock running. Replayed
    as one refresh history, the second run's first whole frame was counted as regions."""
    budget = "  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n"
    regions = policy(budget + "  payload: {mode: regions}\n", "regions")
    run1 = daemon_records(regions, [1.0] * 5, payload=6_000)
    run2 = daemon_records(regions, [1.0] * 5, payload=6_000, epoch=1, t0=T0 + 2)
    for r in run2:
        r["decided_s"] += 2.0  # the same host's monotonic clock, 2 s on: within the 10 s period
    for r in run1 + run2:  # 30,000 pixels of regions, 6,000 bytes: 0.2 B/px
        r.update(payload="regions", regions=[[0, 0, 100, 100], [200, 0, 300, 200]])
    path = write(tmp_path / "r.jsonl", run1 + run2)
    refresh = policy(budget + "  payload: {mode: regions, wholeFrameEverySeconds: 10.0}\n", "refresh")
    rep = replay([path], refresh, regions)
    assert rep["sides"][0]["overall"]["uplink_bytes"] == pytest.approx((2 * 640 * 480 + 8 * 30_000) * 0.2, rel=1e-6)


def test_helpers() -> None:
    assert percentile([], 50) == 0.0 and percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 95) == 4
    assert jpeg_bytes_per_pixel(85) == 0.2 and 0.2 < jpeg_bytes_per_pixel(87) < 0.247
    assert jpeg_bytes_per_pixel(0) == jpeg_bytes_per_pixel(1)
    assert human_bytes(999) == "999 B" and human_bytes(1_234_567) == "1.2 MB" and human_bytes(None) == "-"


# --------------------------------------------------------------------------- digest

def test_the_digest_is_what_the_policy_does_not_how_it_is_written() -> None:
    a = parse_policy(HEAD % "a" + "  threshold: 0.5\n  budget: {burst: 4}\n")
    b = parse_policy(HEAD % "b" + "  # the same, written otherwise\n  budget:\n    burst: 4\n    maxFraction: 0.2\n")
    c = parse_policy(HEAD % "a" + "  threshold: 0.51\n")
    assert policy_digest(a) == policy_digest(b) != policy_digest(c)
    assert len(policy_digest(a)) == 12


def test_a_learned_policys_digest_covers_its_model(tmp_path: Path) -> None:
    import numpy as np

    from edgewise.hardness.learned import FEATURE_NAMES, GainModel

    x = np.random.default_rng(0).random((200, len(FEATURE_NAMES)))
    digests: List[Optional[str]] = []
    for k in (0, 1):
        GainModel.fit(x, x[:, k], {}).save(tmp_path / "gain.json")
        p = parse_policy(HEAD % "l" + "  signals: {learnedModel: gain.json}\n", str(tmp_path / "p.yaml"))
        digests.append(policy_digest(p))
    assert digests[0] != digests[1]


def test_a_carry_aware_policy_on_records_without_the_carry_state_says_so(tmp_path: Path) -> None:
    # records of a daemon whose policy did not read the carry state hold no carry-state features:
    # a carry-aware policy replayed on them reads 0 for each, as if an answer had just come back
    # with nothing in it, and the report has to say so as it does for any missing signal
    import numpy as np

    from edgewise.hardness.learned import FEATURE_NAMES, GainModel

    x = np.random.default_rng(0).random((200, len(FEATURE_NAMES)))
    GainModel.fit(x, x[:, FEATURE_NAMES.index("answer_age")], {}, features=FEATURE_NAMES).save(tmp_path / "g.json")
    carry = parse_policy(HEAD % "c" + "  signals: {learnedModel: g.json}\n", str(tmp_path / "p.yaml"))
    rep = replay([write(tmp_path / "r.jsonl", daemon_records(BUSY, WAVE[:20]))], carry)
    assert "20 record(s) lack signal answer_age" in "\n".join(rep["notes"])


def test_another_carry_aware_policy_is_told_it_reads_the_recorded_carry_state(tmp_path: Path) -> None:
    # records of a daemon under one carry-aware policy hold the carry-state features its escalations
    # left; another carry-aware policy replayed on them reads those (the pixels are not recorded, so
    # the carrier cannot be re-run), and the report says which features, recorded under which policy
    import numpy as np

    from edgewise.hardness.learned import FEATURE_NAMES, GainModel

    x = np.random.default_rng(0).random((200, len(FEATURE_NAMES)))
    for name, target in (("a.json", "answer_age"), ("b.json", "new_regions")):
        GainModel.fit(x, x[:, FEATURE_NAMES.index(target)], {}, features=FEATURE_NAMES).save(tmp_path / name)
    recorder = parse_policy(HEAD % "ours" + "  signals: {learnedModel: a.json}\n", str(tmp_path / "a.yaml"))
    other = parse_policy(HEAD % "theirs" + "  signals: {learnedModel: b.json}\n", str(tmp_path / "b.yaml"))
    recs = daemon_records(BUSY, WAVE[:20])
    for i, rec in enumerate(recs):  # as a daemon under the carry-aware policy records them
        rec["signals"].update(answer_age=round(i % 5 / 30, 4), new_regions=0.5)
        rec.update(policy="ours", policy_digest=policy_digest(recorder))
    path = write(tmp_path / "r.jsonl", recs)
    said = [n for n in replay([path], other)["notes"] if "carry-state features" in n]
    assert len(said) == 1 and f"answer_age, new_regions under 'ours' ({policy_digest(recorder)[:12]})" in said[0]
    assert "carrier cannot be re-run" in said[0] and str(tmp_path / "b.yaml") in said[0]
    # the policy that recorded them, or one that reads no carry state, is told nothing of the kind
    assert not any("carry-state features" in n for n in replay([path], recorder)["notes"])
    assert not any("carry-state features" in n for n in replay([path], BUSY)["notes"])


# --------------------------------------------------------------------------- unusable records

def test_a_record_with_a_field_of_the_wrong_type_is_skipped_and_counted_never_a_crash(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE)
    held = [i for i, r in enumerate(recs) if r["suppressed_by"]]
    wrong = {"hardness": "x", "suppressed_by": 5, "policy_generation": [1], "policy_digest": None,
             "escalated": "yes", "payload_bytes": "big", "decided_s": "soon", "capture_unix_ns": 1.5,
             "edge_boxes": "2"}
    for i, (name, value) in zip(held, wrong.items()):  # held-back frames: the recorded side reads them all
        recs[i][name] = value
    recs[held[-1]]["edge_classes"] = [7]
    older = held[-2]  # an older daemon's record: the boxes instead of the edge facts, a score not a number
    del recs[older]["edge_classes"], recs[older]["edge_boxes"], recs[older]["edge_max_score"]
    recs[older]["detections"] = [{"box": [1, 2, 3, 4], "score": "high", "class_name": "car", "source": "edge"}]
    path = write(tmp_path / "r.jsonl", recs)
    reading = Reading()
    assert len(list(frames([path], reading))) == 200 - len(wrong) - 1
    assert reading.wrong_types == {**{name: 1 for name in wrong}, "edge_classes": 1}
    for against in (None, BUSY):
        rep = replay([path], BUSY, against)
        assert rep["records"]["frames"] == 200 - len(wrong) - 2
        notes = "\n".join(rep["notes"])
        assert "1 record(s) have hardness of another type than docs/records.md gives it: skipped" in notes
        assert "1 record(s) have edge_classes of another type" in notes
        assert "1 record(s) have signals or edge facts that are not numbers: skipped" in notes
        assert all(isinstance(h["hardness"], float) for s in rep["sides"] for h in s["hardest_suppressed"])
        assert "Notes" in table(rep)


def test_records_of_which_no_frame_is_usable_are_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InvalidInputError, match=r"empty.jsonl: no records \(the files are empty\)"):
        replay([str(empty)], BUSY)
    recs = daemon_records(BUSY, WAVE[:3])
    for r in recs:
        r["hardness"] = "x"
    bad = write(tmp_path / "bad.jsonl", [*recs, {"stream": "cam"}])
    with open(bad, "a") as f:
        f.write("torn{\n")
    with pytest.raises(InvalidInputError, match=r"bad.jsonl: none of the 5 line\(s\) is a usable frame record "
                                                r"\(1 not JSON objects; 1 without stream, frame_seq or signals; "
                                                r"3 with a field of the wrong type: hardness 3\)"):
        replay([bad], BUSY)


def test_check_policy_exits_2_on_records_it_cannot_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgewise.cli import main

    pol = tmp_path / "busy.yaml"
    pol.write_text(HEAD % "busy" + LINEAR + "  threshold: 0.5\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    recs = daemon_records(BUSY, WAVE[:20])
    recs[3]["hardness"] = "x"
    for records, code in ((str(empty), 2), (write(tmp_path / "r.jsonl", recs), 0)):
        assert main(["edge", "check-policy", str(pol), "--replay", records]) == code
        out, err = capsys.readouterr()
        if code:
            assert err.startswith("edgewise: error: ") and err.count("\n") == 1 and "no records" in err
        else:
            assert "1 record(s) have hardness of another type" in out
