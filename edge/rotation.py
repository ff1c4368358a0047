"""Size-based rotation of the JSON Lines sink, for a device whose disk is a 16 GB eMMC.

At 15 fps a stream writes about 1.1 GB of records a day (850 bytes each, without boxes),
which fills a Xavier NX's eMMC in days. The sink closes its file when the next record would
pass ``sinks.jsonl_max_bytes`` and renames it ``<path>.<UTC time>`` (``logrotate``'s
``dateext`` form: existing rotated files are never renamed again, so a crash mid-rotation
leaves nothing half-named), opens a new one, and keeps the ``sinks.jsonl_keep`` newest
rotated files. Newest means the greatest name: a new name is never below the newest
existing one, whatever the clock says (after a backward step of the wall clock, on a board
without RTC, it continues one microsecond after the newest name), so that pruning never
deletes the file just rotated. With ``sinks.jsonl_compress`` a background thread gzips each rotated file
(``<name>.gz``, written aside, fsync'd and renamed into place before the plain file goes; records
compress about 14x) and a
rotated file left uncompressed by a crash is compressed at the next start, one whose gzip failed
(a full disk, the open-file limit) once a later file is gzip'd. The disk
budget per stream is in deploy/jetson/README.md ("Disk on small flash").

:func:`history` reads the newest records across the current and the rotated files,
so the sink's late-record de-duplication (keys of late results already written) survives
a rotation that happened just before a restart.
"""

from __future__ import annotations

import calendar
import errno
import gzip
import io
import logging
import os
import queue
import re
import shutil
import stat
import struct
import threading
import time
from typing import Iterator, List, Optional, Tuple

from edgewise.outputs import fsync_dir

log = logging.getLogger(__name__)

#: ``.<YYYYmmddTHHMMSS.ffffffZ>[-N][.gz]``; the fraction is optional: daemons before
#: 2026-12-01 named rotated files to the second (``.20261130T120000Z``), and after an upgrade
#: those are still this sink's files, pruned by ``jsonl_keep`` and read for late keys
_SUFFIX = re.compile(r"\.(\d{8}T\d{6}(?:\.\d{6})?Z)(?:-(\d+))?(\.gz)?$")


def rotated_files(path: str) -> List[str]:
    """The rotated files of ``path``, newest first: the names ``rotate`` writes, whose time is a
    real one. Another file named like them (``<path>.20261399T...``, a hand-made copy) is not
    ours: never pruned nor read, and no new name continues after it (a time that does not parse
    made every rotation raise, and the sink lost each record from then on)."""
    folder, base = os.path.split(os.path.abspath(path))
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if name.startswith(base + "."):
            m = _SUFFIX.match(name[len(base):])
            if m and _is_time(m.group(1)):
                found.append((_stamp_us(m.group(1)), int(m.group(2) or 0), os.path.join(folder, name)))
    return [f for _, _, f in sorted(found, reverse=True)]


#: Rotated names stay before year 9999: a name continues one microsecond after the newest, and
#: one after ``99991231T235959.999999Z`` would need a fifth year digit, which ``_SUFFIX`` and
#: ``strptime`` do not read (those files were never pruned).
_LAST_US = calendar.timegm((9999, 1, 1, 0, 0, 0)) * 1_000_000


def _is_time(stamp: str) -> bool:
    try:
        return _stamp_us(stamp) < _LAST_US
    except ValueError:
        return False


def _stamp_us(stamp: str) -> int:
    """Microseconds since the epoch of a rotated name's ``YYYYmmddTHHMMSS.ffffffZ`` (or an older
    daemon's ``YYYYmmddTHHMMSSZ``: at the second's start)."""
    return calendar.timegm(time.strptime(stamp[:15], "%Y%m%dT%H%M%S")) * 1_000_000 + int(stamp[16:22] or 0)


