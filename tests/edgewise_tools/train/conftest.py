"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgewise.synth import PRESETS, SynthJob, generate

EASY = dataclasses.replace(PRESETS["easy"], objects_min=2, objects_max=3, size_easy=(20.0, 30.0),
                           size_hard=(16.0, 24.0), occluders_max=0)


@pytest.fixture
def one_torch_thread():
    """Train on one intra-op thread: two on a 2-core machine shared with other work spin-wait badly."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """Two 128x128 training-split frames of 2-3 large, clear digits."""
    out = tmp_path_factory.mktemp("tiny") / "ds"
    generate(SynthJob(out=out, frames=4, streams=2, seed=9, split="train", width=128, height=128,
                      difficulty=EASY, stride=5))
    return out
