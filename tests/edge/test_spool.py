"""The durable spool: order, idempotency, caps, expiry, threads, and a real kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from edge.spool import RESERVE_BYTES, Spool, SpoolCorrupt, SpoolError, SpoolFull
from tests.edge.spooldamage import AGE_INDEX, KEY_INDEX, damage_index, nudge

ROOT = Path(__file__).resolve().parents[2]


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_fifo_order_ack_nack_and_stats(tmp_path):
    clock = FakeClock()
    sp = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=60, clock=clock)
    for i in range(5):
        clock.t += 1
        assert sp.put(f"k{i}", bytes([i]) * 10, {"seq": i})
    items = sp.peek(3)
    assert [it.key for it in items] == ["k0", "k1", "k2"]
    assert items[1].payload == b"\x01" * 10 and items[1].meta == {"seq": 1}
    assert items[0].created == 1001.0
    assert sp.nack(items[0].id) == 1 and sp.nack(items[0].id) == 2
    assert sp.peek(1)[0].attempts == 2 and sp.peek(1)[0].key == "k0"  # stays first
    assert sp.ack(items[0].id) and not sp.ack(items[0].id)
    st = sp.stats()
    assert st.depth == 4
    assert st.bytes == sum(10 + len(f'{{"seq":{i}}}') + 2 for i in range(1, 5))
    assert st.oldest_age_s == pytest.approx(clock.t - 1002.0)
    assert (st.dropped_bytes_cap, st.dropped_age_cap) == (0, 0)
    assert [it.key for it in sp.peek(10)] == ["k1", "k2", "k3", "k4"]
    sp.close()


def test_acknowledging_large_payloads_writes_little_wal_whatever_sqlites_build(tmp_path):
    """Debian's SQLite (JetPack's too) is built with secure_delete on: every page a delete
    frees was written to the WAL as zeros, so acknowledging ACK_CHUNK frames of 40 KB wrote
    about as much WAL as they held (346 KB for 8) and, on a full disk, outgrew the 512 KiB
    reserve: the acknowledgements after an outage failed at every round and the spool never
    drained (the fault suite's full-disk run, once the round's acks came in two transactions)."""
    from edge.spool import ACK_CHUNK

    sp = Spool(tmp_path / "s.db", max_bytes=1 << 26, max_age_s=3600)
    for i in range(ACK_CHUNK):
        assert sp.put(f"k{i}", os.urandom(40_000), {"seq": i})
    sp._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert sp.ack_many([it.id for it in sp.peek(ACK_CHUNK)]) == ACK_CHUNK
    wal = os.path.getsize(f"{tmp_path / 's.db'}-wal")
    assert wal < RESERVE_BYTES // 8, wal  # about 2 pages an item, not the payloads
    sp.close()


def test_peek_skips_the_ids_it_is_told_and_reads_past_them(tmp_path):
    """A replay peeks past the entries it delivered and could not acknowledge yet (a full
    disk), wherever they lie: a round that stepped over a stuck entry settles those behind it."""
    sp = Spool(tmp_path / "s.db", max_bytes=1 << 20, max_age_s=3600)
    for i in range(1200):
        sp.put(f"k{i}", b"x", {"seq": i})
    ids = [it.id for it in sp.peek(1200)]
    skip = frozenset(ids[1:4]) | frozenset(ids[5:1105])  # more than SQLite 3.31 takes in one statement
    assert [it.key for it in sp.peek(3, 0, skip)] == ["k0", "k4", "k1105"]
    assert len(sp.peek(1000, 0, frozenset(ids[:100]))) == 1000
    assert sp.present(ids) == set(ids)
    sp.close()


def test_put_is_idempotent_on_key(tmp_path):
    sp = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=60)
    assert sp.put("dev/cam/7", b"a" * 100, {})
    assert sp.put("dev/cam/7", b"b" * 100, {})
    items = sp.peek(10)
    assert len(items) == 1 and items[0].payload == b"a" * 100
    assert sp.stats().depth == 1 and sp.stats().bytes == 100 + 2 + len("dev/cam/7")
    sp.ack(items[0].id)
    assert sp.put("dev/cam/7", b"c", {})  # acked keys may be spooled again (at-least-once)
    sp.close()


def test_byte_cap_evicts_oldest_and_counts(tmp_path, caplog):
    sp = Spool(tmp_path / "s.db", max_bytes=1000, max_age_s=60)
    for i in range(10):  # each item: 200 + 2 ("{}") + 2 (key) = 204 bytes
        assert sp.put(f"k{i}", b"x" * 200, {})
    st = sp.stats()
    assert st.depth == 4 and st.bytes == 4 * 204 and st.bytes <= 1000
    assert [it.key for it in sp.peek(10)] == ["k6", "k7", "k8", "k9"]
    assert st.dropped_bytes_cap == 6 and st.dropped_bytes_cap_bytes == 6 * 204
    assert "byte cap 1000 reached" in caplog.text
    assert not sp.put("huge", b"x" * 2000, {})  # larger than the whole cap: refused
    assert sp.stats().refused_too_large == 1 and sp.stats().depth == 4
    sp.close()


def test_age_expiry_on_expire_peek_and_put(tmp_path):
    clock = FakeClock(0.0)
    sp = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=10, clock=clock)
    for i in range(4):
        clock.t = float(i * 4)  # created at 0, 4, 8, 12
        sp.put(f"k{i}", b"p", {})  # the put at 12 expires k0 (0 < 12 - 10)
    assert sp.stats().dropped_age_cap == 1
    assert sp.expire(now=15.0) == 1  # k1: 4 < 15 - 10
    clock.t = 17.5
    assert [it.key for it in sp.peek(10)] == ["k2", "k3"]  # 8 >= 7.5 stays
    clock.t = 18.5
    assert [it.key for it in sp.peek(10)] == ["k3"]  # peek expires k2
    clock.t = 30.0
    sp.put("k9", b"p", {})
    st = sp.stats()
    assert [it.key for it in sp.peek(10)] == ["k9"]
    assert st.dropped_age_cap == 4 and st.depth == 1 and st.oldest_age_s == 0.0
    sp.close()


def test_reopen_keeps_items_and_counters(tmp_path):
    path = tmp_path / "s.db"
    sp = Spool(path, max_bytes=500, max_age_s=60)
    for i in range(5):
        sp.put(f"k{i}", b"y" * 150, {"i": i})
    sp.close()
    sp2 = Spool(path, max_bytes=500, max_age_s=60)
    st = sp2.stats()
    assert st.depth == 3 and st.dropped_bytes_cap == 2
    assert [it.meta["i"] for it in sp2.peek(10)] == [2, 3, 4]
    sp2.close()


def test_thread_safe_concurrent_puts_and_acks(tmp_path):
    sp = Spool(tmp_path / "s.db", max_bytes=10_000_000, max_age_s=600)

    def writer(w):
        for i in range(100):
            assert sp.put(f"w{w}-{i}", b"z" * 50, {"w": w})

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = sp.peek(1000)
    assert len(items) == 400 and len({it.key for it in items}) == 400
    per_writer = {}
    for it in items:  # each writer's items stay in its own order
        per_writer.setdefault(it.meta["w"], []).append(int(it.key.split("-")[1]))
    assert all(v == sorted(v) for v in per_writer.values())
    for it in items:
        sp.ack(it.id)
    assert sp.stats().depth == 0 and sp.stats().bytes == 0
    sp.close()


CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from edge.spool import RESERVE_BYTES, Spool, SpoolError, SpoolFull
    sp = Spool({path!r}, max_bytes=1 << 30, max_age_s=3600)
    i = 0
    while True:
        sp.put("frame-%d" % i, bytes([i % 256]) * 4096, {{"seq": i}})
        print(i, flush=True)  # printed only after put() returned: committed
        i += 1
    """
)


