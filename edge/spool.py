"""Durable on-disk escalation spool: SQLite in WAL mode, fsync'd on every commit.

When the cloud is unreachable, overloaded or too slow and the policy says
``onCloudUnavailable: spool``, the daemon puts the serialized ``DetectRequest``
here and a replay loop ``peek``s, sends and ``ack``s them in insertion order
when the cloud is back. Design follows the store-and-forward designs in
``docs/design/edge-runtime.md#spool-and-replay`` (Azure IoT edgeHub:
persisted before ack, ordered, TTL; Greengrass stream manager: ``max_size``,
``time_to_live``, ``strategy_on_full``).

Durability: ``journal_mode=WAL`` + ``synchronous=FULL`` makes SQLite fsync the
WAL on every commit, so an item whose ``put`` returned survives ``kill -9`` and
power loss. Delivery is at-least-once: an item is deleted only by ``ack`` after
the cloud answered, so a crash between send and ack replays it; receivers
de-duplicate by the frame idempotency ``key``. ``put`` is idempotent on
``key`` while the item is in the spool.

Caps (what exceeds them is counted in ``stats()`` and logged, never silent):

* **bytes** (``max_bytes``, payload + meta sizes): on a full spool the
  *oldest* items are evicted to make room (Greengrass ``OverwriteOldestData``):
  during a long outage the newest frames are the ones still worth a cloud
  answer. An item larger than the whole cap is refused (``put`` -> False).
* **age** (``max_age_s``): items older than this are expired on ``put``,
  ``peek`` and ``expire(now)``.

The drop counters are persisted in the same database, so they survive
restarts. All methods are thread-safe (one connection behind a lock).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

log = logging.getLogger(__name__)

_SCHEMA = """
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

_COUNTERS = (
    "dropped_bytes_cap",
    "dropped_age_cap",
    "dropped_bytes_cap_bytes",
    "dropped_age_cap_bytes",
    "refused_too_large",
)


@dataclass(frozen=True)
class SpoolItem:
    """One spooled escalation, as stored."""

    id: int
    key: str
    payload: bytes
    meta: Dict[str, Any]
    created: float
    attempts: int = 0


@dataclass(frozen=True)
class SpoolStats:
    """Depth and drop counters (``dropped_*`` count items; ``*_bytes`` their sizes)."""

    depth: int
    bytes: int
    oldest_age_s: float
    dropped_bytes_cap: int
    dropped_age_cap: int
    dropped_bytes_cap_bytes: int = 0
    dropped_age_cap_bytes: int = 0
    refused_too_large: int = 0


