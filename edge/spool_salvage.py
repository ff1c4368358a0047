"""Salvage of a damaged spool file: the daemon keeps running and keeps what it can read.

A spool whose file SQLite finds damaged (a bad flash block, a torn write on an SD card) is
refused by ``Spool`` at open (``SpoolCorrupt``). Refusing the start would take a camera's
detection down until someone logs in (systemd does not restart a daemon that exits 2),
for the sake of an auxiliary queue; moving the file aside and starting empty would lose
the escalations it held, accepted data. ``open_spool`` does neither: when the file is a
spool (an SQLite file with the spool's ``items`` table), it renames it (with its ``-wal``
and ``-shm`` files) to ``<name>.damaged-<UTC time>``, opens a new spool at the path and
copies into it every item it can still read, with its id, age and attempts, so that the
replay continues where it stood. A file that is not a spool (another program's, or one
whose first page is gone) is still refused: it is not ours to rename.

Reading a damaged file: the items are read by their rowid through the table's b-tree,
never through an index (``NOT INDEXED``), so a damaged index, the common case, loses
nothing. A damaged table page loses the items stored on it: the reader finds the first
id past the damage by doubling and bisecting (a few dozen queries, whatever the ids) and
reads on from there. Each item is checked (types, JSON meta) before it is copied.

Damage found while the daemon runs (``Spool.damaged``) is salvaged the same way without a
restart: ``salvage_in_use``, on the spool's own I/O thread, moves the file aside, gives the
open spool a new file at its path (``Spool.replace_damaged_file``) and copies into it what the
damaged one still holds. ``SalvagePacing`` (pure) says when: at once the first time; after a
salvage that failed (a full disk) or damage found again soon after one (a dying card) only
after a back-off, so that the escalations meanwhile do not set off a salvage each.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Type, Union
from urllib.parse import quote

from edge.spool import (
    DAMAGE_MARKER_SUFFIX,
    ITEM_COLUMNS,
    Spool,
    SpoolCorrupt,
    SpoolError,
    SpoolFull,
)

log = logging.getLogger(__name__)

#: Items read per query from a damaged file.
READ_CHUNK = 64
#: Bytes of payload copied per transaction (a full disk then stops the copy near its reserve).
BATCH_BYTES = 128 * 1024
#: Ids past a damaged page tried one by one before the search doubles its steps.
LINEAR_IDS = 4096
#: Where the search for readable ids gives up when the file's highest id cannot be read.
UNKNOWN_TOP = 1 << 62

#: Seconds before a spool found damaged in use is salvaged again after a salvage that failed,
#: or after damage found again this soon after a salvage; doubled at each such try.
SALVAGE_RETRY_S = 30.0
#: ... up to this. A spool that stays sound this long after a salvage is salvaged at once again.
SALVAGE_RETRY_MAX_S = 1800.0

#: The columns that make an ``items`` table the spool's (the first release's).
SPOOL_COLUMNS = {"id", "key", "payload", "meta", "created", "size", "attempts"}

Row = Tuple[int, str, bytes, str, float, int, int, Optional[float], Optional[str]]


@dataclass
class Salvage:
    """What ``salvage`` did with a damaged file.

    Attributes:
        moved_to: where the damaged file now is (kept for inspection); None for a file that
            had been deleted while open (``salvage_in_use`` read it through its connection).
        salvaged: items copied into the new spool.
        damaged_ranges: id ranges (first, last) that could not be read (a damaged page).
        invalid: rows read but not an item (wrong types, meta not JSON); not copied.
        evicted: salvaged items the new spool's byte cap evicted (oldest first).
        full: why the salvage stopped early (the filesystem's reserve reached; in use, also the
            new file failing); the items not copied are still in ``moved_to``.
        unreadable: why nothing at all could be read from the damaged file.
    """

    moved_to: Optional[Path]
    salvaged: int = 0
    damaged_ranges: Tuple[Tuple[int, int], ...] = ()
    invalid: int = 0
    evicted: int = 0
    full: str = ""
    unreadable: str = ""

    def describe(self) -> str:
        if self.unreadable:
            return f"nothing could be salvaged from it ({self.unreadable})"
        lost = "".join(f", ids {a}-{b} unreadable" for a, b in self.damaged_ranges[:3])
        if len(self.damaged_ranges) > 3:
            lost += f" and {len(self.damaged_ranges) - 3} more damaged range(s)"
        bad = f", {self.invalid} row(s) not an escalation" if self.invalid else ""
        cap = f", {self.evicted} evicted by spool.max_bytes" if self.evicted else ""
        rest = f"is still in {self.moved_to}" if self.moved_to is not None else "was lost with the deleted file"
        stopped = f"; stopped early, the rest {rest}: {self.full}" if self.full else ""
        return f"{self.salvaged} escalation(s) salvaged{lost}{bad}{cap}{stopped}"


def is_spool_file(path: Union[str, Path]) -> bool:
    """Whether ``path`` is an SQLite file whose schema has the spool's ``items`` table, with
    its columns (read-only: nothing is written to it)."""
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(items)")}
        return SPOOL_COLUMNS <= columns
    except sqlite3.Error:
        return False
    finally:
        db.close()


def move_aside(path: Path, now: Optional[float] = None) -> Path:
    """Rename ``path`` and its ``-wal``/``-shm`` files to ``<name>.damaged-<UTC time>`` (the
    WAL keeps its name's suffix, so SQLite still finds it); returns the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    moved: List[Tuple[Path, Path]] = []
    try:
        for suffix in ("-wal", "-shm"):  # the WAL travels with its file, or SQLite loses what it holds
            side = path.with_name(path.name + suffix)
            if side.exists():
                os.replace(side, target.with_name(target.name + suffix))
                moved.append((target.with_name(target.name + suffix), side))
        os.replace(path, target)
    except OSError:
        for now_at, was_at in moved:  # put the WAL back beside its file
            os.replace(now_at, was_at)
        raise
    return target


def _valid(row: Tuple[object, ...]) -> bool:
    item_id, key, payload, meta, created, size, attempts = row[:7]
    if not (isinstance(item_id, int) and isinstance(key, str) and key and isinstance(payload, bytes)
            and isinstance(meta, str) and isinstance(created, (int, float)) and isinstance(size, int)
            and isinstance(attempts, int)):
        return False
    try:
        return isinstance(json.loads(meta), dict)
    except ValueError:
        return False


class _Reader:
    """The items of a damaged spool file in id order, around the pages that cannot be read:
    the file at a path (opened read-only), or an open connection to it (not closed here)."""

    def __init__(self, source: Union[Path, sqlite3.Connection]) -> None:
        self._own = not isinstance(source, sqlite3.Connection)
        self.db = (source if isinstance(source, sqlite3.Connection)
                   else sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True))
        self.damaged: List[Tuple[int, int]] = []
        self.invalid = 0
        have = {row[1] for row in self.db.execute("PRAGMA table_info(items)")}
        # a spool of the first release has no mono/boot: its items age as an earlier boot's
        self.columns = ", ".join(c if c in have else f"NULL AS {c}" for c in ITEM_COLUMNS.split(", "))
        try:
            row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'items'").fetchone()
            self.top = int(row[0]) if row else None
        except sqlite3.Error:
            self.top = None

    def _from(self, first: int, limit: int) -> List[Tuple[object, ...]]:
        # >=, not >: "id > n" with n the last id of a damaged page seeks into that page
        return self.db.execute(f"SELECT {self.columns} FROM items NOT INDEXED WHERE id >= ? ORDER BY id LIMIT ?",
                               (first, limit)).fetchall()

    def _readable_from(self, first: int) -> bool:
        try:
            self._from(first, 1)
            return True
        except sqlite3.DatabaseError:
            return False

    def _resume(self, first: int) -> Optional[int]:
        """The smallest id above ``first`` (unreadable) from which items can be read again;
        None when none can. Id by id for ``LINEAR_IDS`` ids (readable items between two
        damaged pages are not jumped over), then by doubling and bisecting."""
        ceiling = max(self.top or UNKNOWN_TOP, first) + 1
        for x in range(first + 1, min(first + LINEAR_IDS, ceiling) + 1):
            if self._readable_from(x):
                return x
        lo = first + LINEAR_IDS  # unreadable from lo
        step = LINEAR_IDS
        while not self._readable_from(lo + step):
            if lo + step >= ceiling:
                return None
            lo, step = lo + step, step * 2
        hi = lo + step  # readable from hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._readable_from(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def rows(self) -> Iterator[Row]:
        first, limit = 1, READ_CHUNK
        while True:
            try:
                chunk = self._from(first, limit)
            except sqlite3.DatabaseError:
                if limit > 1:  # the damage is somewhere in this chunk: read up to it one by one
                    limit = 1
                    continue
                resume = self._resume(first)
                self.damaged.append((first, resume - 1 if resume is not None else (self.top or first)))
                if resume is None:
                    return
                first, limit = resume, READ_CHUNK
                continue
            if not chunk:
                return
            for row in chunk:
                if _valid(row):
                    yield row  # type: ignore[misc]
                else:
                    self.invalid += 1
            first = int(chunk[-1][0]) + 1  # type: ignore[call-overload]

    def close(self) -> None:
        if self._own:
            self.db.close()


