"""``edgewise model info`` runs one frame through the model: a model every runtime refuses at
its first frame (logits, a dynamic YOLOv8 export) is not reported as valid. Tiny real graphs
on ONNX Runtime, through ``describe`` and the real CLI entry point."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgewise.cli import main
from edgewise_tools.models.info import describe
from tests.edgewise.runtime.graphs import fake_yolo, names_meta
from tests.edgewise.runtime.test_own_models import GRID_CELLS, N3, P5_ROWS, S, const_model, head


def test_logits_are_broken_at_first_inference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logits = head(P5_ROWS, 8)
    logits[..., 4:] = -6.0  # an export without the Detect layer's sigmoid
    p = const_model(tmp_path / "logits.onnx", logits, meta={"names": N3})
    d = describe(p)
    assert d["graph_error"].startswith("first inference: objectness/class scores range over [-6, -6]")
    assert "not sigmoid probabilities" in d["graph_error"]
    assert main(["model", "info", str(p)]) == 1
    out, err = capsys.readouterr()
    assert "graph      BROKEN: first inference:" in out
    (line,) = err.splitlines()
    assert line.startswith(f"edgewise: error: {p}: ") and "sigmoid" in line


def test_dynamic_yolov8_export_is_broken_at_first_inference(tmp_path: Path) -> None:
    p = const_model(tmp_path / "v8.onnx", np.zeros((1, 7, GRID_CELLS), np.float32),
                    in_shape=("batch", 3, "height", "width"), out_shape=("batch", "c", "anchors"),
                    meta={"names": N3, "imgsz": f"[{S}, {S}]"})
    err = describe(p)["graph_error"]
    assert err.startswith("first inference: ") and "YOLOv8's transposed [B,4+nc,N] layout" in err


@pytest.mark.parametrize("batch", [None, 2])
def test_a_decodable_model_is_valid(tmp_path: Path, batch: object, capsys: pytest.CaptureFixture[str]) -> None:
    p = fake_yolo(tmp_path / "ok.onnx", imgsz=32, nc=2, batch=batch, metadata=names_meta(["a", "b"]))  # type: ignore[arg-type]
    assert describe(p)["graph_error"] is None
    assert main(["model", "info", str(p)]) == 0
    assert "graph      valid (ONNX checker; ONNX Runtime loads and runs it)" in capsys.readouterr().out


def test_a_batch_dynamic_in_name_only_is_a_warning_not_a_broken_graph(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The model runs one frame at a time (model.max_batch 1, the worker's batch 1): `model info`
    called it "BROKEN" and exited 1; it now says what works and what to set."""
    from tests.edgewise.runtime.test_own_models import batch_of_one_only

    p = batch_of_one_only(tmp_path / "b1.onnx")
    d = describe(p)
    assert d["graph_error"] is None and d["dynamic_batch"]
    assert d["batch_error"].startswith("one frame runs but a batch of 2 fails (")
    assert d["warnings"] == [d["batch_error"]]  # in the JSON too
    assert main(["model", "info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "dynamic batch (in name only: runs one frame at a time)" in out
    assert "graph      valid" in out and "warning    one frame runs but a batch of 2 fails" in out
    assert describe(fake_yolo(tmp_path / "ok.onnx", imgsz=32, nc=2, batch=None,  # type: ignore[arg-type]
                              metadata=names_meta(["a", "b"])))["batch_error"] is None


def test_quantization_metadata_nested_past_the_json_decoders_depth_is_shown_raw(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model whose ``edgewise_quant`` metadata is JSON nested past the decoder's depth (hostile
    or hand-made): ``model info`` ended in a RecursionError traceback; hand-edited metadata is
    shown as it is, and so is this."""
    deep = "[" * 100_000 + "]" * 100_000
    p = fake_yolo(tmp_path / "deep.onnx", imgsz=32, nc=2, metadata={**names_meta(["a", "b"]), "edgewise_quant": deep})
    assert main(["model", "info", str(p)]) == 0
    quantized = [line for line in capsys.readouterr().out.splitlines() if line.startswith("quantized")]
    assert quantized == [f"quantized  {deep}"]
