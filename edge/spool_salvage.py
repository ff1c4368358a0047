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

A copy cut short (``kill -9`` or a power loss, a stop of the daemon, a full disk) must not
leave the rest of the moved file behind unnoticed, as a healthy but partial spool would.
So before a damaged file is moved aside, its new name is added to the salvage marker
``<spool file>.salvaging`` (``salvage_marker``: a comment line, then one moved file's name a
line, written to a temporary file, fsync'd and renamed over the marker, the folder fsync'd),
and each batch the copy stores records in the same transaction the highest id it copied
(``Spool.adopt``). The name leaves the marker (the marker goes once empty) only when the copy
reached the end of the moved file, or found nothing readable in it. Every start
(``open_spool``), and the daemon after a copy that stopped at a full disk
(``continue_salvages``), goes on with each copy the marker names, from the id after the last
one copied: nothing is copied twice, and an item already replayed and acknowledged is not
copied back. A name whose file is gone, or is not a regular file, is said and dropped; a
marker whose content is garbage (a bad block) is said with the moved files there and how to
name the one to go on with; a marker that cannot be read at all (its permissions, an I/O
error) is said with what to do and left as it is, never written over.

Ids: before a copy the new spool numbers its items above the moved file's highest id
(``Spool.raise_ids``), so that an escalation spooled while a copy waits for room never takes
the id of an item not copied yet; should it happen all the same, ``Spool.adopt`` gives the
copied item a new id rather than drop it. A moved file that was itself the spool while an
earlier copy went on holds that copy's progress: it is taken over (``salvaged_from``, the
higher id per file kept), so that when a new spool is damaged in turn nothing acknowledged is
copied back. A finished copy stays recorded (``SALVAGE_DONE``) as long as its moved file is
there: named again by hand, it copies nothing. A moved file gets a name no record or marker
holds (a device without a real-time clock repeats its boot second), and a file's record under
its own name is never taken over (it is of an earlier file of that name). A damaged file's
sequence at or above ``MAX_PLAUSIBLE_ID`` is garbage (a flipped bit) and ignored: numbering
after it would exhaust the new spool's ids. The instance lock (``<spool file>.lock``) is
never moved.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from edge.spool import (
    DAMAGE_MARKER_SUFFIX,
    ITEM_COLUMNS,
    MAX_PLAUSIBLE_ID,
    Spool,
    SpoolCorrupt,
    SpoolError,
    SpoolFull,
    _has_progress,
    disk_full,
    is_corrupt,
    sound_item,
    write_advice,
)
from edgewise.outputs import fsync_dir  # (the salvage's renames: spool and outbox)

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

#: ``<spool file><this>``: the moved damaged files whose copy into the spool has not finished.
SALVAGE_MARKER_SUFFIX = ".salvaging"
#: The salvage marker's first line (a comment: lines starting with # are skipped).
MARKER_HEADER = "# edgewise: damaged spool files moved aside whose escalations are still being copied into {spool}\n"
#: What a moved file's name adds to the spool file's: ``<spool file>.damaged-<UTC time>[-n]``.
MOVED_INFIX = ".damaged-"

