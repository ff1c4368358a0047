"""The device's opset rule (``edgewise.runtime.opsets``): pure functions over a model's imports."""

from __future__ import annotations

from edgewise.runtime.opsets import DEVICE_OPSETS, device_problems, unused_domains

#: what the host's ONNX Runtime quantizer (1.32.0) writes into every model it saves
QUANTIZER_IMPORTS = {"": 17, "ai.onnx.ml": 5, "ai.onnx.training": 1, "com.microsoft": 1, "com.microsoft.nchwc": 1}


def test_unused_domains_never_names_the_default_one() -> None:
    assert unused_domains(QUANTIZER_IMPORTS, [""]) == ["ai.onnx.ml", "ai.onnx.training", "com.microsoft",
                                                       "com.microsoft.nchwc"]
    assert unused_domains(QUANTIZER_IMPORTS, ["", "com.microsoft"]) == ["ai.onnx.ml", "ai.onnx.training",
                                                                        "com.microsoft.nchwc"]
    assert unused_domains({"ai.onnx": 13}, []) == []


def test_an_unused_import_newer_than_the_device_says_to_requantize() -> None:
    (line,) = device_problems(QUANTIZER_IMPORTS, [""])
    assert line.startswith("imports ai.onnx.ml opset 5, newer than JetPack 5.1's TensorRT 8.5")
    assert "(3); no node uses it: drop the import (`edgewise model quantize` drops unused imports" in line


def test_a_used_domain_beyond_the_device_cannot_be_dropped() -> None:
    (line,) = device_problems({"": 18}, [""])
    assert "imports ai.onnx opset 18" in line and "(17)" in line and "re-export the model with opset <= 17" in line
    assert "version_converter" not in line  # it has no Resize adapter: it fails on YOLOv5
    (line,) = device_problems({"": 17, "ai.onnx.ml": 4}, ["", "ai.onnx.ml"])
    assert "its nodes need ai.onnx.ml opset 4; a device cannot run them" in line


def test_what_the_device_loads_passes() -> None:
    assert device_problems({"": DEVICE_OPSETS[""]}, [""]) == []
    assert device_problems({"ai.onnx": 12, "ai.onnx.ml": 3, "com.microsoft": 1}, ["", "com.microsoft"]) == []


def test_tensorrt_takes_symmetric_int8_qdq_and_the_onnx_domain_only() -> None:
    """ONNX Runtime's CPU layout (uint8 activations with zero points, int32 biases), asymmetric
    int8, dynamic and QOperator quantization and contrib operators are each named with what to do;
    symmetric int8 Q/DQ (what `--target tensorrt` writes) and plain operators pass."""
    from edgewise.runtime.opsets import tensorrt_problems

    plain = [("", "Conv"), ("", "Sigmoid")]
    assert tensorrt_problems(plain, []) == []
    assert tensorrt_problems(plain + [("", "QuantizeLinear"), ("", "DequantizeLinear")],
                             [("QuantizeLinear", "int8", False), ("DequantizeLinear", "int8", False),
                              ("DequantizeLinear", "?", False)]) == []
    (line,) = tensorrt_problems(plain, [("QuantizeLinear", "uint8", True), ("DequantizeLinear", "int32", False),
                                        ("DequantizeLinear", "int8", False)])
    assert "uint8 (TensorRT takes int8), int32 (quantized biases): TensorRT 8.5 builds symmetric int8 only" in line
    assert "`edgewise model quantize --target tensorrt`" in line and "model.backend: onnxruntime" in line
    (line,) = tensorrt_problems(plain, [("QuantizeLinear", "int8", True)])
    assert "int8 with zero points other than 0 (asymmetric)" in line
    (line,) = tensorrt_problems(plain + [("", "DynamicQuantizeLinear"), ("", "ConvInteger")], [])
    assert line.startswith("uses ConvInteger, DynamicQuantizeLinear (ONNX Runtime's dynamic or QOperator")
    (line,) = tensorrt_problems(plain + [("com.microsoft", "QLinearSigmoid")], [])
    assert "outside the ONNX domain (com.microsoft:QLinearSigmoid)" in line


def test_a_zero_point_from_a_constant_node_is_not_read_as_onnxs_default() -> None:
    """A QuantizeLinear whose zero point comes from a Constant node (torch exports) was read as
    having none, ONNX's default uint8, and a symmetric int8 model refused for TensorRT (found by
    a review). A zero point given but not an initializer is not judged."""
    from types import SimpleNamespace as N

    from edgewise.runtime.metadata import _qdq_forms
    from edgewise.runtime.opsets import tensorrt_problems

    graph = N(initializer=[], node=[N(op_type="Constant", domain="", input=[]),
                                     N(op_type="QuantizeLinear", domain="", input=["x", "s", "zp"]),
                                     N(op_type="DequantizeLinear", domain="", input=["q", "s", "zp"])])
    forms = _qdq_forms(graph)
    assert forms == (("DequantizeLinear", "?", False), ("QuantizeLinear", "?", False))
    assert tensorrt_problems([("", "QuantizeLinear")], forms) == []
    graph.node[1].input = ["x", "s"]  # none given: ONNX's default, uint8
    assert ("QuantizeLinear", "uint8", False) in _qdq_forms(graph)


def test_every_yolov5_head_is_one_and_an_output_after_nms_is_none() -> None:
    """yolov5-p34 (strides 8, 16) and yolov3-tiny (16, 32) were refused as outputs after NMS once
    models with class names were held to a head's row count (found by a review)."""
    from edgewise.runtime.metadata import grid_cells, head_problem

    for strides in ((8, 16), (16, 32), (8, 16, 32), (4, 8, 16, 32), (8, 16, 32, 64), (8, 16, 32, 64, 128)):
        assert head_problem(3 * grid_cells(640, 640, strides), 85, (640, 640), True) == "", strides
    for max_det in (100, 300, 1000):
        assert "an output after NMS" in head_problem(max_det, 6, (640, 640), True)
