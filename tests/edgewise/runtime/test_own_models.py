"""Models a user brings that are not what they claim: refused at load or at the first
inference with a one-line ``ModelError`` naming the file, never misread or a traceback.

Each model is a tiny graph built here: a constant head ``C`` (+ 0 * sum(input), so the
output depends on the input) with the input/output shapes and metadata under test, loaded
by the real loaders (``load_model_info``, ``Detector.from_file``) and run on ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence, Union

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgewise.errors import ConfigError, InvalidInputError, ModelError
from edgewise.runtime.decoding import decode
from edgewise.runtime.detector import Detector
from edgewise.runtime.firstframe import first_frame_problem
from edgewise.runtime.metadata import load_model_info, parse_names, yolov5_rows
from edgewise.runtime.opsets import device_problems
from tests.edgewise.runtime.graphs import fake_yolo

Dim = Union[int, str]
N3 = "{0: 'cat', 1: 'dog', 2: 'car'}"
S = 64  # input side of the tiny models: a YOLOv5 P5 head has 3 * (8*8 + 4*4 + 2*2) = 252 rows
P5_ROWS = 252
GRID_CELLS = 84


def head(rows: int, cols: int, obj: float = 0.9) -> np.ndarray:
    """A ``[1, rows, cols]`` YOLOv5-like head with one box in the middle of the input."""
    a = np.zeros((1, rows, cols), np.float32)
    a[0, 0, :5] = [S / 2, S / 2, 10, 10, obj]
    a[0, 0, 5:] = 0.9
    return a


def const_model(path: Path, const: np.ndarray, in_shape: Sequence[Dim] = (1, 3, S, S),
                out_shape: Optional[Sequence[Dim]] = None, meta: Optional[Dict[str, str]] = None,
                ir_version: int = 8, opset: int = 17, space_to_depth: int = 0,
                out_type: int = TensorProto.FLOAT) -> Path:
    nodes = []
    x = "images"
    if space_to_depth:  # needs H and W to be multiples of the block: a model whose true stride is that
        nodes.append(helper.make_node("SpaceToDepth", [x], ["sd"], blocksize=space_to_depth))
        x = "sd"
    nodes += [helper.make_node("ReduceSum", [x], ["s"], keepdims=0),
              helper.make_node("Mul", ["s", "zero"], ["z"]),
              helper.make_node("Add", ["C", "z"], ["output0" if out_type == TensorProto.FLOAT else "f"])]
    if out_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["f"], ["output0"], to=out_type))
    inits = [numpy_helper.from_array(const.astype(np.float32), "C"),
             numpy_helper.from_array(np.array(0, np.float32), "zero")]
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("images", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("output0", out_type, list(out_shape or const.shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="pytorch")
    model.ir_version = ir_version
    for k, v in {"stride": "32", **(meta or {})}.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))
    return path


def gray(h: int = 48, w: int = 64) -> np.ndarray:
    return np.full((h, w, 3), 114, np.uint8)


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# -- 1. channels-last input ------------------------------------------------------------
@pytest.mark.parametrize("in_shape", [("batch", "height", "width", 3), (1, S, S, 3)])
def test_channels_last_input_is_refused_at_load(tmp_path, in_shape):
    p = const_model(tmp_path / "nhwc.onnx", head(P5_ROWS, 8), in_shape=in_shape, meta={"names": N3})
    with pytest.raises(ModelError) as e:
        load_model_info(p)
    assert "nhwc.onnx" in one_line(e)
    assert "is [B,H,W,3] (channels last); export with channels first [B,3,H,W]" in str(e.value)


def test_symbolic_size_channels_first_input_still_loads_and_detects(tmp_path):
    p = const_model(tmp_path / "nchw.onnx", head(P5_ROWS, 8), in_shape=("batch", 3, "height", "width"),
                    out_shape=("batch", "anchors", 8), meta={"names": N3, "imgsz": f"[{S}, {S}]"})
    info = load_model_info(p)
    assert info.dynamic_hw and info.imgsz == (S, S)
    with Detector.from_file(p, threads=1) as det:
        (d,) = det.detect([gray()])
    assert d.names[int(d.class_ids[0])] == "cat" and len(d.boxes) == 1


# -- 2. symbolic output width that disagrees with the names -----------------------------
def test_symbolic_output_width_mismatch_fails_first_inference_with_model_error(tmp_path):
    # a 3-class head (8 columns) whose metadata names 2 classes; the graph leaves the width symbolic
    p = const_model(tmp_path / "dyncols.onnx", head(P5_ROWS, 8), out_shape=(1, "anchors", "cols"),
                    meta={"names": "{0: 'a', 1: 'b'}"})
    det = Detector.from_file(p, threads=1)
    with pytest.raises(ModelError) as e:
        det.detect([gray()])
    msg = one_line(e)
    assert "dyncols.onnx" in msg and "8 columns" in msg and "2 class names" in msg
    det.close()


def test_decode_column_mismatch_is_a_model_error():
    with pytest.raises(ModelError, match="6 columns but 3 class names"):
        decode(np.zeros((1, 10, 6), np.float32), [None], ("a", "b", "c"))


# -- 3. ONNX IR version on JetPack 5.1 ----------------------------------------------------
def test_ir_version_10_is_a_device_problem_and_lowering_it_fixes_it(tmp_path):
    p = const_model(tmp_path / "ir10.onnx", head(P5_ROWS, 8), meta={"names": N3}, ir_version=10)
    info = load_model_info(p)
    assert info.ir_version == 10
    (problem,) = device_problems(info.opsets, info.node_domains, info.ir_version)
    assert "IR version 10" in problem and "ONNX Runtime 1.16.3" in problem and "ir_version = 9" in problem
    # the advice works: at opset 17, setting the number to 9 loads and runs the same
    m = onnx.load(str(p))
    m.ir_version = 9
    onnx.save(m, str(p))
    info = load_model_info(p)
    assert device_problems(info.opsets, info.node_domains, info.ir_version) == []
    with Detector.from_file(p, threads=1) as det:
        assert len(det.detect([gray()])[0].boxes) == 1


def test_edge_bundle_refuses_ir_10(tmp_path):
    from edge.bundle import BundleOptions, check_options

    p = const_model(tmp_path / "ir10.onnx", head(P5_ROWS, 8), meta={"names": N3}, ir_version=10)
    with pytest.raises(InvalidInputError, match="IR version 10"):
        check_options(BundleOptions(out_dir=tmp_path / "dist", model=p))


def test_opset_18_advice_is_to_re_export_not_version_converter(tmp_path):
    p = const_model(tmp_path / "o18.onnx", head(P5_ROWS, 8), meta={"names": N3}, opset=18, ir_version=9)
    info = load_model_info(p)
    (problem,) = device_problems(info.opsets, info.node_domains, info.ir_version)
    assert "re-export the model with opset <= 17" in problem and "version_converter" not in problem
    assert "lower it" not in problem  # IR 9 is fine


# -- 4. outputs that are not a YOLOv5 head ---------------------------------------------------
def test_row_count_formula_matches_yolov5():
    assert yolov5_rows(640, 640) == (25200, 25500) and yolov5_rows(S, S)[0] == P5_ROWS


@pytest.mark.parametrize("name,const,meta,match", [
    ("nms_nonames", np.zeros((1, 100, 6), np.float32), {}, "100 rows is not a YOLOv5 head"),
    ("v8_nonames", np.zeros((1, 7, GRID_CELLS), np.float32), {}, "YOLOv8 anchor-free output is not supported"),
    ("v8_names", np.zeros((1, 7, GRID_CELLS), np.float32), {"names": N3}, "YOLOv8 anchor-free output"),
    ("v8t_nonames", np.zeros((1, GRID_CELLS, 7), np.float32), {}, "YOLOv8 anchor-free output is not supported"),
    ("v8t_names", np.zeros((1, GRID_CELLS, 7), np.float32), {"names": N3}, "YOLOv8 anchor-free output"),
])
def test_non_yolov5_heads_are_refused_at_load(tmp_path, name, const, meta, match):
    p = const_model(tmp_path / f"{name}.onnx", const, meta=meta)
    with pytest.raises(ModelError, match=match) as e:
        load_model_info(p)
    assert f"{name}.onnx" in one_line(e)


def test_real_yolov5_heads_without_names_still_load(tmp_path, tiny_model):
    assert load_model_info(const_model(tmp_path / "p5.onnx", head(P5_ROWS, 8))).names == ("0", "1", "2")
    p6_rows = yolov5_rows(S, S)[1]
    assert load_model_info(const_model(tmp_path / "p6.onnx", head(p6_rows, 8))).nc == 3
    assert load_model_info(fake_yolo(tmp_path / "fake.onnx", imgsz=64, nc=2)).nc == 2
    with Detector.from_file(tiny_model, threads=1) as det:
        det.detect([gray(), gray(90, 200)])


def test_nms_output_with_symbolic_rows_and_no_names_fails_first_inference(tmp_path):
    nms = np.zeros((1, 100, 6), np.float32)
    nms[0, 0] = [20, 20, 40, 40, 0.9, 0]
    p = const_model(tmp_path / "nms_sym.onnx", nms, out_shape=("batch", "n", 6))
    with Detector.from_file(p, threads=1) as det, pytest.raises(ModelError, match="100 rows is not a YOLOv5"):
        det.detect([gray()])


def test_logits_fail_first_inference(tmp_path):
    const = head(P5_ROWS, 8)
    const[0, 0, 4:] = [4.0, -3.0, -3.0, 5.0]
    p = const_model(tmp_path / "logits.onnx", const, meta={"names": N3})
    with Detector.from_file(p, threads=1) as det, pytest.raises(ModelError) as e:
        det.detect([gray()])
    assert "logits.onnx" in one_line(e) and "not sigmoid probabilities" in str(e.value)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_output_with_nan_or_inf_fails_first_inference(tmp_path, bad):
    """Broken weights or a float16 overflow: NaN boxes went into the records (invalid JSON),
    region payloads (a traceback) and the spool; an all-NaN head silently detected nothing."""
    const = head(P5_ROWS, 8)
    const[0, 0, 0] = bad
    p = const_model(tmp_path / "nan.onnx", const, meta={"names": N3})
    with Detector.from_file(p, threads=1) as det, pytest.raises(ModelError) as e:
        det.detect([gray()])
    assert "nan.onnx" in one_line(e) and "holds 1 NaN or infinite values (of 2016)" in str(e.value)
    assert "first inference: the model's output holds 1 NaN" in (first_frame_problem(load_model_info(p)) or "")


def test_an_integer_output_is_refused_at_load(tmp_path):
    """Scores cast to integers are 0: the model loaded, ran and never detected anything."""
    p = const_model(tmp_path / "int.onnx", head(P5_ROWS, 8), meta={"names": N3}, out_type=TensorProto.INT64)
    with pytest.raises(ModelError, match=r"int\.onnx: first output 'output0' has ONNX type 7, not floating-point"):
        load_model_info(p)


def batch_of_one_only(path: Path) -> Path:
    """A model whose batch is symbolic but which a reshape inside fixes at 1 (an export that
    traced batch 1): one frame runs, two do not."""
    const = head(P5_ROWS, 8)
    nodes = [helper.make_node("ReduceMean", ["images"], ["m"], keepdims=1, axes=[1, 2, 3]),
             helper.make_node("Reshape", ["m", "one"], ["m3"]),
             helper.make_node("Mul", ["m3", "zero"], ["z"]),
             helper.make_node("Add", ["z", "C"], ["output0"])]
    inits = [numpy_helper.from_array(np.array([1, 1, 1], np.int64), "one"),
             numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "zero"),
             numpy_helper.from_array(const, "C")]
    graph = helper.make_graph(
        nodes, "batch1", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, S, S])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", P5_ROWS, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    for k, v in {"stride": "32", "names": N3}.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))
    return path


def test_a_batch_dynamic_in_name_only_is_found_before_it_runs(tmp_path):
    """It passed `model info`, `check-config` and the daemon's start; then the edge dropped every
    batch it formed (a traceback each) and the worker ran one image per call, silently."""
    info = load_model_info(batch_of_one_only(tmp_path / "b1.onnx"))
    assert info.dynamic_batch
    assert first_frame_problem(info, 1) is None
    problem = first_frame_problem(info, 4) or ""
    assert problem.startswith("one frame runs but a batch of 4 fails (") and "set model.max_batch to 1" in problem


def test_an_output_with_fewer_images_than_the_batch_is_refused(tmp_path):
    """A constant head answers one image whatever the batch: `check-config` passed it, then the
    daemon's batches failed on 'got 4 letterbox metas for a batch of 1'."""
    p = const_model(tmp_path / "one.onnx", head(P5_ROWS, 8), in_shape=("batch", 3, S, S),
                    out_shape=("batch", P5_ROWS, 8), meta={"names": N3})
    info = load_model_info(p)
    assert first_frame_problem(info, 1) is None
    assert "holds 1 image(s) for an input batch of 4" in (first_frame_problem(info, 4) or "")


