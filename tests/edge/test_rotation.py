"""The JSON Lines sink on small flash: rotation by size, N files kept, gzip'd aside, nothing
lost, and late records written once also across a rotation and a restart."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from edge import rotation as R
from edge.sinks import JsonlSink, Sinks
from tests.edge.helpers import frame_record
from tests.waiting import wait_until


def late(seq):
    rec = frame_record("cam", seq)
    rec.late, rec.outcome = True, "cloud"
    return rec


def all_records(path: Path):
    """Every record of the file and its rotated files, oldest first."""
    out = []
    for f in reversed(R.rotated_files(str(path))):
        data = gzip.open(f, "rb").read() if f.endswith(".gz") else Path(f).read_bytes()
        out += [json.loads(line) for line in data.splitlines()]
    return out + [json.loads(line) for line in path.read_bytes().splitlines()]


def record_size(tmp_path: Path) -> int:
    probe = tmp_path / "probe.jsonl"
    s = Sinks([JsonlSink(str(probe))])
    s.write(frame_record("cam", 0))
    s.close()
    return probe.stat().st_size


def test_rotates_by_size_keeps_n_and_loses_nothing_kept(tmp_path: Path) -> None:
    path = tmp_path / "det.jsonl"
    size = record_size(tmp_path)
    sinks = Sinks([JsonlSink(str(path), max_bytes=3 * size, keep=2)])
    for seq in range(10):
        sinks.write(frame_record("cam", seq))
    sinks.close()
    rotated = R.rotated_files(str(path))
    assert len(rotated) == 2 and all(not f.endswith(".gz") for f in rotated)
    assert all(os.path.getsize(f) <= 3 * size + 2 for f in rotated + [str(path)])
    kept = [r["frame_seq"] for r in all_records(path)]
    assert kept == list(range(kept[0], 10)) and kept[0] > 0  # the newest, in order; the oldest deleted


def test_rotated_files_are_gzipped_in_the_background_and_pruned(tmp_path: Path) -> None:
    path = tmp_path / "det.jsonl"
    size = record_size(tmp_path)
    sink = JsonlSink(str(path), max_bytes=2 * size, keep=3, compress=True)
    sinks = Sinks([sink])
    for seq in range(12):
        sinks.write(frame_record("cam", seq))
    sinks.close()  # waits for the compressor
    rotated = R.rotated_files(str(path))
    assert len(rotated) == 3 and all(f.endswith(".gz") for f in rotated)
    assert not list(tmp_path.glob("*.tmp"))
    kept = [r["frame_seq"] for r in all_records(path)]
    assert kept == list(range(kept[0], 12)) and kept[0] > 0


def test_a_late_record_is_written_once_across_rotation_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "det.jsonl"
    size = record_size(tmp_path)

    def open_sinks():
        return Sinks([JsonlSink(str(path), max_bytes=2 * size, keep=8, compress=True)])

    sinks = open_sinks()
    sinks.write(late(1))
    for seq in range(10, 14):  # late(1) rotates out of the current file (and is gzip'd)
        sinks.write(frame_record("cam", seq))
    sinks.write(late(1))  # the same process remembers it
    sinks.close()
    assert all(f.endswith(".gz") for f in R.rotated_files(str(path)))
    sinks = open_sinks()  # a restart: the key is found in the rotated, compressed history
    assert "dev/cam/1" in sinks.sinks[0].late_keys
    sinks.write(late(1))
    sinks.write(late(2))
    sinks.close()
    lates = [r["frame_seq"] for r in all_records(path) if r["late"]]
    assert lates == [1, 2]


def test_late_keys_are_bounded_and_a_restart_keeps_the_newest(tmp_path: Path, monkeypatch) -> None:
    """A device whose cloud is often away writes late records for months: the sink remembers
    the newest LATE_KEYS_MAX keys, in the order written, also when it reloads them from a
    rotated history (the newest file is read first, its keys are still the newest)."""
    import edge.sinks

    monkeypatch.setattr(edge.sinks, "LATE_KEYS_MAX", 3)
    path = tmp_path / "det.jsonl"
    sink = JsonlSink(str(path), max_bytes=600, keep=8)
    for seq in range(1, 9):
        sink.write(late(seq), json.dumps({"late": True, "device": "dev", "stream": "cam", "frame_seq": seq,
                                          "pad": "x" * 150}).encode())
    assert list(sink.late_keys) == ["dev/cam/6", "dev/cam/7", "dev/cam/8"]
    sink.close()
    assert len(R.rotated_files(str(path))) >= 2
    again = JsonlSink(str(path), max_bytes=600, keep=8)
    assert list(again.late_keys) == ["dev/cam/6", "dev/cam/7", "dev/cam/8"]
    again.close()


def test_a_rotated_file_left_uncompressed_by_a_crash_is_compressed_at_start(tmp_path: Path) -> None:
    path = tmp_path / "det.jsonl"
    path.write_bytes(b'{"late": true, "device": "d", "stream": "s", "frame_seq": 5}\n')
    left = R.rotate(str(path), now=0)
    assert left.endswith(".19700101T000000.000000Z")
    Path(left + ".gz.tmp").write_bytes(b"half")  # a gzip cut short
    sink = JsonlSink(str(path), max_bytes=1 << 20, keep=4, compress=True)
    assert "d/s/5" in sink.late_keys
    wait_until(lambda: os.path.exists(left + ".gz") and not os.path.exists(left), 20, "the leftover gzip'd")
    sink.close()
    assert gzip.open(left + ".gz").read().startswith(b'{"late": true')


def test_the_gzip_reaches_the_disk_before_its_name_and_its_name_before_the_plain_file_goes(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    """compress renamed its .gz into place and deleted the rotated file with no fsync: after a power
    cut within ext4's writeback delay the .gz could be empty under its name and the plain file gone,
    every record of the rotated file lost. The order at the os-call boundary is what makes it
    durable: the gzip's whole bytes synced, then the rename, the folder synced, then the delete."""

    path = tmp_path / "det.jsonl"
    path.write_bytes(b'{"frame_seq": 1}\n' * 1000)
    left = R.rotate(str(path), now=0)
    from tests.syncs import record_syncs

    done = record_syncs(monkeypatch, folder="dir")
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p: (done.append(("unlink", os.path.basename(p))), real_unlink(p)))
    dst = R.compress(left)
    size = os.path.getsize(dst)
    assert done == [("fsync", size), ("replace", os.path.basename(dst)), ("fsync", "dir"),
                    ("unlink", os.path.basename(left))]
    assert gzip.open(dst).read() == b'{"frame_seq": 1}\n' * 1000


