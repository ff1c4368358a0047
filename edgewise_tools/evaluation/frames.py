"""The evaluation set and what both models say about every frame of it.

A dataset is a folder written by ``edgewise synth`` (``images/``, YOLO ``labels/``,
``dataset.json``); frames are replayed per stream in frame order so the tracker
signal and the policy's budget see real sequences. Both models run once; each
frame keeps the edge detections at the operating threshold (what the daemon
sees, hence the hardness signals) and, for mAP, both models' detections at a low
threshold decoded from the same raw head output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import cv2
import numpy as np

from edgewise.detections import Detections
from edgewise.errors import InvalidInputError
from edgewise.hardness import SignalConfig, TrackerState, compute_signals
from edgewise.runtime import DecodeParams, Detector, decode

_NAME = re.compile(r"^s(\d+)_f(\d+)$")
#: Threshold for the detections that feed mAP (YOLOv5 val.py uses 0.001).
MAP_CONF = 0.001


@dataclass
class FrameRecord:
    """One frame: ground truth, both models' outputs, the edge signals and payload size."""

    stream: int
    frame: int
    width: int
    height: int
    gt_boxes: np.ndarray
    gt_cls: np.ndarray
    edge: Detections           # operating threshold: what the edge daemon acts on
    cloud: Detections          # operating threshold
    edge_all: Detections       # low threshold, for mAP
    cloud_all: Detections      # low threshold, for mAP
    jpeg_bytes: int            # full frame at the policy's JPEG quality
    signals: Dict[str, float] = field(default_factory=dict)


def list_frames(data: Path) -> List[Tuple[int, int, Path, Path]]:
    """(stream, frame, image, label) for every image of a synth dataset, in replay order."""
    images = data / "images"
    if not images.is_dir():
        raise InvalidInputError(f"{data}: no images/ folder (expected a dataset written by `edgewise synth`)")
    out = []
    for img in images.iterdir():
        m = _NAME.match(img.stem)
        if m is None or img.suffix.lower() not in (".jpg", ".jpeg", ".png"):
            continue
        out.append((int(m.group(1)), int(m.group(2)), img, data / "labels" / f"{img.stem}.txt"))
    if not out:
        raise InvalidInputError(f"{images}: no frames named s<stream>_f<frame>.jpg|png")
    return sorted(out, key=lambda t: (t[0], t[1]))


def read_labels(path: Path, width: int, height: int) -> Tuple[np.ndarray, np.ndarray]:
    """YOLO txt (normalised cx cy w h) -> xyxy pixel boxes and class ids."""
    if not path.exists():
        return np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            raise InvalidInputError(f"{path}:{n}: expected 'class cx cy w h', got {line!r}")
        rows.append([float(p) for p in parts])
    if not rows:
        return np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)
    a = np.asarray(rows, np.float64)
    cx, cy, w, h = a[:, 1] * width, a[:, 2] * height, a[:, 3] * width, a[:, 4] * height
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(np.float32)
    return boxes, a[:, 0].astype(np.int32)


def _filter(d: Detections, conf: float) -> Detections:
    return d.select(d.scores >= conf)


def collect(
    data: Path,
    edge: Detector,
    cloud: Detector,
    signal_cfg: SignalConfig,
    jpeg_quality: int = 90,
    limit: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> List[FrameRecord]:
    """Run both models over ``data`` and compute the edge's signals frame by frame."""
    frames = list_frames(Path(data))[:limit]
    low = DecodeParams(conf_thres=MAP_CONF, iou_thres=edge.params.iou_thres, max_det=edge.params.max_det)
    records: List[FrameRecord] = []
    for i, (stream, fno, img_path, label_path) in enumerate(frames):
        img = cv2.imread(str(img_path), cv2.IMREAD_COLOR)
        if img is None:
            raise InvalidInputError(f"{img_path}: not a readable image")
        h, w = img.shape[:2]
        gt_boxes, gt_cls = read_labels(label_path, w, h)
        outs = []
        for det in (edge, cloud):
            batch, metas = det.preprocess([img])
            raw = det.infer(batch)
            outs.append((det.postprocess(raw, metas)[0], decode(raw, metas, det.names, low, det.source)[0]))
        (e_op, e_all), (c_op, c_all) = outs
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
        records.append(FrameRecord(
            stream=stream, frame=fno, width=w, height=h, gt_boxes=gt_boxes, gt_cls=gt_cls,
            edge=e_op, cloud=c_op, edge_all=e_all, cloud_all=c_all,
            jpeg_bytes=len(buf) if ok else 0,
        ))
        if progress is not None:
            progress(i + 1, len(frames))
    set_signals(records, signal_cfg)
    return records


def set_signals(records: List[FrameRecord], signal_cfg: SignalConfig) -> None:
    """(Re)compute every frame's edge signals under ``signal_cfg``, stream by stream in
    frame order (the tracker signal carries state), as the daemon does."""
    trackers: Dict[int, Optional[TrackerState]] = {}
    for r in records:
        r.signals, trackers[r.stream] = compute_signals(r.edge, trackers.get(r.stream), signal_cfg,
                                                        frame_size=(r.width, r.height))


def dataset_names(data: Path) -> Optional[List[str]]:
    """Class names from ``dataset.json`` when present."""
    meta = Path(data) / "dataset.json"
    if meta.exists():
        names = json.loads(meta.read_text()).get("names")
        if isinstance(names, list):
            return [str(n) for n in names]
    return None