@pytest.mark.parametrize("class_id", [2, 0])
def test_nms_output_whose_width_fits_one_class_is_refused_by_its_row_count(tmp_path, class_id):
    """[B,max_det,6] (boxes, score, class id: a YOLOv8/v10 export with nms=True) has 5 + 1 columns.
    With class id 2 the class column failed as a probability at the first frame; with class id 0,
    all a one-class model outputs, it passed and every box decoded to score 0 (found by a probe).
    Its 100 rows are no whole number of anchors per grid cell: refused at load."""
    nms = np.zeros((1, 100, 6), np.float32)
    nms[0, 0] = [20, 20, 40, 40, 0.9, class_id]  # x1, y1, x2, y2, score, class id
    p = const_model(tmp_path / "nms1.onnx", nms, meta={"names": "{0: 'person'}"})
    with pytest.raises(ModelError, match=r"100 rows is no YOLOv5 head's anchors x grid cells at .*an output after NMS"):
        Detector.from_file(p, threads=1)


# -- 6. metadata parser -------------------------------------------------------------------
@pytest.mark.parametrize("text", ["-" * 100000 + "1", "[" * 5000 + "]" * 5000, "9" * 5000])
def test_pathological_names_are_a_model_error(text):
    with pytest.raises(ModelError) as e:
        parse_names(text, "m.onnx (ONNX metadata)")
    assert one_line(e).startswith("m.onnx (ONNX metadata): class names")


