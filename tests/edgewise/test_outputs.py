"""Output paths are checked before the work: real folders, files and filesystems."""

from __future__ import annotations

import subprocess

import pytest

from edgewise.errors import ConfigError
from edgewise.outputs import check_output_file, check_output_folder


def test_a_file_output_that_can_be_made_passes_and_nothing_is_made(tmp_path):
    out = check_output_file(tmp_path / "new" / "deeper" / "m.onnx", "-o")
    assert not out.parent.exists()  # a run refused later (bad data) leaves nothing behind
    assert list(tmp_path.iterdir()) == []  # nor does the write probe


def test_a_folder_given_for_a_file_and_a_file_given_for_a_folder_are_named(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"^-o .*: is a folder; give the path of the file"):
        check_output_file(tmp_path, "-o")
    with pytest.raises(ConfigError, match=r"^-o .*f/m.onnx: .*/f is a file, not a folder"):
        check_output_file(tmp_path / "f" / "m.onnx", "-o")
    with pytest.raises(ConfigError, match=r"^--out .*/f: is a file; give a folder"):
        check_output_folder(tmp_path / "f", "--out")
    with pytest.raises(ConfigError, match=r"^--out .*f/a/b: .*/f is a file, not a folder"):
        check_output_folder(tmp_path / "f" / "a" / "b", "--out")


def test_a_read_only_filesystem_is_refused_before_the_work(small_fs):
    fs = small_fs(1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(fs.path)], check=True)
    try:
        with pytest.raises(ConfigError, match=r"^--report .*: cannot write in .*Read-only file system"):
            check_output_file(fs.path / "r.json", "--report")
        with pytest.raises(ConfigError, match=r"^--out .*: cannot write in .*Read-only file system"):
            check_output_folder(fs.path / "report", "--out")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(fs.path)], check=True)


def test_a_full_filesystem_is_refused_before_the_work(small_fs):
    fs = small_fs(64 << 10)
    fs.fill()
    # a full tmpfs still makes empty files (inodes, not blocks): the check must write a byte
    with pytest.raises(ConfigError, match=r"^-o .*: cannot write in .*No space left on device"):
        check_output_file(fs.path / "m.onnx", "-o")


def test_the_files_a_tool_writes_in_its_folder_are_checked_too(tmp_path):
    (tmp_path / "eval.json").mkdir()
    (tmp_path / "eval.md").write_text("an earlier report: replaced")
    assert check_output_folder(tmp_path, "--out", ("eval.md",)) == tmp_path
    with pytest.raises(ConfigError, match=r"^--out .*: .*/eval.json is a folder, where this command writes its "
                                          r"eval.json; move it away or choose another folder$"):
        check_output_folder(tmp_path, "--out", ("eval.md", "eval.json"))


def test_replace_durably_syncs_the_bytes_then_renames_then_syncs_the_folder(tmp_path, monkeypatch):
    """os.replace alone is atomic for a kill, not for a power cut: the file can come back empty
    under its final name. At the os-call boundary: the bytes fsync'd, the rename, the folder fsync'd."""

    from edgewise.outputs import replace_durably
    from tests.syncs import record_syncs

    done = record_syncs(monkeypatch)
    part = tmp_path / "m.onnx.part"
    part.write_bytes(b"x" * 123)
    replace_durably(part, tmp_path / "m.onnx")
    assert done == [("fsync", 123), ("replace", "m.onnx"), ("fsync", "folder")]
    assert (tmp_path / "m.onnx").read_bytes() == b"x" * 123 and not part.exists()

