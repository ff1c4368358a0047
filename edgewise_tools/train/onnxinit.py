"""Start training from an ONNX file this project exported (``--init model.onnx``).

The export (:mod:`edgewise_tools.models.export`) folds every BatchNorm into its
convolution, so a shipped ``models/*.onnx`` holds, per ``Conv`` block, one fused
weight ``W`` and bias ``b``: ``y = W x + b``. This module copies them back into a
trainable :class:`~edgewise_tools.models.yolov5.YOLOv5` and *unfuses* each block
with BatchNorm statistics measured on real images, so that the network computes
the same function in eval mode and nearly the same in train mode:

* the conv keeps ``W`` (no bias); on calibration images each output channel of
  ``W x`` has mean ``mu`` and variance ``var``;
* BatchNorm gets ``running_mean = mu``, ``running_var = var``, ``weight =
  sqrt(var + eps)``, ``bias = b + mu``, so ``BN(W x) = (W x - mu) + b + mu = W x + b``
  exactly, and a training batch like the calibration images is normalised by
  statistics close to ``mu``/``var``, i.e. the fine-tuning starts where the shipped
  model is instead of from a function that batch statistics have scrambled.

Without calibration images the BatchNorm is the identity (``mu = 0``, ``var = 1 -
eps``): exact in eval mode only. The ONNX weights carry the PyTorch parameter names
(``model.0.conv.weight``, ``model.24.m.0.weight``), so tensors are matched by name
and shape (each bias through its Conv node); a mismatch (another architecture or class count) is a
``ConfigError`` naming the tensor.

``python -m edgewise_tools.train.onnxinit SRC DST`` (``export_native``) exports such a file
again with a symbolic height/width, so that a fixed-size shipped model runs at each image's
native size (how the README's camera-world measurement ran the episodes pair's cloud model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from edgewise.errors import ConfigError
from edgewise_tools.models.yolov5 import Conv, YOLOv5


def onnx_weights(path: Path) -> Dict[str, np.ndarray]:
    """The weight and bias of every Conv node of an ONNX file, by the weight's name:
    ``{"model.0.conv.weight": W, "model.0.conv.bias": b, ...}``. Biases are found through
    the node, not by name: the exporter shares one initialiser between equal tensors (the
    all-zero biases of an untrained model), so a bias may carry another conv's name."""
    import onnx
    from onnx import numpy_helper

    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise ConfigError(f"--init {path}: not a readable ONNX file ({type(exc).__name__}: {exc})") from None
    inits = {t.name: t for t in proto.graph.initializer}
    alias = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "Identity" and n.input}

    def tensor(name: str) -> Optional[np.ndarray]:
        for _ in range(len(alias) + 1):  # follow Identity chains to the initialiser
            if name in inits:
                return np.array(numpy_helper.to_array(inits[name]), np.float32)
            if name not in alias:
                return None
            name = alias[name]
        return None

    out: Dict[str, np.ndarray] = {}
    for node in proto.graph.node:
        if node.op_type != "Conv" or len(node.input) < 2:
            continue
        name = node.input[1]
        w = tensor(name)
        if w is None:
            continue
        out[name] = w
        b = tensor(node.input[2]) if len(node.input) > 2 else None
        if b is not None and name.endswith("weight"):
            out[name[:-len("weight")] + "bias"] = b
    return out


def _conv_blocks(model: YOLOv5) -> Dict[str, Conv]:
    return {name: m for name, m in model.named_modules() if isinstance(m, Conv)}


def load_onnx(model: YOLOv5, path: Path, images: Optional[np.ndarray] = None, batch: int = 16) -> int:
    """Copy the fused weights of ``path`` into ``model`` and unfuse them (see module doc).

    ``images`` [N,3,H,W] float32 (the trainer's input format) calibrate the BatchNorm
    statistics. Returns how many ONNX tensors were used; the model is left in train mode.
    """
    weights = onnx_weights(Path(path))
    blocks = _conv_blocks(model)
    used = 0

    def take(name: str, like: torch.Tensor) -> torch.Tensor:
        if name not in weights:
            raise ConfigError(f"--init {path}: no tensor {name!r}; not an edgewise export of this architecture")
        arr = weights[name]
        if tuple(arr.shape) != tuple(like.shape):
            raise ConfigError(f"--init {path}: tensor {name!r} has shape {list(arr.shape)}, the model "
                              f"expects {list(like.shape)} (another architecture or class count)")
        return torch.from_numpy(arr)

    with torch.no_grad():
        for name, blk in blocks.items():
            bn = blk.bn
            if bn is None:
                raise ConfigError("the model to initialise is fused; build a fresh one")
            blk.conv.weight.copy_(take(f"{name}.conv.weight", blk.conv.weight))
            bias = take(f"{name}.conv.bias", bn.bias)
            bn.weight.fill_(1.0)
            bn.bias.copy_(bias)
            bn.running_mean.zero_()  # type: ignore[union-attr]
            bn.running_var.fill_(1.0 - bn.eps)  # type: ignore[union-attr]
            used += 2
        for i, conv in enumerate(model.detect.m):
            assert isinstance(conv, nn.Conv2d) and conv.bias is not None
            conv.weight.copy_(take(f"model.{len(model.model) - 1}.m.{i}.weight", conv.weight))
            conv.bias.copy_(take(f"model.{len(model.model) - 1}.m.{i}.bias", conv.bias))
            used += 2
    if images is not None and len(images):
        _calibrate(model, blocks, images, batch)
    model.train()
    return used


