"""Which ONNX operator sets a JetPack 5.1 device loads, and what a model imports beyond them.

An ONNX model lists, per operator domain, the opset version its nodes were written for
(``ModelProto.opset_import``). A runtime refuses a model that imports a version newer than
it knows, even for a domain no node uses: ONNX Runtime 1.16.3 (the bundle's CPU backend)
fails to load a model importing ``ai.onnx.ml`` opset 5, which ONNX Runtime's newer
quantizer writes into every model it saves. So the rule, kept here only:

* :data:`DEVICE_OPSETS`: the newest version per domain that *both* of the device's
  runtimes load: TensorRT 8.5's ONNX parser supports the default domain up to opset 17
  (onnx-tensorrt release/8.5-GA, ``docs/operators.md``); ONNX Runtime 1.16.3 loads
  ``ai.onnx.ml`` up to 3 (its own load error says so).
* :func:`device_problems`: what a model imports beyond that, with what to do; the Jetson
  bundle refuses such a model (``edge.bundle``), ``edge model-info`` shows it.
* :func:`unused_domains`: imports no node uses; ``edgewise model quantize`` drops them
  (``edgewise_tools.models.quantize``), which changes nothing a runtime computes.
* :func:`tensorrt_problems`: what TensorRT 8.5's ONNX parser has no importer for, though ONNX
  Runtime runs it: operators outside the ONNX domain, ONNX Runtime's dynamic and QOperator
  quantization, and Q/DQ nodes that are not symmetric int8. TensorRT's explicit quantization
  takes int8 with zero point 0 only (TensorRT developer guide, "Working with INT8", Q/DQ
  layers; onnx-tensorrt's QuantizeLinear/DequantizeLinear importers), and its
  DequantizeLinear does not take int32, which ONNX Runtime's quantizer writes for convolution
  biases unless told not to (``QuantizeBias``). ONNX Runtime's CPU layout (uint8
  activations with zero points, what ``edgewise model quantize --target cpu`` writes) fails
  the engine build on the device.
* :func:`model_problems`: both, for a model the device runs on TensorRT (``model.backend``
  ``auto`` or ``tensorrt``); the Jetson bundle, ``edge model-info``, ``model info`` and
  ``model quantize`` say them, and the TensorRT backend refuses such a model before it builds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, List, Mapping, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from edgewise.runtime.metadata import ModelInfo

#: the device's runtimes, as the messages name them
DEVICE_RUNTIMES = "JetPack 5.1's TensorRT 8.5 and the bundle's ONNX Runtime 1.16.3"
#: domain -> newest opset both device runtimes load ("" is the default domain, ai.onnx)
DEVICE_OPSETS: Mapping[str, int] = {"": 17, "ai.onnx.ml": 3}
#: newest ONNX IR version ONNX Runtime 1.16.3 loads (its load error: "Unsupported model IR
#: version: 10, max supported IR version: 9"); IR 10 is what onnx >= 1.16 writes
DEVICE_IR_VERSION = 9
#: operators of the ONNX domain TensorRT 8.5's parser has no importer for, that quantizers
#: write: ONNX Runtime's dynamic quantization (ConvInteger, MatMulInteger,
#: DynamicQuantizeLinear) and its QOperator format (QLinearConv, QLinearMatMul)
TENSORRT_NO_IMPORTER = frozenset({"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QLinearConv",
                                  "QLinearMatMul"})
#: what to do about a quantized model TensorRT cannot build
TENSORRT_FIX = ("quantize the float model with `edgewise model quantize --target tensorrt` (symmetric int8, "
                "float biases), or run this one on ONNX Runtime (model.backend: onnxruntime, on the CPU)")


def _domain(name: str) -> str:
    return "" if name in ("", "ai.onnx") else name


def unused_domains(opsets: Mapping[str, int], node_domains: Iterable[str]) -> List[str]:
    """Imported domains no node uses (never the default one), sorted."""
    used = {_domain(d) for d in node_domains}
    return sorted(d for d in opsets if _domain(d) and _domain(d) not in used)


def device_problems(
    opsets: Mapping[str, int], node_domains: Iterable[str], ir_version: Optional[int] = None
) -> List[str]:
    """One line per import a JetPack 5.1 device cannot load, saying what to do; [] when none.

    ``ir_version`` (``ModelInfo.ir_version``) is checked too when given: ONNX Runtime 1.16.3
    refuses IR > :data:`DEVICE_IR_VERSION`.
    """
    used = {_domain(d) for d in node_domains}
    out = []
    if ir_version is not None and ir_version > DEVICE_IR_VERSION:
        default = opsets.get("", opsets.get("ai.onnx", 0))
        if default <= DEVICE_OPSETS[""]:
            fix = (f"lower it: m = onnx.load(path); m.ir_version = {DEVICE_IR_VERSION}; onnx.save(m, path) "
                   f"(safe at ai.onnx opset {default}), or export with onnx < 1.16")
        else:
            fix = f"re-export with opset <= {DEVICE_OPSETS['']} and onnx < 1.16 (IR {DEVICE_IR_VERSION})"
        out.append(f"ONNX IR version {ir_version}, newer than the bundle's ONNX Runtime 1.16.3 loads "
                   f"({DEVICE_IR_VERSION}); {fix}")
    for name, version in sorted(opsets.items()):
        limit = DEVICE_OPSETS.get(_domain(name))
        if limit is None or version <= limit:
            continue
        label = name or "ai.onnx"
        if _domain(name) in used:
            # onnx.version_converter has no Resize adapter: it fails on every YOLOv5 graph
            fix = (f"re-export the model with opset <= {limit} (YOLOv5 export.py --opset {limit}; torch.onnx.export "
                   f"opset_version={limit}, dynamo=False)"
                   if not _domain(name) else f"its nodes need {label} opset {version}; a device cannot run them")
        else:
            fix = ("no node uses it: drop the import (`edgewise model quantize` drops unused imports of the models "
                   "it writes; for a float model: m = onnx.load(path); keep = [o for o in m.opset_import if o.domain "
                   f"!= {name!r}]; del m.opset_import[:]; m.opset_import.extend(keep); onnx.save(m, path))")
        out.append(f"imports {label} opset {version}, newer than {DEVICE_RUNTIMES} load ({limit}); {fix}")
    return out


def tensorrt_problems(ops: Iterable[Tuple[str, str]], qdq: Iterable[Tuple[str, str, bool]]) -> List[str]:
    """One line per part of a model TensorRT 8.5 cannot build, saying what to do; [] when none.
    ``ops`` and ``qdq`` are ``ModelInfo.ops`` and ``ModelInfo.qdq``."""
    ops = list(ops)
    out = []
    foreign = sorted(f"{d}:{op}" for d, op in ops if _domain(d))
    if foreign:
        out.append(f"uses operators outside the ONNX domain ({', '.join(foreign[:4])}"
                   f"{', ...' if len(foreign) > 4 else ''}), which TensorRT 8.5 has no importer for; "
                   "re-export the model without them, or run it on ONNX Runtime (model.backend: onnxruntime)")
    unknown = sorted(op for d, op in ops if not _domain(d) and op in TENSORRT_NO_IMPORTER)
    if unknown:
        out.append(f"uses {', '.join(unknown)} (ONNX Runtime's dynamic or QOperator quantization), which "
                   f"TensorRT 8.5 has no importer for; {TENSORRT_FIX}")
    forms = set(qdq)
    types = {t for _, t, _ in forms}
    wrong = [f"{t} (TensorRT takes int8)" for t in sorted(types - {"int8", "int32", "?"})]
    if "int32" in types:
        wrong.append("int32 (quantized biases)")
    if any(t == "int8" and nonzero for _, t, nonzero in forms):
        wrong.append("int8 with zero points other than 0 (asymmetric)")
    if wrong:
        out.append(f"its QuantizeLinear/DequantizeLinear nodes use {', '.join(wrong)}: TensorRT 8.5 builds "
                   f"symmetric int8 only (zero point 0); {TENSORRT_FIX}")
    return out


def model_problems(info: ModelInfo, tensorrt: bool = True) -> List[str]:
    """What keeps a JetPack 5.1 device from running ``info``'s model: the imports both runtimes
    load (:func:`device_problems`) and, where it runs on TensorRT, :func:`tensorrt_problems`."""
    out = device_problems(info.opsets, info.node_domains, info.ir_version)
    if tensorrt:
        out.extend(tensorrt_problems(info.ops, info.qdq))
    return out
