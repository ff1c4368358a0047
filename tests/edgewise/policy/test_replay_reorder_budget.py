"""The what-if replay's reorder window under one budget of records held across all streams
(``edgewise.policy.recorded.REORDER_BUDGET``): memory bounded however many streams the records
hold (counted by ``Reading.held_most``, never timed), the same decisions and report as an
unbounded window on records within the budget, duplicates told at any distance, and a note
naming the budget when a record comes later than its stream's share of it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence, Tuple

import pytest

from edgewise.policy.recorded import REORDER_BUDGET, REORDER_FRAMES, Reading, _Released, frames
from edgewise.policy.replay import replay
from edgewise.policy.whatif import table
from tests.edgewise.policy.test_replay import BUSY, WAVE, daemon_records, write

Rec = Dict[str, Any]


def fleet(devices: int, streams: int, n: int, late_by: int = 3) -> List[List[Rec]]:
    """Each stream's records as its daemon decided them (``devices`` x ``streams``, ``n`` frames)."""
    out = []
    for d in range(devices):
        for s in range(streams):
            recs = daemon_records(BUSY, WAVE[(d + s) % 7:][:n], stream=f"cam{s}")
            out.append([dict(r, device=f"dev{d}") for r in recs])
    return out


def interleaved(streams: Sequence[Sequence[Rec]], late_by: int = 3) -> List[Rec]:
    """One file as a fleet collector writes it: frame by frame across the streams, each
    escalated frame's record ``late_by`` frames of its stream late (written when settled)."""
    out: List[Rec] = []
    pending: List[Tuple[int, Rec]] = []
    for i in range(max(len(s) for s in streams)):
        for recs in streams:
            if i < len(recs):
                if recs[i]["escalated"]:
                    pending.append((i + late_by, recs[i]))
                else:
                    out.append(recs[i])
        out += [r for due, r in pending if due <= i]
        pending = [(due, r) for due, r in pending if due > i]
    return out + [r for _, r in pending]


def seqs_by_stream(docs: Iterable[Rec]) -> Dict[Tuple[str, str], List[int]]:
    out: Dict[Tuple[str, str], List[int]] = {}
    for d in docs:
        out.setdefault((d["device"], d["stream"]), []).append(d["frame_seq"])
    return out


def timeless(report: Dict[str, Any]) -> Dict[str, Any]:
    """A report without what differs from run to run (time) or with the budget (its counts)."""
    doc = json.loads(json.dumps(report))
    for key in ("seconds", "cpu_seconds", "records_per_second", "reorder"):
        del doc["records"][key]
    return doc


