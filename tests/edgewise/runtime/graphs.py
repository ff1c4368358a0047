"""Small hand-built ONNX graphs shaped like YOLOv5 exports, for unit tests.

``fake_yolo`` maps ``images [B,3,S,S]`` to ``[B,N,5+nc]`` with a fixed random
linear layer + sigmoid (xywh scaled to input pixels), so outputs depend on
each image and batch splitting can be checked exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def fake_yolo(
    path: Path,
    imgsz: int = 32,
    nc: int = 2,
    batch: Optional[int] = None,
    metadata: Optional[Dict[str, str]] = None,
    out_cols: Optional[int] = None,
    input_rank: int = 4,
    quant: bool = False,
    seed: int = 0,
) -> Path:
    rng = np.random.default_rng(seed)
    n = 3 * sum((imgsz // s) ** 2 for s in (8, 16, 32))
    cols = out_cols if out_cols is not None else 5 + nc
    pooled = 3 * 4 * 4
    w = rng.normal(0, 2.0, (pooled, n * cols)).astype(np.float32)
    scale = np.ones((cols,), np.float32)
    scale[:4] = imgsz
    b = batch if batch is not None else "batch"
    in_shape = [b, 3, imgsz, imgsz] if input_rank == 4 else [b, 3 * imgsz * imgsz]
    nodes = []
    x = "images"
    if input_rank != 4:
        nodes.append(helper.make_node("Reshape", ["images", "shape4"], ["img4"]))
        x = "img4"
    k = imgsz // 4
    nodes += [
        helper.make_node("AveragePool", [x], ["pool"], kernel_shape=[k, k], strides=[k, k]),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
    ]
    if quant:
        nodes += [
            helper.make_node("QuantizeLinear", ["flat", "qs", "qz"], ["flat_q"]),
            helper.make_node("DequantizeLinear", ["flat_q", "qs", "qz"], ["flat_dq"]),
        ]
    nodes += [
        helper.make_node("MatMul", ["flat_dq" if quant else "flat", "W"], ["lin"]),
        helper.make_node("Sigmoid", ["lin"], ["sig"]),
        helper.make_node("Reshape", ["sig", "shape3"], ["r3"]),
        helper.make_node("Mul", ["r3", "scale"], ["output0"]),
    ]
    inits = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(scale, "scale"),
        numpy_helper.from_array(np.array([-1, n, cols], np.int64), "shape3"),
        numpy_helper.from_array(np.array([-1, 3, imgsz, imgsz], np.int64), "shape4"),
        numpy_helper.from_array(np.array(0.02, np.float32), "qs"),
        numpy_helper.from_array(np.array(0, np.int8), "qz"),
    ]
    used = {i for node in nodes for i in node.input}
    inits = [t for t in inits if t.name in used]
    graph = helper.make_graph(
        nodes,
        "fake_yolo",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [b, n, cols])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    return path


def names_meta(names: Sequence[str], stride: int = 32, imgsz: int = 32) -> Dict[str, str]:
    return {
        "names": repr({i: n for i, n in enumerate(names)}),
        "stride": str(stride),
        "imgsz": f"[{imgsz}, {imgsz}]",
    }