def salvage(damaged: Union[Path, sqlite3.Connection], into: Spool,
            stop_on: Tuple[Type[SpoolError], ...] = (SpoolFull,)) -> Salvage:
    """Copy every readable item of the spool file ``damaged`` (a path, or a connection to a
    file deleted while open) into ``into`` (ids kept). Stops at a full filesystem, or at any
    other of the errors ``stop_on`` of the new spool (``Salvage.full``: the rest stays in
    ``damaged``)."""
    reader = _Reader(damaged)
    result = Salvage(moved_to=damaged if isinstance(damaged, Path) else None)

    def adopt(batch: List[Row]) -> None:
        adopted, evicted = into.adopt(batch)
        result.salvaged += adopted
        result.evicted += evicted

    try:
        batch: List[Row] = []
        size = 0
        for row in reader.rows():
            batch.append(row)
            size += len(row[2])
            if len(batch) >= READ_CHUNK or size >= BATCH_BYTES:
                adopt(batch)
                batch, size = [], 0
        if batch:
            adopt(batch)
    except stop_on as exc:
        result.full = str(exc)
    finally:
        reader.close()
    result.damaged_ranges = tuple(reader.damaged)
    result.invalid = reader.invalid
    return result


def damage_marker(path: Path) -> Path:
    """The file a spool leaves beside itself when it finds its file damaged while in use
    (``Spool`` writes it): damage ``quick_check`` cannot see (an index that no longer holds
    the table's rows), which the next start must salvage all the same."""
    return path.with_name(path.name + DAMAGE_MARKER_SUFFIX)


