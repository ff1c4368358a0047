"""ONNX export of a YOLOv5 in the Ultralytics output format (export.py ``export_onnx``).

Input ``images`` [B,3,H,W] float32, output ``output0`` [B,N,5+nc] (xywh in input pixels,
sigmoid applied), opset 17, dynamic batch axis, metadata ``stride``, ``names`` (a Python
dict literal as Ultralytics writes it), ``imgsz`` and ``edgewise_arch``. With
``dynamic_hw`` the height and width are symbolic too (any multiple of 32: a model trained
on crops runs on whole frames or regions at their native scale, the runtime's
``input: native``); ``imgsz`` then records the training size. Uses the
TorchScript exporter (``dynamo=False``): the dynamo exporter needs onnxscript
(``docs/design/edge-runtime.md#onnx-export``). Imports torch; callers import this lazily.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import onnx
import torch

from edgewise_tools.models.yolov5 import YOLOv5

PathLike = Union[str, "os.PathLike[str]"]


def names_dict(names: Optional[Sequence[str]], nc: int) -> Dict[int, str]:
    """Class names as Ultralytics stores them ({0: 'person', ...}); default '0'..'nc-1'."""
    if names is None:
        return {i: str(i) for i in range(nc)}
    names = [str(n) for n in names]
    if len(names) != nc:
        raise ValueError(f"names: {len(names)} names given for {nc} classes")
    return dict(enumerate(names))


def _imgsz(imgsz: Union[int, Sequence[int]]) -> Tuple[int, int]:
    if isinstance(imgsz, int):
        hw = (imgsz, imgsz)
    else:
        vals = [int(v) for v in imgsz]
        if len(vals) != 2:
            raise ValueError(f"imgsz: expected N or (H, W), got {imgsz!r}")
        hw = (vals[0], vals[1])
    if min(hw) < 32 or hw[0] % 32 or hw[1] % 32:
        raise ValueError(
            f"imgsz {hw}: height and width must be positive multiples of 32 (the max stride)"
        )
    return hw


def export_onnx(
    model: YOLOv5,
    path: PathLike,
    imgsz: Union[int, Sequence[int]] = 640,
    names: Optional[Sequence[str]] = None,
    dynamic_batch: bool = True,
    opset: int = 17,
    dynamic_hw: bool = False,
    arch: Optional[str] = None,
    extra_metadata: Optional[Dict[str, str]] = None,
) -> Path:
    """Export ``model`` (left untouched: a fused eval copy is exported) to ``path``; returns it."""
    h, w = _imgsz(imgsz)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    m = copy.deepcopy(model).float().cpu().eval()
    m.fuse()
    m.detect.dynamic = dynamic_hw
    for p in m.parameters():
        p.requires_grad_(False)
    im = torch.zeros(1, 3, h, w)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The grids are constants for a fixed H, W: the tracer's warning about it is expected.
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            # dynamo=False is deliberate (the dynamo exporter needs onnxscript): no deprecation noise.
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            sample = m(im)  # dry run: builds the cached grids
            dynamic_axes: Optional[Dict[str, Dict[int, str]]] = (
                {"images": {0: "batch"}, "output0": {0: "batch"}} if dynamic_batch else None
            )
            if dynamic_hw:
                dynamic_axes = dynamic_axes or {"images": {}, "output0": {}}
                dynamic_axes["images"].update({2: "height", 3: "width"})
                dynamic_axes["output0"][1] = "candidates"
            torch.onnx.export(
                m,
                (im,),
                str(part),
                verbose=False,
                opset_version=opset,
                do_constant_folding=True,
                input_names=["images"],
                output_names=["output0"],
                dynamic_axes=dynamic_axes,
                dynamo=False,
            )
        proto = onnx.load(str(part))
        # State the fixed output dims (N unless dynamic_hw, and 5+nc) in the declared shape.
        dims = proto.graph.output[0].type.tensor_type.shape.dim
        for axis, (d, size) in enumerate(zip(list(dims)[1:], tuple(sample.shape)[1:]), 1):
            if axis == 1 and dynamic_hw:
                continue
            d.ClearField("dim_param")
            d.dim_value = int(size)
        onnx.checker.check_model(proto)
        meta = {
            "stride": str(int(max(m.stride.tolist()))),
            "names": str(names_dict(names, model.nc)),
            "imgsz": str([h, w]),
            "edgewise_arch": arch or model.arch,
        }
        meta.update(extra_metadata or {})
        del proto.metadata_props[:]
        for k, v in meta.items():
            prop = proto.metadata_props.add()
            prop.key, prop.value = k, v
        proto.producer_name = "edgewise"
        onnx.save(proto, str(part))
        os.replace(part, out)  # atomic: readers never see a half-written model
    finally:
        if part.exists():  # the export failed half way
            part.unlink()
    return out
