"""One daemon per state folder: a lock beside the spool, one beside the MQTT outbox and one
beside the JSON Lines records file, held for the daemon's life.

The spool, its start count (``<spool>.epoch``) and the MQTT outbox belong to one daemon. A
second one on the same ``spool.path`` (started by hand while the service runs, or a copied
config) would replay the same escalations twice, keep wrong byte counts for the caps, and
could move a live spool aside to salvage it. ``flock`` on ``<spool>.lock`` makes the second
start fail at once with the first one's pid; the kernel releases the lock when its process
ends, ``kill -9`` included, so a crash never leaves a stale lock behind.

The outbox has a lock of its own (``<outbox>.lock``): it is ``mqtt-outbox.db`` beside the spool
unless ``sinks.mqtt_outbox`` says otherwise, so a second daemon in the same folder under
another spool name shared it. Both ran: they took the MQTT session (its client id is kept in
the outbox) from each other at every reconnect, and each deleted the other's records, until
the outbox's count went below zero and its records were no longer written.

The JSON Lines records file (``sinks.jsonl``) has one too: two daemons with their own spools but
one records file both ran, each appending to it and each rotating it (renaming the file the other
was writing, pruning the other's rotated files). Its lock is a hidden sibling,
``.<records>.lock`` (``.records.jsonl.lock``): ``<records>.lock`` would be picked up by the glob
the docs give for the records and their rotated files (``check-policy --replay
records.jsonl*``), and read as a records file.

A lock is beside the file it guards as the kernel finds it (:func:`lock_path`: symlinks
resolved): a second daemon whose ``spool.path`` was a symlink to the first one's spool (a
spool moved to a bigger disk and linked back) took ``<link>.lock``, a file of its own, and
ran on the same SQLite database.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import List, Optional, Tuple

from edgewise.errors import ConfigError

try:  # POSIX; the daemon runs on Linux (Jetson), elsewhere it starts without the lock
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

SUFFIX = ".lock"
#: what a refused start says, by the setting that names the file the lock guards
_IN_USE = {
    "spool.path": "uses this spool.path; stop it first (`systemctl stop edgewise-edge`), or give this daemon "
                  "its own spool.path",
    "sinks.mqtt_outbox": "uses this sinks.mqtt_outbox; stop it first (`systemctl stop edgewise-edge`), or give "
                         "this daemon its own sinks.mqtt_outbox",
    "sinks.jsonl": "writes to this sinks.jsonl; stop it first (`systemctl stop edgewise-edge`), or give this "
                   "daemon its own sinks.jsonl",
}


def lock_path(guarded: str, hidden: bool = False) -> str:
    """The lock file of ``guarded`` (the spool, the outbox, the records file): ``<file>.lock``
    beside the file the path names once its symlinks are resolved, so every path to one file (a
    symlink to it, a symlinked folder, ``..``) has one lock; ``hidden`` (the records file):
    ``.<file>.lock``, which no ``<file>*`` glob picks up."""
    real = os.path.realpath(guarded)
    if hidden:
        folder, name = os.path.split(real)
        return os.path.join(folder, "." + name + SUFFIX)
    return real + SUFFIX


class InstanceLock:
    """``acquire`` takes the lock of ``spool_path``, then the one of ``outbox_path`` (the MQTT
    sink's outbox, when the daemon opens one) and the one of ``records_path`` (the JSON Lines
    sink's file, when set), or raises ``ConfigError`` naming the daemon that holds it (and keeps
    none); ``release`` (or the process's end) gives them back."""

    def __init__(self, spool_path: str, outbox_path: Optional[str] = None,
                 records_path: Optional[str] = None) -> None:
        self.path = lock_path(spool_path)
        #: (lock file, the setting that names the file it guards)
        self.locks: List[Tuple[str, str]] = [(self.path, "spool.path")]
        if outbox_path:
            self.locks.append((lock_path(outbox_path), "sinks.mqtt_outbox"))
        if records_path:
            self.locks.append((lock_path(records_path, hidden=True), "sinks.jsonl"))
        self._fds: List[int] = []

    def acquire(self) -> None:
        if fcntl is None:
            return
        try:
            for path, setting in self.locks:
                self._take(path, setting)
        except BaseException:
            self.release()
            raise

    def _take(self, path: str, setting: str) -> None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only or full folder: the spool says so; do not stop for the lock
            log.warning("cannot create the instance lock %s (%s); a second daemon on this %s would "
                        "not be refused", path, exc.strerror or exc, setting)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                log.warning("cannot lock %s (%s); a second daemon on this %s would not be refused",
                            path, exc.strerror or exc, setting)
                return
            who = f"pid {holder}" if holder else "another process"
            raise ConfigError(f"{path}: another edgewise daemon ({who}) {_IN_USE[setting]}") from None
        self._fds.append(fd)
        try:  # the pid is for the message a second daemon gives; a full disk may refuse it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass

    def release(self) -> None:
        while self._fds:
            os.close(self._fds.pop())  # closing the descriptor drops the flock


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
