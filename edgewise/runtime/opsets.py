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

from typing import Iterable, List, Mapping

#: the device's runtimes, as the messages name them
DEVICE_RUNTIMES = "JetPack 5.1's TensorRT 8.5 and the bundle's ONNX Runtime 1.16.3"
#: domain -> newest opset both device runtimes load ("" is the default domain, ai.onnx)
DEVICE_OPSETS: Mapping[str, int] = {"": 17, "ai.onnx.ml": 3}


def _domain(name: str) -> str:
    return "" if name in ("", "ai.onnx") else name


def unused_domains(opsets: Mapping[str, int], node_domains: Iterable[str]) -> List[str]:
    """Imported domains no node uses (never the default one), sorted."""
    used = {_domain(d) for d in node_domains}
    return sorted(d for d in opsets if _domain(d) and _domain(d) not in used)


def device_problems(opsets: Mapping[str, int], node_domains: Iterable[str]) -> List[str]:
    """One line per import a JetPack 5.1 device cannot load, saying what to do; [] when none."""
    used = {_domain(d) for d in node_domains}
    out = []
    for name, version in sorted(opsets.items()):
        limit = DEVICE_OPSETS.get(_domain(name))
        if limit is None or version <= limit:
            continue
        label = name or "ai.onnx"
        if _domain(name) in used:
            fix = (f"re-export the model at opset {limit} (or convert it: onnx.version_converter)"
                   if not _domain(name) else f"its nodes need {label} opset {version}; a device cannot run them")
        else:
            fix = "no node uses it: re-quantize with `edgewise model quantize`, which drops unused imports"
        out.append(f"imports {label} opset {version}, newer than {DEVICE_RUNTIMES} load ({limit}); {fix}")
    return out
