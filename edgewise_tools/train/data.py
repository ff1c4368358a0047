"""Training data: YOLO-txt datasets (``edgewise synth`` layout) loaded into memory, augmented, batched.

Images are letterboxed once to the square training size with
``edgewise.runtime.letterbox.letterbox`` (the inference preprocessing), so the
model trains on exactly the geometry it sees at run time. Augmentations
(Ultralytics ``utils/augmentations.py`` style): random scale/translate affine
(``random_affine``), HSV jitter (``augment_hsv``), no flips: a mirrored digit is
not a digit (a flipped 2 is no class at all, a flipped 6 is not a 9).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

import cv2
import numpy as np

from edgewise.errors import ConfigError, InvalidInputError
from edgewise.runtime.letterbox import letterbox
from edgewise.runtime.metadata import parse_names
from edgewise.synth.writer import incomplete_problem
from edgewise_tools.evaluation.frames import label_rows
from edgewise_tools.provenance import dataset_meta

IMG_EXT = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass(frozen=True)
class Augment:
    """Augmentation strengths (0 disables). Fractions as in hyp.scratch-low.yaml."""

    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4
    scale: float = 0.25  # smaller than Ultralytics' 0.5: tiny digits must stay readable
    translate: float = 0.1


NO_AUGMENT = Augment(0.0, 0.0, 0.0, 0.0, 0.0)


def read_yolo_labels(path: Path, nc: Optional[int] = None) -> np.ndarray:
    """[n, 5] float32 (cls, cx, cy, w, h) normalised (no file: no rows); a malformed file is an
    InvalidInputError naming it and the line. The rules of a label line (an integer class id,
    below ``nc`` when given; four numbers in [0, 1]) are the evaluation's
    (:func:`edgewise_tools.evaluation.frames.label_rows`): a class id of nan or 1.5 was taken
    here, and nan ended training in an IndexError."""
    return label_rows(path, nc).astype(np.float32)


def dataset_names(root: Path) -> List[str]:
    """Class names from ``dataset.json`` (written by edgewise synth): its ``names``, else ``nc``
    numbered names, else (also without the file) "0".."9". It is read as the evaluation reads it
    (:func:`edgewise_tools.provenance.dataset_meta`: a file that is not a JSON object is an
    InvalidInputError naming it, where it was a JSONDecodeError traceback, and one without
    ``names`` a KeyError). The names must be ones a model may have (unique, 1..256 printable
    characters: :func:`edgewise.runtime.metadata.parse_names`), or training ended in a
    ``best.onnx`` that no tool loads."""
    meta = dataset_meta(root)
    names, nc = meta.get("names"), meta.get("nc")
    if names is None:
        return [str(i) for i in range(nc if nc.__class__ is int and nc >= 1 else 10)]
    if not isinstance(names, list) or not names:
        raise InvalidInputError(f"{Path(root) / 'dataset.json'}: names {str(names)[:60]!r}: must be a non-empty "
                                "list of class names (as `edgewise synth` writes it)")
    # the rule every loader applies to the exported model's names: checked before training, not
    # by the first tool to load best.onnx after the whole run
    return list(parse_names(names, f"{Path(root) / 'dataset.json'}: names", fix="rename one in dataset.json"))


class YoloDataset:
    """All images of ``root/images`` with labels from ``root/labels``, letterboxed to ``imgsz``."""

    def __init__(self, root: Path, imgsz: int, limit: Optional[int] = None) -> None:
        root = Path(root)
        img_dir = root / "images"
        if not img_dir.is_dir():
            raise ConfigError(f"{root}: no images/ folder (expected the edgewise synth layout)")
        unfinished = incomplete_problem(root)
        if unfinished:
            raise ConfigError(unfinished)
        files = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in IMG_EXT)
        if limit is not None:
            files = files[:limit]
        if not files:
            raise ConfigError(f"{img_dir}: no images")
        self.imgsz = int(imgsz)
        self.names = dataset_names(root)
        self.files = files
        self.images = np.empty((len(files), self.imgsz, self.imgsz, 3), np.uint8)
        self.labels: List[np.ndarray] = []  # per image [n, 5] cls, x0, y0, x1, y1 (input pixels)
        for i, f in enumerate(files):
            im = cv2.imread(str(f), cv2.IMREAD_COLOR)
            if im is None:
                raise ConfigError(f"{f}: cannot decode image")
            h0, w0 = im.shape[:2]
            lb_im, meta = letterbox(im, self.imgsz, auto=False, scaleup=True)
            self.images[i] = lb_im
            lab = read_yolo_labels(root / "labels" / (f.stem + ".txt"), len(self.names))
            xyxy = np.zeros((len(lab), 5), np.float32)
            xyxy[:, 0] = lab[:, 0]
            rx, ry = meta.ratio
            xyxy[:, 1] = (lab[:, 1] - lab[:, 3] / 2) * w0 * rx + meta.pad[0]
            xyxy[:, 2] = (lab[:, 2] - lab[:, 4] / 2) * h0 * ry + meta.pad[1]
            xyxy[:, 3] = (lab[:, 1] + lab[:, 3] / 2) * w0 * rx + meta.pad[0]
            xyxy[:, 4] = (lab[:, 2] + lab[:, 4] / 2) * h0 * ry + meta.pad[1]
            self.labels.append(xyxy)

    def __len__(self) -> int:
        return len(self.files)


def augment_hsv(im: np.ndarray, rng: np.random.Generator, hgain: float, sgain: float, vgain: float) -> None:
    """HSV colour-space augmentation in place (Ultralytics augment_hsv, LUT based)."""
    if not (hgain or sgain or vgain):
        return
    r = rng.uniform(-1, 1, 3) * [hgain, sgain, vgain] + 1
    hue, sat, val = cv2.split(cv2.cvtColor(im, cv2.COLOR_BGR2HSV))
    x = np.arange(0, 256, dtype=r.dtype)
    lut_hue = ((x * r[0]) % 180).astype(np.uint8)
    lut_sat = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(x * r[2], 0, 255).astype(np.uint8)
    im_hsv = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    cv2.cvtColor(im_hsv, cv2.COLOR_HSV2BGR, dst=im)


def random_affine(im: np.ndarray, labels: np.ndarray, rng: np.random.Generator, scale: float,
                  translate: float) -> Tuple[np.ndarray, np.ndarray]:
    """Scale about the centre and translate; boxes follow; tiny/clipped-away boxes are dropped."""
    if not (scale or translate):
        return im, labels
    h, w = im.shape[:2]
    s = float(rng.uniform(1 - scale, 1 + scale))
    tx = float(rng.uniform(0.5 - translate, 0.5 + translate)) * w
    ty = float(rng.uniform(0.5 - translate, 0.5 + translate)) * h
    m = np.array([[s, 0, tx - s * w / 2], [0, s, ty - s * h / 2]], np.float32)
    out = cv2.warpAffine(im, m, (w, h), flags=cv2.INTER_LINEAR, borderValue=(114, 114, 114))
    if not len(labels):
        return out, labels
    b = labels[:, 1:5].copy()
    b[:, [0, 2]] = b[:, [0, 2]] * s + m[0, 2]
    b[:, [1, 3]] = b[:, [1, 3]] * s + m[1, 2]
    area0 = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
    bw, bh = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    # utils/augmentations.py box_candidates: wh > 2 px, area ratio > 0.1, aspect < 20
    keep = (bw > 2) & (bh > 2) & (bw * bh / (area0 + 1e-16) > 0.1) & \
           (np.maximum(bw / (bh + 1e-16), bh / (bw + 1e-16)) < 20)
    new = np.concatenate([labels[:, :1], b], 1)[keep]
    return out, new


def batches(ds: YoloDataset, batch_size: int, rng: np.random.Generator, aug: Augment,
            shuffle: bool = True, indices: Optional[Sequence[int]] = None, as_uint8: bool = False
            ) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Yield ``(images [B,3,H,W] float32 RGB 0..1, targets [n,6] (i,cls,cx,cy,w,h) normalised, idx)``;
    with ``as_uint8`` the images stay uint8 RGB 0..255 (the trainer scales them on its device:
    at 1280 px the float conversion here was 60% of a batch's preparation, and a quarter of the
    bytes cross to a GPU)."""
    order = np.array(indices if indices is not None else np.arange(len(ds)))
    if shuffle:
        order = rng.permutation(order)
    sz = ds.imgsz
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ims = np.empty((len(idx), sz, sz, 3), np.uint8)
        tgts = []
        for j, k in enumerate(idx):
            im, lab = ds.images[k], ds.labels[k]
            if aug.scale or aug.translate:
                im, lab = random_affine(im, lab, rng, aug.scale, aug.translate)
            else:
                im = im.copy()
            augment_hsv(im, rng, aug.hsv_h, aug.hsv_s, aug.hsv_v)
            ims[j] = im
            if len(lab):
                t = np.zeros((len(lab), 6), np.float32)
                t[:, 0] = j
                t[:, 1] = lab[:, 0]
                t[:, 2] = (lab[:, 1] + lab[:, 3]) / 2 / sz
                t[:, 3] = (lab[:, 2] + lab[:, 4]) / 2 / sz
                t[:, 4] = (lab[:, 3] - lab[:, 1]) / sz
                t[:, 5] = (lab[:, 4] - lab[:, 2]) / sz
                tgts.append(t)
        x = np.ascontiguousarray(ims[..., ::-1].transpose(0, 3, 1, 2))
        tg = np.concatenate(tgts, 0) if tgts else np.zeros((0, 6), np.float32)
        yield (x if as_uint8 else x.astype(np.float32) / 255.0), tg, idx


T = TypeVar("T")


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items``, made in a background thread up to ``depth`` ahead, so that preparing the next
    batch (OpenCV and NumPy release the GIL) overlaps the training step on this one. The order
    is kept, and one producer thread consumes any random generator in the same sequence as a
    plain loop would. An exception in ``items`` is raised here; leaving the loop early stops
    the thread (after the item it is making)."""
    q: queue.Queue[Tuple[int, Any]] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(kind: int, value: Any) -> bool:
        while not stop.is_set():
            try:
                q.put((kind, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for it in items:
                if not put(0, it):
                    return
            put(1, None)
        except BaseException as exc:  # handed to the consumer
            put(2, exc)

    thread = threading.Thread(target=work, name="train-batches", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == 1:
                return
            if kind == 2:
                raise value
            yield value
    finally:
        stop.set()
        thread.join()