def open_spool(path: Union[str, Path], max_bytes: int, max_age_s: float) -> Spool:
    """The spool at ``path``; a damaged one (found by ``quick_check`` now, or marked damaged
    while in use) is moved aside and salvaged into a new one (module doc), said in one ERROR
    naming both files. ``SpoolCorrupt`` when the file is not a spool or cannot be moved."""
    path = Path(path)
    marker = damage_marker(path)
    why = ""
    if marker.exists() and path.exists() and is_spool_file(path):
        why = f"spool {path} was found damaged while the daemon ran ({_read_marker(marker)})"
    else:
        try:
            spool = Spool(path, max_bytes=max_bytes, max_age_s=max_age_s)
        except SpoolCorrupt as exc:
            if not is_spool_file(path):
                raise
            why = str(exc).split(";")[0]
        else:
            _remove(marker)  # a stale mark of a file that is gone or sound again
            return spool
    try:
        moved = move_aside(path)
    except OSError as err:  # a read-only folder: the refusal stands, with why it could not be salvaged
        raise SpoolCorrupt(f"{why}; it could not be moved aside to salvage it ({err.strerror or err})") from None
    _remove(marker)
    spool = Spool(path, max_bytes=max_bytes, max_age_s=max_age_s)
    try:
        result = salvage(moved, spool)
    except (sqlite3.Error, OSError) as err:  # the file went worse still: start empty, say so
        log.error("%s; moved it to %s and started a new spool, but nothing could be salvaged from it (%s)",
                  why, moved, err)
        return spool
    except BaseException:
        spool.close()
        raise
    log.error("%s; moved it to %s (kept for inspection) and started a new spool at %s: %s",
              why, moved, path, result.describe())
    return spool


