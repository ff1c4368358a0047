"""The worker with models a user brings: a model that cannot serve fails warm-up with a
one-line ``ModelError`` naming it (the worker never reports SERVING), and a fixed-batch
export serves. Real models built here, real ``ModelRunner`` / ``serve``, no mocks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from cloud.worker.runner import ModelRunner
from cloud.worker.server import SERVING_TAG, serve
from cloud.worker.settings import BatchingSettings, WorkerSettings
from edgewise.errors import ModelError
from edgewise.runtime.detector import Detector
from tests.edgewise.runtime.graphs import fake_yolo, names_meta
from tests.edgewise.runtime.test_own_models import N3, P5_ROWS, const_model, head


def settings(model: Path, mode: str = "on", **kw) -> WorkerSettings:
    return WorkerSettings(model=str(model), host="127.0.0.1", port=0, metrics_port=-1, worker_id="w-own",
                          threads=1, warmup_rounds=1, grace_s=1,
                          batching=BatchingSettings(max_batch_size=2, mode=mode), **kw)


def serve_fails(st: WorkerSettings) -> str:
    said: list[str] = []
    with pytest.raises(ModelError) as e:
        asyncio.run(serve(st, announce=said.append))
    assert not any(line.startswith(SERVING_TAG) for line in said)
    msg = str(e.value)
    assert "\n" not in msg and st.model in msg
    return msg


def test_warmup_runtime_failure_is_a_one_line_model_error(tmp_path):
    # true stride 64 (SpaceToDepth 64), no stride metadata, imgsz 96: onnxruntime fails at the first run
    p = const_model(tmp_path / "p6_96.onnx", head(100, 8), in_shape=("batch", 3, "height", "width"),
                    out_shape=(1, 100, 8), meta={"names": N3, "imgsz": "[96, 96]"}, space_to_depth=64)
    msg = serve_fails(settings(p))
    assert "warm-up inference failed" in msg and "SpaceToDepth" in msg


def test_native_model_whose_true_stride_is_larger_fails_warmup(tmp_path):
    # warm-up at 128x128 works; a native frame of 160x160 (a multiple of 32, not of 64) cannot (the
    # constant head serves one image per call: batching off, else the warm-up's batch of 2 fails first)
    rows = 3 * (16 * 16 + 8 * 8 + 4 * 4 + 2 * 2)  # a P6 head's at the 128x128 warm-up
    p = const_model(tmp_path / "p6_native.onnx", head(rows, 8), in_shape=("batch", 3, "height", "width"),
                    out_shape=(1, rows, 8), meta={"names": N3, "imgsz": "[128, 128]", "input_size": "native"},
                    space_to_depth=64)
    msg = serve_fails(settings(p, mode="off", input_size="auto"))
    assert "native size 160x160" in msg and "stride metadata" in msg


def test_symbolic_width_names_mismatch_fails_warmup(tmp_path):
    p = const_model(tmp_path / "dyncols.onnx", head(P5_ROWS, 8), out_shape=(1, "anchors", "cols"),
                    meta={"names": "{0: 'a', 1: 'b'}"})
    assert "8 columns but there are 2 class names" in serve_fails(settings(p))


def test_fixed_batch_export_serves_any_batch(tmp_path):
    p = fake_yolo(tmp_path / "b2.onnx", imgsz=32, nc=2, batch=2, metadata=names_meta(["a", "b"]))
    runner = ModelRunner(Detector.from_file(p, conf_thres=0.01, threads=1))
    rng = np.random.default_rng(0)
    items = [runner.prepare_array(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(3)]
    together, _ = runner.run(items)
    alone = [runner.run([it])[0][0] for it in items]
    for a, b in zip(together, alone):
        assert not isinstance(a, Exception) and not isinstance(b, Exception)
        assert len(a.boxes) > 0 and np.allclose(a.boxes, b.boxes) and np.allclose(a.scores, b.scores)
    runner.close()


def test_a_non_square_dynamic_export_runs_at_the_size_the_imgsz_setting_gives(tmp_path):
    """``imgsz: 32,64`` for a ``[B,3,H,W]`` export without size metadata: the worker took a square
    size only (``--imgsz 384,640`` was "not an integer"), so such a model ran at a guess."""
    from edgewise.runtime.metadata import yolov5_rows

    h, w = 32, 64
    a = np.zeros((1, yolov5_rows(h, w)[0], 8), np.float32)
    a[0, 0, :5] = [w / 2, h / 2, 10, 10, 0.9]
    a[0, 0, 5:] = 0.9
    p = const_model(tmp_path / "dyn.onnx", a, in_shape=("batch", 3, "height", "width"), out_shape=(1, "n", 8),
                    meta={"names": N3})
    runner = ModelRunner.from_settings(settings(p, imgsz="32,64", input_size="model"))
    assert runner.imgsz == (h, w)
    boxes = runner.run([runner.prepare_array(np.full((64, 128, 3), 114, np.uint8))])[0][0].boxes
    assert np.allclose(boxes, [[54, 22, 74, 42]])  # the middle of the 64x128 image, 20x20
