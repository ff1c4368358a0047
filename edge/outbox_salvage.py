"""Salvage of a damaged MQTT sink outbox at the daemon's start: it starts, and keeps what it can read.

A damaged outbox file (a bad flash block, a torn write on an SD card) was refused at the
start (exit 2, which systemd does not restart), so a camera's detection stopped until someone
logged in, for the sake of the records' second copy on their way to the broker. The spool
does not refuse a damaged file (``edge.spool_salvage``); nor does the outbox now.
``open_outbox``, when ``Outbox`` finds the file damaged and it is an outbox (its ``records``
table), copies what it still holds into a new file beside it (``<name>.salvage``), moves the
damaged one aside with its ``-wal`` and ``-shm`` files (``<name>.damaged-<UTC time>``, kept
for inspection; the spool's names, ``aside_name``) and renames the copy into place. A file
that is not an outbox (another program's, or one whose first page is gone) is still refused:
it is not ours to rename.

The copy reads the records, then the late keys, in id order through the tables' rowid
b-trees, around the pages that cannot be read (``DamagedTable``, the spool salvage's reader):
a damaged index loses nothing, a damaged table page the rows stored on it. Only a complete
copy is renamed: it is checkpointed into its one file, fsync'd and renamed to
``<name>.salvaged`` before anything else moves. So a start cut short (``kill -9``, a power
loss) loses nothing: a start that finds ``<name>.salvage`` discards it (the copy was cut
short; the damaged file is still in place and is copied again), and one that finds
``<name>.salvaged`` finishes the moves, whichever of the damaged file's three files had been
moved aside (the cut came between the renames).

The new outbox starts a new MQTT session (the client id is not copied): the records the
damaged one had in flight at QoS 2 are published anew, so a consumer may get those few twice.
Their packet identifiers belong to the old session, which a new one cannot complete.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Tuple, Union, cast

from edge.outbox import LATE_KEYS_MAX, OUTBOX_COLUMNS, Outbox, OutboxDamaged, OutboxError, torn
from edge.spool import disk_full, read_only
from edge.spool_salvage import DamagedTable, aside_name, fsync_dir, has_table

log = logging.getLogger(__name__)

#: ``<outbox file><this>``: the copy a salvage makes, while it is written.
COPY_SUFFIX = ".salvage"
#: ``<outbox file><this>``: the copy once complete and durable, before it takes the outbox's place.
DONE_SUFFIX = ".salvaged"


@dataclass
class OutboxSalvage:
    """What one salvage copied."""

    moved_to: Path
    records: int = 0
    late_keys: int = 0
    dropped: int = 0  # copied records over ``max_records`` (the oldest)
    lost_ranges: Tuple[Tuple[int, int], ...] = ()  # record ids that could not be read
    invalid: int = 0  # rows read whose values are not a record's (no bytes, or zeros: ``torn``)

    def describe(self) -> str:
        text = f"{self.records} record(s) and {self.late_keys} late key(s) copied"
        if self.lost_ranges:
            ids = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.lost_ranges[:5])
            text += f"; records with ids {ids}{' ...' if len(self.lost_ranges) > 5 else ''} could not be read"
        if self.invalid:
            text += f"; {self.invalid} unreadable record(s) skipped"
        if self.dropped:
            text += f"; {self.dropped} oldest dropped over sinks.mqtt_outbox_max"
        return text + "; a new MQTT session starts (records in flight at QoS 2 are published again)"


def is_outbox_file(path: Union[str, Path]) -> bool:
    """Whether ``path`` is an SQLite file with the outbox's ``records`` table (read-only)."""
    return has_table(path, "records", OUTBOX_COLUMNS)


def _records(row: Tuple[object, ...]) -> bool:
    return isinstance(row[0], int) and not torn(row[1])


def _keys(row: Tuple[object, ...]) -> bool:
    return isinstance(row[0], int) and isinstance(row[1], str)


