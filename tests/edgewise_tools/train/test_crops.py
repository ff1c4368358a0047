"""Native-scale crops for the cloud model: labels follow the pixels, same seed same files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgewise.errors import ConfigError
from edgewise.synth import PRESETS, SynthJob, generate
from edgewise_tools.train.crops import crop_labels, crop_windows, main, make_crops
from edgewise_tools.train.data import read_yolo_labels


@pytest.fixture(scope="module")
def camera_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cam") / "ds"
    generate(SynthJob(out=out, frames=3, streams=2, seed=4, split="train", width=640, height=360,
                      difficulty=PRESETS["camera"]))
    return out


def test_boxes_are_clipped_into_the_crop_and_dropped_when_mostly_outside() -> None:
    # one 20x40 box at x 90..110, y 10..50 of a 200x100 frame
    lab = np.array([[7, 0.5, 0.3, 0.1, 0.4]], np.float32)
    (line,) = crop_labels(lab, 200, 100, (80, 0, 180, 100), keep=0.6)
    cls, cx, cy, w, h = (float(v) for v in line.split())
    assert cls == 7 and (cx * 100, cy * 100, w * 100, h * 100) == pytest.approx((20, 30, 20, 40), abs=1e-3)
    assert crop_labels(lab, 200, 100, (100, 0, 200, 100), keep=0.6) == []  # half of it inside
    assert len(crop_labels(lab, 200, 100, (100, 0, 200, 100), keep=0.5)) == 1


def test_first_window_holds_an_object_and_windows_stay_in_the_frame() -> None:
    rng = np.random.default_rng(0)
    lab = np.array([[1, 0.9, 0.8, 0.02, 0.05]], np.float32)
    for _ in range(50):
        wins = crop_windows(1280, 720, lab, 320, 3, rng)
        assert len(wins) == 3
        for x0, y0, x1, y1 in wins:
            assert 0 <= x0 and x1 <= 1280 and 0 <= y0 and y1 <= 720 and (x1 - x0, y1 - y0) == (320, 320)
        x0, y0, x1, y1 = wins[0]
        assert x0 <= 0.9 * 1280 <= x1 and y0 <= 0.8 * 720 <= y1


def test_crops_keep_native_scale_and_are_reproducible(camera_data: Path, tmp_path: Path) -> None:
    import cv2

    a = make_crops(camera_data, tmp_path / "a", size=160, per_frame=2, seed=3)
    make_crops(camera_data, tmp_path / "b", size=160, per_frame=2, seed=3)
    assert a["images"] == 12 and a["objects"] > 0 and a["names"] == [str(i) for i in range(10)]
    files_a = sorted((tmp_path / "a").rglob("*.*"))
    assert [p.read_bytes() for p in files_a] == [(tmp_path / "b" / p.relative_to(tmp_path / "a")).read_bytes()
                                                  for p in files_a]
    heights = []
    for img in sorted((tmp_path / "a" / "images").iterdir()):
        assert cv2.imread(str(img)).shape == (160, 160, 3)
        heights += [h * 160 for h in read_yolo_labels(tmp_path / "a" / "labels" / f"{img.stem}.txt")[:, 4]]
    frame_heights = [hh * 360 for p in (camera_data / "labels").iterdir() for hh in read_yolo_labels(p)[:, 4]]
    # native scale: the crops' boxes are as tall as in the frames (a clipped box only shrinks)
    assert max(heights) <= max(frame_heights) + 1e-3 and np.median(heights) > 0.5 * np.median(frame_heights)
    assert json.loads((tmp_path / "a" / "dataset.json").read_text())["per_frame"] == 2


def test_cli_and_bad_arguments(camera_data: Path, tmp_path: Path, capsys) -> None:
    assert main(["--data", str(camera_data), "--out", str(tmp_path / "c"), "--size", "96", "--per-frame", "1",
                 "--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 2
    assert main(["--data", str(tmp_path), "--out", str(tmp_path / "d")]) == 2
    assert "no images/ folder" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--size"):
        make_crops(camera_data, tmp_path / "e", size=8)


def test_camera_packaging_exports_a_rect_edge_and_a_native_cloud(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from edgewise.runtime.metadata import load_model_info
    from edgewise_tools.models.yolov5 import build_model
    from edgewise_tools.train.camera import export_pair
    from edgewise_tools.train.trainer import TrainConfig, save_checkpoint

    run = tmp_path / "run"
    (run / "data" / "cam-train").mkdir(parents=True)  # the training frames' size sets the edge's aspect
    (run / "data" / "cam-train" / "dataset.json").write_text(json.dumps({"width": 160, "height": 90}))
    for stage, arch in (("edge-96", "yolov5n"), ("cloud", "yolov5n")):
        (run / stage).mkdir(parents=True)
        save_checkpoint(run / stage / "best.pt", build_model(arch, nc=10), TrainConfig(data="d", out="o", arch=arch),
                        [str(i) for i in range(10)], 1, {"map50": 0.5})
        (run / stage / "summary.json").write_text(json.dumps({"best_map50": 0.5, "imgsz": 96}))
    files = export_pair(run, tmp_path / "models", "edge-96")  # 160x90 at 96: 96x54, rounded up to 64
    edge, cloud = load_model_info(files["edge"]), load_model_info(files["cloud"])
    assert edge.imgsz == (64, 96) and not edge.dynamic_hw and edge.metadata["edgewise_world"] == "camera"
    assert cloud.dynamic_hw and cloud.imgsz == (96, 96) and cloud.metadata["edgewise_val_map50"] == "0.5000"
    mtime = files["edge"].stat().st_mtime_ns
    export_pair(run, tmp_path / "models", "edge-96")  # newer than its checkpoint: kept
    assert files["edge"].stat().st_mtime_ns == mtime
    files["edge"].unlink()
    assert load_model_info(export_pair(run, tmp_path / "models", "edge-96", (96, 96))["edge"]).imgsz == (96, 96)
    with pytest.raises(FileNotFoundError, match="edge-320/best.pt: the edge-320 stage has not written"):
        export_pair(run, tmp_path / "models", "edge-320")


def test_each_models_threshold_is_chosen_on_validation_and_written_into_it(tmp_path: Path, camera_data: Path) -> None:
    from edgewise.runtime import Detector
    from edgewise.runtime.metadata import load_model_info
    from edgewise_tools.train.camera import operating_points
    from edgewise_tools.train.reference import CONF_GRID
    from tests.edgewise.runtime.graphs import fake_yolo, names_meta

    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "cam-val").symlink_to(camera_data)
    model = fake_yolo(tmp_path / "m.onnx", nc=10, metadata=names_meta([str(i) for i in range(10)]))
    got = operating_points(run, [model], threads=1)["m.onnx"]
    record = json.loads((run / "conf-m.json").read_text())
    assert got == record and record["conf"] in CONF_GRID and len(record["curve"]) == len(CONF_GRID)
    best = max(v["f1"] for v in record["curve"].values())
    assert record["curve"][str(record["conf"])]["f1"] == best  # the best F1; ties go to the lowest threshold
    assert min(float(c) for c, v in record["curve"].items() if v["f1"] == best) == record["conf"]
    assert load_model_info(model).conf_thres == record["conf"]
    with Detector.from_file(model, threads=1) as det:  # the runtime's default for this model
        assert det.params.conf_thres == record["conf"]
    mtime = model.stat().st_mtime_ns
    operating_points(run, [model], threads=1)  # stated and recorded: kept
    assert model.stat().st_mtime_ns == mtime


def test_edge_stages_are_ordered_by_input_size(tmp_path: Path) -> None:
    from edgewise_tools.train.camera import edge_stages

    for name in ("edge-416", "edge-96", "edge-320", "edge-x", "cloud"):
        (tmp_path / name).mkdir()
    assert edge_stages(tmp_path) == ["edge-96", "edge-320", "edge-416"]  # by size, not by name


def test_a_rerun_does_not_mix_its_crops_with_an_earlier_larger_runs(camera_data: Path, tmp_path: Path) -> None:
    """Crops written into a folder that holds an earlier run's kept its extra crops beside the new
    ones (dataset.json said 2 images, images/ held 12, and `edgewise train` trained on all 12):
    a non-empty --out is refused, and --overwrite replaces the earlier crops."""
    from edgewise.errors import InvalidInputError
    from edgewise_tools.train.data import YoloDataset

    out = tmp_path / "c"
    assert make_crops(camera_data, out, size=96, per_frame=2)["images"] == 12
    with pytest.raises(InvalidInputError, match=r"is not empty .* pass --overwrite"):
        make_crops(camera_data, out, size=96, per_frame=1, limit=2)
    assert len(list((out / "images").iterdir())) == 12  # refused: nothing removed
    assert make_crops(camera_data, out, size=96, per_frame=1, limit=2, overwrite=True)["images"] == 2
    assert len(list((out / "images").iterdir())) == len(list((out / "labels").iterdir())) == 2
    assert len(YoloDataset(out, 96)) == 2
    (out / "images" / "mine.jpg").write_bytes(b"")  # not a crop: --overwrite refuses to remove it
    with pytest.raises(InvalidInputError, match="images/mine.jpg"):
        make_crops(camera_data, out, size=96, per_frame=1, overwrite=True)


def test_ctrl_c_leaves_a_marked_incomplete_dataset_that_readers_refuse(camera_data: Path, tmp_path: Path) -> None:
    """A real SIGINT while the crops are written: one line and exit status 130, no traceback; the
    folder keeps its marker, so `edgewise train` refuses it instead of training on part of the
    crops, and a rerun with --overwrite completes it."""
    import signal
    import subprocess
    import sys
    import time

    from edgewise.synth.writer import CROPS_INCOMPLETE
    from edgewise_tools.train.data import YoloDataset

    out = tmp_path / "c"
    args = ["--data", str(camera_data), "--out", str(out), "--size", "32", "--per-frame", "3000"]
    proc = subprocess.Popen([sys.executable, "-m", "edgewise_tools.train.crops", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not (
                (out / "images").is_dir() and any((out / "images").iterdir())):
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = err.decode()
    assert proc.returncode == 130, text[-2000:]
    assert "Traceback" not in text and f"crops: interrupted; {out} holds an incomplete dataset" in text
    assert (out / CROPS_INCOMPLETE).exists() and not (out / "dataset.json").exists()
    with pytest.raises(ConfigError, match=r"edgewise_tools.train.crops` run that wrote this dataset did not finish"):
        YoloDataset(out, 32)
    assert main([*args[:-1], "1", "--overwrite"]) == 0
    assert not (out / CROPS_INCOMPLETE).exists() and len(YoloDataset(out, 32)) == 6