#: Why a copy should stop now ("" to go on); asked between batches.
StopCheck = Callable[[], str]

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
        full: why the salvage stopped early (the filesystem's reserve reached, the new file
            failing); the items not copied are still in ``moved_to``, copied later.
        unreadable: why nothing at all could be read from the damaged file.
        stopped: why a stop cut the copy short (the daemon is stopping); the rest is copied at
            the next start.
        resumed: the copy went on with one that an earlier try or run had not finished.
        source_failed: ``full`` is about the moved file (it cannot be opened now), not the new
            spool: the copies after it go on.
    """

    moved_to: Optional[Path]
    salvaged: int = 0
    damaged_ranges: Tuple[Tuple[int, int], ...] = ()
    invalid: int = 0
    evicted: int = 0
    full: str = ""
    unreadable: str = ""
    stopped: str = ""
    resumed: bool = False
    source_failed: bool = False

    @property
    def blocks(self) -> bool:
        """The copies after this one wait too: a stop, or the new spool cannot take more (a full
        disk); not a moved file that cannot be read now, which does not hold the others up."""
        return bool(self.stopped) or (bool(self.full) and not self.source_failed)

    @property
    def finished(self) -> bool:
        """The copy reached the end of the damaged file (or found nothing it could read)."""
        return not self.full and not self.stopped

    def describe(self) -> str:
        if self.unreadable:
            return f"nothing could be salvaged from it ({self.unreadable})"
        lost = "".join(f", ids {a}-{b} unreadable" for a, b in self.damaged_ranges[:3])
        if len(self.damaged_ranges) > 3:
            lost += f" and {len(self.damaged_ranges) - 3} more damaged range(s)"
        bad = f", {self.invalid} row(s) not an escalation" if self.invalid else ""
        cap = f", {self.evicted} evicted by spool.max_bytes" if self.evicted else ""
        rest = f"is still in {self.moved_to}" if self.moved_to is not None else "was lost with the deleted file"
        if self.stopped:
            stopped = f"; stopped early ({self.stopped}), the rest {rest} and is copied at the next start"
        elif self.full:
            later = ("; the daemon copies it from there later (it tries again, and so does its next start)"
                     if self.moved_to is not None else "")
            stopped = f"; stopped early, the rest {rest}: {self.full}{later}"
        else:
            stopped = ""
        more = " more" if self.resumed else ""
        return f"{self.salvaged}{more} escalation(s) salvaged{lost}{bad}{cap}{stopped}"


def has_table(path: Union[str, Path], table: str, columns: Iterable[str]) -> bool:
    """Whether ``path`` is an SQLite file whose schema has ``table`` with (at least) ``columns``
    (read-only: nothing is written to it): whose file it is, the spool's or the MQTT outbox's."""
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        for schema_writable in ("OFF", "ON"):
            # ON: a file cut short (a truncation, a copy that stopped) whose header counts more
            # pages than it has is "malformed" to every query, its schema included; read that
            # way its schema still shows whose file it is, and it is salvaged, not refused
            db.execute(f"PRAGMA writable_schema = {schema_writable}")
            try:
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            except sqlite3.DatabaseError:
                continue
            return set(columns) <= have
        return False
    except sqlite3.Error:
        return False
    finally:
        db.close()


def is_spool_file(path: Union[str, Path]) -> bool:
    """Whether ``path`` is an SQLite file with the spool's ``items`` table and its columns."""
    return has_table(path, "items", SPOOL_COLUMNS)


