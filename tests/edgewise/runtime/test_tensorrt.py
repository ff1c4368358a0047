"""TensorRT backend: everything that needs no GPU, plus a real build where TensorRT exists."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgewise.errors import ConfigError, DeploymentError, InvalidInputError
from edgewise.runtime.backends import tensorrt as trtb
from edgewise.runtime.letterbox import preprocess_batch
from edgewise.runtime.metadata import load_model_info
from tests.conftest import ROOT

HAS_TRT = importlib.util.find_spec("tensorrt") is not None

KEY_ARGS = dict(model_sha256="ab" * 32, precision="fp16", imgsz=(640, 640), trt_version="8.5.2.2",
                gpu_name="Xavier", max_batch=1)


def test_cache_key_is_stable_and_readable():
    k = trtb.engine_cache_key(**KEY_ARGS)
    assert k == trtb.engine_cache_key(**KEY_ARGS)
    assert k.startswith("abababababababab-fp16-640x640-b1-trt8.5.2.2-xavier-") and k.endswith(".engine")


@pytest.mark.parametrize("field, value", [
    ("model_sha256", "cd" * 32), ("precision", "int8"), ("imgsz", (320, 320)),
    ("trt_version", "10.3.0"), ("gpu_name", "NVIDIA H100"), ("max_batch", 8),
])
def test_cache_key_changes_with_every_input(field, value):
    assert trtb.engine_cache_key(**{**KEY_ARGS, field: value}) != trtb.engine_cache_key(**KEY_ARGS)


def test_cache_key_distinguishes_names_that_slug_alike():
    a = trtb.engine_cache_key(**{**KEY_ARGS, "gpu_name": "GPU A"})
    b = trtb.engine_cache_key(**{**KEY_ARGS, "gpu_name": "GPU-A"})
    assert a != b


def test_cache_key_rejects_unknown_precision():
    with pytest.raises(ConfigError, match="precision 'int4'"):
        trtb.engine_cache_key(**{**KEY_ARGS, "precision": "int4"})


def test_default_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEWISE_ENGINE_CACHE", str(tmp_path))
    assert trtb.default_cache_dir() == tmp_path


def test_publish_is_atomic_for_writers_sharing_a_cache(tmp_path: Path):
    """Workers sharing an engine cache volume may write the same engine at once: the file is
    always one writer's complete bytes and no temporary file is left behind."""
    import threading

    path = tmp_path / "engines" / "m.engine"
    blobs = [bytes([i]) * 200_000 for i in range(8)]
    threads = [threading.Thread(target=trtb.publish, args=(path, b)) for b in blobs for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_bytes() in blobs
    assert [p.name for p in path.parent.iterdir()] == ["m.engine"]


def test_version_tuple():
    assert trtb.trt_version_tuple("8.5.2.2") == (8, 5, 2, 2)
    assert trtb.trt_version_tuple("10.3.0.post1") == (10, 3, 0, 1)


def _write_images(d: Path, n: int) -> list:
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ims = []
    for i in range(n):
        im = rng.integers(0, 255, (40 + i, 60, 3), dtype=np.uint8)
        cv2.imwrite(str(d / f"{i:03d}.png"), im)
        ims.append(im)
    return ims


def test_calibration_batches_letterbox_and_cycle(tmp_path: Path):
    ims = _write_images(tmp_path / "calib", 5)
    (tmp_path / "calib" / "notes.txt").write_text("not an image")
    cb = trtb.CalibrationBatches.from_dir(tmp_path / "calib", (32, 32), batch_size=2)
    assert len(cb) == 3
    batches = list(cb)
    assert [b.shape for b in batches] == [(2, 3, 32, 32)] * 3
    assert all(b.flags["C_CONTIGUOUS"] and b.dtype == np.float32 for b in batches)
    expect, _ = preprocess_batch([ims[4], ims[0]], (32, 32), auto=False)  # last batch cycles
    np.testing.assert_array_equal(batches[2], expect)


def test_calibration_max_images(tmp_path: Path):
    _write_images(tmp_path / "c", 5)
    assert len(trtb.CalibrationBatches.from_dir(tmp_path / "c", (32, 32), 1, max_images=3)) == 3


def test_calibration_folder_errors(tmp_path: Path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        trtb.CalibrationBatches.from_dir(tmp_path / "nope", (32, 32))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInputError, match="holds no images"):
        trtb.CalibrationBatches.from_dir(tmp_path / "empty", (32, 32))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jpg").write_bytes(b"garbage")
    with pytest.raises(InvalidInputError, match=r"x\.jpg cannot be decoded"):
        list(trtb.CalibrationBatches.from_dir(tmp_path / "bad", (32, 32)))


@pytest.mark.skipif(HAS_TRT, reason="TensorRT is installed here; the missing-TensorRT message cannot be shown")
def test_clear_error_when_tensorrt_is_absent(tiny_model: Path):
    with pytest.raises(trtb.TensorRTUnavailableError, match=r"pip install tensorrt.*JetPack|JetPack.*pip install tensorrt"):
        trtb.import_tensorrt()
    from edgewise.runtime import Detector

    with pytest.raises(DeploymentError, match="JetPack"):
        Detector.from_file(tiny_model, backend="tensorrt")
    # auto falls back to ONNX Runtime
    assert Detector.from_file(tiny_model, backend="auto").backend.name.startswith("onnxruntime")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed (needs an NVIDIA GPU, JetPack or pip install tensorrt)")
def test_engine_build_cache_and_agreement(tiny_model: Path, tmp_path: Path):  # pragma: no cover - GPU only
    if trtb.cuda_device_name() is None:
        pytest.skip("TensorRT is installed but no CUDA device / CUDA Python bindings are available")
    from edgewise.runtime.backends.onnxruntime import OnnxRuntimeBackend

    info = load_model_info(tiny_model)
    be = trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path, precision="fp16", max_batch=4)
    engines = list(tmp_path.glob("*.engine"))
    assert len(engines) == 1
    x = np.random.default_rng(0).random((3, 3, 160, 160), dtype=np.float32)
    ref = OnnxRuntimeBackend(info, threads=1).run(x)
    np.testing.assert_allclose(be.run(x), ref, atol=0.05)
    mtime = engines[0].stat().st_mtime
    trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path, precision="fp16", max_batch=4)
    assert engines[0].stat().st_mtime == mtime  # loaded from the cache, not rebuilt


