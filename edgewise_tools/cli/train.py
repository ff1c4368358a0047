"""``edgewise train``: the YOLOv5 trainer's command line (needs the train extra: torch).

The flags are declared here without importing torch, so building the CLI stays cheap;
``python -m edgewise_tools.train`` parses the same flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from edgewise.errors import EdgewiseError


def register(subparsers: Any) -> None:
    """Add ``train``."""
    t = subparsers.add_parser("train", help="train a YOLOv5 model (needs the train extra: torch)")
    add_train_arguments(t)
    t.set_defaults(func=run_args)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``edgewise train`` / ``python -m edgewise_tools.train`` (no torch import here)."""
    p.add_argument("--data", required=True, help="training folder (edgewise synth layout)")
    p.add_argument("--val", default=None, help="validation folder (default: the training folder)")
    p.add_argument("--out", required=True, help="run folder: checkpoints, history, best.onnx")
    p.add_argument("--arch", default="yolov5n", help="yolov5n|s|m|l|x (default yolov5n)")
    p.add_argument("--width", dest="width_multiple", type=float, default=None,
                   help="override the width multiple (e.g. 0.375 for a narrow yolov5s)")
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--nbs", type=int, default=64, help="nominal batch size (accumulation target; default %(default)s)")
    p.add_argument("--optimizer", choices=("SGD", "AdamW"), default="SGD")
    p.add_argument("--lr0", type=float, default=None, help="initial LR (default 0.01 SGD, 0.001 AdamW)")
    p.add_argument("--lrf", type=float, default=0.01)
    p.add_argument("--linear-lr", action="store_true", help="linear instead of cosine decay")
    p.add_argument("--warmup-epochs", type=float, default=3.0)
    p.add_argument("--warmup-bias-lr", type=float, default=None,
                   help="bias LR at the start of warmup (default 0.1 for SGD as Ultralytics; lr0 for AdamW)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--amp", default="auto", choices=("auto", "bf16", "off"),
                   help="mixed precision: auto (bfloat16 autocast on a CUDA device that has it, float32 "
                        "elsewhere), bf16, or off (float32 throughout); default %(default)s")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="wall-clock seconds; the LR schedule follows time and training stops there")
    p.add_argument("--limit", type=int, default=None, help="use only the first N training images")
    p.add_argument("--val-limit", type=int, default=None)
    p.add_argument("--epoch-size", type=int, default=None,
                   help="images per epoch (validation + checkpoint after each); default: the whole set")
    p.add_argument("--no-export", action="store_true", help="skip the ONNX export of best.pt")
    p.add_argument("--init", default=None,
                   help="start from a pre-trained backbone (python -m edgewise_tools.train.pretrain --out FILE), "
                        "fine-tune a trained detector (a trainer checkpoint such as RUN/best.pt) or an ONNX "
                        "model exported by edgewise (e.g. models/edge.onnx: Conv+BN unfused on training images)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from OUT/resume.pt (written after every epoch of any run, "
                        "with or without --resume) when it exists, with the same settings; otherwise start "
                        "afresh (without --resume, an OUT that holds resume.pt is refused)")



def run_args(args: argparse.Namespace) -> int:
    """Train with parsed ``args`` (also the ``edgewise train`` handler)."""
    try:
        from edgewise_tools.train.trainer import TrainConfig, train
    except ModuleNotFoundError as exc:
        print(f"edgewise train: needs the train extra (torch): {exc}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lr0 = args.lr0 if args.lr0 is not None else (0.001 if args.optimizer == "AdamW" else 0.01)
    cfg = TrainConfig(data=args.data, val=args.val, out=args.out, arch=args.arch,
                      width_multiple=args.width_multiple, imgsz=args.imgsz, epochs=args.epochs,
                      batch=args.batch, nbs=args.nbs, optimizer=args.optimizer, lr0=lr0, lrf=args.lrf,
                      cos_lr=not args.linear_lr, warmup_epochs=args.warmup_epochs,
                      warmup_bias_lr=(args.warmup_bias_lr if args.warmup_bias_lr is not None
                                      else (0.1 if args.optimizer == "SGD" else lr0)), seed=args.seed,
                      threads=args.threads, device=args.device, amp=args.amp, time_budget_s=args.time_budget, limit=args.limit,
                      val_limit=args.val_limit, epoch_size=args.epoch_size,
                      export_onnx=not args.no_export, init=args.init, resume=args.resume)
    try:
        summary = train(cfg)
    except EdgewiseError as exc:
        print(f"edgewise train: error: {exc}", file=sys.stderr)
        return 2
    summary.pop("history", None)
    print(json.dumps(summary))
    return 0