def _copy(damaged: Path, copy: Path, max_records: int, late_keys_max: int, moved_to: Path) -> OutboxSalvage:
    """Everything readable of ``damaged`` into a new outbox at ``copy``, closed again with its
    write-ahead log checkpointed into the file and the file fsync'd (``OSError`` when the log
    could not be emptied: a full disk)."""
    result = OutboxSalvage(moved_to)
    got = {"records": 0, "keys": 0}
    records = DamagedTable(damaged, table="records", columns="id, data", valid=_records)
    try:
        keys = DamagedTable(damaged, table="late_keys", columns="rowid, key", valid=_keys, id_column="rowid")
    except sqlite3.Error:  # no late keys to read: they only guard against publishing a replay twice
        keys = None
    new = Outbox(copy, max_records, late_keys_max)
    try:
        def data() -> Iterator[bytes]:
            for row in records.rows():
                got["records"] += 1
                yield cast(bytes, row[1])  # checked by _records

        def late() -> Iterator[str]:
            for row in keys.rows() if keys is not None else ():
                got["keys"] += 1
                yield str(row[1])

        result.dropped = new.restore(data(), late())
        result.records, result.late_keys = got["records"] - result.dropped, got["keys"]
        result.lost_ranges, result.invalid = tuple(records.damaged), records.invalid
    finally:
        new.close()
        records.close()
        if keys is not None:
            keys.close()
    wal = copy.with_name(copy.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise OSError(f"its copy's write-ahead log {wal} could not be checkpointed")
    fd = os.open(str(copy), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return result


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(str(path) + suffix)
        except FileNotFoundError:
            pass


def _reason(err: BaseException) -> str:
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)


def _advice(path: Path, err: BaseException) -> str:
    """What the operator does about ``err``, met writing beside the outbox at ``path``."""
    reason = _reason(err)
    if (isinstance(err, OSError) and disk_full(err)) or "full" in reason or "checkpointed" in reason:
        return "free space there"
    if read_only(path.parent):
        return "its filesystem is mounted read-only (after I/O errors? `dmesg` says): remount it read-write"
    return "make its folder writable by the daemon"


def _put_in_place(done: Path, path: Path, target: Optional[Path] = None) -> None:
    """The complete copy ``done`` takes ``path``'s place; what is there of the damaged file (all
    of it, or the part a start cut short had not moved) goes aside first, to ``target``."""
    if any(path.with_name(path.name + suffix).exists() for suffix in ("", "-wal", "-shm")):
        target = target or aside_name(path)
        for suffix in ("-wal", "-shm", ""):  # the WAL first, as move_aside: it travels with its file
            side = path.with_name(path.name + suffix)
            if side.exists():
                os.replace(side, target.with_name(target.name + suffix))
    os.replace(done, path)
    fsync_dir(path.parent)


def open_outbox(path: Union[str, Path], max_records: int, late_keys_max: int = LATE_KEYS_MAX) -> Outbox:
    """The outbox at ``path``; a damaged one is moved aside and what it holds copied into a new
    one (module doc), said in one ERROR naming both files. ``OutboxError`` when the file is not
    an outbox, or the salvage cannot be written (a full or read-only filesystem: the message
    says what to do)."""
    path = Path(path)
    copy = path.with_name(path.name + COPY_SUFFIX)
    done = path.with_name(path.name + DONE_SUFFIX)
    _remove(copy)  # a copy cut short, if any: the damaged file is still in place
    if done.exists():  # a complete copy a start cut short had not put in place yet
        try:
            _put_in_place(done, path)
        except OSError as err:
            raise OutboxError(f"MQTT sink outbox {path}: the complete copy {done} of a damaged outbox could not be "
                              f"put in place ({_reason(err)}): {_advice(path, err)}") from None
        log.warning("MQTT sink outbox %s: a salvage cut short by a stop was finished (its complete copy put in "
                    "place)", path)
    try:
        return Outbox(path, max_records, late_keys_max)
    except OutboxDamaged as exc:
        if not is_outbox_file(path):
            raise OutboxError(f"MQTT sink outbox {path} is not a readable outbox ({exc.reason}); move it aside (a new "
                              "outbox is made at the start) or set sinks.mqtt_outbox to a file of its own") from None
        why = str(exc)
    target = aside_name(path)
    try:
        result = _copy(path, copy, max_records, late_keys_max, target)
        os.replace(copy, done)  # complete and durable: from here a start finishes the moves
        fsync_dir(path.parent)
        _put_in_place(done, path, target)
    except (OSError, sqlite3.Error, OutboxError) as err:
        if not done.exists():
            _remove(copy)
        raise OutboxError(f"{why}, and it could not be salvaged ({_reason(err)}): {_advice(path, err)}, or move the "
                          "file aside (a new outbox is made at the start), or set sinks.mqtt_outbox") from None
    log.error("%s; moved it to %s (kept for inspection) and started a new outbox at %s: %s",
              why, target, path, result.describe())
    return Outbox(path, max_records, late_keys_max)
