"""edgewise.synth: determinism, label correctness against rendered pixels, YOLO/COCO agreement."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgewise.errors import ConfigError
from edgewise.synth import PRESETS, StreamGenerator, SynthJob, generate, load_difficulty
from edgewise.synth.assets import load_sprites

SMALL = dataclasses.replace(PRESETS["reference"], objects_min=2, objects_max=4)


def _job(out: Path, seed: int, **kw) -> SynthJob:
    args = dict(out=out, frames=6, streams=2, seed=seed, split="train", width=160, height=128,
                difficulty=SMALL)
    args.update(kw)
    return SynthJob(**args)


def _files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_different_seed_differs(tmp_path: Path) -> None:
    generate(_job(tmp_path / "a", 7))
    generate(_job(tmp_path / "b", 7))
    generate(_job(tmp_path / "c", 8))
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert len([k for k in a if k.startswith("images/")]) == 12
    assert a == b
    assert a.keys() == c.keys()
    diff = [k for k in a if k.startswith("images/") and a[k] != c[k]]
    assert len(diff) == 12


def _isolated(labels, i: int, margin: int = 3) -> bool:
    x0, y0, x1, y1 = labels[i].box
    for j, o in enumerate(labels):
        if j == i or o.box[2] <= o.box[0]:
            continue
        if not (o.box[0] >= x1 + margin or o.box[2] <= x0 - margin
                or o.box[1] >= y1 + margin or o.box[3] <= y0 - margin):
            return False
    return True


def test_boxes_match_rendered_ink_within_one_pixel() -> None:
    # flat black background, no noise/clutter/occluders, bright ink: ink pixels = the object's mask
    d = dataclasses.replace(SMALL, occluders_max=0, clutter_max=0, noise_easy=0.0, noise_hard=0.0,
                            low_light_prob=0.0, contrast_easy=(0.8, 0.8), contrast_hard=(0.8, 0.8))
    checked = 0
    for stream in range(4):
        g = StreamGenerator(192, 160, d, "train", seed=11, stream=stream, flat_background=(0, 0, 0))
        for _ in range(8):
            img, labels = g.next_frame()
            gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.float32)
            for i, lb in enumerate(labels):
                if not lb.labelled or not _isolated(labels, i):
                    continue
                x0, y0, x1, y1 = lb.box
                assert 0 <= x0 < x1 <= 192 and 0 <= y0 < y1 <= 160
                pad = 2
                win = gray[max(0, y0 - pad):y1 + pad, max(0, x0 - pad):x1 + pad]
                ys, xs = np.nonzero(win >= 0.5 * 204)
                assert len(xs), "a labelled object must have ink"
                ex0, ey0 = xs.min() + max(0, x0 - pad), ys.min() + max(0, y0 - pad)
                ex1, ey1 = xs.max() + 1 + max(0, x0 - pad), ys.max() + 1 + max(0, y0 - pad)
                assert abs(ex0 - x0) <= 1 and abs(ey0 - y0) <= 1, (lb, (ex0, ey0, ex1, ey1))
                assert abs(ex1 - x1) <= 1 and abs(ey1 - y1) <= 1, (lb, (ex0, ey0, ex1, ey1))
                checked += 1
    assert checked >= 20


def test_occluded_objects_shrink_to_their_visible_part_and_hidden_ones_are_not_labelled() -> None:
    # the same scene with and without occluders (occluders have their own random stream)
    base = dataclasses.replace(SMALL, noise_easy=0.0, noise_hard=0.0, occluders_max=0)
    occl = dataclasses.replace(base, occluders_max=4, occluder_prob=1.0, min_visible=0.5)
    shrunk = hidden = 0
    for stream in range(6):
        g0 = StreamGenerator(160, 128, base, "train", seed=5, stream=stream)
        g1 = StreamGenerator(160, 128, occl, "train", seed=5, stream=stream)
        for _ in range(6):
            _, free = g0.next_frame()
            _, occ = g1.next_frame()
            assert [o.track_id for o in free] == [o.track_id for o in occ]
            for a, b in zip(free, occ):
                assert a.class_id == b.class_id
                assert b.visible <= a.visible + 1e-6
                assert b.labelled == (b.visible >= 0.5 and b.box[2] > b.box[0])
                if b.box[2] > b.box[0]:  # visible part lies inside the unoccluded extent
                    assert a.box[0] <= b.box[0] and a.box[1] <= b.box[1]
                    assert b.box[2] <= a.box[2] and b.box[3] <= a.box[3]
                    shrunk += int(b.box != a.box)
                hidden += int(a.labelled and not b.labelled)
    assert shrunk > 0 and hidden > 0


def test_yolo_txt_and_coco_json_agree(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    summary = generate(_job(out, 3, frames=5, streams=3))
    coco = json.loads((out / "annotations.json").read_text())
    assert [c["name"] for c in coco["categories"]] == [str(i) for i in range(10)]
    assert summary["images"] == len(coco["images"]) == 15
    by_image = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    n_crowd = 0
    for im in coco["images"]:
        w, h = im["width"], im["height"]
        stem = Path(im["file_name"]).stem
        assert (out / im["file_name"]).exists()
        lines = (out / "labels" / f"{stem}.txt").read_text().split("\n")[:-1]
        yolo = sorted(tuple(round(float(v), 4) for v in ln.split()) for ln in lines)
        anns = by_image.get(im["id"], [])
        n_crowd += sum(a["iscrowd"] for a in anns)
        ref = []
        for a in anns:
            if a["iscrowd"]:
                assert a["visible"] < SMALL.min_visible
                continue
            x, y, bw, bh = a["bbox"]
            assert 0 <= x and 0 <= y and x + bw <= w and y + bh <= h and bw > 0 and bh > 0
            ref.append((float(a["category_id"]), round((x + bw / 2) / w, 4), round((y + bh / 2) / h, 4),
                        round(bw / w, 4), round(bh / h, 4)))
        assert yolo == sorted(ref)
    assert summary["objects"] == sum(1 for a in coco["annotations"] if not a["iscrowd"])


def test_test_split_uses_held_out_handwriting() -> None:
    tr, te = load_sprites("train"), load_sprites("test")
    for c in range(10):
        assert len(te.by_class[c]) == 100 and len(tr.by_class[c]) == 400
        a = tr.by_class[c].reshape(len(tr.by_class[c]), -1)
        b = te.by_class[c].reshape(len(te.by_class[c]), -1)
        # no test sprite equals a training sprite
        d = np.abs(a[:, None, :] - b[None, :, :]).sum(-1)
        assert d.min() > 0


def test_difficulty_validation_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--set sizes: unknown key \(did you mean 'size_easy'\?\)"):
        load_difficulty("reference", ["sizes=3"])
    with pytest.raises(ConfigError, match="contrast_hard"):
        load_difficulty("reference", ["contrast_hard=0.5,0.2"])
    f = tmp_path / "d.yaml"
    f.write_text("preset: hard\nobjects_max: 3\nbogus: 1\n")
    with pytest.raises(ConfigError, match=r"d.yaml:3: bogus: unknown key"):
        load_difficulty(str(f))
    with pytest.raises(ConfigError, match=r"^--set size_hard: has 3 items, not 2"):
        load_difficulty("reference", ["size_hard=8,12,16"])
    f.write_text("preset: hard\nobjects_max: 3\n")
    d = load_difficulty(str(f), ["size_hard=8,12"])
    assert d.objects_max == 3 and d.size_hard == (8.0, 12.0) and d.occluder_prob == PRESETS["hard"].occluder_prob
    for preset, shown in (("[1]", "a list"), ("nope", "'nope'"), ("7", "7")):  # a list showed as '[<Val object>]'
        f.write_text(f"preset: {preset}\n")
        with pytest.raises(ConfigError, match=rf"d.yaml:1: preset: {shown} is not allowed; allowed: easy"):
            load_difficulty(str(f))


def test_cli_writes_dataset(tmp_path: Path, capsys) -> None:
    from edgewise.cli import main

    rc = main(["synth", "--out", str(tmp_path / "o"), "--frames", "3", "--streams", "1", "--seed", "4",
               "--split", "test", "--imgsz", "128,96", "--set", "objects_min=1", "--set", "objects_max=2",
               "--format", "png"])
    assert rc == 0
    meta = json.loads((tmp_path / "o" / "dataset.json").read_text())
    assert meta["split"] == "test" and meta["images"] == 3 and meta["difficulty"]["objects_max"] == 2
    im = cv2.imread(str(tmp_path / "o" / "images" / "s000_f000002.png"))
    assert im.shape == (96, 128, 3)
    assert main(["synth", "--out", str(tmp_path / "p"), "--set", "nope=1"]) == 2


def _run(g: StreamGenerator, frames: int) -> list:
    """Per frame: (non-episodic objects as (track, class, size), episodic objects' hardness)."""
    out = []
    for _ in range(frames):
        g.next_frame()
        out.append(([(o.class_id, round(o.size, 6)) for o in g.objects if not o.episodic],
                    [o.hardness for o in g.objects if o.episodic]))
    return out


def test_hard_episodes_are_short_bursts_of_hard_digits_in_an_otherwise_unchanged_scene() -> None:
    d = dataclasses.replace(PRESETS["episodes"], episode_rate=0.1, episode_frames=(5.0, 8.0),
                            episode_objects=(2.0, 3.0))
    with_ep = _run(StreamGenerator(160, 128, d, "train", seed=5, stream=0), 120)
    without = _run(StreamGenerator(160, 128, dataclasses.replace(d, episode_rate=0.0), "train", seed=5,
                                   stream=0), 120)
    # episodes draw from their own random stream: the easy part of the scene is the same scene
    assert [f[0] for f in with_ep] == [f[0] for f in without]
    assert all(not f[1] for f in without)
    hard = [f[1] for f in with_ep]
    assert all(0.65 <= h <= 1.0 for f in hard for h in f)
    assert all(len(f) <= 3 for f in hard)  # one episode at a time, 2-3 digits
    # stretches with hard digits last at most the episode length, and there are several
    runs, n = [], 0
    for f in hard:
        if f:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    assert len(runs) >= 3 and max(runs) <= 8
    # the preset's own rate puts hard digits in a minority of frames; easy streams stay easy
    gens = [StreamGenerator(160, 128, PRESETS["episodes"], "test", seed=3, stream=s) for s in range(8)]
    frames = [f for g in gens for f in _run(g, 100)]
    share = sum(bool(f[1]) for f in frames) / len(frames)
    assert 0.03 <= share <= 0.25, share
    assert max(g.state.hardness for g in gens) <= 0.2


def test_reference_mix_is_unchanged_by_the_episode_knobs(tmp_path: Path) -> None:
    # episode_rate 0 (every preset but "episodes") draws nothing from the episode stream
    generate(_job(tmp_path / "a", 7))
    generate(_job(tmp_path / "b", 7, difficulty=dataclasses.replace(SMALL, episode_frames=(2.0, 3.0),
                                                                     episode_hardness=(0.1, 0.2))))
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.pop("dataset.json") != b.pop("dataset.json")  # which records the knobs
    assert a == b
    coco = json.loads((tmp_path / "a" / "annotations.json").read_text())
    assert not any(im["episode"] for im in coco["images"])


def test_episode_knobs_are_validated() -> None:
    with pytest.raises(ConfigError, match="episode_rate"):
        load_difficulty("episodes", ["episode_rate=1.5"])
    with pytest.raises(ConfigError, match="episode_frames.*whole numbers"):
        load_difficulty("episodes", ["episode_frames=2.5,8"])
    with pytest.raises(ConfigError, match="episode_hardness"):
        load_difficulty("episodes", ["episode_hardness=0.5,1.5"])
    assert load_difficulty("episodes", ["episode_objects=1,1"]).episode_objects == (1.0, 1.0)