def test_names_never_collide_and_sort_newest_first(tmp_path: Path) -> None:
    path = str(tmp_path / "d.jsonl")
    names = []
    for _ in range(3):
        Path(path).write_text("x\n")
        names.append(R.rotate(path, now=1000.25))
    assert [os.path.basename(n) for n in names] == ["d.jsonl.19700101T001640.250000Z",
                                                    "d.jsonl.19700101T001640.250001Z",
                                                    "d.jsonl.19700101T001640.250002Z"]
    Path(path).write_text("x\n")
    newest = R.rotate(path, now=time.time())
    assert R.rotated_files(path)[0] == newest and R.rotated_files(path)[1:] == names[::-1]
    assert R.prune(path, 1) == names[::-1] and R.rotated_files(path) == [newest]


def test_a_pruned_name_is_never_reused_for_a_newer_file(tmp_path: Path) -> None:
    """Rotating faster than once a second while pruning: every kept file is newer than every
    deleted one (a reused name would sort as the oldest and be deleted first)."""
    path = str(tmp_path / "d.jsonl")
    written = []
    for i in range(30):
        Path(path).write_text(f"{i}\n")
        written.append(R.rotate(path))
        R.prune(path, 3)
    kept = R.rotated_files(path)
    assert [Path(f).read_text() for f in kept] == ["29\n", "28\n", "27\n"]


def test_history_budget_cuts_at_a_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"aaaa\nbbbb\n")
    old = R.rotate(str(path), now=0)
    Path(old).write_bytes(b"1111\n2222\n3333\n")
    path.write_bytes(b"cccc\n")
    assert [line for _, line in R.history(str(path), 12)] == [b"cccc", b"3333"]  # 5 + 7 bytes: "33\n" is cut
    assert [line for _, line in R.history(str(path), 100)] == [b"cccc", b"1111", b"2222", b"3333"]


def test_the_daemon_rotates_its_sink(tmp_path: Path, tiny_model: Path) -> None:
    import asyncio

    from edge.daemon import EdgeDaemon
    from edge.settings import load_settings
    from tests.edge.helpers import settings_yaml

    out = tmp_path / "d.jsonl"
    s = load_settings(str(settings_yaml(
        tmp_path / "edge.yaml", device_id="nx", streams=[{"id": "s", "kind": "synthetic", "uri": "64x48",
                                                          "max_frames": 30}],
        model={"path": str(tiny_model), "backend": "onnxruntime"}, spool={"path": str(tmp_path / "sp.db")},
        sinks={"jsonl": str(out), "jsonl_max_bytes": 8192, "jsonl_keep": 100}, metrics={"port": -1})), env={})
    assert asyncio.run(EdgeDaemon(s).run()) == 0
    rotated = R.rotated_files(str(out))
    assert rotated and all(f.endswith(".gz") for f in rotated)
    assert sorted(r["frame_seq"] & 0xFFFFFFFF for r in all_records(out)) == list(range(30))


