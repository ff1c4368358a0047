"""ModelInfo: metadata from a real built model, sidecar YAML, and every bad model file."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgewise.errors import ModelError
from edgewise.runtime.metadata import (
    imgsz_guess_warning,
    load_model_info,
    names_to_metadata,
    parse_names,
)
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


@pytest.mark.parametrize("value, expected", [("0.45", 0.45), ("0", 0.0), ("1", 1.0)])
def test_stated_score_threshold(tmp_path: Path, value: str, expected: float):
    meta = {**names_meta(["a", "b"]), "edgewise_conf_thres": value}
    assert load_model_info(fake_yolo(tmp_path / "c.onnx", metadata=meta)).conf_thres == expected
    assert load_model_info(fake_yolo(tmp_path / "n.onnx", metadata=names_meta(["a", "b"]))).conf_thres is None


@pytest.mark.parametrize("value", ["high", "1.5", "-0.1", "nan"])
def test_bad_score_threshold_names_the_key_and_file(tmp_path: Path, value: str):
    meta = {**names_meta(["a", "b"]), "edgewise_conf_thres": value}
    with pytest.raises(ModelError, match=r"c\.onnx \(ONNX metadata\): edgewise_conf_thres must be a number in \[0, 1\]"):
        load_model_info(fake_yolo(tmp_path / "c.onnx", metadata=meta))


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


def test_a_batch_of_minus_one_is_dynamic_and_zero_or_huge_ones_are_refused(tmp_path: Path):
    """tf2onnx and paddle2onnx write -1 for "any batch", which ONNX Runtime runs at any batch:
    it was taken as a fixed batch of -1 (a numpy traceback at the first frame); 0 and 4096 were
    tracebacks at the first frame and an allocation of gigabytes."""
    from edgewise.runtime.detector import Detector

    def with_batch(name: str, batch: int) -> Path:
        m = onnx.load(str(fake_yolo(tmp_path / "b.onnx", batch=1)))
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
        if batch == -1:  # and the output's batch and rows, as those exporters write them
            for d in m.graph.output[0].type.tensor_type.shape.dim[:2]:
                d.dim_value = -1
        onnx.save(m, str(tmp_path / name))
        return tmp_path / name

    info = load_model_info(with_batch("any.onnx", -1))
    assert info.dynamic_batch and info.fixed_batch == 0 and info.input_shape[0] is None
    assert info.output_shape[:2] == (None, None)
    with Detector.from_file(info.path, threads=1) as det:
        assert len(det.detect([np.zeros((32, 32, 3), np.uint8)] * 3)) == 3
    for batch in (0, 4096):
        with pytest.raises(ModelError, match=rf"has a fixed batch of {batch} \(allowed: 1..256\)"):
            load_model_info(with_batch(f"b{batch}.onnx", batch))


def _dynamic_hw(path: Path, metadata=None) -> Path:
    """A fake detector whose input height/width are symbolic, as ``export.py --dynamic`` writes."""
    fake_yolo(path, metadata=metadata)
    m = onnx.load(str(path))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for d, name in zip(list(dims)[2:], ("height", "width")):
        d.ClearField("dim_value")
        d.dim_param = name
    onnx.save(m, str(path))
    return path


def test_input_size_precedence(tmp_path: Path):
    fixed = fake_yolo(tmp_path / "fixed.onnx")
    assert load_model_info(fixed).imgsz_source == "graph"
    assert load_model_info(fixed, 32).imgsz == (32, 32)
    with pytest.raises(ModelError, match=r"imgsz 64x64 was asked for but the model's input is fixed at 32x32"):
        load_model_info(fixed, 64)
    bare = _dynamic_hw(tmp_path / "bare.onnx", {"names": "{0: 'a', 1: 'b'}", "stride": "32"})
    guess = load_model_info(bare)
    assert guess.dynamic_hw and guess.imgsz == (640, 640) and guess.imgsz_source == "default"
    assert "does not state its input size" in imgsz_guess_warning(guess)
    given = load_model_info(bare, "480,640")
    assert given.imgsz == (480, 640) and given.imgsz_source == "override"
    stated = _dynamic_hw(tmp_path / "stated.onnx", names_meta(["a", "b"], imgsz=96))
    assert load_model_info(stated).imgsz == (96, 96)
    assert load_model_info(stated).imgsz_source == "onnx-metadata"
    assert load_model_info(stated, 128).imgsz == (128, 128)  # the caller knows best
    with pytest.raises(ModelError, match=r"imgsz 100x100 is not a multiple of the stride 32; use multiples of 32, e.g. 128x128$"):
        load_model_info(bare, 100)
    with pytest.raises(ModelError, match="imgsz must be an int or"):
        load_model_info(bare, "big")


def test_external_data_is_hashed_and_required(tmp_path: Path):
    fake_yolo(tmp_path / "inline.onnx")
    m = onnx.load(str(tmp_path / "inline.onnx"))
    onnx.save_model(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
                    size_threshold=0)
    info = load_model_info(tmp_path / "ext.onnx")
    data = tmp_path / "ext.onnx.data"
    assert info.external_data == (data,)
    assert info.file_bytes == (tmp_path / "ext.onnx").stat().st_size + data.stat().st_size
    blob = bytearray(data.read_bytes())
    blob[0] ^= 1
    data.write_bytes(bytes(blob))
    assert load_model_info(tmp_path / "ext.onnx").sha256 != info.sha256  # new weights, new engine cache key
    data.unlink()
    with pytest.raises(ModelError, match=r"ext.onnx.data, which cannot be read .* keep the external data file"):
        load_model_info(tmp_path / "ext.onnx")


def _external_at(model: Path, location: str) -> None:
    """``model``'s weights declared to be at ``location`` (as a hand-edited file could say)."""
    m = onnx.load(str(model), load_external_data=False)
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
    onnx.save_model(m, str(model))


