"""Where a tool will write its result, checked before the work that produces it.

``edgewise model quantize``, ``eval``, ``demo`` and ``train`` run for minutes to hours and
write their result last; an output path that cannot be written (a folder where a file is
meant, a file where a folder is meant, a read-only or full filesystem) must fail at once,
naming the flag, not after the work is done. ``edgewise edge bundle`` checks its ``-o`` here
too, which is why the rule lives in the core and not in the tools (``edge`` may not import them).

``replace_durably`` and ``fsync_dir`` make a rename into a folder durable: a file renamed into place without it (and
without an fsync of its own bytes first) can be found after a power cut under its new name but
empty, as ext4 leaves a new file whose blocks were not written yet.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence, Union

from edgewise.errors import ConfigError

PathLike = Union[str, "os.PathLike[str]"]


def fsync_dir(folder: PathLike) -> None:
    """Make the renames and removals in ``folder`` durable (best effort: not every filesystem
    can sync a folder)."""
    try:
        fd = os.open(str(folder), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_durably(written: PathLike, path: PathLike) -> None:
    """Rename the finished file ``written`` to ``path`` so that a power cut leaves one of the two
    whole: its bytes fsync'd first, the folder after (``fsync_dir``). ``os.replace`` alone makes
    the name atomic for a kill, not for a power cut: a model, a dataset file or a training
    checkpoint came back empty under its final name, and the next run took it as written (a
    resumed training refused its ``resume.pt``, the hours before lost; a model newer than its
    checkpoint is not exported again)."""
    fd = os.open(os.fspath(written), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(written, path)
    fsync_dir(os.path.dirname(os.path.abspath(os.fspath(path))))


def _writable_folder(folder: Path, flag: str, shown: Path) -> None:
    """Prove a file can be created in ``folder``, or, when it does not exist yet, in the
    nearest folder above it that does (nothing is made: a refused run leaves nothing)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a dangling link: the path cannot be made
            raise ConfigError(f"{flag} {shown}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {shown}: {existing} is a file, not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".edgewise-write-check-", buffering=0) as f:
            f.write(b"\0")  # a full filesystem still makes empty files; a byte needs a block
    except OSError as e:
        raise ConfigError(f"{flag} {shown}: cannot write in {existing} ({e.strerror}); "
                          "choose a writable place") from None


def check_output_file(path: PathLike, flag: str) -> Path:
    """The file ``path`` named by ``flag`` can be written (its folder can be made); else ConfigError."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {p}: is a folder; give the path of the file to write")
    _writable_folder(p.parent if str(p.parent) else Path("."), flag, p)
    if p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(f"{flag} {p}: the file exists and is not writable")
    return p


def check_output_folder(path: PathLike, flag: str, files: Sequence[str] = ()) -> Path:
    """The folder ``path`` named by ``flag`` exists or can be made, and files can be written in it,
    among them ``files`` (the names the tool writes there): none may be a folder, or a file that
    cannot be written (a run that found it so only after its work lost the work, with a traceback)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {p}: is a file; give a folder")
    _writable_folder(p, flag, p)
    for name in files:
        f = p / name
        if f.is_dir():
            raise ConfigError(f"{flag} {p}: {f} is a folder, where this command writes its {name}; move it away "
                              "or choose another folder")
        if f.exists() and not os.access(f, os.W_OK):
            raise ConfigError(f"{flag} {p}: {f} exists and is not writable, and this command writes its {name} "
                              "there; make it writable or choose another folder")
    return p
