"""Model tools: build architecture-exact YOLOv5 ONNX graphs, quantize them, describe them.

``build_onnx`` needs torch (the ``train`` extra) and imports it lazily, so importing
``edgewise_tools.models`` works on the edge (Jetson), where torch is absent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

from edgewise.errors import InvalidInputError
from edgewise.outputs import check_output_file
from edgewise.runtime.metadata import MAX_INPUT_SIDE

#: The newest opsets torch's TorchScript and dynamo exporters write, where the installed torch
#: does not say (``torch.onnx._constants``; these are torch 2.13's)
TORCHSCRIPT_MAX_OPSET = 20
DYNAMO_MAX_OPSET = 23
#: Architectures ``build_onnx`` knows (YOLOv5 v7.0 depth/width multiples).
ARCHITECTURES = ("yolov5n", "yolov5s", "yolov5m", "yolov5l", "yolov5x")
#: The most classes ``build`` takes: more than any detection dataset has (LVIS: 1,203), and the
#: head grows with them (a class adds 3 x (320 + 640 + 1280) weights to a YOLOv5x head).
MAX_CLASSES = 10_000


def build_onnx(
    arch: str,
    imgsz: int = 640,
    nc: int = 80,
    path: Union[str, os.PathLike[str], None] = None,
    names: Optional[Sequence[str]] = None,
    seed: int = 0,
    dynamic_batch: bool = True,
    opset: int = 17,
    style: str = "edgewise",
    dynamic_hw: bool = False,
    dynamo: bool = False,
) -> Path:
    """Build a randomly initialised (seeded) YOLOv5 ``arch`` and export it as ONNX.

    The file is in the Ultralytics export format (see ``edgewise_tools.models.export``,
    which also explains ``style``, ``dynamic_hw`` and ``dynamo``).
    ``path`` defaults to ``./{arch}.onnx``. Returns the path written.
    Raises ``InvalidInputError`` for an unknown architecture, a bad size or class count.
    """
    if arch not in ARCHITECTURES:
        raise InvalidInputError(
            f"--arch {arch!r}: unknown architecture; use one of {', '.join(ARCHITECTURES)}"
        )
    if int(imgsz) < 32 or int(imgsz) % 32 or int(imgsz) > MAX_INPUT_SIDE:
        raise InvalidInputError(
            f"--imgsz {imgsz}: must be a multiple of 32 (the largest stride) in 32..{MAX_INPUT_SIDE} (what every "
            "loader takes)"
        )
    if not 1 <= int(nc) <= MAX_CLASSES:
        raise InvalidInputError(f"--classes {nc}: need 1..{MAX_CLASSES} classes (the head grows with them: "
                                f"{MAX_CLASSES} make a YOLOv5x head of about 270 MB)")
    if names is not None and len(names) != nc:
        raise InvalidInputError(f"--names: {len(names)} names given for {nc} classes")
    if int(opset) < (18 if dynamo else 11):
        raise InvalidInputError(
            f"--opset {opset}: the {'dynamo exporter needs 18' if dynamo else 'YOLOv5 graph needs 11'} or newer"
        )
    out = Path(path) if path is not None else Path(f"{arch}.onnx")
    check_output_file(out, "-o")
    if dynamic_hw and not dynamic_batch:
        raise InvalidInputError("--dynamic makes the batch axis dynamic too (as upstream); drop --static-batch")
    try:
        from edgewise_tools.models.export import export_onnx
        from edgewise_tools.models.yolov5 import build_model
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InvalidInputError(
            f"building a model needs PyTorch ({exc}); install the 'train' extra: pip install 'edgewise[train]'"
        ) from exc
    newest = _newest_opset(dynamo)
    if int(opset) > newest:  # (the dynamo exporter wrote opset 18 for 30, silently)
        raise InvalidInputError(f"--opset {opset}: this torch's {'dynamo' if dynamo else 'TorchScript'} exporter "
                                f"writes at most opset {newest} (JetPack 5.1's TensorRT 8.5 takes up to 17)")
    model = build_model(arch, nc=int(nc), seed=seed)
    return export_onnx(
        model,
        out,
        imgsz=int(imgsz),
        names=names,
        dynamic_batch=dynamic_batch,
        opset=opset,
        arch=arch,
        style=style,
        dynamic_hw=dynamic_hw,
        dynamo=dynamo,
    )


def _newest_opset(dynamo: bool) -> int:
    """The newest opset the installed torch's exporter writes (older releases write fewer)."""
    try:
        from torch.onnx import _constants
    except ImportError:  # pragma: no cover - a torch without the module
        return DYNAMO_MAX_OPSET if dynamo else TORCHSCRIPT_MAX_OPSET
    if dynamo:
        return int(getattr(_constants, "ONNX_MAX_OPSET", DYNAMO_MAX_OPSET))
    return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET",
                       getattr(_constants, "ONNX_MAX_OPSET", TORCHSCRIPT_MAX_OPSET)))


__all__: List[str] = ["ARCHITECTURES", "build_onnx"]
