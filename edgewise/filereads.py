"""Reading the small files an operator points the edge at (policies, gain models): at most
a bounded number of bytes, and, where the daemon re-reads them, regular files only.

A file's size from ``stat`` says nothing for a device or a named pipe (0), so a size check
before reading lets ``/dev/zero`` through and a read without a cap fills memory; a named
pipe without a writer blocks the reader, which in the daemon stops hot reload and its
shutdown. Both are refused here, in one place.

A file a daemon re-reads when it changes (the edge's policy, the gateway's device tokens, the
Kubernetes client's service-account token) is told from its previous version by
:func:`file_identity`, the one rule of what "changed" means.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import Optional, Tuple, Union

from edgewise.errors import ConfigError

#: the most bytes read of a small file an operator names on a command line (a bearer token, a PEM
#: certificate, key or CA bundle: a CA bundle is a few hundred KB); ``/dev/zero`` or an endless pipe
#: read without a cap filled the memory until the kernel killed the command
SMALL_FILE_BYTES = 1 << 20

#: What tells one version of a watched file from another (:func:`file_identity`): its resolved
#: path, device, inode, size, modification and change times (ns).
FileIdentity = Tuple[str, int, int, int, int, int]


def file_identity(path: str) -> Optional[FileIdentity]:
    """The identity of the file at ``path``, through symbolic links; None when there is no path
    or nothing can be looked at there (gone, a link to nothing, no permission to search its
    folder). A watcher reads the file again when this changed:

    * kubelet updates a mounted ConfigMap or Secret (and a projected token) by writing a new
      timestamped folder and swapping the ``..data`` link: the resolved path changes even when
      the old folder's inode is reused and the new file has the same times and size;
    * an edit in place or a ``mv`` over it changes the times, the size or the inode;
    * a ``chmod``/``chown`` that makes a refused, unreadable file readable changes only its
      change time, and so does ``cp -p`` of a file of the same size over it.
    """
    if not path:
        return None
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _open_nonblocking(path: str, flags: int) -> int:
    # A FIFO opens at once without a writer (instead of blocking the reader for ever).
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, for a message ("a named pipe (FIFO)", ...)."""
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_small(path: str, label: str) -> bytes:
    """The bytes of the small file at ``path`` (``-``: standard input), at most
    :data:`SMALL_FILE_BYTES`; more is a ConfigError starting with ``label`` (the flag and the
    path). ``OSError`` (not found, a folder, permission) is the caller's to word."""
    if path == "-":
        data = sys.stdin.buffer.read(SMALL_FILE_BYTES + 1)
    else:
        data = read_capped(path, SMALL_FILE_BYTES, "a file", regular_only=False)[0]
    if len(data) > SMALL_FILE_BYTES:
        raise ConfigError(f"{label}: holds more than {SMALL_FILE_BYTES} bytes; is this the right file?")
    return data


def read_capped(path: Union[str, Path], limit: int, what: str, regular_only: bool = True) -> Tuple[bytes, int]:
    """The first ``limit + 1`` bytes of the file at ``path`` and its size as far as known
    (more than ``limit``: the caller refuses it, naming the size).

    ``regular_only``: anything but a regular file (after symlinks) is a ``ConfigError``
    naming what it is and ``what`` was expected, found without waiting on it. Otherwise a
    pipe is read like ``cat`` would (``check-policy <(kubectl ...)``), up to the cap.
    ``OSError`` (not found, a folder, permission) is the caller's to word."""
    p = Path(path)
    with open(p, "rb", opener=_open_nonblocking if regular_only else None) as f:
        st = os.fstat(f.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(p))
        if regular_only and not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{p}: is {kind_of(st.st_mode)}, expected {what}")
        data = f.read(limit + 1)
    size = len(data)
    if size > limit and stat.S_ISREG(st.st_mode):
        size = max(size, st.st_size)  # the file's own size: the read stopped one byte past the cap
    return data, size
