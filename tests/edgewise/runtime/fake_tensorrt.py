"""A recording stand-in for the ``tensorrt`` module (pure-logic tests only).

It implements just the calls ``edgewise.runtime.backends.tensorrt`` makes, with
the signatures of NVIDIA's Python API, so the 8.x binding path and the 10.x
tensor path can be exercised on a machine without TensorRT or a GPU. It checks
call *usage*, not TensorRT's numerics; the real engine test runs where TensorRT
exists (see test_tensorrt.py).
"""

from __future__ import annotations

import types
from typing import Any, Dict, List, Sequence

import numpy as np


def onnx_model_fn(model: Any, cuda: HostCuda) -> Any:
    """A ``model_fn`` for :func:`make` whose numerics are the ONNX graph ``model`` run on ONNX
    Runtime, reading its input from and writing its output to ``cuda``'s host memory; and
    that session, to compare against."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def model_fn(in_ptr: int, out_ptr: int, shape: Any) -> None:
        x = cuda.mem[in_ptr][: int(np.prod(shape)) * 4].view(np.float32).reshape(shape)
        y = sess.run(None, {"images": x})[0]
        cuda.mem[out_ptr][: y.nbytes] = np.frombuffer(y.tobytes(), np.uint8)

    return model_fn, sess


def make(version: str, tensor_api: bool, model_fn: Any, extra_outputs: Sequence[str] = ()) -> types.SimpleNamespace:
    """``extra_outputs``: output tensors besides ``output0`` (older YOLOv5 exports add the three
    raw head maps); like TensorRT, execution fails unless every I/O tensor has an address."""
    calls: List[Any] = []
    io_names = ["images", "output0", *extra_outputs]
    major = int(version.split(".")[0])

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            self.level = level

    class NetworkDefinitionCreationFlag:
        EXPLICIT_BATCH = 0

    class MemoryPoolType:
        WORKSPACE = "workspace"

    class BuilderFlag:
        FP16 = "fp16"
        INT8 = "int8"

    class IInt8EntropyCalibrator2:
        def __init__(self) -> None:
            calls.append(("calibrator.init",))

    class Profile:
        def set_shape(self, name: str, mn: Any, opt: Any, mx: Any) -> None:
            calls.append(("profile.set_shape", name, mn, opt, mx))

    class Config:
        def __init__(self) -> None:
            self.flags: List[str] = []
            self.int8_calibrator = None

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            calls.append(("set_memory_pool_limit", pool, size))

        def set_flag(self, f: str) -> None:
            self.flags.append(f)

        def add_optimization_profile(self, p: Profile) -> int:
            return 0

        def set_calibration_profile(self, p: Profile) -> None:
            calls.append(("set_calibration_profile",))

    class Network:
        pass

    class OnnxParser:
        def __init__(self, network: Network, logger: Logger) -> None:
            self.num_errors = 0

        def parse(self, data: bytes) -> bool:
            return data[:1] != b"!"

        def get_error(self, i: int) -> str:
            return "bad"

    class Builder:
        platform_has_fast_fp16 = True

        def __init__(self, logger: Logger) -> None:
            pass

        def create_network(self, flags: int) -> Network:
            calls.append(("create_network", flags))
            return Network()

        def create_builder_config(self) -> Config:
            self.config = Config()
            return self.config

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes:
            calls.append(("build", tuple(config.flags), config.int8_calibrator is not None))
            if config.int8_calibrator is not None:
                cal = config.int8_calibrator
                cal.read_calibration_cache()
                while cal.get_batch(["images"]) is not None:
                    pass
                cal.write_calibration_cache(b"CACHE")
            return b"ENGINE"

    class DataType:
        class FLOAT:  # pybind11 enum members carry their name
            name = "FLOAT"

    def nptype(dt: Any) -> Any:
        # TensorRT 8.5's nptype maps bool to np.bool, gone since numpy 1.24 (NVIDIA/TensorRT#2557)
        raise AssertionError("trt.nptype must not be called: TensorRT 8.5's fails with numpy >= 1.24")

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.shape: Dict[str, Any] = {}
            self.addr: Dict[str, int] = {}

        def _out(self) -> Any:
            b = self.shape["images"][0]
            return (b,) + engine_out_shape[1:]

    engine_out_shape = (1, 63, 7)

    class TensorContext(Context):
        def set_input_shape(self, name: str, shape: Any) -> bool:
            self.shape[name] = shape
            return True

        def get_tensor_shape(self, name: str) -> Any:
            return self._out() if name == "output0" else (self.shape["images"][0], 3, 4, 4, 7)

        def set_tensor_address(self, name: str, ptr: int) -> None:
            self.addr[name] = ptr

        def execute_async_v3(self, stream: int) -> bool:
            calls.append(("execute_async_v3",))
            if set(self.addr) != set(io_names) or not all(self.addr.values()):
                return False  # TensorRT: "Address is not set for output tensor ..."
            model_fn(self.addr["images"], self.addr["output0"], self.shape["images"])
            return True

    class BindingContext(Context):
        def set_binding_shape(self, idx: int, shape: Any) -> bool:
            self.shape["images"] = shape
            return True

        def get_binding_shape(self, idx: int) -> Any:
            return self._out() if idx == 1 else (self.shape["images"][0], 3, 4, 4, 7)

        def execute_async_v2(self, bindings: List[int], stream: int) -> bool:
            calls.append(("execute_async_v2",))
            if len(bindings) != len(io_names) or not all(bindings):
                return False
            model_fn(bindings[0], bindings[1], self.shape["images"])
            return True

    class Engine:
        num_bindings = len(io_names)
        num_io_tensors = len(io_names)

        def get_tensor_name(self, i: int) -> str:
            return io_names[i]

        def get_binding_name(self, i: int) -> str:
            return io_names[i]

        def create_execution_context(self) -> Context:
            return TensorContext(self) if tensor_api else BindingContext(self)

        def get_tensor_dtype(self, name: str) -> Any:
            return DataType.FLOAT

        def get_binding_index(self, name: str) -> int:
            return io_names.index(name)

        def get_binding_dtype(self, idx: int) -> Any:
            return DataType.FLOAT

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Any:
            return Engine() if data == b"ENGINE" else None

    mod = types.SimpleNamespace(
        __version__=version, Logger=Logger, Builder=Builder, OnnxParser=OnnxParser,
        NetworkDefinitionCreationFlag=NetworkDefinitionCreationFlag, MemoryPoolType=MemoryPoolType,
        BuilderFlag=BuilderFlag, IInt8EntropyCalibrator2=IInt8EntropyCalibrator2, Runtime=Runtime,
        nptype=nptype, calls=calls, major=major,
    )
    return mod


class HostCuda:
    """``_Cuda`` stand-in: "device" buffers are host arrays addressed by an int handle."""

    def __init__(self) -> None:
        self.mem: Dict[int, np.ndarray] = {}
        self.next = 1

    def malloc(self, nbytes: int) -> int:
        h = self.next
        self.next += 1
        self.mem[h] = np.zeros(nbytes, np.uint8)
        return h

    def free(self, ptr: int) -> None:
        self.mem.pop(ptr, None)

    def stream(self) -> str:
        return "stream"

    def destroy_stream(self, s: str) -> None:
        pass

    def handle(self, s: str) -> int:
        return 7

    def htod(self, ptr: int, host: np.ndarray, s: str) -> None:
        self.mem[ptr][: host.nbytes] = np.frombuffer(host.tobytes(), np.uint8)

    def dtoh(self, host: np.ndarray, ptr: int, s: str) -> None:
        host.reshape(-1).view(np.uint8)[:] = self.mem[ptr][: host.nbytes]

    def sync(self, s: str) -> None:
        pass

    def device_name(self) -> str:
        return "Fake GPU"