@pytest.mark.parametrize("names, said", [
    ("[[1, 2], 'dog', 'car']", "class name 0 is a list, not text"),
    ("[None, 'dog', 'car']", "class name 0 is a NoneType None, not text"),
    ("{0: 'cat', 1: {'k': 'v'}, 2: 'car'}", "class name 1 is a dict, not text"),
    ("['cat', '', 'car']", "class name 1 '' must be 1..256 characters, not blank, without control"),
    ("['cat', 'do\\ng', 'car']", "class name 1 'do\\ng' must be 1..256 characters, not blank, without control"),
    ("['cat', 'cat', 'car']", "class names repeat ('cat'): the edge and the cloud model's classes are matched by name"),
    ("[True, 'dog', 'car']", "class name 0 is a bool True, not text (YAML reads yes/no/on/off/true/false unquoted as a boolean"),
    ("{0.5: 'cat', 1: 'dog', 2: 'car'}", "class names dict keys must be integers 0..nc-1"),
])
def test_class_names_are_unique_printable_text(names, said):
    """Anything was turned into text: a list or a null became a class name, a YAML alias bomb in
    a sidecar one of hundreds of MB; repeated names made the name-matched merge ambiguous."""
    with pytest.raises(ModelError) as e:
        parse_names(names, "m.onnx (ONNX metadata)")
    assert one_line(e).startswith("m.onnx (ONNX metadata): ") and said in str(e.value)
    assert parse_names("{0: 'traffic light', 1: 7, 2: '自行车'}", "m") == ("traffic light", "7", "自行车")
    # what real names hold: a non-breaking space, a CJK space, a zero-width non-joiner (Persian)
    assert parse_names(["traffic\u00a0light", "a\u3000b", "\u0645\u06cc\u200c\u0634\u0648\u062f"], "m")[0] == \
        "traffic\u00a0light"


