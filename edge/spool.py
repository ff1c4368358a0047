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
  answer. Those the replay is sending or has had answered (``sending``) go last:
  they are not lost. An item larger than the whole cap is refused (``put`` -> False).
* **age** (``max_age_s``): items older than this are expired on ``put``,
  ``peek`` and ``expire(now)``. Age is not read from the wall clock alone, which an
  RTC-less Jetson starts at 1970 and NTP later steps by decades: each item keeps the
  monotonic time and the boot id (``/proc/sys/kernel/random/boot_id``) of its ``put``.
  An item of the current boot ages by the monotonic clock. An item of an earlier boot
  is at least as old as this boot, and older by its wall stamp only when both that stamp and
  the wall clock now are plausible (an item of a spool written before these columns existed,
  which may be of this boot, since the package upgrades without a reboot, by that alone): after ``PLAUSIBLE_WALL_S``, and taken while the kernel said the clock was
  synchronized (``clock_synchronized``; an item put while it was not gets no wall stamp,
  ``created`` 0). A clock that looks plausible can still be days behind: systemd starts an
  RTC-less board at the time timesyncd saved at its last sync, or at its own build date,
  and an item spooled then, before NTP, read as days old after a reboot and expired at
  once. On a bogus clock an item is not expired early, and the byte cap still bounds the
  spool. ``stats().oldest_age_s`` uses the same rule.

The drop counters are persisted in the same database, so they survive
restarts. All methods are thread-safe (one connection behind a lock).

**A full disk** (docs/records.md, "When the spool's disk is full"): in WAL mode
a full filesystem is a trap, since deleting items and checkpointing the WAL need
free space too, so once the disk is full nothing could ever be acknowledged
again. The spool therefore keeps ``reserve_bytes`` of its filesystem free:
``put`` raises ``SpoolFull`` (nothing stored) when the free space, counting the
database's own free pages, would drop below it, and the WAL is checkpointed
every ``WAL_AUTOCHECKPOINT_PAGES`` pages so that the reserve always covers a
checkpoint. When another process fills the disk anyway, SQLite's
``SQLITE_FULL`` is raised as ``SpoolFull`` too, after the transaction was rolled
back: items already spooled are never lost by a failed write. ``ack_many``
raises ``SpoolError`` when it cannot delete; the caller keeps the ids and tries
again (see ``edge.escalating``). Acknowledgements are written ``ACK_CHUNK`` items
per transaction, so that one never needs more WAL than the reserve holds: a delete writes
the table's pages, not the payload's, since ``use_wal`` sets ``secure_delete`` to FAST (the
Debian build's default, on, wrote every deleted payload to the WAL). Opening a spool that is a folder, corrupt or
unwritable raises ``SpoolError`` naming the path and what to do.

**A damaged file** (a bad flash block, a torn write): opening runs ``PRAGMA quick_check``,
which reads every page of the file, indexes included, and checks each b-tree page's
structure (not that the indexes hold the table's rows, which ``integrity_check`` adds:
damage of that kind shows at runtime, below). It costs one read of every page, in
b-tree order rather than file order. ``bench/spool.py`` on a full spool at the default
256 MiB cap (7,188 items of 37 kB): 0.07 s with the file in the page cache, 1.6 s from a
cold cache on the build host's disk (where reading the file sequentially takes 0.3 s), once
per start; not measured on an SD card (``--dir`` runs the bench there). A damaged file is
refused at open (``SpoolCorrupt``; the daemon opens its spool through
``edge.spool_salvage.open_spool``, which moves it aside and salvages what it can read into a
new file). Damage that shows only later
(SQLite's "database disk image is malformed" or "file is not a database" from any call, or
an item ``peek`` reads back as garbage: a torn overflow page passes ``quick_check``; ``sound_item``)
raises ``SpoolCorrupt`` too, and from then on every read or write raises it at once
without touching the file (``nack`` and ``close`` stay best effort): nothing more is
written into a damaged file, and the caller stops retrying. ``replace_damaged_file`` then
gives the open spool a new file at its path (the damaged one moved aside), so that the
daemon salvages it without a restart (``edge.spool_salvage.salvage_in_use``); ``generation``
counts those new files. ``adopt`` records in the same transaction how far the copy from a
moved file got (table ``salvaged_from``), so that a copy stopped by a kill, a stop of the
daemon or a full disk goes on from there (``salvage_progress``; ``salvage_finished`` records a
finished one); ``raise_ids`` numbers new items above a moved file's ids before its copy, and
``adopt`` gives an item whose id another key took a new one, so that no copied item is lost
to an id. Every other SQLite error of any call is a ``SpoolError`` naming the path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import (
    AbstractSet,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from edgewise.errors import EdgewiseError
from edgewise.observability import LogThrottle

log = logging.getLogger(__name__)

#: WAL pages between automatic checkpoints (SQLite's default is 1000 = 4 MB at 4 KiB pages);
#: a small WAL keeps the space a checkpoint needs inside the reserve.
WAL_AUTOCHECKPOINT_PAGES = 64
#: Free space kept on the spool's filesystem: room for two checkpoints' worth of WAL.
RESERVE_BYTES = 512 * 1024
#: Items acknowledged per transaction: a delete writes about two pages per item to the
#: WAL, so a chunk stays well inside the reserve.
ACK_CHUNK = 16
#: host parameters in one statement: SQLite before 3.32 (JetPack 5's 3.31) refuses more than 999
MAX_SQL_VARIABLES = 500
#: At most one log line about evictions at the byte cap per this many seconds.
EVICT_LOG_INTERVAL_S = 15.0

#: ``<spool file><this>``: left by a spool that found its file damaged while in use, so the
#: next start salvages it (``edge.spool_salvage``).
DAMAGE_MARKER_SUFFIX = ".damaged"
#: An item's columns as ``adopt`` and the copy of a deleted file take them.
ITEM_COLUMNS = "id, key, payload, meta, created, size, attempts, mono, boot"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    key      TEXT NOT NULL UNIQUE,
    payload  BLOB NOT NULL,
    meta     TEXT NOT NULL,
    created  REAL NOT NULL,
    size     INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    mono     REAL,
    boot     TEXT
);
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""

#: How far the copy from each moved damaged file got (``adopt``): made by the first copy into a
#: file, not at open (an older spool on a full disk still opens).
_PROGRESS_TABLE = "CREATE TABLE IF NOT EXISTS salvaged_from (source TEXT PRIMARY KEY, last_id INTEGER NOT NULL)"

#: ``salvaged_from.last_id`` of a copy that finished: named again, it copies nothing.
SALVAGE_DONE = 1 << 62
#: The highest item id taken from a damaged file's own sequence: above it the number is
#: garbage (a flipped bit), and numbering new items after it would exhaust SQLite's ids.
MAX_PLAUSIBLE_ID = 1 << 53

#: Columns added after the first release, as (name, type); older spools get them by
#: ALTER TABLE at open, NULL in their rows (aged by their wall stamp alone: ``_EXPIRED``).
_ADDED_COLUMNS = (("mono", "REAL"), ("boot", "TEXT"))
#: The columns of the first release: a table ``items`` without them is not a spool.
_BASE_COLUMNS = frozenset({"id", "key", "payload", "meta", "created", "size", "attempts"})

#: A wall clock before this (2020-01-01 UTC) is not set (a board without RTC starts at 1970):
#: wall stamps are compared only when both are after it.
PLAUSIBLE_WALL_S = 1577836800.0
#: Where Linux publishes the id of the current boot.
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

#: An item of the current boot (it has a monotonic stamp of this boot); always 0 or 1.
_SAME_BOOT = "(boot IS NOT NULL AND mono IS NOT NULL AND boot = :boot)"
#: Items past the age cap: the current boot's by the monotonic clock, earlier boots' by
#: this boot's uptime or, when both are plausible, by their wall stamp. An item of a release
#: that kept no boot id (``boot`` NULL) may be of this boot: the package upgrades in place,
#: without a reboot, so it ages by its wall stamp alone (this boot's uptime expired every item
#: of a device up longer than the cap at the upgrade, items spooled a minute before).
_EXPIRED = (
    f"(({_SAME_BOOT} AND mono < :mono_cut) OR (NOT {_SAME_BOOT} AND "
    "((:uptime_over AND boot IS NOT NULL) OR (:wall_ok AND created >= :floor AND created < :wall_cut))))"
)

_COUNTERS = (
    "dropped_bytes_cap",
    "dropped_age_cap",
    "dropped_bytes_cap_bytes",
    "dropped_age_cap_bytes",
    "refused_too_large",
)


class SpoolError(EdgewiseError):
    """The spool file cannot be opened or written; the message names the path."""


class SpoolFull(SpoolError):
    """The spool's filesystem has no room for this item (nothing was stored)."""


class SpoolCorrupt(SpoolError):
    """The spool's file is damaged (SQLite found a malformed page); the message names the
    file. ``edge.spool_salvage.open_spool`` moves such a file aside and salvages it at open,
    ``edge.spool_salvage.salvage_in_use`` when found in use."""


#: seconds a spool call waits for a lock another connection holds (SQLite's busy timeout)
SPOOL_BUSY_TIMEOUT_S = 30.0
#: a write waits for a lock another process holds in slices this long, so that a stop
#: (``Spool.stop_by``, ``edge.outbox.Outbox.stop_by``) ends the wait within one slice instead of
#: SQLite's whole busy timeout
BUSY_SLICE_S = 0.1


def use_wal(db: sqlite3.Connection, synchronous: str) -> None:
    """Write-ahead logging with ``synchronous`` and a checkpoint every
    :data:`WAL_AUTOCHECKPOINT_PAGES` pages: the one set-up of the spool and of the SQLite file
    beside it (the MQTT sink's outbox). SQLite's default checkpoint, at 1000 pages, lets a WAL
    grow to 4 MB, eight times the reserve.

    ``secure_delete`` is FAST: Debian's and Ubuntu's SQLite (JetPack's too) are built with it
    on, which overwrites every page a delete frees with zeros, through the WAL. Acknowledging
    8 spooled 40 KB frames then wrote 346 KB of WAL instead of 20 KB, and on a full disk the
    acknowledgements after an outage outgrew the reserve and failed at every round, so the
    spool never drained (``ACK_CHUNK`` items of a whole 1080p frame each are megabytes). FAST
    still zeroes what a delete leaves on the table's own pages (keys, metadata) where that
    costs no extra write; the pages of a deleted payload keep their bytes until SQLite reuses
    them."""
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    db.execute("PRAGMA secure_delete=FAST")


def wal_working_bytes(db: sqlite3.Connection) -> int:
    """What a SQLite file set up by :func:`use_wal` may still take on its filesystem without
    storing anything more: the WAL's growth up to the checkpoint (plus the transaction that
    crosses it, 16 pages) and the database's as the checkpoint copies in what the WAL holds,
    together at most the WAL's bound, since a page the WAL already holds is no growth of it. A file
    beside the spool counts it before storing a live record: the deletes its acknowledgements
    write are not checked against the reserve (they free space, later), and took up to 36 KiB
    of a 96 KiB reserve in a test (its WAL, at SQLite's default checkpoint, up to 4 MB)."""
    page = int(db.execute("PRAGMA page_size").fetchone()[0])
    return (WAL_AUTOCHECKPOINT_PAGES + 16) * page


def free_bytes(folder: Union[str, Path]) -> Optional[int]:
    """Bytes this user may still write on ``folder``'s filesystem; None when unknown."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def short_of_room(folder: Union[str, Path], size: int, reserve_bytes: int, reusable: int = 0) -> Optional[int]:
    """The bytes free on ``folder``'s filesystem (counting ``reusable``: free pages a SQLite
    file already holds) when storing ``size`` more bytes there would leave fewer than
    ``reserve_bytes`` free; None when it would not, or when that cannot be told (the write will
    say). The one rule by which the spool and the durable sinks beside it keep the spool's reserve."""
    on_disk = free_bytes(folder)
    if on_disk is None:
        return None
    free = on_disk + reusable
    return free if free - size < reserve_bytes else None


