"""edgewise.synth.writer: ``--overwrite`` removes only files synth wrote; a write that fails
(a full disk) is one clean error, not a traceback."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path
from typing import Any, Dict

import pytest

from edgewise.cli import main
from edgewise.errors import InvalidInputError
from edgewise.synth import PRESETS, SynthJob, generate, writer

SMALL = dataclasses.replace(PRESETS["easy"], objects_min=1, objects_max=2)


def _job(out: Path, **kw: Any) -> SynthJob:
    args: Dict[str, Any] = dict(out=out, frames=2, streams=1, seed=1, split="train", width=96, height=64,
                                difficulty=SMALL)
    args.update(kw)
    return SynthJob(**args)


def _files(root: Path) -> Dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name, content", [
    ("annotations.json", b'{"info": {"description": "my own COCO labels"}, "images": []}'),
    ("dataset.json", b'{"mine": 1}'),
    ("annotations.json", b"not json at all"),
])
def test_overwrite_keeps_a_top_level_file_of_synths_name_that_synth_did_not_write(
        tmp_path: Path, name: str, content: bytes) -> None:
    (tmp_path / name).write_bytes(content)
    (tmp_path / "README").write_text("mine")
    before = _files(tmp_path)
    with pytest.raises(InvalidInputError, match=rf"--overwrite removes only the files synth writes, but {name} "
                                                r"is not one of them"):
        generate(_job(tmp_path, overwrite=True))
    assert _files(tmp_path) == before


def test_overwrite_still_replaces_synths_own_json_files(tmp_path: Path) -> None:
    generate(_job(tmp_path, seed=3))
    generate(_job(tmp_path, seed=4, overwrite=True))
    fresh = tmp_path.parent / (tmp_path.name + "-fresh")
    generate(_job(fresh, seed=4))
    assert _files(tmp_path) == _files(fresh)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file is left


def test_a_full_disk_is_one_error_naming_the_file_and_overwrite_recovers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    real = Path.write_bytes
    calls = [0]

    def filling(self: Path, data: bytes) -> int:
        calls[0] += 1
        if calls[0] == 4:  # the second frame's image (after the .synth-incomplete marker and the first frame)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", filling)
    args = ["synth", "--out", str(out), "--frames", "2", "--streams", "1", "--imgsz", "96,64",
            "--difficulty", "easy"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"edgewise: error: output folder {out}: cannot write {out / 'images' / 's000_f000001.jpg'}"
                          f": No space left on device;"), err
    assert "--overwrite" in err
    monkeypatch.setattr(Path, "write_bytes", real)
    assert main(args + ["--overwrite"]) == 0
    assert sorted(p.name for p in (out / "images").iterdir()) == ["s000_f000000.jpg", "s000_f000001.jpg"]


def test_a_failed_json_write_leaves_neither_a_half_file_nor_its_temporary(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_replace(src: Any, target: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(InvalidInputError, match="cannot write.*Input/output error"):
        generate(_job(tmp_path))
    assert not (tmp_path / "annotations.json").exists()
    assert not (tmp_path / writer._tmp_name("annotations.json")).exists()


def test_an_interrupted_synth_says_how_to_replace_what_it_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*_a: Any, **_k: Any) -> Dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr("edgewise.synth.generate", interrupted)
    assert main(["synth", "--out", str(tmp_path / "r"), "--frames", "1", "--streams", "1"]) == 130
    assert "interrupted" in capsys.readouterr().err
