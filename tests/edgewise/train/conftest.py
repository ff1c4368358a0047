"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_torch_thread():
    """Train on one intra-op thread: two on a 2-core machine shared with other work spin-wait badly."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
