"""The what-if replay on record files a QA probe found it could not take: capture times no
clock could have taken and clocks that jump, gzip files cut short or not gzip at all, records
read from a pipe, and numbers that are not finite or too large for a float. Each is a real file
(or pipe) in ``tmp_path``; where the exit status matters, the real CLI runs in a subprocess.
The CLI's subprocesses import this checkout (``PYTHONPATH``), whatever is installed."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest

import edgewise
from edgewise.errors import InvalidInputError
from edgewise.policy.recorded import (
    BOUNDED_FIELDS,
    MAX_LINE,
    MAX_LINE_RUN,
    Reading,
    bad_value,
    frames,
)
from edgewise.policy.replay import replay
from edgewise.policy.whatif import gate_failures, table
from tests.edgewise.policy.test_replay import (
    BUSY,
    HEAD,
    LINEAR,
    T0,
    WAVE,
    daemon_records,
    policy,
    write,
)

ROOT = Path(edgewise.__file__).resolve().parents[1]
BUSY_SPEC = ("  threshold: 0.5\n  budget: {maxFraction: 0.3, windowFrames: 10, maxPerSecond: 2, burst: 1}\n"
             "  streams: {cam: {cooldownSeconds: 0.25}}\n")
#: No budget and no cooldown: a skipped record changes no other decision, so a replay of the
#: rest reproduces them all (check-policy exits 0, not 1).
LAX_SPEC = "  threshold: 0.5\n  budget: {maxFraction: 1.0, maxPerSecond: null}\n"
LAX = policy(LAX_SPEC, "lax")


def check_policy(tmp_path: Path, records: Sequence[str], stdin: Optional[bytes] = None, shell: bool = False,
                 timeout: float = 120.0, spec: str = BUSY_SPEC, name: str = "busy") -> subprocess.CompletedProcess[bytes]:
    """``edgewise edge check-policy POLICY --replay RECORDS... --json`` in a subprocess (in bash
    when ``shell``, for a process substitution), the policy ``spec`` named ``name``. A replay
    that does not finish fails the test."""
    pol = tmp_path / f"{name}.yaml"
    pol.write_text(HEAD % name + LINEAR + spec)
    cmd = [sys.executable, "-m", "edgewise.cli", "edge", "check-policy", str(pol), "--json", "--replay", *records]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if shell:
        cmd = ["bash", "-c", " ".join(cmd)]
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, env=env, cwd=str(tmp_path),
                              check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"check-policy --replay {' '.join(records)} did not finish in {timeout:.0f} s")


def report_of(proc: subprocess.CompletedProcess[bytes]) -> Dict[str, Any]:
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    rep: Dict[str, Any] = json.loads(out)["replay"]
    return rep


def lines_of(recs: Sequence[Dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs).encode()


# --------------------------------------------------------------------------- capture time


def test_a_capture_time_no_clock_could_take_is_skipped_and_said_never_a_hang(tmp_path: Path) -> None:
    """10**30 ns and -10**25 ns made the per-hour figures loop over every hour in between:
    the replay never finished."""
    recs = daemon_records(LAX, WAVE)
    recs[5]["capture_unix_ns"] = 10**30
    recs[6]["capture_unix_ns"] = -10**25
    recs[7]["capture_unix_ns"] = 7_258_118_400 * 10**9  # 2200-01-01: out (the range ends before it)
    recs[8]["capture_unix_ns"] = 946_684_800 * 10**9 - 1  # a nanosecond before 2000
    del recs[9]["capture_unix_ns"]  # every daemon writes it: taken as 1970, it stretched the span
    path = write(tmp_path / "records.jsonl", recs)
    t = time.perf_counter()
    rep = report_of(check_policy(tmp_path, [path], spec=LAX_SPEC, name="lax"))
    assert time.perf_counter() - t < 60
    assert rep["records"]["frames"] == 195 and rep["sides"][0]["reproduction"]["share"] == 1.0
    assert rep["records"]["hours"] == pytest.approx(20 / 3600, abs=1e-3)  # 200 frames at 10 fps
    notes = "\n".join(rep["notes"])
    assert "5 record(s) have no capture time, or one before 2000 or after 2200 (a clock not yet set" in notes
    assert "skipped" in notes and "jumps" not in notes


def test_a_device_that_starts_at_1970_before_ntp_sync(tmp_path: Path) -> None:
    """A Jetson without an RTC battery: its first 100 records are at 1970, the rest now. Before,
    the replay took 10-21 s to report 499,664 h of capture time, 0 escalations per hour and
    54 B/day of uplink, without a note."""
    recs = daemon_records(LAX, [1.0 if i % 4 == 0 else 0.0 for i in range(400)])
    for r in recs[:100]:
        r["capture_unix_ns"] -= T0 * 10**9  # the same frames, on a clock that started at 0
    path = write(tmp_path / "records.jsonl", recs)
    t = time.perf_counter()
    rep = replay([path], LAX)
    assert time.perf_counter() - t < 5
    fig = rep["sides"][0]["overall"]
    assert rep["records"]["frames"] == 300 and fig["escalated"] == 75
    assert rep["records"]["hours"] == pytest.approx(30 / 3600, abs=1e-3)
    assert rep["records"]["capture_start_unix_s"] == pytest.approx(T0 + 10, abs=0.01)
    assert fig["per_hour_p50"] == pytest.approx(75 * 3600 / 30, rel=1e-3)  # 75 in 30 s of capture
    assert fig["uplink_bytes_per_day"] == pytest.approx(75 * 50_000 * 86400 / 30, rel=1e-3)
    notes = "\n".join(rep["notes"])
    assert "100 record(s) have no capture time, or one before 2000 or after 2200" in notes
    assert "What-if replay over 300 frames" in table(rep)


@pytest.mark.parametrize("jump_h", [24 * 200, -24 * 365, 198 * 365 * 24])
def test_a_clock_jump_is_said_and_the_rates_count_only_the_time_recorded(tmp_path: Path, jump_h: int) -> None:
    """An hour recorded, the clock stepped (by NTP, forward or back), another hour recorded:
    the per-hour and per-day figures are over the two hours, not over the months between, and
    the work does not grow with the gap (2001 to 2199 is 1.7 million hours)."""
    hard = [1.0 if i % 10 == 0 else 0.0 for i in range(7200)]  # 1 fps: 360 escalations an hour
    t0 = 978_307_200 if jump_h > 100_000 else T0  # 2001-01-01 for the longest jump
    recs = daemon_records(LAX, hard, fps=1.0, t0=t0)
    for r in recs[3600:]:
        r["capture_unix_ns"] += jump_h * 3600 * 10**9  # the decision clock (decided_s) is monotonic: unmoved
    path = write(tmp_path / "records.jsonl", recs)
    t = time.perf_counter()
    rep = replay([path], LAX)
    assert time.perf_counter() - t < 10
    fig = rep["sides"][0]["overall"]
    assert rep["sides"][0]["reproduction"]["share"] == 1.0
    assert rep["records"]["hours"] == pytest.approx(2.0, abs=1e-3)
    assert (fig["per_hour_p50"], fig["per_hour_p95"], fig["hours"]) == (360.0, 360.0, 2)
    assert fig["uplink_bytes_per_day"] == pytest.approx(720 * 50_000 * 12, rel=1e-3)
    assert rep["sides"][0]["streams"]["cam"]["per_hour_p50"] == 360.0
    notes = "\n".join(rep["notes"])
    assert "stream cam: capture time jumps by more than 1 h 1 time(s)" in notes
    assert f"at most {abs(jump_h):,.1f} h" in notes and "the records cover 2.00 h of the" in notes
    assert ("capture time goes backwards" in notes) == (jump_h < 0)
    assert "extrapolated" not in notes


# --------------------------------------------------------------------------- unreadable files

GOOD = daemon_records(BUSY, WAVE[:100])


def cut_gzip(path: Path, size: int) -> str:
    """The second half of GOOD's records gzip'd, cut after ``size`` bytes (a .gz.tmp being written)."""
    path.write_bytes(gzip.compress(lines_of(GOOD[50:]))[:size])
    return str(path)


@pytest.mark.parametrize("size", [2, 5, 10, 20])
def test_a_gzip_file_cut_inside_its_first_record_is_skipped_with_a_note(tmp_path: Path, size: int) -> None:
    good = write(tmp_path / "records.jsonl", GOOD[:50])
    cut = cut_gzip(tmp_path / "records.jsonl.1.gz", size)
    reading = Reading()
    got = [d["frame_seq"] for d in frames([cut, good], reading)]
    assert got == list(range(50))
    assert reading.files == [good, cut] and reading.empty_files == []
    assert len(reading.cut_short) == 1 and reading.cut_short[0].startswith(f"{cut}: cannot be read (")
    with pytest.raises(InvalidInputError, match=r"records.jsonl.1.gz: no records \(.*records.jsonl.1.gz: cannot be "
                                                r"read \(.*\): skipped"):
        replay([cut], BUSY)


def test_gzip_magic_followed_by_junk_or_a_corrupt_stream_is_skipped_with_a_note(tmp_path: Path) -> None:
    good = write(tmp_path / "records.jsonl", GOOD[:50])
    junk = tmp_path / "junk.gz"
    junk.write_bytes(b"\x1f\x8bRJ this is not gzip\n" * 20)
    corrupt = tmp_path / "corrupt.gz"
    corrupt.write_bytes(gzip.compress(lines_of(GOOD[50:]))[:10] + bytes(range(256)) * 8)
    reading = Reading()
    assert len(list(frames([str(junk), str(corrupt), good], reading))) == 50
    assert sorted(n.split(":")[0] for n in reading.cut_short) == [str(corrupt), str(junk)]
    assert all(": cannot be read (" in n for n in reading.cut_short)


def test_a_gz_tmp_caught_by_the_glob_mid_compression_gives_its_records_before_the_cut(tmp_path: Path) -> None:
    source = write(tmp_path / "records.jsonl", GOOD)  # the daemon's gzip is still reading it
    packed = gzip.compress(lines_of(GOOD))
    tmp = tmp_path / "records.jsonl.gz.tmp"
    tmp.write_bytes(packed[: len(packed) * 2 // 3])
    reading = Reading()
    assert [d["frame_seq"] for d in frames(sorted(map(str, tmp_path.glob("records.jsonl*"))), reading)] == list(
        range(100))
    assert reading.duplicates == reading.lines - 100 > 0
    assert len(reading.cut_short) == 1 and reading.cut_short[0].startswith(f"{tmp}: cannot read past line ")
    assert source in reading.files


def test_check_policy_on_cut_gzip_files_notes_them_or_exits_2_never_a_traceback(tmp_path: Path) -> None:
    good = write(tmp_path / "records.jsonl", GOOD[:50])
    cut = cut_gzip(tmp_path / "records.jsonl.1.gz", 10)
    junk = tmp_path / "junk.gz"
    junk.write_bytes(b"\x1f\x8b" + b"junk" * 100)
    rep = report_of(check_policy(tmp_path, [good, cut, str(junk)]))
    assert rep["records"]["frames"] == 50
    notes = "\n".join(rep["notes"])
    assert f"{cut}: cannot be read (" in notes and f"{junk}: cannot be read (" in notes
    proc = check_policy(tmp_path, [cut, str(junk)])
    err = proc.stderr.decode()
    assert proc.returncode == 2 and proc.stdout == b"", err
    assert err.startswith("edgewise: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "no records" in err and f"{cut}: cannot be read" in err and f"{junk}: cannot be read" in err


# --------------------------------------------------------------------------- pipes


@pytest.mark.skipif(not Path("/dev/stdin").exists() or shutil.which("bash") is None, reason="needs /dev/stdin, bash")
def test_records_from_a_pipe_are_read_once_whole_plain_or_gzip(tmp_path: Path) -> None:
    """``--replay /dev/stdin`` and ``<(...)``: before, the magic bytes and the lines read for the
    order were read from the pipe and lost (716 of 728 frames) and a gzip'd pipe crashed."""
    recs = daemon_records(BUSY, WAVE + WAVE[:100], stream="cam")  # 300 records, ~250 kB: many pipe buffers
    data = lines_of(recs)
    assert len(data) > 200_000
    path = write(tmp_path / "records.jsonl", recs)
    whole = report_of(check_policy(tmp_path, [path]))
    assert whole["records"]["frames"] == 300 and whole["sides"][0]["reproduction"]["share"] == 1.0
    for stdin, name in ((data, "/dev/stdin"), (gzip.compress(data), "/dev/stdin"), (data, "-")):  # - as for cat
        rep = report_of(check_policy(tmp_path, [name], stdin=stdin))
        assert rep["records"]["frames"] == 300 and rep["records"]["lines"] == 300
        assert rep["sides"][0]["reproduction"]["share"] == 1.0 and rep["notes"] == whole["notes"]
    other = daemon_records(BUSY, WAVE, stream="cam2")
    (tmp_path / "other.gz").write_bytes(gzip.compress(lines_of(other)))
    rep = report_of(check_policy(tmp_path, [f"<(cat {path})", f"<(cat {tmp_path / 'other.gz'})"], shell=True))
    assert rep["records"]["frames"] == 500 and rep["records"]["streams"] == 2
    assert not any("not JSON" in n for n in rep["notes"])