def test_history_budget_cuts_a_gzipd_file_and_skips_a_torn_one(tmp_path: Path, caplog) -> None:
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"cccc\n")
    older = R.rotate(str(path), now=0)
    Path(older).write_bytes(b"1111\n2222\n3333\n")
    R.compress(older)
    path.write_bytes(b"cccc\n")
    newer = R.rotate(str(path), now=1)  # a gzip cut short by a crash, newer than the whole one
    # header only: its last 4 bytes, read as the size, say 4 GB
    Path(newer + ".gz").write_bytes(gzip.compress(b"9999\n" * 1000, mtime=0)[:10])
    os.unlink(newer)
    path.write_bytes(b"dddd\n")
    assert [line for _, line in R.history(str(path), 12)] == [b"dddd", b"3333"]
    assert "cannot read" in caplog.text and newer + ".gz" in caplog.text


def test_names_keep_increasing_when_the_clock_steps_back(tmp_path):
    """An RTC-less board: rotated in 2025, then the clock restarts at 1970. The newest
    files must stay newest by name, so pruning deletes the oldest, not the ones just rotated."""
    path = str(tmp_path / "rec.jsonl")
    made = []
    for i, now in enumerate([1_750_000_000.5, 1_750_000_100.25, 60.0, 60.0, 61.0]):
        Path(path).write_text(f"{i}\n")
        made.append(R.rotate(path, now=now))
    assert made[2].endswith(".20250615T150820.250001Z")  # one microsecond after the newest
    assert made[3].endswith(".20250615T150820.250002Z")
    assert R.rotated_files(path) == made[::-1]
    assert R.prune(path, 2) == made[2::-1]
    assert [Path(f).read_text() for f in R.rotated_files(path)] == ["4\n", "3\n"]
    Path(path).write_text("5\n")
    later = R.rotate(path, now=1_750_000_200.0)  # the clock is right again: its own time
    assert later.endswith(".20250615T151000.000000Z") and R.rotated_files(path)[0] == later


def test_names_continue_after_compressed_and_suffixed_files(tmp_path):
    path = str(tmp_path / "rec.jsonl")
    old = [path + ".20250615T094140.000000Z.gz", path + ".20250615T094140.000000Z-1"]
    for f in old:
        Path(f).write_bytes(b"")
    assert R.rotated_files(path) == old[::-1]  # the existing order is unchanged
    Path(path).write_text("x\n")
    new = R.rotate(path, now=100.0)
    assert new.endswith(".20250615T094140.000001Z")
    assert R.rotated_files(path)[0] == new
    assert R.next_stamp(100.0, None) == "19700101T000140.000000Z"


def test_links_named_like_rotated_files_are_never_followed(tmp_path: Path) -> None:
    """In a folder another user could write, a link named like a rotated file had the
    compressor copy its target (a key the daemon may read) into a .gz that user could read,
    and a link at the temporary name had it write over its target (found by a probe). Both
    are refused; the targets are untouched, and nothing of them is written."""
    secret = tmp_path / "client.key"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    read_link = tmp_path / "out.jsonl.20200101T000000.000000Z"
    read_link.symlink_to(secret)
    plain = tmp_path / "out.jsonl.20200102T000000.000000Z"
    plain.write_bytes(b'{"a": 1}\n')
    (tmp_path / (plain.name + ".gz.tmp")).symlink_to(victim)
    try:
        R.compress(str(read_link))
    except OSError:
        pass
    else:
        raise AssertionError("a link was compressed")
    assert R.compress(str(plain)) == str(plain) + ".gz"  # the link at its temporary name replaced, not followed
    assert gzip.open(str(plain) + ".gz").read() == b'{"a": 1}\n'
    assert victim.read_bytes() == b"keep me" and secret.read_bytes().startswith(b"-----BEGIN")
    assert not (tmp_path / (read_link.name + ".gz")).exists()


