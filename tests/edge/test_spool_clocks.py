"""Spool ages across wall-clock steps and reboots: an RTC-less board starts at 1970 and NTP
steps it by decades; items age by the monotonic clock of the boot that spooled them."""

from __future__ import annotations

import calendar
import sqlite3
import sys
import time

import pytest

import edge.spool
from edge.spool import Spool

DAY = 86400.0
T1970 = 60.0  # a Jetson booted without an RTC battery
T2025 = 1_750_000_000.0  # what NTP sets once the network is back


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _spool(path, wall: Clock, mono: Clock, boot: str) -> Spool:
    return Spool(path, max_bytes=1 << 24, max_age_s=DAY, clock=wall, monotonic=mono, boot_id=boot)


def test_forward_step_from_1970_to_2025_expires_nothing(tmp_path):
    wall, mono = Clock(T1970), Clock(100.0)
    sp = _spool(tmp_path / "s.db", wall, mono, "boot-a")
    for i in range(5):
        sp.put(f"k{i}", b"x" * 10, {"i": i})
    wall.t += 300
    mono.t += 300
    wall.t = T2025  # NTP
    assert sp.expire() == 0
    assert [it.meta["i"] for it in sp.peek(10)] == [0, 1, 2, 3, 4]
    assert sp.stats().oldest_age_s == 300.0
    mono.t += DAY
    assert sp.expire() == 5 and sp.stats().dropped_age_cap == 5
    sp.close()


def test_backward_step_within_a_boot_still_ages(tmp_path):
    wall, mono = Clock(T2025), Clock(100.0)
    sp = _spool(tmp_path / "s.db", wall, mono, "boot-a")
    sp.put("k", b"x", {})
    wall.t = T1970
    mono.t += DAY / 2
    assert sp.stats().oldest_age_s == DAY / 2
    mono.t += DAY / 2 + 1
    assert sp.expire() == 1
    sp.close()


def test_reboot_onto_a_bogus_clock_ages_earlier_items_from_this_boot(tmp_path):
    """Run 1 in 2025; the board reboots at 1970 with the link down for days: the 2025
    items are at least as old as this boot, so they expire once it is past the cap."""
    path = tmp_path / "s.db"
    wall, mono = Clock(T2025), Clock(5000.0)
    sp = _spool(path, wall, mono, "boot-a")
    for i in range(3):
        sp.put(f"a{i}", b"x" * 10, {"i": i})
    sp.close()

    wall, mono = Clock(T1970), Clock(5.0)
    sp = _spool(path, wall, mono, "boot-b")  # this boot started (at the latest) now
    assert sp.expire() == 0 and sp.stats().oldest_age_s == 0.0
    wall.t += DAY / 2
    mono.t += DAY / 2
    for i in range(2):
        sp.put(f"b{i}", b"y" * 10, {"i": 100 + i})
    assert sp.stats().oldest_age_s == DAY / 2
    wall.t += 0.6 * DAY
    mono.t += 0.6 * DAY
    assert sp.expire() == 3  # up 1.1 days: the earlier boot's items are older than the cap
    assert [it.meta["i"] for it in sp.peek(10)] == [100, 101]
    assert abs(sp.stats().oldest_age_s - 0.6 * DAY) < 1e-6
    wall.t = T2025 + 3 * DAY  # NTP at last: this boot's items still age by the monotonic clock
    assert sp.expire() == 0 and len(sp) == 2
    sp.close()


def test_reboot_keeps_items_spooled_on_a_stale_but_plausible_clock_before_ntp(tmp_path):
    """systemd starts an RTC-less board at the time timesyncd saved at its last sync (here a
    week ago: the board was off) or at its build date, a clock after 2020 but days behind.
    Items spooled then, before NTP and with the link down, used to read as a week old after
    a reboot onto a synced clock and all expired at once; the kernel said the clock was not
    synchronized when they were put, so they age by this boot's uptime."""
    path = tmp_path / "s.db"
    stale = calendar.timegm((2026, 11, 28, 0, 0, 0))
    sp = Spool(path, max_bytes=1 << 24, max_age_s=DAY, clock=Clock(stale + 100), monotonic=Clock(100.0),
               boot_id="boot-a", synchronized=lambda: False)
    for i in range(5):
        sp.put(f"k{i}", b"x" * 10, {"i": i})
    sp.close()

    wall, mono = Clock(calendar.timegm((2026, 12, 5, 0, 10, 0))), Clock(30.0)
    sp = Spool(path, max_bytes=1 << 24, max_age_s=DAY, clock=wall, monotonic=mono, boot_id="boot-b",
               synchronized=lambda: True)
    assert sp.expire() == 0 and len(sp) == 5
    assert sp.stats().oldest_age_s == 0.0  # this boot's age (it started, at the latest, now): not a week
    mono.t += DAY / 2
    assert sp.expire() == 0 and sp.stats().oldest_age_s == DAY / 2
    mono.t += DAY / 2 + 1  # still bounded: expired once this boot is older than the cap
    assert sp.expire() == 5
    sp.close()