def test_a_yaml_alias_bomb_in_a_sidecar_is_refused_without_expanding_it(tmp_path):
    p = const_model(tmp_path / "m.onnx", head(P5_ROWS, 8), meta={})
    bomb = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    bomb += [f"{c}: &{c} [{', '.join(['*' + prev] * 9)}]" for prev, c in zip("abcdefgh", "bcdefghi")]
    (tmp_path / "m.yaml").write_text("\n".join(bomb) + "\nnames: [*i, dog, car]\n")
    with pytest.raises(ModelError, match=r"m\.yaml: class name 0 is a list, not text"):
        load_model_info(p)


def test_a_sidecar_with_a_5000_digit_number_is_a_model_error(tmp_path):
    """Python 3.11 refuses to read ints of more than 4300 digits with a ValueError: a traceback."""
    p = const_model(tmp_path / "m.onnx", head(P5_ROWS, 8), meta={})
    (tmp_path / "m.yaml").write_text("stride: " + "9" * 5000 + "\nnames: [cat, dog, car]\n")
    with pytest.raises(ModelError, match=r"m\.yaml: cannot read sidecar YAML"):
        load_model_info(p)


def test_latin1_sidecar_is_a_model_error(tmp_path):
    p = const_model(tmp_path / "m.onnx", head(P5_ROWS, 8), meta={})
    (tmp_path / "m.yaml").write_bytes(b"names: [caf\xe9, dog, car]\n")
    with pytest.raises(ModelError) as e:
        load_model_info(p)
    assert "m.yaml" in one_line(e) and "UTF-8" in str(e.value)