def reusable_bytes(db: sqlite3.Connection) -> int:
    """Bytes of free pages inside a SQLite file (``PRAGMA freelist_count``): space a write reuses
    before the file grows."""
    page = int(db.execute("PRAGMA page_size").fetchone()[0])
    return int(db.execute("PRAGMA freelist_count").fetchone()[0]) * page


def read_only(folder: Union[str, Path]) -> bool:
    """``folder`` lies on a filesystem mounted read-only."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def disk_full(exc: OSError) -> bool:
    """Whether a failed write means no room: the filesystem is full, or the daemon's quota."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def write_advice(folder: Union[str, Path], exc: OSError) -> str:
    """What the operator does about ``exc``, met writing in the spool's ``folder``: "its
    filesystem is full; ...", "its filesystem is mounted read-only; ..." or "make its folder
    writable by the daemon"."""
    if disk_full(exc):
        return "its filesystem is full; free space there or set spool.path to another filesystem"
    if exc.errno == errno.EROFS or read_only(folder):
        return ("its filesystem is mounted read-only (remounted so after I/O errors? `dmesg` says); remount it "
                "read-write, or set spool.path to a writable filesystem (e.g. /var/lib/edgewise)")
    return "make its folder writable by the daemon"


def read_boot_id(path: str = BOOT_ID_PATH) -> Optional[str]:
    """The kernel's id of the current boot; None when it cannot be read (not Linux)."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None


#: what ``adjtimex`` returns while the kernel's clock is not synchronized (``STA_UNSYNC``:
#: never set by NTP since boot, stepped by hand, or drifted past its error bound)
_TIME_ERROR = 5
#: bytes given to ``adjtimex`` (its ``struct timex`` is 208 on 64-bit Linux); all zero, so
#: ``modes`` is 0: a read, allowed without CAP_SYS_TIME
_TIMEX_BYTES = 512
_adjtimex: Optional[Callable[..., int]] = None


def clock_synchronized() -> Optional[bool]:
    """Whether the kernel says the wall clock is synchronized (what ``timedatectl`` shows as
    "System clock synchronized": set by systemd-timesyncd, or chrony with ``rtcsync``); None
    where that cannot be asked (not Linux)."""
    global _adjtimex
    try:
        if _adjtimex is None:
            _adjtimex = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).adjtimex
        state = int(_adjtimex(ctypes.create_string_buffer(_TIMEX_BYTES)))
    except (OSError, AttributeError):
        return None
    return None if state < 0 else state != _TIME_ERROR


@dataclass(frozen=True)
class _Now:
    """The clocks at one call: wall time (``synced``: the kernel said it was synchronized),
    monotonic time, and this boot's id and start (in monotonic time)."""

    wall: float
    mono: float
    boot: str
    boot_start: float
    synced: bool

    @property
    def stamp(self) -> float:
        """The wall stamp an item put now keeps: the wall time, or 0 (below
        ``PLAUSIBLE_WALL_S``: no stamp) when the kernel did not say it was synchronized."""
        return self.wall if self.synced else 0.0

    def params(self, max_age_s: float) -> Dict[str, Any]:
        """Bind values for ``_EXPIRED`` and ``_SAME_BOOT``."""
        return {
            "boot": self.boot,
            "mono_cut": self.mono - max_age_s,
            "uptime_over": int(self.mono - self.boot_start > max_age_s),
            "wall_ok": int(self.synced and self.wall >= PLAUSIBLE_WALL_S),
            "floor": PLAUSIBLE_WALL_S,
            "wall_cut": self.wall - max_age_s,
        }