def test_an_unsynchronized_clock_now_does_not_age_earlier_items_by_wall_time(tmp_path):
    """A stamp of a synchronized clock, read against a clock now stepped by hand (``date -s``
    marks it unsynchronized) or not yet synced: the wall difference means nothing."""
    path = tmp_path / "s.db"
    _spool(path, Clock(T2025), Clock(5000.0), "boot-a").put("k", b"x", {})
    synced = [False]
    wall, mono = Clock(T2025 + 30 * DAY), Clock(5.0)
    sp = Spool(path, max_bytes=1 << 24, max_age_s=DAY, clock=wall, monotonic=mono, boot_id="boot-b",
               synchronized=lambda: synced[0])
    assert sp.expire() == 0 and sp.stats().oldest_age_s == 0.0
    synced[0] = True  # NTP says the clock is right: the item is 30 days old
    assert sp.stats().oldest_age_s == 30 * DAY and sp.expire() == 1
    sp.close()


def test_the_kernels_sync_state_decides_the_stamp_of_a_spool_on_the_real_clocks(tmp_path, monkeypatch):
    """With the real clocks, an item keeps its wall stamp only while the kernel says the clock is
    synchronized (``edge.spool.clock_synchronized``, adjtimex); an unknown state counts as not."""
    for state, kept in ((False, False), (None, False), (True, True)):
        monkeypatch.setattr(edge.spool, "clock_synchronized", lambda state=state: state)
        path = tmp_path / f"{state}.db"
        sp = Spool(path, max_bytes=1 << 20, max_age_s=DAY)
        sp.put("k", b"x", {})
        before = time.time()
        created = sp.peek(1)[0].created
        sp.close()
        assert (created > 0.0) is kept and (not kept or before - 60 < created <= before), (state, created)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="adjtimex is Linux's")
def test_clock_synchronized_reads_the_kernel():
    """On Linux adjtimex answers (a read, no privilege needed): True or False, never None."""
    assert edge.spool.clock_synchronized() in (True, False)


def test_earlier_boot_ages_by_wall_time_when_both_stamps_are_plausible(tmp_path):
    path = tmp_path / "s.db"
    sp = _spool(path, Clock(T2025), Clock(5000.0), "boot-a")
    sp.put("k", b"x", {})
    sp.close()

    wall, mono = Clock(T2025 + DAY / 2), Clock(5.0)
    sp = _spool(path, wall, mono, "boot-b")
    assert sp.expire() == 0 and sp.stats().oldest_age_s == DAY / 2
    wall.t += DAY / 2 + 1
    assert sp.expire() == 1
    sp.close()


_OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    key      TEXT NOT NULL UNIQUE,
    payload  BLOB NOT NULL,
    meta     TEXT NOT NULL,
    created  REAL NOT NULL,
    size     INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS items_created ON items(created);
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