def test_unrelated_model_yaml_does_not_break_a_complete_model(tmp_path):
    p = const_model(tmp_path / "yolo.onnx", head(P5_ROWS, 8), meta={"names": N3})
    (tmp_path / "model.yaml").write_text("- a\n- b\n")
    assert load_model_info(p).names == ("cat", "dog", "car")
    # ... but it is an error, naming it, when the model needs it (no names in the metadata)
    q = const_model(tmp_path / "nonames.onnx", head(P5_ROWS, 8), meta={})
    with pytest.raises(ModelError) as e:
        load_model_info(q)
    assert "model.yaml" in one_line(e) and "must be a mapping" in str(e.value)


# -- 10. stride metadata ------------------------------------------------------------------
@pytest.mark.parametrize("stride", ["True", "32.9", "[8, 16, 32.5]", "'abc'"])
def test_non_integer_stride_is_refused(tmp_path, stride):
    p = const_model(tmp_path / "s.onnx", head(P5_ROWS, 8), meta={"names": N3, "stride": stride})
    with pytest.raises(ModelError, match="stride must be an integer") as e:
        load_model_info(p)
    assert "s.onnx" in one_line(e)


@pytest.mark.parametrize("stride,want", [("32", 32), ("32.0", 32), ("'32'", 32), ("[8, 16, 32]", 32), ("64", 64)])
def test_integer_strides_load(tmp_path, stride, want):
    p = const_model(tmp_path / "s.onnx", head(P5_ROWS, 8), meta={"names": N3, "stride": stride})
    assert load_model_info(p).stride == want


