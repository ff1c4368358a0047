"""edgewise.synth: the output folder (new or empty, ``--overwrite``) and frame sizes too small for the digits."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path
from typing import Dict

import pytest

from edgewise.errors import ConfigError, InvalidInputError
from edgewise.synth import (
    PRESET_SIZES,
    PRESETS,
    StreamGenerator,
    SynthJob,
    generate,
    load_difficulty,
)
from edgewise.synth.settings import DEFAULT_SIZE

SMALL = dataclasses.replace(PRESETS["easy"], objects_min=1, objects_max=2)


def _job(out: Path, **kw) -> SynthJob:
    args = dict(out=out, frames=3, streams=2, seed=1, split="train", width=96, height=64, difficulty=SMALL)
    args.update(kw)
    return SynthJob(**args)  # type: ignore[arg-type]


def _files(root: Path) -> Dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- the output folder
def test_a_folder_holding_a_dataset_is_refused_and_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "r"
    generate(_job(out))
    before = _files(out)
    with pytest.raises(InvalidInputError, match=r"r is not empty \(it holds annotations.json, dataset.json, "
                                                r"images and 1 more\).*choose an empty or new folder.*--overwrite"):
        generate(_job(out, streams=1, frames=2, seed=5))
    assert _files(out) == before


def test_a_folder_of_other_files_is_refused_too(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInputError, match="holds notes.txt"):
        generate(_job(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_an_empty_existing_folder_is_used(tmp_path: Path) -> None:
    generate(_job(tmp_path, streams=1))
    assert len(list((tmp_path / "images").iterdir())) == 3


def test_overwrite_replaces_synths_files_only_and_equals_a_fresh_dataset(tmp_path: Path) -> None:
    out = tmp_path / "r"
    generate(_job(out, video=True))
    (out / "notes.txt").write_text("mine")
    (out / "cams").mkdir()
    (out / "cams" / "keep.jpg").write_bytes(b"x")
    new = dict(streams=1, frames=2, seed=5)
    summary = generate(_job(out, overwrite=True, **new))
    fresh = tmp_path / "fresh"
    generate(_job(fresh, **new))
    files = _files(out)
    assert files.pop("notes.txt") == b"mine" and files.pop("cams/keep.jpg") == b"x"
    assert files == _files(fresh)  # no stale frame, label or video is left
    assert sorted(p.name for p in (out / "images").iterdir()) == ["s000_f000000.jpg", "s000_f000001.jpg"]
    assert not (out / "videos").exists()
    meta = json.loads((out / "dataset.json").read_text())
    assert (meta["streams"], meta["frames"], meta["images"]) == (1, 2, 2) == (summary["streams"], 2, 2)


def test_overwrite_refuses_files_synth_did_not_write_in_its_folders(tmp_path: Path) -> None:
    out = tmp_path / "r"
    generate(_job(out))
    (out / "images" / "holiday.jpg").write_bytes(b"x")
    (out / "labels" / "notes").mkdir()
    before = _files(out)
    with pytest.raises(InvalidInputError, match=r"--overwrite removes only the files synth writes, but "
                                                r"images/holiday.jpg, labels/notes are not one of them"):
        generate(_job(out, overwrite=True))
    assert _files(out) == before  # nothing deleted


def test_overwrite_refuses_a_dataset_json_nested_past_the_json_decoders_depth(tmp_path: Path) -> None:
    """Whether dataset.json is synth's was asked of json.loads, whose RecursionError on a
    deeply nested file was a traceback of `edgewise synth --overwrite`: it is not synth's."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "dataset.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InvalidInputError, match="--overwrite removes only the files synth writes, but "
                                                "dataset.json is not one of them"):
        generate(_job(out, overwrite=True))


def test_an_invalid_job_removes_nothing_even_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "r"
    generate(_job(out))
    before = _files(out)
    with pytest.raises(ConfigError, match="frame size 40x40"):
        generate(_job(out, overwrite=True, width=40, height=40))
    assert _files(out) == before


