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


def test_a_dataset_folder_points_at_its_images(tmp_path):
    # `edgewise synth --out frames` then `model quantize --calib frames/`: the images are in frames/images
    _photos(tmp_path / "images", 1)
    with pytest.raises(InvalidInputError, match=rf"has no images .*; it looks like a dataset folder: its images are in {tmp_path / 'images'}$"):
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


def test_folder_is_read_as_the_daemon_reads_it(tmp_path):
    """cv2.imread decoded a truncated JPEG partly, read hidden AppleDouble twins, sorted
    frame10 before frame2 and left a phone photo sideways: the daemon's reader now."""
    from edge.sources.opencv import ImageFolderSource
    from tests.edgewise.test_wire import _with_exif_orientation

    d = tmp_path / "cal"
    d.mkdir()
    for i in (1, 2, 10):
        cv2.imwrite(str(d / f"frame{i}.png"), np.full((20, 30, 3), i, np.uint8))
    (d / "._frame1.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    good = cv2.imencode(".jpg", np.full((40, 64, 3), 90, np.uint8))[1].tobytes()
    (d / "frame3.jpg").write_bytes(good[: len(good) * 2 // 3])  # truncated
    (d / "frame4.jpg").write_bytes(_with_exif_orientation(good, 6))  # a portrait phone photo
    src = open_frames(d)
    assert [f.name for f in src.files] == ["frame1.png", "frame2.png", "frame3.jpg", "frame4.jpg", "frame10.png"]
    got = dict(src.read(range(5)))
    assert sorted(got) == [0, 1, 3, 4] and src.skipped == [str(d / "frame3.jpg")]
    assert got[3].shape == (64, 40, 3)
    daemon = ImageFolderSource(str(d))
    daemon.open()
    assert [p.name for p in daemon.files] == [f.name for f in src.files]


def test_a_video_with_a_bad_middle_frame_reads_on_and_a_short_read_is_noted(tmp_path, caplog):
    from tests.edge.sources.test_file_sources import midcorrupt_video

    video = midcorrupt_video(tmp_path / "mid.avi", 30, 10)
    src = open_frames(video)
    assert src.count == 30
    with caplog.at_level("WARNING", logger="edgewise_tools.models.calibration"):
        got = dict(src.read([5, 10, 20, 29]))
    assert sorted(got) == [5, 20, 29]  # frame 10 does not decode: skipped, the rest is read
    assert src.skipped == [f"{video} frame 10"]
    assert any("read 3 of the 4 frames wanted (1 undecodable" in r.getMessage() for r in caplog.records)
