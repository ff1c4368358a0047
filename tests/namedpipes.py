"""A named pipe put where a file a process reads was, for the tests of readers that must refuse it
without waiting on it (``edgewise.filereads``): on code that waits, the reader gets an end of file
every ``every_s`` seconds, so such a test fails (late, or on what it read) instead of hanging."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def pipe_in_place(path: Path, every_s: float = 2.0) -> Iterator[Path]:
    """Replace ``path`` by a named pipe; while the block runs, a reader waiting on it is given an
    end of file every ``every_s`` seconds."""
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(every_s):
            try:  # opens only while a reader waits; closing at once is its end of file
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

    helper = threading.Thread(target=unblock, name="pipe-unblocker", daemon=True)
    helper.start()
    try:
        yield path
    finally:
        done.set()
        helper.join(every_s + 5)