def aside_name(path: Path, now: Optional[float] = None, taken: Sequence[str] = ()) -> Path:
    """Where ``move_aside`` puts ``path``: ``<name>.damaged-<UTC time>``, ``-2``, ``-3`` ... added
    when that is taken, as a file or as a name in ``taken`` (the moved files a spool has records
    of copies from: a device without a clock that repeats its boot time must not give a new
    damaged file the name of one whose copy is recorded as done)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = path.with_name(f"{path.name}{MOVED_INFIX}{stamp}")
    n = 1
    while (target.name in taken
           or any(target.with_name(target.name + suffix).exists() for suffix in ("", "-wal", "-shm"))):
        n += 1
        target = path.with_name(f"{path.name}{MOVED_INFIX}{stamp}-{n}")
    return target


def move_aside(path: Path, now: Optional[float] = None, target: Optional[Path] = None) -> Path:
    """Rename ``path`` and its ``-wal``/``-shm`` files to ``target`` (``aside_name`` by default;
    the WAL keeps its name's suffix, so SQLite still finds it); returns the new path."""
    if target is None:
        target = aside_name(path, now)
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


class DamagedTable:
    """The rows of one table of a damaged SQLite file in id order, around the pages that cannot
    be read: the file at a path (opened read-only), or an open connection to it (not closed
    here). By default the spool's ``items``; ``table``, ``columns`` (those the file lacks read
    as NULL), ``valid`` (a row worth copying) and ``id_column`` (the integer key the table's
    rows are stored by, ``rowid`` for any) read another table (the MQTT outbox's)."""

    def __init__(self, source: Union[Path, sqlite3.Connection], table: str = "items", columns: str = ITEM_COLUMNS,
                 valid: Callable[[Tuple[object, ...]], bool] = sound_item, id_column: str = "id") -> None:
        self._own = not isinstance(source, sqlite3.Connection)
        self.db = (source if isinstance(source, sqlite3.Connection)
                   else sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True))
        if self._own:  # a file cut short is "malformed" to every query but read so (is_spool_file)
            self.db.execute("PRAGMA writable_schema = ON")
        self.table, self.id_column, self.valid = table, id_column, valid
        self.damaged: List[Tuple[int, int]] = []
        self.invalid = 0
        have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")} | {"rowid"}
        # a spool of the first release has no mono/boot: its items age by their wall stamp alone
        self.columns = ", ".join(c if c in have else f"NULL AS {c}" for c in columns.split(", "))
        try:
            row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
            self.top = int(row[0]) if row else None
        except sqlite3.Error:
            self.top = None
        if self.top is None:
            try:  # the rowid b-tree's last entry: no sqlite_sequence (damaged), the highest id all the same
                row = self.db.execute(f"SELECT MAX({id_column}) FROM {table}").fetchone()
                self.top = int(row[0]) if row and row[0] is not None else None
            except sqlite3.Error:
                pass

    def progress(self) -> Dict[str, int]:
        """How far copies into this file from other moved files had got (its ``salvaged_from``,
        written while it was the spool); empty when it has none or it cannot be read."""
        return _progress_in(self.db)

    def _from(self, first: int, limit: int) -> List[Tuple[object, ...]]:
        # >=, not >: "id > n" with n the last id of a damaged page seeks into that page
        key = self.id_column
        return self.db.execute(f"SELECT {self.columns} FROM {self.table} NOT INDEXED WHERE {key} >= ? "
                               f"ORDER BY {key} LIMIT ?", (first, limit)).fetchall()

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

    def rows(self, first: int = 1) -> Iterator[Row]:
        """The readable rows (``valid``) with an id from ``first`` on; the others are counted
        (``invalid``), and the id ranges that could not be read are in ``damaged``."""
        limit = READ_CHUNK
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
                if self.valid(row):
                    yield row  # type: ignore[misc]
                else:
                    self.invalid += 1
            first = int(chunk[-1][0]) + 1  # type: ignore[call-overload]

    def close(self) -> None:
        if self._own:
            self.db.close()


def _progress_in(db: sqlite3.Connection) -> Dict[str, int]:
    """The ``salvaged_from`` rows of a (moved, maybe damaged) spool file; best effort."""
    try:
        if not _has_progress(db):
            return {}
        return {str(s): int(n) for s, n in db.execute("SELECT source, last_id FROM salvaged_from")
                if isinstance(s, str) and isinstance(n, int)}
    except sqlite3.Error:
        return {}


def _progress_of(path: Path, untouched: bool = False) -> Dict[str, int]:
    """``_progress_in`` the moved file at ``path`` (read-only; ``untouched``: ``immutable``, no
    -wal or -shm made beside a damaged file and the WAL not read); empty when it cannot be opened."""
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro{'&immutable=1' if untouched else ''}", uri=True)
    except sqlite3.Error:
        return {}
    try:
        return _progress_in(db)
    finally:
        db.close()


def _recorded_names(path: Path) -> List[str]:
    """The moved files the spool file at ``path`` records copies from, read without touching it
    (best effort, for ``aside_name``)."""
    return list(_progress_of(path, untouched=True))


