"""The bounded reads of operator files: a device or a named pipe where a file was expected
is refused at once, a pipe can still be read when asked, a read never passes its cap."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from edgewise.errors import ConfigError
from edgewise.filereads import file_identity, read_capped


def _in_thread(fn, timeout: float = 10.0):
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the read blocked"
    return out[0]


def test_a_regular_file_is_read_to_its_cap_and_its_size_is_known(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert read_capped(small, 10, "x") == (b"abc", 3)
    big = tmp_path / "big"
    big.write_bytes(b"z" * 5000)
    data, size = read_capped(big, 100, "x")
    assert len(data) == 101 and size == 5000


@pytest.mark.parametrize("make, says", [
    (lambda p: os.mkfifo(p), "is a named pipe (FIFO), expected the thing"),
    (lambda p: os.symlink("/dev/zero", p), "is a device, expected the thing"),
])
def test_a_pipe_or_a_device_is_refused_without_waiting(tmp_path: Path, make, says: str) -> None:
    path = tmp_path / "f"
    make(path)
    result = _in_thread(lambda: read_capped(path, 1 << 20, "the thing"))
    assert isinstance(result, ConfigError) and str(result) == f"{path}: {says}"


def test_asked_to_read_pipes_it_reads_one_up_to_its_cap(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(b"policy",), daemon=True)
    writer.start()
    assert _in_thread(lambda: read_capped(fifo, 100, "x", regular_only=False)) == (b"policy", 6)
    writer.join(10)
    data, size = _in_thread(lambda: read_capped("/dev/zero", 100, "x", regular_only=False))
    assert len(data) == 101 and size == 101  # capped: a device that never ends


def test_a_folder_is_the_callers_to_word(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        read_capped(tmp_path, 100, "x")


def test_a_chmod_changes_the_identity(tmp_path):
    """An unreadable new policy (or tokens file) is refused; the ``chmod`` that fixes it changes
    neither the mtime nor the size nor the inode, only the change time, which the identity
    holds, so the watcher reads the file again (root reads any file, so the daemon-level refusal
    cannot be shown here)."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"x")
    os.chmod(path, 0o000)
    before = file_identity(str(path))
    st = os.stat(path)
    os.chmod(path, 0o644)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert file_identity(str(path)) != before


def test_the_identity_follows_links_and_says_when_nothing_is_there(tmp_path):
    """A link is looked at through (a ConfigMap's key); a link to nothing, a missing file and no
    path at all have no identity (not the working folder's)."""
    target = tmp_path / "a.yaml"
    target.write_text("a")
    link = tmp_path / "policy.yaml"
    link.symlink_to(target.name)
    ident = file_identity(str(link))
    assert ident is not None and ident[0] == str(target.resolve())
    target.unlink()
    assert file_identity(str(link)) is None
    assert file_identity(str(tmp_path / "missing.yaml")) is None
    assert file_identity("") is None
