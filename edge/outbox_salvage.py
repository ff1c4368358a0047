"""Salvage of a damaged MQTT sink outbox at the daemon's start: it starts, and keeps what it can read.

A damaged outbox file (a bad flash block, a torn write on an SD card) was refused at the
start (exit 2, which systemd does not restart), so a camera's detection stopped until someone
logged in, for the sake of the records' second copy on their way to the broker. The spool
does not refuse a damaged file (``edge.spool_salvage``); nor does the outbox now.
``open_outbox``, when ``Outbox`` finds the file damaged and it is an outbox (its ``records``
table), copies what it still holds into a new file beside it (``<name>.salvage``), moves the
damaged one aside with its ``-wal`` and ``-shm`` files (``<name>.damaged-<UTC time>``, kept
for inspection; the spool's names and ``move_aside``) and renames the copy into place. A file
that is not an outbox (another program's, or one whose first page is gone) is still refused:
it is not ours to rename.

The copy reads the records, then the late keys, in id order through the tables' rowid
b-trees, around the pages that cannot be read (``DamagedTable``, the spool salvage's reader):
a damaged index loses nothing, a damaged table page the rows stored on it. It is complete
before anything is moved, so a start cut short (``kill -9``, a power loss) loses nothing: a
start that finds ``<name>.salvage`` beside the outbox discards it (the copy was cut short;
the damaged file is still in place and is copied again), and one that finds it with the
outbox gone renames it into place (the cut came between the two renames).

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
from typing import Iterator, Tuple, Union, cast
from urllib.parse import quote

from edge.outbox import LATE_KEYS_MAX, Outbox, OutboxDamaged, OutboxError
from edge.spool import disk_full, read_only
from edge.spool_salvage import DamagedTable, aside_name, move_aside

log = logging.getLogger(__name__)

#: ``<outbox file><this>``: the copy a salvage makes before it takes the outbox's place.
COPY_SUFFIX = ".salvage"
#: The columns that make a ``records`` table the outbox's.
OUTBOX_COLUMNS = {"id", "data"}


@dataclass
class OutboxSalvage:
    """What one salvage copied."""

    moved_to: Path
    records: int = 0
    late_keys: int = 0
    dropped: int = 0  # copied records over ``max_records`` (the oldest)
    lost_ranges: Tuple[Tuple[int, int], ...] = ()  # record ids that could not be read

    def describe(self) -> str:
        text = f"{self.records} record(s) and {self.late_keys} late key(s) copied"
        if self.lost_ranges:
            ids = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.lost_ranges[:5])
            text += f"; records with ids {ids}{' ...' if len(self.lost_ranges) > 5 else ''} could not be read"
        if self.dropped:
            text += f"; {self.dropped} oldest dropped over sinks.mqtt_outbox_max"
        return text + "; a new MQTT session starts (records in flight at QoS 2 are published again)"


def is_outbox_file(path: Union[str, Path]) -> bool:
    """Whether ``path`` is an SQLite file with the outbox's ``records`` table (read-only)."""
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        for schema_writable in ("OFF", "ON"):  # ON: a file cut short, as edge.spool_salvage.is_spool_file
            db.execute(f"PRAGMA writable_schema = {schema_writable}")
            try:
                columns = {row[1] for row in db.execute("PRAGMA table_info(records)")}
            except sqlite3.DatabaseError:
                continue
            return OUTBOX_COLUMNS <= columns
        return False
    except sqlite3.Error:
        return False
    finally:
        db.close()


def _records(row: Tuple[object, ...]) -> bool:
    return isinstance(row[0], int) and isinstance(row[1], bytes)


def _keys(row: Tuple[object, ...]) -> bool:
    return isinstance(row[0], int) and isinstance(row[1], str)


def _copy(damaged: Path, copy: Path, max_records: int, late_keys_max: int, moved_to: Path) -> OutboxSalvage:
    """Everything readable of ``damaged`` into a new outbox at ``copy`` (closed again)."""
    result = OutboxSalvage(moved_to)
    records = DamagedTable(damaged, table="records", columns="id, data", valid=_records)
    keys = DamagedTable(damaged, table="late_keys", columns="rowid, key", valid=_keys, id_column="rowid")
    new = Outbox(copy, max_records, late_keys_max)
    try:
        got = {"records": 0, "keys": 0}

        def data() -> Iterator[bytes]:
            for row in records.rows():
                got["records"] += 1
                yield cast(bytes, row[1])  # checked by _records

        def late() -> Iterator[str]:
            try:
                for row in keys.rows():
                    got["keys"] += 1
                    yield str(row[1])
            except sqlite3.Error:  # the table itself is gone: the keys only guard against repeats
                return

        result.dropped = new.restore(data(), late())
        result.records, result.late_keys = got["records"] - result.dropped, got["keys"]
        result.lost_ranges = tuple(records.damaged)
    finally:
        new.close()
        records.close()
        keys.close()
    return result


def _fsync_dir(folder: Path) -> None:
    fd = os.open(str(folder), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(str(path) + suffix)
        except FileNotFoundError:
            pass


def open_outbox(path: Union[str, Path], max_records: int, late_keys_max: int = LATE_KEYS_MAX) -> Outbox:
    """The outbox at ``path``; a damaged one is moved aside and what it holds copied into a new
    one (module doc), said in one ERROR naming both files. ``OutboxError`` when the file is not
    an outbox, or the salvage cannot be written (a full or read-only filesystem: the message
    says what to do)."""
    path = Path(path)
    copy = path.with_name(path.name + COPY_SUFFIX)
    if copy.exists():
        if path.exists():
            _remove(copy)  # a copy cut short: the damaged file is still in place
        else:  # cut between the two renames: the copy is complete
            move_aside(copy, target=path)
            _fsync_dir(path.parent)
            log.warning("MQTT sink outbox %s: a salvage cut short by a stop was finished (its copy %s put in "
                        "place)", path, copy)
    try:
        return Outbox(path, max_records, late_keys_max)
    except OutboxDamaged as exc:
        if not is_outbox_file(path):
            raise
        why = str(exc)
    target = aside_name(path)
    try:
        result = _copy(path, copy, max_records, late_keys_max, target)
        move_aside(path, target=target)
        move_aside(copy, target=path)
        _fsync_dir(path.parent)
    except (OSError, sqlite3.Error, OutboxError) as err:
        if path.exists():
            _remove(copy)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        if (isinstance(err, OSError) and disk_full(err)) or "full" in reason:
            advice = "free space there"
        elif read_only(path.parent):
            advice = "its filesystem is mounted read-only (after I/O errors? `dmesg` says): remount it read-write"
        else:
            advice = "make its folder writable by the daemon"
        raise OutboxError(f"{why}, and it could not be salvaged ({reason}): {advice}, or move the file aside (a new "
                          "outbox is made at the start), or set sinks.mqtt_outbox") from None
    log.error("%s; moved it to %s (kept for inspection) and started a new outbox at %s: %s",
              why, target, path, result.describe())
    return Outbox(path, max_records, late_keys_max)
