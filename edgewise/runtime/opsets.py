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
"""

from __future__ import annotations

from typing import Iterable, List, Mapping, Optional

#: the device's runtimes, as the messages name them
DEVICE_RUNTIMES = "JetPack 5.1's TensorRT 8.5 and the bundle's ONNX Runtime 1.16.3"
#: domain -> newest opset both device runtimes load ("" is the default domain, ai.onnx)
DEVICE_OPSETS: Mapping[str, int] = {"": 17, "ai.onnx.ml": 3}
#: newest ONNX IR version ONNX Runtime 1.16.3 loads (its load error: "Unsupported model IR
#: version: 10, max supported IR version: 9"); IR 10 is what onnx >= 1.16 writes
DEVICE_IR_VERSION = 9


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
            fix = "no node uses it: re-quantize with `edgewise model quantize`, which drops unused imports"
        out.append(f"imports {label} opset {version}, newer than {DEVICE_RUNTIMES} load ({limit}); {fix}")
    return out