@pytest.mark.timeout(60)
def test_survives_sigkill_of_the_writer(tmp_path):
    path = tmp_path / "spool.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(path))],
        stdout=subprocess.PIPE, text=True,
    )
    committed = []
    try:
        assert proc.stdout is not None
        while len(committed) < 60:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            committed.append(int(line))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    sp = Spool(path, max_bytes=1 << 30, max_age_s=3600)
    items = sp.peek(100000)
    seqs = [it.meta["seq"] for it in items]
    assert set(committed) <= set(seqs)  # every committed put survived
    assert seqs == list(range(len(seqs)))  # in order, no holes (one more may have committed)
    assert all(it.payload == bytes([it.meta["seq"] % 256]) * 4096 for it in items)
    assert sp.stats().depth == len(items)
    sp.close()


def test_invalid_caps_rejected(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        Spool(tmp_path / "a.db", max_bytes=0, max_age_s=1)
    with pytest.raises(ValueError, match="max_age_s"):
        Spool(tmp_path / "b.db", max_bytes=1, max_age_s=0)


def test_non_json_meta_is_stringified_not_lost(tmp_path):
    sp = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=60)
    assert sp.put("k", b"p", {"path": tmp_path, "n": 1})
    assert sp.peek(1)[0].meta == {"path": str(tmp_path), "n": 1}
    sp.close()