def salvage_in_use(spool: Spool) -> Salvage:
    """Salvage ``spool``, found damaged while in use (``Spool.damaged``), without a restart, as
    ``open_spool`` does at start: its file is moved aside (``move_aside``), a new one started at
    its path and what the damaged one still holds copied into it, ids, ages and attempts kept;
    the spool object goes on, on the new file. A file deleted while open is read through the
    spool's connection, the only way left to it. Call it on the thread that makes the spool's
    calls (the daemon's spool thread), so that the calls queued behind it meet the new file.

    Raises ``SpoolError`` when no new file could be started (the file cannot be moved, a full
    disk): the spool stays damaged, its file and its mark in place, so the next start salvages
    it. A copy that stops early (a full disk, the new file failing too) is a ``Salvage`` with
    ``full`` set; the new spool is damaged again when that was the cause."""
    moved, old = spool.replace_damaged_file(move_aside)
    _remove(damage_marker(spool.path))  # the file it marked is moved aside
    source: Union[Path, sqlite3.Connection, None] = moved if moved is not None else old
    try:
        if source is None:
            return Salvage(moved_to=None, unreadable="it had been deleted and closed")
        return salvage(source, spool, stop_on=(SpoolError,))
    except (sqlite3.Error, OSError) as err:  # the damaged file went worse still: the new spool goes on empty
        return Salvage(moved_to=moved, unreadable=str(err))
    finally:
        if old is not None:
            old.close()


class SalvagePacing:
    """When a spool found damaged in use may be salvaged (pure; times in monotonic seconds).

    The first damage is salvaged at once. After a salvage that failed (a full disk, a folder
    the daemon cannot write) the next try waits ``first_s``, doubling at each failure up to
    ``max_s``; so does damage found again before the spool stayed sound for ``max_s`` after a
    salvage (a card that keeps failing). Meanwhile a damaged spool behaves as it always did:
    escalations keep their edge result, nothing is replayed."""

    def __init__(self, first_s: float = SALVAGE_RETRY_S, max_s: float = SALVAGE_RETRY_MAX_S) -> None:
        self.first_s = first_s
        self.max_s = max(first_s, max_s)
        self.tries = 0  # salvages in a row, none followed by max_s of a sound spool
        self.last: Optional[float] = None  # when the last one ran
        self.last_ok = False

    def _tries_at(self, now: float) -> int:
        if self.last is not None and self.last_ok and now - self.last >= self.max_s:
            return 0  # it stayed sound long enough: this is new damage, not the same trouble
        return self.tries

    def wait_s(self, now: float) -> float:
        """Seconds until the next salvage may run (0: now)."""
        tries = self._tries_at(now)
        if self.last is None or tries == 0:
            return 0.0
        delay = min(self.max_s, self.first_s * 2.0 ** min(tries - 1, 32))
        return max(0.0, self.last + delay - now)

    def due(self, now: float) -> bool:
        return self.wait_s(now) <= 0.0

    def attempted(self, now: float, ok: bool) -> None:
        """A salvage ran at ``now``; ``ok``: the spool got a new file."""
        self.tries = self._tries_at(now) + 1
        self.last, self.last_ok = now, ok


def _read_marker(marker: Path) -> str:
    try:
        text = marker.read_text(encoding="utf-8", errors="replace").strip()[:300]
        return "".join(c if c.isprintable() else "?" for c in text) or "no detail"
    except OSError as exc:
        return f"its mark could not be read: {exc.strerror or exc}"


def _remove(marker: Path) -> None:
    try:
        marker.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s (%s); the next start salvages the spool again", marker,
                    exc.strerror or exc)