def test_out_that_is_a_file_or_under_one_is_a_clean_error(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(InvalidInputError, match=r"output folder .*f is a file, not a folder; choose a new or empty"):
        generate(_job(f))
    with pytest.raises(InvalidInputError, match=r"cannot use .*f/sub/images: Not a directory; choose a folder"):
        generate(_job(f / "sub"))
    assert f.read_text() == "x"


def test_cli_refuses_a_used_out_and_overwrites_on_request(tmp_path: Path, capsys) -> None:
    from edgewise.cli import main

    out = str(tmp_path / "r")
    args = ["synth", "--out", out, "--difficulty", "easy", "--imgsz", "96,64", "--set", "objects_max=2"]
    assert main(args + ["--streams", "2", "--frames", "3"]) == 0
    capsys.readouterr()
    assert main(args + ["--streams", "1", "--frames", "2", "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgewise: error: output folder") and "--overwrite" in err and err.count("\n") == 1
    assert len(list((tmp_path / "r" / "images").iterdir())) == 6
    assert main(args + ["--streams", "1", "--frames", "2", "--seed", "5", "--overwrite"]) == 0
    assert len(list((tmp_path / "r" / "images").iterdir())) == 2
    capsys.readouterr()
    assert main(["synth", "--out", str(tmp_path / "r" / "dataset.json"), "--imgsz", "96,64"]) == 2
    assert capsys.readouterr().err.startswith("edgewise: error: output folder")


# ---------------------------------------------------------------- frame size against digit size
@pytest.mark.parametrize("preset, overrides, size, keys, need", [
    ("camera", [], (96, 96), "'size_easy' (64,128)", "128x128"),
    ("episodes", [], (40, 40), "'size_easy' (26,48)", "48x48"),
    ("easy", [], (32, 32), "'size_easy' (28,56)", "56x56"),
    ("reference", [], (33, 4096), "'size_easy' (26,48)", "48x4096"),
    ("reference", ["size_easy=300,400", "size_hard=300,400"], (320, 240),
     "keys 'size_easy' (300,400), 'size_hard' (300,400)", "400x400"),
    ("camera", ["far_size=16,100", "size_easy=64,96", "size_hard=40,60"], (640, 90), "'size_easy' (64,96), "
     "'far_size' (16,100)", "640x100"),
])
def test_a_frame_too_small_for_the_digits_is_refused_up_front(tmp_path: Path, preset: str, overrides: list,
                                                              size: tuple, keys: str, need: str) -> None:
    d = load_difficulty(preset, overrides)
    w, h = size
    with pytest.raises(ConfigError, match=rf"difficulty '{preset}': frame size {w}x{h} is too small for .*"
                                          rf"{re.escape(keys)}.*use a frame of at least {need}"):
        generate(_job(tmp_path / "o", width=w, height=h, difficulty=d, preset=preset))
    assert not (tmp_path / "o").exists()
    # the edge's synthetic source builds a StreamGenerator: the same rule, before any asset is loaded
    with pytest.raises(ConfigError, match=rf"frame size {w}x{h} is too small for .*{re.escape(keys)}"):
        StreamGenerator(w, h, d, "test", seed=0, stream=0)


def test_cli_names_the_size_and_the_knob(tmp_path: Path, capsys) -> None:
    from edgewise.cli import main

    assert main(["synth", "--out", str(tmp_path / "s"), "--frames", "1", "--streams", "1", "--difficulty", "camera",
                 "--imgsz", "96"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgewise: error: difficulty 'camera': frame size 96x96 is too small for key 'size_easy'")
    assert "at least 128 px wide and 128 px tall" in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_smallest_size_that_works_works(name: str) -> None:
    d = PRESETS[name]
    need = d.min_frame_side()
    assert need == max(d.size_easy[1], d.size_hard[1], d.far_size[1] if d.horizon > 0 else 0)
    w, h = PRESET_SIZES.get(name, DEFAULT_SIZE)
    assert min(w, h) >= need  # every preset's default size passes
    for stream in range(3):  # digits spawned anywhere in a frame the size of the tallest one
        g = StreamGenerator(need, need, d, "train", seed=stream, stream=stream)
        for _ in range(25):
            img, _labels = g.next_frame()
        assert img.shape == (need, need, 3)
    with pytest.raises(ConfigError, match=f"at least {need} px wide"):
        StreamGenerator(need, need - 1, d, "train", seed=0, stream=0)


def test_far_size_counts_only_where_far_digits_are_drawn() -> None:
    d = dataclasses.replace(PRESETS["camera"], far_size=(16.0, 140.0), size_bottom=(150.0, 190.0))
    assert d.min_frame_side() == 140
    assert dataclasses.replace(d, far_prob=0.0, episode_rate=0.0).min_frame_side() == 128
    assert dataclasses.replace(d, horizon=0.0).min_frame_side() == 128  # flat scenes draw no far digits


@pytest.mark.parametrize("kw, says", [
    ({"stride": 0}, r"--stride 0: must be 1\.\.1000"),
    ({"stride": 1_000_000}, r"--stride 1000000: must be 1\.\.1000 \(every frame is generated"),
    ({"jpeg_quality": 0}, r"--quality 0: must be 1\.\.100"),
])
def test_stride_and_quality_out_of_range_are_named_before_anything_is_generated(tmp_path: Path, kw, says) -> None:
    """A stride of a million rendered a million frames per kept one, silently, for hours."""
    with pytest.raises(ConfigError, match=says):
        generate(_job(tmp_path / "r", **kw))
    assert not (tmp_path / "r").exists()


def test_large_flat_frames_decode_the_background_video_at_a_bounded_width() -> None:
    """A 4096 px frame of a flat preset decoded the clip at 6554 px: 125 test frames of 96 MB."""
    from edgewise.synth.render import _FLAT_VIDEO_MAX_WIDTH

    gens = [StreamGenerator(4096, 2304, SMALL, "test", 3, s) for s in range(8)]
    videos = [g for g in gens if g.video is not None]
    assert videos, "no stream of eight picked the video background"
    for g in videos:
        assert g.video[0].shape[1] <= _FLAT_VIDEO_MAX_WIDTH
        img, _ = g.next_frame()
        assert img.shape == (2304, 4096, 3)


def test_a_video_decodes_at_the_size_of_its_labels_and_an_odd_size_is_refused(tmp_path: Path) -> None:
    """The MJPG video stores colour at half the width and height: at 97x65 it decoded as 96x64,
    one pixel off the labels (found by a probe). Even sizes decode whole; odd ones are refused
    before anything is written, naming the even size to use."""
    import cv2

    generate(_job(tmp_path / "even", width=98, height=66, video=True))
    cap = cv2.VideoCapture(str(tmp_path / "even" / "videos" / "s000.avi"))
    ok, frame = cap.read()
    cap.release()
    assert ok and frame.shape[:2] == (66, 98)
    for w, h in ((97, 66), (98, 65)):
        with pytest.raises(ConfigError, match=r"--video needs an even frame size: .* would decode one pixel smaller "
                                              r"than its labels .*; use --imgsz 98x66"):
            generate(_job(tmp_path / "odd", width=w, height=h, video=True))
        assert not (tmp_path / "odd").exists()
    generate(_job(tmp_path / "odd", width=97, height=65))  # without --video an odd size is fine


def test_an_interrupted_dataset_is_refused_by_its_readers_until_overwritten(tmp_path: Path) -> None:
    """Ctrl-C in `edgewise synth` left images/ and labels/ with part of the frames (the last image
    perhaps without its labels), and `edgewise train` and `eval` took them for the dataset."""
    from edgewise_tools.evaluation.frames import list_frames

    out = tmp_path / "set"

    def stop(n: int) -> None:
        if n == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(_job(out), stop)
    assert len(list((out / "images").iterdir())) == 2 and not (out / "dataset.json").exists()
    said = f"{out}: an `edgewise synth` run that wrote this dataset did not finish"
    with pytest.raises(InvalidInputError, match=re.escape(said)):
        list_frames(out)
    trains = importlib.util.find_spec("torch") is not None  # the train extra: its reader too
    if trains:
        from edgewise_tools.train.data import YoloDataset

        with pytest.raises(ConfigError, match=re.escape(said)):
            YoloDataset(out, 64)
    generate(_job(out, overwrite=True))  # the same run again, as the message says
    assert len(list_frames(out)) == 6
    if trains:
        assert len(YoloDataset(out, 64).files) == 6
    assert _files(out) == _files(_fresh(tmp_path / "fresh"))


def _fresh(out: Path) -> Path:
    generate(_job(out))
    return out