def test_ack_many_in_one_transaction(tmp_path):
    sp = Spool(tmp_path / "s.db", max_bytes=10_000, max_age_s=60)
    for i in range(5):
        sp.put(f"k{i}", b"p" * 10, {})
    ids = [it.id for it in sp.peek(10)]
    assert sp.ack_many(ids[:3] + [9999]) == 3
    assert [it.key for it in sp.peek(10)] == ["k3", "k4"]
    assert sp.stats().depth == 2 and sp.stats().bytes == 2 * (10 + 2 + 2)
    sp.close()


def fill_spool(sp, size=20_000, start=0):
    """Put random items until the spool refuses one; returns the keys stored."""
    keys = []
    while True:
        key = f"k{start + len(keys)}"
        try:
            assert sp.put(key, os.urandom(size), {"i": start + len(keys)})
        except SpoolFull as exc:
            return keys, exc
        keys.append(key)


def test_a_spool_that_fills_its_disk_keeps_a_reserve_so_it_can_drain_and_fill_again(small_fs):
    """The spool alone on a 2 MiB tmpfs: it refuses new items before the disk is full
    (nothing stored, nothing evicted), can still acknowledge everything, and then takes
    as much again, cycle after cycle."""
    fs = small_fs(2 << 20)
    sp = Spool(fs.path / "s.db", max_bytes=1 << 30, max_age_s=3600)
    for cycle in range(3):
        keys, exc = fill_spool(sp, start=1000 * cycle)
        assert len(keys) >= 40, (cycle, len(keys))
        assert str(fs.path / "s.db") in str(exc) and "KiB free" in str(exc)
        assert fs.free() > 0
        items = sp.peek(1000)
        assert [it.key for it in items] == keys and len(sp) == len(keys)
        assert sp.ack_many([it.id for it in items]) == len(keys)
        assert len(sp) == 0 and sp.stats().dropped_bytes_cap == 0
    sp.close()


def test_when_another_process_fills_the_disk_nothing_spooled_is_lost_and_it_recovers(small_fs):
    """SQLITE_FULL from a disk someone else filled: the failed put is rolled back cleanly
    (no 'cannot rollback' error), every item already spooled is still there, acks fail with
    SpoolError instead of half-applying, and once space returns both work again."""
    fs = small_fs(2 << 20)
    sp = Spool(fs.path / "s.db", max_bytes=1 << 30, max_age_s=3600)
    stored = [f"k{i}" for i in range(10)]
    for i, key in enumerate(stored):
        assert sp.put(key, os.urandom(20_000), {"i": i})
    filler = fs.fill(leave=0)
    with pytest.raises(SpoolFull, match="s.db"):
        sp.put("late-comer", os.urandom(20_000), {})
    sp.reserve_bytes = -(1 << 40)  # no reserve check: what SQLite itself says on a full disk
    with pytest.raises(SpoolFull, match="disk is full"):
        for i in range(100):
            sp.put(f"more{i}", os.urandom(20_000), {})
    items = sp.peek(1000)
    kept = [it.key for it in items]
    assert kept[:10] == stored and len(sp) == len(kept)
    try:
        sp.ack_many([it.id for it in items])
        acked = True
    except SpoolError:
        acked = False
        assert [it.key for it in sp.peek(1000)] == kept  # a failed ack deletes nothing
    assert sp.nack(items[0].id) >= 0  # best effort, never raises
    filler.unlink()  # space returns
    sp.reserve_bytes = RESERVE_BYTES
    if not acked:
        assert sp.ack_many([it.id for it in items]) == len(kept)
    assert len(sp) == 0 and sp.put("again", os.urandom(20_000), {}) and len(sp) == 1
    sp.close()
    assert [it.key for it in Spool(fs.path / "s.db", max_bytes=1 << 30, max_age_s=3600).peek(10)] == ["again"]


