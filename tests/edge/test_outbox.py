"""The MQTT sink's outbox: the session it ties a device's restarts to, its bound, and a lock
another process holds."""

from __future__ import annotations

import threading
import time

import pytest

from edge.outbox import Outbox, OutboxBusy, this_host
from edge.spool import BUSY_SLICE_S
from tests.edge.helpers import hold_write_lock, let_go


def test_the_client_id_is_kept_for_the_device_on_this_host_and_made_anew_elsewhere(tmp_path):
    path = tmp_path / "mqtt-outbox.db"
    made = iter(f"cam-1-{i:08x}" for i in range(10))
    box = Outbox(path, 10)
    first = box.client_id("cam-1-", lambda: next(made), "m1/host-a")
    box.put(b"r1")
    box.hand(1, 7)
    box.received(1)
    box.close()
    box = Outbox(path, 10)  # a restart on the same machine: the same session, the exchange to complete
    assert box.client_id("cam-1-", lambda: next(made), "m1/host-a") == first
    assert box.in_flight() == [(1, 7, True, b"r1")]
    # the file copied to another machine (a cloned image): its own id, the exchange is not its own
    other = box.client_id("cam-1-", lambda: next(made), "m2/host-b")
    assert other != first and box.in_flight() == [] and len(box) == 1
    assert box.client_id("cam-2-", lambda: "cam-2-0000abcd", "m2/host-b") == "cam-2-0000abcd"  # renamed device
    box.close()
    assert this_host()


def test_the_bound_drops_the_oldest_records_not_those_in_flight(tmp_path):
    box = Outbox(tmp_path / "o.db", 3)
    for i in range(3):
        box.put(f"r{i}".encode())
    box.hand(1, 5)  # r0 in flight: the broker's session may hold its packet identifier
    box.put(b"r3")
    assert [d for _, d in box.peek(0, 10)] == [b"r0", b"r2", b"r3"] and box.dropped == 1
    box.close()


def test_a_packet_identifier_handed_again_is_let_go_by_the_record_that_kept_it(tmp_path):
    """Record 1's exchange ended (a refusal, or a resume that found no session for it) while
    another process held the outbox: the sink does not wait for that lock on paho's thread or
    the event loop, so record 1 kept its identifier 5 on disk. Paho then gave 5 to record 2.
    A restart resumed record 1 under 5 (the lowest id of the two): the broker took its PUBLISH
    or PUBREL as record 2's exchange; record 2 was lost and record 1 sent twice. The hand-over
    of 5 to record 2 now clears it from record 1 in the same transaction, found by an index
    (an outbox of thousands of 60 kB records is not read through at every publish)."""
    path = tmp_path / "mqtt-outbox.db"
    box = Outbox(path, 10)
    for i in range(3):
        box.put(f"r{i}".encode())
    box.hand(1, 5)
    box.received(1)
    box.hand(3, 6)
    box.hand(2, 5)  # the stale 5 on record 1 was never cleared
    assert box.in_flight() == [(2, 5, False, b"r1"), (3, 6, False, b"r2")]
    box.hand(2, None)  # QoS 1, or a refusal: clears its own only
    assert box.in_flight() == [(3, 6, False, b"r2")]
    plan = " ".join(str(r) for r in box._db.execute(
        "EXPLAIN QUERY PLAN UPDATE records SET mid = NULL WHERE mid = 6 AND id != 3"))
    assert "records_by_mid" in plan, plan
    box.close()
    box = Outbox(path, 10)  # what a restart resumes
    assert box.in_flight() == [(3, 6, False, b"r2")] and len(box) == 3
    box.close()