def test_a_spool_of_the_previous_version_opens_and_keeps_working(tmp_path):
    """A database without the mono/boot columns gets them (NULL: items aged by their wall stamp alone)."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(str(path))
    db.executescript(_OLD_SCHEMA)
    db.executemany(
        "INSERT INTO items(key, payload, meta, created, size, attempts) VALUES (?, ?, ?, ?, ?, ?)",
        [("old/plausible", b"p", '{"i":1}', T2025 - 10, 15, 2), ("old/1970", b"q", '{"i":2}', T1970, 10, 0)],
    )
    db.execute("INSERT INTO counters(name, value) VALUES ('dropped_age_cap', 7)")
    db.commit()
    db.close()

    wall, mono = Clock(T2025), Clock(0.0)
    sp = _spool(path, wall, mono, "boot-b")
    st = sp.stats()
    assert st.depth == 2 and st.bytes == 25 and st.dropped_age_cap == 7
    assert st.oldest_age_s == 10.0  # by its plausible wall stamp
    items = sp.peek(10)
    assert [(it.key, it.meta, it.attempts) for it in items] == [("old/plausible", {"i": 1}, 2), ("old/1970", {"i": 2}, 0)]
    assert sp.put("new/1", b"n", {})
    assert sp.nack(items[0].id) == 3
    wall.t += DAY  # the plausible one is past the cap; the 1970 stamp is not trusted
    assert sp.expire() == 1
    assert [it.key for it in sp.peek(10)] == ["old/1970", "new/1"]
    sp.close()

    cols = {r[1] for r in sqlite3.connect(str(path)).execute("PRAGMA table_info(items)")}
    assert {"mono", "boot"} <= cols
    sp = _spool(path, wall, mono, "boot-b")  # migrating twice is a no-op
    # this boot is past the cap: its item expires; the 1970 one may be of this boot too (the package
    # upgrades without a reboot) and has no plausible stamp: kept, the byte cap bounds it
    mono.t += DAY + 1
    assert sp.expire() == 1 and [it.key for it in sp.peek(10)] == ["old/1970"]
    assert sp.ack(items[1].id) is True
    sp.close()


def test_unreadable_boot_id_falls_back_to_one_per_spool(tmp_path, monkeypatch):
    import edge.spool as spool_mod

    monkeypatch.setattr(spool_mod, "read_boot_id", lambda path=spool_mod.BOOT_ID_PATH: None)
    path = tmp_path / "s.db"
    wall, mono = Clock(T1970), Clock(10.0)
    sp = Spool(path, max_bytes=1 << 20, max_age_s=DAY, clock=wall, monotonic=mono)
    sp.put("k", b"x", {})
    sp.close()
    sp = Spool(path, max_bytes=1 << 20, max_age_s=DAY, clock=wall, monotonic=mono)  # another process
    assert sp.stats().oldest_age_s == 0.0  # counted from this spool's opening
    mono.t += DAY + 1
    assert sp.expire() == 1
    sp.close()


def test_read_boot_id(tmp_path):
    from edge.spool import read_boot_id

    f = tmp_path / "boot_id"
    f.write_text("abc-123\n")
    assert read_boot_id(str(f)) == "abc-123"
    assert read_boot_id(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("synchronized", [True, False])
def test_an_upgrade_without_a_reboot_keeps_what_the_first_release_spooled(tmp_path, monkeypatch, synchronized):
    """An in-place upgrade (the package's: the daemon stopped, the new one started, no reboot)
    from a release whose spool kept no boot id: its items were aged as an earlier boot's, at
    least this boot's uptime, so on a device up longer than ``spool.max_age_s`` (24 h by default)
    the new daemon expired the whole backlog at its first look, items spooled a minute before,
    saying they were older than the cap. Such items age by their wall stamp now (a plausible one,
    the clock synchronized now); without one, never early: the byte cap bounds them. Real clocks
    and the kernel's boot id, as the daemon runs (the kernel's sync state set both ways)."""
    uptime = time.monotonic()
    if uptime < 600:
        pytest.skip("the machine has been up for less than 10 minutes")
    monkeypatch.setattr(edge.spool, "clock_synchronized", lambda: synchronized)
    path = tmp_path / "spool.db"
    db = sqlite3.connect(str(path))
    db.executescript(_OLD_SCHEMA)  # before d5be4cd (2026-12-03)
    now = time.time()
    db.executemany("INSERT INTO items(key, payload, meta, created, size) VALUES (?, x'00', '{}', ?, 1)",
                   [("dev/cam/1", now - 60),               # spooled a minute before the upgrade
                    ("dev/cam/2", now - uptime / 2 - 60),  # before the age cap, by its wall stamp
                    ("dev/cam/3", T1970)])                 # no plausible stamp (an RTC-less board)
    db.commit()
    db.close()
    sp = Spool(path, max_bytes=1 << 24, max_age_s=uptime / 2)  # the device is up twice the cap
    kept = ["dev/cam/1", "dev/cam/3"] if synchronized else ["dev/cam/1", "dev/cam/2", "dev/cam/3"]
    assert [it.key for it in sp.peek(10)] == kept
    st = sp.stats()
    assert st.dropped_age_cap == 3 - len(kept)
    assert (60 <= st.oldest_age_s < uptime / 2) if synchronized else st.oldest_age_s == 0.0
    sp.close()
