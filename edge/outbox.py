"""The MQTT sink's outbox: records kept on disk until the broker acknowledged them.

A small SQLite file (WAL, ``synchronous=NORMAL``): every record the MQTT sink
gets is appended here first; the sink's publisher thread sends them in order
and deletes each one when its PUBACK arrived. So a broker outage (or a restart
of the daemon meanwhile) loses nothing up to ``max_records``; beyond that the
*oldest* records are dropped, counted (the newest results are the ones a
consumer still acts on, as the spool's eviction). ``synchronous=NORMAL`` makes a
commit survive ``kill -9`` of the daemon (the data is in the OS), not a power
cut: the records are the ones the JSON Lines sink also has, and an fsync per
frame would cost the Jetson's eMMC ~10 ms on the event loop.

The outbox also remembers the idempotency keys of the *late* records it took
(results replayed from the escalation spool), in the same transaction as the
record: a replay repeated after a crash between "written to the sinks" and
"acknowledged in the spool" finds the key and the record is not published a
second time. The last ``late_keys_max`` keys are kept (a replay repeats only
what the spool still holds, the newest items).

Not the escalation spool (``edge.spool``) on purpose: that one fsyncs every
commit, caps bytes and ages, and forgets a key once delivered; here the writes
are per frame, the cap is a record count, and late keys outlive delivery.
Thread-safe (one connection behind a lock). Callers: ``edge.sinks.MqttSink``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import List, Optional, Tuple, Union

from edgewise.errors import EdgewiseError

#: how many late keys a sink remembers (the newest; a replay repeats only recent results)
LATE_KEYS_MAX = 100_000

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    data  BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS late_keys (
    key   TEXT PRIMARY KEY
);
"""


class OutboxError(EdgewiseError):
    """The outbox file cannot be opened; the message names the path."""


class Outbox:
    """Durable FIFO of serialized records, with a memory of late keys."""

    def __init__(self, path: Union[str, Path], max_records: int, late_keys_max: int = LATE_KEYS_MAX) -> None:
        if max_records < 1:
            raise ValueError(f"outbox max_records must be >= 1, got {max_records}")
        self.path = Path(path)
        self.max_records = int(max_records)
        self.late_keys_max = int(late_keys_max)
        self.dropped = 0  # records dropped over the cap since start
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._depth = int(self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0])
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"MQTT sink outbox {self.path}: cannot open it ({exc}); move it aside "
                              "or set sinks.mqtt_outbox to a writable file") from None
        self._writes = 0

    def late_keys(self) -> List[str]:
        """The late keys remembered (the newest ``late_keys_max``)."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT key FROM late_keys")]

    def __len__(self) -> int:
        return self._depth

    def put(self, data: bytes, late_key: Optional[str] = None) -> bool:
        """Append one record; False (nothing stored) when ``late_key`` was taken before.
        Over ``max_records`` the oldest records are dropped (``dropped`` counts them)."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                if late_key is not None:
                    db.execute("INSERT OR IGNORE INTO late_keys(key) VALUES (?)", (late_key,))
                    if db.execute("SELECT changes()").fetchone()[0] == 0:
                        db.execute("COMMIT")
                        return False
                db.execute("INSERT INTO records(data) VALUES (?)", (sqlite3.Binary(data),))
                over = self._depth + 1 - self.max_records
                if over > 0:
                    db.execute("DELETE FROM records WHERE id IN (SELECT id FROM records ORDER BY id LIMIT ?)",
                               (over,))
                self._writes += 1
                if late_key is not None and self._writes % 1000 == 0:
                    db.execute("DELETE FROM late_keys WHERE rowid <= (SELECT MAX(rowid) FROM late_keys) - ?",
                               (self.late_keys_max,))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            if over > 0:
                self.dropped += over
                log.warning("MQTT sink outbox full (%d records): dropped the %d oldest",
                            self.max_records, over)
            self._depth += 1 - max(0, over)
            return True

    def peek(self, after_id: int, limit: int) -> List[Tuple[int, bytes]]:
        """Up to ``limit`` oldest records with an id above ``after_id``: (id, data)."""
        with self._lock:
            rows = self._db.execute("SELECT id, data FROM records WHERE id > ? ORDER BY id LIMIT ?",
                                    (int(after_id), int(limit))).fetchall()
        return [(int(r[0]), bytes(r[1])) for r in rows]

    def ack(self, ids: List[int]) -> None:
        """Delete published records (ids already gone are ignored)."""
        if not ids:
            return
        with self._lock:
            db = self._db
            before = db.total_changes
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("DELETE FROM records WHERE id = ?", [(i,) for i in ids])
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            self._depth -= db.total_changes - before

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - best effort
                pass
            self._db.close()
