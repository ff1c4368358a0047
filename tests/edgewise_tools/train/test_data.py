"""Training batches: uint8 batches hold the float batches' values, and the background
prefetch keeps the order and the random sequence, raises what the producer raised, and
stops its thread when the loop is left early; a malformed dataset.json or label line is one
error naming the file (and line), as the evaluation reads them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgewise.errors import InvalidInputError
from edgewise_tools.train.data import Augment, YoloDataset, batches, dataset_names, prefetched

ROOT = Path(__file__).resolve().parents[3]


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


@pytest.mark.parametrize("meta, label, expected", [
    # a dataset.json that is not JSON: a JSONDecodeError traceback
    ("{not json", None, "dataset.json: not valid JSON (Expecting property name"),
    # a class id of nan: an IndexError traceback in the first batch's loss
    (None, "nan 0.5 0.5 0.2 0.2", "labels/{stem}.txt:1: class nan is not a class id (an integer >= 0)"),
    # a class id of 1.5 was trained as class 1
    (None, "1.5 0.5 0.5 0.2 0.2", "labels/{stem}.txt:1: class 1.5 is not a class id (an integer >= 0)"),
    (None, "42 0.5 0.5 0.2 0.2", "labels/{stem}.txt:1: class 42 is not one of the 10 classes (0..9)"),
    # class names no tool loads a model with: the whole run trained, then best.onnx was refused
    # by every loader (edge, worker, eval, model info)
    (json.dumps({"names": ["car", "car"] + [str(i) for i in range(2, 10)]}),
     None, "dataset.json: names: class names repeat ('car'): the edge and the cloud model's classes are matched "
           "by name, so each must be unique; rename one in dataset.json"),
    (json.dumps({"names": ["car\nbus"] + [str(i) for i in range(1, 10)]}),
     None, "dataset.json: names: class name 0 'car\\nbus' must be 1..256 characters, not blank, without control"),
    (json.dumps({"names": ["x" * 300] + [str(i) for i in range(1, 10)]}), None, "class name 0 'xxxx"),
])
def test_a_malformed_dataset_is_one_error_line_of_edgewise_train(tiny_data: Path, tmp_path: Path, meta: object,
                                                                  label: object, expected: str) -> None:
    data = tmp_path / "ds"
    shutil.copytree(tiny_data, data)
    first = sorted((data / "labels").iterdir())[0]
    if meta is not None:
        (data / "dataset.json").write_text(str(meta))
    if label is not None:
        first.write_text(f"{label}\n")
    p = subprocess.run([sys.executable, "-m", "edgewise.cli", "train", "--data", str(data), "--out",
                        str(tmp_path / "run"), "--epochs", "1", "--imgsz", "64", "--no-export"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert expected.format(stem=first.stem) in p.stderr


def test_class_names_come_from_dataset_json_as_the_evaluation_reads_it(tmp_path: Path) -> None:
    """A dataset.json without names was a KeyError traceback; names that are no list went
    through as whatever iterating them gave (the letters of a string)."""
    (tmp_path / "dataset.json").write_text(json.dumps({"nc": 3}))
    assert dataset_names(tmp_path) == ["0", "1", "2"]
    (tmp_path / "dataset.json").write_text(json.dumps({"streams": 2}))
    assert dataset_names(tmp_path) == [str(i) for i in range(10)]
    (tmp_path / "dataset.json").write_text(json.dumps({"names": "abc"}))
    with pytest.raises(InvalidInputError, match=r"dataset.json: names 'abc': must be a non-empty list of class"):
        dataset_names(tmp_path)
    (tmp_path / "dataset.json").write_text(json.dumps({"names": ["car", "bus"]}))
    assert dataset_names(tmp_path) == ["car", "bus"]
