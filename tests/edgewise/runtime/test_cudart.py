"""The ctypes CUDA runtime of the TensorRT backend, against a stand-in ``libcudart`` whose
"device" memory is host memory: the real ctypes calls, pointers and copies, no GPU."""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from edgewise.errors import DeploymentError, ModelError
from edgewise.runtime.backends import cudart
from edgewise.runtime.backends import tensorrt as trtb
from edgewise.runtime.metadata import load_model_info


class FakeLibcudart:
    """Functions with libcudart's C signatures (set as attributes so ``argtypes`` can be set)."""

    def __init__(self, device: bytes = b"Xavier", fail: Dict[str, int] = None) -> None:
        self.buffers: Dict[int, Any] = {}
        self.calls: List[str] = []
        fail = fail or {}

        def fn(name: str, body: Any) -> Any:
            def call(*args: Any) -> int:
                self.calls.append(name)
                if name in fail:
                    return fail[name]
                body(*args)
                return 0
            return call

        def malloc(pp: Any, n: int) -> None:
            buf = ctypes.create_string_buffer(n)
            self.buffers[ctypes.addressof(buf)] = buf
            pp._obj.value = ctypes.addressof(buf)

        def memcpy(dst: int, src: int, n: int, kind: int, stream: int) -> None:
            assert kind in (cudart.HOST_TO_DEVICE, cudart.DEVICE_TO_HOST) and stream == 77
            device = dst if kind == cudart.HOST_TO_DEVICE else src
            assert device in self.buffers and n <= len(self.buffers[device])
            ctypes.memmove(dst, src, n)

        def props(buf: Any, dev: int) -> None:
            assert dev == 0
            ctypes.memmove(buf, device + b"\0", len(device) + 1)

        def stream_create(ps: Any) -> None:
            ps._obj.value = 77

        self.cudaMalloc = fn("cudaMalloc", malloc)
        self.cudaFree = fn("cudaFree", lambda p: self.buffers.pop(p))
        self.cudaStreamCreate = fn("cudaStreamCreate", stream_create)
        self.cudaStreamDestroy = fn("cudaStreamDestroy", lambda s: None)
        self.cudaMemcpyAsync = fn("cudaMemcpyAsync", memcpy)
        self.cudaStreamSynchronize = fn("cudaStreamSynchronize", lambda s: None)
        self.cudaGetDeviceProperties = fn("cudaGetDeviceProperties", props)
        self.cudaGetErrorString = lambda err: b"no CUDA-capable device is detected" if err == 100 else b"oops"


def test_round_trip_through_device_memory() -> None:
    rt = cudart.CudaRuntime(FakeLibcudart())
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ptr, stream = rt.malloc(x.nbytes), rt.stream()
    rt.htod(ptr, x, stream)
    y = np.empty_like(x)
    rt.dtoh(y, ptr, stream)
    rt.sync(stream)
    np.testing.assert_array_equal(x, y)
    rt.free(ptr)
    assert rt.lib.buffers == {}
    assert rt.device_name() == "Xavier"


def test_failures_name_the_call_and_cuda_error() -> None:
    rt = cudart.CudaRuntime(FakeLibcudart(fail={"cudaMalloc": 2}))
    with pytest.raises(ModelError, match=r"CUDA cudaMalloc failed: error 2 \(oops\)"):
        rt.malloc(16)
    assert cudart.device_name(FakeLibcudart(fail={"cudaGetDeviceProperties": 100})) is None
    with pytest.raises(DeploymentError, match="no usable CUDA device: no CUDA-capable device"):
        cudart.CudaRuntime(FakeLibcudart(fail={"cudaGetDeviceProperties": 100})).device_name()


def test_missing_libcudart_is_one_line_saying_what_to_install(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cudart, "candidates", lambda: [str(tmp_path / "libcudart.so.11.0"), "libnothere.so"])
    with pytest.raises(DeploymentError) as exc:
        cudart.load_library()
    msg = str(exc.value)
    assert "\n" not in msg and "libcudart" in msg and "JetPack" in msg and str(tmp_path) in msg
    assert cudart.device_name() is None


def test_candidates_put_the_override_first(monkeypatch) -> None:
    monkeypatch.setenv("EDGEWISE_CUDART", "/opt/x/libcudart.so.11.0")
    c = cudart.candidates()
    assert c[0] == "/opt/x/libcudart.so.11.0" and "libcudart.so.11.0" in c and len(c) == len(set(c))


@pytest.mark.skipif(ctypes.util.find_library("cudart") is None, reason="no libcudart on this machine")
def test_declarations_bind_to_a_real_libcudart() -> None:
    """Where a CUDA runtime is installed (with or without a GPU), every symbol resolves and
    a call answers: a device name, or CUDA's own one-line reason."""
    rt = cudart.CudaRuntime()
    try:
        name = rt.device_name()
    except DeploymentError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("no usable CUDA device: ")
        assert cudart.device_name() is None
    else:
        assert name and cudart.device_name() == name


def test_tensorrt_backend_runs_over_ctypes_cudart(monkeypatch, tmp_path: Path) -> None:
    """The TensorRT backend's whole run path with the ctypes runtime: the stand-in engine
    reads its input from, and writes its output to, the addresses the backend bound."""
    import onnxruntime as ort

    from tests.edgewise.runtime import fake_tensorrt
    from tests.edgewise.runtime.graphs import fake_yolo

    model = fake_yolo(tmp_path / "m.onnx", nc=2)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def model_fn(in_ptr: int, out_ptr: int, shape: Any) -> None:
        x = np.frombuffer(ctypes.string_at(in_ptr, int(np.prod(shape)) * 4), np.float32).reshape(shape)
        y = sess.run(None, {"images": x})[0]
        ctypes.memmove(out_ptr, y.tobytes(), y.nbytes)

    lib = FakeLibcudart(device=b"Orin")
    mod = fake_tensorrt.make("8.5.2.2", True, model_fn)
    monkeypatch.setattr(trtb, "import_tensorrt", lambda: mod)
    monkeypatch.setattr(trtb, "_Cuda", lambda: cudart.CudaRuntime(lib))
    monkeypatch.setattr(trtb, "cuda_device_name", lambda: cudart.device_name(lib))
    info = load_model_info(model)
    be = trtb.TensorRTBackend.from_onnx(info, cache_dir=tmp_path / "eng", precision="fp16", max_batch=2)
    assert "-orin-" in next((tmp_path / "eng").glob("*.engine")).name
    x = np.random.default_rng(0).random((3, 3, 32, 32), dtype=np.float32)
    np.testing.assert_allclose(be.run(x), sess.run(None, {"images": x})[0], rtol=1e-6)
    be.close()
    assert lib.buffers == {} and "cudaStreamDestroy" in lib.calls