def salvage(damaged: Union[Path, sqlite3.Connection], into: Spool, after: int = 0,
            should_stop: Optional[StopCheck] = None) -> Salvage:
    """Copy every readable item of the spool file ``damaged`` (a path, or a connection to a
    file deleted while open) with an id above ``after`` into ``into`` (ids kept; for a path,
    how far it got is recorded under the file's name, ``Spool.adopt``). Stops at a full
    filesystem, or at any other error of the new spool (``SpoolError``: ``Salvage.full``),
    or between two batches when ``should_stop`` gives a reason (``Salvage.stopped``): the
    rest stays in ``damaged``. A batch the filesystem's reserve refuses is tried in halves,
    so that a copy near a full disk stores what still fits.

    Before the copy, the new spool numbers its items above the damaged file's highest id
    (``Spool.raise_ids``: an item spooled meanwhile never takes the id of one not copied yet),
    and takes over how far copies into the damaged file itself had got (its own
    ``salvaged_from``, when it was a spool a salvage was copying into): those copies then go
    on from there, and bring back nothing acknowledged."""
    reader = DamagedTable(damaged)
    result = Salvage(moved_to=damaged if isinstance(damaged, Path) else None)
    source = damaged.name if isinstance(damaged, Path) else None
    inherited = reader.progress() if source is not None else {}
    inherited.pop(source or "", None)  # a record under its own name is of an earlier file of that name

    def adopt(batch: List[Row]) -> None:
        try:
            adopted, evicted = into.adopt(batch, source)
        except SpoolFull:
            if len(batch) == 1:
                raise
            # near the reserve: the first half (lower ids) may still fit, and the copy then stops
            # exactly where the next try goes on
            half = len(batch) // 2
            adopt(batch[:half])
            adopt(batch[half:])
            return
        result.salvaged += adopted
        result.evicted += evicted

    try:
        if reader.top and reader.top < MAX_PLAUSIBLE_ID:  # a garbled sequence would exhaust the new spool's ids
            into.raise_ids(reader.top)
        if inherited:
            into.record_progress(inherited)
        batch: List[Row] = []
        size = 0
        for row in reader.rows(after + 1):
            batch.append(row)
            size += len(row[2])
            if len(batch) >= READ_CHUNK or size >= BATCH_BYTES:
                adopt(batch)
                batch, size = [], 0
                result.stopped = should_stop() if should_stop is not None else ""
                if result.stopped:
                    break
        if batch:
            adopt(batch)
    except SpoolError as exc:
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


def salvage_marker(path: Path) -> Path:
    """The file naming the moved damaged files whose copy into the spool at ``path`` has not
    finished (module doc)."""
    return path.with_name(path.name + SALVAGE_MARKER_SUFFIX)


def _is_moved_name(path: Path, name: str) -> bool:
    """``name`` is one ``move_aside`` gives the spool file at ``path`` (no folder, no -wal)."""
    return (name.startswith(path.name + MOVED_INFIX) and len(name) < 256 and name.isprintable()
            and "/" not in name and not name.endswith(("-wal", "-shm")))


def _moved_files(path: Path) -> List[Path]:
    """The damaged files moved aside beside the spool at ``path``, oldest first."""
    found = path.parent.glob(glob.escape(path.name + MOVED_INFIX) + "*")
    return sorted(p for p in found if _is_moved_name(path, p.name))


class _MarkerUnreadable(OSError):
    """The salvage marker is there but cannot be read: it is not written over (the names it holds
    would be lost)."""


