"""What this CPU offers INT8 inference, from ``/proc/cpuinfo`` (standard library only).

ONNX Runtime's x86 INT8 kernels multiply u8 x s8 and accumulate in int32; with VNNI
(AVX-512 VNNI, AVX-VNNI) or AMX-INT8 that is one instruction. Without it the AVX2 kernels
use ``vpmaddubsw``, whose int16 intermediate sums saturate, and run at about float speed:
an INT8 model is then no faster than its float model and agrees with it less (the camera
pair's INT8 edge model: F1 0.910 against its float model on a CPU without VNNI, 0.965 on one
with it; README, "Edge daemon CPU per frame"). The daemon warns when it loads an INT8 model
on such a CPU (``edgewise.runtime.backends.onnxruntime``); the quantizer and the benches
print :func:`cpu_int8_support`. A Jetson runs INT8 on TensorRT, where none of this applies.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import FrozenSet, Optional

#: x86 flags that give ONNX Runtime one-instruction u8 x s8 dot products, with their names
INT8_FLAGS = (("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"), ("amx_int8", "AMX-INT8"))


def cpu_flags() -> Optional[FrozenSet[str]]:
    """The CPU's feature flags (x86 ``flags``, arm64 ``Features`` of /proc/cpuinfo); None
    where /proc/cpuinfo is absent or lists none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    flags = {f for line in lines if line.startswith(("flags", "Features")) for f in line.split(":", 1)[1].split()}
    return frozenset(flags) or None


def cpu_int8_support() -> str:
    """What this CPU offers ONNX Runtime's x86 INT8 kernels, e.g. ``x86 AVX-512 VNNI``."""
    flags = cpu_flags()
    if flags is None or "sse2" not in flags:  # not x86: its INT8 kernels are another story
        return platform.machine() or "unknown CPU"
    have = [name for flag, name in INT8_FLAGS if flag in flags]
    if have:
        return "x86 " + ", ".join(have)
    return "x86 AVX2, no VNNI" if "avx2" in flags else "x86 without AVX2"


def cpu_lacks_vnni() -> bool:
    """True on an x86 CPU with AVX2 but none of :data:`INT8_FLAGS`."""
    flags = cpu_flags()
    return flags is not None and "avx2" in flags and not {f for f, _ in INT8_FLAGS} & flags