class Spool:
    """A durable FIFO of escalation requests with byte and age caps."""

    def __init__(
        self,
        path: Union[str, Path],
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be > 0, got {max_bytes}")
        if max_age_s <= 0:
            raise ValueError(f"spool max_age_s must be > 0, got {max_age_s}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self.max_age_s = float(max_age_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(self.path), timeout=30.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        for name in _COUNTERS:
            self._db.execute("INSERT OR IGNORE INTO counters(name, value) VALUES (?, 0)", (name,))
        row = self._db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM items").fetchone()
        self._bytes = int(row[0])
        self._depth = int(row[1])

    # --- writing ---------------------------------------------------------------

    def put(self, key: str, payload: bytes, meta: Optional[Dict[str, Any]] = None) -> bool:
        """Store durably; True when the item is in the spool after the call.

        A key already spooled is not stored twice (True). An item larger than
        ``max_bytes`` on its own is refused (False, counted). To make room the
        oldest items are evicted (counted, logged).
        """
        # default=str: a stray non-JSON value in meta must not lose the escalation
        meta_text = json.dumps(meta or {}, sort_keys=True, separators=(",", ":"), default=str)
        size = len(payload) + len(meta_text) + len(key)
        with self._lock:
            now = self._clock()
            self._expire_locked(now)
            if size > self.max_bytes:
                self._bump("refused_too_large", 1)
                log.warning(
                    "spool: refused %s: %d bytes is more than the whole spool cap (%d bytes)",
                    key, size, self.max_bytes,
                )
                return False
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("SELECT 1 FROM items WHERE key = ?", (key,)).fetchone():
                    db.execute("COMMIT")
                    return True
                evicted, evicted_bytes = self._evict_for(size)
                db.execute(
                    "INSERT INTO items(key, payload, meta, created, size) VALUES (?, ?, ?, ?, ?)",
                    (key, sqlite3.Binary(payload), meta_text, now, size),
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._bytes += size - evicted_bytes
            self._depth += 1 - evicted
            if evicted:
                log.warning(
                    "spool: byte cap %d reached; evicted the %d oldest item(s) (%d bytes) for %s",
                    self.max_bytes, evicted, evicted_bytes, key,
                )
            return True

    def _evict_for(self, size: int) -> Tuple[int, int]:
        """Delete oldest items until ``size`` more bytes fit (inside a transaction)."""
        over = self._bytes + size - self.max_bytes
        if over <= 0:
            return 0, 0
        ids: List[int] = []
        freed = 0
        cur = self._db.execute("SELECT id, size FROM items ORDER BY id")
        try:
            for item_id, item_size in cur:
                if freed >= over:
                    break
                ids.append(int(item_id))
                freed += int(item_size)
        finally:
            cur.close()
        self._db.executemany("DELETE FROM items WHERE id = ?", [(i,) for i in ids])
        self._bump_in_tx("dropped_bytes_cap", len(ids))
        self._bump_in_tx("dropped_bytes_cap_bytes", freed)
        return len(ids), freed

    # --- reading ---------------------------------------------------------------

    def peek(self, limit: int = 16) -> List[SpoolItem]:
        """Up to ``limit`` oldest items, in insertion order (not removed)."""
        with self._lock:
            self._expire_locked(self._clock())
            rows = self._db.execute(
                "SELECT id, key, payload, meta, created, attempts FROM items ORDER BY id LIMIT ?",
                (max(0, int(limit)),),
            ).fetchall()
        return [
            SpoolItem(int(r[0]), str(r[1]), bytes(r[2]), json.loads(r[3]), float(r[4]), int(r[5]))
            for r in rows
        ]

    def ack(self, item_id: int) -> bool:
        """Delete a delivered item; False when it was already gone (expired, evicted, acked)."""
        with self._lock:
            row = self._db.execute("SELECT size FROM items WHERE id = ?", (item_id,)).fetchone()
            if row is None:
                return False
            self._db.execute("DELETE FROM items WHERE id = ?", (item_id,))
            self._bytes -= int(row[0])
            self._depth -= 1
            return True

    def ack_many(self, item_ids: List[int]) -> int:
        """Delete several delivered items in one fsync'd transaction; returns how many existed."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                n = 0
                freed = 0
                for item_id in item_ids:
                    row = db.execute("SELECT size FROM items WHERE id = ?", (item_id,)).fetchone()
                    if row is None:
                        continue
                    db.execute("DELETE FROM items WHERE id = ?", (item_id,))
                    n += 1
                    freed += int(row[0])
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._bytes -= freed
            self._depth -= n
            return n

    def nack(self, item_id: int) -> int:
        """Record a failed delivery attempt; the item stays in place. Returns attempts (0 if gone)."""
        with self._lock:
            self._db.execute("UPDATE items SET attempts = attempts + 1 WHERE id = ?", (item_id,))
            row = self._db.execute("SELECT attempts FROM items WHERE id = ?", (item_id,)).fetchone()
            return int(row[0]) if row else 0

    # --- caps and stats -----------------------------------------------------

    def expire(self, now: Optional[float] = None) -> int:
        """Delete items older than ``max_age_s`` at ``now``; returns how many."""
        with self._lock:
            return self._expire_locked(self._clock() if now is None else now)

    def _expire_locked(self, now: float) -> int:
        cutoff = now - self.max_age_s
        db = self._db
        row = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM items WHERE created < ?", (cutoff,)
        ).fetchone()
        n, nbytes = int(row[0]), int(row[1])
        if n == 0:
            return 0
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM items WHERE created < ?", (cutoff,))
            self._bump_in_tx("dropped_age_cap", n)
            self._bump_in_tx("dropped_age_cap_bytes", nbytes)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self._bytes -= nbytes
        self._depth -= n
        log.warning("spool: expired %d item(s) (%d bytes) older than %gs", n, nbytes, self.max_age_s)
        return n

    def _bump_in_tx(self, name: str, by: int) -> None:
        if by:
            self._db.execute("UPDATE counters SET value = value + ? WHERE name = ?", (by, name))

    def _bump(self, name: str, by: int) -> None:
        self._db.execute("UPDATE counters SET value = value + ? WHERE name = ?", (by, name))

    def stats(self, now: Optional[float] = None) -> SpoolStats:
        """Depth, bytes, age of the oldest item and the drop counters."""
        with self._lock:
            t = self._clock() if now is None else now
            oldest = self._db.execute("SELECT MIN(created) FROM items").fetchone()[0]
            counters = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            return SpoolStats(
                depth=self._depth,
                bytes=self._bytes,
                oldest_age_s=max(0.0, t - float(oldest)) if oldest is not None else 0.0,
                dropped_bytes_cap=int(counters.get("dropped_bytes_cap", 0)),
                dropped_age_cap=int(counters.get("dropped_age_cap", 0)),
                dropped_bytes_cap_bytes=int(counters.get("dropped_bytes_cap_bytes", 0)),
                dropped_age_cap_bytes=int(counters.get("dropped_age_cap_bytes", 0)),
                refused_too_large=int(counters.get("refused_too_large", 0)),
            )

    def __len__(self) -> int:
        return self._depth

    def close(self) -> None:
        """Close the database (a checkpoint folds the WAL into the main file)."""
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - best effort
                pass
            self._db.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