class _Marker:
    """The salvage marker of the spool at ``path``: ``names`` as read (see ``_read``), and
    ``add``/``drop``, each written durably before they return (``OSError`` when it cannot be;
    ``_MarkerUnreadable`` when the marker could not be read, ``unreadable`` saying why)."""

    def __init__(self, path: Path) -> None:
        self.spool = path
        self.path = salvage_marker(path)
        self.unreadable = ""
        self.names = self._read()

    def _read(self) -> List[str]:
        """The names the marker holds whose file is there. A name whose file is gone, or is not a
        regular file, is said and dropped (a file moved only halfway, its -wal first, gets its
        -wal back); a line that names no moved spool file (garbage: a bad block) is said with the
        moved files there and how to go on with one of them, and the marker is written again
        without them. A marker that cannot be read (its permissions, an I/O error) is said with
        what to do and left as it is: nothing is copied until it can be read."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                todo = "make it readable and writable by the daemon (owner edgewise, e.g. `chown edgewise`)"
            elif exc.errno == errno.EISDIR:
                todo = "it is a folder: move it away (nothing in it is the daemon's)"
            else:
                todo = "check `dmesg` for I/O errors on its filesystem"
            self.unreadable = f"its salvage marker {self.path} cannot be read ({exc.strerror or exc}): {todo}"
            log.error("spool %s: %s. Until then no copy of a damaged spool file that an earlier run had not "
                      "finished goes on, and a damaged spool is not salvaged; the marker is left as it is",
                      self.spool, self.unreadable)
            return []
        names, problem = self._parse(data)
        keep: List[str] = []
        for name in names:
            moved = self.spool.with_name(name)
            if name in keep:
                continue
            if moved.is_file():
                keep.append(name)
            elif moved.exists() or moved.is_symlink():
                log.warning("spool %s: its salvage marker %s names %s, which is not a regular file (a folder?): "
                            "nothing is copied from it, and it is dropped from the marker", self.spool, self.path,
                            moved)
            elif self._unmove(moved):
                log.warning("spool %s: a salvage stopped while it moved the damaged file to %s; its -wal and -shm "
                            "are back beside it, and it is salvaged as a damaged file is", self.spool, moved)
            else:
                log.warning("spool %s: its salvage marker %s names %s, which is not there (deleted, or the salvage "
                            "stopped before it moved the file): nothing more is copied from it; if it was deleted, "
                            "the escalations not yet copied from it are lost", self.spool, self.path, moved)
        if problem:
            others = [p.name for p in _moved_files(self.spool) if p.name not in keep]
            there = (f"the moved files there are {', '.join(others)}" if others
                     else "no other moved file is there")
            log.error("spool %s: its salvage marker %s is damaged (%s), so a copy of a damaged spool file into the "
                      "spool may not have finished; %s. To go on with one, stop the daemon, add the file's name as "
                      "a line to %s and start it: what was copied already is not copied twice, and a file whose "
                      "copy had finished copies nothing. Delete moved files you no longer need", self.spool,
                      self.path, problem, there, self.path)
        if problem or keep != names:
            try:
                self._write(keep)
            except OSError as exc:
                log.warning("spool %s: could not write its salvage marker %s again (%s)", self.spool, self.path,
                            exc.strerror or exc)
        return keep

    def _parse(self, data: bytes) -> Tuple[List[str], str]:
        """The names in the marker's bytes, and what is wrong with them ("" when nothing)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return [], "not UTF-8 text"
        lines = text.split("\n")
        torn = lines.pop()  # after the last newline: "" unless the write was torn
        names: List[str] = []
        bad = 1 if torn.strip() else 0
        for line in (x.strip() for x in lines):
            if not line or line.startswith("#"):
                continue
            if _is_moved_name(self.spool, line):
                names.append(line)
            else:
                bad += 1
        return names, (f"{bad} line(s) that name no moved spool file" if bad else "")

    def _unmove(self, moved: Path) -> bool:
        """``move_aside`` stopped after moving the -wal (and maybe the -shm) of the spool to
        ``moved`` but not the file itself: put them back beside the file. The -wal decides (it
        holds committed items); a -shm is only SQLite's index of it, rebuilt from the -wal, so
        one already beside the file (a kill between the two renames) stays and the moved one is
        removed. False when that is not the case (the spool's own -wal is there)."""
        wal, wal_back = (moved.with_name(moved.name + "-wal"), self.spool.with_name(self.spool.name + "-wal"))
        shm, shm_back = (moved.with_name(moved.name + "-shm"), self.spool.with_name(self.spool.name + "-shm"))
        if not self.spool.exists() or not wal.exists() or wal_back.exists():
            return False
        try:
            os.replace(wal, wal_back)
            if shm.exists():
                if shm_back.exists():
                    shm.unlink()
                else:
                    os.replace(shm, shm_back)
        except OSError as exc:
            log.warning("spool %s: could not move %s's -wal back (%s)", self.spool, moved, exc.strerror or exc)
            return False
        return True

    def _write(self, names: Sequence[str]) -> None:
        """Replace the marker by one holding ``names`` (removed when none), durably; never one
        that could not be read (``_MarkerUnreadable``)."""
        if self.unreadable:
            raise _MarkerUnreadable(errno.EACCES, self.unreadable)
        if not names:
            try:
                self.path.unlink()
            except FileNotFoundError:
                return
            fsync_dir(self.spool.parent)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = (MARKER_HEADER.format(spool=self.spool.name) + "".join(f"{n}\n" for n in names)).encode("utf-8")
        try:
            fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise
        fsync_dir(self.spool.parent)

    def add(self, name: str) -> None:
        self._write(self.names + [name])
        self.names.append(name)

    def drop(self, name: str) -> None:
        rest = [n for n in self.names if n != name]
        self._write(rest)
        self.names = rest

    def forget(self, name: str) -> None:
        """``drop`` for a file that was not moved after all; a failure is only said."""
        try:
            self.drop(name)
        except OSError as exc:
            log.warning("spool %s: could not remove %s from its salvage marker %s (%s)", self.spool, name,
                        self.path, exc.strerror or exc)


