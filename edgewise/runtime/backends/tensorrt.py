"""Native TensorRT backend: build FP16/INT8 engines from ONNX, cache them, run them.

Supports TensorRT 8.5 (JetPack 5.1 on Xavier NX) and 10.x. Engines are
serialised under a cache directory and keyed by model sha256 + precision +
input size + max batch + TensorRT version + GPU name (an engine is only valid
for the exact TensorRT build and GPU it was built on). INT8 uses an
``IInt8EntropyCalibrator2`` fed with letterboxed calibration images and a
calibration cache file, so a rebuild (new TensorRT, new GPU) skips
calibration. A model already quantized with QDQ nodes builds in INT8 without
calibration.

API facts this relies on (NVIDIA's 8.x -> 10.x Python migration guide):
- 8.5 introduced the name-based tensor API (``num_io_tensors``,
  ``get_tensor_name``, ``get_tensor_mode``, ``set_input_shape``,
  ``set_tensor_address``, ``execute_async_v3``); 10.0 removed the binding API
  (``num_bindings``, ``binding_is_input``, ``set_binding_shape``,
  ``execute_async_v2``). We use the tensor API when the context has
  ``execute_async_v3`` and fall back to bindings for 8.0-8.4.
- Networks are explicit-batch: 8.x needs the ``EXPLICIT_BATCH`` creation flag,
  10.x ignores/deprecates it (flag 0).
- ``build_serialized_network`` (8.0+), ``set_memory_pool_limit(WORKSPACE)``
  (8.4+; ``max_workspace_size`` before), ``set_calibration_profile`` for
  dynamic shapes in INT8.

``tensorrt`` is imported lazily and CUDA memory goes through ``libcudart`` over ctypes
(``edgewise.runtime.backends.cudart``: no Python package beyond TensorRT's own bindings);
everything here that needs no GPU (cache keys, calibration batches, the error when TensorRT
is absent) works and is tested without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgewise.errors import ConfigError, DeploymentError, InvalidInputError, ModelError
from edgewise.imagefiles import IMAGE_SUFFIXES, read_image_file
from edgewise.outputs import replace_durably
from edgewise.runtime.backends.cudart import CudaRuntime, device_name
from edgewise.runtime.letterbox import preprocess_batch
from edgewise.runtime.metadata import ModelInfo
from edgewise.runtime.opsets import tensorrt_problems

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
TENSORRT_MISSING = (
    "the TensorRT backend needs NVIDIA TensorRT's Python bindings, which are not installed: "
    "on Jetson they come with JetPack (sudo apt-get install nvidia-jetpack, or python3-libnvinfer); "
    "on x86 with an NVIDIA GPU: pip install tensorrt; "
    "or use the onnxruntime backend (edge daemon: model.backend: onnxruntime)"
)


class TensorRTUnavailableError(DeploymentError):
    """TensorRT (or the CUDA bindings it needs) cannot be imported here: an installation
    problem of this host (UNAVAILABLE at a boundary, see ``edgewise.status``)."""


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, or ``TensorRTUnavailableError`` saying how to install it."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise TensorRTUnavailableError(f"{TENSORRT_MISSING} ({e})") from None
    return trt


def trt_version_tuple(version: str) -> Tuple[int, ...]:
    """``"8.5.2.2"`` -> ``(8, 5, 2, 2)``."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


# ---------------------------------------------------------------- cache keys
def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "unknown"