# -- YOLOv8's transposed layout in a dynamic export (its shape is symbolic until the run) --
def test_dynamic_yolov8_transposed_output_is_named_at_first_inference(tmp_path):
    # [B,4+nc,N]: 4 + 3 names = 7 rows, one column per grid cell; YOLOv8 export(dynamic=True)
    const = np.zeros((1, 7, GRID_CELLS), np.float32)
    p = const_model(tmp_path / "v8dyn.onnx", const, in_shape=("batch", 3, "height", "width"),
                    out_shape=("batch", "c", "anchors"), meta={"names": N3, "imgsz": f"[{S}, {S}]"})
    load_model_info(p)  # nothing static to tell it by
    with Detector.from_file(p, threads=1) as det, pytest.raises(ModelError) as e:
        det.detect([gray()])
    msg = one_line(e)
    assert "v8dyn.onnx" in msg and "[1, 7, 84]" in msg
    assert "YOLOv8's transposed [B,4+nc,N] layout" in msg and "export YOLOv5" in msg
    assert "fix the names metadata" not in msg  # the names are right: the model is not a YOLOv5


def test_a_head_with_normalized_boxes_is_refused_at_its_first_frame(tmp_path):
    """An export whose boxes are in [0, 1] (normalized) passed every check and its boxes came back
    as specks at the top-left corner with their scores (found by a probe)."""
    a = np.zeros((1, P5_ROWS, 8), np.float32)
    a[0, :, :4] = [0.5, 0.5, 0.2, 0.2]
    a[0, 0, 4:] = [0.9, 0.9, 0.1, 0.1]
    p = const_model(tmp_path / "normalized.onnx", a, meta={"names": N3})
    with Detector.from_file(p, threads=1) as det, pytest.raises(
            ModelError, match=r"every box centre .* is within 0.50 of 0 at a 64x64 input: boxes in normalized"):
        det.detect([gray()])


def test_a_fixed_size_yolov5_with_more_classes_than_rows_loads_and_detects(tmp_path):
    """A YOLOv5 head at a small fixed input with many classes (365 at 64x64: [1,252,370], the rows
    exactly YOLOv5's, the columns 5 + the names) has more columns than rows, and was refused at
    load as YOLOv8's transposed layout; ``edgewise model build --imgsz 64 --classes 365`` made one
    that ``model info`` refused (found by a probe)."""
    nc = 365
    a = np.zeros((1, P5_ROWS, 5 + nc), np.float32)
    a[0, 0, :5] = [S / 2, S / 2, 10, 10, 0.9]
    a[0, 0, 5 + nc - 1] = 0.9
    names = repr({i: f"k{i}" for i in range(nc)})
    p = const_model(tmp_path / "many.onnx", a, meta={"names": names})
    assert load_model_info(p).nc == nc
    with Detector.from_file(p, threads=1) as det:
        d = det.detect([gray(S, S)])[0]
    assert d.class_ids.tolist() == [nc - 1] and np.allclose(d.boxes, [[27, 27, 37, 37]])
    # a YOLOv8 output with as many classes is still refused: its rows are 4 + nc, not YOLOv5's count
    v8 = const_model(tmp_path / "v8.onnx", np.zeros((1, GRID_CELLS, 4 + nc), np.float32).transpose(0, 2, 1),
                     meta={"names": names})
    with pytest.raises(ModelError):
        load_model_info(v8)


