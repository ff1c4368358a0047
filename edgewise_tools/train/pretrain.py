"""Backbone pre-training on object crops: ``python -m edgewise_tools.train.pretrain``.

A detector trained from scratch on a small CPU budget spends most of it learning
what the classes look like: on the reference data the class loss stays near its
chance level for the first ~10k images while the box loss is already falling.
Detectors normally start from a backbone pre-trained as a classifier (YOLOv5's
``--weights`` from ImageNet-trained checkpoints); this is that step in miniature,
built only from the *training* split so held-out scores stay held out:

1. every labelled box of the training folder becomes a square crop with context
   (side = box side x U(1.3, 2.1), centre jittered by up to 15% of the box), resized to
   ``crop`` pixels, ``views`` times per object;
2. the YOLOv5 backbone (layers 0-9, through SPPF) + global average pooling + a
   linear layer is trained as a classifier on them (AdamW, cosine LR over the
   time budget, HSV jitter per batch);
3. the backbone weights are saved; ``edgewise train --init FILE`` loads them (the
   neck and the Detect head keep their initialisation).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import cv2
import numpy as np
import torch
from torch import nn

from edgewise.errors import ConfigError
from edgewise.runtime.letterbox import to_chw_rgb
from edgewise.synth.writer import incomplete_problem
from edgewise_tools.models.yolov5 import YOLOv5, build_model
from edgewise_tools.train.data import IMG_EXT, augment_hsv, read_yolo_labels

log = logging.getLogger("edgewise_tools.train")

#: backbone layers of the v7.0 layer table (0..9: Conv ... SPPF)
BACKBONE_LAYERS = 10


def object_crops(root: Path, crop: int, views: int, rng: np.random.Generator,
                 limit: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Crops [N, crop, crop, 3] uint8 (BGR) and class ids [N] from ``root/images`` + ``root/labels``."""
    img_dir = Path(root) / "images"
    if not img_dir.is_dir():
        raise ConfigError(f"{root}: no images/ folder (expected the edgewise synth layout)")
    unfinished = incomplete_problem(Path(root))
    if unfinished:
        raise ConfigError(unfinished)
    files = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in IMG_EXT)[:limit]
    crops: List[np.ndarray] = []
    classes: List[int] = []
    for f in files:
        labels = read_yolo_labels(Path(root) / "labels" / (f.stem + ".txt"))
        if not len(labels):
            continue
        im = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if im is None:
            raise ConfigError(f"{f}: cannot decode image")
        h, w = im.shape[:2]
        padded = cv2.copyMakeBorder(im, h, h, w, w, cv2.BORDER_CONSTANT, value=(114, 114, 114))
        for cls, cx, cy, bw, bh in labels:
            side0 = max(bw * w, bh * h, 2.0)
            for _ in range(views):
                side = side0 * rng.uniform(1.3, 2.1)
                x = cx * w + rng.uniform(-0.15, 0.15) * side0 + w
                y = cy * h + rng.uniform(-0.15, 0.15) * side0 + h
                x0, y0 = max(int(round(x - side / 2)), 0), max(int(round(y - side / 2)), 0)
                s = max(int(round(side)), 2)
                patch = padded[y0:y0 + s, x0:x0 + s]
                crops.append(cv2.resize(patch, (crop, crop), interpolation=cv2.INTER_LINEAR))
                classes.append(int(cls))
    if not crops:
        raise ConfigError(f"{root}: no labelled objects to crop")
    return np.stack(crops), np.array(classes, np.int64)


class BackboneClassifier(nn.Module):
    """The first ``BACKBONE_LAYERS`` layers of a YOLOv5 + global pooling + a linear classifier."""

    def __init__(self, detector: YOLOv5, nc: int) -> None:
        super().__init__()
        self.backbone = nn.Sequential(*list(detector.model.children())[:BACKBONE_LAYERS])
        with torch.no_grad():
            c = int(self.backbone(torch.zeros(1, 3, 64, 64)).shape[1])
        self.fc = nn.Linear(c, nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(x).mean((2, 3)))