def engine_cache_key(
    model_sha256: str,
    precision: str,
    imgsz: Tuple[int, int],
    trt_version: str,
    gpu_name: str,
    max_batch: int = 1,
) -> str:
    """File name of a cached engine; changes whenever any input changes.

    ``<sha16>-<precision>-<h>x<w>-b<max_batch>-trt<version>-<gpu>-<digest8>.engine``:
    readable fields for operators plus a digest of all of them (so two GPU names
    that slug alike still differ).
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    fields = f"{model_sha256}|{precision}|{imgsz[0]}x{imgsz[1]}|{max_batch}|{trt_version}|{gpu_name}"
    digest = hashlib.sha256(fields.encode()).hexdigest()[:8]
    return (
        f"{model_sha256[:16]}-{precision}-{imgsz[0]}x{imgsz[1]}-b{max_batch}"
        f"-trt{_slug(trt_version)}-{_slug(gpu_name)}-{digest}.engine"
    )


def default_cache_dir() -> Path:
    """``$EDGEWISE_ENGINE_CACHE`` or ``~/.cache/edgewise/engines``."""
    env = os.environ.get("EDGEWISE_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "edgewise" / "engines"


def publish(path: Path, data: bytes) -> None:
    """Write ``path`` atomically under a temporary name of this process alone: workers sharing
    a cache volume (a ReadWriteMany claim, a node's hostPath) may build the same engine at once,
    and a reader must never see half a file. The bytes are fsync'd before the rename and the
    folder after it: renamed without, a Jetson whose power was cut within half a minute of
    ``edge engine`` found the engine under its name but empty, and refused every start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        replace_durably(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def calibration_cache_path(cache_dir: Path, info: ModelInfo) -> Path:
    """Calibration cache of a model: per model and input size, valid across TensorRT builds."""
    return cache_dir / f"{info.sha256[:16]}-{info.imgsz[0]}x{info.imgsz[1]}.calib"


# ------------------------------------------------------ calibration batches
class CalibrationBatches:
    """Letterboxed NCHW float32 batches from calibration images (no GPU needed).

    Images are read lazily, one batch at a time. The last batch is completed
    by cycling from the first images, since TensorRT calibrates on full batches.
    """

    def __init__(
        self,
        files: Sequence[Path],
        imgsz: Tuple[int, int],
        batch_size: int = 8,
        stride: int = 32,
        max_images: Optional[int] = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"calibration batch_size must be >= 1, got {batch_size}")
        self.files = list(files)[: max_images if max_images else None]
        if not self.files:
            raise InvalidInputError("no calibration images given")
        self.imgsz = imgsz
        self.batch_size = batch_size
        self.stride = stride

    @classmethod
    def from_dir(
        cls,
        folder: Union[str, Path],
        imgsz: Tuple[int, int],
        batch_size: int = 8,
        stride: int = 32,
        max_images: Optional[int] = None,
    ) -> CalibrationBatches:
        """All images (jpg/png/bmp/webp/tif) under ``folder``, sorted by name."""
        d = Path(folder)
        if not d.is_dir():
            raise InvalidInputError(f"calibration folder {d} does not exist or is not a directory")
        try:
            files = sorted(p for p in d.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        except OSError as e:
            raise InvalidInputError(f"calibration folder {d} cannot be read: {e}") from None
        if not files:
            raise InvalidInputError(
                f"calibration folder {d} holds no images ({', '.join(IMAGE_SUFFIXES)}); "
                f"put a few hundred frames from the deployment camera there"
            )
        return cls(files, imgsz, batch_size, stride, max_images)

    def __len__(self) -> int:
        return -(-len(self.files) // self.batch_size)

    def _read(self, path: Path) -> np.ndarray:
        try:  # header first: a bomb or a damaged file among the calibration images is refused, named
            return read_image_file(path)
        except InvalidInputError as exc:
            raise InvalidInputError(f"calibration image {path} cannot be decoded: {exc}") from None

    def __iter__(self) -> Iterator[np.ndarray]:
        n = len(self.files)
        for start in range(0, n, self.batch_size):
            idx = [(start + k) % n for k in range(self.batch_size)]
            images = [self._read(self.files[i]) for i in idx]
            batch, _ = preprocess_batch(images, self.imgsz, auto=False, stride=self.stride)
            yield np.ascontiguousarray(batch)


# ------------------------------------------------------------ CUDA helpers
_Cuda = CudaRuntime  # tests swap in a host-memory stand-in

#: TensorRT ``DataType`` name -> numpy dtype. ``trt.nptype`` is not used: TensorRT 8.5's
#: (JetPack 5.1) reads ``np.bool``, which numpy 1.24 removed (NVIDIA/TensorRT#2557).
NP_TYPES = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32,
            "INT64": np.int64, "BOOL": np.bool_, "UINT8": np.uint8}


def np_dtype(trt_dtype: Any) -> Any:
    """The numpy dtype of a TensorRT ``DataType``."""
    name = getattr(trt_dtype, "name", str(trt_dtype).rpartition(".")[2])
    try:
        return NP_TYPES[name]
    except KeyError:
        raise ModelError(f"TensorRT tensor type {trt_dtype} has no numpy equivalent here") from None


def cuda_device_name() -> Optional[str]:
    """Name of CUDA device 0, or ``None`` when there is none / no ``libcudart``."""
    return device_name()


# --------------------------------------------------------------- building
def make_calibrator(trt: Any, batches: Optional[CalibrationBatches], cache_file: Path, cuda: Any) -> Any:
    """An ``IInt8EntropyCalibrator2`` over ``batches`` that reads/writes ``cache_file``.

    With ``batches=None`` only the cache is used (TensorRT reads it first and
    asks for no batch when it is valid).
    """

    class _EntropyCalibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)  # required by the pybind base
            self.it: Iterator[np.ndarray] = iter(batches) if batches is not None else iter(())
            self.dev: Any = None
            self.count = 0

        def get_batch_size(self) -> int:
            return batches.batch_size if batches is not None else 1

        def get_batch(self, names: List[str], *args: Any) -> Optional[List[int]]:
            try:
                batch = next(self.it)
            except StopIteration:
                return None
            if self.dev is None:
                self.dev = cuda.malloc(batch.nbytes)
                self.stream = cuda.stream()
            cuda.htod(self.dev, batch, self.stream)
            cuda.sync(self.stream)
            self.count += 1
            log.info("INT8 calibration batch %d/%d", self.count, len(batches or ()))
            return [int(self.dev)]

        def read_calibration_cache(self, *args: Any) -> Optional[bytes]:
            if cache_file.is_file():
                data = cache_file.read_bytes()
                if data:  # (empty: renamed into place before its bytes reached the disk, and the power cut)
                    log.info("using INT8 calibration cache %s", cache_file)
                    return data
                log.warning("INT8 calibration cache %s is empty; calibrating again", cache_file)
            return None

        def write_calibration_cache(self, cache: Any, *args: Any) -> None:
            publish(cache_file, bytes(cache))

    return _EntropyCalibrator()


def build_engine(
    info: ModelInfo,
    precision: str = "fp16",
    max_batch: int = 1,
    calibration: Optional[CalibrationBatches] = None,
    calibration_cache: Optional[Path] = None,
    workspace_mb: int = 1024,
) -> bytes:
    """Build a serialized TensorRT engine from ``info.path``."""
    trt = import_tensorrt()
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    major = trt_version_tuple(trt.__version__)[0]
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(info.path.read_bytes()):
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ModelError(f"{info.path}: TensorRT cannot parse the ONNX model: {errs}")
    config = builder.create_builder_config()
    if hasattr(config, "set_memory_pool_limit"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    else:  # TensorRT < 8.4
        config.max_workspace_size = workspace_mb << 20
    h, w = info.imgsz
    profile = None
    if info.dynamic_batch or info.dynamic_hw:  # any dynamic input dimension needs a profile
        if info.dynamic_batch:
            opt = max(1, min(calibration.batch_size if calibration is not None else 1, max_batch))
            least, most = 1, max_batch
        else:  # a fixed batch with a symbolic height/width: the engine is built for info.imgsz
            least = opt = most = max(1, info.fixed_batch)
        profile = builder.create_optimization_profile()
        profile.set_shape(info.input_name, (least, 3, h, w), (opt, 3, h, w), (most, 3, h, w))
        config.add_optimization_profile(profile)
    if precision in ("fp16", "int8") and getattr(builder, "platform_has_fast_fp16", True):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
        if info.precision != "int8":  # not QDQ: needs calibration (or its cache)
            cache = calibration_cache
            if calibration is None and (cache is None or not cache.is_file()):
                raise ConfigError(
                    f"{info.path}: an INT8 engine needs calibration images (--calib DIR) or an existing "
                    f"calibration cache ({cache}); or quantize the ONNX first (edgewise model quantize)"
                )
            config.int8_calibrator = make_calibrator(
                trt, calibration, cache or Path("calib.cache"), _Cuda()
            )
            if profile is not None and hasattr(config, "set_calibration_profile"):
                config.set_calibration_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ModelError(f"{info.path}: TensorRT failed to build a {precision} engine (see its log above)")
    return bytes(serialized)


def engine_file(
    info: ModelInfo,
    cache_dir: Optional[Union[str, Path]] = None,
    precision: Optional[str] = None,
    max_batch: int = 8,
) -> Tuple[Path, str, int]:
    """``(path, precision, max batch)`` of the engine ``TensorRTBackend.from_onnx`` loads or
    builds for these arguments on this GPU and TensorRT: a QDQ model defaults to INT8, any
    other to FP16; a fixed-batch model's batch wins over ``max_batch``."""
    trt = import_tensorrt()
    prec = precision or ("int8" if info.precision == "int8" else "fp16")
    mb = max_batch if info.dynamic_batch else max(1, info.fixed_batch)
    gpu = cuda_device_name() or "unknown-gpu"
    cdir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return cdir / engine_cache_key(info.sha256, prec, info.imgsz, trt.__version__, gpu, mb), prec, mb


# ---------------------------------------------------------------- running
class EngineUnreadable(ModelError):
    """TensorRT does not deserialize an engine's bytes (``from_onnx`` builds a cached one again)."""


class TensorRTBackend:
    """``InferenceBackend`` on a deserialized TensorRT engine."""

    name = "tensorrt"

    def __init__(self, info: ModelInfo, engine_bytes: bytes, max_batch: int = 1) -> None:
        self.trt = trt = import_tensorrt()
        self.info = info
        self.cuda = _Cuda()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise EngineUnreadable(f"{info.path}: its TensorRT engine does not deserialize")
        self.context = self.engine.create_execution_context()
        self.tensor_api = hasattr(self.context, "execute_async_v3")
        self.max_batch = max_batch if info.dynamic_batch else max(1, info.fixed_batch)
        self.stream: Any = self.cuda.stream()
        self._dev: dict = {}
        self._in_dtype = np.float16 if self._io_dtype(info.input_name) == np.float16 else np.float32
        #: outputs besides the detections (older YOLOv5 exports add the three raw head maps):
        #: TensorRT runs only with an address for every I/O tensor, so each gets a buffer, unread
        eng = self.engine
        names = ([eng.get_tensor_name(i) for i in range(eng.num_io_tensors)] if self.tensor_api
                 else [eng.get_binding_name(i) for i in range(eng.num_bindings)])
        self._extra = [n for n in names if n not in (info.input_name, info.output_name)]
        self.name = f"tensorrt[{trt.__version__}]"

    @classmethod
    def from_onnx(
        cls,
        info: ModelInfo,
        cache_dir: Optional[Union[str, Path]] = None,
        precision: Optional[str] = None,
        max_batch: int = 8,
        calibration: Optional[CalibrationBatches] = None,
    ) -> TensorRTBackend:
        """Load the cached engine for this model/GPU/TensorRT, building it on a miss; a model
        TensorRT cannot build is refused first, in words (``opsets.tensorrt_problems``), rather
        than by the ONNX parser's first error on the device."""
        problems = tensorrt_problems(info.ops, info.qdq)
        if problems:
            raise ModelError(f"{info.path}: TensorRT cannot build this model: {'; '.join(problems)}")
        path, prec, mb = engine_file(info, cache_dir, precision, max_batch)
        cdir = path.parent
        if path.is_file():
            log.info("loading cached TensorRT engine %s", path)
            data = path.read_bytes()
            try:
                return cls(info, data, mb)
            except EngineUnreadable:  # a cache: built again rather than a start refused until someone deletes it
                log.warning("cached TensorRT engine %s does not deserialize (%d bytes: cut short by a power cut or a "
                            "full disk?); building it again", path, len(data))
        log.info("building TensorRT %s engine for %s (minutes on a Jetson)", prec, info.path)
        data = build_engine(info, prec, mb, calibration, calibration_cache_path(cdir, info))
        publish(path, data)
        return cls(info, data, mb)

    def _io_dtype(self, name: str) -> Any:
        if self.tensor_api:
            return np_dtype(self.engine.get_tensor_dtype(name))
        return np_dtype(self.engine.get_binding_dtype(self.engine.get_binding_index(name)))

    def _buffer(self, name: str, nbytes: int) -> Any:
        cur = self._dev.get(name)
        if cur is None or cur[1] < nbytes:
            if cur is not None:
                self.cuda.free(cur[0])
            cur = (self.cuda.malloc(nbytes), nbytes)
            self._dev[name] = cur
        return cur[0]

    def _run_chunk(self, x: np.ndarray) -> np.ndarray:
        inp, outn = self.info.input_name, self.info.output_name
        ctx, eng = self.context, self.engine
        if self.tensor_api:
            ctx.set_input_shape(inp, tuple(x.shape))
            out_shape = tuple(ctx.get_tensor_shape(outn))
        else:
            i_in, i_out = eng.get_binding_index(inp), eng.get_binding_index(outn)
            ctx.set_binding_shape(i_in, tuple(x.shape))
            out_shape = tuple(ctx.get_binding_shape(i_out))
        out = np.empty(out_shape, self._io_dtype(outn))
        d_in = self._buffer(inp, x.nbytes)
        d_out = self._buffer(outn, out.nbytes)
        self.cuda.htod(d_in, x, self.stream)
        h = self.cuda.handle(self.stream)
        if self.tensor_api:
            ctx.set_tensor_address(inp, int(d_in))
            ctx.set_tensor_address(outn, int(d_out))
            for name in self._extra:
                ctx.set_tensor_address(name, int(self._extra_buffer(name, ctx.get_tensor_shape(name))))
            ok = ctx.execute_async_v3(h)
        else:
            bindings = [0] * eng.num_bindings
            bindings[i_in], bindings[i_out] = int(d_in), int(d_out)
            for name in self._extra:
                i = eng.get_binding_index(name)
                bindings[i] = int(self._extra_buffer(name, ctx.get_binding_shape(i)))
            ok = ctx.execute_async_v2(bindings, h)
        if not ok:
            raise ModelError(f"{self.info.path}: TensorRT execution failed")
        self.cuda.dtoh(out, d_out, self.stream)
        self.cuda.sync(self.stream)
        return out

    def _extra_buffer(self, name: str, shape: Any) -> Any:
        return self._buffer(name, int(np.prod(tuple(shape))) * np.dtype(self._io_dtype(name)).itemsize)

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(batch, dtype=self._in_dtype)
        n = x.shape[0]
        outs = []
        for start in range(0, n, self.max_batch):
            chunk = x[start : start + self.max_batch]
            if not self.info.dynamic_batch and chunk.shape[0] < self.max_batch:
                pad = np.zeros((self.max_batch - chunk.shape[0],) + chunk.shape[1:], chunk.dtype)
                chunk = np.concatenate([chunk, pad])
            outs.append(self._run_chunk(np.ascontiguousarray(chunk)))
        out = np.concatenate(outs)[:n] if len(outs) > 1 else outs[0][:n]
        return out if out.dtype == np.float32 else out.astype(np.float32)

    def close(self) -> None:
        for ptr, _ in self._dev.values():
            self.cuda.free(ptr)
        self._dev.clear()
        if self.stream is not None:
            self.cuda.destroy_stream(self.stream)
            self.stream = None
        self.context = None
        self.engine = None
