"""Salvage of a damaged spool (real SQLite files, real damage: a flipped page-type byte
as a bad flash block leaves it): the daemon's spool opens again and keeps what the file
still holds, ids, ages and attempts included; a file that is not a spool is not touched."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import subprocess
import sys

import pytest

from edge.spool import Spool, SpoolCorrupt, SpoolError
from edge.spool_salvage import is_spool_file, open_spool
from tests.edge.spooldamage import AGE_INDEX, KEY_INDEX, damage_index, damage_page_holding
from tests.logs import said

CAP = 1 << 30


def _payload(i: int, size: int) -> bytes:
    marker = f"<item-{i:05d}>".encode()
    return marker + bytes([i % 251]) * (size - len(marker))


def _fill(path, n: int, size: int, acked=()):
    """A closed spool of ``n`` items (some ``acked`` away: ids with gaps, as in service);
    returns {key: (id, payload, meta, attempts)} of what it holds."""
    with Spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        for i in range(n):
            assert sp.put(f"dev/cam/{i}", _payload(i, size), {"i": i, "transport": "grpc"})
        items = {it.key: it for it in sp.peek(n)}
        for i in acked:
            sp.ack(items[f"dev/cam/{i}"].id)
        for i in (3, 4):
            sp.nack(items[f"dev/cam/{i}"].id)
        return {it.key: (it.id, it.payload, it.meta, it.attempts) for it in sp.peek(n)}


def _readable_one_by_one(path) -> set:
    """The keys of the items SQLite can read from ``path``, asked id by id (slow, exact)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    keys = set()
    try:
        top = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'items'").fetchone()[0]
        for i in range(1, top + 1):
            try:
                row = db.execute("SELECT key FROM items NOT INDEXED WHERE id = ?", (i,)).fetchone()
            except sqlite3.DatabaseError:
                continue
            if row:
                keys.add(row[0])
    finally:
        db.close()
    return keys


def _held(sp: Spool):
    return {it.key: (it.id, it.payload, it.meta, it.attempts) for it in sp.peek(len(sp) + 1)}


@pytest.mark.parametrize("index", [KEY_INDEX, AGE_INDEX])
def test_a_damaged_index_loses_nothing(tmp_path, caplog, index):
    path = tmp_path / "spool.db"
    before = _fill(path, 120, 2000, acked=range(10, 20))
    damage_index(path, index)
    with pytest.raises(SpoolCorrupt):  # what the daemon used to stop at (exit 2)
        Spool(path, max_bytes=CAP, max_age_s=3600)
    with caplog.at_level(logging.ERROR, logger="edge.spool_salvage"):
        sp = open_spool(path, max_bytes=CAP, max_age_s=3600)
    with sp:
        assert _held(sp) == before  # ids (the replay's order and acks), payloads, meta, attempts
        assert len(sp) == 110 and sp.stats().oldest_age_s < 60
        sp.put("dev/cam/new", b"x", {})  # a sound file again: written and read as any spool
        assert [it.key for it in sp.peek(200)][-1] == "dev/cam/new"
        assert max(it.id for it in sp.peek(200)) > max(i for i, *_ in before.values())  # ids never reused
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("spool.db.damaged-")
             and not p.name.endswith(("-wal", "-shm"))]
    assert len(moved) == 1 and is_spool_file(moved[0])
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert line.startswith(f"spool {path} is not a readable spool (damaged: ")
    assert f"moved it to {moved[0]}" in line and line.endswith(": 110 escalation(s) salvaged")


