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