def _foreign_database(path: Path) -> None:
    import sqlite3

    db = sqlite3.connect(str(path))
    db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")  # a table of the same name
    db.commit()
    db.close()


@pytest.mark.parametrize("make, expected", [
    (lambda p: p.mkdir(), "is a folder; set spool.path to a file in it"),
    (lambda p: p.write_bytes(os.urandom(8192)), "is not a readable spool (file is not a database); move it aside"),
    (lambda p: _foreign_database(p), "is another program's database (no such column: size), not a spool"),
])
def test_a_spool_path_that_is_a_folder_or_not_a_database_is_one_clear_error(tmp_path, make, expected):
    path = tmp_path / "spool.db"
    make(path)
    with pytest.raises(SpoolError) as ei:
        Spool(path, max_bytes=1000, max_age_s=60)
    assert str(path) in str(ei.value) and expected in str(ei.value) and "\n" not in str(ei.value)


def test_a_spool_on_a_full_disk_is_reported_full_at_open_not_as_permissions(small_fs):
    """Opening needs room for SQLite's -wal and -shm files; on a full disk SQLite says only
    "disk I/O error". That is a full disk (free space there), not a file to chmod."""
    fs = small_fs(1 << 20)
    with Spool(fs.path / "spool.db", max_bytes=1 << 30, max_age_s=3600) as sp:
        sp.put("dev/cam/1", b"x" * 1000, {})
    filler = fs.fill()
    with pytest.raises(SpoolFull, match=r"its filesystem is full .* free space there"):
        Spool(fs.path / "spool.db", max_bytes=1 << 30, max_age_s=3600)
    filler.unlink()
    with Spool(fs.path / "spool.db", max_bytes=1 << 30, max_age_s=3600) as sp:
        assert len(sp) == 1


def test_a_spool_deleted_while_open_is_made_again_with_its_items(tmp_path):
    """A cleanup job removes the spool's folder under the running daemon: the items live on
    only in the unlinked file, lost at the next restart. Recovery writes them to a new file
    at the same path, counters included; the spool goes on from there."""
    import shutil

    folder = tmp_path / "state"
    sp = Spool(folder / "spool.db", max_bytes=1 << 20, max_age_s=3600)
    assert sp.recover_if_deleted() is None  # in place: nothing to do
    sp.put("dev/cam/0", b"z", {})
    sp.put("dev/cam/1", b"a" * 100, {"n": 1})
    sp.put("dev/cam/2", b"b" * 100, {"n": 2})
    sp.put("dev/cam/3", b"c" * (2 << 20), {})  # larger than the spool: refused, counted
    sp.ack(sp.peek(1)[0].id)
    ids = [i.id for i in sp.peek(10)]
    shutil.rmtree(folder)
    assert sp.recover_if_deleted() == 2
    assert (folder / "spool.db").exists()
    assert [(i.key, i.meta) for i in sp.peek(10)] == [("dev/cam/1", {"n": 1}), ("dev/cam/2", {"n": 2})]
    assert [i.id for i in sp.peek(10)] == ids  # a replay in flight acks its own item, not another
    assert sp.stats().refused_too_large == 1 and len(sp) == 2
    sp.put("dev/cam/4", b"d", {})
    sp.close()
    with Spool(folder / "spool.db", max_bytes=1 << 20, max_age_s=3600) as again:  # a restart finds them
        assert [i.key for i in again.peek(10)] == ["dev/cam/1", "dev/cam/2", "dev/cam/4"]


def test_a_spool_on_a_read_only_filesystem_says_so(small_fs):
    """Not "check that the file and its folder are writable": the mount is read-only."""
    import subprocess

    fs = small_fs(1 << 20)
    with Spool(fs.path / "spool.db", max_bytes=1 << 20, max_age_s=3600) as sp:
        sp.put("dev/cam/1", b"x", {})
    subprocess.run(["mount", "-o", "remount,ro", str(fs.path)], check=True)
    try:
        with pytest.raises(SpoolError, match=r"its filesystem is mounted read-only; set spool.path to a writable"):
            Spool(fs.path / "spool.db", max_bytes=1 << 20, max_age_s=3600)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(fs.path)], check=True)


def _spool_of(path: Path, n: int) -> None:
    """A closed spool file holding ``n`` items (its WAL folded into the file)."""
    with Spool(path, max_bytes=1 << 30, max_age_s=3600) as sp:
        for i in range(n):
            assert sp.put(f"dev/cam/{i}", os.urandom(3000), {"i": i})


