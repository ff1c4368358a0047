"""ONNX export of a YOLOv5 in the Ultralytics output format (export.py ``export_onnx``).

Input ``images`` [B,3,H,W] float32, output ``output0`` [B,N,5+nc] (xywh in input pixels,
sigmoid applied). The default is edgewise's own form: opset 17, dynamic batch axis,
metadata ``stride``, ``names`` (a Python dict literal as Ultralytics writes it), ``imgsz``
and ``edgewise_arch``, through the TorchScript exporter (``dynamo=False``, see
``docs/design/edge-runtime.md#onnx-export``).

The other forms users bring (``docs/models.md``) come from the same code, so the tests
need no download: ``style="yolov5-v7.0"`` writes only what YOLOv5 v7.0 ``export.py``
writes (``stride`` as ``'32'``, ``names`` as a dict literal, no ``imgsz``; output dims as
the exporter inferred them); ``dynamic_hw`` is ``export.py --dynamic`` (axes ``batch``,
``height``, ``width`` and ``anchors``, grids computed in the graph); ``dynamo=True`` is the
torch >= 2.9 default exporter (opset 18, weights in an external ``<file>.data``).
Imports torch; callers import this lazily.
"""

from __future__ import annotations

import copy
import os
import shutil
import warnings
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import onnx
import torch

from edgewise.errors import ModelError
from edgewise.outputs import replace_durably
from edgewise.runtime.metadata import parse_names
from edgewise_tools.models.yolov5 import YOLOv5

PathLike = Union[str, "os.PathLike[str]"]
STYLES = ("edgewise", "yolov5-v7.0")


def names_dict(names: Optional[Sequence[str]], nc: int) -> Dict[int, str]:
    """Class names as Ultralytics stores them ({0: 'person', ...}); default '0'..'nc-1'. Names
    every loader would refuse (repeated, blank, over 256 characters, a line break: the one rule,
    :func:`edgewise.runtime.metadata.parse_names`) are a ModelError here, before the model is
    written, not at its first load."""
    if names is None:
        return {i: str(i) for i in range(nc)}
    checked = parse_names(list(names), "names", fix="give each class a name of its own")
    if len(checked) != nc:
        raise ValueError(f"names: {len(checked)} names given for {nc} classes")
    return dict(enumerate(checked))


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
    arch: Optional[str] = None,
    extra_metadata: Optional[Dict[str, str]] = None,
    style: str = "edgewise",
    dynamic_hw: bool = False,
    dynamo: bool = False,
) -> Path:
    """Export ``model`` (left untouched: a fused eval copy is exported) to ``path``; returns it.

    ``style``, ``dynamic_hw`` and ``dynamo``: see the module docstring (``dynamic_hw``
    implies a dynamic batch, as in upstream).
    """
    if style not in STYLES:
        raise ValueError(f"style {style!r}: use one of {', '.join(STYLES)}")
    h, w = _imgsz(imgsz)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    m = copy.deepcopy(model).float().cpu().eval()
    m.fuse()
    for p in m.parameters():
        p.requires_grad_(False)
    m.detect.dynamic = dynamic_hw
    im = torch.zeros(1, 3, h, w)
    dynamic_axes: Optional[Dict[str, Dict[int, str]]] = None
    if dynamic_hw:  # upstream export.py --dynamic
        dynamic_axes = {
            "images": {0: "batch", 2: "height", 3: "width"},
            "output0": {0: "batch", 1: "anchors"},
        }
    elif dynamic_batch:
        dynamic_axes = {"images": {0: "batch"}, "output0": {0: "batch"}}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The grids are constants for a fixed H, W: the tracer's warning about it is expected.
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            # dynamo=False is deliberate (the dynamo exporter needs onnxscript): no deprecation noise.
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            sample = m(im)  # dry run: builds the cached grids
            if dynamo:
                _export_dynamo(m, im, part, opset, dynamic_axes)
            else:
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
        proto = onnx.load(str(part), load_external_data=False)
        problem = written_opset_problem(proto, opset)
        if problem:
            raise ModelError(problem)
        if style == "edgewise" and not dynamic_hw:
            # Only the batch axis is dynamic: state N and 5+nc in the declared output shape.
            dims = proto.graph.output[0].type.tensor_type.shape.dim
            for d, size in zip(list(dims)[1:], tuple(sample.shape)[1:]):
                d.ClearField("dim_param")
                d.dim_value = int(size)
        stride = int(max(m.stride.tolist()))
        meta = {"stride": str(stride), "names": str(names_dict(names, model.nc))}
        if style == "edgewise":
            meta.update(imgsz=str([h, w]), edgewise_arch=arch or model.arch)
            proto.producer_name = "edgewise"
        meta.update(extra_metadata or {})
        del proto.metadata_props[:]
        for k, v in meta.items():
            prop = proto.metadata_props.add()
            prop.key, prop.value = k, v
        onnx.save(proto, str(part))  # external data (dynamo) stays in place: tensors not loaded
        onnx.checker.check_model(str(part))  # by path: resolves external data next to it
        if dynamo:
            data = part.with_name(part.name + ".data")
            final_data = out.with_name(out.name + ".data")
            _point_external_data(part, data.name, final_data.name)
            replace_durably(data, final_data)
        replace_durably(part, out)  # atomic: readers never see a half-written model, nor an empty one after a power cut
    finally:
        for leftover in (part, part.with_name(part.name + ".data")):
            if leftover.exists():  # the export failed half way
                leftover.unlink()
    return out


def written_opset_problem(proto: onnx.ModelProto, opset: int) -> Optional[str]:
    """Why an exported model is not at the opset asked for, or None: an exporter may write
    another one without a word (torch's dynamo exporter wrote 18 for a newer opset it lacked),
    and the opset decides which runtimes load the model (TensorRT 8.5 on JetPack 5.1: 17)."""
    written = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if written == opset:
        return None
    return (f"torch {torch.__version__}'s exporter wrote opset {written} where --opset {opset} was asked; "
            "ask for that opset, or export with the other exporter (with or without --dynamo)")


def _export_dynamo(
    m: YOLOv5, im: torch.Tensor, part: Path, opset: int, axes: Optional[Dict[str, Dict[int, str]]]
) -> None:
    """torch's dynamo exporter (the default from torch 2.9), weights as external data."""
    from torch.export import Dim

    shapes = None
    if axes is not None:
        shapes = ({k: Dim(v, min=1 if k == 0 else 32) for k, v in axes["images"].items()},)
    prog = torch.onnx.export(
        m,
        (im,),
        None,
        input_names=["images"],
        output_names=["output0"],
        opset_version=opset,
        dynamo=True,
        dynamic_shapes=shapes,
        external_data=True,
        verbose=False,
    )
    assert prog is not None
    prog.save(str(part), external_data=True)
    tmpdir = part.parent / "onnx_export"  # some torch versions drop artefacts here
    if tmpdir.is_dir():
        shutil.rmtree(tmpdir, ignore_errors=True)


def _point_external_data(model_path: Path, old: str, new: str) -> None:
    """Rename the external data file a model refers to (without loading the tensors)."""
    proto = onnx.load(str(model_path), load_external_data=False)
    for t in proto.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    onnx.save(proto, str(model_path))