# ------------------------------------------------- API usage against a stand-in
# TensorRT is absent here, so the build/run code paths are driven through a
# recording stand-in of the module (tests/edgewise/runtime/fake_tensorrt.py)
# that follows NVIDIA's 8.x binding and 10.x tensor APIs; numerics come from
# running the same ONNX graph on ONNX Runtime.


@pytest.fixture
def fake_trt(monkeypatch, tmp_path: Path):
    from tests.edgewise.runtime import fake_tensorrt
    from tests.edgewise.runtime.graphs import fake_yolo

    model = fake_yolo(tmp_path / "m.onnx", nc=2)
    cuda = fake_tensorrt.HostCuda()
    model_fn, sess = fake_tensorrt.onnx_model_fn(model, cuda)

    def install(version: str, tensor_api: bool):
        mod = fake_tensorrt.make(version, tensor_api, model_fn)
        monkeypatch.setattr(trtb, "import_tensorrt", lambda: mod)
        monkeypatch.setattr(trtb, "_Cuda", lambda: cuda)
        monkeypatch.setattr(trtb, "cuda_device_name", lambda: "Fake GPU")
        return mod

    return install, model, sess


@pytest.mark.parametrize("version, flags", [("8.5.2.2", 1), ("10.3.0", 0)])
def test_build_engine_network_flags_and_profile(fake_trt, version, flags):
    install, model, _ = fake_trt
    mod = install(version, True)
    info = load_model_info(model)
    assert trtb.build_engine(info, "fp16", max_batch=4) == b"ENGINE"
    assert ("create_network", flags) in mod.calls
    assert ("set_memory_pool_limit", "workspace", 1024 << 20) in mod.calls
    assert ("profile.set_shape", "images", (1, 3, 32, 32), (1, 3, 32, 32), (4, 3, 32, 32)) in mod.calls
    assert ("build", ("fp16",), False) in mod.calls


def test_int8_needs_calibration_then_writes_cache(fake_trt, tmp_path: Path):
    install, model, _ = fake_trt
    mod = install("8.5.2.2", True)
    info = load_model_info(model)
    with pytest.raises(ConfigError, match="INT8 engine needs calibration images"):
        trtb.build_engine(info, "int8", calibration_cache=tmp_path / "none.calib")
    _write_images(tmp_path / "cal", 3)
    cal = trtb.CalibrationBatches.from_dir(tmp_path / "cal", info.imgsz, batch_size=2)
    cache = tmp_path / "c" / "m.calib"
    trtb.build_engine(info, "int8", max_batch=4, calibration=cal, calibration_cache=cache)
    assert cache.read_bytes() == b"CACHE"
    assert ("set_calibration_profile",) in mod.calls
    assert ("profile.set_shape", "images", (1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32)) in mod.calls
    # with the cache present, no images are needed any more
    trtb.build_engine(info, "int8", calibration_cache=cache)


