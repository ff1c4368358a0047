"""The protobuf-only ONNX reader: its field numbers are onnx.proto's, and it reads real models
as the ``onnx`` package does (``onnx`` is a test tool here, never a device dependency)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from edgewise.runtime import onnxproto

onnx = pytest.importorskip("onnx")


def _onnx_descriptor(name: str):
    msg = onnx
    for part in name.split("."):
        msg = getattr(msg, part)
    return msg.DESCRIPTOR


@pytest.mark.parametrize("message", sorted(onnxproto.MESSAGES))
def test_field_numbers_and_types_are_onnx_protos(message: str) -> None:
    desc = _onnx_descriptor(message)
    for name, number, label, ftype, type_name in onnxproto.MESSAGES[message]:
        field = desc.fields_by_name[name]
        # an enum is a varint on the wire, read here as int32
        their_type = field.TYPE_INT32 if field.type == field.TYPE_ENUM else field.type
        assert (field.number, their_type) == (number, ftype), f"{message}.{name}"
        assert (field.label == field.LABEL_REPEATED) == (label == onnxproto._REP), f"{message}.{name}"
        if type_name:
            assert field.message_type.full_name == f"onnx.{type_name}", f"{message}.{name}"


def test_constants_are_onnx_enums() -> None:
    assert onnxproto.FLOAT == onnx.TensorProto.FLOAT
    assert onnxproto.FLOAT16 == onnx.TensorProto.FLOAT16
    assert onnxproto.EXTERNAL == onnx.TensorProto.EXTERNAL


def test_reads_a_real_model_like_onnx(tiny_model: Path) -> None:
    data = tiny_model.read_bytes()
    ours, theirs = onnxproto.parse_model(data), onnx.load_model_from_string(data)
    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in theirs.graph.node]
    assert {m.key: m.value for m in ours.metadata_props} == {m.key: m.value for m in theirs.metadata_props}
    assert [(t.name, t.data_type, list(t.dims)) for t in ours.graph.initializer] == \
        [(t.name, t.data_type, list(t.dims)) for t in theirs.graph.initializer]
    for a, b in zip(list(ours.graph.input) + list(ours.graph.output),
                    list(theirs.graph.input) + list(theirs.graph.output)):
        assert a.name == b.name and a.type.tensor_type.elem_type == b.type.tensor_type.elem_type
        assert [(d.HasField("dim_value"), d.dim_value, d.dim_param) for d in a.type.tensor_type.shape.dim] == \
            [(d.HasField("dim_value"), d.dim_value, d.dim_param) for d in b.type.tensor_type.shape.dim]


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        onnxproto.parse_model(b"\xff\xff\xff\xff not a model")