def _is_full(exc: sqlite3.Error) -> bool:
    """SQLITE_FULL (Python 3.8 has no ``sqlite_errorcode``: match SQLite's message)."""
    return "full" in str(exc).lower()


def is_busy(exc: sqlite3.Error) -> bool:
    """SQLITE_BUSY / SQLITE_LOCKED: another connection holds the lock (by message, as ``_is_full``)."""
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def is_corrupt(exc: sqlite3.Error) -> bool:
    """SQLITE_CORRUPT ("database disk image is malformed") or SQLITE_NOTADB ("file is not a
    database"), by message as in ``_is_full``; not a full disk or an I/O error."""
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "corrupt" in text


def _raise_sequence(db: sqlite3.Connection, top: int) -> None:
    """Number the items inserted from now on above ``top`` (SQLite's AUTOINCREMENT counter)."""
    if db.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'items'", (top,)).rowcount == 0:
        db.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('items', ?)", (top,))


def _is_open(db: sqlite3.Connection) -> bool:
    """Whether ``db`` was not closed yet."""
    try:
        db.total_changes  # noqa: B018 - raises on a closed connection
    except sqlite3.ProgrammingError:
        return False
    return True


def quick_check(db: sqlite3.Connection) -> List[str]:
    """What ``PRAGMA quick_check`` finds wrong with the file, first problems first (one
    line each); empty when it is sound. Costs one read of the whole file (module doc)."""
    rows = db.execute("PRAGMA quick_check(3)").fetchall()
    return [" ".join(str(r[0]).replace("*** in database main ***", "").split()) for r in rows if str(r[0]) != "ok"]


def _count_items(db: sqlite3.Connection) -> Optional[int]:
    """How many rows ``items`` of a damaged file seems to hold (its table, not an index);
    None when that cannot be read either."""
    try:
        return int(db.execute("SELECT COUNT(*) FROM items NOT INDEXED").fetchone()[0])
    except sqlite3.Error:
        return None


def _has_progress(db: sqlite3.Connection) -> bool:
    """Whether the file has the table ``adopt`` records a salvage's progress in."""
    row = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'salvaged_from'").fetchone()
    return row is not None


def _merge_progress(db: sqlite3.Connection, progress: Dict[str, int]) -> None:
    """Record how far copies from moved files got (inside a transaction, ``salvaged_from``
    made), the higher id kept per file (no UPSERT: SQLite 3.22 on the Jetson's Ubuntu 18.04)."""
    for source, last in progress.items():
        db.execute("INSERT OR IGNORE INTO salvaged_from(source, last_id) VALUES (?, ?)", (source, last))
        db.execute("UPDATE salvaged_from SET last_id = MAX(last_id, ?) WHERE source = ?", (last, source))


