"""Recording the os calls that make a file durable (fsync, rename), in order, for tests of
the write-then-rename rule (``edgewise.outputs.replace_durably`` and its callers)."""

from __future__ import annotations

import os
import stat
from typing import Any, List, Tuple


def record_syncs(monkeypatch: Any, folder: str = "folder") -> List[Tuple[str, Any]]:
    """Patch ``os.fsync`` and ``os.replace`` to note ("fsync", size or ``folder``) and
    ("replace", the new name's base name) before doing the real call; returns the list."""
    done: List[Tuple[str, Any]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        done.append(("fsync", folder if stat.S_ISDIR(st.st_mode) else st.st_size))
        real_fsync(fd)

    def replace(a: Any, b: Any) -> None:
        done.append(("replace", os.path.basename(b)))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return done