def widen_backbone(backbone: nn.Module, source: Dict[str, torch.Tensor], noise: float = 0.0,
                   seed: int = 0) -> None:
    """Copy a narrower backbone of the same depth into ``backbone`` (keys ``model.N...``),
    function-preserving: Net2WiderNet (Chen, Goodfellow & Shlens, ICLR 2016).

    yolov5n -> yolov5s doubles every channel count at equal depth. Output channel ``o`` of
    each conv (and its BatchNorm) copies source channel ``o // k``; input channel ``i``
    reads source channel ``i // k`` with the weight divided by ``k``, so each layer sees
    the same sums. Concatenations (C3, SPPF) keep this mapping because every concatenated
    block is widened by the same ``k``; residual adds and max-pools are per channel.
    ``noise`` (relative to each weight tensor's std) breaks the symmetry between copies,
    which would otherwise get identical gradients forever.
    """
    gen = torch.Generator().manual_seed(seed)
    state = backbone.state_dict()
    for key, dst in state.items():
        src = source.get(f"model.{key}")
        if src is None or src.dim() != dst.dim():
            raise ConfigError(f"cannot widen: source backbone has no matching tensor for 'model.{key}' "
                              "(widening needs the same architecture family and depth)")
        if dst.dim() == 0:
            state[key] = src.clone()
            continue
        ratios = [d // s_ for d, s_ in zip(dst.shape, src.shape)]
        if any(d != s_ * r for d, s_, r in zip(dst.shape, src.shape, ratios)) or min(ratios) < 1:
            raise ConfigError(f"cannot widen 'model.{key}' from {tuple(src.shape)} to {tuple(dst.shape)}: "
                              "channel counts must be whole multiples")
        w = src.repeat_interleave(ratios[0], 0)
        if dst.dim() == 4:
            w = w.repeat_interleave(ratios[1], 1) / ratios[1]
            if noise:
                w = w + noise * float(w.std()) * torch.randn(w.shape, generator=gen)
        state[key] = w.to(dst.dtype)
    backbone.load_state_dict(state)


def _to_tensor(batch: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(to_chw_rgb(list(batch)))


def accuracy(model: nn.Module, crops: np.ndarray, classes: np.ndarray, batch: int = 256) -> float:
    model.eval()
    hits = 0
    with torch.no_grad():
        for i in range(0, len(crops), batch):
            hits += int((model(_to_tensor(crops[i:i + batch])).argmax(1).numpy() == classes[i:i + batch]).sum())
    model.train()
    return hits / max(len(crops), 1)


def pretrain(data: Path, val: Optional[Path], out: Path, arch: str, nc: int = 10, crop: int = 48,
             views: int = 2, batch: int = 64, lr0: float = 0.002, time_budget_s: float = 300.0,
             max_epochs: int = 50, seed: int = 0, threads: int = 0,
             widen_from: Optional[Path] = None) -> Dict[str, Any]:
    """Train ``arch``'s backbone on crops of ``data``; save its weights to ``out``; return a summary.

    ``widen_from``: start from a narrower pre-trained backbone file (see :func:`widen_backbone`).
    """
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    crops, classes = object_crops(data, crop, views, rng)
    vcrops, vclasses = object_crops(val, crop, 1, rng) if val else (crops[:0], classes[:0])
    detector = build_model(arch, nc=nc, seed=seed)
    model = BackboneClassifier(detector, nc).train()
    if widen_from is not None:
        widen_backbone(model.backbone, _backbone_state(widen_from), noise=0.01, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr0, weight_decay=5e-4)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    t0, seen, epochs = time.monotonic(), 0, 0
    total = max_epochs * len(crops)
    done = False
    while not done and epochs < max_epochs:
        order = rng.permutation(len(crops))
        for i in range(0, len(order) - batch + 1, batch):
            progress = max(seen / total, (time.monotonic() - t0) / time_budget_s)
            if progress >= 1.0:
                done = True
                break
            for g in opt.param_groups:
                g["lr"] = lr0 * (0.02 + 0.98 * (1 + math.cos(math.pi * progress)) / 2)
            idx = order[i:i + batch]
            ims = crops[idx].copy()
            for im in ims:
                augment_hsv(im, rng, 0.015, 0.7, 0.4)
            loss = loss_fn(model(_to_tensor(ims)), torch.from_numpy(classes[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen += len(idx)
            if (i // batch) % 50 == 0:
                log.info("pretrain %s: epoch %d it %d loss %.3f %.0f crops/s", arch, epochs + 1,
                         i // batch, loss.item(), seen / max(time.monotonic() - t0, 1e-6))
        epochs += 1
    summary: Dict[str, Any] = {
        "arch": arch, "widened_from": str(widen_from) if widen_from else None, "crops": int(len(crops)),
        "crops_seen": seen, "seconds": round(time.monotonic() - t0, 1),
        "train_acc": accuracy(model, crops[:4000], classes[:4000]),
        "val_acc": accuracy(model, vcrops, vclasses) if len(vcrops) else None}
    state = {f"model.{k}": v for k, v in model.backbone.state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"arch": arch, "nc": nc, "backbone": state, "summary": summary}, out)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    log.info("pretrain %s: %s", arch, json.dumps(summary))
    return summary


def _backbone_state(path: Path) -> Dict[str, torch.Tensor]:
    ck = torch.load(path, map_location="cpu", weights_only=False)
    state = None
    if isinstance(ck, dict):
        # a backbone file of this module, or a whole detector checkpoint of the trainer
        state = ck.get("backbone", ck.get("model"))
    if not isinstance(state, dict):
        raise ConfigError(f"{path}: neither an edgewise backbone file nor a trainer checkpoint "
                          "(no 'backbone' or 'model' weights)")
    return state


def load_backbone(model: YOLOv5, path: Path) -> int:
    """Copy pre-trained weights from ``path`` into ``model``; return how many tensors.

    ``path`` is a backbone file (this module's output: layers 0-9 only) or a trainer
    checkpoint (``best.pt``/``last.pt``: every tensor, to fine-tune a trained detector
    on new data)."""
    state = _backbone_state(path)
    own = model.state_dict()
    bad = [k for k, v in state.items() if k not in own or own[k].shape != v.shape]
    if bad:
        raise ConfigError(f"{path}: backbone of a different architecture; mismatched tensors such as {bad[0]!r}")
    model.load_state_dict(state, strict=False)
    return len(state)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgewise_tools.train.pretrain", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="training folder (edgewise synth layout)")
    p.add_argument("--val", type=Path, default=None, help="folder whose crops give the reported accuracy")
    p.add_argument("--out", type=Path, required=True, help="backbone file to write (.pt)")
    p.add_argument("--arch", default="yolov5n")
    p.add_argument("--crop", type=int, default=48)
    p.add_argument("--views", type=int, default=2, help="crops per labelled object")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr0", type=float, default=0.002)
    p.add_argument("--time-budget", type=float, default=300.0, help="seconds")
    p.add_argument("--max-epochs", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--widen-from", type=Path, default=None,
                   help="start from a narrower pre-trained backbone of the same depth (e.g. yolov5n's for yolov5s)")
    a = p.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        summary = pretrain(a.data, a.val, a.out, a.arch, crop=a.crop, views=a.views, batch=a.batch, lr0=a.lr0,
                           time_budget_s=a.time_budget, max_epochs=a.max_epochs, seed=a.seed, threads=a.threads,
                           widen_from=a.widen_from)
    except ConfigError as exc:
        print(f"pretrain: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