@pytest.mark.parametrize("out_shape", [None, (1, "c", "n")])
def test_a_transposed_yolov5_head_is_named_as_one(tmp_path, out_shape):
    """``[B,5+nc,N]`` was refused as YOLOv8's layout ("export YOLOv5") when its shape is fixed, and,
    symbolic, with "fix the names metadata" (the names were right) (found by a probe)."""
    const = head(P5_ROWS, 8).transpose(0, 2, 1).copy()
    p = const_model(tmp_path / "t.onnx", const, out_shape=out_shape, meta={"names": N3})
    with pytest.raises(ModelError) as e:
        with Detector.from_file(p, threads=1) as det:
            det.detect([gray()])
    msg = one_line(e)
    assert "t.onnx" in msg and "YOLOv5 head transposed ([B,5+nc,N])" in msg and "[B,N,5+nc]" in msg
    assert "fix the names metadata" not in msg and "YOLOv8" not in msg


def test_an_input_with_one_fixed_side_runs_at_that_side(tmp_path):
    """``[1,3,48,'width']``: the size was assumed 640x640 (or taken from imgsz) whatever the fixed
    height, and ONNX Runtime refused the first frame ("Got: 640 Expected: 48"): the edge daemon died
    with a traceback (found by a probe). The fixed side is the graph's; a size asked for that
    differs is refused at load, and so is 'native' (each image its own height)."""
    h, w = 32, 64
    rows = yolov5_rows(h, w)[0]
    a = np.zeros((1, rows, 8), np.float32)
    a[0, 0, :5] = [w / 2, h / 2, 10, 10, 0.9]
    a[0, 0, 5:] = 0.9
    p = const_model(tmp_path / "h32.onnx", a, in_shape=(1, 3, h, "width"), out_shape=(1, "n", 8),
                    meta={"names": N3, "imgsz": f"[{h}, {w}]"})
    assert load_model_info(p).imgsz == (h, w)
    assumed = const_model(tmp_path / "assumed.onnx", a, in_shape=(1, 3, h, "width"), out_shape=(1, "n", 8),
                          meta={"names": N3})
    info = load_model_info(assumed)
    assert (info.imgsz, info.imgsz_source) == ((h, 640), "default")  # still warned about: the width is a guess
    with Detector.from_file(p, threads=1, imgsz=(h, w)) as det:
        d = det.detect([gray(h * 2, w * 2)])[0]
    assert np.allclose(d.boxes, [[54, 22, 74, 42]])  # the middle of the 64x128 frame, 20x20
    with pytest.raises(ModelError, match=r"input size 64x64 was asked for but input 'images' \[1,3,32,\?\] has its "
                                         r"height fixed at 32; give a size with that height") as e:
        load_model_info(p, 64)
    assert "h32.onnx" in one_line(e)
    stated = const_model(tmp_path / "stated.onnx", a, in_shape=(1, 3, h, "width"), meta={"names": N3, "imgsz": "64"})
    with pytest.raises(ModelError, match=r"input size 64x64 is stated \(onnx-metadata\) but input"):
        load_model_info(stated)
    with pytest.raises(ConfigError, match="has one side fixed"):
        Detector.from_file(p, threads=1, input_size="native")


@pytest.mark.parametrize("which", ["input", "output"])
def test_a_tensor_without_a_declared_shape_is_named_as_such(tmp_path, which):
    """A graph input or output may declare no shape (an edited graph): it was refused as of
    "rank 0 ()", which it is not (found by a probe)."""
    p = const_model(tmp_path / "noshape.onnx", head(P5_ROWS, 8), meta={"names": N3})
    m = onnx.load(str(p))
    getattr(m.graph, which)[0].type.tensor_type.ClearField("shape")
    onnx.save(m, str(p))
    with pytest.raises(ModelError, match="declares no shape") as e:
        load_model_info(p)
    assert "noshape.onnx" in one_line(e) and "has rank 0" not in one_line(e)
    if which == "output":  # what the message advises loads and runs
        onnx.save(onnx.shape_inference.infer_shapes(onnx.load(str(p))), str(p))
        with Detector.from_file(p, threads=1) as det:
            assert det.detect([gray()])[0].class_ids.tolist() == [0]