@pytest.mark.parametrize("index", [KEY_INDEX, AGE_INDEX])
def test_a_spool_whose_index_page_is_damaged_is_refused_at_open_with_what_it_held(tmp_path, index):
    """The chaos probe's damage: an index's root page unreadable. Reading the table alone
    finds nothing wrong, so the spool used to open and then fail every put and ack (and
    `edge run` crashed in last_epoch). PRAGMA quick_check at open refuses it with one line
    naming the file, what it held and what to do; moved aside, a new spool opens."""
    path = tmp_path / "spool.db"
    _spool_of(path, 120)
    damage_index(path, index)
    with pytest.raises(SpoolCorrupt) as ei:
        Spool(path, max_bytes=1 << 30, max_age_s=3600)
    text = str(ei.value)
    assert text.startswith(f"spool {path} is not a readable spool (damaged: "), text
    assert "it seemed to hold 120 escalation(s); move it aside" in text and "\n" not in text
    assert isinstance(ei.value, SpoolError)
    path.rename(tmp_path / "spool.db.bad")
    with Spool(path, max_bytes=1 << 30, max_age_s=3600) as sp:
        assert len(sp) == 0 and sp.put("dev/cam/0", b"x", {})


def test_damage_found_after_open_is_spool_corrupt_from_every_call_and_nothing_more_is_written(tmp_path):
    """The key index damaged under an open spool (it passed the check at open): the first
    call that meets the damage raises SpoolCorrupt, naming the file and the fix, and so
    does every call after it, without touching the file again, reads included (raw
    sqlite3.DatabaseError escaped from last_epoch before). nack stays best effort."""
    path = tmp_path / "spool.db"
    _spool_of(path, 40)
    sp = Spool(path, max_bytes=1 << 30, max_age_s=3600)
    items = sp.peek(5)
    damage_index(path, KEY_INDEX)
    nudge(path)
    with pytest.raises(SpoolCorrupt) as ei:
        sp.ack_many([it.id for it in items])
    text = str(ei.value)
    assert text.startswith(f"spool {path} is damaged (database disk image is malformed)"), text
    assert "moved aside (kept for inspection)" in text and "which the daemon does by itself" in text
    assert "\n" not in text
    assert sp.damaged == text
    size = path.stat().st_size, (tmp_path / "spool.db-wal").stat().st_size
    for call in (lambda: sp.put("dev/cam/new", b"x", {}), lambda: sp.peek(5), lambda: sp.stats(),
                 sp.last_epoch, sp.expire, lambda: sp.ack_many([items[0].id])):
        with pytest.raises(SpoolCorrupt, match="which the daemon does by itself"):
            call()
    assert sp.nack(items[0].id) == 0
    assert (path.stat().st_size, (tmp_path / "spool.db-wal").stat().st_size) == size
    assert len(sp) == 40
    sp.close()



def _read_bytes() -> int:
    """Bytes this process has read through system calls so far (page-cache hits included)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _indexes(path: Path) -> set:
    import sqlite3

    db = sqlite3.connect(str(path))
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        db.close()


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_full_spool_puts_and_reports_without_reading_its_payloads(tmp_path):
    """Region payloads (~40 kB) live on overflow pages, before the columns the caps and stats
    ask for: read from the table, every put, peek and stats of an outage read the whole file.
    The age index answers them; what a call reads stays far below the spool's size."""
    payload = os.urandom(40_000)
    sp = Spool(tmp_path / "s.db", max_bytes=24 << 20, max_age_s=3600)
    i = 0
    while sp.stats().dropped_bytes_cap == 0:  # up to the byte cap: each put now evicts
        assert sp.put(f"d/c/{i}", payload, {"i": i})
        i += 1
    before = _read_bytes()
    assert sp.put("d/c/new", payload, {"i": -1})
    stats = sp.stats()
    assert len(sp.peek(16)) == 16
    read = _read_bytes() - before
    assert stats.bytes <= 24 << 20 and stats.depth == len(sp)
    assert read < 2 << 20, f"put + stats + peek read {read} bytes of a {stats.bytes}-byte spool"


