"""One daemon per state folder: a lock beside the spool, held for the daemon's life.

The spool, its start count (``<spool>.epoch``) and the MQTT outbox belong to one daemon. A
second one on the same ``spool.path`` (started by hand while the service runs, or a copied
config) would replay the same escalations twice, keep wrong byte counts for the caps, and
could move a live spool aside to salvage it. ``flock`` on ``<spool>.lock`` makes the second
start fail at once with the first one's pid; the kernel releases the lock when its process
ends, ``kill -9`` included, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Optional

from edgewise.errors import ConfigError

try:  # POSIX; the daemon runs on Linux (Jetson), elsewhere it starts without the lock
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

SUFFIX = ".lock"


class InstanceLock:
    """``acquire`` takes the lock of ``spool_path`` or raises ``ConfigError`` naming the
    daemon that holds it; ``release`` (or the process's end) gives it back."""

    def __init__(self, spool_path: str) -> None:
        self.path = spool_path + SUFFIX
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        if fcntl is None:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only or full folder: the spool says so; do not stop for the lock
            log.warning("cannot create the instance lock %s (%s); a second daemon on this spool.path would "
                        "not be refused", self.path, exc.strerror or exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                log.warning("cannot lock %s (%s); a second daemon on this spool.path would not be refused",
                            self.path, exc.strerror or exc)
                return
            who = f"pid {holder}" if holder else "another process"
            raise ConfigError(f"{self.path}: another edgewise daemon ({who}) uses this spool.path; stop it first "
                              "(`systemctl stop edgewise-edge`), or give this daemon its own spool.path") from None
        self._fd = fd
        try:  # the pid is for the message a second daemon gives; a full disk may refuse it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