@pytest.mark.parametrize("location, said", [
    ("../../etc/hostname", "keeps its weights at '../../etc/hostname', outside the model's folder"),
    ("/dev/zero", "keeps its weights at '/dev/zero', outside the model's folder"),
    ("fifo", "which is not a regular file"),
])
def test_external_data_outside_the_models_folder_or_not_a_file_is_refused(tmp_path: Path, location, said):
    """``edge bundle`` copied a location of ``../../etc/hostname`` into the device image; one of
    ``/dev/zero`` or a FIFO was read for ever by every loader."""
    fake_yolo(tmp_path / "inline.onnx")
    m = onnx.load(str(tmp_path / "inline.onnx"))
    onnx.save_model(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, location="ext.onnx.data",
                    size_threshold=0)
    os.mkfifo(tmp_path / "fifo")
    _external_at(tmp_path / "ext.onnx", location)
    with pytest.raises(ModelError, match=re.escape(said)):
        load_model_info(tmp_path / "ext.onnx")


@pytest.mark.parametrize("h, w", [(0, 0), (0, -5), (100_000, 100_000)])
def test_a_fixed_input_size_no_image_can_have_is_refused(tmp_path: Path, h: int, w: int):
    inp = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, h, w])
    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 25200, 15])
    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["x"])], "g", [inp], [out])
    p = tmp_path / "odd.onnx"
    onnx.save(helper.make_model(graph), str(p))
    with pytest.raises(ModelError, match=rf"input size {h}x{w} is not a usable image size \(each side in 1..8192"):
        load_model_info(p)


@pytest.mark.parametrize("value, expected", [
    (640, (640, 640)), ("640", (640, 640)), ("480x640", (480, 640)), ("480, 640", (480, 640)),
    ([480, 640], (480, 640)), ("[480, 640]", (480, 640)), ("'64'", (64, 64)), (64.0, (64, 64)),
    ("(480, 640)", (480, 640)), (" 480 x 640 ", (480, 640)), ((np.int64(480), np.int64(640)), (480, 640)),
])
def test_imgsz_forms_that_are_read(value, expected):
    from edgewise.runtime.metadata import parse_imgsz

    assert parse_imgsz(value, "m.onnx") == expected


