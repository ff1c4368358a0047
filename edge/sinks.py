"""Sinks of per-frame records: JSON Lines file, MQTT topic, stdout.

One ``edge.records.FrameRecord`` per frame (schema: docs/records.md): device,
stream, frame_seq, timestamps, detections with the producing model per box, the
escalation decision with its explanation and the outcome, hardness and signals,
per-stage latency, cloud round trip, and ``late`` for results that arrived from
the spool replay. ``Sinks`` serialises each record once; every sink gets the
record and those bytes.

A live record the JSON Lines file or the MQTT sink's outbox cannot take (its disk full, an I/O
error, the outbox locked by another process) is held in a bounded in-memory backlog (``HeldRecords``, :data:`BACKLOG_BYTES`, the
oldest dropped and counted beyond it) and written, in order, before the next record once the
disk takes it again; a late record is not held: its answer stays in the spool, which replays it.
At the sink's close what is held goes in for :data:`CLOSE_TIMEOUT_S` at most; every record lost
(beyond the bound, or at exit) is counted in ``edgewise_edge_sink_dropped_total``.
On the spool's filesystem the JSON Lines sink's live lines and the MQTT outbox's live records
leave the spool's reserve free (``reserve_bytes``): late records and the spool's
acknowledgements may use it.
The JSON Lines sink writes the file that is at its path (one removed or replaced while the
daemon runs is reopened) and gives a file that ends in a torn line its newline. It keeps the
idempotency keys of late records it has written (the newest ``edge.outbox.LATE_KEYS_MAX``;
reloaded from the file's tail on start), so a replay repeated after a crash between "written"
and "acknowledged" never writes a late result twice. The MQTT
sink keeps every record in a durable outbox (``edge.outbox``) until the broker
acknowledged it (a PUBACK refusing it is not an acknowledgement), so a broker outage loses nothing up to the outbox's bound, and
the outbox remembers late keys the same way (docs/records.md).
Callers: ``edge.daemon`` builds them, ``edge.pipeline`` / ``edge.escalating`` write.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import sqlite3
import stat
import sys
import threading
import time
from collections import deque
from typing import Any, BinaryIO, Callable, Deque, Dict, FrozenSet, List, Optional, Set, Tuple, Type

try:
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]

from edge import rotation
from edge.outbox import BUSY_TIMEOUT_S, LATE_KEYS_MAX, Outbox, OutboxBusy, OutboxDamaged, torn
from edge.records import FrameRecord, epoch_of_key, idempotency_key
from edge.spool import is_corrupt, short_of_room
from edgewise.errors import DeploymentError
from edgewise.filereads import kind_of
from edgewise.observability import LogThrottle
from edgewise.policy.recorded import UNDECODABLE

log = logging.getLogger(__name__)

TAIL_BYTES = 64 * 1024 * 1024
#: live lines the JSON Lines sink holds in memory while its file cannot take them (a full
#: disk): about 10 minutes of 4 streams at 10 fps with a few boxes each
BACKLOG_BYTES = 16 * 1024 * 1024
#: how long one record's write (on the event loop) puts held records in, at most; the rest go in
#: with the next records. 16 MiB of held records put at once held the loop up 8.9 s (the
#: outbox, 21,000 records of 800 bytes; the JSON Lines file fsyncs each)
DRAIN_SLICE_S = 0.05
#: a failing sink is logged at most once per this many seconds (with the count since)
LOG_EVERY_S = 10.0
#: rotated JSON Lines files the next ``Sinks.durable`` call syncs, at most (the newest; a device
#: without a spool never calls it, and the kernel writes an older file back within seconds)
UNSYNCED_ROTATED = 8
#: how long a durable sink's close takes at most: records held in memory go in until then (the
#: rest are lost, logged and counted; 16 MiB of them took 8.9 s into the outbox, and a lock
#: another process holds or a slow disk has no end), and the MQTT sink publishes what its
#: outbox holds in what is left. The daemon closes its sinks one after the other once
#: ``shutdown_grace_s`` (5 s) and the escalations' wait for the spool are over: two durable sinks add
#: 6 s at most, and the stdout sink (``StdoutSink``: records waiting for a reader) 3 s more, which
#: keeps a stop inside systemd's TimeoutStopSec=30 (``edge.settings.MAX_SHUTDOWN_GRACE_S`` counts them)
CLOSE_TIMEOUT_S = 3.0
#: records waiting for stdout's reader (``StdoutSink``), at most: beyond it the oldest are dropped
STDOUT_BACKLOG_BYTES = 16 * 1024 * 1024


class Sink(Protocol):
    """Somewhere records go; ``data`` is ``rec.to_json()``, computed once for all sinks.
    ``write`` raises when the record did not get in; ``durable``: the record is kept (a
    file, an outbox), so a replayed answer stays in the spool until every durable sink has
    taken its record."""

    name: str
    durable: bool

    def write(self, rec: FrameRecord, data: bytes) -> None: ...

    def close(self) -> None: ...


def _remember(keys: Dict[str, None], key: str) -> None:
    """Add ``key`` as the newest, forgetting the oldest beyond :data:`LATE_KEYS_MAX`."""
    keys.pop(key, None)
    keys[key] = None
    while len(keys) > LATE_KEYS_MAX:
        del keys[next(iter(keys))]


class HeldRecords:
    """Live records a durable sink could not take (its disk full, an I/O error), oldest first,
    at most :data:`BACKLOG_BYTES` (the oldest dropped and counted beyond): a live record has no
    other copy (the spool holds escalations only), so it waits here and goes in, in order,
    before the sink's next records (:data:`DRAIN_SLICE_S` of them per record, the record
    itself held behind them while some are left). ``where`` names the sink in the log.
    This is where a held record is decided lost (beyond the bound, or at exit): ``on_lost(n)``
    is called there, and only there (the daemon counts it in ``edgewise_edge_sink_dropped_total``)."""

    def __init__(self, where: str, on_lost: Optional[Callable[[int], None]] = None) -> None:
        self.where = where
        self.on_lost = on_lost
        self.items: Deque[bytes] = deque()
        self.bytes = 0
        self.dropped = 0  # lost beyond the bound since the last report in the log (each counted when lost)

    def __len__(self) -> int:
        return len(self.items)

    def _lose(self, n: int) -> None:
        if n and self.on_lost is not None:
            self.on_lost(n)

    def hold(self, data: bytes) -> None:
        self.items.append(data)
        self.bytes += len(data)
        lost = 0
        while self.bytes > BACKLOG_BYTES and len(self.items) > 1:
            self.bytes -= len(self.items.popleft())
            lost += 1
        self.dropped += lost
        self._lose(lost)

    def drain(self, put: Callable[[bytes], Any], budget_s: Optional[float] = None) -> bool:
        """``put`` held records, oldest first, for up to ``budget_s`` (None: all; two at least,
        so that the backlog shrinks while a record joins it per write); raise at the first it
        does not take. Whether none is left."""
        end = None if budget_s is None else time.monotonic() + budget_s
        done = 0
        while self.items:
            put(self.items[0])
            self.bytes -= len(self.items.popleft())
            done += 1
            if end is not None and self.items and done >= 2 and time.monotonic() >= end:
                return False
        if self.dropped:
            log.warning("%s takes records again; %d live records were lost while it could not (beyond the %d MiB "
                        "held in memory)", self.where, self.dropped, BACKLOG_BYTES >> 20)
            self.dropped = 0
        return True

    def flush_at_exit(self, put: Callable[[bytes], Any], budget_s: float,
                      errors: Tuple[Type[BaseException], ...]) -> None:
        """The sink's close: ``put`` what is held, oldest first, for up to ``budget_s``
        (:data:`CLOSE_TIMEOUT_S`: the stop must end within systemd's TimeoutStopSec); what did
        not get in by then, or when ``put`` raised one of ``errors``, is lost: said in an ERROR
        with its count, and counted (``on_lost``)."""
        try:
            if self.drain(put, budget_s):
                return
            why: str = f"not put in within the sink's close time of {budget_s:g} s"
        except errors as exc:
            why = str(exc)
        n = len(self.items)
        earlier = (f"; {self.dropped} more were lost before, beyond the {BACKLOG_BYTES >> 20} MiB held"
                   if self.dropped else "")
        log.error("%s: %d live records held in memory are lost at exit: %s%s", self.where, n, why, earlier)
        self.items.clear()
        self.bytes = 0
        self.dropped = 0
        self._lose(n)


def counter(metrics: Any, sink: str) -> Optional[Callable[[int], None]]:
    """``HeldRecords.on_lost`` of sink ``sink``: its records lost, counted in
    ``edgewise_edge_sink_dropped_total{sink}`` (``metrics``: ``EdgeMetrics``, or None: not counted)."""
    if metrics is None:
        return None
    return lambda n: metrics.sink_dropped.labels(sink).inc(n)


def reserve_refusal(reserve_bytes: int) -> OSError:
    """Why a durable sink holds a live record in memory on the spool's filesystem: it would eat
    into the spool's reserve (``edge.spool.RESERVE_BYTES``), which the spool's acknowledgements and
    late records need (on a full disk the replay otherwise asks the cloud for the same frames
    again and again)."""
    return OSError(errno.ENOSPC, f"fewer than {reserve_bytes // 1024} KiB would be left free on its filesystem, "
                                 "kept for the spool's acknowledgements and late records")


def _not_a_file(mode: int) -> str:
    """What a path the sink must not open is (a named pipe, whose open blocks until a reader
    comes; a device), or "" (a file, or a folder, whose open fails with its own error)."""
    return "" if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else kind_of(mode)


def open_appending(path: str) -> BinaryIO:
    """``sinks.jsonl`` opened to append (its folder made when missing), unbuffered (a failed
    write leaves nothing behind to flush later); one error for the daemon and ``check-config``."""
    try:
        st = os.stat(path)
    except OSError:
        pass
    else:
        kind = _not_a_file(st.st_mode)
        if kind:
            raise DeploymentError(f"sinks.jsonl {path}: is {kind}, not a file; set sinks.jsonl to a "
                                  "file (to pipe records to a program, use sinks.stdout)")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return open(path, "ab", buffering=0)
    except OSError as exc:
        raise DeploymentError(f"sinks.jsonl {path}: cannot open it for appending ({exc.strerror or exc}); "
                              "make it a writable file or set sinks.jsonl") from None


def _gone(here: Optional[os.stat_result]) -> str:
    return "removed or moved away" if here is None else "replaced"


class JsonlSink:
    """Appends one JSON object per line; flushed per record (fsync optional). With
    ``max_bytes`` the file rotates by size, ``keep`` rotated files stay, gzip'd with
    ``compress`` (``edge.rotation``). Live lines it loses (``HeldRecords``) are counted in
    ``metrics.sink_dropped`` (``EdgeMetrics``) when given; its close takes ``close_timeout_s`` at most."""

    name = "jsonl"
    durable = True

    def __init__(self, path: str, fsync: bool = False, max_bytes: int = 0, keep: int = 0,
                 compress: bool = False, reserve_bytes: int = 0, metrics: Any = None,
                 close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self.path = path
        self.close_timeout_s = close_timeout_s
        self.fsync = fsync
        #: bytes of its filesystem a live line leaves free (the spool's reserve, where the spool
        #: shares it): late lines and the spool's acknowledgements may still use them
        self.reserve_bytes = reserve_bytes
        self.max_bytes = max_bytes
        self.keep = keep
        self.f = open_appending(path)
        self._newline_due = False  # the file ends in a torn line: the next write starts with a newline
        self._path_log = LogThrottle(LOG_EVERY_S)
        self._end_torn_line()
        self.last_epoch = -1  # the newest run (frame_seq >> 32) in the file's history
        self.devices: Set[str] = set()  # the devices of the records in the file's history
        #: late keys written, oldest first; the newest :data:`edge.outbox.LATE_KEYS_MAX` are kept
        #: (a replay repeats only recent results; a device whose cloud is often away would
        #: otherwise hold every late key of its life in memory)
        self.late_keys: Dict[str, None] = self._load_late_keys()
        self.size = self.f.tell()
        self.compressor = rotation.Compressor(path, keep) if max_bytes and compress else None
        #: files rotated away and not synced since (``Sinks.durable``): lines written before a
        #: rotation are there, not in the file open now (a lock: the spool thread drops the synced)
        self._rotated: List[str] = []
        self._rotated_lock = threading.Lock()
        #: live lines not written yet (module doc)
        self.held = HeldRecords(f"sinks.jsonl {path}", counter(metrics, self.name))

    def _load_late_keys(self) -> Dict[str, None]:
        """Keys of the late records among the newest ``TAIL_BYTES`` of the file and, when it
        rotates, of the files rotated before it (a replay repeated right after a restart
        finds its first copy there), oldest first; ``last_epoch`` becomes the newest run seen
        there."""
        by_file: Dict[int, List[str]] = {}
        for age, line in rotation.history(self.path, TAIL_BYTES):
            try:
                rec = json.loads(line)
            except UNDECODABLE:  # a line torn by a crash, or nested past the decoder's depth
                continue
            if not isinstance(rec, dict):
                continue
            if isinstance(rec.get("device"), str):
                self.devices.add(rec["device"])
            seq = rec.get("frame_seq", -1)
            if isinstance(seq, int) and 0 <= seq < 1 << 64:  # (a uint64 on the wire; larger: damage)
                self.last_epoch = max(self.last_epoch, seq >> 32)
            if rec.get("late"):
                by_file.setdefault(age, []).append(idempotency_key(rec.get("device", ""), rec.get("stream", ""), seq))
        keys: Dict[str, None] = {}
        for age in sorted(by_file, reverse=True):  # the oldest file first
            for key in by_file[age]:
                _remember(keys, key)
        return keys

    def write(self, rec: FrameRecord, data: bytes) -> None:
        """Append the record's line whole, after any held back (module doc), or raise
        (OSError) leaving the file as it was: a line cut short by a full disk is cut off again,
        a live line is held in the backlog, and a late key counts as written only once its
        line is."""
        key = rec.key if rec.late else None
        if key is not None and key in self.late_keys:
            log.info("late result %s already written; duplicate replay ignored", key)
            return
        line = data + b"\n"
        try:
            room = self._room_for(self.held.bytes + (len(line) if key is None else 0))
            if key is None and not room:  # the held live lines and this one stay out of the reserve
                raise reserve_refusal(self.reserve_bytes)
            # (a late line may use the reserve; the held live lines it would follow may not)
            if room and not self.held.drain(self._append, DRAIN_SLICE_S) and key is None:
                self.held.hold(line)  # behind those still held: they go in with the next lines
                return
            self._append(line)
        except OSError:
            if key is None:
                self.held.hold(line)
            raise
        if key is not None:
            _remember(self.late_keys, key)

    def _room_for(self, size: int) -> bool:
        """Whether ``size`` more bytes of live lines leave ``reserve_bytes`` free on the file's
        filesystem: on a disk shared with the spool, live lines that took the last bytes left
        the spool unable to acknowledge what it replayed, so it replayed the same entries again
        and again while the disk stayed full (found by a probe)."""
        return not self.reserve_bytes or short_of_room(
            os.path.dirname(os.path.abspath(self.path)), size, self.reserve_bytes) is None

    def _end_torn_line(self) -> None:
        """A file that ends in a line torn by a crash or a power cut (no newline) gets one before
        the next record, so that record starts a line of its own instead of making the torn one
        longer and unreadable. The torn bytes stay: nothing a reader could use is cut away. (Only
        noted here: the newline goes out with the next line, so a full disk fails that write,
        which holds the record, rather than the daemon's start.)"""
        st = os.fstat(self.f.fileno())
        if not (stat.S_ISREG(st.st_mode) and st.st_size):
            return
        try:  # (the sink's own descriptor is write-only)
            with open(self.path, "rb") as r:
                r.seek(st.st_size - 1)
                torn = r.read(1) != b"\n"
        except OSError:
            torn = True  # unreadable: an empty line costs a reader nothing
        if torn:
            self._newline_due = True
            log.warning("sinks.jsonl %s ended in a torn line (a crash or power cut mid-write); the next record "
                        "starts on a line of its own", self.path)

    def _follow_path(self) -> bool:
        """Keep writing the file that is at ``path`` now (True), or the open one (False): one
        removed, moved away or replaced while the daemon runs (an operator's ``rm``, a logrotate
        ``create``) is reopened, not written into an unlinked file where every record is lost;
        a file truncated in place
        (``copytruncate``) is measured again. Where the path cannot be looked at or a new file
        cannot be made there (a folder without search permission, a rotation that made the new
        file another user's), the open file goes on taking records as long as it is still
        linked somewhere (a moved file), said in a throttled WARNING; an unlinked one raises
        (OSError), and the record is held."""
        mine = os.fstat(self.f.fileno())
        try:
            here: Optional[os.stat_result] = os.stat(self.path)
        except FileNotFoundError:
            here = None
        except OSError as exc:
            self._keep_writing_here(mine, f"{self.path} cannot be looked at ({exc.strerror or exc})", exc)
            return False
        if here is not None and (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev):
            self.size = mine.st_size
            return True
        kind = _not_a_file(here.st_mode) if here is not None else ""
        if kind:
            self._keep_writing_here(mine, f"{self.path} is {kind} now, not a file",
                                    OSError(errno.EINVAL, "not a regular file", self.path))
            return False
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            f = open(self.path, "ab", buffering=0)
        except OSError as exc:
            self._keep_writing_here(mine, f"{self.path} was {_gone(here)} but cannot be opened anew "
                                          f"({exc.strerror or exc})", exc)
            return False
        old, self.f = self.f, f
        try:
            old.close()
        except OSError:  # (a deferred error of a network filesystem): the new file is the sink's now
            pass
        self._newline_due = False
        self._end_torn_line()
        self.size = os.fstat(f.fileno()).st_size
        log.warning("sinks.jsonl %s was %s while the daemon wrote it; records go to the file now there",
                    self.path, _gone(here))
        return True

    def _keep_writing_here(self, mine: os.stat_result, why: str, exc: OSError) -> None:
        """Go on with the open file (``mine``) when it still has a name, else raise ``exc``."""
        if not mine.st_nlink:
            raise exc
        self.size = mine.st_size
        if self._path_log.allow() is not None:
            log.warning("sinks.jsonl %s; records go on into the file open before, under its new name or "
                        "its old one, until the path can be used", why)

    def _append(self, line: bytes) -> None:
        at_path = self._follow_path()
        if at_path and self.max_bytes and self.size and self.size + len(line) > self.max_bytes:
            self._rotate()  # (not a moved file the sink goes on with: the path holds something else)
        if self._newline_due:
            line = b"\n" + line
        view = memoryview(line)
        fd = self.f.fileno()
        try:
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            if self.fsync:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, self.size)  # no torn line for the next one to follow
            except OSError:
                pass
            raise
        self.size += len(view)
        self._newline_due = False
        if not os.fstat(fd).st_nlink:  # removed between the look at the path and the write
            self._append(line.lstrip(b"\n"))

    def _rotate(self) -> None:
        rotated = rotation.rotate(self.path)  # the open file moves with its name
        try:
            f = open(self.path, "ab", buffering=0)
        except OSError:  # no room for a new file: go on appending to the old one, under its name
            os.replace(rotated, self.path)
            raise
        old, self.f = self.f, f
        try:
            old.close()
        except OSError:
            pass
        with self._rotated_lock:
            self._rotated = [*self._rotated[1 - UNSYNCED_ROTATED:], rotated]
        self.size = 0
        if self.compressor is not None:
            self.compressor.submit(rotated)
        else:
            rotation.prune(self.path, self.keep)

    def unsynced_rotated(self) -> List[str]:
        """The files rotated away and not synced since, oldest first: ``Sinks.durable`` syncs
        them with the open one (a late line written before a rotation is in one of them)."""
        with self._rotated_lock:
            return list(self._rotated)

    def rotated_synced(self, names: List[str]) -> None:
        """(any thread) ``names`` are synced: a later ``Sinks.durable`` leaves them (a sync the
        disk refused leaves them for the next one)."""
        with self._rotated_lock:
            self._rotated = [n for n in self._rotated if n not in names]

    def close(self) -> None:
        """Write the lines held in memory, for up to ``close_timeout_s`` (``HeldRecords.flush_at_exit``);
        the gzip of rotated files gets what is left of that time, no more: a file it did not finish
        stays plain and the next start gzips it (``rotation.Compressor``). The close used to wait
        up to 20 s more for the gzip (a 64 MiB file takes seconds on a Jetson's core)."""
        end = time.monotonic() + self.close_timeout_s
        self.held.flush_at_exit(self._append, self.close_timeout_s, (OSError,))
        self.f.close()
        if self.compressor is not None and not self.compressor.close(max(0.0, end - time.monotonic())):
            log.info("sinks.jsonl %s: rotated files not gzip'd within the sink's close time stay plain; the next "
                     "start gzips them", self.path)


def _fsync_file(name: str) -> None:
    """fsync the file at ``name``; one gone is nothing to sync (gzip'd: ``rotation.compress``
    syncs the gzip before it deletes the plain file; or pruned)."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StdoutSink:
    """One JSON line per record on stdout, written by a thread of its own: a reader that falls
    behind or stops reading (a pipe nobody reads) holds up this sink only. Written on the event
    loop, a write into a full pipe stopped the whole daemon: frames, the other sinks,
    escalations, and the stop. Records wait for the reader in memory, at most
    :data:`STDOUT_BACKLOG_BYTES` (beyond it the oldest are dropped, counted by ``on_lost``, and
    the write says so: the sink is failing meanwhile). A write that fails (the reader gone:
    EPIPE) fails the records after it; one that finds a stdout a parent set non-blocking full
    (EAGAIN) waits for the reader, as into a blocking one. The close gives what waits :data:`CLOSE_TIMEOUT_S`."""

    name = "stdout"
    durable = False

    def __init__(self, on_lost: Optional[Callable[[int], None]] = None) -> None:
        self.on_lost = on_lost
        self._cond = threading.Condition()
        self._items: Deque[bytes] = deque()
        self._bytes = 0
        self._writing = False  # a record is being written (taken off ``_items``)
        self._error: Optional[OSError] = None
        self._closing = False
        self._thread: Optional[threading.Thread] = None
        self._fd = -1

    def _lose(self, n: int) -> None:
        if n and self.on_lost is not None:
            self.on_lost(n)

    def write(self, rec: FrameRecord, data: bytes) -> None:
        lost = 0
        with self._cond:
            if self._error is not None:
                raise OSError(self._error.errno, f"stdout: {self._error.strerror or self._error}")
            if self._thread is None:
                sys.stdout.flush()  # what was printed before goes first
                self._fd = sys.stdout.fileno()
                self._thread = threading.Thread(target=self._run, name="stdout-sink", daemon=True)
                self._thread.start()
            self._items.append(data + b"\n")
            self._bytes += len(data) + 1
            while self._bytes > STDOUT_BACKLOG_BYTES and len(self._items) > 1:
                self._bytes -= len(self._items.popleft())
                lost += 1
            self._cond.notify_all()
        if lost:
            self._lose(lost)
            raise OSError(errno.EAGAIN, f"stdout's reader does not keep up (stopped reading?): {lost} older "
                                        f"record(s) dropped beyond the {STDOUT_BACKLOG_BYTES >> 20} MiB held for it")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return
                data = self._items.popleft()
                self._bytes -= len(data)
                self._writing = True
            try:
                view = memoryview(data)
                while view:
                    try:
                        view = view[os.write(self._fd, view):]
                    except BlockingIOError:  # a stdout a parent set non-blocking: wait, as a blocking write does
                        select.select([], [self._fd], [], 1.0)
            except OSError as exc:
                with self._cond:
                    self._error = exc
                    # the record being written is lost too, unless a close that gave up on it counted it
                    n = len(self._items) + (1 if self._writing else 0)
                    self._items.clear()
                    self._bytes = 0
                    self._writing = False
                    self._cond.notify_all()
                self._lose(n)
                return
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def close(self) -> None:
        """Give what waits for the reader :data:`CLOSE_TIMEOUT_S`; what is left then is lost
        (said and counted). A write blocked on a reader that never comes back stays behind in
        its (daemon) thread: the stop does not wait for it."""
        end = time.monotonic() + CLOSE_TIMEOUT_S
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while (self._items or self._writing) and self._error is None:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            n = len(self._items) + (1 if self._writing and self._error is None else 0)
            self._items.clear()
            self._bytes = 0
            self._writing = False  # (counted here: a write that fails later does not count it again)
        if n:
            log.error("sinks.stdout: %d records not taken by stdout's reader within the sink's close time of %g s "
                      "are lost", n, CLOSE_TIMEOUT_S)
            self._lose(n)


#: records the MQTT sink hands to paho at once, at most (``sink_window`` bounds it further)
SINK_WINDOW = 64
#: bytes of records the MQTT sink hands to paho at once, at most (``within``): a record larger
#: than this goes alone. 64 records of a frame with 10,000 boxes (about 800 KB each) put 50 MB in
#: paho's memory at once, on a Jetson whose memory the model shares
SINK_WINDOW_BYTES = 4 * 1024 * 1024


def within(held: int, size: int, bound: int) -> bool:
    """Whether a record of ``size`` bytes may join the ``held`` bytes of records paho holds for
    the MQTT sink: they stay within ``bound`` bytes, or paho holds none (a record larger than the
    bound goes, alone)."""
    return not held or held + size <= bound


def sink_window(bound: int, window: int) -> int:
    """How many records the MQTT sink may have handed to paho at once: ``window``, but never
    all of the connection's in-flight ``bound`` (``Client.in_flight_bound``): a quarter of it
    (at least one slot, unless the bound is 1: the sink must go on) stays free for the
    escalations that share the connection. paho sends what is beyond the bound first in,
    first out, so a backlog drained after an outage (a window of 64) put every escalation
    behind up to 44 records queued in paho and 20 in flight, each record two round trips at
    QoS 2: over a slow uplink, past the escalation's deadline."""
    return max(1, min(window, bound - max(1, bound // 4)))


class MqttSink:
    """Publishes each record (JSON, QoS 1) to ``<prefix>/<device>/detections`` through
    a paho connection owned elsewhere, store-and-forward: ``write`` appends the record
    to the durable ``Outbox``; a publisher thread sends the outbox in order while the
    broker is connected and deletes each record when the broker acknowledged it.
    A late record whose key the outbox already took is not published again.

    Only a PUBACK with a reason code below 0x80 is a delivery. A record the broker refuses
    (not authorized by its ACL, over its size limit, a quota; logged, throttled, and counted
    in ``edgewise_edge_mqtt_refused_total`` by ``MqttConnection``) stays in the outbox: every
    ``retry_refused_s`` the record refused longest ago is sent again, and once one is taken
    all of them follow, oldest first, so records refused while the broker's ACL was wrong
    arrive once it is fixed (late, after the records taken meanwhile, and not necessarily in
    order: each names its frame_seq); a record refused again goes behind the others (one
    that never fits cannot hold them up), and the outbox's bound drops the oldest records
    as ever.

    Where the connection keeps its MQTT session and the broker takes QoS 2
    (``MqttConnection.exactly_once``) records go out at QoS 2, and the outbox keeps each one's
    packet identifier and PUBREC (``Outbox.hand``, ``Outbox.received``): a daemon killed with
    records in flight completes their exchanges after the restart (``Outbox.in_flight``,
    ``MqttConnection.resume``; the sink must be made before the connection starts), so the
    broker delivers each record once. At QoS 1 a record in flight at a kill may arrive twice.

    Paho holds at most ``window`` records of the sink (``sink_window``) and ``window_bytes`` of
    them (``within``: a larger record goes alone) until the broker answers them."""

    name = "mqtt"
    durable = True

    def __init__(self, conn: Any, topic: str, outbox: Outbox, metrics: Any = None,
                 close_timeout_s: float = CLOSE_TIMEOUT_S, window: int = SINK_WINDOW, retry_refused_s: float = 30.0,
                 reserve_bytes: int = 0, window_bytes: int = SINK_WINDOW_BYTES, start: bool = True) -> None:
        if window < 1 or window_bytes < 1:
            raise ValueError(f"MqttSink window ({window} records) and window_bytes ({window_bytes}) must be at "
                             "least 1: the sink hands paho nothing otherwise")
        self.conn = conn
        self.topic = topic
        self.outbox = outbox
        self.metrics = metrics
        self.close_timeout_s = close_timeout_s
        self.window = window  # records handed to paho and not yet acknowledged, at most
        self.window_bytes = window_bytes  # and their bytes, at most (``within``)
        self.retry_refused_s = retry_refused_s
        #: bytes of its filesystem a live record leaves free (the spool's reserve, where the outbox
        #: shares the spool's filesystem; late records may use it), as the JSON Lines sink
        self.reserve_bytes = reserve_bytes
        self._send_log = LogThrottle(60.0, burst=3)
        self._after_refusal = f"the record stays in the MQTT outbox and is sent again in {retry_refused_s:g} s"
        self._pending: Dict[int, int] = {}  # outbox ids handed to paho, not yet answered: their sizes
        self._refused: Dict[int, None] = {}  # outbox ids the broker refused, oldest refusal first
        self._probe: Optional[int] = None  # the refused record sent again, while it waits for its answer
        self._probe_at = 0.0  # when the next refused record may be sent again (time.monotonic)
        self._release = False  # a probe was taken: send every refused record again, oldest first
        #: outbox ids the broker took whose delete found the outbox locked (paho's thread does not
        #: wait for that lock): the publisher thread deletes them
        self._delivered: List[int] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reported_drops = 0
        self.held = HeldRecords("the MQTT sink's outbox", counter(metrics, self.name))
        self.last_epoch = max((epoch_of_key(k) for k in outbox.late_keys()), default=-1)
        conn.publishes_to(topic)
        if metrics is not None:
            conn.measure(metrics)
        #: outbox ids the last process left in flight (resumed at start, never handed over anew:
        #: their answers, or the refused records' retries, settle them)
        self._resumed: Set[int] = set()
        self._thread = threading.Thread(target=self._publisher, name="mqtt-sink", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Resume the exchanges the last process left in flight and start publishing: before the
        connection starts, once the outbox keeps its client id (``start=False`` until then, while
        the daemon waits for a lock another process holds: ``write`` takes records meanwhile).
        Called again after it failed (the daemon's ``_guarded`` start), it goes on from there: the
        exchanges already handed over are not handed again, publishing does not start twice."""
        if self._thread.ident is not None:
            return
        self._resume()
        self._show()
        self._thread.start()

    def write(self, rec: FrameRecord, data: bytes) -> None:
        """Append the record to the outbox, after any held back; a live record the outbox
        cannot take (its disk full: by default it shares the spool's, which fills in an
        outage; its lock held by another process: ``OutboxBusy``, the lock is not waited for
        on the event loop) is held (``HeldRecords``), a late one stays in the spool, which
        replays it."""
        key = rec.key if rec.late else None
        try:
            room = self.outbox.room_for(self.held.bytes + (len(data) if key is None else 0), self.reserve_bytes)
            if key is None and not room:  # as the JSON Lines sink's: live records stay out of the reserve
                raise reserve_refusal(self.reserve_bytes)
            if room and not self.held.drain(lambda d: self.outbox.put(d, None), DRAIN_SLICE_S) and key is None:
                self.held.hold(data)  # behind those still held: they go in with the next records
                return
            fresh = self.outbox.put(data, key)
        except (sqlite3.Error, OSError, OutboxBusy) as exc:
            if key is None:
                self.held.hold(data)
            if isinstance(exc, sqlite3.DatabaseError) and is_corrupt(exc):
                raise OutboxDamaged(self.outbox.path, f"{exc}; restart the daemon: its start copies what the outbox "
                                                      "still holds into a new one") from None
            raise
        finally:
            self._wake.set()
        if not fresh:
            log.info("late result %s already published; duplicate replay ignored", rec.key)
            return
        self._show()

    def _show(self) -> None:
        """The outbox's depth and the records its bound dropped since the last call, in the
        metrics. Called from the event loop (``write``), the publisher thread and ``close`` at
        once: the count not yet reported is taken under the lock, so no drop is counted twice
        (two threads used to count the same ones: 1,046 counted for 990 dropped)."""
        if self.metrics is None:
            return
        self.metrics.sink_backlog.labels(self.name).set(len(self.outbox))
        with self._lock:
            dropped = self.outbox.dropped
            new = dropped - self._reported_drops
            if new > 0:
                self._reported_drops = dropped
        if new > 0:
            self.metrics.sink_dropped.labels(self.name).inc(new)

    def _resume(self) -> None:
        """The QoS 2 exchanges the last process left open, handed to the connection before it
        starts: the broker gets each one's PUBREL or PUBLISH again, same packet identifier."""
        mids: Set[int] = set()
        for rid, mid, received, data in self.outbox.in_flight():
            if rid in self._resumed:  # by a call that failed after it (``start``)
                mids.add(mid)
                continue
            if torn(data):
                self._drop_torn(rid, data)
                continue
            if not self.conn.session_expiry_s or mid in mids or not 0 < mid <= _MAX_MID:
                # no session to complete it in, or not an id this sink gave (a second record with one id: only
                # from an outbox written before ``Outbox.hand`` kept ids unique): anew. Not waiting for a lock
                # another process holds (this runs on the daemon's event loop: 30 s a record, frames and
                # signals stalled): the record's next hand-over writes its new id over the stale one
                self._forget_mid(rid, wait_s=0)
                continue
            mids.add(mid)
            self.conn.resume(self.topic, data, mid, received, on_done=lambda refused, r=rid: self._answered(r, refused),
                             on_received=lambda got, r=rid: self.outbox.received(r, got, wait_s=0),
                             after_refusal=self._after_refusal)
            self._pending[rid] = len(data)  # (no answer comes before the connection starts)
            self._resumed.add(rid)
        if mids:
            log.info("MQTT sink: %d records were in flight when the daemon stopped; their QoS 2 exchanges "
                     "are completed, not published anew", len(mids))

    def _answered(self, rid: int, refused: Any) -> None:
        """(paho's thread, or the publisher's) The broker's answer to record ``rid``: a
        delivery deletes it from the outbox now, a refusal keeps it for a later try. Neither
        waits for a lock another process holds on the outbox: paho's thread also takes the
        escalations' answers (each record's delete held them up 30 s); a delete that found it
        locked is the publisher thread's (``_delete_delivered``)."""
        with self._lock:
            self._pending.pop(rid, None)
            probe = self._probe == rid
            if probe:
                self._probe = None
            if refused is not None:
                self._refused[rid] = None  # behind the other refused records
                self._probe_at = time.monotonic() + self.retry_refused_s
                self._release = False
            elif probe:
                self._release = True  # taken now: the broker's mind changed, the others follow
        if refused is None:
            try:
                self.outbox.ack([rid], wait_s=0)
            except OutboxBusy:
                with self._lock:
                    self._delivered.append(rid)
        else:
            self._forget_mid(rid, wait_s=0)  # the exchange ended: nothing for a restart to complete
        self._wake.set()

    def _delete_delivered(self) -> None:
        """(the publisher's thread, and close) Delete the records the broker took whose delete
        found the outbox locked, waiting for the lock (``Outbox.ack``); kept for the next try
        when it is still held."""
        with self._lock:
            rids, self._delivered = self._delivered, []
        try:
            self.outbox.ack(rids)
        except BaseException:
            with self._lock:
                self._delivered[:0] = rids
            raise

    def _forget_mid(self, rid: int, wait_s: float = BUSY_TIMEOUT_S) -> None:
        """Best effort: a restart would otherwise take record ``rid``'s ended exchange up again
        (it then sends the record once more). Left on disk, its identifier is cleared when paho
        gives it to another record (``Outbox.hand``)."""
        try:
            self.outbox.hand(rid, None, wait_s)
        except (sqlite3.Error, OSError, OutboxBusy) as exc:
            log.warning("MQTT sink: the outbox %s could not be written (%s)", self.outbox.path, exc)

    def _due_refused(self, limit: int) -> List[Tuple[int, bytes]]:
        """Refused records to send again now: the one refused longest ago (the probe) every
        ``retry_refused_s``; once a probe is taken, all of them, oldest record first."""
        with self._lock:
            if self._probe is not None or not self._refused or time.monotonic() < self._probe_at:
                return []
            if self._release:
                rids = sorted(self._refused)[:limit]
            else:
                rids = [next(iter(self._refused))]
                self._probe = rids[0]
            for rid in rids:
                del self._refused[rid]
            if not self._refused:
                self._release = False
        out = []
        for rid in rids:
            found = self.outbox.peek(rid - 1, 1)
            if found and found[0][0] == rid:
                out.append(found[0])
            else:  # dropped by the outbox's bound meanwhile
                with self._lock:
                    if self._probe == rid:
                        self._probe = None
        return out

    def _send(self, rid: int, data: bytes, again: bool = False) -> bool:
        """Hand one record to paho (``again``: a refused one); False when paho cannot take it
        now (a new record is tried again from the outbox, a refused one goes back with the
        refused)."""
        from edge.transports.mqtt import PublishRefused  # paho only where the MQTT sink is used

        mid = self.conn.reserve_mid() if self.conn.exactly_once else None
        try:
            if mid is not None or again:
                self.outbox.hand(rid, mid)  # on disk before the broker can see it
        except (sqlite3.Error, OSError, OutboxBusy) as exc:  # its disk: not sent until it can be noted
            if mid is not None:
                self.conn.release_mid(mid)
            return self._not_sent(rid, again, f"its packet identifier could not be noted in the outbox ({exc})")
        with self._lock:  # noted first: its answer may come before publish() returns
            self._pending[rid] = len(data)
        try:
            info = self.conn.publish(
                self.topic, data, on_done=lambda refused: self._answered(rid, refused),
                after_refusal=self._after_refusal, mid=mid,
                on_received=None if mid is None else lambda got: self.outbox.received(rid, got, wait_s=0))
        except PublishRefused as exc:  # over the broker's size limit: logged and counted
            self._answered(rid, exc.refusal)
            return True
        if info.rc not in (0, _NO_CONN):  # not queued by paho: try again later
            return self._not_sent(rid, again, f"rc={info.rc}")
        return True

    def _not_sent(self, rid: int, again: bool, why: str) -> bool:
        if self.conn.exactly_once:
            self._forget_mid(rid)
        with self._lock:
            self._pending.pop(rid, None)
            if again:
                self._refused[rid] = None
            if self._probe == rid:
                self._probe = None
        held = self._send_log.allow()
        if held is not None:
            log.warning("MQTT publish to %s failed: %s; retrying%s", self.topic, why,
                        f" ({held} more failures not logged)" if held else "")
        return False

    def _publisher(self) -> None:
        """(thread) Hand outbox records to paho in order. A record handed over is never
        handed over again by this process while it waits for its answer: paho itself
        re-sends what was in flight when the connection dropped. Only a refused record is
        sent again (``_due_refused``). An outbox that cannot be read (its disk) is tried
        again every half second, said once per minute."""
        last = 0
        while True:
            if self._delivered:
                try:
                    self._delete_delivered()
                except Exception as exc:
                    held = self._send_log.allow()
                    if held is not None:
                        log.warning("MQTT sink: records the broker took could not be deleted from the outbox %s "
                                    "(%s); trying again", self.outbox.path, exc,
                                    exc_info=not isinstance(exc, (sqlite3.Error, OSError, OutboxBusy)))
            self._show()
            with self._lock:
                n_pending = len(self._pending)
            if self._stop.is_set() and (not n_pending or not self.conn.connected.is_set()):
                return
            limit = sink_window(self.conn.in_flight_bound, self.window)
            if self.conn.connected.is_set() and n_pending < limit and not self._stop.is_set():
                try:
                    last = self._hand_over(last, limit - n_pending)
                except Exception as exc:
                    held = self._send_log.allow()
                    if held is not None:
                        damaged = isinstance(exc, sqlite3.DatabaseError) and is_corrupt(exc)
                        log.error("MQTT sink: the outbox %s cannot be read (%s); trying again%s", self.outbox.path,
                                  exc, "; it is damaged: restart the daemon, whose start copies what the outbox "
                                  "still holds into a new one" if damaged else "",
                                  exc_info=not isinstance(exc, (sqlite3.Error, OSError, OutboxBusy)))
            self._wake.wait(0.5)
            self._wake.clear()

    def _held_bytes(self) -> int:
        """Bytes of the records handed to paho and not yet answered."""
        with self._lock:
            return sum(self._pending.values())

    def _hand_over(self, last: int, room: int) -> int:
        """One round of the publisher, ``room`` records at most and as many bytes as ``within``
        lets paho hold: refused records due again, then new ones after ``last`` (the highest id
        handed over so far, returned)."""
        again = self._due_refused(room)
        for i, (rid, data) in enumerate(again):
            if not within(self._held_bytes(), len(data), self.window_bytes):
                with self._lock:  # not handed over: back with the refused, before any new record goes
                    self._refused.update((r, None) for r, _ in again[i:])
                    if self._probe == rid:
                        self._probe = None
                return last
            if not self._send(rid, data, again=True):
                with self._lock:  # not handed over: back with the refused
                    self._refused.update((r, None) for r, _ in again[i + 1:])
                break
            room -= 1
        held = self._held_bytes()
        for rid, data in self.outbox.peek(last, room, self._resumed,
                                          lambda taken, size: within(held + taken, size, self.window_bytes)):
            if torn(data):
                self._drop_torn(rid, data)
            elif not self._send(rid, data):
                break
            last = rid
        return last

    def _drop_torn(self, rid: int, data: bytes) -> None:
        """Record ``rid`` reads back as zeros (``edge.outbox.torn``): a page of the outbox a power
        cut or the storage left half written. Published, it reached every consumer as a record of
        NUL bytes; it is deleted from the outbox unpublished instead, said in an ERROR, and counted
        as lost (``edgewise_edge_sink_dropped_total``; the JSON Lines file, where configured, has it)."""
        log.error("MQTT sink: record %d in the outbox %s reads back as %d bytes of garbage (zeros: a page a power "
                  "cut or the storage left half written); dropped, not published. If this recurs, check the disk "
                  "(dmesg)", rid, self.outbox.path, len(data))
        if self.metrics is not None:
            self.metrics.sink_dropped.labels(self.name).inc()
        self._answered(rid, None)  # gone from the outbox as a delivered record goes

    def close(self) -> None:
        """Publish what the outbox holds for up to ``close_timeout_s`` while connected;
        the rest (refused records included) stays in the outbox for the next start. Stops the
        connection (the daemon closes its sinks last), then closes the outbox. A lock another
        process holds on the outbox is waited for until then (``Outbox.stop_by``), no longer:
        records held in memory that did not get in by then are lost, said in an ERROR with their
        count and counted (the JSON Lines file, when configured, has them)."""
        deadline = time.monotonic() + self.close_timeout_s
        self.outbox.stop_by = deadline
        self.held.flush_at_exit(lambda d: self.outbox.put(d, None, wait_s=BUSY_TIMEOUT_S), self.close_timeout_s,
                                (sqlite3.Error, OSError, OutboxBusy))
        while (len(self.outbox) > len(self._refused) and self.conn.connected.is_set()
               and time.monotonic() < deadline):
            self._wake.set()
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:  # (never started: the outbox never kept its client id)
            self._thread.join(max(0.1, deadline - time.monotonic()) + 1.0)
        if self._delivered and not self._thread.is_alive():
            try:
                self._delete_delivered()
            except (sqlite3.Error, OSError, OutboxBusy) as exc:
                log.warning("%d MQTT records the broker took could not be deleted from the outbox (%s): they are "
                            "published again at the next start", len(self._delivered), exc)
        if len(self.outbox):
            log.warning("%d MQTT records not yet acknowledged by the broker (%d of them refused); kept in %s "
                        "for the next start", len(self.outbox), len(self._refused), self.outbox.path)
        if not self._thread.is_alive():  # (else its own last round counts them)
            self._show()  # what the outbox's bound dropped while the held records went in
        self.conn.stop()  # no broker answer may come to a closed outbox: the sink is the connection's last user
        self.outbox.close()


_MAX_MID = 65535  # MQTT packet identifiers are 1..65535
_NO_CONN = 4  # paho MQTT_ERR_NO_CONN: queued by paho, sent after the reconnect


class Sinks:
    """Fan-out to every configured sink; one failing sink never stops the others."""

    def __init__(self, sinks: List[Sink], on_error: Optional[Any] = None) -> None:
        self.sinks = sinks
        self.on_error = on_error
        self._failing: Dict[str, Tuple[float, int]] = {}  # sink -> (last logged, failures since)
        #: sinks whose last write failed (a full disk, a damaged outbox): the daemon is degraded.
        #: Replaced, never changed in place: ``/healthz`` reads it from another thread
        self.failing: FrozenSet[str] = frozenset()

    def write(self, rec: FrameRecord) -> bool:
        """Give the record to every sink; whether every durable sink took it (a replay keeps
        its spooled answer until they did)."""
        data = rec.to_json()
        kept = True
        for s in self.sinks:
            try:
                s.write(rec, data)
                if s.name in self.failing:
                    self.failing = self.failing - {s.name}
            except Exception as exc:
                if s.name not in self.failing:
                    self.failing = self.failing | {s.name}
                self._log_failure(s, rec, exc)
                kept = kept and not s.durable
                if self.on_error is not None:
                    self.on_error(s.name)
        return kept

    def _log_failure(self, sink: Sink, rec: FrameRecord, exc: Exception) -> None:
        """One line per sink every LOG_EVERY_S while it fails (a full disk fails every frame)."""
        now = time.monotonic()
        last, since = self._failing.get(sink.name, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            self._failing[sink.name] = (last, since + 1)
            return
        held = getattr(sink, "held", None)
        log.warning("sink %s failed to write the record of %s: %s%s%s", sink.name, rec.key, exc,
                    f" ({since} more failures since the last report)" if since else "",
                    f"; {len(held)} live records held in memory until it takes them" if held else "")
        self._failing[sink.name] = (now, 0)

    def durable(self) -> Callable[[], None]:
        """(event loop) A call, for any thread, that fsyncs what the durable sinks hold so far:
        the JSON Lines file (unless ``sinks.fsync`` syncs each line already) and the MQTT outbox.
        The spool calls it before it acknowledges replayed escalations (``edge.escalating``): its
        delete is fsync'd, the late records were not, so a power cut soon after a replay lost
        the cloud's answers from both. The call raises ``OSError`` when the disk refuses (the
        acknowledgement then waits), and does its work once however often it is called."""
        fds: List[int] = []
        rotated: List[Tuple[JsonlSink, List[str]]] = []
        outboxes: List[Outbox] = []
        try:
            for s in self.sinks:
                if isinstance(s, JsonlSink) and not s.fsync:
                    fds.append(os.dup(s.f.fileno()))  # (the sink may rotate meanwhile: this is the file written)
                    # and the files it rotated away since the last call: a replay round takes seconds of
                    # live records, and its first late lines may be in the file rotated meanwhile
                    rotated.append((s, s.unsynced_rotated()))
                elif isinstance(s, MqttSink):
                    outboxes.append(s.outbox)
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        left = [True]

        def sync() -> None:
            if not left[0]:
                return
            left[0] = False
            try:
                for fd in fds:
                    os.fsync(fd)
                for sink, names in rotated:
                    for name in names:
                        _fsync_file(name)
                    sink.rotated_synced(names)
                for outbox in outboxes:
                    outbox.sync()
            finally:
                for fd in fds:
                    os.close(fd)

        return sync

    def last_epoch(self) -> int:
        """The newest run whose keys a sink remembers (-1: none): the next run must count
        from above it, or the sink would drop that run's late answers as repeats."""
        return max([s.last_epoch for s in self.sinks if isinstance(s, (JsonlSink, MqttSink))], default=-1)

    def devices(self) -> Set[str]:
        """The devices of the records the JSON Lines sink's history holds."""
        return set().union(*[s.devices for s in self.sinks if isinstance(s, JsonlSink)])

    def close(self) -> None:
        for s in self.sinks:
            try:
                s.close()
            except Exception:
                log.exception("closing sink %s", s.name)