def _copy(spool: Spool, marker: _Marker, name: str, should_stop: Optional[StopCheck],
          resumed: bool, inherited: Optional[Dict[str, int]] = None) -> Salvage:
    """Copy into ``spool`` what the moved file ``name`` (in the marker) holds past what an earlier
    try copied (the spool's ``salvage_progress``, or ``inherited``: what another moved file, once
    the spool, had recorded of it); once the copy is over, drop the name from the marker."""
    moved = spool.path.with_name(name)
    try:
        after = max(spool.salvage_progress(name), (inherited or {}).get(name, 0))
        result = salvage(moved, spool, after=after, should_stop=should_stop)
    except SpoolError as exc:  # the new spool's own file failed: go on later
        result = Salvage(moved_to=moved, full=str(exc))
    except (sqlite3.Error, OSError) as err:
        if isinstance(err, sqlite3.DatabaseError) and is_corrupt(err):
            result = Salvage(moved_to=moved, unreadable=str(err))  # never readable: nothing to go on with
        else:  # cannot be opened now (no room for its -shm, an I/O error): go on later
            result = Salvage(moved_to=moved, full=f"{err}; delete {marker.path} to give it up", source_failed=True)
    result.resumed = resumed
    if result.stopped:
        spool.busy_with = f"salvaging its damaged file; the next start copies the rest from {moved}"
    if result.finished:
        try:
            spool.salvage_finished(name)  # first: named again, it copies nothing
        except SpoolError:
            pass  # the marker still drops it; named again by hand, it is looked through once more
        try:
            marker.drop(name)
        except OSError as exc:
            log.warning("spool %s: the salvage from %s finished but its salvage marker %s could not be updated "
                        "(%s); the next start looks through that file again, which copies nothing twice",
                        spool.path, moved, marker.path, exc.strerror or exc)
    # pending while any copy the marker lists is unfinished, not only this one
    spool.copy_pending = not result.finished or bool(marker.names)
    return result


