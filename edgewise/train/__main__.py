"""``python -m edgewise.train``: command-line front end of :func:`edgewise.train.train`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from edgewise.cli.synth import add_train_arguments
from edgewise.errors import EdgewiseError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgewise train", description="train a YOLOv5 on a YOLO-txt dataset")
    add_train_arguments(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_args(build_parser().parse_args(list(argv) if argv is not None else None))


def run_args(args: argparse.Namespace) -> int:
    """Train with parsed ``args`` (also the ``edgewise train`` handler)."""
    try:
        from edgewise.train.trainer import TrainConfig, train
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
                      threads=args.threads, device=args.device, time_budget_s=args.time_budget, limit=args.limit,
                      val_limit=args.val_limit, epoch_size=args.epoch_size,
                      export_onnx=not args.no_export, init=args.init)
    try:
        summary = train(cfg)
    except EdgewiseError as exc:
        print(f"edgewise train: error: {exc}", file=sys.stderr)
        return 2
    summary.pop("history", None)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
