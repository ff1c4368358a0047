"""``describe(model)``: what a YOLOv5 ONNX file is, for ``edgewise model info``.

Validation, class names, stride, input size and precision come from the runtime's
``edgewise.runtime.metadata.load_model_info`` (one parser for the whole project); this
adds what only the model tools need: parameter count, opset, producer, file size,
operator histogram, the quantization layout (how many convolutions run in INT8), and a
check of the graph itself (``check_graph``: the ONNX checker, then ONNX Runtime loading
it, then one grey frame through it: ``edgewise.runtime.firstframe``), since a file can carry valid
YOLOv5 metadata around a graph no runtime accepts, or one whose output the runtime refuses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

PathLike = Union[str, "os.PathLike[str]"]


def count_params(model: Any) -> int:
    """Learned parameters: weights and biases of Conv/ConvTranspose/Gemm/MatMul nodes.

    In a QDQ model a weight reaches its Conv through a DequantizeLinear; its int8
    initializer is counted, so a quantized model counts like its float original (and
    like Ultralytics' fused ``model.info()``).
    """
    inits = {t.name: t for t in model.graph.initializer}
    # Weights reach a Conv through DequantizeLinear (QDQ) or Identity (deduplicated by the exporter).
    alias = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type in ("DequantizeLinear", "Identity")
    }
    total = 0
    for n in model.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv"):
            continue
        if n.op_type == "QLinearConv":  # x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp[, b]
            names = [n.input[3]] + ([n.input[8]] if len(n.input) > 8 else [])
        else:
            names = list(n.input[1:3])
        for name in names:
            # Counted per use: exporters share identical tensors (e.g. the zero biases of
            # a freshly initialised model), the model still has a parameter per use.
            for _ in range(4):
                name = alias.get(name, name)
            t = inits.get(name)
            if t is None:
                continue
            size = 1
            for d in t.dims:
                size *= int(d)
            total += size
    return total


def check_graph(path: Path) -> Optional[str]:
    """None when the ONNX checker passes the graph and ONNX Runtime (CPU) loads it,
    else a one-line reason (e.g. an opset-12 graph with per-channel ``axis`` on Q/DQ)."""
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(path))  # by path: external data and > 2 GB work
    except Exception as e:  # ValidationError, or protobuf errors on a damaged file
        return "ONNX checker: " + " ".join(str(e).split())[:300]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # load, do not tune
    so.log_severity_level = 3
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        return "ONNX Runtime: " + " ".join(str(e).split())[:300]
    return None


def describe(model_path: PathLike, imgsz: Union[int, Sequence[int], None] = None) -> Dict[str, Any]:
    """A JSON-ready description of a YOLOv5 ONNX model.

    ``imgsz``: input size of a model whose graph leaves it dynamic (``load_model_info``).
    ``graph_error`` is None for a valid graph, else why it is broken; ``batch_error`` is None
    unless a dynamic batch of 2 fails while one frame runs (the model is usable at batch 1);
    ``warnings`` lists what the user should know (an assumed input size, that batch failure).
    Raises ``ModelError`` (naming the file) for a missing, corrupt or non-YOLOv5 model.
    """
    import onnx

    from edgewise.runtime.firstframe import first_frame_problems
    from edgewise.runtime.metadata import imgsz_guess_warning, load_model_info
    from edgewise.runtime.opsets import model_problems

    info = load_model_info(Path(model_path), imgsz)
    model = onnx.load(str(info.path), load_external_data=False)
    ops: Dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "QLinearConv", "ConvInteger")]
    # In QDQ form a Conv runs in INT8 when its weight comes out of a DequantizeLinear.
    dq_out = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    int8_convs = sum(
        1 for n in convs if n.op_type != "Conv" or (len(n.input) > 1 and n.input[1] in dq_out)
    )
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    init_names = {t.name for t in model.graph.initializer}
    graph_error, batch_error = check_graph(info.path), None
    if graph_error is None:  # a batch that fails while one frame runs leaves a model usable at batch 1
        graph_error, batch_error = first_frame_problems(
            info, 2, "the batch size where it runs (edge model.max_batch, worker batching.max_batch_size)")
    warnings = [imgsz_guess_warning(info)] if info.imgsz_source == "default" else []
    if batch_error:
        warnings.append(batch_error)
    return {
        "path": str(info.path),
        "file_bytes": info.file_bytes,
        "sha256": info.sha256,
        "precision": info.precision,
        "inputs": [
            {"name": i.name, "shape": _shape(i), "dtype": _dtype(i)}
            for i in model.graph.input
            if i.name not in init_names
        ],
        "outputs": [
            {"name": o.name, "shape": _shape(o), "dtype": _dtype(o)} for o in model.graph.output
        ],
        "classes": list(info.names),
        "nc": info.nc,
        "names_source": info.names_source,
        "stride": info.stride,
        "imgsz": list(info.imgsz),
        "imgsz_source": info.imgsz_source,
        "dynamic_batch": info.dynamic_batch,
        "dynamic_hw": info.dynamic_hw,
        "params": count_params(model),
        "opset": opset,
        "jetpack51": model_problems(info),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "conv_nodes": len(convs),
        "int8_conv_nodes": int8_convs,
        "ops": dict(sorted(ops.items())),
        "metadata": dict(info.metadata),
        "graph_error": graph_error,
        "batch_error": batch_error,
        "warnings": warnings,
    }


def _shape(vi: Any) -> List[Any]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]


def _dtype(vi: Any) -> str:
    from onnx import helper

    try:
        return str(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    except Exception:  # an element type numpy has no name for
        return str(vi.type.tensor_type.elem_type)


def format_description(d: Dict[str, Any]) -> str:
    """Human-readable lines of ``describe``'s result."""
    names = d["classes"]
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    prec = d["precision"]
    if prec == "int8":
        prec += f" ({d['int8_conv_nodes']}/{d['conv_nodes']} convolutions in INT8)"
    batch = "dynamic batch" if d["dynamic_batch"] else "fixed batch"
    if d.get("batch_error"):
        batch = "dynamic batch (in name only: runs one frame at a time)"
    size = f"{d['imgsz'][0]}x{d['imgsz'][1]}"
    if d.get("dynamic_hw"):
        size += {"default": " (assumed: dynamic H/W, size not stated)", "override": " (as given)"}.get(
            d["imgsz_source"], f" (dynamic H/W; from {d['imgsz_source']})"
        )
    lines = [
        f"model      {d['path']} ({d['file_bytes'] / 1e6:.1f} MB, sha256 {d['sha256'][:12]})",
        f"precision  {prec}",
        f"params     {d['params']:,}",
        "input      " + "; ".join(f"{i['name']} {i['shape']} {i['dtype']}" for i in d["inputs"]),
        "output     " + "; ".join(f"{o['name']} {o['shape']} {o['dtype']}" for o in d["outputs"]),
        f"imgsz      {size}, stride {d['stride']}, {batch}",
        f"classes    {d['nc']}: {shown} (from {d['names_source']})",
        f"opset      {d['opset']} ({d['producer'] or 'unknown producer'})",
    ]
    if d["metadata"].get("edgewise_arch"):
        lines.append(f"arch       {d['metadata']['edgewise_arch']}")
    quant = d["metadata"].get("edgewise_quant")
    if quant:
        try:
            q = json.loads(quant)
            lines.append(
                f"quantized  {q.get('method')} calibration on {q.get('frames')} frames "
                f"(target {q.get('target', 'cpu')})"
            )
        except (ValueError, AttributeError, RecursionError):  # hand-edited (or nested past the decoder): raw
            lines.append(f"quantized  {quant}")
    err = d.get("graph_error")
    lines.append(f"graph      {'BROKEN: ' + err if err else 'valid (ONNX checker; ONNX Runtime loads and runs it)'}")
    lines.append("jetson     " + ("; ".join(d["jetpack51"]) if d.get("jetpack51") else
                                  "its opsets and operators load on JetPack 5.1 (TensorRT 8.5, ONNX Runtime 1.16.3)"))
    for w in d.get("warnings", []):
        lines.append(f"warning    {w}")
    return "\n".join(lines)