def test_an_outbox_of_the_last_release_opens_at_once_while_another_process_holds_its_lock(tmp_path):
    """An outbox the last release wrote (its in-flight columns, no ``records_by_mid``) opened
    at once with another process holding its write lock (an operator's sqlite3 shell, a backup
    tool): nothing at the open writes to an outbox that has its tables. The index's creation
    waited there for SQLite's 30 s busy timeout, on the daemon's event loop, then refused the
    outbox ("cannot open it ... move it aside"): the daemon's first start after the upgrade
    failed. It is made by the first hand-over of an identifier instead (which waits for the
    lock as every such write does), and keeps identifiers unique from there."""
    import sqlite3

    path = tmp_path / "mqtt-outbox.db"
    box = Outbox(path, 10)
    for i in range(3):
        box.put(f"r{i}".encode())
    box.hand(1, 5)
    box.close()
    db = sqlite3.connect(str(path))
    db.execute("DROP INDEX records_by_mid")  # as the last release left it
    db.close()
    holder = hold_write_lock(path)
    try:
        t0 = time.monotonic()
        box = Outbox(path, 10)
        assert time.monotonic() - t0 < 1.0
        assert box.in_flight() == [(1, 5, False, b"r0")] and len(box) == 3
    finally:
        let_go(holder)
    box.hand(2, 5)  # paho gives 5 to record 2: record 1 lets go of it
    assert box.in_flight() == [(2, 5, False, b"r1")]
    plan = " ".join(str(r) for r in box._db.execute(
        "EXPLAIN QUERY PLAN UPDATE records SET mid = NULL WHERE mid = 6 AND id != 3"))
    assert "records_by_mid" in plan, plan
    box.close()


def test_a_lock_another_process_holds_never_holds_up_put_and_a_stop_ends_the_other_writes_waits(tmp_path):
    """``put`` runs on the daemon's event loop: with another process holding the write lock
    it raises ``OutboxBusy`` at once, also while the publisher's acknowledgement waits for
    that lock in another thread. That wait ends within a slice of ``stop_by``, and close does not
    wait. Each used to wait SQLite's 30 s busy timeout holding the connection: a real daemon
    wrote one frame per 30 s and took 114 s to exit after SIGTERM."""
    path = tmp_path / "mqtt-outbox.db"
    box = Outbox(path, 100)
    box.put(b"r0")
    holder = hold_write_lock(path)
    try:
        failed = []

        def ack() -> None:
            try:
                box.ack([1])
            except OutboxBusy as exc:
                failed.append(exc)

        acking = threading.Thread(target=ack, daemon=True)
        acking.start()
        for _ in range(5):
            t0 = time.monotonic()
            with pytest.raises(OutboxBusy, match=r"mqtt-outbox.db is locked by another process .*end that "
                                                 r"process's transaction"):
                box.put(b"r1")
            assert time.monotonic() - t0 < BUSY_SLICE_S
        assert acking.is_alive() and len(box) == 1  # the acknowledgement waits for the lock
        box.stop_by = t0 = time.monotonic()
        acking.join(5)
        assert not acking.is_alive() and time.monotonic() - t0 < 2 * BUSY_SLICE_S + 0.3 and len(failed) == 1
        t0 = time.monotonic()
        box.close()
        assert time.monotonic() - t0 < 1.0
    finally:
        let_go(holder)
    box = Outbox(path, 100)
    assert [d for _, d in box.peek(0, 10)] == [b"r0"]  # nothing half-written, the unacknowledged record kept
    box.put(b"r1")
    box.ack([1])
    assert [d for _, d in box.peek(0, 10)] == [b"r1"]
    box.close()


def test_a_write_waits_for_a_lock_another_process_lets_go_of(tmp_path):
    """Before a stop the publisher's writes wait for the lock (up to ``BUSY_TIMEOUT_S``) and
    go through once it is released; ``put`` given ``wait_s`` (the sink's close) too."""
    path = tmp_path / "mqtt-outbox.db"
    box = Outbox(path, 100)
    box.put(b"r0")
    holder = hold_write_lock(path)
    done = []
    try:
        threads = [threading.Thread(target=lambda: done.append(box.hand(1, 9)), daemon=True),
                   threading.Thread(target=lambda: done.append(box.put(b"r1", wait_s=10)), daemon=True)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert not done
    finally:
        let_go(holder)
    for t in threads:
        t.join(5)
    assert sorted(map(repr, done)) == ["None", "True"] and box.in_flight() == [(1, 9, False, b"r0")] and len(box) == 2
    box.close()


def test_sync_fsyncs_the_file_and_its_write_ahead_log(tmp_path, monkeypatch):
    """``synchronous=NORMAL`` leaves the last commits in the log unsynced; ``sync`` (called before
    the spool lets replayed answers go, ``edge.sinks.Sinks.durable``) fsyncs the file and the log."""
    import os

    path = tmp_path / "outbox.db"
    ob = Outbox(path, 100)
    assert ob.put(b'{"late": true}', late_key="dev/cam/1")
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    ob.sync()
    assert synced == [str(path), f"{path}-wal"]
    ob.close()