@pytest.mark.parametrize("value", ["[64.5, 64]", "64x", "640,", "x", True, [64, 64, 64], "[0, 64]"])
def test_imgsz_forms_that_are_refused_not_misread(value):
    """'[64.5, 64]' was cut to 64, the text "'64'" read as the sides 6 and 4, '64x' taken as 64x64."""
    from edgewise.runtime.metadata import parse_imgsz

    with pytest.raises(ModelError, match=re.escape("m.onnx: imgsz must be an int or [h, w]") + r".*" +
                       re.escape(repr(value))):
        parse_imgsz(value, "m.onnx")


def test_a_class_name_is_the_same_name_whichever_unicode_form_it_was_written_in(tmp_path: Path):
    """An edge model whose names came from macOS file names (decomposed, NFD: 'a' + U+0308) and a
    cloud model whose names were typed (composed, NFC: U+00E4) name 'Fußgänger' alike to the eye,
    but every cloud answer was refused ("class_name 'Fußgänger' is not the edge model's name of
    class_id 0, 'Fußgänger'"). Both load as NFC, so they are one name."""
    import unicodedata

    from edgewise.v1 import detect_pb2
    from edgewise.wire import answer_detections

    nfd, nfc = unicodedata.normalize("NFD", "Fußgänger"), unicodedata.normalize("NFC", "Fußgänger")
    assert nfd != nfc
    edge = load_model_info(fake_yolo(tmp_path / "edge.onnx", nc=2, metadata=names_meta([nfd, "Auto"])))
    cloud = load_model_info(fake_yolo(tmp_path / "cloud.onnx", nc=2, metadata=names_meta([nfc, "Auto"])))
    assert edge.names == cloud.names == (nfc, "Auto")
    answer = [detect_pb2.Detection(x1=1, y1=1, x2=9, y2=9, score=0.9, class_id=0, class_name=cloud.names[0])]
    assert answer_detections(answer, edge.names, (32, 32)).names[0] == nfc


@pytest.mark.parametrize("meta, says", [
    ({"names": "{'٠': 'a', '١': 'b'}"}, r"class names dict keys must be integers 0..nc-1, got \['٠', '١'\]"),
    ({"names": "{0: 'a', '１': 'b'}"}, r"class names dict keys must be integers 0..nc-1, got \[0, '１'\]"),
    ({"names": "{0: 'a', 1: 'b'}", "stride": "['٣٢']"}, r"stride must be an integer like 32, got \"\['٣٢'\]\""),
    ({"names": "{0: 'a', 1: 'b'}", "imgsz": "٣٢x٣٢"}, r"imgsz must be an int or \[h, w\], got '٣٢x٣٢'"),
])
def test_metadata_numbers_are_read_in_ascii_digits_only(tmp_path: Path, meta, says):
    """str.isdigit took any script's digits, so a names key '١' (Arabic-Indic), a full-width '１', a stride
    ['٣٢'] or an imgsz '٣٢x٣٢' in a model's metadata read as 1, 1, 32 and 32x32, though every setting
    refuses such digits (found by a probe). The metadata reader follows the one rule."""
    p = fake_yolo(tmp_path / "m.onnx", nc=2, imgsz=32, metadata=meta)
    with pytest.raises(ModelError, match=says + r".*\(write it in the ASCII digits 0-9\)"):
        load_model_info(p)
    ok = {k: v.translate(str.maketrans("٠١٦٤٣٢１", "0164321")) for k, v in meta.items()}
    info = load_model_info(fake_yolo(tmp_path / "ok.onnx", nc=2, imgsz=32, metadata=ok))
    assert info.names == ("a", "b")  # the same metadata in ASCII digits reads