@torch.no_grad()
def _calibrate(model: YOLOv5, blocks: Dict[str, Conv], images: np.ndarray, batch: int) -> None:
    """Per-channel mean/variance of each conv's output on ``images``, then the unfused BN."""
    sums: Dict[str, torch.Tensor] = {}
    sqs: Dict[str, torch.Tensor] = {}
    counts: Dict[str, int] = {}
    hooks: List[torch.utils.hooks.RemovableHandle] = []

    def hook(name: str):  # type: ignore[no-untyped-def]
        def fn(_m: nn.Module, _inp: object, out: torch.Tensor) -> None:
            x = out.double()
            sums[name] = sums.get(name, 0) + x.sum(dim=(0, 2, 3))
            sqs[name] = sqs.get(name, 0) + (x * x).sum(dim=(0, 2, 3))
            counts[name] = counts.get(name, 0) + x.shape[0] * x.shape[2] * x.shape[3]
        return fn

    for name, blk in blocks.items():
        hooks.append(blk.conv.register_forward_hook(hook(name)))
    was = model.training
    model.eval()  # identity BatchNorm: the conv outputs are exactly W x
    try:
        device = next(model.parameters()).device
        for s in range(0, len(images), batch):
            model(torch.from_numpy(np.ascontiguousarray(images[s:s + batch], np.float32)).to(device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    for name, blk in blocks.items():
        bn = blk.bn
        assert bn is not None
        n = counts[name]
        mu = sums[name] / n
        var = (sqs[name] / n - mu * mu).clamp_min(0.0)
        bn.running_mean.copy_(mu.float())  # type: ignore[union-attr]
        bn.running_var.copy_(var.float())  # type: ignore[union-attr]
        bn.weight.copy_(torch.sqrt(var + bn.eps).float())
        bn.bias.add_(mu.float())


def export_native(src: Path, dst: Path) -> Path:
    """``src`` (an ONNX file of this project's builder) exported again with a symbolic
    height/width and the metadata ``input_size: native``: the same weights, run by a worker
    or ``edgewise eval`` at each image's own size (whole camera frames, region payloads)."""
    from edgewise.runtime.metadata import load_model_info
    from edgewise_tools.models.yolov5 import build_model

    info = load_model_info(src)
    arch = info.metadata.get("edgewise_arch")
    if not arch:
        raise ConfigError(f"{src}: no edgewise_arch in its ONNX metadata (not an export of this project's builder)")
    model = build_model(arch, nc=info.nc)
    load_onnx(model, src)  # no images: identity BatchNorm, exact in eval mode
    extra = {k: v for k, v in info.metadata.items() if k not in ("names", "stride", "imgsz")}
    return export_model_native(model.eval(), dst, info.imgsz, list(info.names), arch, extra)


def export_model_native(model: Any, dst: Path, imgsz: Any, names: List[str], arch: str, meta: Dict[str, str]) -> Path:
    """Export ``model`` with a symbolic height/width and ``input_size: native`` in its metadata,
    so the runtime runs it at each image's own size."""
    from edgewise.runtime.detector import NATIVE_KEY
    from edgewise_tools.models.export import export_onnx

    return Path(export_onnx(model, dst, imgsz=imgsz, names=names, arch=arch,
                            extra_metadata={**meta, NATIVE_KEY: "native"}, dynamic_hw=True))


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m edgewise_tools.train.onnxinit",
                                description="Export an ONNX file of this project's builder again with a "
                                            "symbolic height/width (input_size: native).")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    args = p.parse_args(argv)
    print(f"wrote {export_native(args.src, args.dst)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