# --------------------------------------------------------------------------- numbers


def numbers_records(pol: Any = BUSY) -> List[Dict[str, Any]]:
    recs = daemon_records(pol, WAVE)
    esc = [i for i, r in enumerate(recs) if r["escalated"]]
    recs[1]["signals"]["uncertain_count"] = 10**400  # an int no float holds: OverflowError in combine
    recs[2]["signals"]["entropy"] = 10**400          # a signal the policy does not weigh: still unusable
    recs[3]["signals"]["uncertain_count"] = float("nan")
    recs[4]["signals"]["uncertain_count"] = float("inf")
    recs[5]["hardness"] = float("nan")
    recs[6]["decided_s"] = float("-inf")
    recs[7]["decided_s"] = 10**400
    recs[8]["edge_max_score"] = float("inf")
    recs[9]["width"] = 10**400
    recs[esc[-1]]["payload_bytes"] = 10**400
    recs[10]["signals"]["uncertain_count"] = True  # JSON true: abs(True) is 1, so it counted as 1.0
    return recs


def test_numbers_that_are_not_finite_or_too_large_are_skipped_and_counted(tmp_path: Path) -> None:
    recs = numbers_records()
    path = tmp_path / "records.jsonl"
    text = lines_of(recs).decode()
    assert "NaN" in text and "-Infinity" in text
    text = text.replace('"edge_max_score":Infinity', '"edge_max_score":1e400')  # a float JSON text overflows
    path.write_text(text)
    reading = Reading()
    assert len(list(frames([str(path)], reading))) == 200 - 6
    assert reading.bad_values == {"hardness": 1, "decided_s": 2, "edge_max_score": 1, "width": 1,
                                  "payload_bytes": 1}
    assert reading.wrong_types == {}
    for against in (None, BUSY):
        rep = replay([str(path)], BUSY, against)
        assert rep["records"]["frames"] == 200 - 6 - 5
        notes = "\n".join(rep["notes"])
        assert "5 record(s) have signals or edge facts that are not numbers: skipped" in notes
        assert "2 record(s) have decided_s that is not a finite number (NaN, Infinity, or too large" in notes
        for name in ("hardness", "edge_max_score", "width", "payload_bytes"):
            assert f"1 record(s) have {name} that is not a finite number" in notes
        json.dumps(rep, allow_nan=False)  # nothing infinite came through
        assert "Notes" in table(rep)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 10**400, -(2**53) - 1])
