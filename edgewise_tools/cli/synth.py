"""``edgewise synth``: procedural camera streams with exact labels.

``edgewise synth --out DIR --frames N --streams K --seed S --split test --imgsz 256``
writes K camera streams of N frames with YOLO txt and COCO labels (see
edgewise.synth.writer for the layout) into a new or empty DIR (``--overwrite``
replaces an earlier synth dataset there). ``edgewise train`` forwards to
``python -m edgewise_tools.train`` (same flags).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Tuple


def _imgsz(text: str) -> Tuple[int, int]:
    """``N``, ``W,H`` or ``WxH``: exactly one or two whole numbers, nothing left empty."""
    parts = text.lower().replace("x", ",").split(",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:  # also an empty part: "x240", "320,,240"
        raise argparse.ArgumentTypeError(f"--imgsz must be N, W,H or WxH (got {text!r})") from None
    if len(sizes) == 1:
        return sizes[0], sizes[0]
    if len(sizes) == 2:
        return sizes[0], sizes[1]
    raise argparse.ArgumentTypeError(f"--imgsz must be N, W,H or WxH (got {text!r})")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("synth", help="generate synthetic camera streams with labels")
    p.add_argument("--out", required=True, type=Path, help="output folder, new or empty (see --overwrite)")
    p.add_argument("--frames", type=int, default=None,
                   help="frames per stream (default: the preset's, 30 for camera, else 100)")
    p.add_argument("--streams", type=int, default=None,
                   help="number of camera streams (default: the preset's, 30 for camera, else 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed, a whole number >= 0 (same seed, same bytes)")
    p.add_argument("--split", choices=("train", "val", "test"), default=None,
                   help="sprite/background pool: test uses held-out handwriting and backgrounds (default: the "
                        "preset's, test for camera, whose defaults are the camera world's headline test split, "
                        "else train)")
    p.add_argument("--imgsz", type=_imgsz, default=None,
                   help="frame size N, W,H or WxH (default: the preset's, 1280,720 for camera, else 320,240)")
    p.add_argument("--difficulty", default="reference",
                   help="preset (easy, medium, hard, reference, episodes, camera) or a JSON/YAML file of knobs "
                        "(default %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one difficulty knob (repeatable), e.g. --set objects_max=3")
    p.add_argument("--format", dest="image_format", choices=("jpg", "png"), default="jpg")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    p.add_argument("--stride", type=int, default=1, help="keep every k-th frame (default 1)")
    p.add_argument("--video", action="store_true", help="also write one MJPG .avi per stream (needs an even frame size)")
    p.add_argument("--overwrite", action="store_true",
                   help="--out may hold an earlier synth dataset: remove the files synth writes there (images/, "
                        "labels/, videos/, annotations.json, dataset.json) first; other files stay. Without it "
                        "--out must be new or empty")
    p.set_defaults(func=_synth)


def _synth(args: argparse.Namespace) -> int:
    from edgewise.synth import SynthJob, default_layout, generate, load_difficulty

    layout = default_layout(args.difficulty)
    w, h = args.imgsz or (layout.width, layout.height)
    frames = layout.frames if args.frames is None else args.frames
    streams = layout.streams if args.streams is None else args.streams
    job = SynthJob(out=args.out, frames=frames, streams=streams, seed=args.seed,
                   split=args.split or layout.split, width=w, height=h,
                   difficulty=load_difficulty(args.difficulty, args.overrides),
                   image_format=args.image_format, jpeg_quality=args.quality, video=args.video,
                   stride=args.stride, preset=str(args.difficulty), overwrite=args.overwrite)
    t0 = time.monotonic()
    total = frames * streams

    last = [t0]

    def progress(n: int) -> None:  # every 500 frames or 10 s, and at the end
        now = time.monotonic()
        if n % 500 == 0 or n == total or now - last[0] >= 10.0:
            last[0] = now
            print(f"synth: {n}/{total} frames", file=sys.stderr)

    try:
        summary = generate(job, progress)
    except KeyboardInterrupt:
        print(f"synth: interrupted; {args.out} holds an incomplete dataset (run again with --overwrite to "
              f"replace it)", file=sys.stderr)
        raise
    summary["seconds"] = round(time.monotonic() - t0, 2)
    summary.pop("difficulty", None)
    print(json.dumps(summary))
    return 0
