"""ModelInfo: metadata from a real built model, sidecar YAML, and every bad model file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgewise.errors import ModelError
from edgewise.runtime.metadata import load_model_info, names_to_metadata, parse_names
from tests.edgewise.runtime.graphs import fake_yolo, names_meta


def test_real_built_model(tiny_model: Path):
    info = load_model_info(tiny_model)
    assert info.names == tuple(str(i) for i in range(10)) and info.nc == 10
    assert info.stride == 32 and info.imgsz == (160, 160)
    assert info.input_name == "images" and info.input_shape[1:] == (3, 160, 160)
    assert info.output_shape[1:] == (3 * (20 * 20 + 10 * 10 + 5 * 5), 15)
    assert info.dynamic_batch and not info.dynamic_hw
    assert info.precision == "float32" and info.input_dtype == "float32"
    assert info.sha256 == hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    assert info.names_source == "onnx-metadata"


def test_ultralytics_names_literal():
    assert parse_names("{0: 'person', 1: 'bicycle'}", "x") == ("person", "bicycle")
    assert parse_names(["a", "b"], "x") == ("a", "b")
    assert parse_names(names_to_metadata(["x", "y"]), "x") == ("x", "y")
    with pytest.raises(ModelError, match="not a Python dict/list literal"):
        parse_names("__import__('os').system('true')", "m.onnx (ONNX metadata)")
    with pytest.raises(ModelError, match="0..1 without gaps"):
        parse_names("{0: 'a', 2: 'b'}", "x")


def test_sidecar_yaml_named_after_model(tmp_path: Path):
    p = fake_yolo(tmp_path / "det.onnx", imgsz=32, nc=2, batch=None)
    (tmp_path / "det.yaml").write_text("names: {0: cat, 1: dog}\nstride: 32\nimgsz: [32, 32]\n")
    info = load_model_info(p)
    assert info.names == ("cat", "dog") and info.names_source.endswith("det.yaml")


def test_sidecar_model_yaml_list(tmp_path: Path):
    p = fake_yolo(tmp_path / "x.onnx", nc=2)
    (tmp_path / "model.yaml").write_text("names: [cat, dog]\n")
    assert load_model_info(p).names == ("cat", "dog")


def test_metadata_wins_over_sidecar(tmp_path: Path):
    p = fake_yolo(tmp_path / "m.onnx", nc=2, metadata=names_meta(["p", "q"]))
    (tmp_path / "m.yaml").write_text("names: [cat, dog]\n")
    assert load_model_info(p).names == ("p", "q")


def test_no_names_anywhere_defaults_to_indices(tmp_path: Path):
    info = load_model_info(fake_yolo(tmp_path / "m.onnx", nc=2))
    assert info.names == ("0", "1") and info.names_source == "default"


def test_missing_file(tmp_path: Path):
    with pytest.raises(ModelError, match=r"nope\.onnx does not exist"):
        load_model_info(tmp_path / "nope.onnx")


def test_corrupt_file(tmp_path: Path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x08\x07this is not protobuf\xff\xff\xff")
    with pytest.raises(ModelError, match=r"bad\.onnx is not a valid ONNX model"):
        load_model_info(p)


def test_truncated_real_model(tmp_path: Path, tiny_model: Path):
    p = tmp_path / "trunc.onnx"
    p.write_bytes(tiny_model.read_bytes()[:5000])
    with pytest.raises(ModelError, match="trunc.onnx"):
        load_model_info(p)


def test_wrong_input_rank(tmp_path: Path):
    p = fake_yolo(tmp_path / "r.onnx", input_rank=2)
    with pytest.raises(ModelError, match=r"YOLOv5 detector.*rank 2"):
        load_model_info(p)


def test_output_inconsistent_with_names(tmp_path: Path):
    p = fake_yolo(tmp_path / "o.onnx", nc=2, metadata=names_meta(["a", "b", "c"]))
    with pytest.raises(ModelError, match=r"7 columns but there are 3 class names.*5 \+ nc = 8"):
        load_model_info(p)


def test_not_a_detector_output_rank(tmp_path: Path):
    node = helper.make_node("Relu", ["images"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    p = tmp_path / "cls.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p))
    with pytest.raises(ModelError, match=r"output \[B,N,5\+nc\].*rank 4"):
        load_model_info(p)


def test_bad_stride_metadata(tmp_path: Path):
    meta = names_meta(["a", "b"])
    meta["stride"] = "thirty-two"
    with pytest.raises(ModelError, match="stride must be an integer"):
        load_model_info(fake_yolo(tmp_path / "s.onnx", metadata=meta))


def test_int8_qdq_detected(tmp_path: Path):
    info = load_model_info(fake_yolo(tmp_path / "q.onnx", quant=True))
    assert info.precision == "int8"


def test_fixed_batch_and_float16(tmp_path: Path):
    info = load_model_info(fake_yolo(tmp_path / "f.onnx", batch=1))
    assert not info.dynamic_batch and info.fixed_batch == 1
    m = onnx.load(str(tmp_path / "f.onnx"))
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            arr = onnx.numpy_helper.to_array(t).astype(np.float16)
            t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    onnx.save(m, str(tmp_path / "h.onnx"))
    assert load_model_info(tmp_path / "h.onnx").precision == "float16"