def test_each_number_a_replay_computes_with_must_be_finite_and_not_too_large(value: Any) -> None:
    ok = daemon_records(BUSY, WAVE[:1])[0]
    assert bad_value(ok) is None and bad_value({**ok, "payload_bytes": None, "width": 2**53}) is None
    for name in BOUNDED_FIELDS:
        assert bad_value({**ok, name: value}) == name


def test_check_policy_on_a_400_digit_signal_exits_0_with_a_note(tmp_path: Path) -> None:
    path = write(tmp_path / "records.jsonl", numbers_records(LAX))
    rep = report_of(check_policy(tmp_path, [path], spec=LAX_SPEC, name="lax"))
    assert rep["records"]["frames"] == 200 - 11 and rep["sides"][0]["reproduction"]["share"] == 1.0
    assert any("signals or edge facts that are not numbers" in n for n in rep["notes"])


def test_a_byte_order_mark_an_editor_put_first_does_not_cost_the_first_record(tmp_path: Path) -> None:
    """A records file saved by an editor that writes a UTF-8 byte order mark (Windows Notepad)
    lost its first record, counted as a torn line. Plain and gzip'd."""
    recs = daemon_records(BUSY, WAVE[:20])
    for path, opener in ((tmp_path / "records.jsonl", open), (tmp_path / "records.jsonl.gz", gzip.open)):
        with opener(path, "wb") as f:
            f.write(b"\xef\xbb\xbf" + lines_of(recs))
        reading = Reading()
        assert [r["frame_seq"] for r in frames([str(path)], reading)] == [r["frame_seq"] for r in recs]
        assert reading.not_json == 0


