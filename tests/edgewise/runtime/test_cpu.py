"""``edgewise.runtime.cpu``: what the CPU offers INT8 inference, and the daemon's warning for an
INT8 model where ONNX Runtime's INT8 kernels lack VNNI (a real model, flags monkeypatched)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edgewise.runtime import cpu

ROOT = Path(__file__).resolve().parents[3]
SHIPPED_INT8 = ROOT / "models" / "camera" / "edge-int8.onnx"
AVX2 = frozenset({"sse2", "avx2", "fma"})


@pytest.mark.parametrize("flags,support,lacks", [
    (AVX2, "x86 AVX2, no VNNI", True),
    (AVX2 | {"avx512f", "avx512_vnni"}, "x86 AVX-512 VNNI", False),
    (AVX2 | {"avx_vnni"}, "x86 AVX-VNNI", False),
    (AVX2 | {"amx_int8"}, "x86 AMX-INT8", False),
    (frozenset({"sse2"}), "x86 without AVX2", False),
    (frozenset({"asimd", "asimddp"}), None, False),  # arm64: another story
    (None, None, False),
])
def test_int8_support_and_vnni(monkeypatch, flags, support, lacks) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    if support is not None:
        assert cpu.cpu_int8_support() == support
    assert cpu.cpu_lacks_vnni() is lacks


@pytest.mark.parametrize("flags,warned", [(AVX2, True), (AVX2 | {"avx512_vnni"}, False)])
def test_an_int8_model_without_vnni_is_warned_about(monkeypatch, caplog, flags, warned) -> None:
    from edgewise.runtime.backends.onnxruntime import OnnxRuntimeBackend
    from edgewise.runtime.metadata import load_model_info

    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    info = load_model_info(SHIPPED_INT8)
    assert info.precision == "int8"
    with caplog.at_level(logging.WARNING, logger="edgewise.runtime.backends.onnxruntime"):
        OnnxRuntimeBackend(info, threads=1).close()
    hits = [r.getMessage() for r in caplog.records if "without VNNI" in r.getMessage()]
    assert bool(hits) is warned, hits
    if warned:
        assert "x86 AVX2, no VNNI" in hits[0] and "prefer the float model" in hits[0]
