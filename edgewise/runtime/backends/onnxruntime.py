"""ONNX Runtime backend: provider preference, threads, IO binding, fixed batches.

Execution providers are tried in the order TensorRT -> CUDA -> CPU, keeping only
those ``onnxruntime.get_available_providers()`` reports (so the same code runs
on a Jetson with onnxruntime-gpu and on a CPU box). On a GPU provider the input
is bound with IO binding (``bind_cpu_input`` / ``bind_output`` on the device) to
skip ONNX Runtime's per-run host staging; on CPU plain ``session.run`` is
already zero-copy. Models exported with a fixed batch are fed in chunks of that
size, the last one zero-padded.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgewise.errors import ConfigError, DeploymentError, ModelError
from edgewise.runtime.backends import split_fixed_batch
from edgewise.runtime.cpu import cpu_int8_support, cpu_lacks_vnni
from edgewise.runtime.metadata import ModelInfo

log = logging.getLogger(__name__)

PREFERENCE = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
GRAPH_OPT_LEVELS = ("disable", "basic", "extended", "all")
ProviderSpec = Union[str, Tuple[str, Dict[str, Any]]]
ONNXRUNTIME_MISSING = (
    "the onnxruntime backend needs ONNX Runtime, which is not installed: pip install onnxruntime "
    "(the Jetson bundle installs it: sudo /usr/lib/edgewise-edge/setup.sh --force); "
    "or use the tensorrt backend where TensorRT is installed"
)


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or ``DeploymentError`` saying how to install it."""
    try:
        import onnxruntime
    except ImportError as e:
        raise DeploymentError(f"{ONNXRUNTIME_MISSING} ({e})") from None
    return onnxruntime


def choose_providers(
    available: Sequence[str],
    requested: Optional[Sequence[str]] = None,
    trt_cache_dir: Optional[Path] = None,
    fp16: bool = True,
) -> List[ProviderSpec]:
    """Providers to use, best first (pure: ``available`` is injected).

    ``requested`` (names, best first) restricts the choice; a requested provider
    that is not available raises ``ConfigError`` listing what is. CPU is always
    appended as the last resort so unsupported nodes still run.
    """
    avail = list(available)
    if requested:
        missing = [p for p in requested if p not in avail]
        if missing:
            raise ConfigError(
                f"providers {missing} are not available in this onnxruntime build; "
                f"available: {avail} (install onnxruntime-gpu for CUDA/TensorRT)"
            )
        order = list(requested)
    else:
        order = [p for p in PREFERENCE if p in avail]
    if "CPUExecutionProvider" not in order:
        order.append("CPUExecutionProvider")
    out: List[ProviderSpec] = []
    for p in order:
        if p == "TensorrtExecutionProvider":
            opts: Dict[str, Any] = {"trt_fp16_enable": fp16}
            if trt_cache_dir is not None:
                opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(trt_cache_dir))
            out.append((p, opts))
        else:
            out.append(p)
    return out


def session_options(
    threads: Optional[int] = None, inter_threads: Optional[int] = None, graph_opt: str = "all",
    spinning: Optional[bool] = None,
) -> Any:
    """``SessionOptions`` with thread counts, graph optimisation level and, when ``spinning``
    is given, whether idle pool threads busy-wait for work (ONNX Runtime's
    ``session.intra_op.allow_spinning`` / ``inter_op``; its default spins: right for
    back-to-back inference, a waste of every pool thread's idle time at camera pace)."""
    ort = import_onnxruntime()

    if graph_opt not in GRAPH_OPT_LEVELS:
        raise ConfigError(f"graph_opt {graph_opt!r}: use one of {', '.join(GRAPH_OPT_LEVELS)}")
    so = ort.SessionOptions()
    if threads is not None:
        if threads < 0:
            raise ConfigError(f"threads must be >= 0 (0 = onnxruntime default), got {threads}")
        so.intra_op_num_threads = int(threads)
    if inter_threads is not None:
        if inter_threads < 0:
            raise ConfigError(f"inter_threads must be >= 0, got {inter_threads}")
        so.inter_op_num_threads = int(inter_threads)
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL if inter_threads > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    if spinning is not None:
        for pool in ("intra_op", "inter_op"):
            so.add_session_config_entry(f"session.{pool}.allow_spinning", "1" if spinning else "0")
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[graph_opt]
    return so


class OnnxRuntimeBackend:
    """``InferenceBackend`` on an ``onnxruntime.InferenceSession``."""

    name = "onnxruntime"

    def __init__(
        self,
        info: ModelInfo,
        providers: Optional[Sequence[str]] = None,
        threads: Optional[int] = None,
        inter_threads: Optional[int] = None,
        graph_opt: str = "all",
        io_binding: Optional[bool] = None,
        trt_cache_dir: Optional[Path] = None,
        spinning: Optional[bool] = None,
    ) -> None:
        ort = import_onnxruntime()

        self.info = info
        chosen = choose_providers(ort.get_available_providers(), providers, trt_cache_dir,
                                  fp16=info.precision != "int8")
        so = session_options(threads, inter_threads, graph_opt, spinning)
        try:
            self.session = ort.InferenceSession(str(info.path), sess_options=so, providers=chosen)
        except Exception as e:  # onnxruntime raises its own exception types
            raise ModelError(f"{info.path}: onnxruntime cannot load the model: {e}") from None
        self.providers = list(self.session.get_providers())
        on_gpu = self.providers[0] in ("TensorrtExecutionProvider", "CUDAExecutionProvider")
        self.io_binding = on_gpu if io_binding is None else bool(io_binding)
        self.device = "cuda" if on_gpu else "cpu"
        self._dtype = np.float16 if info.input_dtype == "float16" else np.float32
        self.name = f"onnxruntime[{self.providers[0].replace('ExecutionProvider', '')}]"
        log.info("%s: %s, providers %s", info.path, self.name, self.providers)
        if info.precision == "int8" and self.device == "cpu" and cpu_lacks_vnni():
            log.warning("%s: an INT8 model on an x86 CPU without VNNI (%s): ONNX Runtime's INT8 kernels "
                        "run at about float speed here and their sums can saturate, so the model is no faster "
                        "than its float version and agrees with it less; prefer the float model on this CPU",
                        info.path, cpu_int8_support())

    def _run_one(self, x: np.ndarray) -> np.ndarray:
        if self.io_binding:
            binding = self.session.io_binding()
            binding.bind_cpu_input(self.info.input_name, x)
            binding.bind_output(self.info.output_name, self.device)
            self.session.run_with_iobinding(binding)
            out = binding.copy_outputs_to_cpu()[0]
        else:
            out = self.session.run([self.info.output_name], {self.info.input_name: x})[0]
        return np.asarray(out)

    def run(self, batch: np.ndarray) -> np.ndarray:
        """``[B,3,H,W]`` float -> ``[B,N,5+nc]`` float32."""
        x = np.ascontiguousarray(batch, dtype=self._dtype)
        if self.info.dynamic_batch or x.shape[0] == self.info.fixed_batch:
            out = self._run_one(x)
        else:
            n = x.shape[0]
            out = np.concatenate([self._run_one(c) for c in split_fixed_batch(x, self.info.fixed_batch)])[:n]
        return out if out.dtype == np.float32 else out.astype(np.float32)

    def close(self) -> None:
        self.session = None
