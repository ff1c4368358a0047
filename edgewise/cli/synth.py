"""``edgewise synth`` (procedural data) and ``edgewise train`` (YOLOv5 trainer, needs the train extra).

``edgewise synth --out DIR --frames N --streams K --seed S --split test --imgsz 256``
writes K camera streams of N frames with YOLO txt and COCO labels (see
edgewise.synth.writer for the layout). ``edgewise train`` forwards to
``python -m edgewise.train`` (same flags).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Tuple


def _imgsz(text: str) -> Tuple[int, int]:
    try:
        parts = [int(p) for p in text.lower().replace("x", ",").split(",") if p]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--imgsz must be N or W,H (got {text!r})") from None
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise argparse.ArgumentTypeError(f"--imgsz must be N or W,H (got {text!r})")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("synth", help="generate synthetic camera streams with labels")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--frames", type=int, default=100, help="frames per stream (default 100)")
    p.add_argument("--streams", type=int, default=4, help="number of camera streams (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--split", choices=("train", "val", "test"), default="train",
                   help="sprite/background pool: test uses held-out handwriting and backgrounds")
    p.add_argument("--imgsz", type=_imgsz, default=(320, 240), help="frame size N or W,H (default 320,240)")
    p.add_argument("--difficulty", default="reference",
                   help="preset (easy, medium, hard, reference, episodes) or a JSON/YAML file of knobs")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one difficulty knob (repeatable), e.g. --set objects_max=3")
    p.add_argument("--format", dest="image_format", choices=("jpg", "png"), default="jpg")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    p.add_argument("--stride", type=int, default=1, help="keep every k-th frame (default 1)")
    p.add_argument("--video", action="store_true", help="also write one MJPG .avi per stream")
    p.set_defaults(func=_synth)

    t = subparsers.add_parser("train", help="train a YOLOv5 model (needs the train extra: torch)")
    add_train_arguments(t)
    t.set_defaults(func=_train)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``edgewise train`` / ``python -m edgewise.train`` (no torch import here)."""
    p.add_argument("--data", required=True, help="training folder (edgewise synth layout)")
    p.add_argument("--val", default=None, help="validation folder (default: the training folder)")
    p.add_argument("--out", required=True, help="run folder: checkpoints, history, best.onnx")
    p.add_argument("--arch", default="yolov5n", help="yolov5n|s|m|l|x (default yolov5n)")
    p.add_argument("--width", dest="width_multiple", type=float, default=None,
                   help="override the width multiple (e.g. 0.375 for a narrow yolov5s)")
    p.add_argument("--imgsz", type=int, default=256)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--nbs", type=int, default=64, help="nominal batch size (accumulation target)")
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
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="wall-clock seconds; the LR schedule follows time and training stops there")
    p.add_argument("--limit", type=int, default=None, help="use only the first N training images")
    p.add_argument("--val-limit", type=int, default=None)
    p.add_argument("--epoch-size", type=int, default=None,
                   help="images per epoch (validation + checkpoint after each); default: the whole set")
    p.add_argument("--no-export", action="store_true", help="skip the ONNX export of best.pt")
    p.add_argument("--init", default=None,
                   help="start from a pre-trained backbone (python -m edgewise.train.pretrain --out FILE) "
                        "or fine-tune a trained detector (a trainer checkpoint such as RUN/best.pt)")


def _synth(args: argparse.Namespace) -> int:
    from edgewise.synth import SynthJob, generate, load_difficulty

    w, h = args.imgsz
    job = SynthJob(out=args.out, frames=args.frames, streams=args.streams, seed=args.seed,
                   split=args.split, width=w, height=h,
                   difficulty=load_difficulty(args.difficulty, args.overrides),
                   image_format=args.image_format, jpeg_quality=args.quality, video=args.video,
                   stride=args.stride)
    t0 = time.monotonic()
    total = args.frames * args.streams

    def progress(n: int) -> None:
        if n % 500 == 0 or n == total:
            print(f"synth: {n}/{total} frames", file=sys.stderr)

    summary = generate(job, progress)
    summary["seconds"] = round(time.monotonic() - t0, 2)
    summary.pop("difficulty", None)
    print(json.dumps(summary))
    return 0


def _train(args: argparse.Namespace) -> int:
    from edgewise.train.__main__ import run_args

    return int(run_args(args))
