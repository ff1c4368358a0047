"""End-to-end detection on a real built YOLOv5n and on small hand-built graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgewise.errors import ConfigError, InvalidInputError, ModelError
from edgewise.runtime import Detector
from edgewise.runtime.backends.onnxruntime import (
    OnnxRuntimeBackend,
    choose_providers,
    session_options,
)
from edgewise.runtime.metadata import load_model_info
from tests.edgewise.runtime.graphs import fake_yolo, names_meta


def _images(n: int = 4):
    rng = np.random.default_rng(7)
    shapes = [(120, 160), (240, 180), (97, 301), (160, 160)]
    return [rng.integers(0, 255, shapes[i % 4] + (3,), dtype=np.uint8) for i in range(n)]


@pytest.fixture(scope="module")
def det(tiny_model: Path):
    # random weights give low scores: a low threshold makes boxes appear
    with Detector.from_file(tiny_model, backend="onnxruntime", conf_thres=0.001, threads=1) as d:
        yield d


def test_shapes_and_types(det):
    out = det.detect(_images())
    assert len(out) == 4
    assert sum(len(d) for d in out) > 0
    for d, im in zip(out, _images()):
        assert d.boxes.dtype == np.float32 and d.boxes.shape[1] == 4
        assert d.class_scores.shape == (len(d), 10)
        assert d.names == det.names and d.source == det.source
        h, w = im.shape[:2]
        assert (d.boxes[:, 0::2] >= 0).all() and (d.boxes[:, 0::2] <= w).all()
        assert (d.boxes[:, 1::2] >= 0).all() and (d.boxes[:, 1::2] <= h).all()
        assert ((d.class_ids >= 0) & (d.class_ids < 10)).all()
        assert 0.0 <= d.missed_objectness <= 1.0


def test_deterministic(det):
    a = det.detect(_images())
    b = det.detect(_images())
    for x, y in zip(a, b):
        assert np.array_equal(x.boxes, y.boxes) and np.array_equal(x.scores, y.scores)


def test_batch_of_one_and_four_agree(det):
    four = det.detect(_images())
    for im, d4 in zip(_images(), four):
        (d1,) = det.detect([im])
        assert np.array_equal(d1.class_ids, d4.class_ids)
        np.testing.assert_allclose(d1.boxes, d4.boxes, atol=1e-3)
        np.testing.assert_allclose(d1.scores, d4.scores, atol=1e-5)


def test_stages_compose_to_detect(det):
    batch, metas = det.preprocess(_images(2))
    assert batch.shape == (2, 3, 160, 160) and batch.dtype == np.float32
    raw = det.infer(batch)
    assert raw.shape == (2, 1575, 15) and raw.dtype == np.float32
    staged = det.postprocess(raw, metas)
    direct = det.detect(_images(2))
    assert [len(d) for d in staged] == [len(d) for d in direct]


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((10, 10, 3), np.float32), r"image 1: expected dtype uint8"),
        (np.zeros((10, 10), np.uint8), r"image 1: expected shape HxWx3"),
        (np.zeros((10, 10, 4), np.uint8), r"image 1: expected shape HxWx3"),
        (np.zeros((0, 10, 3), np.uint8), r"image 1: empty image"),
        ("not an image", r"image 1: expected a numpy array"),
    ],
)
def test_bad_images_name_the_index(det, bad, match):
    with pytest.raises(InvalidInputError, match=match):
        det.detect([_images(1)[0], bad])


def test_single_array_instead_of_list(det):
    with pytest.raises(InvalidInputError, match="wrap a single image"):
        det.detect(_images(1)[0])


def test_empty_batch(det):
    assert det.detect([]) == []


def test_bad_options(tiny_model: Path, tmp_path: Path):
    with pytest.raises(ConfigError, match="backend 'cuda'"):
        Detector.from_file(tiny_model, backend="cuda")
    with pytest.raises(ConfigError, match="iou_thres"):
        Detector.from_file(tiny_model, iou_thres=1.5)
    with pytest.raises(ModelError, match="does not exist"):
        Detector.from_file(tmp_path / "missing.onnx")
    with pytest.raises(ConfigError, match="CUDAExecutionProvider"):
        Detector.from_file(tiny_model, providers=["CUDAExecutionProvider"])


def test_score_threshold_is_the_models_own_unless_given(tmp_path: Path):
    stated = fake_yolo(tmp_path / "stated.onnx", metadata={**names_meta(["a", "b"]), "edgewise_conf_thres": "0.6"})
    plain = fake_yolo(tmp_path / "plain.onnx", metadata=names_meta(["a", "b"]))
    img = np.random.default_rng(3).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    with Detector.from_file(stated, threads=1) as own, Detector.from_file(stated, conf_thres=0.01, threads=1) as low, \
            Detector.from_file(plain, threads=1) as default:
        assert own.params.conf_thres == 0.6 and low.params.conf_thres == 0.01
        assert default.params.conf_thres == 0.25  # YOLOv5's default where the model states none
        kept, every = own.detect([img])[0], low.detect([img])[0]
        assert len(every) > len(kept) and (kept.scores >= 0.6).all()
        assert sorted(kept.scores.tolist()) == sorted(s for s in every.scores.tolist() if s >= 0.6)


def test_fixed_batch_model_is_split_and_padded(tmp_path: Path):
    dyn = fake_yolo(tmp_path / "dyn.onnx", nc=2, metadata=names_meta(["a", "b"]))
    fixed = fake_yolo(tmp_path / "fixed.onnx", nc=2, batch=2, metadata=names_meta(["a", "b"]))
    x = np.random.default_rng(0).random((5, 3, 32, 32), dtype=np.float32)
    a = OnnxRuntimeBackend(load_model_info(dyn), threads=1).run(x)
    b = OnnxRuntimeBackend(load_model_info(fixed), threads=1).run(x)
    assert a.shape == b.shape == (5, 63, 7)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_io_binding_path_matches_plain_run(tmp_path: Path):
    p = fake_yolo(tmp_path / "m.onnx", nc=2)
    info = load_model_info(p)
    x = np.random.default_rng(1).random((2, 3, 32, 32), dtype=np.float32)
    plain = OnnxRuntimeBackend(info, threads=1, io_binding=False).run(x)
    bound = OnnxRuntimeBackend(info, threads=1, io_binding=True).run(x)
    np.testing.assert_array_equal(plain, bound)


def test_provider_preference():
    avail = ["CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider", "AzureExecutionProvider"]
    chosen = choose_providers(avail, trt_cache_dir=Path("/tmp/c"))
    assert [c if isinstance(c, str) else c[0] for c in chosen] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert chosen[0][1]["trt_engine_cache_path"] == "/tmp/c"
    assert choose_providers(["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert choose_providers(avail, ["CUDAExecutionProvider"]) == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(ConfigError, match="graph_opt"):
        session_options(graph_opt="max")
    with pytest.raises(ConfigError, match="threads"):
        session_options(threads=-1)


def test_native_input_runs_each_image_at_its_own_scale(native_model: Path, tiny_model: Path) -> None:
    with Detector.from_file(native_model, conf_thres=0.001, threads=1, input_size="native") as nat, \
            Detector.from_file(native_model, conf_thres=0.001, threads=1) as fixed:
        assert nat.info.dynamic_hw and nat.backend.name.startswith("onnxruntime")
        im = _images(1)[0]  # 120 x 160: padded to 128 x 160, never scaled
        batch, metas = nat.preprocess([im])
        assert batch.shape == (1, 3, 128, 160) and metas[0].ratio == (1.0, 1.0)
        # two sizes in one batch: the largest native shape, the smaller image padded to it
        batch, metas = nat.preprocess([im, np.zeros((700, 1280, 3), np.uint8)])
        assert batch.shape == (2, 3, 704, 1280) and metas[0].ratio == (1.0, 1.0)
        (d,) = nat.detect([im])
        assert len(d) and (d.boxes[:, 2] <= 160).all() and (d.boxes[:, 3] <= 120).all()
        assert fixed.preprocess([im])[0].shape == (1, 3, 160, 160)  # the model's imgsz, scaled up
    with Detector.from_file(native_model, threads=1, input_size="native", max_side=640) as capped:
        assert capped.preprocess([np.zeros((720, 1280, 3), np.uint8)])[0].shape == (1, 3, 384, 640)
    with pytest.raises(ConfigError, match="dynamic height and width"):
        Detector.from_file(tiny_model, input_size="native")
    with pytest.raises(ConfigError, match="TensorRT engine is built for one input size"):
        Detector.from_file(native_model, backend="tensorrt", input_size="native")
    with pytest.raises(ConfigError, match="input size 'huge'"):
        Detector.from_file(native_model, input_size="huge")


def test_auto_input_size_is_native_only_for_a_model_that_asks(native_model: Path, tmp_path: Path) -> None:
    import onnx

    with Detector.from_file(native_model, threads=1, input_size="auto") as d:
        assert d.input_size == "native"
    proto = onnx.load(str(native_model))
    keep = [(m.key, m.value) for m in proto.metadata_props if m.key not in ("input_size", "imgsz")]
    del proto.metadata_props[:]  # like an upstream `export.py --dynamic` file: letterboxed to a size
    for k, v in keep:
        prop = proto.metadata_props.add()
        prop.key, prop.value = k, v
    onnx.save(proto, str(tmp_path / "upstream.onnx"))
    with Detector.from_file(tmp_path / "upstream.onnx", threads=1, input_size="auto", imgsz=160) as d:
        assert d.input_size == "model" and d.preprocess([np.zeros((90, 160, 3), np.uint8)])[0].shape[2:] == (160, 160)


def test_missing_backends_are_one_line_saying_what_to_install(tiny_model, monkeypatch):
    """No TensorRT and no ONNX Runtime: ``auto`` says both, in one line (no traceback)."""
    from edgewise.errors import DeploymentError
    from edgewise.runtime import detector as D
    from edgewise.runtime.backends import onnxruntime as ortb

    def missing():
        raise DeploymentError(f"{ortb.ONNXRUNTIME_MISSING} (No module named 'onnxruntime')")

    monkeypatch.setattr(ortb, "import_onnxruntime", missing)
    monkeypatch.setattr(D, "tensorrt_unusable_reason", lambda: "the tensorrt module is not installed")
    with pytest.raises(DeploymentError) as exc:
        D.Detector.from_file(tiny_model, backend="auto")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("backend auto: TensorRT is not usable here (the tensorrt module")
    assert "pip install onnxruntime" in msg and "setup.sh --force" in msg
    with pytest.raises(DeploymentError, match="^the onnxruntime backend needs ONNX Runtime"):
        D.Detector.from_file(tiny_model, backend="onnxruntime")