def _inherited(spool: Spool, names: Sequence[str]) -> Dict[str, int]:
    """How far copies had got as the moved files ``names`` themselves recorded (each was once the
    spool, copying from the files before it): the highest id per file."""
    found: Dict[str, int] = {}
    for name in names:
        for source, last in _progress_of(spool.path.with_name(name)).items():
            if source != name:  # a record under its own name is of an earlier file of that name
                found[source] = max(found.get(source, 0), last)
    return found


def _continue(spool: Spool, marker: _Marker, should_stop: Optional[StopCheck], quiet: bool) -> List[Salvage]:
    results: List[Salvage] = []
    inherited = _inherited(spool, marker.names)
    for name in list(marker.names):
        result = _copy(spool, marker, name, should_stop, resumed=True, inherited=inherited)
        results.append(result)
        level = logging.WARNING
        if quiet and not result.finished:  # the daemon trying again and again: the end is what matters
            level = logging.INFO if result.salvaged else logging.DEBUG
        log.log(level, "spool %s: went on with the salvage of the damaged file %s, which an earlier try had not "
                "finished (a stop, a crash or a full disk cut it short): %s", spool.path, result.moved_to,
                result.describe())
        if result.blocks:
            break
    return results


def continue_salvages(spool: Spool, should_stop: Optional[StopCheck] = None, quiet: bool = False) -> List[Salvage]:
    """Go on with every copy into ``spool`` that its salvage marker names (module doc), oldest
    first, each from the id after the last one it copied; one WARNING each (``quiet``, for the
    daemon's tries: a copy that does not finish yet is only INFO, or DEBUG when it copied
    nothing). Returns what each did; empty when none was pending. Stops at the first that the new
    spool cannot finish (a full disk, ``should_stop``): the marker keeps it and those after it; a
    moved file that cannot be read now is kept too, and the next one gone on with."""
    return _continue(spool, _Marker(spool.path), should_stop, quiet)


def open_spool(path: Union[str, Path], max_bytes: int, max_age_s: float) -> Spool:
    """The spool at ``path``; a damaged one (found by ``quick_check`` now, or marked damaged
    while in use) is moved aside and salvaged into a new one (module doc), said in one ERROR
    naming both files. Copies into it that an earlier run did not finish (the salvage marker)
    go on, one WARNING each. ``SpoolCorrupt`` when the file is not a spool or cannot be moved."""
    path = Path(path)
    marker = damage_marker(path)
    pending = _Marker(path)
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
            _guard_open(spool, lambda: _continue(spool, _forget_gone(spool, pending), None, quiet=False))
            return spool
    target = aside_name(path, taken=[*_recorded_names(path), *pending.names])
    try:
        pending.add(target.name)  # before the move: a copy cut short goes on at the next start
        moved = move_aside(path, target=target)
    except OSError as err:  # a read-only folder: the refusal stands, with why it could not be salvaged
        if target.name in pending.names:
            pending.forget(target.name)
        if isinstance(err, _MarkerUnreadable):
            raise SpoolCorrupt(f"{why}; it is not salvaged while {pending.unreadable}") from None
        advice = write_advice(path.parent, err)
        # a full disk: the daemon starts without the spool and tries again (a refusal would stop it)
        kind = SpoolFull if disk_full(err) else SpoolCorrupt
        raise kind(f"{why}; it could not be moved aside to salvage it ({err.strerror or err}): {advice}") from None
    fsync_dir(path.parent)
    _remove(marker)
    try:
        spool = Spool(path, max_bytes=max_bytes, max_age_s=max_age_s)
    except SpoolError as err:  # a full disk: the marker keeps the moved file for the next open
        log.error("%s; moved it to %s (kept for inspection), but no new spool could be started at %s (%s); what "
                  "it holds is copied into the spool once one can be opened", why, moved, path, err)
        raise

    def copy() -> None:
        result = _copy(spool, pending, target.name, None, resumed=False)
        log.error("%s; moved it to %s (kept for inspection) and started a new spool at %s: %s",
                  why, moved, path, result.describe())
        if not result.blocks:
            _continue(spool, pending, None, quiet=False)

    _guard_open(spool, copy)
    return spool


