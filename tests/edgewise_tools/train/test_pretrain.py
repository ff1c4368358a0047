"""Backbone pre-training: crops sit on the labelled objects, the classifier learns, the
backbone loads into a detector (and only into the architecture it came from)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgewise.errors import ConfigError  # noqa: E402
from edgewise_tools.models.yolov5 import build_model  # noqa: E402
from edgewise_tools.train import TrainConfig, train  # noqa: E402
from edgewise_tools.train.data import read_yolo_labels  # noqa: E402
from edgewise_tools.train.pretrain import (  # noqa: E402
    BackboneClassifier,
    _to_tensor,
    load_backbone,
    main,
    object_crops,
    widen_backbone,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_crops_are_centred_on_each_labelled_object(tiny_data: Path) -> None:
    crops, classes = object_crops(tiny_data, 48, 3, np.random.default_rng(0))
    labels = [read_yolo_labels(p) for p in sorted((tiny_data / "labels").glob("*.txt"))]
    expected = np.concatenate([np.repeat(lab[:, 0], 3) for lab in labels if len(lab)]).astype(np.int64)
    assert crops.shape == (len(expected), 48, 48, 3) and crops.dtype == np.uint8
    assert np.array_equal(classes, expected)


def test_crop_geometry_on_a_hand_made_image(tmp_path: Path) -> None:
    # one white 20x20 square at (40..60, 20..40) of a grey 100x80 frame, class 7
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    im = np.full((80, 100, 3), 100, np.uint8)
    im[20:40, 40:60] = 255
    cv2.imwrite(str(tmp_path / "images" / "f.png"), im)
    (tmp_path / "labels" / "f.txt").write_text(f"7 {50 / 100} {30 / 80} {20 / 100} {20 / 80}\n")
    crops, classes = object_crops(tmp_path, 48, 20, np.random.default_rng(0))
    assert classes.tolist() == [7] * 20
    # context 1.3-2.1x the box and centre jitter <= 15%: the crop centre is always the square,
    # the border ring mostly the grey background, and the square fills 1/2.1^2..1/1.3^2 of the crop
    assert (crops[:, 22:26, 22:26] > 240).all()
    ring = np.concatenate([crops[:, 0], crops[:, -1], crops[:, :, 0], crops[:, :, -1]], 1).astype(float)
    assert (np.median(ring, axis=(1, 2)) < 110).all()
    white = (crops[..., 0] > 177).mean((1, 2))
    assert ((white > 0.8 / 2.1 ** 2) & (white < 1.2 / 1.3 ** 2)).all(), white


def test_empty_or_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no images/ folder"):
        object_crops(tmp_path, 48, 1, np.random.default_rng(0))
    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.jpg"), np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ConfigError, match="no labelled objects"):
        object_crops(tmp_path, 48, 1, np.random.default_rng(0))


def test_a_dataset_synth_did_not_finish_writing_is_refused(tmp_path: Path) -> None:
    """Pre-training reads the synth layout as `train` does: a folder an interrupted `edgewise
    synth` left (its marker still there, part of the frames, the last perhaps without its labels)
    was taken for the dataset, while train, eval and check-policy refuse it."""
    from edgewise.synth.writer import INCOMPLETE

    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "f.png"), np.full((80, 100, 3), 100, np.uint8))
    (tmp_path / "labels" / "f.txt").write_text("7 0.5 0.5 0.2 0.25\n")
    (tmp_path / INCOMPLETE).write_text("")
    with pytest.raises(ConfigError, match="an `edgewise synth` run that wrote this dataset did not finish"):
        object_crops(tmp_path, 48, 1, np.random.default_rng(0))


def test_classifier_loss_falls_and_backbone_loads_into_detector(tiny_data: Path, tmp_path: Path) -> None:
    crops, classes = object_crops(tiny_data, 48, 2, np.random.default_rng(1))
    torch.manual_seed(0)
    model = BackboneClassifier(build_model("yolov5n", nc=10), 10).train()
    opt = torch.optim.AdamW(model.parameters(), lr=0.002)
    x, y = _to_tensor(crops), torch.from_numpy(classes)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3]), losses

    out = tmp_path / "bb.pt"
    assert main(["--data", str(tiny_data), "--out", str(out), "--arch", "yolov5n", "--time-budget", "3",
                 "--batch", "8", "--max-epochs", "1"]) == 0
    saved = torch.load(out, weights_only=False)
    assert json.loads(out.with_suffix(".json").read_text()) == saved["summary"]
    assert saved["summary"]["arch"] == "yolov5n" and saved["summary"]["crops_seen"] > 0
    det = build_model("yolov5n", nc=10, seed=7)
    head_before = det.model[-1].m[0].weight.clone()
    assert load_backbone(det, out) == len(saved["backbone"])
    for k, v in saved["backbone"].items():
        assert torch.equal(det.state_dict()[k], v), k
    assert torch.equal(det.model[-1].m[0].weight, head_before)  # the Detect head is untouched

    with pytest.raises(ConfigError, match="different architecture"):
        load_backbone(build_model("yolov5s", nc=10), out)
    # the trainer starts from it (--init), and rejects a missing file up front
    summary = train(TrainConfig(data=str(tiny_data), out=str(tmp_path / "run"), imgsz=128, epochs=1, batch=4,
                                nbs=4, warmup_epochs=0.0, log_every=0, threads=1, init=str(out),
                                export_onnx=False))
    assert summary["epochs_run"] == 1
    with pytest.raises(ConfigError, match="no such file"):
        TrainConfig(data=str(tiny_data), out="x", init=str(tmp_path / "missing.pt")).validate()

    # a trainer checkpoint loads whole (fine-tuning a trained detector on new data) ...
    ck = tmp_path / "run" / "last.pt"
    fresh = build_model("yolov5n", nc=10, seed=3)
    assert load_backbone(fresh, ck) == len(fresh.state_dict())
    trained = torch.load(ck, weights_only=False)["model"]
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in trained.items())
    # ... and anything else is refused by name
    torch.save({"weights": {}}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="neither an edgewise backbone file nor a trainer checkpoint"):
        load_backbone(fresh, tmp_path / "other.pt")


def test_widening_yolov5n_to_yolov5s_preserves_the_features() -> None:
    torch.manual_seed(0)
    narrow = BackboneClassifier(build_model("yolov5n", nc=10, seed=1), 10)
    for m in narrow.modules():  # non-trivial BatchNorm statistics and affine parameters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.normal_()
            m.bias.data.normal_()
    narrow.eval()
    source = {f"model.{k}": v for k, v in narrow.backbone.state_dict().items()}
    wide = BackboneClassifier(build_model("yolov5s", nc=10), 10).eval()
    widen_backbone(wide.backbone, source)
    x = torch.rand(2, 3, 64, 96)
    with torch.no_grad():
        fn, fw = narrow.backbone(x), wide.backbone(x)
    assert fw.shape[1] == 2 * fn.shape[1]
    # every source channel appears twice (channels 2c and 2c+1), with the same values
    assert torch.allclose(fw[:, 0::2], fn, atol=1e-4) and torch.allclose(fw[:, 1::2], fn, atol=1e-4)
    # noise breaks the symmetry between the two copies, but only slightly
    widen_backbone(wide.backbone, source, noise=0.01)
    with torch.no_grad():
        fw = wide.backbone(x)
    assert not torch.equal(fw[:, 0::2], fw[:, 1::2])
    assert torch.nn.functional.cosine_similarity(fw[:, 0::2].flatten(), fn.flatten(), dim=0) > 0.95

    with pytest.raises(ConfigError, match="cannot widen"):  # a different depth (yolov5m) has other layers
        widen_backbone(BackboneClassifier(build_model("yolov5m", nc=10), 10).backbone, source)
