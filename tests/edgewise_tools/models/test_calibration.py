"""Calibration sources: validation messages, disjoint spread-out splits, streamed reading."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgewise.errors import InvalidInputError
from edgewise_tools.models.calibration import open_frames, split_indices

DATA = Path("/usr/share/doc/opencv-doc/examples/data")
VIDEO = DATA / "vtest.avi"


def _photos(dst: Path, n: int) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(DATA.glob("*.jpg"))[:n]:
        shutil.copy(f, dst / f.name)
    return dst


def test_missing_source_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(InvalidInputError, match=f"{missing} does not exist"):
        open_frames(missing)


def test_empty_folder_named(tmp_path):
    (tmp_path / "notes.txt").write_text("no images here")
    with pytest.raises(InvalidInputError, match=rf"folder {tmp_path} has no images"):
        open_frames(tmp_path)


def test_not_a_video_named(tmp_path):
    bogus = tmp_path / "clip.mp4"
    bogus.write_bytes(b"\x00" * 1000)
    with pytest.raises(InvalidInputError, match=rf"{bogus} is not a video OpenCV can decode"):
        open_frames(bogus)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any folder")
def test_unreadable_folder_named(tmp_path):
    d = _photos(tmp_path / "cal", 2)
    d.chmod(0)
    try:
        with pytest.raises(InvalidInputError, match=f"{d}"):
            open_frames(d)
    finally:
        d.chmod(0o755)


def test_folder_reads_sorted_and_skips_corrupt(tmp_path):
    d = _photos(tmp_path / "cal", 3)
    (d / "zz-corrupt.jpg").write_bytes(b"not a jpeg")
    src = open_frames(d)
    assert src.kind == "images" and src.count == 4
    got = list(src.read(range(4)))
    assert [i for i, _ in got] == [0, 1, 2]
    assert all(im.ndim == 3 and im.dtype == np.uint8 for _, im in got)
    assert src.skipped == [str(d / "zz-corrupt.jpg")]


def test_video_frames_by_index():
    src = open_frames(VIDEO)
    assert src.kind == "video" and src.count == 795
    got = dict(src.read([0, 10, 400]))
    assert sorted(got) == [0, 10, 400]
    cap = cv2.VideoCapture(str(VIDEO))
    for _ in range(10):
        cap.grab()
    ok, tenth = cap.read()
    cap.release()
    assert ok and np.array_equal(got[10], tenth)
    assert not np.array_equal(got[0], got[400])


def test_split_spreads_and_keeps_holdout_disjoint():
    cal, hold, note = split_indices(795, 500, 50)
    assert len(cal) == 500 and len(hold) == 50 and note == ""
    assert not set(cal) & set(hold)
    assert max(cal) < min(hold)  # held-out frames are the tail, not calibration neighbours
    assert cal[0] == 0 and hold[-1] >= 780


def test_split_short_source_keeps_half_for_holdout_at_most():
    cal, hold, note = split_indices(10, 500, 50)
    assert len(hold) == 5 and len(cal) == 5 and not set(cal) & set(hold)
    assert "10 frames" in note
    cal, hold, _ = split_indices(10, 3, 50)
    assert len(cal) == 3 and len(hold) == 5 and not set(cal) & set(hold)


def test_split_rejects_bad_counts():
    with pytest.raises(InvalidInputError, match="--samples 0"):
        split_indices(10, 0, 5)
    with pytest.raises(InvalidInputError, match="--holdout -1"):
        split_indices(10, 5, -1)
