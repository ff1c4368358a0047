"""The CUDA runtime calls the TensorRT backend needs, over ``ctypes`` on ``libcudart``.

TensorRT's Python bindings leave device memory and streams to the caller. NVIDIA's samples
use ``cuda-python`` or ``pycuda``, neither a good fit for JetPack 5.1: ``cuda-python``'s
aarch64 wheels for Python 3.8 are built for CUDA 11.8 and 12 (JetPack 5.1 has 11.4) and
``pycuda`` has no wheel (pip compiles it against the CUDA toolkit), while ``libcudart`` is on
every machine that can run TensorRT. So, as NVIDIA's Polygraphy does (``polygraphy/cuda/cuda.py``), this
module loads the library with ``ctypes`` and declares the seven functions used: allocate,
free, create a stream, copy asynchronously, synchronize, and name the device (CUDA Runtime
API reference, <https://docs.nvidia.com/cuda/cuda-runtime-api/>). No Python package needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from typing import Any, List, Optional

import numpy as np

from edgewise.errors import DeploymentError, ModelError

#: cudaMemcpyKind
HOST_TO_DEVICE = 1
DEVICE_TO_HOST = 2
#: sizeof(cudaDeviceProp) is 712 bytes in CUDA 11.4 and 1008 in 12.x; ``name`` is its first field
_PROP_BYTES = 4096
_NAME_BYTES = 256


class CudaUnavailableError(DeploymentError):
    """No loadable ``libcudart`` (or no CUDA device) on this host."""


def candidates() -> List[str]:
    """Where ``libcudart`` may be, most specific first: ``$EDGEWISE_CUDART``, the loader's
    cache, JetPack's and the CUDA toolkit's folders, and pip's ``nvidia-cuda-runtime`` wheels."""
    out: List[str] = []
    env = os.environ.get("EDGEWISE_CUDART")
    if env:
        out.append(env)
    found = ctypes.util.find_library("cudart")
    if found:
        out.append(found)
    out += ["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"]
    for pattern in ("/usr/local/cuda/lib64/libcudart.so*", "/usr/local/cuda/targets/*/lib/libcudart.so*",
                    *(os.path.join(p, "nvidia", "cuda_runtime", "lib", "libcudart.so*") for p in sys.path if p)):
        out += sorted(glob.glob(pattern))
    return list(dict.fromkeys(out))


def load_library() -> Any:
    """``ctypes.CDLL`` of the first loadable ``libcudart``, or ``CudaUnavailableError``."""
    tried = candidates()
    for name in tried:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CudaUnavailableError(
        "the TensorRT backend needs CUDA's runtime library libcudart, which cannot be loaded "
        f"(tried {', '.join(tried[:6])}{', ...' if len(tried) > 6 else ''}): on Jetson it comes with "
        "JetPack (sudo apt-get install nvidia-jetpack, or cuda-cudart-11-4); elsewhere install the "
        "CUDA runtime, or set EDGEWISE_CUDART to the library's path"
    )


class CudaRuntime:
    """Device memory, streams and copies on CUDA device 0 (``lib``: a loaded ``libcudart``)."""

    def __init__(self, lib: Any = None) -> None:
        self.lib = lib if lib is not None else load_library()
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        self._declare("cudaMalloc", [ctypes.POINTER(vp), sz])
        self._declare("cudaFree", [vp])
        self._declare("cudaStreamCreate", [ctypes.POINTER(vp)])
        self._declare("cudaStreamDestroy", [vp])
        self._declare("cudaMemcpyAsync", [vp, vp, sz, i, vp])
        self._declare("cudaStreamSynchronize", [vp])
        self._declare("cudaGetDeviceProperties", [ctypes.c_char_p, i])
        self.lib.cudaGetErrorString.argtypes = [i]
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p

    def _declare(self, name: str, argtypes: List[Any]) -> None:
        fn = getattr(self.lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int

    def _check(self, call: str, err: int) -> None:
        if err != 0:
            text = self.lib.cudaGetErrorString(err)
            detail = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
            raise ModelError(f"CUDA {call} failed: error {err} ({detail})")

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self._check("cudaMalloc", self.lib.cudaMalloc(ctypes.byref(ptr), nbytes))
        return int(ptr.value or 0)

    def free(self, ptr: int) -> None:
        self.lib.cudaFree(ptr)

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self._check("cudaStreamCreate", self.lib.cudaStreamCreate(ctypes.byref(s)))
        return int(s.value or 0)

    def destroy_stream(self, stream: int) -> None:
        self.lib.cudaStreamDestroy(stream)

    def handle(self, stream: int) -> int:
        return int(stream)

    def htod(self, ptr: int, host: np.ndarray, stream: int) -> None:
        self._check("cudaMemcpyAsync", self.lib.cudaMemcpyAsync(
            ptr, host.ctypes.data, host.nbytes, HOST_TO_DEVICE, stream))

    def dtoh(self, host: np.ndarray, ptr: int, stream: int) -> None:
        self._check("cudaMemcpyAsync", self.lib.cudaMemcpyAsync(
            host.ctypes.data, ptr, host.nbytes, DEVICE_TO_HOST, stream))

    def sync(self, stream: int) -> None:
        self._check("cudaStreamSynchronize", self.lib.cudaStreamSynchronize(stream))

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(_PROP_BYTES)
        err = self.lib.cudaGetDeviceProperties(buf, 0)
        if err != 0:  # cudaErrorNoDevice, cudaErrorInsufficientDriver, ...
            text = self.lib.cudaGetErrorString(err)
            raise CudaUnavailableError(
                f"no usable CUDA device: {text.decode(errors='replace') if isinstance(text, bytes) else text}")
        return buf.raw[:_NAME_BYTES].split(b"\0", 1)[0].decode(errors="replace")


def device_name(lib: Any = None) -> Optional[str]:
    """Name of CUDA device 0, or ``None`` when there is no ``libcudart`` or no device."""
    try:
        return CudaRuntime(lib).device_name()
    except (CudaUnavailableError, AttributeError, OSError):
        return None