def test_int8_qdq_model_needs_no_calibration(fake_trt, tmp_path: Path):
    from tests.edgewise.runtime.graphs import fake_yolo

    install, _, _ = fake_trt
    mod = install("10.3.0", True)
    info = load_model_info(fake_yolo(tmp_path / "q.onnx", quant=True))
    trtb.build_engine(info, "int8")
    assert ("build", ("fp16", "int8"), False) in mod.calls


def test_parse_failure_is_a_model_error(fake_trt, tmp_path: Path):
    install, model, _ = fake_trt
    install("10.3.0", True)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"!" + model.read_bytes())
    info = load_model_info(model)
    from edgewise.errors import ModelError

    with pytest.raises(ModelError, match="cannot parse"):
        trtb.build_engine(type(info)(**{**info.__dict__, "path": bad}), "fp16")


@pytest.mark.parametrize("version, tensor_api, call", [("10.3.0", True, "execute_async_v3"),
                                                       ("8.4.3", False, "execute_async_v2")])
def test_engine_cache_and_run_on_both_apis(fake_trt, tmp_path: Path, version, tensor_api, call):
    install, model, sess = fake_trt
    mod = install(version, tensor_api)
    info = load_model_info(model)
    be = trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path / "eng", precision="fp16", max_batch=2)
    (engine,) = (tmp_path / "eng").glob("*.engine")
    assert engine.name == trtb.engine_cache_key(info.sha256, "fp16", (32, 32), version, "Fake GPU", 2)
    x = np.random.default_rng(0).random((5, 3, 32, 32), dtype=np.float32)
    np.testing.assert_allclose(be.run(x), sess.run(None, {"images": x})[0], rtol=1e-6)
    assert (call,) in mod.calls
    builds = sum(1 for c in mod.calls if c[0] == "build")
    trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path / "eng", precision="fp16", max_batch=2)
    assert sum(1 for c in mod.calls if c[0] == "build") == builds  # second open hits the cache
    be.close()


@pytest.mark.parametrize("cut", [0, 3])
def test_a_cached_engine_cut_short_by_a_power_cut_is_built_again_not_a_refused_start(fake_trt, tmp_path: Path,
                                                                                      caplog, cut):
    """A power cut soon after ``edge engine`` (ExecStartPre) left the cached engine under its name
    but empty (ext4: renamed before its blocks were written) or cut short: every start was refused
    ("delete it to rebuild", exit 2, which systemd does not restart) until someone logged in. It is
    a cache: the engine is built again, said in a WARNING, and the entry replaced."""
    install, model, _ = fake_trt
    mod = install("8.5.2.2", True)
    info = load_model_info(model)
    trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path / "eng", precision="fp16").close()
    (engine,) = (tmp_path / "eng").glob("*.engine")
    engine.write_bytes(engine.read_bytes()[:cut])
    mod.calls.clear()
    be = trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path / "eng", precision="fp16")
    be.close()
    assert sum(1 for c in mod.calls if c[0] == "build") == 1 and engine.read_bytes() == b"ENGINE"
    assert f"cached TensorRT engine {engine} does not deserialize ({cut} bytes: cut short by a power cut" in caplog.text
    assert [p.name for p in engine.parent.iterdir()] == [engine.name]


