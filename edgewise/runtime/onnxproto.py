"""The fields of an ONNX model the runtime reads, parsed with protobuf alone (no ``onnx``).

A device needs only a model's inputs, outputs, metadata, operators (type, domain, inputs),
initializer types and the values of quantization zero points (``edgewise.runtime.metadata``),
not the ``onnx`` package: its wheels for Python 3.8 need a newer numpy than JetPack 5.1's and
it would be the only reason to ship it. The ONNX file format is a protobuf ``ModelProto``
(onnx/onnx.proto, <https://github.com/onnx/onnx/blob/main/onnx/onnx.proto>); this module
declares the subset of its messages used here, with the same field numbers, in a private
descriptor pool, and lets protobuf (already on the device for gRPC) parse the file. Fields not
declared here (attributes, ...) are skipped by the parser as unknown fields, so any valid ONNX
file parses. ``tests/edgewise/runtime/test_onnxproto.py`` checks every field
number against the ``onnx`` package's own descriptors.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

#: TensorProto.DataType values used by the runtime
FLOAT = 1
FLOAT16 = 10
#: TensorProto.DataType -> name, for the integer types quantized models carry
INTEGER_TYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 21: "uint4", 22: "int4"}
#: TensorProto.DataLocation.EXTERNAL: the tensor's bytes live in another file
EXTERNAL = 1

_PACKAGE = "edgewise.onnxsubset"
_OPT = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REP = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_STR = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_I32 = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
_I64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_MSG = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES

#: message -> (field, number, label, type, message type) as in onnx.proto (proto2); the enum
#: ``data_location`` is read as the int32 it is on the wire
MESSAGES: Dict[str, List[Tuple[str, int, int, int, str]]] = {
    "StringStringEntryProto": [("key", 1, _OPT, _STR, ""), ("value", 2, _OPT, _STR, "")],
    "TensorShapeProto.Dimension": [("dim_value", 1, _OPT, _I64, ""), ("dim_param", 2, _OPT, _STR, "")],
    "TensorShapeProto": [("dim", 1, _REP, _MSG, "TensorShapeProto.Dimension")],
    "TypeProto.Tensor": [("elem_type", 1, _OPT, _I32, ""), ("shape", 2, _OPT, _MSG, "TensorShapeProto")],
    "TypeProto": [("tensor_type", 1, _OPT, _MSG, "TypeProto.Tensor")],
    "ValueInfoProto": [("name", 1, _OPT, _STR, ""), ("type", 2, _OPT, _MSG, "TypeProto")],
    "NodeProto": [("input", 1, _REP, _STR, ""), ("op_type", 4, _OPT, _STR, ""), ("domain", 7, _OPT, _STR, "")],
    "TensorProto": [
        ("dims", 1, _REP, _I64, ""), ("data_type", 2, _OPT, _I32, ""), ("int32_data", 5, _REP, _I32, ""),
        ("name", 8, _OPT, _STR, ""), ("raw_data", 9, _OPT, _BYTES, ""),
        ("external_data", 13, _REP, _MSG, "StringStringEntryProto"), ("data_location", 14, _OPT, _I32, ""),
    ],
    "GraphProto": [
        ("node", 1, _REP, _MSG, "NodeProto"), ("name", 2, _OPT, _STR, ""),
        ("initializer", 5, _REP, _MSG, "TensorProto"), ("input", 11, _REP, _MSG, "ValueInfoProto"),
        ("output", 12, _REP, _MSG, "ValueInfoProto"),
    ],
    "OperatorSetIdProto": [("domain", 1, _OPT, _STR, ""), ("version", 2, _OPT, _I64, "")],
    "ModelProto": [
        ("ir_version", 1, _OPT, _I64, ""), ("graph", 7, _OPT, _MSG, "GraphProto"),
        ("opset_import", 8, _REP, _MSG, "OperatorSetIdProto"),
        ("metadata_props", 14, _REP, _MSG, "StringStringEntryProto"),
    ],
}


def _build() -> Any:
    # Nested ONNX messages (TypeProto.Tensor) become flat ones here; names never reach the wire.
    fdp = descriptor_pb2.FileDescriptorProto(name="edgewise/onnxsubset.proto", package=_PACKAGE,
                                             syntax="proto2")
    for msg, fields in MESSAGES.items():
        m = fdp.message_type.add(name=msg.replace(".", "_"))
        for name, number, label, ftype, type_name in fields:
            f = m.field.add(name=name, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = f".{_PACKAGE}.{type_name.replace('.', '_')}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ModelProto"))


_MODEL_PROTO = _build()


def parse_model(data: bytes) -> Any:
    """A ``ModelProto`` (subset) from a serialized ONNX model; raises protobuf's
    ``DecodeError`` for bytes that are not one."""
    return _MODEL_PROTO.FromString(data)