@pytest.mark.parametrize("stamp", ["20261399T000000.000000Z", "99991231T235959.999999Z"])
def test_a_file_named_like_a_rotated_one_with_no_real_time_is_left_alone(tmp_path: Path, stamp: str) -> None:
    """``<path>.20261399T000000.000000Z`` (month 13, day 99: a hand-made name) matched the pattern
    of rotated names, and reading its time raised ValueError at every rotation: the sink lost
    each record past ``jsonl_max_bytes`` (not even held, as a full disk's are). One at the last
    microsecond of year 9999 made the next names' year 10000, which are never read or pruned."""
    path = tmp_path / "det.jsonl"
    stray = tmp_path / f"det.jsonl.{stamp}"
    stray.write_text("kept by hand\n")
    size = record_size(tmp_path)
    sinks = Sinks([JsonlSink(str(path), max_bytes=3 * size, keep=2)])
    assert all(sinks.write(frame_record("cam", seq)) for seq in range(10))
    sinks.close()
    assert not sinks.failing
    rotated = R.rotated_files(str(path))
    assert str(stray) not in rotated and len(rotated) == 2
    assert stray.read_text() == "kept by hand\n"  # not ours: never pruned
    kept = [r["frame_seq"] for r in all_records(path)]
    assert kept == list(range(kept[0], 10)) and kept[0] > 0


def test_files_rotated_by_a_daemon_before_microsecond_names_are_still_pruned_and_read(tmp_path: Path) -> None:
    """Daemons before 2026-12-01 named rotated files to the second (``<path>.20261130T120000Z``,
    gzip'd ``.gz``, ``-N`` on a collision). After an upgrade the sink did not know them: never
    pruned (a device kept up to ``jsonl_keep`` old files beside as many new ones, for good) and not
    read for late keys, so a replay's late record already written before the upgrade was written again."""
    path = tmp_path / "det.jsonl"
    old = [tmp_path / "det.jsonl.20261130T120000Z.gz", tmp_path / "det.jsonl.20261130T120000Z-1.gz",
           tmp_path / "det.jsonl.20261130T120005Z"]
    with gzip.open(old[0], "wb") as f:
        f.write(late(1).to_json() + b"\n")
    with gzip.open(old[1], "wb") as f:
        f.write(late(2).to_json() + b"\n")
    old[2].write_bytes(late(3).to_json() + b"\n")
    size = record_size(tmp_path)
    sinks = Sinks([JsonlSink(str(path), max_bytes=3 * size, keep=3)])
    assert {"dev/cam/1", "dev/cam/2", "dev/cam/3"} <= set(sinks.sinks[0].late_keys)
    sinks.write(late(3))  # written before the upgrade: a repeat, dropped
    for seq in range(10, 16):  # two rotations: the two oldest (old) files go
        assert sinks.write(frame_record("cam", seq))
    sinks.close()
    rotated = R.rotated_files(str(path))
    assert len(rotated) == 3 and rotated[-1] == str(old[2])
    assert not old[0].exists() and not old[1].exists()
    lates = [r["frame_seq"] for r in all_records(path) if r["late"]]
    assert lates == [3]



#: A compressor in a process of its own: a file rotated while the process is at its open-file
#: limit (the gzip cannot open it), then, the limit raised again, the next file rotated; the
#: compressor is closed after and each file says whether it was gzip'd.
_GZIP_AT_THE_FD_LIMIT = """
import logging, os, resource, sys, time
from edge import rotation as R
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
path = sys.argv[1]
compressor = R.Compressor(path, keep=8)
rotated = []
for n in (1, 2):
    with open(path, "w") as f:
        f.write('{"n": %d}\\n' % n)
    rotated.append(R.rotate(path, now=n))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard))  # less the listing's own
compressor.submit(rotated[0])
while not compressor.jobs.empty():
    time.sleep(0.01)
time.sleep(0.5)  # the gzip of the first file has failed
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
compressor.submit(rotated[1])
assert compressor.close(20)
for f in rotated:
    print(os.path.exists(f + ".gz") and not os.path.exists(f))
"""


def test_a_rotated_file_the_gzip_could_not_open_is_gzipd_once_a_later_one_is(tmp_path: Path) -> None:
    """A rotated file whose gzip failed for a passing reason (the daemon at its open-file
    limit, a disk full for a while) stayed plain until the next start, 64 MiB instead of about
    5 MiB, for as long as the daemon ran (found by a probe: 8 plain files after 36 s at the
    limit). Once a later file is gzip'd, those left plain are gzip'd too."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _GZIP_AT_THE_FD_LIMIT, str(tmp_path / "det.jsonl")], cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Too many open files" in done.stderr  # the first gzip did fail, and said so
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr
