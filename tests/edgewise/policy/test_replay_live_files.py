"""The what-if replay on the files of a running daemon: ``records.jsonl*`` given while the
daemon rotates and gzip's them (``edge.rotation``'s own ``compress``). A file listed by the
shell and gzip'd before the replay opens it is read as its ``.gz``; a file read ahead and
rotated away before its records are read is read under its new name, never swapped for the
daemon's new file; each is noted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge.rotation import compress
from edgewise.errors import InvalidInputError
from edgewise.policy.recorded import Reading, frames
from edgewise.policy.replay import replay
from tests.edgewise.policy.test_replay import BUSY, WAVE, daemon_records, write

ROTATED = "records.jsonl.20261207T135218.697012Z"


def test_a_records_file_rotated_while_the_replay_runs_is_read_under_its_new_name(tmp_path: Path) -> None:
    """A long replay read ``records.jsonl`` ahead, then read the older files for a minute; the
    daemon rotated it meanwhile, and the replay opened the name again: the daemon's new file.
    The rotated file's records were left out of the report without a word."""
    recs = daemon_records(BUSY, WAVE)
    older = write(tmp_path / "records.jsonl.20261207T120000.000000Z.gz", recs[:100], gz=True)
    live = write(tmp_path / "records.jsonl", recs[100:])
    reading = Reading()
    it = frames([live, older], reading, window=8)
    seqs = [next(it)["frame_seq"]]  # both files are read ahead; the older one is being read
    os.rename(live, tmp_path / ROTATED)  # the daemon's rotation, then its new file
    write(tmp_path / "records.jsonl", daemon_records(BUSY, WAVE[:50], epoch=1))
    seqs += [d["frame_seq"] for d in it]
    assert seqs == list(range(200))
    assert reading.cut_short == [f"{live}: rotated to {tmp_path / ROTATED} while the replay ran: its records were "
                                 "read there"]


def test_a_records_file_gone_before_its_records_are_read_is_noted_not_replaced(tmp_path: Path) -> None:
    recs = daemon_records(BUSY, WAVE)
    older = write(tmp_path / "records.jsonl.20261207T120000.000000Z.gz", recs[:100], gz=True)
    live = write(tmp_path / "records.jsonl", recs[100:])
    reading = Reading()
    it = frames([live, older], reading, window=8)
    seqs = [next(it)["frame_seq"]]
    os.rename(live, tmp_path / ROTATED)  # rotated, the daemon's new file made, then the rotated one
    write(tmp_path / "records.jsonl", daemon_records(BUSY, WAVE[:50], epoch=1))
    compress(str(tmp_path / ROTATED))  # gzip'd: that file is gone (its .gz is a file of its own)
    seqs += [d["frame_seq"] for d in it]
    assert seqs == list(range(100))
    assert reading.cut_short == [f"{live}: is no longer the file read when the replay began, and that file is not "
                                 "in its folder under another name; it was there when the replay began (a file being "
                                 "rotated or gzip'd?): skipped"]


def test_a_listed_file_gzipd_before_the_replay_opens_it_is_read_as_its_gz(tmp_path: Path) -> None:
    """``check-policy --replay records.jsonl*`` while the daemon gzip'd a rotated file: the shell
    listed the plain file (and its .gz.tmp), which was gone a moment later: "records file not
    found", the replay stopped."""
    recs = daemon_records(BUSY, WAVE)
    plain = write(tmp_path / ROTATED, recs[:100])
    live = write(tmp_path / "records.jsonl", recs[100:])
    listed = [live, plain, plain + ".gz.tmp"]  # what the glob caught mid-compression
    compress(plain)
    rep = replay(listed, BUSY)
    assert rep["records"]["frames"] == 200
    assert rep["sides"][0]["reproduction"]["agreed"] == 200
    notes = "\n".join(rep["notes"])
    assert f"{plain}: gzip'd to {plain}.gz since the files were listed: {plain}.gz read in its place" in notes
    assert f"{plain}.gz.tmp: gzip'd to {plain}.gz since the files were listed, which is read too: skipped" in notes
    # given too, the .gz is read once; a file never there is still an error
    assert replay([live, plain, plain + ".gz"], BUSY)["records"]["frames"] == 200
    with pytest.raises(InvalidInputError, match="records.jsonl.1: records file not found"):
        replay([live, str(tmp_path / "records.jsonl.1")], BUSY)
