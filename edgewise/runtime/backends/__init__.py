"""Inference backends: the narrow ``InferenceBackend`` seam and its implementations.

``onnxruntime`` (CPU/CUDA/TensorRT execution providers) is always available;
``tensorrt`` (native engines) is imported lazily, only when asked for.
"""

from __future__ import annotations

from typing import List, Protocol

import numpy as np

from edgewise.runtime.metadata import ModelInfo


class InferenceBackend(Protocol):
    """Runs a preprocessed NCHW float batch through the model.

    ``run`` takes ``[B, 3, H, W]`` float32 and returns ``[B, N, 5+nc]`` float32,
    for any ``B >= 1`` (backends with a fixed batch split and pad internally).
    """

    info: ModelInfo
    name: str

    def run(self, batch: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


def split_fixed_batch(batch: np.ndarray, fixed: int) -> List[np.ndarray]:
    """Chunks of exactly ``fixed`` images (the last zero-padded) for fixed-batch models."""
    out = []
    for start in range(0, batch.shape[0], fixed):
        chunk = batch[start : start + fixed]
        if chunk.shape[0] < fixed:
            pad = np.zeros((fixed - chunk.shape[0],) + chunk.shape[1:], chunk.dtype)
            chunk = np.concatenate([chunk, pad], axis=0)
        out.append(chunk)
    return out

