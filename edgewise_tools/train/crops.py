"""Native-scale training crops of a full-resolution dataset: ``python -m edgewise_tools.train.crops``.

A cloud model that runs at the camera's native resolution (the runtime's ``input:
native``: whole 1280x720 frames, or region crops of them) is trained on crops of the
frames at their native scale, not on frames shrunk to a training size: a 20 px far
digit stays 20 px. A YOLO net is fully convolutional, so what it learns on 320x320
crops carries over to a 1280x736 frame (``docs/design/escalation.md#the-camera-world``).

Per frame, ``per_frame`` crops of ``size`` x ``size`` pixels: the first centred on a
labelled object drawn uniformly (jittered by up to 40% of the crop, so objects are
not always in the middle), the others at uniform positions. Boxes are clipped to the
crop and kept when at least ``keep`` of their area is inside (Ultralytics keeps a
clipped box above an area ratio too, ``box_candidates``). Every draw comes from a
generator seeded by ``(seed, frame index)``: the same arguments write the same files.
The output is a dataset in the ``edgewise synth`` layout (``images/``, ``labels/``,
``dataset.json``) that ``edgewise train`` reads as is. As ``edgewise synth``'s, ``--out`` must
be new or empty, or (``--overwrite``) hold an earlier crops dataset, whose files are removed
first: crops written over a larger run's would keep its extra crops beside the new ones, and
``edgewise train`` would train on all of them. While it writes, the folder holds
``.crops-incomplete``, which the readers of the layout refuse (an interrupted run leaves it,
so ``dataset.json`` never stands for part of the crops).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import cv2
import numpy as np

from edgewise.errors import ConfigError, EdgewiseError
from edgewise.synth.writer import CROPS_INCOMPLETE, OwnFiles, incomplete_problem, prepare_output
from edgewise_tools.train.data import IMG_EXT, dataset_names, read_yolo_labels

Box = Tuple[int, int, int, int]

#: dataset.json keys every crops summary has (how --overwrite knows this tool wrote one)
_SUMMARY_KEYS = frozenset(("names", "nc", "source", "frames", "images", "size", "per_frame", "seed", "keep"))


def _written_by_crops(p: Path) -> bool:
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError, RecursionError):  # (nested past the decoder's depth: not the tool's)
        return False
    return isinstance(data, dict) and _SUMMARY_KEYS <= set(data)


#: what :func:`make_crops` writes into ``out`` (what ``--overwrite`` removes)
CROPS_FILES = OwnFiles("crops", {"images": re.compile(r".+_c\d+\.jpg"), "labels": re.compile(r".+_c\d+\.txt")},
                       ("dataset.json",), _written_by_crops, CROPS_INCOMPLETE)


def crop_windows(width: int, height: int, labels: np.ndarray, size: int, per_frame: int,
                 rng: np.random.Generator) -> List[Box]:
    """``per_frame`` windows (x0, y0, x1, y1) of ``size`` px inside a ``width`` x ``height``
    frame; ``labels`` [n,5] (cls, cx, cy, w, h normalised) pick the first window's centre."""
    cw, ch = min(size, width), min(size, height)
    out: List[Box] = []
    for k in range(per_frame):
        if k == 0 and len(labels):
            obj = labels[int(rng.integers(0, len(labels)))]
            cx = obj[1] * width + rng.uniform(-0.4, 0.4) * cw
            cy = obj[2] * height + rng.uniform(-0.4, 0.4) * ch
            x0, y0 = int(round(cx - cw / 2)), int(round(cy - ch / 2))
        else:
            x0, y0 = int(rng.integers(0, width - cw + 1)), int(rng.integers(0, height - ch + 1))
        x0, y0 = min(max(x0, 0), width - cw), min(max(y0, 0), height - ch)
        out.append((x0, y0, x0 + cw, y0 + ch))
    return out