def test_a_uint8_image_input_is_named_and_the_fix_given(tmp_path):
    """Exports for other runtimes take uint8 pixels: the refusal said "has ONNX type 2" (found by a probe)."""
    p = const_model(tmp_path / "u8.onnx", head(P5_ROWS, 8), meta={"names": N3})
    m = onnx.load(str(p))
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.UINT8
    onnx.save(m, str(p))
    with pytest.raises(ModelError, match=r"u8\.onnx: expected a float32/float16 image input, 'images' is uint8; "
                                         r"export the model with a float input taking RGB in 0\.\.1"):
        load_model_info(p)


def test_auto_input_size_of_a_model_with_one_fixed_side_that_asks_for_native_is_model(tmp_path):
    """'auto' is 'native' for a model whose metadata asks for it and whose height and width are
    both symbolic; with one side fixed it picked 'native' all the same, which the detector then
    refused ("has one side fixed ... (use 'model')"): 'auto', the cloud worker's default, failed
    to load a model 'model' runs (review)."""
    from edgewise.runtime.detector import NATIVE_KEY

    h, w = 32, 64
    a = np.zeros((1, yolov5_rows(h, w)[0], 8), np.float32)
    a[0, 0, :5] = [w / 2, h / 2, 10, 10, 0.9]
    a[0, 0, 5:] = 0.9
    p = const_model(tmp_path / "h32n.onnx", a, in_shape=(1, 3, h, "width"), out_shape=(1, "n", 8),
                    meta={"names": N3, "imgsz": f"[{h}, {w}]", NATIVE_KEY: "native"})
    with Detector.from_file(p, threads=1, input_size="auto") as det:
        assert det.input_size == "model"
        assert det.detect([gray(h, w)])[0].class_ids.tolist() == [0]


@pytest.mark.parametrize("op, domain", [("NonMaxSuppression", ""), ("EfficientNMS_TRT", "")])
def test_an_end_to_end_export_with_nms_built_in_is_named_as_such(tmp_path, op, domain):
    """An end-to-end export (YOLOv7 --end2end: ONNX's NonMaxSuppression, or TensorRT's EfficientNMS
    plugin, with outputs num_dets, boxes, scores, classes) was refused as "first output has rank
    2", which told the user nothing of what to export instead (found by a probe)."""
    p = const_model(tmp_path / "end2end.onnx", head(P5_ROWS, 8), meta={"names": N3})
    m = onnx.load(str(p))
    m.graph.node.append(onnx.helper.make_node(op, ["boxes", "scores"], ["selected"], domain=domain))
    onnx.save(m, str(p))
    with pytest.raises(ModelError) as e:
        load_model_info(p)
    said = one_line(e)
    assert f"end2end.onnx: the graph runs its own non-maximum suppression ({op})" in said, said
    assert "export without NMS" in said and "rank" not in said


@pytest.mark.parametrize("meta", [{}, {"names": N3}])
def test_a_segmentation_export_is_named_as_such(tmp_path, meta):
    """A YOLOv5-seg export (output0 [1,N,5+nc+32] with 32 mask coefficients, output1 [1,32,H/4,W/4]
    the mask prototypes) without names loaded as a detector of nc+32 classes (112 for COCO: the mask
    coefficients read as class scores; found by a probe), and with names was refused as a head
    whose columns do not match. Now it is named a segmentation export, with what to export instead."""
    p = const_model(tmp_path / "seg.onnx", head(P5_ROWS, 8 + 32), meta=meta)
    m = onnx.load(str(p))
    m.graph.node.append(onnx.helper.make_node("Identity", ["C"], ["output1"]))
    m.graph.output.append(onnx.helper.make_tensor_value_info("output1", TensorProto.FLOAT, [1, 32, S // 4, S // 4]))
    onnx.save(m, str(p))
    with pytest.raises(ModelError) as e:
        load_model_info(p)
    said = one_line(e)
    assert "seg.onnx: output 'output1' [1,32,16,16] holds mask prototypes: this is a segmentation export" in said, said
    assert "export the detection weights" in said