def _forget_gone(spool: Spool, pending: _Marker) -> _Marker:
    """Drop the spool's record of copies from moved files that the marker no longer names and
    that are gone (deleted by hand): nothing can be copied from them again. A moved file still
    there keeps its record, so that one named again by hand copies nothing twice. Best effort;
    not while the marker cannot be read. Returns ``pending``."""
    if pending.unreadable:
        return pending
    try:
        gone = [s for s in spool.salvage_sources()
                if s not in pending.names and _is_moved_name(spool.path, s) and not spool.path.with_name(s).exists()]
        spool.forget_salvages(gone)
    except SpoolError as exc:
        log.debug("spool %s: its record of finished salvages was not tidied (%s)", spool.path, exc)
    return pending


def _guard_open(spool: Spool, copy: Callable[[], object]) -> None:
    """Run ``copy`` into the spool just opened; closed again when it raises."""
    try:
        copy()
    except BaseException:
        spool.close()
        raise


def salvage_in_use(spool: Spool, should_stop: Optional[StopCheck] = None) -> Salvage:
    """Salvage ``spool``, found damaged while in use (``Spool.damaged``), without a restart, as
    ``open_spool`` does at start: its file is moved aside (``move_aside``, its new name in the
    salvage marker first), a new one started at its path and what the damaged one still holds
    copied into it, ids, ages and attempts kept; the spool object goes on, on the new file. A
    file deleted while open is read through the spool's connection, the only way left to it.
    Call it on the thread that makes the spool's calls (the daemon's spool thread), so that the
    calls queued behind it meet the new file. ``should_stop`` is asked between batches: a copy
    it stops (``Salvage.stopped``) goes on at the next start (not that of a deleted file, which
    would be lost: it always finishes). Copies an earlier try left unfinished are not gone on
    with here: ``continue_salvages``.

    Raises ``SpoolError`` when no new file could be started (the file cannot be moved, a full
    disk): the spool stays damaged, its file and its mark in place, so the next start salvages
    it. A copy that stops early (a full disk, the new file failing too) is a ``Salvage`` with
    ``full`` set; the new spool is damaged again when that was the cause."""
    pending = _Marker(spool.path)
    if pending.unreadable:  # a move now would write over the names it holds
        raise SpoolError(f"spool {spool.path} is damaged and is not salvaged while {pending.unreadable}")
    planned: List[Path] = []

    def move(path: Path) -> Path:
        target = aside_name(path, taken=[*_recorded_names(path), *pending.names])
        pending.add(target.name)  # before the move: a copy cut short goes on at the next start
        planned.append(target)
        try:
            moved = move_aside(path, target=target)
        except OSError:
            pending.forget(target.name)
            raise
        fsync_dir(path.parent)
        return moved

    try:
        moved, old = spool.replace_damaged_file(move)
    except SpoolError:
        for target in planned:
            if not target.exists():  # put back at the path: nothing to copy from there
                pending.forget(target.name)
        raise
    _remove(damage_marker(spool.path))  # the file it marked is moved aside
    if moved is not None:
        return _copy(spool, pending, moved.name, should_stop, resumed=False)
    try:
        if old is None:
            return Salvage(moved_to=None, unreadable="it had been deleted and closed")
        return salvage(old, spool)
    except (sqlite3.Error, OSError) as err:  # the damaged file went worse still: the new spool goes on empty
        return Salvage(moved_to=None, unreadable=str(err))
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

    def reset(self) -> None:
        """Back to no try yet: the next one may run at once."""
        self.tries, self.last, self.last_ok = 0, None, False


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