def test_a_spool_of_the_previous_version_gets_the_age_index(tmp_path):
    import sqlite3

    path = tmp_path / "s.db"
    with Spool(path, max_bytes=1 << 20, max_age_s=60) as sp:
        sp.put("d/c/1", b"x" * 100, {})
    db = sqlite3.connect(str(path))  # as the previous version left it
    db.execute(f"DROP INDEX {AGE_INDEX}")
    db.execute("CREATE INDEX items_created ON items(created)")
    db.commit()
    db.close()
    with Spool(path, max_bytes=1 << 20, max_age_s=60) as sp:
        assert [it.key for it in sp.peek()] == ["d/c/1"]
    assert AGE_INDEX in _indexes(path) and "items_created" not in _indexes(path)


def test_a_spool_without_room_for_its_index_opens_and_works_without_it(small_fs, caplog):
    import sqlite3

    fs = small_fs(8 << 20)
    path = fs.path / "spool.db"
    with Spool(path, max_bytes=4 << 20, max_age_s=3600) as sp:
        for i in range(20_000):
            sp._db.execute("INSERT INTO items(key, payload, meta, created, size, mono, boot) "
                           "VALUES (?, x'00', '{}', 1.0, 10, 1.0, 'b')", (f"d/c/{i}",))
    db = sqlite3.connect(str(path))  # a previous version's file: no age index
    db.execute(f"DROP INDEX {AGE_INDEX}")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    fs.fill(leave=64 << 10)  # the index needs more than is left
    with caplog.at_level("WARNING", logger="edge.spool"):
        with Spool(path, max_bytes=4 << 20, max_age_s=3600, reserve_bytes=0) as sp:
            assert len(sp) == 20_000 and sp.stats().depth == 20_000
            assert len(sp.peek(3)) == 3
    assert any("no room to index it" in r.getMessage() for r in caplog.records)
    assert AGE_INDEX not in _indexes(path)


def test_evictions_at_the_cap_are_logged_once_per_interval_and_all_counted(tmp_path, caplog):
    from edge.spool import EVICT_LOG_INTERVAL_S

    clock = FakeClock()
    sp = Spool(tmp_path / "s.db", max_bytes=1_000, max_age_s=1e6, clock=clock)
    with caplog.at_level("WARNING", logger="edge.spool"):
        for i in range(30):  # 100 bytes each: from the 10th on, every put evicts one
            assert sp.put(f"k{i:02d}", b"x" * 97, {})
        clock.t += EVICT_LOG_INTERVAL_S
        assert sp.put("k30", b"x" * 97, {})
    lines = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "(20 more puts evicted since the last such line" in lines[1]
    assert sp.stats().dropped_bytes_cap == 22


def test_a_write_waiting_for_a_lock_held_elsewhere_ends_within_a_slice_of_a_stop(tmp_path):
    """Another connection holds the spool's write lock when the daemon stops: an acknowledgement
    waiting for it ends with the stop's error within ``BUSY_SLICE_S`` of ``stop_by``, writes
    after it are tried once, and close does not wait for its checkpoint. Each used to wait
    SQLite's whole busy timeout (30 s): a real SIGTERM'd daemon took 88 s to exit, past systemd's
    TimeoutStopSec=30. Nothing is lost: the item is still spooled for the next start."""
    import sqlite3
    import time

    path = tmp_path / "spool.db"
    sp = Spool(path, max_bytes=1 << 20, max_age_s=3600)
    assert sp.put("dev/cam/1", b"x" * 100, {"seq": 1})
    (item,) = sp.peek(1)
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    errors = []

    def in_thread(fn):
        def run():
            try:
                fn()
            except SpoolError as exc:
                errors.append(str(exc))
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    acking = in_thread(lambda: sp.ack_many([item.id]))
    time.sleep(0.5)
    assert acking.is_alive()  # before a stop, a write waits for the lock as it always did
    sp.stop_by = t0 = time.monotonic()
    acking.join(3.0)
    assert not acking.is_alive() and time.monotonic() - t0 < 1.0
    assert errors == [f"spool {path}: the daemon is stopping and the spool stayed busy past the shutdown grace "
                      "(another process holding its lock?)"]
    t0 = time.monotonic()
    later = in_thread(lambda: (sp.nack(item.id), sp.ack_many([item.id]), sp.close()))
    later.join(3.0)
    assert not later.is_alive() and time.monotonic() - t0 < 1.0 and len(errors) == 2
    other.execute("ROLLBACK")
    other.close()
    with Spool(path, max_bytes=1 << 20, max_age_s=3600) as again:
        assert [it.key for it in again.peek(5)] == ["dev/cam/1"]