def test_a_damaged_table_page_loses_only_the_items_on_it(tmp_path, caplog):
    path = tmp_path / "spool.db"
    before = _fill(path, 300, 300)  # about a dozen items per page
    damage_page_holding(path, b"<item-00150>")
    with caplog.at_level(logging.ERROR, logger="edge.spool_salvage"):
        sp = open_spool(path, max_bytes=CAP, max_age_s=3600)
    with sp:
        held = _held(sp)
    lost = set(before) - set(held)
    assert "dev/cam/150" in lost and 1 <= len(lost) <= 30, sorted(lost)
    (moved,) = [p for p in tmp_path.glob("spool.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert set(held) == _readable_one_by_one(moved)  # every item SQLite can still read, no fewer
    assert "dev/cam/0" in held and "dev/cam/299" in held  # read on past the damage
    assert all(before[k] == v for k, v in held.items())  # what was kept is intact
    lost_ids = sorted(before[k][0] for k in lost)
    assert lost_ids == list(range(lost_ids[0], lost_ids[-1] + 1))  # one page: a run of ids
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert f"{len(held)} escalation(s) salvaged, ids {lost_ids[0]}-{lost_ids[-1]} unreadable" in line


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_spool_file_cut_short_is_salvaged_not_refused(tmp_path, caplog, capsys, keep):
    """A file cut short (a truncation, a copy that stopped, a filesystem repair) has a header
    that counts more pages than it has, and SQLite calls it malformed to every query, its
    schema included: it was taken for "not a spool" and the daemon exited 2, salvaging nothing
    (found by a fault probe). Read with its schema writable it shows whose file it is, and the
    items before the cut come back; check-config agrees."""
    from edgewise.cli import main
    from tests.edge.helpers import settings_yaml

    path = tmp_path / "spool.db"
    before = _fill(path, 130, 10_000)
    os.truncate(path, int(os.path.getsize(path) * keep))
    assert is_spool_file(path)
    cfg = settings_yaml(tmp_path / "edge.yaml", device_id="d1", streams=[{"id": "s", "kind": "synthetic"}],
                        policy_file=str(tmp_path / "p.yaml"), spool={"path": str(path)}, metrics={"port": -1},
                        cloud={"endpoints": ["10.1.2.3:50051"]})
    (tmp_path / "p.yaml").write_text("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\n"
                                     "spec: {}\n")
    main(["edge", "check-config", "--config", str(cfg), "--set", "model.path=/nonexistent.onnx"])
    err = capsys.readouterr().err  # it stops at the missing model, checked after the spool
    assert "spool.path" not in err and "/nonexistent.onnx" in err, err
    with caplog.at_level(logging.ERROR, logger="edge.spool_salvage"):
        sp = open_spool(path, max_bytes=CAP, max_age_s=3600)
    with sp:
        held = _held(sp)
    assert 0 < len(held) < len(before) and all(before[k] == v for k, v in held.items())
    assert "dev/cam/0" in held
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert "is not a readable spool (database disk image is malformed); moved it to" in line
    assert f"{len(held)} escalation(s) salvaged" in line


def test_salvage_keeps_to_the_byte_cap_newest_first(tmp_path):
    path = tmp_path / "spool.db"
    before = _fill(path, 50, 1000)
    damage_index(path)
    with open_spool(path, max_bytes=20_000, max_age_s=3600) as sp:
        keys = [it.key for it in sp.peek(100)]
        assert sp.stats().bytes <= 20_000
    assert keys == [f"dev/cam/{i}" for i in range(50 - len(keys), 50)] and 10 <= len(keys) < 50
    assert len(before) == 50


def test_a_file_that_is_not_a_spool_is_refused_and_left_where_it_is(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(SpoolCorrupt, match="is not a readable spool"):
        open_spool(garbage, max_bytes=CAP, max_age_s=3600)
    other = tmp_path / "other.db"
    db = sqlite3.connect(str(other))
    db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")  # not the spool's items
    db.commit()
    db.close()
    with pytest.raises(SpoolError, match="another program's database"):
        open_spool(other, max_bytes=CAP, max_age_s=3600)
    assert not is_spool_file(other) and not is_spool_file(garbage)
    assert {p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))} == {"garbage.db", "other.db"}


def test_a_damaged_spool_that_cannot_be_moved_is_refused_with_why(tmp_path, monkeypatch):
    import os

    path = tmp_path / "spool.db"
    _fill(path, 5, 100)
    damage_index(path)

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(SpoolCorrupt, match=r"could not be moved aside to salvage it \(Permission denied\)"):
        open_spool(path, max_bytes=CAP, max_age_s=3600)
    assert path.exists()


def test_two_damaged_pages_lose_only_their_own_items(tmp_path):
    """Readable items between two damaged pages are not jumped over."""
    path = tmp_path / "spool.db"
    _fill(path, 400, 300)
    damage_page_holding(path, b"<item-00100>")
    damage_page_holding(path, b"<item-00140>")
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        held = set(_held(sp))
    (moved,) = [p for p in tmp_path.glob("spool.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert held == _readable_one_by_one(moved) and "dev/cam/120" in held and "dev/cam/100" not in held


def test_a_spool_of_the_first_release_is_salvaged(tmp_path):
    """Its items table has no mono/boot columns (added at open, after quick_check)."""
    path = tmp_path / "spool.db"
    db = sqlite3.connect(str(path))
    db.executescript("""
        CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE,
            payload BLOB NOT NULL, meta TEXT NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0);
        CREATE INDEX items_created ON items(created);
        CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);""")
    db.executemany("INSERT INTO items(key, payload, meta, created, size) VALUES (?, ?, '{}', ?, 10)",
                   [(f"dev/cam/{i}", b"p" * 10, 1.0e9 + i) for i in range(30)])
    db.commit()
    db.close()
    damage_index(path)
    with open_spool(path, max_bytes=CAP, max_age_s=10 * 365 * 86400) as sp:
        assert [it.key for it in sp.peek(100)] == [f"dev/cam/{i}" for i in range(30)]


def test_damage_found_in_use_is_salvaged_at_the_next_start_even_if_quick_check_passes(tmp_path, caplog):
    """An index that lost rows passes quick_check; the spool that met the damage marks the file."""
    from edge.spool_salvage import damage_marker

    path = tmp_path / "spool.db"
    before = _fill(path, 20, 100)
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    sp._error(sqlite3.DatabaseError("database disk image is malformed"), "ack failed")  # what a failed ack meets
    sp.close()
    assert damage_marker(path).read_text().startswith("database disk image is malformed")
    with caplog.at_level(logging.ERROR, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
            assert _held(again) == before
    assert not damage_marker(path).exists()
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert line.startswith(f"spool {path} was found damaged while the daemon ran (database disk image is malformed)")
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as third:  # sound now: opened as it is
        assert len(third) == 20
    assert len([p for p in tmp_path.glob("spool.db.damaged-*Z")]) == 1


def test_a_salvage_that_fills_the_disk_stops_at_the_reserve_and_says_so(small_fs, caplog):
    fs = small_fs(3 << 20)
    path = fs.path / "spool.db"
    _fill(path, 200, 9000)  # 1.8 MB of a 3 MiB filesystem: the copy cannot fit beside it
    damage_index(path)
    with caplog.at_level(logging.ERROR, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
            kept = len(sp)
            assert sp.ack_many([it.id for it in sp.peek(5)]) == 5  # the reserve left room to acknowledge
            assert len(sp) == kept - 5
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert 0 < kept < 200 and f": {kept} escalation(s) salvaged; stopped early, the rest is still in " in line
    assert "KiB stay free" in line


def test_a_refused_move_puts_the_wal_back(tmp_path, monkeypatch):
    import os

    from edge.spool_salvage import move_aside

    path = tmp_path / "spool.db"
    path.write_bytes(b"main")
    (tmp_path / "spool.db-wal").write_bytes(b"wal")
    real = os.replace

    def refuse_main(src, dst):
        if str(src) == str(path):
            raise PermissionError(13, "Permission denied")
        real(src, dst)

    monkeypatch.setattr(os, "replace", refuse_main)
    with pytest.raises(PermissionError):
        move_aside(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool.db", "spool.db-wal"]


# --- damage found while the spool is in use: salvaged without a restart --------------------


def _stats_of(sp: Spool):
    st = sp.stats()
    return st.depth, st.bytes


def test_an_item_torn_by_a_power_cut_is_damage_the_salvage_drops_not_a_crash_of_every_peek(tmp_path):
    """An item's last overflow page half written (a power cut, a card that lied about its
    write): the b-tree is sound, ``quick_check`` passes and the spool opens as it is, but the row
    reads back as zeros. ``peek`` returned it to ``json.loads``, whose error failed every replay
    round, for as long as the item stayed at the head of the spool; it is damage now, which the
    salvage moves aside, keeping every other item as it was."""
    from edge.spool_salvage import salvage_in_use
    from tests.edge.spooldamage import tear_page_holding

    path = tmp_path / "spool.db"
    before = _fill(path, 12, 10_000)  # each item larger than a page: its meta on an overflow page
    tear_page_holding(path, b'{"i":7,"transport":"grpc"}')
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert sp.generation == 0 and len(sp) == 12  # quick_check saw nothing: opened as it is
        with pytest.raises(SpoolCorrupt, match=r"is damaged \(item 8 reads as garbage, a page of it torn"):
            sp.peek(12)
        result = salvage_in_use(sp)
        held = _held(sp)
    assert set(before) - set(held) == {"dev/cam/7"} and result.salvaged == 11
    assert all(before[k] == v for k, v in held.items())


def test_a_spool_damaged_in_use_is_salvaged_in_place_and_goes_on(tmp_path):
    """The chaos probe's damaged key index, met by an ack of an open spool: salvage_in_use
    moves the file aside (the instance lock stays where it is, still held), gives the same
    spool object a new file at its path with every item, id, age and attempt, and byte and
    item counts that match the file; the acknowledgement held across it deletes the right
    items, and new items are numbered above every old id."""
    from edge.instancelock import InstanceLock
    from edge.spool_salvage import damage_marker, salvage_in_use
    from edgewise.errors import ConfigError
    from tests.edge.spooldamage import nudge

    path = tmp_path / "spool.db"
    before = _fill(path, 40, 500, acked=(38, 39))  # the file's highest ids acknowledged away
    lock = InstanceLock(str(path))
    lock.acquire()
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    counts = _stats_of(sp)
    in_flight = [it.id for it in sp.peek(5)]  # a replay round waiting for its acknowledgement
    damage_index(path, KEY_INDEX)
    nudge(path)
    with pytest.raises(SpoolCorrupt):
        sp.ack_many(in_flight)
    assert damage_marker(path).exists()

    result = salvage_in_use(sp)

    assert sp.damaged is None and sp.generation == 1 and sp.stats().generation == 1
    assert (result.salvaged, result.damaged_ranges, result.full, result.unreadable) == (38, (), "", "")
    assert result.moved_to is not None and result.moved_to.name.startswith("spool.db.damaged-")
    assert is_spool_file(result.moved_to) and is_spool_file(path)
    assert not damage_marker(path).exists()
    assert _held(sp) == before and _stats_of(sp) == counts == (len(sp), sp.stats().bytes)
    assert sp.ack_many(in_flight) == 5 and len(sp) == 33
    assert sp.put("dev/cam/new", b"x", {})
    new_id = sp.peek(100)[-1].id
    assert new_id > 40, new_id  # not 39 or 40: ids of the old file are never handed out again
    assert (tmp_path / "spool.db.lock").exists()
    with pytest.raises(ConfigError, match="another edgewise daemon"):
        InstanceLock(str(path)).acquire()
    sp.close()
    lock.release()
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:  # sound: opened as it is
        assert len(again) == 34
    assert len(list(tmp_path.glob("spool.db.damaged-*Z"))) == 1


def test_garbage_over_a_table_page_in_use_loses_only_its_items_and_the_counts_follow(tmp_path):
    """A table page overwritten with garbage under an open spool: the replay's peek meets it,
    the salvage keeps every item not on that page, and the spool's depth and bytes are those
    of what it holds now, not of what it held."""
    from edge.spool_salvage import salvage_in_use
    from tests.edge.spooldamage import garble_page_holding, nudge

    path = tmp_path / "spool.db"
    before = _fill(path, 60, 900)
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    garble_page_holding(path, b"<item-00002>")
    nudge(path)
    with pytest.raises(SpoolCorrupt, match="is damaged"):
        sp.peek(8)

    result = salvage_in_use(sp)

    held = _held(sp)
    readable = _readable_one_by_one(result.moved_to)
    assert set(held) == readable and 0 < 60 - len(held) <= 5, sorted(set(before) - set(held))
    assert result.salvaged == len(held) and result.damaged_ranges
    assert all(held[k] == before[k] for k in held)
    st = sp.stats()
    db = sqlite3.connect(str(path))
    try:
        depth, size = db.execute("SELECT COUNT(*), SUM(size) FROM items").fetchone()
    finally:
        db.close()
    assert (st.depth, st.bytes, len(sp)) == (depth, size, depth) == (len(held), size, len(held))
    assert f"ids {result.damaged_ranges[0][0]}-" in result.describe()
    sp.close()


def test_a_spool_deleted_and_then_found_damaged_is_salvaged_from_its_open_file(tmp_path):
    """The file was deleted while open (a cleanup job) and the copy the spool still holds open
    turns out damaged: there is nothing to move aside, so its items are read through the
    spool's own connection into a new file at the path."""
    from edge.spool_salvage import salvage_in_use
    from tests.edge.spooldamage import nudge

    path = tmp_path / "spool.db"
    before = _fill(path, 30, 400)
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    damage_index(path, KEY_INDEX)
    nudge(path)
    for name in ("spool.db", "spool.db-wal", "spool.db-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    with pytest.raises(SpoolCorrupt):
        sp.put("dev/cam/new", b"x", {})

    result = salvage_in_use(sp)

    assert result.moved_to is None and result.salvaged == 30 and path.exists()
    assert _held(sp) == before and not list(tmp_path.glob("spool.db.damaged-*"))
    assert sp.put("dev/cam/new", b"x", {}) and len(sp) == 31
    sp.close()
    with Spool(path, max_bytes=CAP, max_age_s=3600) as again:
        assert len(again) == 31


def test_a_salvage_in_use_that_finds_the_disk_full_puts_the_damaged_file_back(small_fs):
    """No room for a new file beside the damaged one: the salvage fails saying so, and leaves
    everything as it was (the damaged file and its mark at the path, no new file, the spool
    still damaged), so that a later try or the next start salvages it. Once there is room,
    it does."""
    from edge.spool_salvage import damage_marker, salvage_in_use
    from tests.edge.spooldamage import garble_page_holding, nudge

    fs = small_fs(2 << 20)
    path = fs.path / "spool.db"
    _fill(path, 40, 900)
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    garble_page_holding(path, b"<item-00001>")
    nudge(path)
    with pytest.raises(SpoolCorrupt):
        sp.peek(8)
    damaged = path.read_bytes()
    filler = fs.fill()  # every block of the filesystem

    with pytest.raises(SpoolError, match="its filesystem is full") as ei:
        salvage_in_use(sp)

    assert f"spool {path}" in str(ei.value)
    assert sp.damaged is not None and sp.generation == 0
    assert path.read_bytes() == damaged and damage_marker(path).exists()
    assert sorted(p.name for p in fs.path.iterdir() if p.name.startswith("spool.db")) == [
        "spool.db", "spool.db.damaged"]  # the file, its mark; no moved copy, no new file's WAL
    with pytest.raises(SpoolCorrupt):
        sp.peek(8)
    filler.unlink()
    result = salvage_in_use(sp)
    assert sp.damaged is None and 30 <= result.salvaged < 40 and len(sp) == result.salvaged
    sp.close()


def test_salvage_pacing_backs_off_after_failures_and_repeated_damage_then_forgets():
    """The first damage is salvaged at once; a failed salvage waits 30 s, then 60, 120, ...
    up to the cap; damage found again soon after a good salvage waits too; damage after a
    spool stayed sound for the cap is salvaged at once again."""
    from edge.spool_salvage import SalvagePacing

    p = SalvagePacing(first_s=30, max_s=240)
    assert p.due(0.0)
    p.attempted(0.0, ok=False)
    assert not p.due(29.9) and p.due(30.0) and p.wait_s(10.0) == 20.0
    p.attempted(30.0, ok=False)
    assert not p.due(89.9) and p.due(90.0)
    for now in (90.0, 210.0, 450.0, 690.0):  # 120, 240, then the cap
        assert p.due(now)
        p.attempted(now, ok=False)
    assert p.wait_s(690.0) == 240.0
    p.attempted(930.0, ok=True)  # a salvage that worked, after a run of failures
    assert not p.due(1000.0)  # damage again soon after: the same trouble, still backed off
    assert p.due(930.0 + 240.0)  # sound for the cap: new damage is salvaged at once
    fresh = SalvagePacing(first_s=30, max_s=1800)
    fresh.attempted(0.0, ok=True)
    assert fresh.wait_s(5.0) == 25.0  # damaged again 5 s after a salvage: wait
    fresh.attempted(30.0, ok=True)
    assert fresh.wait_s(30.0) == 60.0
    assert fresh.due(30.0 + 1800.0)
    fresh.reset()  # the escalator's pacing of a cut-short copy that made progress
    assert fresh.due(31.0) and fresh.wait_s(31.0) == 0.0


# --- a copy cut short (a kill, a stop, a full disk) goes on where it stopped ---------------


def _kill_mid_salvage(path, mode: str) -> None:
    """Run ``spooldamage.salvage_until_killed`` in a child process and SIGKILL it once it stored
    two batches of the copy (the rest not copied yet), as a power loss would stop it."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-m", "tests.edge.spooldamage", str(path), mode], cwd=str(root),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(60, child.kill)  # a child that never gets there fails the test, not hangs it
    guard.start()
    try:
        assert child.stdout is not None and child.stderr is not None
        lines = []
        for line in child.stdout:
            lines.append(line.strip())
            if line.strip() == "batch 2":
                os.kill(child.pid, signal.SIGKILL)
                break
        child.wait(30)
        err = child.stderr.read()
    finally:
        guard.cancel()
        if child.poll() is None:
            child.kill()
            child.wait(30)
        child.stdout.close()
        child.stderr.close()
    assert lines[-1:] == ["batch 2"] and child.returncode == -signal.SIGKILL, (lines, child.returncode, err)


@pytest.mark.parametrize("mode", ["in-use", "start"])
def test_a_salvage_killed_mid_copy_is_finished_at_the_next_start(tmp_path, caplog, mode):
    """kill -9 (a power loss) in the middle of a salvage's copy, in a real child process: the
    next start finds the salvage marker, goes on with the copy from the moved file and holds
    every item, ids, payloads, meta and attempts as they were; the marker is gone after it. It
    used to find a sound but partial spool and say nothing (34 of 300 items)."""
    path = tmp_path / "spool.db"
    marker = tmp_path / "spool.db.salvaging"
    before = _fill(path, 300, 8000)  # 17 items a batch: 2 batches of 18 stored when killed
    if mode == "start":
        damage_index(path)
    _kill_mid_salvage(path, mode)
    (moved,) = [p for p in tmp_path.glob("spool.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    if marker.exists():  # (the code before this test had none)
        assert marker.read_text().splitlines()[1:] == [moved.name]
    with Spool(path, max_bytes=CAP, max_age_s=3600) as partial:  # sound, and only part of it
        assert len(partial) == 34

    with caplog.at_level(logging.WARNING, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
            assert len(sp) == 300 and _held(sp) == before
    assert not marker.exists() and not (tmp_path / "spool.db.damaged").exists()
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert line.startswith(f"spool {path}: went on with the salvage of the damaged file {moved}, which an earlier "
                           "try had not finished (a stop, a crash or a full disk cut it short): ")
    assert line.endswith(f": {300 - 34} more escalation(s) salvaged")
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:  # nothing left to do
        assert len(again) == 300
    assert len([p for p in tmp_path.glob("spool.db.damaged-*Z")]) == 1


def _damaged_in_use(path, n: int, size: int):
    """A spool of ``n`` items whose key index is damaged under it, met by a put; with what it held."""
    from tests.edge.spooldamage import nudge

    before = _fill(path, n, size)
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    damage_index(path, KEY_INDEX)
    nudge(path)
    with pytest.raises(SpoolCorrupt):
        sp.put("dev/cam/new", b"x", {})
    return sp, before


def test_a_stopped_copy_goes_on_from_where_it_stopped_and_brings_back_nothing_acknowledged(tmp_path):
    """A stop cuts the copy short after its first batch (``should_stop``); the items it copied
    are replayed and acknowledged; the next start copies the rest, and not those again (the
    copy's progress is kept in the new file, in the transaction of each batch)."""
    from edge.spool_salvage import salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 200, 3000)
    result = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")

    assert result.stopped == "the daemon is stopping" and not result.finished and 0 < result.salvaged < 200
    assert result.describe() == (f"{result.salvaged} escalation(s) salvaged; stopped early (the daemon is stopping), "
                                 f"the rest is still in {result.moved_to} and is copied at the next start")
    assert salvage_marker(path).read_text().splitlines()[1:] == [result.moved_to.name]
    copied = _held(sp)
    assert len(copied) == result.salvaged and all(before[k] == v for k, v in copied.items())
    assert sp.ack_many([v[0] for v in copied.values()]) == len(copied)  # replayed before the daemon stopped
    sp.stop_by = 0.0
    with pytest.raises(SpoolError, match=r"stayed busy past the shutdown grace \(salvaging its damaged file; the "
                                         r"next start copies the rest from "):
        sp.put("dev/cam/late", b"x", {})
    sp.close()

    with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
        held = _held(again)
    assert set(held) == set(before) - set(copied) and all(before[k] == v for k, v in held.items())
    assert not salvage_marker(path).exists()


def test_a_salvage_marker_naming_a_file_that_is_gone_is_said_and_dropped(tmp_path, caplog):
    from edge.spool_salvage import salvage_marker

    path = tmp_path / "spool.db"
    _fill(path, 5, 100)
    salvage_marker(path).write_text("# a comment\nspool.db.damaged-20260101T000000Z\n")
    with caplog.at_level(logging.WARNING, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
            assert len(sp) == 5
    assert not salvage_marker(path).exists()
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert line.startswith(f"spool {path}: its salvage marker {salvage_marker(path)} names "
                           f"{tmp_path / 'spool.db.damaged-20260101T000000Z'}, which is not there (deleted, ")


@pytest.mark.parametrize("shm_moved", [True, False], ids=["after both", "between the wal and the shm"])
def test_a_move_cut_short_after_the_wal_gets_its_wal_back(tmp_path, caplog, shm_moved):
    """A kill between the renames of a move aside (the -wal moved, the file not; the -shm moved
    too or still beside the file): the -wal goes back beside its file, whose committed items
    would otherwise be lost."""
    from edge.spool_salvage import salvage_marker

    path = tmp_path / "spool.db"
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    for i in range(5):
        sp.put(f"dev/cam/{i}", b"x" * 100, {})
    wal = tmp_path / "spool.db-wal"
    assert wal.stat().st_size > 0
    moved = tmp_path / "spool.db.damaged-20260101T000000Z"
    copy = sqlite3.connect(str(path))  # holds the WAL in place while the spool closes, as a kill would
    copy.execute("SELECT COUNT(*) FROM items").fetchone()
    wal.rename(moved.with_name(moved.name + "-wal"))
    if shm_moved:
        (tmp_path / "spool.db-shm").rename(moved.with_name(moved.name + "-shm"))
    salvage_marker(path).write_text(moved.name + "\n")
    with caplog.at_level(logging.WARNING, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
            assert len(again) == 5
    copy.close()
    sp._db.close()
    assert "a salvage stopped while it moved the damaged file" in caplog.records[0].getMessage()
    assert not salvage_marker(path).exists()
    assert not list(tmp_path.glob("spool.db.damaged-*"))


@pytest.mark.parametrize("damage,problem", [
    (b"\xff\xfe\x00garbage", "not UTF-8 text"),
    (b"# edgewise\nspool.db.damaged-2026", "1 line(s) that name no moved spool file"),  # torn mid-line
    (b"# edgewise\n../../etc/passwd\n", "1 line(s) that name no moved spool file"),
])
def test_a_damaged_salvage_marker_is_said_with_the_moved_files_and_how_to_go_on(tmp_path, caplog, damage, problem):
    """The marker itself hit by a bad block: the start says so (ERROR) with the moved files there
    and how to name the one to go on with; named so, the next start goes on with it."""
    from edge.spool_salvage import salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 100, 3000)
    result = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    sp.close()
    assert 0 < result.salvaged < 100
    marker = salvage_marker(path)
    marker.write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
            assert len(again) == result.salvaged
    (line,) = said(caplog.records, "edge.spool_salvage")
    assert line.startswith(f"spool {path}: its salvage marker {marker} is damaged ({problem}), so a copy of a "
                           f"damaged spool file into the spool may not have finished; the moved files there are "
                           f"{result.moved_to.name}. To go on with one, stop the daemon, add the file's name as a "
                           f"line to {marker} and start it"), line
    assert not marker.exists()

    marker.write_text(result.moved_to.name + "\n")  # what the line says to do
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
        assert _held(again) == before
    assert not marker.exists()


def test_a_copy_stopped_by_a_full_disk_goes_on_as_room_comes_back_and_delivers_each_item_once(small_fs, caplog):
    """The start's copy stops at the filesystem's reserve; as replays are acknowledged, room
    comes back and ``continue_salvages`` copies more, each time from where it stopped: every
    item of the damaged file is delivered once, none twice, and the marker goes at the end."""
    from edge.spool_salvage import continue_salvages, salvage_marker

    fs = small_fs(3 << 20)
    path = fs.path / "spool.db"
    before = _fill(path, 200, 9000)
    damage_index(path)
    delivered = []
    rounds = 0
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert salvage_marker(path).exists() and 0 < len(sp) < 200
        while True:
            items = sp.peek(1000)
            delivered += [it.key for it in items]
            assert sp.ack_many([it.id for it in items]) == len(items)
            if not salvage_marker(path).exists():
                break
            rounds += 1
            assert rounds < 20
            results = continue_salvages(sp)
            assert len(results) == 1 and results[0].salvaged > 0 and results[0].resumed
    assert sorted(delivered) == sorted(before) and len(delivered) == 200 and rounds >= 1


def test_a_damaged_spool_whose_filesystem_went_read_only_is_said_so(small_fs, monkeypatch, caplog):
    """The kernel remounts a failing card read-only (after I/O errors) just as the damage is
    salvaged: the error names the read-only filesystem and what to do, not a folder's
    permissions; nothing is left behind (no marker naming a move that did not happen), and once
    it is writable again the salvage works."""
    import os
    import subprocess

    import edge.spool_salvage as salvaging
    from edge.spool_salvage import damage_marker, salvage_in_use

    fs = small_fs(4 << 20)
    path = fs.path / "spool.db"
    sp, before = _damaged_in_use(path, 20, 500)

    def remount(mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(fs.path)], check=True, capture_output=True)

    def read_only_first(real):
        def call(*args, **kwargs):
            if not os.statvfs(fs.path).f_flag & os.ST_RDONLY:
                remount("ro")  # the spool's file is closed by now, as replace_damaged_file does
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(salvaging, "move_aside", read_only_first(salvaging.move_aside))
    if hasattr(salvaging, "aside_name"):  # where the target is named, before anything is written
        monkeypatch.setattr(salvaging, "aside_name", read_only_first(salvaging.aside_name))
    try:
        with pytest.raises(SpoolError) as ei:
            salvage_in_use(sp)
    finally:
        remount("rw")
    text = str(ei.value)
    assert text.startswith(f"spool {path} is damaged and cannot be moved aside to salvage it (Read-only file "
                           "system): its filesystem is mounted read-only"), text
    assert "remount it read-write, or set spool.path to a writable filesystem" in text
    assert "make its folder writable" not in text
    assert sorted(p.name for p in fs.path.iterdir()) == ["spool.db", "spool.db.damaged"] and damage_marker(path).exists()
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="edge.spool_salvage"):
        result = salvage_in_use(sp)
    assert result.finished and _held(sp) == before and not said(caplog.records, "edge.spool_salvage")
    sp.close()


def test_a_new_file_the_full_disk_refuses_puts_the_damaged_file_back_and_unlists_it(small_fs, monkeypatch):
    """The disk fills (another writer) between the move aside and the new file: the new file
    cannot be made, the damaged file goes back to the path with its mark, and the salvage
    marker no longer names a move that was undone; with room again, the salvage works."""
    import edge.spool_salvage as salvaging
    from edge.spool_salvage import damage_marker, salvage_in_use, salvage_marker

    fs = small_fs(2 << 20)
    path = fs.path / "spool.db"
    sp, before = _damaged_in_use(path, 30, 900)
    damaged = path.read_bytes()
    real = salvaging.move_aside
    fillers = []

    def fill_then_move(*args, **kwargs):
        assert salvage_marker(path).exists()  # the name is written before anything moves
        fillers.append(fs.fill(leave=0))
        return real(*args, **kwargs)

    monkeypatch.setattr(salvaging, "move_aside", fill_then_move)
    with pytest.raises(SpoolError, match="its filesystem is full"):
        salvage_in_use(sp)
    assert path.read_bytes() == damaged and damage_marker(path).exists() and not salvage_marker(path).exists()
    assert sp.damaged is not None and not list(fs.path.glob("spool.db.damaged-*"))
    monkeypatch.undo()
    fillers[0].unlink()
    result = salvage_in_use(sp)
    assert result.finished and _held(sp) == before and not salvage_marker(path).exists()
    sp.close()


def test_items_spooled_while_a_start_copy_waits_for_room_take_no_id_of_the_damaged_file(small_fs):
    """A full disk stops the start's copy at id 30 of 200; frames spooled meanwhile are numbered
    above the damaged file's highest id, not 31.., so the copy that goes on later as room comes
    back loses none of the damaged file's items to a taken id (review of e4a778e: 5 lost)."""
    from edge.spool_salvage import continue_salvages, salvage_marker

    fs = small_fs(3 << 20)
    path = fs.path / "spool.db"
    before = _fill(path, 200, 9000)
    damage_index(path)
    delivered = []
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert salvage_marker(path).exists() and 0 < len(sp) < 200
        items = sp.peek(1000)
        delivered += [it.key for it in items]
        sp.ack_many([it.id for it in items])
        for j in range(5):  # the cloud cannot take these meanwhile
            assert sp.put(f"dev/cam/new/{j}", b"n" * 100, {})
        assert min(it.id for it in sp.peek(1000)) > 200
        rounds = 0
        while salvage_marker(path).exists():
            rounds += 1
            assert rounds < 30
            continue_salvages(sp)
            items = [it for it in sp.peek(1000) if not it.key.startswith("dev/cam/new/")]
            delivered += [it.key for it in items]
            sp.ack_many([it.id for it in items])
        assert len(sp) == 5
    assert sorted(delivered) == sorted(before)


def test_an_id_taken_by_another_key_gets_a_new_id_and_is_not_dropped(tmp_path, caplog):
    """Should an item of the new spool hold an id of one still to be copied (a sequence that
    could not be raised), the copied item gets a new id: said, never dropped."""
    path = tmp_path / "spool.db"
    with Spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert sp.put("dev/cam/new", b"n", {})
        (new,) = sp.peek(1)
        from edge.spool import ITEM_COLUMNS

        same = sp._db.execute(f"SELECT {ITEM_COLUMNS} FROM items").fetchone()  # as a copy reads it
        row = (same[0], "dev/cam/old") + tuple(same[2:])
        with caplog.at_level(logging.WARNING, logger="edge.spool"):
            assert sp.adopt([row, same], "spool.db.damaged-20260101T000000Z") == (1, 0)
        held = {it.key: it.id for it in sp.peek(10)}
    assert held["dev/cam/new"] == new.id and held["dev/cam/old"] > new.id
    assert "were given new ids; they are replayed after it, none is lost" in caplog.text


def test_a_new_spool_damaged_before_its_copy_finished_brings_back_nothing_acknowledged(tmp_path):
    """A stop cuts a copy short; its items are acknowledged; the new spool (holding how far the
    copy got) is damaged in turn before the next start. That start moves it aside too and takes
    over the progress it recorded: the first file's copy goes on from there (review of e4a778e:
    the 44 acknowledged items came back)."""
    from edge.spool_salvage import salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 200, 3000)
    result = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    copied = _held(sp)
    assert 0 < len(copied) < 200 and sp.ack_many([v[0] for v in copied.values()]) == len(copied)
    for j in range(3):
        assert sp.put(f"dev/cam/new/{j}", b"n" * 100, {})
    sp.close()
    damage_index(path)  # the same failing card damages the new file before the next start
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
        held = _held(again)
    assert not set(held) & set(copied)
    assert set(held) == (set(before) - set(copied)) | {f"dev/cam/new/{j}" for j in range(3)}
    assert not salvage_marker(path).exists() and result.moved_to.exists()


def test_inherited_progress_is_honoured_whatever_the_order_of_the_copies(tmp_path):
    """``continue_salvages`` goes on with the older file first; how far its copy got is in the
    newer moved file (once the spool) only: it is read from there before the older copy goes on."""
    from edge.spool_salvage import continue_salvages, salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 200, 3000)
    first = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    copied = _held(sp)
    assert sp.ack_many([v[0] for v in copied.values()]) == len(copied)
    sp.close()
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    damage_index(path)
    from tests.edge.spooldamage import nudge

    nudge(path)
    with pytest.raises(SpoolCorrupt):
        sp.put("dev/cam/x", b"x", {})
    second = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    assert second.finished or second.stopped  # empty or nearly: nothing of the first file in it
    assert salvage_marker(path).read_text().splitlines()[1:][0] == first.moved_to.name
    continue_salvages(sp)
    held = _held(sp)
    sp.close()
    assert not set(held) & set(copied) and set(held) == set(before) - set(copied)


def test_a_damaged_spool_on_a_full_disk_lets_the_daemon_start_and_try_again(small_fs):
    """No block free for the salvage marker: ``SpoolFull`` (the daemon starts without the spool
    and opens it later), not ``SpoolCorrupt`` (exit 2, and systemd does not restart it); with
    room again the salvage runs and keeps everything."""
    from edge.spool import SpoolFull

    fs = small_fs(2 << 20)
    path = fs.path / "spool.db"
    before = _fill(path, 50, 3000)
    damage_index(path)
    # a process killed with the spool open leaves its -wal and -shm: the next open then needs no
    # new block to find the damage, only the marker does
    subprocess.run([sys.executable, "-c", "import os, sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
                    "db.execute('SELECT COUNT(*) FROM counters').fetchall(); os._exit(0)", str(path)], check=True)
    filler = fs.fill(leave=0)
    with pytest.raises(SpoolFull, match=r"could not be moved aside to salvage it \(No space left on device\): "
                                        r"its filesystem is full; free space there"):
        open_spool(path, max_bytes=CAP, max_age_s=3600)
    assert not list(fs.path.glob("spool.db.damaged-*"))
    filler.unlink()
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert _held(sp) == before


def test_a_salvage_marker_the_daemon_cannot_read_is_said_and_kept(tmp_path, caplog, monkeypatch):
    """A marker left unreadable (root-owned, an I/O error) is not taken for a damaged one and
    deleted: it is said with what to do, kept as it is, and the copy goes on once it can be read."""
    import errno
    from pathlib import Path

    from edge.spool_salvage import salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 100, 3000)
    result = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    sp.close()
    marker = salvage_marker(path)
    text = marker.read_bytes()
    real = Path.read_bytes

    def refuse(self):
        if self == marker:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with caplog.at_level(logging.ERROR, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
            assert len(again) == result.salvaged
    monkeypatch.undo()
    assert marker.read_bytes() == text
    assert "cannot be read (Permission denied): make it readable and writable by the daemon (owner edgewise" \
        in caplog.text
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
        assert _held(again) == before
    assert not marker.exists()


def test_a_marker_name_that_is_a_folder_is_dropped_and_holds_up_nothing(tmp_path, caplog):
    """A name in the marker that is not a regular file is said and dropped; the copies after it
    go on (review of e4a778e: a folder blocked them at every start)."""
    from edge.spool_salvage import salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 200, 3000)
    result = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    sp.close()
    (tmp_path / "spool.db.damaged-20200101T000000Z").mkdir()
    salvage_marker(path).write_text("spool.db.damaged-20200101T000000Z\n" + result.moved_to.name + "\n")
    with caplog.at_level(logging.WARNING, logger="edge.spool_salvage"):
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as again:
            assert _held(again) == before and not again.copy_pending
    assert "which is not a regular file" in caplog.text and not salvage_marker(path).exists()


def test_a_moved_file_that_cannot_be_opened_now_does_not_hold_up_the_next(tmp_path, monkeypatch):
    """A moved file that cannot be opened now (an I/O error) stays in the marker; the next one is
    gone on with, and the spool stays ``copy_pending`` while any copy is unfinished."""
    import edge.spool_salvage as salvaging
    from edge.spool_salvage import continue_salvages, salvage_in_use, salvage_marker

    path = tmp_path / "spool.db"
    sp, before = _damaged_in_use(path, 200, 3000)
    result = salvage_in_use(sp, should_stop=lambda: "the daemon is stopping")
    blocked = tmp_path / "spool.db.damaged-20200101T000000Z"
    blocked.write_bytes(b"")
    salvage_marker(path).write_text(f"{blocked.name}\n{result.moved_to.name}\n")
    real = salvaging.DamagedTable.__init__

    def io_error(self, source):
        if source == blocked:
            raise sqlite3.OperationalError("disk I/O error")
        real(self, source)

    monkeypatch.setattr(salvaging.DamagedTable, "__init__", io_error)
    results = continue_salvages(sp)
    assert [r.finished for r in results] == [False, True]
    assert _held(sp) == before and sp.copy_pending
    assert salvage_marker(path).read_text().splitlines()[1:] == [blocked.name]
    sp.close()


def test_the_record_of_a_copy_from_a_file_that_is_gone_is_dropped_at_open(tmp_path):
    """A finished copy is recorded (named again by hand, it copies nothing); once its moved file
    is deleted the record goes at the next open."""
    path = tmp_path / "spool.db"
    _fill(path, 20, 100)
    damage_index(path)
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        (moved,) = [p for p in tmp_path.glob("spool.db.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
        assert list(sp.salvage_sources()) == [moved.name]
    for p in tmp_path.glob("spool.db.damaged-*"):
        p.unlink()
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert sp.salvage_sources() == {}


def test_a_garbled_sequence_in_a_damaged_file_does_not_exhaust_the_new_spools_ids(tmp_path):
    """A damaged file's own sequence near 2**63 (a flipped bit quick_check does not see) used to
    be taken over by the new spool, which then refused every put as a full filesystem, across
    restarts. Such a sequence is ignored: the new spool numbers after what it holds."""
    path = tmp_path / "spool.db"
    with Spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        for i in range(5):
            assert sp.put(f"dev/cam/{i}", b"x" * 100, {})
    db = sqlite3.connect(str(path))
    db.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'items'", ((1 << 63) - 1,))
    db.commit()
    db.close()
    (tmp_path / "spool.db.damaged").write_text("found damaged while the daemon ran\n")
    for _ in range(2):  # and after a restart
        with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
            assert sp.put(f"dev/cam/new-{_}", b"y", {})
    with Spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert len(sp) == 7 and max(it.id for it in sp.peek(100)) < 1 << 53


def test_a_spool_file_deleted_while_open_keeps_numbering_above_every_id_handed_out(tmp_path):
    """recover_if_deleted rebuilt the file numbering from its highest item: ids already handed
    out (acknowledged since, or still to come from a copy) were given again, so a late ack of
    one could remove a new item. The new file keeps the old sequence."""
    path = tmp_path / "spool.db"
    with Spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        for i in range(100):
            assert sp.put(f"dev/cam/{i}", b"x" * 100, {})
        sp.ack_many([it.id for it in sp.peek(1000) if it.id > 50])
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        assert sp.recover_if_deleted() == 50
        assert sp.put("dev/cam/new", b"y", {})
        (new,) = [it for it in sp.peek(1000) if it.key == "dev/cam/new"]
        assert new.id > 100


def test_a_clock_that_repeats_its_boot_time_gives_a_new_damaged_file_a_new_name(tmp_path, monkeypatch):
    """A device without a real-time clock starts at the same second each boot. A finished copy
    is recorded under its moved file's name; once the operator deleted that file, the next
    damaged file was moved to the same name, and its copy taken as done (review of afb4c29:
    all 20 items lost when that copy had been cut short once). The name is now one no record
    holds, and a file's record of its own name is never taken over."""
    import edge.spool_salvage as ss

    monkeypatch.setattr(ss.time, "time", lambda: 1_000_000_000.0)
    path = tmp_path / "spool.db"
    _fill(path, 10, 100)
    (tmp_path / "spool.db.damaged").write_text("x\n")
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        sp.ack_many([it.id for it in sp.peek(100)])
        for i in range(20):
            assert sp.put(f"dev/cam/b-{i}", b"y" * 100, {})
    (first,) = [p for p in tmp_path.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    for p in list(tmp_path.iterdir()):
        if ".damaged-" in p.name:
            p.unlink()  # the operator deletes the moved files, as the docs advise
    (tmp_path / "spool.db.damaged").write_text("x\n")
    with open_spool(path, max_bytes=CAP, max_age_s=3600) as sp:
        assert sorted(it.key for it in sp.peek(100)) == sorted(f"dev/cam/b-{i}" for i in range(20))
    (second,) = [p for p in tmp_path.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert second.name != first.name


@pytest.mark.parametrize("err, full", [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EACCES, False),
                                       (errno.EROFS, False)])
def test_a_damaged_spool_in_use_that_cannot_be_moved_aside_says_whether_its_disk_is_full(tmp_path, err, full):
    """``SpoolFull`` (the salvage is retried with a back-off) for no room, by the error's
    number (``edge.spool.disk_full``), a plain ``SpoolError`` otherwise; the file stays."""
    from edge.spool import SpoolFull
    from tests.edge.spooldamage import nudge

    path = tmp_path / "spool.db"
    _fill(path, 10, 100)
    sp = Spool(path, max_bytes=CAP, max_age_s=3600)
    damage_index(path, KEY_INDEX)
    nudge(path)
    with pytest.raises(SpoolCorrupt):
        sp.ack_many([it.id for it in sp.peek(2)])

    def refused(p):
        raise OSError(err, os.strerror(err), str(p))

    with pytest.raises(SpoolError, match="cannot be moved aside to salvage it") as info:
        sp.replace_damaged_file(refused)
    assert isinstance(info.value, SpoolFull) is full, info.value
    assert ("its filesystem is full" in str(info.value)) is full
    assert path.exists() and sp.damaged is not None


def test_an_item_whose_meta_nests_past_the_json_decoders_depth_is_not_sound():
    """Garbage in a damaged file can be JSON nested past the decoder's depth: its RecursionError
    escaped the soundness check and failed every replay round, where garbage is damage."""
    from edge.spool import sound_item

    assert sound_item((1, "dev/cam/1", b"x", "{}", 0.0, 1, 0))
    assert not sound_item((1, "dev/cam/1", b"x", "[" * 100_000 + "]" * 100_000, 0.0, 1, 0))