# --------------------------------------------------------------------------- frame_seq, sizes and counts


@pytest.mark.parametrize("seq", [2**63, 10**30, -1, -(2**40)])
def test_a_frame_seq_no_daemon_writes_is_skipped_and_said_never_a_crash(tmp_path: Path, seq: int) -> None:
    """A frame_seq of 2**63 or more crashed the replay (OverflowError: the stream's frame_seqs are
    64-bit integers); a negative one was decided as a frame of an epoch before the first."""
    recs = daemon_records(BUSY, WAVE[:20])
    recs[5]["frame_seq"] = seq
    path = write(tmp_path / "records.jsonl", recs)
    reading = Reading()
    assert len(list(frames([path], reading))) == 19 and reading.bad_values == {"frame_seq": 1}
    rep = replay([path], BUSY)
    assert rep["records"]["frames"] == 19
    assert "1 record(s) have frame_seq that is not an integer from 0 to 2**63 - 1" in "\n".join(rep["notes"])
    proc = check_policy(tmp_path, [path])  # the CLI: a note and exit 1 (a skipped frame changes the budget)
    assert proc.returncode in (0, 1) and b"Traceback" not in proc.stderr


@pytest.mark.parametrize("field, value", [("payload_bytes", -50_000), ("width", -640), ("height", 0),
                                          ("width", None), ("edge_boxes", -3)])
def test_a_negative_or_missing_size_is_skipped_never_an_uplink_under_any_gate(tmp_path: Path, field: str,
                                                                              value: Optional[int]) -> None:
    """A negative payload_bytes or frame width made the uplink per day negative, and a frame of
    width 0 (or none) sent 0 bytes: either passed any --max-bytes-per-day gate."""
    recs = daemon_records(LAX, WAVE[:30])
    bad = [i for i, r in enumerate(recs) if field != "payload_bytes" or r.get("payload_bytes")][::2]
    for i in bad:
        if value is None:
            del recs[i][field]
        else:
            recs[i][field] = value
    path = write(tmp_path / "records.jsonl", recs)
    reading = Reading()
    assert len(list(frames([path], reading))) == 30 - len(bad) and reading.bad_values == {field: len(bad)}
    for against in (None, LAX):
        rep = replay([path], LAX, against)
        assert f"{len(bad)} record(s) have {field} that is not a finite number of at least" in "\n".join(rep["notes"])
        for side in rep["sides"]:
            assert side["overall"]["uplink_bytes_per_day"] > 10**9  # 640x480 frames at 10 fps, 2 in 3 escalated
        assert gate_failures(rep, [], None, 1000.0, False)


def test_a_last_line_of_one_nul_byte_is_not_json_not_too_long(tmp_path: Path) -> None:
    """A file that ends in one NUL byte (a crash) was said to have a line longer than 1 MB: the
    marker of a too-long line was the one-character string "\\0", which CPython shares with the
    line read (found by a probe)."""
    path = tmp_path / "records.jsonl"
    path.write_bytes(lines_of(daemon_records(LAX, WAVE[:5])) + b"\0")
    reading = Reading()
    assert len(list(frames([str(path)], reading))) == 5
    assert (reading.too_long, reading.not_json) == (0, 1)


def test_a_line_nested_past_the_json_decoders_depth_is_not_json(tmp_path: Path) -> None:
    """A line of 100000 '[' (well under MAX_LINE) made json.loads raise RecursionError, which
    nothing caught: check-policy --replay ended in a traceback. It is a line that is not JSON,
    counted, also as a file's first line (read ahead for its capture time), also in a line the
    fast path cuts."""
    deep = "[" * 100_000 + "]" * 100_000
    cut = '{"detections":[' + deep + '],"escalated":true,"detail":"","policy":"","latency_ms":{},"decided_s":1}'
    path = tmp_path / "records.jsonl"
    path.write_bytes(f"{deep}\n{cut}\n".encode() + lines_of(daemon_records(LAX, WAVE[:5])))
    reading = Reading()
    assert len(list(frames([str(path)], reading))) == 5
    assert reading.not_json == 2
    report_of(check_policy(tmp_path, [str(path)]))  # exit 0, no traceback


def test_a_line_longer_than_any_record_is_skipped_in_pieces_and_said(tmp_path: Path) -> None:
    """A run of NUL bytes a crash left (or a file that is not the sink's) made one line of all of
    it: the replay held it whole (a 64 MB line took 260 MB; /dev/zero all memory, then a
    MemoryError traceback). It is read on in pieces of MAX_LINE, and counted."""
    recs = daemon_records(LAX, WAVE[:20])
    path = tmp_path / "records.jsonl"
    path.write_bytes(lines_of(recs[:10]) + b"\0" * (16 * MAX_LINE) + b"\n" + lines_of(recs[10:]))
    reading = Reading()
    tracemalloc.start()
    try:
        got = list(frames([str(path)], reading))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 20 and reading.too_long == 1 and reading.not_json == 0
    assert peak < 8 * MAX_LINE  # pieces of MAX_LINE characters, never the 16 MAX_LINE line
    rep = replay([str(path)], LAX)
    assert rep["records"]["frames"] == 20
    assert f"1 line(s) are longer than {MAX_LINE:,} characters" in "\n".join(rep["notes"])
    junk = tmp_path / "junk.bin"  # one line, longer than any record: nothing to replay, and why
    junk.write_bytes(b"x" * (MAX_LINE + 1))
    with pytest.raises(InvalidInputError, match=rf"none of the 1 line\(s\) is a usable frame record \(1 longer than {MAX_LINE:,} characters\)"):
        replay([str(junk)], LAX)


def test_a_line_without_end_gives_the_file_up_after_the_records_before_it(tmp_path: Path) -> None:
    """``--replay /dev/zero`` read for ever (one endless line, read on in pieces): a line past
    MAX_LINE_RUN gives its file up, the records before it are used and the note says why."""
    recs = daemon_records(LAX, WAVE[:20])
    path = tmp_path / "records.jsonl"
    path.write_bytes(lines_of(recs[:10]) + b"\0" * (MAX_LINE_RUN + MAX_LINE) + b"\n" + lines_of(recs[10:]))
    reading = Reading()
    assert len(list(frames([str(path)], reading))) == 10
    assert reading.cut_short == [f"{path}: cannot read past line 10 (a line of over 64 MiB without a line end: not a "
                                 "records file); the records before it are used"]
    proc = check_policy(tmp_path, ["/dev/zero"], timeout=60.0)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err
    assert ("/dev/zero: no records (/dev/zero: a line of over 64 MiB without a line end: not a records file: "
            "skipped)") in err


# --------------------------------------------------------------------------- ids the table prints


FORGED = "cam\nNOT REPRODUCED: 0 decisions agree \x1b[2J"


@pytest.mark.parametrize("field, value", [("stream", FORGED), ("device", "dev\r\nstream x (9 frames)"),
                                          ("stream", "c" * 129), ("stream", "cam|b"), ("device", "d\x00"),
                                          ("reason", "hard\nstream x (9 frames)"), ("suppressed_by", FORGED),
                                          ("policy_digest", "\x1b[2J")])
def test_a_stream_or_device_no_daemon_can_have_is_skipped_never_printed_into_the_table(
        tmp_path: Path, field: str, value: str) -> None:
    """The what-if table printed a record's stream id (and its device, reason, suppressor and
    policy digest) as it was: a line break in one started a forged line of the report (``stream
    cam`` then ``NOT REPRODUCED...``) and a terminal escape cleared the operator's screen. A
    daemon writes all of them within the id rule (edgewise.ids), so records with other text
    there are not a daemon's: skipped, said."""
    recs = daemon_records(LAX, WAVE[:30]) + daemon_records(LAX, WAVE[:10], stream="b")
    for r in recs[30:]:
        r[field] = value
    path = write(tmp_path / "records.jsonl", recs)
    reading = Reading()
    assert len(list(frames([path], reading))) == 30 and reading.bad_values == {field: 10}
    proc = check_policy(tmp_path, [path], spec=LAX_SPEC, name="lax")
    assert proc.returncode == 0, proc.stderr.decode()
    pol = tmp_path / "lax.yaml"
    text = subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "check-policy", str(pol), "--replay", path],
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False, timeout=120)
    out = text.stdout.decode()
    assert text.returncode == 0, text.stderr.decode()
    assert "\x1b" not in out and "NOT REPRODUCED" not in out and "stream x" not in out and "\r" not in out
    assert f"10 record(s) have {field} that is not text a daemon writes" in out
    assert "30 frames of 1 stream(s)" in out
