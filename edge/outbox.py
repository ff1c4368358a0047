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

Each record handed to the broker at QoS 2 keeps, next to it, its MQTT packet identifier
(``hand``, written before the broker can see the message) and whether the broker's PUBREC
came (``received``, written before the PUBREL goes out); ``in_flight`` gives them to the next
process, which completes those exchanges in the same MQTT session instead of publishing the
records anew, so the broker delivers each once (``edge.sinks.MqttSink``). The session's client
id is kept here too (``client_id``): the outbox is what ties a device's restarts together.

Every open runs SQLite's ``quick_check`` first: a damaged file is ``OutboxDamaged``, which
``edge.outbox_salvage.open_outbox`` (the daemon's way in) answers by copying what it still
holds into a new outbox; another program's database is refused before anything is written.
A record that reads back as zeros (``torn``: a half-written page ``quick_check`` does not see)
is neither copied by the salvage nor published by the sink.

Another process holding the file's write lock (an operator's ``sqlite3`` shell left in a
transaction, a backup tool, a second daemon) never holds the event loop up: ``put`` (called
there, once per frame) tries the lock once and raises ``OutboxBusy`` (the MQTT sink keeps the
record in memory meanwhile), and every other write waits for it in ``edge.spool.BUSY_SLICE_S``
slices with the connection free in between, up to ``BUSY_TIMEOUT_S`` and not past ``stop_by``
(paho's thread tries once as well: ``edge.sinks.MqttSink``).
Before, each write waited in SQLite, holding the connection, for its 30 s busy timeout: the
daemon handled one frame per 30 s and took 114 s to exit after SIGTERM.

Not the escalation spool (``edge.spool``) on purpose: that one fsyncs every
commit, caps bytes and ages, and forgets a key once delivered; here the writes
are per frame, the cap is a record count, and late keys outlive delivery.
Thread-safe (one connection behind a lock). Callers: ``edge.sinks.MqttSink``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Collection, Iterable, List, Optional, Tuple, TypeVar, Union

from edge.spool import (
    BUSY_SLICE_S,
    is_busy,
    is_corrupt,
    quick_check,
    reusable_bytes,
    short_of_room,
    use_wal,
    wal_working_bytes,
)
from edgewise.errors import EdgewiseError

#: how many late keys a sink remembers (the newest; a replay repeats only recent results)
LATE_KEYS_MAX = 100_000
#: seconds a write other than ``put`` waits for a lock another process holds, at most
BUSY_TIMEOUT_S = 30.0

T = TypeVar("T")

log = logging.getLogger(__name__)


def torn(data: object) -> bool:
    """Whether a record read back from the outbox is not one the MQTT sink put there: empty, not
    bytes, or holding a NUL byte. A record is a JSON line, which writes a NUL as ``\\u0000``, never
    raw; a page a power cut left half written (or a card that acknowledged a write it had only
    cached) reads back as zeros, in a b-tree ``PRAGMA quick_check`` finds sound. The one rule for
    the sink's publisher and the salvage's copy (``edge.outbox_salvage``)."""
    return not isinstance(data, bytes) or not data or b"\0" in data

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    data  BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS late_keys (
    key   TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""
#: finds the record holding a packet identifier (``Outbox.hand``) without reading the records through
_MID_INDEX = "CREATE INDEX IF NOT EXISTS records_by_mid ON records(mid) WHERE mid IS NOT NULL"
#: the columns of ``records`` that make a file an outbox (the first release's)
OUTBOX_COLUMNS = frozenset(("id", "data"))
#: columns added to ``records`` after the first release (an older outbox gets them at open)
_IN_FLIGHT_COLUMNS = (("mid", "INTEGER"), ("received", "INTEGER NOT NULL DEFAULT 0"))


def this_host() -> str:
    """What tells this machine from a copy of its disk: the machine id systemd makes at first
    boot (``/etc/machine-id``; a golden image must be cleared of it, as systemd asks), else the
    host name (a container without one: its own)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                machine = f.read().strip()
        except OSError:
            continue
        if machine:
            return machine
    return socket.gethostname()


class OutboxError(EdgewiseError):
    """The outbox file cannot be opened; the message names the path."""


class OutboxDamaged(OutboxError):
    """The outbox file is damaged (SQLite's ``quick_check``, or a query that found it malformed
    or not a database at all): ``edge.outbox_salvage.open_outbox`` copies what it still holds
    into a new one when it is an outbox. ``reason``: SQLite's words."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"MQTT sink outbox {path} is damaged ({reason})")
        self.reason = reason


class OutboxBusy(OutboxError):
    """Another process holds the outbox's write lock: nothing was written."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"MQTT sink outbox {path} is locked by another process (an sqlite3 shell left in a "
                         "transaction, a backup tool, a second daemon on this file?); end that process's "
                         "transaction")


class Outbox:
    """Durable FIFO of serialized records, with a memory of late keys."""

    def __init__(self, path: Union[str, Path], max_records: int, late_keys_max: int = LATE_KEYS_MAX) -> None:
        if max_records < 1:
            raise ValueError(f"outbox max_records must be >= 1, got {max_records}")
        self.path = Path(path)
        self.max_records = int(max_records)
        self.late_keys_max = int(late_keys_max)
        self.dropped = 0  # records dropped over the cap since start
        #: monotonic time after which a write no longer waits for a lock another process holds
        #: (the MQTT sink's close sets it: the stop must end within systemd's TimeoutStopSec)
        self.stop_by: Optional[float] = None
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                       check_same_thread=False)
            tables = [r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(records)")}
            if tables and not OUTBOX_COLUMNS <= columns:  # before anything is written into it
                self._db.close()
                raise OutboxError(f"MQTT sink outbox {self.path} is another program's database (tables "
                                  f"{', '.join(tables[:5])}), not an outbox; set sinks.mqtt_outbox to a file of its "
                                  "own, or move this one aside")
            use_wal(self._db, "NORMAL")
            self._wal_working = wal_working_bytes(self._db)  # the page size is the file's for good
            problems = quick_check(self._db)  # before anything is written into a damaged file
            if problems:
                raise sqlite3.DatabaseError(f"damaged: {problems[0]}{' and more' if len(problems) > 1 else ''}")
            self._db.executescript(_SCHEMA)
            have = {r[1] for r in self._db.execute("PRAGMA table_info(records)")}
            for column, decl in _IN_FLIGHT_COLUMNS:
                if column not in have:
                    self._db.execute(f"ALTER TABLE records ADD COLUMN {column} {decl}")
            # not waited for: an outbox of the last release opens while another process holds its lock
            self._mid_index = _try_now(self._db, _MID_INDEX)
            self._depth = int(self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0])
        except (OSError, sqlite3.Error) as exc:
            with contextlib.suppress(AttributeError, sqlite3.Error):
                self._db.close()
            if isinstance(exc, sqlite3.DatabaseError) and (str(exc).startswith("damaged: ") or is_corrupt(exc)):
                raise OutboxDamaged(self.path, str(exc).replace("damaged: ", "", 1)) from None
            raise OutboxError(f"MQTT sink outbox {self.path}: cannot open it ({exc}); move it aside "
                              "or set sinks.mqtt_outbox to a writable file") from None
        self._writes = 0

    def client_id(self, prefix: str, make: Callable[[], str], host: str = "", wait_s: float = BUSY_TIMEOUT_S) -> str:
        """The MQTT client id this outbox's records are published under: the one kept here if it
        starts with ``prefix`` (the device id) and was made on ``host`` (``this_host()``), else
        ``make()``, kept from now on (``keep_client_id``, waiting ``wait_s`` for a lock another
        process holds). A new id is a new MQTT session: the exchanges the outbox
        had in flight are another session's, and their records are published anew (an outbox
        copied with a disk image to another machine must not share its session)."""
        kept = self.kept_client_id(prefix, host)
        if kept is not None:
            return kept
        made = make()
        self.keep_client_id(made, host, wait_s)
        return made

    def kept_client_id(self, prefix: str, host: str = "") -> Optional[str]:
        """The client id kept here when it starts with ``prefix`` and was made on ``host``; None
        when a new one is needed. A read: never waits for a lock another process holds."""
        with self._lock:
            kept = dict(self._db.execute("SELECT key, value FROM meta WHERE key IN ('client_id', 'host')"))
        if str(kept.get("client_id", "")).startswith(prefix) and kept.get("host", "") == host:
            return str(kept["client_id"])
        return None

    def keep_client_id(self, made: str, host: str = "", wait_s: float = BUSY_TIMEOUT_S) -> None:
        """Keep ``made`` as the client id (of ``host``), and forget the exchanges the outbox had in
        flight in the old session (their records are published anew). ``OutboxBusy`` when another
        process holds the write lock for ``wait_s`` (0: tried once, as on the event loop)."""
        def keep(db: sqlite3.Connection) -> None:
            db.executemany("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", [("client_id", made), ("host", host)])
            db.execute("UPDATE records SET mid = NULL, received = 0 WHERE mid IS NOT NULL")
        self._write(keep, wait_s)

    def hand(self, rid: int, mid: Optional[int], wait_s: float = BUSY_TIMEOUT_S) -> None:
        """Record ``rid`` goes to the broker at QoS 2 with packet identifier ``mid`` (None: at
        QoS 1, or not at all after a refusal; nothing to complete after a restart).

        A packet identifier names one exchange: another record still noted with ``mid`` (its
        exchange ended, and clearing it found the outbox locked: the sink does not wait for that
        on paho's thread or the event loop) lets go of it in the same transaction. Otherwise a
        restart could resume the old record under the new one's identifier: the broker takes it
        as the new exchange's, one record is lost and the other sent twice."""
        def write(db: sqlite3.Connection) -> None:
            if mid is not None:
                if not self._mid_index:  # the open found the outbox locked (``_try_now``)
                    db.execute(_MID_INDEX)
                db.execute("UPDATE records SET mid = NULL, received = 0 WHERE mid = ? AND id != ?", (mid, int(rid)))
            db.execute("UPDATE records SET mid = ?, received = 0 WHERE id = ?", (mid, int(rid)))

        def written(_: None) -> None:
            if mid is not None:
                self._mid_index = True

        self._write(write, wait_s, written)

    def received(self, rid: int, got: bool = True, wait_s: float = BUSY_TIMEOUT_S) -> None:
        """The broker's PUBREC for record ``rid`` came (``got``): a restart sends its PUBREL, not
        the record; or the exchange started over (the broker lost the session): the record."""
        self._write(lambda db: db.execute("UPDATE records SET received = ? WHERE id = ?", (int(got), int(rid))),
                    wait_s)

    def in_flight(self) -> List[Tuple[int, int, bool, bytes]]:
        """The records handed to the broker at QoS 2 and not acknowledged: (id, mid, received,
        data), the received ones first (their exchanges are the further along), then by id."""
        with self._lock:
            rows = self._db.execute("SELECT id, mid, received, data FROM records WHERE mid IS NOT NULL "
                                    "ORDER BY received DESC, id").fetchall()
        return [(int(r[0]), int(r[1]), bool(r[2]), _data(r[3])) for r in rows]

    def late_keys(self) -> List[str]:
        """The late keys remembered (the newest ``late_keys_max``)."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT key FROM late_keys")]

    def __len__(self) -> int:
        return self._depth

    def room_for(self, size: int, reserve_bytes: int) -> bool:
        """Whether ``size`` more bytes of records leave ``reserve_bytes`` free on the outbox's
        filesystem, its free pages counted (``edge.spool.short_of_room``), once its WAL has taken
        what it may still take (``edge.spool.wal_working_bytes``)."""
        if not reserve_bytes:
            return True
        with self._lock:
            return short_of_room(self.path.parent, size + self._wal_working, reserve_bytes,
                                 reusable_bytes(self._db)) is None

    def put(self, data: bytes, late_key: Optional[str] = None, wait_s: float = 0.0) -> bool:
        """Append one record; False (nothing stored) when ``late_key`` was taken before.
        Over ``max_records`` the oldest records are dropped (``dropped`` counts them), not those
        in flight at QoS 2 (a few dozen at most: their exchanges are completed first).
        ``OutboxBusy`` when another process holds the write lock for ``wait_s`` (by default
        the lock is tried once: ``put`` runs on the daemon's event loop)."""

        def append(db: sqlite3.Connection) -> Optional[int]:
            if late_key is not None:
                db.execute("INSERT OR IGNORE INTO late_keys(key) VALUES (?)", (late_key,))
                if db.execute("SELECT changes()").fetchone()[0] == 0:
                    return None
            db.execute("INSERT INTO records(data) VALUES (?)", (sqlite3.Binary(data),))
            over = self._depth + 1 - self.max_records
            if over > 0:  # not a record in flight: the broker's session may hold its packet identifier
                before = db.total_changes
                db.execute("DELETE FROM records WHERE id IN "
                           "(SELECT id FROM records WHERE mid IS NULL ORDER BY id LIMIT ?)", (over,))
                over = db.total_changes - before
            if late_key is not None and (self._writes + 1) % 1000 == 0:
                db.execute("DELETE FROM late_keys WHERE rowid <= (SELECT MAX(rowid) FROM late_keys) - ?",
                           (self.late_keys_max,))
            return max(0, over)

        def appended(over: Optional[int]) -> None:
            if over is None:
                return
            self._writes += 1
            if over:
                self.dropped += over
                log.warning("MQTT sink outbox full (%d records): dropped the %d oldest", self.max_records, over)
            self._depth += 1 - over

        return self._write(append, wait_s, appended) is not None

    def restore(self, records: Iterable[bytes], late_keys: Iterable[str]) -> int:
        """Append ``records`` (oldest first) and remember ``late_keys``, in one transaction: what
        a salvage read from a damaged outbox. Over ``max_records`` the oldest are dropped, as
        :meth:`put` drops them; returns how many were dropped."""
        # (streamed: a salvage's records are up to about 100 MB; the body runs once, after the lock is taken)
        def append(db: sqlite3.Connection) -> Tuple[int, int]:
            db.executemany("INSERT OR IGNORE INTO late_keys(key) VALUES (?)", ((k,) for k in late_keys))
            db.executemany("INSERT INTO records(data) VALUES (?)", ((sqlite3.Binary(d),) for d in records))
            depth = int(db.execute("SELECT COUNT(*) FROM records").fetchone()[0])
            over = max(0, depth - self.max_records)
            db.execute("DELETE FROM records WHERE id IN (SELECT id FROM records WHERE mid IS NULL ORDER BY id "
                       "LIMIT ?)", (over,))
            return depth, over

        def appended(done: Tuple[int, int]) -> None:
            self._depth = done[0] - done[1]
            self.dropped += done[1]

        return self._write(append, then=appended)[1]

    def peek(self, after_id: int, limit: int, skip: Collection[int] = (),
             fits: Optional[Callable[[int, int], bool]] = None) -> List[Tuple[int, bytes]]:
        """Up to ``limit`` oldest records with an id above ``after_id`` and not in ``skip``: (id, data).
        ``fits(bytes taken so far, size)``: whether the next record (of ``size`` bytes) is taken
        too; the first it refuses ends the list, and only the records taken are read (a record
        can be megabytes)."""
        n = max(0, int(limit))
        with self._lock:
            rows = self._db.execute("SELECT id, length(data) FROM records WHERE id > ? ORDER BY id LIMIT ?",
                                    (int(after_id), n + len(skip))).fetchall()
            ids: List[int] = []
            taken = 0
            for rid, size in ((int(r[0]), int(r[1] or 0)) for r in rows if int(r[0]) not in skip):
                if len(ids) >= n or (fits is not None and not fits(taken, size)):
                    break
                ids.append(rid)
                taken += size
            if not ids:
                return []
            got = self._db.execute(f"SELECT id, data FROM records WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id",
                                   ids).fetchall()
        return [(int(r[0]), _data(r[1])) for r in got]

    def sync(self) -> None:
        """fsync the file and its write-ahead log (any thread; ``OSError`` when the disk refuses):
        the commits so far survive a power cut, which ``synchronous=NORMAL`` alone does not
        promise. Called before the spool acknowledges replayed escalations whose late records
        are here (``edge.sinks.Sinks.durable``)."""
        for name in (str(self.path), f"{self.path}-wal"):
            try:
                fd = os.open(name, os.O_RDONLY)
            except FileNotFoundError:  # (no log: everything is in the file)
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def ack(self, ids: List[int], wait_s: float = BUSY_TIMEOUT_S) -> None:
        """Delete published records (ids already gone are ignored)."""
        if not ids:
            return

        def delete(db: sqlite3.Connection) -> int:
            before = db.total_changes
            db.executemany("DELETE FROM records WHERE id = ?", [(i,) for i in ids])
            return db.total_changes - before

        def deleted(n: int) -> None:
            self._depth -= n

        self._write(delete, wait_s, deleted)

    def _write(self, body: Callable[[sqlite3.Connection], T], wait_s: float = BUSY_TIMEOUT_S,
               then: Optional[Callable[[T], None]] = None) -> T:
        """``body`` in one write transaction (rolled back when it raises), then ``then`` with its
        result, both holding the connection's lock. The write lock is tried without SQLite's busy
        wait, so the connection is never held while another process holds the file: between
        tries, every ``BUSY_SLICE_S``, the other threads' calls get in (the event loop's ``put``
        among them). It is tried for ``wait_s``, not past ``stop_by``; then ``OutboxBusy``."""
        give_up = time.monotonic() + wait_s
        while True:
            with self._lock:
                db = self._db
                if _try_now(db, "BEGIN IMMEDIATE"):
                    try:
                        out = body(db)
                        db.execute("COMMIT")
                    except BaseException:
                        if db.in_transaction:
                            db.execute("ROLLBACK")
                        raise
                    if then is not None:
                        then(out)
                    return out
            end = give_up if self.stop_by is None else min(give_up, self.stop_by)
            left = end - time.monotonic()
            if left <= 0:
                raise OutboxBusy(self.path)
            time.sleep(min(BUSY_SLICE_S, left))

    def close(self) -> None:
        """Close the database; its checkpoint (which folds the WAL into the file) does not wait
        for a lock another process holds: the next open folds it."""
        with self._lock:
            try:
                self._db.execute("PRAGMA busy_timeout = 0")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - best effort
                pass
            self._db.close()


def _try_now(db: sqlite3.Connection, statement: str) -> bool:
    """``statement`` without SQLite's busy wait: False when another connection holds the write
    lock. ``BEGIN IMMEDIATE`` (``_write``), and ``records_by_mid`` at the open: an outbox of the
    last release lacks it, and the open runs on the daemon's event loop, so it must not wait for
    another process's lock (30 s, then "cannot open it"); ``Outbox.hand`` makes it then."""
    db.execute("PRAGMA busy_timeout = 0")
    try:
        db.execute(statement)
        return True
    except sqlite3.OperationalError as exc:
        if is_busy(exc):
            return False
        raise
    finally:
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")


def _data(value: object) -> bytes:
    """A record's ``data`` as read: b"" (``torn``) where a damaged row holds no bytes at all."""
    return value if isinstance(value, bytes) else b""