def _insert_items(db: sqlite3.Connection, rows: Sequence[Tuple[Any, ...]]) -> None:
    """Insert items read as ``ITEM_COLUMNS`` (inside a transaction); ids or keys already
    present are skipped."""
    db.executemany(f"INSERT OR IGNORE INTO items({ITEM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   [tuple(r) for r in rows])


#: The index the caps and stats read instead of the table: every column they ask for, so
#: SQLite answers them from this small b-tree. Read from the table, ``boot``, ``mono``,
#: ``created`` and ``size`` sit after each row's payload, on its overflow pages, so every
#: query over all items read the whole file: at the 256 MiB cap about 20 ms per ``put``
#: and 40 ms per ``stats`` on the build host, for every escalation of an outage.
AGE_INDEX = "items_age"
#: Spools of earlier versions have this index on ``created``, which no query uses now.
_OLD_INDEX = "items_created"


def _add_age_index(db: sqlite3.Connection, path: Path) -> None:
    """Create ``AGE_INDEX`` (once per file: it reads every row) and drop ``_OLD_INDEX``. On
    a full disk the spool works without it, slower, and the next start tries again."""
    try:
        db.execute(f"CREATE INDEX IF NOT EXISTS {AGE_INDEX} ON items(boot, mono, created, size)")
        db.execute(f"DROP INDEX IF EXISTS {_OLD_INDEX}")
    except sqlite3.OperationalError as exc:
        if not _is_full(exc):
            raise
        log.warning("spool %s: no room to index it (%s); it works without the index, slower with many "
                    "items, until a start finds room", path, exc)


def _upgrade(db: sqlite3.Connection, path: Path) -> None:
    """Give a spool written by an earlier version the columns added since (NULL in its rows)
    and ``AGE_INDEX``. A table ``items`` that is not a spool's is left alone (its queries
    then fail and ``_open_error`` says so)."""
    have = {str(r[1]) for r in db.execute("PRAGMA table_info(items)")}
    if not _BASE_COLUMNS <= have:
        return
    for name, kind in _ADDED_COLUMNS:
        if name in have:
            continue
        try:
            db.execute(f"ALTER TABLE items ADD COLUMN {name} {kind}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):  # another process added it meanwhile
                raise
    _add_age_index(db, path)


@dataclass(frozen=True)
class SpoolItem:
    """One spooled escalation, as stored."""

    id: int
    key: str
    payload: bytes
    meta: Dict[str, Any]
    created: float
    attempts: int = 0


def sound_item(row: Sequence[object]) -> bool:
    """Whether a row of ``items`` read as ``ITEM_COLUMNS`` (its first seven columns) holds what
    the spool wrote: the types of every column and a JSON object for ``meta``. A page torn by a
    power cut or a bad block can leave a row whose b-tree ``PRAGMA quick_check`` finds sound but
    whose bytes are zeros (an item's overflow page, where its ``meta`` lies, half written): such a
    row is damage, not an item. The one rule for ``Spool.peek`` and the salvage's copy."""
    item_id, key, payload, meta, created, size, attempts = row[:7]
    if not (isinstance(item_id, int) and isinstance(key, str) and key and isinstance(payload, bytes)
            and isinstance(meta, str) and isinstance(created, (int, float)) and isinstance(size, int)
            and isinstance(attempts, int)):
        return False
    try:
        return isinstance(json.loads(meta), dict)
    except (ValueError, RecursionError):  # garbage nested past the decoder's depth is garbage too
        return False


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
    #: the spool's ``generation`` when read: the drop counters start at 0 in each new file
    generation: int = 0


class Spool:
    """A durable FIFO of escalation requests with byte and age caps."""

    def __init__(
        self,
        path: Union[str, Path],
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
        reserve_bytes: int = RESERVE_BYTES,
        monotonic: Optional[Callable[[], float]] = None,
        boot_id: Optional[str] = None,
        synchronized: Optional[Callable[[], Optional[bool]]] = None,
    ) -> None:
        """``clock`` is the wall clock and ``monotonic`` the clock items age by within a boot
        (``time.monotonic``; when only ``clock`` is injected, as tests do, it drives both and
        an explicit ``now`` stands for both). ``synchronized`` says whether the wall clock is
        synchronized (``clock_synchronized``, None: cannot be known, taken as not; with an
        injected ``clock``, always). ``boot_id`` defaults to the kernel's; where that
        cannot be read a random id per spool stands in, so items of an earlier process count
        as an earlier boot's. This boot started at monotonic 0 for the kernel's id and
        ``time.monotonic`` (Linux counts it from the boot), otherwise when the spool opened."""
        if max_bytes <= 0:
            raise ValueError(f"spool max_bytes must be > 0, got {max_bytes}")
        if max_age_s <= 0:
            raise ValueError(f"spool max_age_s must be > 0, got {max_age_s}")
        self.path = Path(path)
        self.max_bytes = int(max_bytes)
        self.max_age_s = float(max_age_s)
        self.reserve_bytes = int(reserve_bytes)
        self._clock = clock
        if monotonic is None:
            monotonic = time.monotonic if clock is time.time else clock
        self._mono = monotonic
        if synchronized is None:
            synchronized = clock_synchronized if clock is time.time else (lambda: True)
        self._synchronized = synchronized
        kernel_boot = read_boot_id() if boot_id is None else None
        self._boot = boot_id or kernel_boot or f"process-{uuid.uuid4().hex}"
        self._boot_start = 0.0 if kernel_boot is not None and monotonic is time.monotonic else monotonic()
        self._lock = threading.Lock()
        #: ``time.monotonic()`` after which ``put`` refuses at once (set at shutdown, when the
        #: spool stayed busy past the grace: each waiting put could otherwise wait out SQLite's
        #: busy timeout in turn)
        self.stop_by: Optional[float] = None
        #: why the file is damaged, once SQLite said so (every call raises ``SpoolCorrupt`` then)
        self.damaged: Optional[str] = None
        #: SQLite's own words about that damage ("database disk image is malformed")
        self.damage_cause: Optional[str] = None
        #: files that replaced a damaged one while the spool was open (``replace_damaged_file``)
        self.generation = 0
        #: what the daemon itself kept the spool busy with (a salvage that a stop cut short),
        #: said instead of another process when a stop refuses a put
        self.busy_with: Optional[str] = None
        #: ids acknowledged while not in the file during an unfinished salvage copy (``copy_pending``):
        #: replays delivered before the copy reached them, which ``adopt`` then leaves out
        self._acked_absent: Set[int] = set()
        self._copy_pending = False
        #: ids a replay has sent, or whose late records are written but not yet acknowledged
        #: (set by the replay loop's thread, swapped whole): the byte cap evicts others first,
        #: since these are not lost (``_evict_for``)
        self.sending: FrozenSet[int] = frozenset()
        #: the highest item id a caller was given (``peek``) or the file had handed out: a new
        #: file after damage numbers its items above it (``replace_damaged_file``)
        self._top_id = 0
        self._evict_log = LogThrottle(EVICT_LOG_INTERVAL_S, clock=monotonic)
        self._db = self._open()
        try:
            row = self._db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM items").fetchone()
        except sqlite3.Error as exc:
            self._db.close()
            raise self._open_error(exc) from None
        self._bytes = int(row[0])
        self._depth = int(row[1])

    def _open(self) -> sqlite3.Connection:
        if self.path.is_dir():
            raise SpoolError(f"spool {self.path} is a folder; set spool.path to a file in it, "
                             f"e.g. {self.path / 'spool.db'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"spool {self.path}: cannot create its folder ({exc.strerror or exc}); "
                             "create it or set spool.path") from None
        try:
            db = sqlite3.connect(str(self.path), timeout=SPOOL_BUSY_TIMEOUT_S, isolation_level=None,
                                 check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._open_error(exc) from None
        try:
            use_wal(db, "FULL")
            problems = quick_check(db)  # before anything is written into a damaged file
            if problems:
                held = _count_items(db)
                db.close()
                more = " and more" if len(problems) > 1 else ""
                raise self._unreadable(f"damaged: {problems[0]}{more}", held)
            db.executescript(_SCHEMA)
            _upgrade(db, self.path)
            for name in _COUNTERS:
                db.execute("INSERT OR IGNORE INTO counters(name, value) VALUES (?, 0)", (name,))
        except sqlite3.Error as exc:
            db.close()
            raise self._open_error(exc) from None
        return db

    def _open_error(self, exc: sqlite3.Error) -> SpoolError:
        text = str(exc)
        if "no such column" in text or "no such table" in text:  # a database, not ours (schema differs)
            return SpoolError(f"spool {self.path} is another program's database ({exc}), not a spool; set "
                              "spool.path to a file of its own, or move this one aside")
        if is_corrupt(exc):
            return self._unreadable(text, None)
        free = free_bytes(self.path.parent)
        if _is_full(exc) or (free is not None and free < self.reserve_bytes):
            # SQLite says "disk I/O error" when its -wal/-shm files find no room
            room = "" if free is None else f", {free // 1024} KiB free"
            return SpoolFull(f"spool {self.path}: its filesystem is full ({exc}{room}); free space there "
                             "or set spool.path to another filesystem")
        if read_only(self.path.parent):
            return SpoolError(f"spool {self.path}: cannot open it ({exc}): its filesystem is mounted read-only; "
                              "set spool.path to a writable filesystem (e.g. /var/lib/edgewise)")
        return SpoolError(f"spool {self.path}: cannot open it ({exc}); check that the file and its "
                          "folder are writable by the daemon, or set spool.path")

    def _unreadable(self, why: str, held: Optional[int]) -> SpoolCorrupt:
        """The refusal of a file that is not a sound spool, with how many items it held if known."""
        items = "" if held is None else f", it seemed to hold {held} escalation(s)"
        return SpoolCorrupt(f"spool {self.path} is not a readable spool ({why}){items}; move it aside to keep "
                            "its contents for inspection (a new spool is created at the next start) "
                            "or set spool.path")

    def _error(self, exc: sqlite3.Error, what: str) -> SpoolError:
        """The ``SpoolError`` for SQLite's ``exc`` in a call (``what`` failed): a damaged file
        (from now on every call raises it at once), a full disk, or another failure."""
        if is_corrupt(exc):
            return self._damage(str(exc))
        if _is_full(exc):
            return SpoolFull(f"spool {self.path}: its filesystem is full ({exc})")
        text = str(exc).lower()
        if is_busy(exc):
            hint = "; another process holds its lock (stop it)"
        elif "i/o" in text:
            hint = "; check its disk (`dmesg` shows I/O errors)"
        else:
            hint = ""
        return SpoolError(f"spool {self.path}: {what} ({exc}){hint}")

    def _damage(self, cause: str) -> SpoolCorrupt:
        """The file is damaged (``cause``): from now on every call raises the ``SpoolCorrupt``
        returned, and the next start salvages the file (``_mark_damaged``)."""
        if self.damaged is None:
            self.damaged = (f"spool {self.path} is damaged ({cause}); nothing more is spooled into it or "
                            "replayed from it until it is moved aside (kept for inspection) and the escalations "
                            "it can still read are salvaged into a new spool, which the daemon does by itself "
                            "(and at its next start)")
            self.damage_cause = cause
            self._mark_damaged(cause)
        return SpoolCorrupt(self.damaged)

    def _mark_damaged(self, why: str) -> None:
        """Leave ``<file>.damaged`` beside the file, so that the next start salvages it even
        when ``quick_check`` finds nothing (an index that lost rows); best effort."""
        try:
            self.path.with_name(self.path.name + DAMAGE_MARKER_SUFFIX).write_text(why + "\n", encoding="utf-8")
        except OSError as exc:
            log.warning("spool %s: could not mark it damaged for the next start (%s)", self.path,
                        exc.strerror or exc)

    @contextmanager
    def _guarded(self, what: str) -> Iterator[None]:
        """Around a call's queries (lock held): ``SpoolCorrupt`` at once on a damaged spool,
        and SQLite's errors as ``SpoolError`` (``_error``)."""
        if self.damaged is not None:
            raise SpoolCorrupt(self.damaged)
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc, what) from None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; on any error ROLLBACK (when SQLite has not already
        rolled back by itself, as it does on SQLITE_FULL) and raise ``SpoolError``."""
        db = self._db
        try:
            self._begin(db)
            yield db
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:  # pragma: no cover - the original error matters more
                    log.exception("spool %s: rollback failed", self.path)
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, "write failed") from None
            raise

    def _begin(self, db: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE: take the write lock, waiting up to ``SPOOL_BUSY_TIMEOUT_S`` while
        another connection holds it, in ``BUSY_SLICE_S`` slices. Past ``stop_by`` (the daemon
        stops) it is tried once without waiting, and a lock held elsewhere ends the call with
        the stop's ``SpoolError``: the acknowledgements and attempts written at shutdown, each
        waiting out SQLite's whole busy timeout in turn, kept a SIGTERM'd daemon past systemd's
        TimeoutStopSec. Every other statement keeps SQLite's busy timeout."""
        give_up = time.monotonic() + SPOOL_BUSY_TIMEOUT_S
        while True:
            now = time.monotonic()
            stopping = self.stop_by is not None and now >= self.stop_by
            wait = 0.0 if stopping else max(0.0, min(BUSY_SLICE_S, give_up - now))
            db.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() >= give_up:
                    raise
                if stopping:
                    self._check_stopping()
            finally:
                db.execute(f"PRAGMA busy_timeout = {int(SPOOL_BUSY_TIMEOUT_S * 1000)}")

    def _check_stopping(self) -> None:
        if self.stop_by is not None and time.monotonic() >= self.stop_by:
            why = self.busy_with or "another process holding its lock?"
            raise SpoolError(f"spool {self.path}: the daemon is stopping and the spool stayed busy past "
                             f"the shutdown grace ({why})")

    def _check_room(self, size: int) -> None:
        """Raise SpoolFull when storing ``size`` more bytes would eat into the reserve."""
        free = short_of_room(self.path.parent, size, self.reserve_bytes, reusable_bytes(self._db))
        if free is not None:
            raise SpoolFull(
                f"spool {self.path}: {free // 1024} KiB free on its filesystem, and "
                f"{self.reserve_bytes // 1024} KiB stay free so that spooled items can still be "
                "acknowledged; free space there or set spool.path to a bigger filesystem"
            )

    # --- writing ---------------------------------------------------------------

    def put(self, key: str, payload: bytes, meta: Optional[Dict[str, Any]] = None) -> bool:
        """Store durably; True when the item is in the spool after the call.

        A key already spooled is not stored twice (True). An item larger than
        ``max_bytes`` on its own is refused (False, counted). To make room the
        oldest items are evicted (counted, logged). Raises ``SpoolFull`` when the
        filesystem has no room left for it (see the module doc) and ``SpoolError``
        when the write fails otherwise; nothing is stored or evicted then.
        """
        # default=str: a stray non-JSON value in meta must not lose the escalation
        meta_text = json.dumps(meta or {}, sort_keys=True, separators=(",", ":"), default=str)
        size = len(payload) + len(meta_text) + len(key)
        self._check_stopping()
        with self._lock, self._guarded("write failed"):
            self._check_stopping()
            now = self._now()
            self._expire_quietly(now)
            if size > self.max_bytes:
                with self._transaction():
                    self._bump_in_tx("refused_too_large", 1)
                log.warning(
                    "spool: refused %s: %d bytes is more than the whole spool cap (%d bytes)",
                    key, size, self.max_bytes,
                )
                return False
            self._check_room(size)
            evicted = evicted_bytes = 0
            with self._transaction() as db:
                if db.execute("SELECT 1 FROM items WHERE key = ?", (key,)).fetchone():
                    return True
                evicted, evicted_bytes = self._evict_for(size)
                db.execute(
                    "INSERT INTO items(key, payload, meta, created, size, mono, boot) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (key, sqlite3.Binary(payload), meta_text, now.stamp, size, now.mono, now.boot),
                )
            self._bytes += size - evicted_bytes
            self._depth += 1 - evicted
            if evicted:  # at the cap every put evicts: one line per EVICT_LOG_INTERVAL_S
                held = self._evict_log.allow()
                if held is not None:
                    log.warning(
                        "spool: byte cap %d reached; evicted the %d oldest item(s) (%d bytes) for %s%s",
                        self.max_bytes, evicted, evicted_bytes, key,
                        f" ({held} more puts evicted since the last such line; stats() counts them all)"
                        if held else "",
                    )
            return True

    def _evict_for(self, size: int) -> Tuple[int, int]:
        """Delete oldest items until ``size`` more bytes fit (inside a transaction). Items being
        replayed (``sending``) go last: one evicted while its answer was on the way came back
        as a late record all the same, counted as evicted (a loss) and as replayed."""
        over = self._bytes + size - self.max_bytes
        if over <= 0:
            return 0, 0
        ids: List[int] = []
        freed = 0
        sending, spared = self.sending, []
        cur = self._db.execute("SELECT id, size FROM items ORDER BY id")
        try:
            for item_id, item_size in cur:
                if freed >= over:
                    break
                if int(item_id) in sending:
                    spared.append((int(item_id), int(item_size)))
                    continue
                ids.append(int(item_id))
                freed += int(item_size)
        finally:
            cur.close()
        for item_id, item_size in spared:  # nothing else left to make room with
            if freed >= over:
                break
            ids.append(item_id)
            freed += item_size
        self._db.executemany("DELETE FROM items WHERE id = ?", [(i,) for i in ids])
        self._bump_in_tx("dropped_bytes_cap", len(ids))
        self._bump_in_tx("dropped_bytes_cap_bytes", freed)
        return len(ids), freed

    # --- reading ---------------------------------------------------------------

    def peek(self, limit: int = 16, after_id: int = 0, skip: AbstractSet[int] = frozenset()) -> List[SpoolItem]:
        """Up to ``limit`` oldest items with an id above ``after_id`` and not in ``skip``, in
        insertion order (not removed). Skipped items cost a read of their id only."""
        with self._lock, self._guarded("read failed"):
            self._expire_quietly(self._now())
            limit, after_id = max(0, int(limit)), int(after_id)
            if skip:
                ids = [r[0] for r in self._db.execute("SELECT id FROM items WHERE id > ? ORDER BY id LIMIT ?",
                                                      (after_id, limit + len(skip)))]
                wanted = [i for i in ids if i not in skip][:limit]
                rows = []
                for start in range(0, len(wanted), MAX_SQL_VARIABLES):  # SQLite before 3.32 takes 999
                    part = wanted[start:start + MAX_SQL_VARIABLES]
                    rows += self._db.execute(f"SELECT {ITEM_COLUMNS} FROM items WHERE id IN "
                                             f"({','.join('?' * len(part))}) ORDER BY id", part).fetchall()
            else:
                rows = self._db.execute(f"SELECT {ITEM_COLUMNS} FROM items WHERE id > ? ORDER BY id LIMIT ?",
                                        (after_id, limit)).fetchall()
            torn = next((r for r in rows if not sound_item(r)), None)
            if torn is not None:  # (a replay that met it failed with a JSON error, at every round)
                raise self._damage(f"item {torn[0]!r} reads as garbage, a page of it torn or damaged")
            if rows:
                self._top_id = max(self._top_id, int(rows[-1][0]))
        return [SpoolItem(r[0], r[1], r[2], json.loads(r[3]), float(r[4]), r[6]) for r in rows]

    def present(self, item_ids: Sequence[int]) -> Set[int]:
        """Which of ``item_ids`` are still in the spool (not evicted, expired or acknowledged
        since they were peeked)."""
        ids = [int(i) for i in item_ids]
        found: Set[int] = set()
        with self._lock, self._guarded("read failed"):
            for start in range(0, len(ids), MAX_SQL_VARIABLES):
                part = ids[start:start + MAX_SQL_VARIABLES]
                found.update(int(r[0]) for r in self._db.execute(
                    f"SELECT id FROM items WHERE id IN ({','.join('?' * len(part))})", part))
        return found

    def ack(self, item_id: int) -> bool:
        """Delete a delivered item; False when it was already gone (expired, evicted, acked)."""
        return self.ack_many([item_id]) == 1

    def ack_many(self, item_ids: List[int]) -> int:
        """Delete several delivered items, ``ACK_CHUNK`` per fsync'd transaction (a bounded
        WAL, see the module doc); returns how many existed. Raises ``SpoolError`` when a
        delete cannot be written; the chunks before it are deleted, so a retry with the
        same ids finishes the job."""
        n = 0
        for start in range(0, len(item_ids), ACK_CHUNK):
            with self._lock, self._guarded("write failed"):
                deleted = freed = 0
                absent: List[int] = []
                with self._transaction() as db:
                    for item_id in item_ids[start:start + ACK_CHUNK]:
                        row = db.execute("SELECT size FROM items WHERE id = ?", (item_id,)).fetchone()
                        if row is None:
                            absent.append(int(item_id))
                            continue
                        db.execute("DELETE FROM items WHERE id = ?", (item_id,))
                        deleted += 1
                        freed += int(row[0])
                self._bytes -= freed
                self._depth -= deleted
                n += deleted
                if self._copy_pending:
                    self._acked_absent.update(absent)
        return n

    @property
    def copy_pending(self) -> bool:
        """A salvage's copy into this spool stopped before the end (a full disk): an acknowledged
        id not in the file yet is remembered, and ``adopt`` leaves it out, so that a replay
        delivered before the copy reached it is not sent again (this process only: a restart
        forgets them, and they are sent once more)."""
        return self._copy_pending

    @copy_pending.setter
    def copy_pending(self, pending: bool) -> None:
        with self._lock:
            self._copy_pending = pending
            if not pending:
                self._acked_absent.clear()

    def nack(self, item_id: int) -> int:
        """Record a failed delivery attempt; the item stays in place. Returns attempts (0 if
        gone). The count is best effort: on a full disk (or a damaged file) it is not written,
        and it never raises."""
        with self._lock:
            try:
                with self._guarded("write failed"), self._transaction() as db:
                    db.execute("UPDATE items SET attempts = attempts + 1 WHERE id = ?", (item_id,))
            except SpoolError as exc:
                log.debug("%s; attempt of item %d not counted", exc, item_id)
            try:
                with self._guarded("read failed"):
                    row = self._db.execute("SELECT attempts FROM items WHERE id = ?", (item_id,)).fetchone()
            except SpoolError as exc:
                log.debug("%s; attempts of item %d unknown", exc, item_id)
                return 0
            return int(row[0]) if row else 0

    # --- caps and stats -----------------------------------------------------

    def _now(self, wall: Optional[float] = None) -> _Now:
        """The clocks now; ``wall`` overrides the wall clock (and the monotonic one when a
        single injected clock drives both)."""
        if wall is None:
            wall = self._clock()
        mono = wall if self._mono is self._clock else self._mono()
        return _Now(wall=wall, mono=mono, boot=self._boot, boot_start=self._boot_start,
                    synced=self._synchronized() is True)

    def expire(self, now: Optional[float] = None) -> int:
        """Delete items older than ``max_age_s`` (see the module doc) at wall time ``now``;
        returns how many."""
        with self._lock, self._guarded("expiry failed"):
            return self._expire_locked(self._now(now))

    def _expire_quietly(self, now: _Now) -> None:
        """Expire as part of another call; a failed expiry (full disk) waits for the next one,
        a damaged file fails the call."""
        try:
            self._expire_locked(now)
        except SpoolCorrupt:
            raise
        except SpoolError as exc:
            log.warning("%s; expiry of old items postponed", exc)

    def _expire_locked(self, now: _Now) -> int:
        params = now.params(self.max_age_s)
        row = self._db.execute(
            f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM items WHERE {_EXPIRED}", params
        ).fetchone()
        n, nbytes = int(row[0]), int(row[1])
        if n == 0:
            return 0
        with self._transaction() as db:
            db.execute(f"DELETE FROM items WHERE id IN (SELECT id FROM items WHERE {_EXPIRED})", params)
            self._bump_in_tx("dropped_age_cap", n)
            self._bump_in_tx("dropped_age_cap_bytes", nbytes)
        self._bytes -= nbytes
        self._depth -= n
        log.warning("spool: expired %d item(s) (%d bytes) older than %gs", n, nbytes, self.max_age_s)
        return n

    def _bump_in_tx(self, name: str, by: int) -> None:
        if by:
            self._db.execute("UPDATE counters SET value = value + ? WHERE name = ?", (by, name))

    def stats(self, now: Optional[float] = None) -> SpoolStats:
        """Depth, bytes, age of the oldest item and the drop counters."""
        with self._lock, self._guarded("read failed"):
            oldest = self._oldest_age(self._now(now))
            counters = dict(self._db.execute("SELECT name, value FROM counters").fetchall())
            return SpoolStats(
                depth=self._depth,
                bytes=self._bytes,
                oldest_age_s=oldest,
                dropped_bytes_cap=int(counters.get("dropped_bytes_cap", 0)),
                dropped_age_cap=int(counters.get("dropped_age_cap", 0)),
                dropped_bytes_cap_bytes=int(counters.get("dropped_bytes_cap_bytes", 0)),
                dropped_age_cap_bytes=int(counters.get("dropped_age_cap_bytes", 0)),
                refused_too_large=int(counters.get("refused_too_large", 0)),
                generation=self.generation,
            )

    def _oldest_age(self, now: _Now) -> float:
        """The age of the oldest item by the rule of ``_EXPIRED`` (0 when empty)."""
        params = now.params(self.max_age_s)
        same = self._db.execute(f"SELECT MIN(mono) FROM items WHERE {_SAME_BOOT}", params).fetchone()[0]
        earlier, created = self._db.execute(
            f"SELECT COUNT(boot), MIN(CASE WHEN created >= :floor THEN created END) FROM items "
            f"WHERE NOT {_SAME_BOOT}", params,
        ).fetchone()
        age = 0.0
        if same is not None:
            age = now.mono - float(same)
        if earlier:  # (an item without a boot id may be of this boot: its wall stamp alone)
            age = max(age, now.mono - now.boot_start)
        if created is not None and params["wall_ok"]:
            age = max(age, now.wall - float(created))
        return max(0.0, age)

    def recover_if_deleted(self) -> Optional[int]:
        """When the spool's file was deleted while open (its folder removed, a cleanup job),
        what is spooled lives only in the unlinked file and is gone at the next restart: make
        a new file at ``path`` and move every item and counter into it. Returns how many items
        moved; None when the file is in place."""
        if self.path.exists():
            return None
        with self._lock:
            old = self._db
            with self._guarded("read failed"):
                items = old.execute(f"SELECT {ITEM_COLUMNS} FROM items ORDER BY id").fetchall()
                counters = old.execute("SELECT name, value FROM counters").fetchall()
                progress = (old.execute("SELECT source, last_id FROM salvaged_from").fetchall()
                            if _has_progress(old) else [])
            top = max(self._top_id, self._sequence())
            self._db = self._open()
            try:
                with self._transaction() as db:
                    _insert_items(db, items)  # with their ids: a replay in flight acks the same item
                    if top:  # new items keep being numbered above every id handed out
                        _raise_sequence(db, top)
                    db.executemany("UPDATE counters SET value = ? WHERE name = ?", [(v, n) for n, v in counters])
                    if progress:
                        db.execute(_PROGRESS_TABLE)
                        db.executemany("INSERT OR REPLACE INTO salvaged_from(source, last_id) VALUES (?, ?)", progress)
            except SpoolError:
                self._db.close()
                self._db = old  # keep the items where they are; tried again later
                raise
            old.close()
        return len(items)

    def replace_damaged_file(self, move_aside: Callable[[Path], Path]
                             ) -> Tuple[Optional[Path], Optional[sqlite3.Connection]]:
        """Give a damaged spool a new, empty file at ``path``, so that it works again without a
        restart (``edge.spool_salvage.salvage_in_use`` then copies into it what the damaged file
        still holds). The damaged file is closed, then moved aside by ``move_aside`` (which
        returns where to, the ``-wal`` and ``-shm`` beside it); returns (that path, None). When
        the damaged file was deleted while open there is nothing to move: returns (None, its
        connection), still open and the only way left to read it, which the caller closes
        ((None, None) when even that is gone).

        The new file numbers its items above every id the damaged one handed out, so that an id
        a caller still holds (a replay waiting for its acknowledgement) never names a new item.
        Its drop counters start at 0: ``generation`` goes up by one, and ``stats`` carries it.
        Raises ``SpoolError`` when the file cannot be moved aside or the new one cannot be made
        (``SpoolFull``: a full disk): the spool stays damaged, its file back in place (or, where
        it cannot be put back, where ``move_aside`` put it, said in the error)."""
        with self._lock:
            if self.damaged is None:
                raise ValueError(f"spool {self.path} is not damaged: its file is not replaced")
            self._top_id = max(self._top_id, self._sequence())
            moved: Optional[Path] = None
            old: Optional[sqlite3.Connection] = None
            if self.path.exists():
                # closed before the move: SQLite checkpoints at close and removes the WAL by its name
                self._db.close()
                try:
                    moved = move_aside(self.path)
                except OSError as exc:
                    advice = write_advice(self.path.parent, exc)
                    kind = SpoolFull if disk_full(exc) else SpoolError
                    raise kind(f"spool {self.path} is damaged and cannot be moved aside to salvage it "
                               f"({exc.strerror or exc}): {advice}") from None
            elif _is_open(self._db):
                old = self._db
            try:
                db = self._open()
                try:
                    if self._top_id:
                        db.execute("BEGIN IMMEDIATE")
                        db.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('items', ?)", (self._top_id,))
                        db.execute("COMMIT")
                except sqlite3.Error as exc:
                    db.close()
                    raise self._open_error(exc) from None
            except SpoolError as exc:
                self._discard_new_file()
                if moved is not None:
                    self._put_back(moved, exc)
                raise
            self._db = db
            self._bytes = self._depth = 0
            self.damaged = self.damage_cause = None
            self.generation += 1
            return moved, old

    def _sequence(self) -> int:
        """The highest id the (damaged) file handed out, as its ``sqlite_sequence`` says; 0
        when that cannot be read."""
        try:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'items'").fetchone()
        except sqlite3.Error:  # damaged too, or closed by an earlier try
            return 0
        seq = int(row[0]) if row and row[0] is not None else 0
        return seq if 0 <= seq < MAX_PLAUSIBLE_ID else 0  # garbage: numbering after it would exhaust the ids

    def _discard_new_file(self) -> None:
        """Remove what a new file that could not be made left at ``path`` (its ``-wal`` would
        otherwise be taken for the damaged file's when that is put back)."""
        for suffix in ("", "-wal", "-shm"):
            try:
                self.path.with_name(self.path.name + suffix).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("spool %s: could not remove %s%s (%s)", self.path, self.path.name, suffix,
                            exc.strerror or exc)

    def _put_back(self, moved: Path, why: SpoolError) -> None:
        """Move the damaged file (its ``-wal`` and ``-shm`` first) from ``moved`` back to
        ``path``, where the next start finds it; ``SpoolError`` saying so when it cannot."""
        try:
            for suffix in ("-wal", "-shm"):
                side = moved.with_name(moved.name + suffix)
                if side.exists():
                    os.replace(side, self.path.with_name(self.path.name + suffix))
            os.replace(moved, self.path)
        except OSError as exc:
            raise SpoolError(f"{why}; the damaged spool, moved to {moved}, could not be put back "
                             f"({exc.strerror or exc}): what it holds is copied from there into the new "
                             "spool at the next try, or at the next start; leave it where it is") from None

    def adopt(self, rows: Sequence[Tuple[Any, ...]], source: Optional[str] = None) -> Tuple[int, int]:
        """Store items of another spool file as they were (``ITEM_COLUMNS``: id, age and attempts
        kept, so the replay order and ages go on; a key already here is skipped), then evict the
        oldest over ``max_bytes``. An id already taken by another key (an item spooled since,
        numbered before the copy reached that id) gets a new id above all others, said in a
        WARNING: no item is dropped for its id. Returns (stored, evicted); ``SpoolFull``
        (nothing stored) when they would eat into the filesystem's reserve. Used to salvage a
        damaged file (``edge.spool_salvage``), whose name ``source`` is: the highest id of
        ``rows`` (read in id order) is then recorded in the same transaction as how far that copy
        got (``salvage_progress``), so that an item copied, replayed and acknowledged is not
        copied again when a stopped copy goes on. Ids acknowledged before they were copied
        (``copy_pending``) are left out."""
        with self._lock, self._guarded("write failed"):
            last = max((int(r[0]) for r in rows), default=0)
            if self._acked_absent:
                rows = [r for r in rows if int(r[0]) not in self._acked_absent]
            # twice: a batch goes through the WAL before the checkpoint copies it into the file
            self._check_room(2 * sum(len(r[2]) + len(r[3]) + len(r[1]) for r in rows))
            with self._transaction() as db:
                before = self._depth
                renumbered = self._insert_adopted(db, rows)
                if source is not None and last:
                    db.execute(_PROGRESS_TABLE)
                    _merge_progress(db, {source: last})
                size, depth = db.execute("SELECT COALESCE(SUM(size), 0), COUNT(*) FROM items").fetchone()
                self._bytes, self._depth = int(size), int(depth)
                stored = self._depth - before
                evicted, freed = self._evict_for(0)
                self._bytes -= freed
                self._depth -= evicted
        if renumbered:
            log.warning("spool %s: %d salvaged escalation(s) found their id taken by an escalation spooled "
                        "since (%s) and were given new ids; they are replayed after it, none is lost",
                        self.path, len(renumbered), ", ".join(f"{a} -> {b}" for a, b in renumbered[:5]))
        return stored, evicted

    def record_progress(self, progress: Dict[str, int]) -> None:
        """Merge how far copies from moved files had got (``salvage_progress``, read from a
        damaged file being salvaged into this one), the higher id kept per file."""
        with self._lock, self._guarded("write failed"), self._transaction() as db:
            db.execute(_PROGRESS_TABLE)
            _merge_progress(db, progress)

    def _insert_adopted(self, db: sqlite3.Connection, rows: Sequence[Tuple[Any, ...]]) -> List[Tuple[int, int]]:
        """Insert ``rows`` (inside ``adopt``'s transaction); a row whose id another key holds is
        inserted with a new id. Returns those (old id, new id)."""
        fresh: List[Tuple[Any, ...]] = []
        taken: List[Tuple[Any, ...]] = []
        for r in rows:
            row = db.execute("SELECT key FROM items WHERE id = ?", (r[0],)).fetchone()
            if row is None:
                fresh.append(r)
            elif row[0] != r[1]:
                taken.append(r)
        _insert_items(db, fresh)
        renumbered: List[Tuple[int, int]] = []
        for r in taken:
            if db.execute("SELECT 1 FROM items WHERE key = ?", (r[1],)).fetchone() is not None:
                continue  # copied already, under another id
            cur = db.execute(f"INSERT INTO items({ITEM_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?)",
                             tuple(r[1:]))
            renumbered.append((int(r[0]), int(cur.lastrowid or 0)))
        return renumbered

    def raise_ids(self, top: int) -> None:
        """Number the items spooled from now on above ``top`` (the highest id of a damaged file
        whose items are still to be copied in, with their ids), so that no new item takes the id
        of one not copied yet."""
        with self._lock, self._guarded("write failed"):
            self._top_id = max(self._top_id, top)
            if top <= self._sequence():
                return
            with self._transaction() as db:
                _raise_sequence(db, top)

    def salvage_progress(self, source: str) -> int:
        """The highest id of the moved file ``source`` that ``adopt`` copied into this spool; 0
        when none was; ``SALVAGE_DONE`` when that copy finished (``salvage_finished``)."""
        with self._lock, self._guarded("read failed"):
            if not _has_progress(self._db):
                return 0
            row = self._db.execute("SELECT last_id FROM salvaged_from WHERE source = ?", (source,)).fetchone()
        return int(row[0]) if row else 0

    def salvage_sources(self) -> Dict[str, int]:
        """Every moved file this spool has a copy's progress of (``salvage_progress``)."""
        with self._lock, self._guarded("read failed"):
            if not _has_progress(self._db):
                return {}
            return {str(s): int(n) for s, n in self._db.execute("SELECT source, last_id FROM salvaged_from")}

    def salvage_finished(self, source: str) -> None:
        """Record that the copy from ``source`` finished (``SALVAGE_DONE``): named again (by hand,
        in the salvage marker) it copies nothing, so nothing acknowledged comes back."""
        with self._lock, self._guarded("write failed"):
            with self._transaction() as db:
                db.execute(_PROGRESS_TABLE)
                _merge_progress(db, {source: SALVAGE_DONE})

    def forget_salvages(self, sources: Sequence[str]) -> None:
        """Drop the progress of copies from ``sources`` (moved files that are gone)."""
        if not sources:
            return
        with self._lock, self._guarded("write failed"):
            if not _has_progress(self._db):
                return
            with self._transaction() as db:
                db.executemany("DELETE FROM salvaged_from WHERE source = ?", [(s,) for s in sources])

    def last_epoch(self) -> int:
        """The newest run (``frame_seq >> 32``) among the spooled keys; -1 when none."""
        from edge.records import epoch_of_key

        with self._lock, self._guarded("read failed"):
            keys = [r[0] for r in self._db.execute("SELECT key FROM items")]
        return max((epoch_of_key(k) for k in keys), default=-1)

    def devices(self) -> Set[str]:
        """The devices whose escalations the spool holds (the first part of each key, ``device/stream/seq``)."""
        with self._lock, self._guarded("read failed"):
            keys = [r[0] for r in self._db.execute("SELECT key FROM items")]
        return {str(k).split("/", 1)[0] for k in keys}

    def __len__(self) -> int:
        return self._depth

    def close(self) -> None:
        """Close the database (a checkpoint folds the WAL into the main file; past ``stop_by``
        it does not wait for a connection elsewhere, whose lock it needs: the next open folds it)."""
        with self._lock:
            try:
                if self.stop_by is not None and time.monotonic() >= self.stop_by:
                    self._db.execute("PRAGMA busy_timeout = 0")
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:  # pragma: no cover - best effort
                pass
            self._db.close()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
