"""Training batches: uint8 batches hold the float batches' values, and the background
prefetch keeps the order and the random sequence, raises what the producer raised, and
stops its thread when the loop is left early."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgewise_tools.train.data import Augment, YoloDataset, batches, prefetched


def test_uint8_batches_are_the_float_batches_before_scaling(tiny_data: Path) -> None:
    ds = YoloDataset(tiny_data, 128)
    plain = list(batches(ds, 3, np.random.default_rng(5), Augment()))
    small = list(batches(ds, 3, np.random.default_rng(5), Augment(), as_uint8=True))
    assert len(plain) == len(small) >= 2
    for (x, tg, idx), (u, tg8, idx8) in zip(plain, small):
        assert u.dtype == np.uint8 and x.dtype == np.float32
        assert np.array_equal(x, u.astype(np.float32) / 255.0)
        assert np.array_equal(tg, tg8) and np.array_equal(idx, idx8)


def test_prefetched_batches_are_the_same_batches_in_the_same_order(tiny_data: Path) -> None:
    """The augmentation draws from one generator: one producer thread draws it in the same
    sequence as a plain loop, so a seeded run is the same run with the prefetch."""
    ds = YoloDataset(tiny_data, 128)
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    plain = list(batches(ds, 2, rng_a, Augment(), as_uint8=True))
    ahead = list(prefetched(batches(ds, 2, rng_b, Augment(), as_uint8=True)))
    assert len(plain) == len(ahead)
    for a, b in zip(plain, ahead):
        assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert rng_a.bit_generator.state == rng_b.bit_generator.state


def test_prefetched_raises_the_producers_error_where_it_came() -> None:
    def items():
        yield 1
        yield 2
        raise ValueError("label file 3 is malformed")

    got = []
    with pytest.raises(ValueError, match="malformed"):
        for it in prefetched(items()):
            got.append(it)
    assert got == [1, 2]


def test_leaving_the_loop_early_stops_the_producer() -> None:
    made = []

    def items():
        for k in range(1000):
            made.append(k)
            yield k

    before = {t.ident for t in threading.enumerate()}
    gen = prefetched(items(), depth=2)
    for it in gen:
        if it == 3:
            break
    gen.close()
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "train-batches" and t.ident not in before]
    assert len(made) <= 3 + 1 + 2 + 1  # the items handed out, the queue's depth and the one being made