@pytest.mark.parametrize("layout", ["one fleet file", "a file per device"])
def test_many_streams_hold_one_budget_and_replay_as_an_unbounded_window_does(tmp_path: Path, layout: str) -> None:
    """40 streams: a window of 64 records each would hold 2,560; the budget of 200 holds at most
    200 (5 a stream), and as every record comes at most 3 frames late the order, the decisions
    and the whole report are those of a window without a budget."""
    streams = fleet(4, 10, 120)
    if layout == "one fleet file":
        paths = [write(tmp_path / "fleet.jsonl", interleaved(streams))]
    else:
        paths = [write(tmp_path / f"dev{d}.jsonl", interleaved(streams[d * 10:(d + 1) * 10])) for d in range(4)]
    total = sum(len(s) for s in streams)
    reading = Reading()
    got = list(frames(paths, reading, window=64, budget=200))
    assert (reading.held_most, reading.reorder_frames, reading.reorder_budget, reading.streams) == (200, 5, 200, 40)
    assert (reading.beyond_window, reading.duplicates) == (0, 0) and len(got) == total
    assert all(seqs == list(range(120)) for seqs in seqs_by_stream(got).values())
    unbounded = Reading()
    again = list(frames(paths, unbounded, window=64, budget=10**9))
    assert unbounded.held_most > 40 * 60 and unbounded.reorder_frames == 64  # what a window per stream holds
    assert seqs_by_stream(again) == seqs_by_stream(got)

    tight = replay(paths, BUSY, reorder_frames=64, reorder_budget=200)
    loose = replay(paths, BUSY)
    assert tight["records"]["reorder"] == {"window_frames": 5, "budget_records": 200, "held_most": 200}
    assert loose["records"]["reorder"]["window_frames"] == min(REORDER_FRAMES, REORDER_BUDGET // 40)
    assert tight["sides"][0]["reproduction"]["agreed"] == total
    assert len(tight["sides"][1]["hardest_suppressed"]) == 10  # ties of hardness: ranked the same either way
    assert timeless(tight) == timeless(loose)


def test_a_record_later_than_its_streams_share_is_decided_where_it_came_and_the_note_names_the_budget(
        tmp_path: Path) -> None:
    streams = fleet(1, 20, 60)
    records = interleaved(streams)
    moved = next(r for r in records if r["stream"] == "cam0" and r["frame_seq"] == 10)
    records.remove(moved)
    at = records.index(next(r for r in records if r["stream"] == "cam0" and r["frame_seq"] == 30))
    records.insert(at, moved)  # 20 frames of its stream late: within a window of 64, not within 5
    path = write(tmp_path / "fleet.jsonl", records)

    reading = Reading()
    got = seqs_by_stream(frames([path], reading, window=64, budget=100))
    assert (reading.reorder_frames, reading.beyond_window, reading.held_most) == (5, 1, 100)
    assert sorted(got[("dev0", "cam0")]) == list(range(60)) and got[("dev0", "cam0")] != list(range(60))
    rep = replay([path], BUSY, reorder_frames=64, reorder_budget=100)
    note = next(n for n in rep["notes"] if "came more than" in n)
    assert note.startswith("1 record(s) came more than 5 frames of their stream late")
    assert "The 20 stream(s) shared the reorder budget of 100 records held at once" in note
    assert "REORDER_BUDGET" in note and "5 each instead of 64" in note and "--replay -" in note
    assert note in table(rep)

    reading = Reading()  # within the budget (the default one): in order, nothing said
    assert all(s == list(range(60)) for s in seqs_by_stream(frames([path], reading)).values())
    assert reading.beyond_window == 0
    assert not any("came more than" in n for n in replay([path], BUSY)["notes"])

    one = daemon_records(BUSY, WAVE[:60])  # one stream: the window is what a record came later than
    one.insert(30, one.pop(10))
    rep = replay([write(tmp_path / "one.jsonl", one)], BUSY, reorder_frames=8)
    note = next(n for n in rep["notes"] if "came more than" in n)
    assert "more than 8 frames" in note and "(the reorder window: 8 frames of a stream)" in note
    assert "budget of" not in note


def test_duplicates_are_told_at_any_distance_however_small_the_budget(tmp_path: Path) -> None:
    """A fleet file and its gzip'd copy (a glob catching both): the copy is all duplicates."""
    records = interleaved(fleet(2, 10, 40))
    plain = write(tmp_path / "fleet.jsonl", records)
    copy = write(tmp_path / "fleet.jsonl.gz", records, gz=True)
    reading = Reading()
    got = list(frames([plain, copy], reading, window=64, budget=100))
    assert (reading.duplicates, reading.beyond_window, len(got)) == (len(records), 0, len(records))
    assert (reading.held_most, reading.reorder_frames) == (100, 5)
    assert all(s == list(range(40)) for s in seqs_by_stream(got).values())
    with gzip.open(copy, "rt") as f:
        assert sum(1 for _ in f) == len(records)


def test_frames_yielded_are_kept_as_runs_and_a_late_frame_fills_its_gap() -> None:
    """What tells a duplicate at any distance grows with the gaps in a stream's frame_seqs (frames
    the daemon never wrote), not with its records: a late frame joins the runs around it."""
    rel = _Released()
    for seq in range(0, 100, 2):
        rel.add_next(seq)
    assert len(rel.starts) == 50
    for seq in range(1, 99, 2):
        assert not rel.seen(seq) and rel.seen(seq)  # late, then a duplicate of it
    assert (list(rel.starts), list(rel.ends), rel.last) == ([0], [98], 98)
    assert rel.seen(0) and rel.seen(50) and rel.seen(98)
    rel.add_next(200)
    assert not rel.seen(150) and not rel.seen(152) and not rel.seen(151)
    assert (list(rel.starts), list(rel.ends)) == ([0, 150, 200], [98, 152, 200])
    assert not rel.seen(99) and not rel.seen(149) and list(rel.starts) == [0, 149, 200]


def test_mismatches_listed_are_the_first_by_stream_and_frame_whatever_the_interleaving(tmp_path: Path) -> None:
    streams = fleet(1, 12, 40)
    for recs in streams:
        for r in (recs[5], recs[20]):  # recorded decisions the policy does not make: 24 mismatches
            r["escalated"] = not r["escalated"]
    path = write(tmp_path / "fleet.jsonl", interleaved(streams))
    tight = replay([path], BUSY, reorder_frames=64, reorder_budget=60)
    loose = replay([path], BUSY)
    listed = [(m["stream"], m["frame_seq"]) for m in tight["sides"][0]["reproduction"]["mismatches"]]
    expected = sorted((f"cam{s}", seq) for s in range(12) for seq in (5, 20))[:20]
    assert listed == expected
    assert timeless(tight) == timeless(loose)


def test_a_negative_window_or_budget_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", daemon_records(BUSY, WAVE[:5]))
    with pytest.raises(ValueError, match="0 or more"):
        list(frames([path], Reading(), budget=-1))
    reading = Reading()  # a budget of 0: no reordering, every record decided where it comes
    assert [d["frame_seq"] for d in frames([path], reading, budget=0)] == list(range(5))
    assert (reading.held_most, reading.reorder_frames) == (0, 0)