def test_publish_syncs_the_bytes_before_the_rename_and_the_folder_after(tmp_path: Path, monkeypatch):
    """The engine's bytes reach the disk before its name does, and the name before publish
    returns: a rename alone left an empty engine under its name after a power cut."""
    done = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        done.append(("fsync", "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else os.fstat(fd).st_size))
        real_fsync(fd)

    def replace(a, b):
        done.append(("replace", Path(b).name))
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    trtb.publish(tmp_path / "m.engine", b"E" * 1000)
    assert done == [("fsync", 1000), ("replace", "m.engine"), ("fsync", "dir")]


def test_a_model_in_onnx_runtimes_cpu_layout_is_refused_before_the_build(fake_trt, tmp_path: Path):
    """The Jetson bundle shipped the CPU layout of the INT8 model (uint8 activations with zero
    points, int32 biases), which TensorRT's parser refuses (found by a probe): the engine build
    failed on the device with the parser's first error. It is refused before the build, saying
    what to do; the TensorRT layout builds."""
    from edgewise.errors import ModelError

    install, _, _ = fake_trt
    mod = install("8.5.2.2", True)
    cpu_layout = load_model_info(ROOT / "models" / "camera" / "edge-int8.onnx")
    with pytest.raises(ModelError, match=r"edge-int8.onnx: TensorRT cannot build this model: its QuantizeLinear/"
                                         r"DequantizeLinear nodes use uint8 .*--target tensorrt"):
        trtb.TensorRTBackend.from_onnx(cpu_layout, cache_dir=tmp_path / "eng", precision="int8")
    assert not any(c[0] in ("parse", "build") for c in mod.calls)
    trt_layout = load_model_info(ROOT / "models" / "camera" / "edge-int8-trt.onnx")
    assert trtb.build_engine(trt_layout, "int8") == b"ENGINE"


def test_backend_auto_runs_what_tensorrt_cannot_build_on_onnx_runtime(monkeypatch, caplog):
    """Where TensorRT is usable, ``auto`` chose it for any model, so a CPU-layout INT8 model failed
    to build; it now runs on ONNX Runtime with a warning that says why and what to do, and an
    explicit ``tensorrt`` backend is refused."""
    from edgewise.errors import ModelError
    from edgewise.runtime import detector as det

    monkeypatch.setattr(det, "tensorrt_unusable_reason", lambda: "")
    model = ROOT / "models" / "camera" / "edge-int8.onnx"
    d = det.Detector.from_file(model, backend="auto", threads=1)
    assert type(d.backend).__name__ == "OnnxRuntimeBackend"
    assert "backend auto: TensorRT cannot build" in caplog.text and "--target tensorrt" in caplog.text
    monkeypatch.setattr(trtb, "import_tensorrt", lambda: (_ for _ in ()).throw(AssertionError("no build")))
    with pytest.raises(ModelError, match="TensorRT cannot build this model"):
        det.Detector.from_file(model, backend="tensorrt")


def test_a_fixed_batch_with_a_symbolic_height_and_width_gets_a_profile(fake_trt):
    """A profile was made for a dynamic batch only: a fixed-batch export with a symbolic
    height/width (accepted by `model info` and ONNX Runtime) had none, which TensorRT refuses
    for a network with dynamic inputs (found by a probe). It gets one, for the model's size."""
    import dataclasses

    install, model, _ = fake_trt
    mod = install("8.5.2.2", True)
    info = dataclasses.replace(load_model_info(model), dynamic_batch=False, fixed_batch=2, dynamic_hw=True)
    trtb.build_engine(info, "fp16", max_batch=8)
    assert ("profile.set_shape", "images", (2, 3, 32, 32), (2, 3, 32, 32), (2, 3, 32, 32)) in mod.calls
    mod.calls.clear()
    trtb.build_engine(dataclasses.replace(info, dynamic_hw=False), "fp16")
    assert not any(c[0] == "profile.set_shape" for c in mod.calls)  # static: no profile needed


@pytest.mark.parametrize("version, tensor_api", [("10.3.0", True), ("8.4.3", False)])
def test_every_output_of_a_model_with_extra_outputs_gets_a_buffer(fake_trt, monkeypatch, tmp_path: Path, version,
                                                                   tensor_api):
    """Only the detections' output got an address: a model that also outputs the raw head maps
    (older YOLOv5 exports) failed TensorRT's execution, which needs one for every I/O tensor
    (found by a probe). Each extra output gets a buffer, and the detections are read as before."""
    from tests.edgewise.runtime import fake_tensorrt

    _, model, sess = fake_trt
    cuda = fake_tensorrt.HostCuda()
    model_fn, _ = fake_tensorrt.onnx_model_fn(model, cuda)
    mod = fake_tensorrt.make(version, tensor_api, model_fn, extra_outputs=("345", "403", "461"))
    monkeypatch.setattr(trtb, "import_tensorrt", lambda: mod)
    monkeypatch.setattr(trtb, "_Cuda", lambda: cuda)
    monkeypatch.setattr(trtb, "cuda_device_name", lambda: "Fake GPU")
    info = load_model_info(model)
    be = trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path / "eng", precision="fp16", max_batch=2)
    x = np.random.default_rng(0).random((2, 3, 32, 32), dtype=np.float32)
    np.testing.assert_allclose(be.run(x), sess.run(None, {"images": x})[0], rtol=1e-6)
    be.close()