def crop_labels(labels: np.ndarray, width: int, height: int, window: Box, keep: float) -> List[str]:
    """YOLO lines of the boxes of ``labels`` (normalised to the frame) inside ``window``."""
    x0, y0, x1, y1 = window
    cw, ch = x1 - x0, y1 - y0
    lines = []
    for cls, cx, cy, w, h in labels:
        bx0, by0 = cx * width - w * width / 2, cy * height - h * height / 2
        bx1, by1 = bx0 + w * width, by0 + h * height
        ix0, iy0 = max(bx0, x0), max(by0, y0)
        ix1, iy1 = min(bx1, x1), min(by1, y1)
        area = (bx1 - bx0) * (by1 - by0)
        if ix1 <= ix0 or iy1 <= iy0 or area <= 0 or (ix1 - ix0) * (iy1 - iy0) < keep * area:
            continue
        lines.append(f"{int(cls)} {((ix0 + ix1) / 2 - x0) / cw:.6f} {((iy0 + iy1) / 2 - y0) / ch:.6f} "
                     f"{(ix1 - ix0) / cw:.6f} {(iy1 - iy0) / ch:.6f}")
    return lines


def make_crops(data: Path, out: Path, size: int = 320, per_frame: int = 2, seed: int = 0, keep: float = 0.6,
               quality: int = 95, limit: Optional[int] = None, overwrite: bool = False) -> Dict[str, Any]:
    """Write the crops of every frame of ``data`` to ``out`` (new or empty, or with ``overwrite``
    holding an earlier crops dataset); returns the summary (also dataset.json)."""
    if size < 32 or per_frame < 1 or not 0 < keep <= 1 or not 1 <= quality <= 100:
        raise ConfigError("--size >= 32, --per-frame >= 1, --keep in (0, 1] and --quality in 1..100")
    img_dir = Path(data) / "images"
    if not img_dir.is_dir():
        raise ConfigError(f"{data}: no images/ folder (expected the edgewise synth layout)")
    unfinished = incomplete_problem(Path(data))
    if unfinished:
        raise ConfigError(unfinished)
    files = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in IMG_EXT)[:limit]
    if not files:
        raise ConfigError(f"{img_dir}: no images")
    prepare_output(Path(out), overwrite, ("images", "labels"), CROPS_FILES)
    marker = Path(out) / CROPS_FILES.marker
    marker.write_text("python -m edgewise_tools.train.crops is writing this dataset, or was interrupted while it did\n")
    n_crops = n_boxes = 0
    for i, f in enumerate(files):
        im = cv2.imread(str(f), cv2.IMREAD_COLOR)
        if im is None:
            raise ConfigError(f"{f}: cannot decode image")
        h, w = im.shape[:2]
        labels = read_yolo_labels(Path(data) / "labels" / f"{f.stem}.txt")
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, i])
        for k, win in enumerate(crop_windows(w, h, labels, size, per_frame, rng)):
            x0, y0, x1, y1 = win
            stem = f"{f.stem}_c{k}"
            ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(im[y0:y1, x0:x1]),
                                   [cv2.IMWRITE_JPEG_QUALITY, quality])
            if not ok:
                raise ConfigError(f"could not encode {stem}")
            (out / "images" / f"{stem}.jpg").write_bytes(buf.tobytes())
            lines = crop_labels(labels, w, h, win, keep)
            (out / "labels" / f"{stem}.txt").write_text("".join(line + "\n" for line in lines))
            n_crops += 1
            n_boxes += len(lines)
    names = dataset_names(Path(data))
    summary = {"names": names, "nc": len(names), "source": str(data), "frames": len(files), "images": n_crops,
               "objects": n_boxes, "size": size, "per_frame": per_frame, "seed": seed, "keep": keep}
    tmp = out / ".dataset.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out / "dataset.json")
    marker.unlink()
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgewise_tools.train.crops", description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="full-resolution dataset (edgewise synth layout)")
    p.add_argument("--out", type=Path, required=True, help="folder for the crops dataset")
    p.add_argument("--size", type=int, default=320, help="crop side in pixels (320)")
    p.add_argument("--per-frame", type=int, default=2, help="crops per frame (2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", type=float, default=0.6, help="least share of a box inside the crop to keep it")
    p.add_argument("--limit", type=int, default=None, help="only the first N frames")
    p.add_argument("--overwrite", action="store_true",
                   help="--out may hold an earlier crops dataset: remove its files (images/, labels/, dataset.json) "
                        "first; without it --out must be new or empty")
    a = p.parse_args(argv)
    try:
        summary = make_crops(a.data, a.out, a.size, a.per_frame, a.seed, a.keep, limit=a.limit,
                             overwrite=a.overwrite)
    except EdgewiseError as exc:
        print(f"crops: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"crops: interrupted; {a.out} holds an incomplete dataset (run again with --overwrite to replace it)",
              file=sys.stderr)
        return 130
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