def _format_us(us: int) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(us // 1_000_000)) + f".{us % 1_000_000:06d}Z"


def next_stamp(now: float, newest: Optional[str]) -> str:
    """The stamp for a file rotated at ``now``: its UTC time to the microsecond, or one
    microsecond after the ``newest`` existing stamp when the clock is not past it."""
    us = int(now * 1_000_000)
    if newest is not None:
        us = max(us, _stamp_us(newest) + 1)
    return _format_us(us)


def _newest_stamp(path: str) -> Optional[str]:
    newest = rotated_files(path)[:1]
    if not newest:
        return None
    m = _SUFFIX.search(newest[0])
    return m.group(1) if m else None


def rotate(path: str, now: Optional[float] = None) -> str:
    """Rename ``path`` to ``<path>.<UTC time to the microsecond>`` (``-N`` when that exists);
    the new name. Microseconds keep names unique and in order even when files rotate faster
    than once a second and older ones are pruned meanwhile (a freed name is never reused
    for a newer file); a clock behind the newest name continues after it (module doc)."""
    t = time.time() if now is None else now
    stamp = next_stamp(t, _newest_stamp(path))
    dst, n = f"{path}.{stamp}", 0
    while os.path.exists(dst) or os.path.exists(dst + ".gz"):
        n += 1
        dst = f"{path}.{stamp}-{n}"
    os.replace(path, dst)
    return dst


def prune(path: str, keep: int) -> List[str]:
    """Delete all but the ``keep`` newest rotated files; the deleted names."""
    gone = []
    for old in rotated_files(path)[keep:]:
        try:
            os.unlink(old)
            gone.append(old)
        except OSError as exc:
            log.warning("cannot delete rotated file %s: %s", old, exc)
    return gone


#: opened as a file, never through a link or as a FIFO: a link named like a rotated file had the
#: daemon copy its target (a key it may read) into a world-readable .gz, and one at the .tmp
#: name had it write over its target (found by a probe)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def compress(src: str) -> str:
    """gzip ``src`` into ``src.gz`` (via a temporary file) and delete ``src``; ``OSError`` when
    ``src`` is a link or not a regular file (a link at the temporary name is replaced). The gzip
    is fsync'd before its rename and the folder before ``src`` goes: without, a power cut within
    half a minute of a rotation could leave the ``.gz`` empty under its name (ext4 had not written
    its blocks yet) with ``src`` already deleted, a whole rotated file of records lost."""
    dst, tmp = src + ".gz", src + ".gz.tmp"
    with open(os.open(src, os.O_RDONLY | _NOFOLLOW), "rb") as fin:
        if not stat.S_ISREG(os.fstat(fin.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", src)
        if os.path.lexists(tmp):
            os.unlink(tmp)  # (a crash's leftover, or a link: made anew, never followed)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o640)
        with open(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6,
                                                  filename=os.path.basename(src)) as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.close()  # (the gzip trailer written, before the fsync)
            raw.flush()
            os.fsync(raw.fileno())
    os.replace(tmp, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))
    os.unlink(src)
    return dst


def _open_sized(f: str) -> Tuple[io.BufferedIOBase, int]:
    """``f`` opened for reading, with its uncompressed size (a gzip member's ISIZE trailer,
    RFC 1952: the size modulo 2**32; rotated files are far smaller)."""
    if f.endswith(".gz"):
        with open(f, "rb") as raw:
            raw.seek(-4, os.SEEK_END)
            size: int = struct.unpack("<I", raw.read(4))[0]
        return gzip.GzipFile(f, "rb"), size
    fh = open(f, "rb")
    return fh, os.fstat(fh.fileno()).st_size


def history(path: str, budget: int) -> Iterator[Tuple[int, bytes]]:
    """The lines of the newest ``budget`` bytes (uncompressed) of ``path`` and its rotated
    files, each with its file's age: 0 for ``path``, 1 for the newest rotated file, and so on
    (files newest first, lines within a file oldest first); a file cut by the budget starts at
    its next whole line. Streamed: a start-up costs no more memory than a line, whatever
    ``budget`` is."""
    for age, f in enumerate([path] + rotated_files(path)):
        if budget <= 0:
            return
        try:
            fh, size = _open_sized(f)
        except FileNotFoundError:  # no file yet, or pruned meanwhile
            continue
        except OSError as exc:
            log.warning("cannot read %s for late keys: %s", f, exc)
            continue
        used = 0
        try:
            with fh:
                if size > budget:
                    fh.seek(size - budget)
                    fh.readline()  # the rest of a line cut by the budget
                for line in fh:
                    used += len(line)
                    yield age, (line[:-1] if line.endswith(b"\n") else line)
        except (OSError, EOFError) as exc:  # a gzip cut short by a crash
            log.warning("cannot read %s for late keys: %s", f, exc)
        budget -= used


class Compressor:
    """One background thread that gzips rotated files, then prunes to ``keep``."""

    def __init__(self, path: str, keep: int) -> None:
        self.path = path
        self.keep = keep
        self.jobs: queue.Queue[Optional[str]] = queue.Queue()
        self.left: List[str] = []  # rotated files whose gzip failed, oldest first (the thread's own)
        self.thread = threading.Thread(target=self._run, name="jsonl-gzip", daemon=True)
        self.thread.start()
        for f in rotated_files(path):  # left uncompressed by a crash
            if not f.endswith(".gz"):
                self.submit(f)

    def submit(self, rotated: str) -> None:
        self.jobs.put(rotated)

    def _run(self) -> None:
        while True:
            src = self.jobs.get()
            if src is None:
                return
            if self._gzip(src):
                self._retry_left()
            prune(self.path, self.keep)

    def _gzip(self, src: str) -> bool:
        """Gzip one rotated file; False when it failed (a full disk, the open-file limit): the
        plain file stays and is in ``left``, tried again once another file is gzip'd."""
        if not os.path.exists(src):  # pruned before its turn: older than the kept ones
            return True
        try:
            compress(src)
        except OSError as exc:
            log.warning("cannot gzip rotated file %s: %s; it stays plain until another file is gzip'd", src, exc)
            if os.path.lexists(src + ".gz.tmp"):
                os.unlink(src + ".gz.tmp")
            if src not in self.left:
                self.left.append(src)
            return False
        return True

    def _retry_left(self) -> None:
        """A gzip worked, so what failed before may work now: the files left plain are gzip'd,
        oldest first, until one fails again (it and the rest wait for the next success). They
        stayed plain until the next start, about 14x their gzip'd size, however short the
        failure was."""
        left, self.left = self.left, []
        for i, src in enumerate(left):
            if not self._gzip(src):
                self.left.extend(f for f in left[i + 1:] if f not in self.left)
                return

    def close(self, timeout: float = 20.0) -> bool:
        """Let the queued files be gzip'd for up to ``timeout``; whether they were. The thread
        goes on with the rest until the process ends: a file not finished stays plain (its
        ``.gz.tmp`` is made anew), and the next start gzips it."""
        self.jobs.put(None)
        self.thread.join(timeout)
        return not self.thread.is_alive()
