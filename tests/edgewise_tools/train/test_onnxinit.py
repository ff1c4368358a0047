"""ONNX ``--init``: an exported (Conv+BN fused) model becomes a trainable one computing the same function."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from edgewise.errors import ConfigError  # noqa: E402
from edgewise_tools.models.export import export_onnx  # noqa: E402
from edgewise_tools.models.yolov5 import Conv, build_model  # noqa: E402
from edgewise_tools.train import TrainConfig, train  # noqa: E402
from edgewise_tools.train.data import NO_AUGMENT, YoloDataset, batches  # noqa: E402
from edgewise_tools.train.onnxinit import export_native, load_onnx  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trained_like(seed: int) -> torch.nn.Module:
    """A yolov5n whose BatchNorms hold non-trivial statistics and affine parameters."""
    m = build_model("yolov5n", nc=10, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for bn in (x for x in m.modules() if isinstance(x, torch.nn.BatchNorm2d)):
            bn.running_mean.copy_(torch.randn(bn.num_features, generator=g) * 0.3)
            bn.running_var.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) + 0.5)
            bn.bias.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
    return m.eval()


def test_unfused_model_computes_what_the_onnx_file_computes(tiny_data: Path, tmp_path: Path) -> None:
    onnx_path = export_onnx(_trained_like(1), tmp_path / "m.onnx", imgsz=128)
    x, _, _ = next(batches(YoloDataset(tiny_data, 128), 8, np.random.default_rng(0), NO_AUGMENT, shuffle=False))
    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]

    fresh = build_model("yolov5n", nc=10, seed=7)
    used = load_onnx(fresh, onnx_path, images=x)
    assert used == 2 * sum(isinstance(m, Conv) for m in fresh.modules()) + 2 * 3  # every block + the 3 head convs
    assert fresh.training
    fresh.eval()
    with torch.no_grad():
        got = fresh(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got[..., 4:], want[..., 4:], atol=1e-4)
    np.testing.assert_allclose(got[..., :4], want[..., :4], atol=2e-2, rtol=1e-4)
    # in train mode, a batch like the calibration images is normalised by nearly the same
    # statistics: the first layer's BatchNorm output equals the fused conv's
    fresh.train()
    first = fresh.model[0]
    with torch.no_grad():
        conv_out = first.conv(torch.from_numpy(x))
        bn_train = first.bn(conv_out)
        fused = conv_out + (first.bn.bias - first.bn.running_mean).view(1, -1, 1, 1)
    np.testing.assert_allclose(bn_train.numpy(), fused.numpy(), atol=1e-2)


def test_training_starts_from_an_onnx_file(tiny_data: Path, tmp_path: Path) -> None:
    onnx_path = export_onnx(_trained_like(2), tmp_path / "m.onnx", imgsz=128)
    cfg = TrainConfig(data=str(tiny_data), out=str(tmp_path / "run"), imgsz=128, epochs=1, batch=4, nbs=4,
                      warmup_epochs=0.0, log_every=0, threads=1, init=str(onnx_path), export_onnx=False)
    summary = train(cfg)
    assert summary["epochs_run"] == 1
    assert json.loads((tmp_path / "run" / "config.json").read_text())["init"] == str(onnx_path)


def test_another_architecture_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    onnx_path = export_onnx(build_model("yolov5n", nc=10).eval(), tmp_path / "n.onnx", imgsz=64)
    with pytest.raises(ConfigError, match=r"model\.0\.conv\.weight.*another architecture"):
        load_onnx(build_model("yolov5s", nc=10), onnx_path)
    with pytest.raises(ConfigError, match=r"model\.24\.m\.0\.weight"):
        load_onnx(build_model("yolov5n", nc=3), onnx_path)
    (tmp_path / "junk.onnx").write_bytes(b"not onnx")
    with pytest.raises(ConfigError, match="not a readable ONNX"):
        load_onnx(build_model("yolov5n", nc=10), tmp_path / "junk.onnx")


def test_native_export_computes_the_same_at_any_size(tmp_path: Path) -> None:
    src = export_onnx(_trained_like(3), tmp_path / "fixed.onnx", imgsz=128, arch="yolov5n")
    dst = export_native(src, tmp_path / "native.onnx")
    x = np.random.default_rng(0).random((1, 3, 128, 128), np.float32)
    run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (src, dst)}
    np.testing.assert_allclose(run[dst].run(None, {"images": x})[0], run[src].run(None, {"images": x})[0], atol=1e-3)
    wide = np.random.default_rng(1).random((1, 3, 64, 192), np.float32)  # the fixed file refuses this shape
    assert run[dst].run(None, {"images": wide})[0].shape == (1, 3 * (8 * 24 + 4 * 12 + 2 * 6), 15)
    assert run[dst].get_modelmeta().custom_metadata_map["input_size"] == "native"
    import onnx

    foreign = onnx.load(str(src))  # an export by another tool: no edgewise_arch
    kept = [m for m in foreign.metadata_props if m.key != "edgewise_arch"]
    del foreign.metadata_props[:]
    foreign.metadata_props.extend(kept)
    onnx.save(foreign, str(tmp_path / "foreign.onnx"))
    with pytest.raises(ConfigError, match="no edgewise_arch"):
        export_native(tmp_path / "foreign.onnx", tmp_path / "x.onnx")
