"""``edgewise synth``: each preset's own layout, the whole seed, and the frame-size grammar."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Dict, List

import pytest

from edgewise.cli import main
from edgewise.errors import ConfigError
from edgewise.synth import PRESETS, Layout, SynthJob, default_layout, generate
from edgewise_tools.cli.synth import _imgsz

SMALL = dataclasses.replace(PRESETS["easy"], objects_min=1, objects_max=2)


def test_the_camera_preset_defaults_to_the_headline_test_split_and_the_others_keep_theirs(tmp_path: Path) -> None:
    assert default_layout("camera") == Layout(1280, 720, 30, 30, "test")
    assert default_layout("episodes") == Layout(320, 240, 4, 100, "train")
    (tmp_path / "d.yaml").write_text("preset: camera\nfar_prob: 0.5\n")
    assert default_layout(str(tmp_path / "d.yaml")) == default_layout("camera")


@pytest.mark.parametrize("argv, want", [
    ([], (30, 30, "test", 1280, 720)),
    (["--streams", "2", "--frames", "3", "--split", "val", "--imgsz", "640x360"], (2, 3, "val", 640, 360)),
])
def test_the_command_line_fills_what_it_does_not_say_from_the_preset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: List[str], want: tuple) -> None:
    seen: Dict[str, SynthJob] = {}

    def record(job: SynthJob, progress=None) -> dict:  # the CLI's wiring only: nothing rendered
        seen["job"] = job
        return {}

    monkeypatch.setattr("edgewise.synth.generate", record)
    assert main(["synth", "--out", str(tmp_path / "o"), "--difficulty", "camera", *argv]) == 0
    job = seen["job"]
    assert (job.streams, job.frames, job.split, job.width, job.height) == want


def _frames(out: Path, seed: int) -> Dict[str, bytes]:
    generate(SynthJob(out=out, frames=2, streams=1, seed=seed, split="train", width=96, height=64,
                      difficulty=SMALL))
    return {p.name: p.read_bytes() for p in sorted((out / "images").iterdir())}


def test_a_seed_above_two_to_the_32_is_its_own_scene_and_a_negative_one_is_refused(tmp_path: Path) -> None:
    # it wrapped: 2**32 gave seed 0's bytes while dataset.json recorded another seed
    assert _frames(tmp_path / "a", 0) != _frames(tmp_path / "b", 2**32)
    assert _frames(tmp_path / "c", 7) == _frames(tmp_path / "d", 7)
    with pytest.raises(ConfigError, match="--seed -1"):
        SynthJob(out=tmp_path / "e", frames=1, streams=1, seed=-1, split="train", width=96, height=64,
                 difficulty=SMALL).validate()


@pytest.mark.parametrize("text, size", [("256", (256, 256)), ("320,240", (320, 240)), ("320x240", (320, 240))])
def test_imgsz_reads_n_w_h_and_wxh(text: str, size: tuple) -> None:
    assert _imgsz(text) == size


@pytest.mark.parametrize("text", ["x240", "320,,240", "320x", "1,2,3", "a"])
def test_imgsz_with_an_empty_or_extra_part_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--imgsz"):
        _imgsz(text)
