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
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple, Union
from urllib.parse import quote

from edge.spool import DAMAGE_MARKER_SUFFIX, ITEM_COLUMNS, Spool, SpoolCorrupt, SpoolFull

log = logging.getLogger(__name__)

#: Items read per query from a damaged file.
READ_CHUNK = 64
#: Bytes of payload copied per transaction (a full disk then stops the copy near its reserve).
BATCH_BYTES = 128 * 1024
#: Ids past a damaged page tried one by one before the search doubles its steps.
LINEAR_IDS = 4096
#: Where the search for readable ids gives up when the file's highest id cannot be read.
UNKNOWN_TOP = 1 << 62

#: The columns that make an ``items`` table the spool's (the first release's).
SPOOL_COLUMNS = {"id", "key", "payload", "meta", "created", "size", "attempts"}

Row = Tuple[int, str, bytes, str, float, int, int, Optional[float], Optional[str]]


@dataclass
class Salvage:
    """What ``salvage`` did with a damaged file.

    Attributes:
        moved_to: where the damaged file now is (kept for inspection).
        salvaged: items copied into the new spool.
        damaged_ranges: id ranges (first, last) that could not be read (a damaged page).
        invalid: rows read but not an item (wrong types, meta not JSON); not copied.
        evicted: salvaged items the new spool's byte cap evicted (oldest first).
        full: why the salvage stopped early (the filesystem's reserve reached); the items
            not copied are still in ``moved_to``.
    """

    moved_to: Path
    salvaged: int = 0
    damaged_ranges: Tuple[Tuple[int, int], ...] = ()
    invalid: int = 0
    evicted: int = 0
    full: str = ""

    def describe(self) -> str:
        lost = "".join(f", ids {a}-{b} unreadable" for a, b in self.damaged_ranges[:3])
        if len(self.damaged_ranges) > 3:
            lost += f" and {len(self.damaged_ranges) - 3} more damaged range(s)"
        bad = f", {self.invalid} row(s) not an escalation" if self.invalid else ""
        cap = f", {self.evicted} evicted by spool.max_bytes" if self.evicted else ""
        stopped = (f"; stopped early, the rest is still in {self.moved_to}: {self.full}" if self.full else "")
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
    """The items of a damaged spool file in id order, around the pages that cannot be read."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
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
        self.db.close()


def salvage(damaged: Path, into: Spool) -> Salvage:
    """Copy every readable item of the spool file ``damaged`` into ``into`` (ids kept). Stops
    at a full filesystem (``Salvage.full``: the rest stays in ``damaged``)."""
    reader = _Reader(damaged)
    result = Salvage(moved_to=damaged)

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
    except SpoolFull as exc:
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
