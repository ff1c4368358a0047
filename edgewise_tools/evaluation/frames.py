"""The evaluation set and what both models say about every frame of it.

A dataset is a folder written by ``edgewise synth`` (``images/``, YOLO ``labels/``,
``dataset.json``); frames are replayed per stream in frame order so the tracker and
motion signals and the policy's budget see real sequences. The edge model runs once per
frame; each frame keeps the edge detections at the operating threshold (what the daemon
sees, hence the hardness signals) and, for mAP, at a low threshold decoded from the same
raw head output. The cloud model runs once per payload mode on what that mode would send
(:func:`edgewise.regions.plan_payload`, JPEG-encoded at the policy's quality and decoded
again, as the worker would receive it), and its boxes are mapped back into frame pixels:
so each mode's accuracy, uplink bytes and cloud time are measured, not assumed. The
reference every share is taken against, the cloud on every frame whole at full resolution,
is encoded at the policy's quality too unless the evaluation names a quality of its own
(``edgewise eval --reference-quality``: a policy at a lower quality is then judged against
the same reference as the one it replaces).
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import cv2
import numpy as np

from edgewise.carrying import CarryState, seed, step
from edgewise.detections import Detections
from edgewise.errors import ConfigError, InvalidInputError
from edgewise.hardness import (
    MOTION_SIGNALS,
    MotionDetector,
    MotionResult,
    SignalConfig,
    TrackerState,
)
from edgewise.hardness.signals import recorded_signals, score_bands
from edgewise.imagefiles import read_image_file
from edgewise.policy import Policy
from edgewise.policy.schema import Merge
from edgewise.regions import MODES, tiles_to_frame
from edgewise.runtime import DecodeParams, Detector, decode
from edgewise.synth.writer import incomplete_problem
from edgewise.wire import shift_detections
from edgewise_tools.provenance import dataset_meta

_NAME = re.compile(r"^s(\d+)_f(\d+)$")
#: Threshold for the detections that feed mAP (YOLOv5 val.py uses 0.001).
MAP_CONF = 0.001
#: :meth:`FrameRecord.sent`'s name for the reference: the cloud on the whole frame at the
#: reference's JPEG quality (the cloud-only row, and the uplink every share is taken against)
REFERENCE = "reference"


@dataclass
class ModeResult:
    """The cloud's answer to one frame sent in one payload mode."""

    cloud: Detections       # operating threshold, frame pixels
    cloud_all: Detections   # low threshold, for mAP
    nbytes: int             # encoded payload size
    regions: Optional[np.ndarray] = None  # frame rects the cloud saw (the merge's regions); None: all of it
    cloud_ms: float = 0.0   # the cloud model's time on this payload (pre + infer + post)
    whole: bool = False     # the whole frame at full resolution went (``full``, or a mode's fallback)


@dataclass
class FrameRecord:
    """One frame: ground truth, both models' outputs, the edge signals and payload size.

    ``cloud``/``cloud_all``/``jpeg_bytes`` are the reference, the whole frame at full
    resolution at the reference quality (empty when ``full`` was not among the collected
    modes, ``has_full`` False); it is also what payload mode ``full`` sends unless the
    policy's quality differs from the reference's, when ``modes["full"]`` holds that answer;
    ``modes`` holds the other payload modes that were evaluated."""

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
    jpeg_bytes: int            # full frame at the reference JPEG quality
    signals: Dict[str, float] = field(default_factory=dict)
    modes: Dict[str, ModeResult] = field(default_factory=dict)
    cloud_ms: float = 0.0      # the cloud model's time on the full frame
    has_full: bool = True      # the cloud ran on the whole frame (``cloud``, ``cloud_all``)
    #: per payload mode, the boxes of this frame's cloud answer as the edge carries them into
    #: the stream's next frames (entry j-1: j frames later; missing entries: nothing left)
    carried: Dict[str, List[Detections]] = field(default_factory=dict)
    #: the moving blobs no edge box explains ([k, 4] frame pixels, the motion detector's): what
    #: the carry-state features (:mod:`edgewise.hardness.carrystate`) and region proposals read
    blobs: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))

    def sent(self, mode: str = "full") -> ModeResult:
        """What escalating this frame in ``mode`` gives (``full`` when that mode was not run;
        :data:`REFERENCE`: the reference, what ``full`` sends unless the policy's JPEG quality
        differs from the reference's)."""
        got = self.modes.get(mode) if mode != REFERENCE else None
        if got is not None:
            return got
        if not self.has_full:
            raise ValueError(f"frame s{self.stream} f{self.frame}: neither payload {mode!r} nor the whole frame "
                             "was sent to the cloud model when it was collected")
        return ModeResult(self.cloud, self.cloud_all, self.jpeg_bytes, None, self.cloud_ms, whole=True)


def list_frames(data: Path) -> List[Tuple[int, int, Path, Path]]:
    """(stream, frame, image, label) for every image of a synth dataset, in replay order.

    When ``dataset.json`` declares the dataset's ``streams`` and ``frames`` (as ``edgewise
    synth`` writes it), ``images/`` must hold exactly those frames, ``s<stream>_f<frame>``
    for every stream and frame from 0: else the evaluation would score other frames than
    the dataset says it has (InvalidInputError naming what is missing or extra). Whether they
    are consecutive frames of their streams is :func:`stride_problem`'s question."""
    images = data / "images"
    if not data.is_dir():
        raise InvalidInputError(f"{data}: {'not a folder' if data.exists() else 'does not exist'} (expected a "
                                "dataset folder written by `edgewise synth`)")
    if not images.is_dir():
        raise InvalidInputError(f"{data}: no images/ folder (expected a dataset written by `edgewise synth`)")
    unfinished = incomplete_problem(data)
    if unfinished:
        raise InvalidInputError(unfinished)
    meta = dataset_meta(data)
    out = []
    for img in images.iterdir():
        m = _NAME.match(img.stem)
        if m is None or img.suffix.lower() not in (".jpg", ".jpeg", ".png"):
            continue
        out.append((int(m.group(1)), int(m.group(2)), img, data / "labels" / f"{img.stem}.txt"))
    if not out:
        raise InvalidInputError(f"{images}: no frames named s<stream>_f<frame>.jpg|png")
    out.sort(key=lambda t: (t[0], t[1], t[2].name))
    seen: Dict[Tuple[int, int], Path] = {}
    for stream, fno, img, _ in out:
        if (stream, fno) in seen:
            raise InvalidInputError(f"{images}: {seen[(stream, fno)].name} and {img.name} are the same frame "
                                    f"(stream {stream}, frame {fno}); keep one of them")
        seen[(stream, fno)] = img
    _check_declared(data, meta, set(seen))
    return out


def stream_id(stream: int) -> str:
    """The id a set's stream has for a policy (``spec.streams``, its budget and cooldown): ``s<stream>``."""
    return f"s{stream}"


def fit_warnings(policy: Policy, data: Path, names: Optional[Sequence[str]] = None, model: str = "") -> List[str]:
    """What the daemon warns of a policy that does not fit its device (:meth:`Policy.fit_warnings`:
    ``spec.streams`` the device lacks and, given the model's class ``names``, ``spec.classes`` it
    lacks), for ``data``'s streams as a replay names them (:func:`stream_id`): overrides no frame
    of the set gets, so the policy's figures on it are not what it does where they apply (a
    ``mode: never`` for ``cam0`` left every stream escalating, silently)."""
    ids = [stream_id(s) for s in sorted({s for s, _, _, _ in list_frames(data)})]
    found = (policy.fit_warnings([str(n) for n in names], model, ids) if names is not None
             else [w for w in (policy.unknown_streams_warning(ids),) if w])
    return [f"--data {data} (its streams replayed as {', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}): {w}"
            for w in found]


#: why frames missing from a stream matter to a replay
_AS_CONSECUTIVE = "are replayed as consecutive ones (motion, the tracker and the policy's budget see a gap as one frame)"


def stride_problem(data: Path) -> Optional[str]:
    """Why the frames of ``data`` are not consecutive frames of their streams (its
    ``dataset.json`` says ``stride`` k > 1: one frame kept in k, as ``edgewise synth --stride``
    writes a training set), or None. Frames are replayed as streams: the motion detector, the
    tracker and the policy's budget timeline take each next frame as the next one the camera
    gave, so a gap of k - 1 frames looks like one frame's motion and one frame's time. The
    evaluated set must be consecutive (``eval --data``, ``check-policy --data``); a strided
    training set (``eval --train-data``) is fitted with a warning. A set whose ``dataset.json``
    declares no frames (:func:`list_frames` then checks none) has the same problem where a
    stream's frame numbers skip one: the frames missing there."""
    stride = dataset_meta(data).get("stride", 1)
    if stride != 1 or stride.__class__ is not int:
        return (f"its dataset.json says stride {stride!r}: it keeps one frame in {stride!r} of its streams, whose "
                f"frames {_AS_CONSECUTIVE}")
    last: Dict[int, int] = {}
    for stream, fno, _, _ in list_frames(data):  # in stream and frame order
        if stream in last and fno != last[stream] + 1:
            return (f"stream {stream} goes from frame {last[stream]} to frame {fno} (s{stream:03d}_f{last[stream] + 1:06d}"
                    f"{'' if fno == last[stream] + 2 else ' and more'} missing in images/), and its frames "
                    f"{_AS_CONSECUTIVE}")
        last[stream] = fno
    return None


def _check_declared(data: Path, meta: Dict[str, Any], found: Set[Tuple[int, int]]) -> None:
    """``images/`` holds the frames ``dataset.json`` declares (when it declares them)."""
    if "streams" not in meta and "frames" not in meta:
        return
    where = data / "dataset.json"
    for key in ("streams", "frames"):
        v = meta.get(key)
        if v.__class__ is not int or v < 1:
            raise InvalidInputError(f"{where}: {key} {v!r}: must be an integer >= 1 (the dataset's {key}, as "
                                    "`edgewise synth` writes it)")
    streams, frames = meta["streams"], meta["frames"]
    # Never the declared layout as a set: dataset.json is edited text, and 'frames: 100000000'
    # made a set of hundreds of millions of pairs (a hang, then all memory). Only what images/
    # holds is kept; the missing frames are counted, and the first few found in order.
    extra = sorted(k for k in found if not (k[0] < streams and k[1] < frames))
    n_missing = streams * frames - (len(found) - len(extra))
    if not n_missing and not extra:
        return
    missing = list(itertools.islice(((s, f) for s in range(streams) for f in range(frames)
                                     if (s, f) not in found), 3))

    def names(keys: List[Tuple[int, int]], count: int) -> str:
        shown = ", ".join(f"s{s:03d}_f{f:06d}" for s, f in keys[:3])
        return shown + (f" and {count - 3} more" if count > 3 else "")

    parts = ([f"{n_missing} missing ({names(missing, n_missing)})"] if n_missing else []) + (
        [f"{len(extra)} not declared ({names(extra, len(extra))})"] if extra else [])
    raise InvalidInputError(
        f"{data / 'images'}: holds {len(found)} frames but {where} declares {streams} stream(s) x {frames} "
        f"frame(s) = {streams * frames}: {'; '.join(parts)}; generate the dataset again with `edgewise synth` "
        "or make dataset.json say what images/ holds")


def read_labels(path: Path, width: int, height: int, nc: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """YOLO txt (normalised cx cy w h) -> xyxy pixel boxes and class ids.

    A missing file is a frame without objects (YOLO's convention). Every line must be
    ``class cx cy w h``: an integer class id (below ``nc`` when given: the classes the
    models and the dataset have) and four numbers in [0, 1]; else InvalidInputError
    naming the file and line. A file that cannot be read as UTF-8 text (or a folder in
    its place) is an InvalidInputError naming it too."""
    return to_pixels(label_rows(path, nc), width, height)


def label_rows(path: Path, nc: Optional[int] = None) -> np.ndarray:
    """The validated rows ``class cx cy w h`` of a YOLO label file ([K, 5], normalised; no
    file: no rows), the checks of :func:`read_labels`."""
    if not path.exists():
        return np.zeros((0, 5), np.float64)
    if path.is_dir():
        raise InvalidInputError(f"{path}: a folder where the frame's label file should be; remove it or put a "
                                "YOLO txt there (one 'class cx cy w h' line per object)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path}: not a text label file (not UTF-8: byte {exc.start} is "
                                f"{exc.object[exc.start:exc.start + 1]!r}); expected YOLO txt, one "
                                "'class cx cy w h' line per object") from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read the label file: {exc.strerror or exc}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 5:
            raise InvalidInputError(f"{path}:{n}: expected 'class cx cy w h', got {line!r}")
        problem = _label_problem(parts, nc)
        if problem:
            raise InvalidInputError(f"{path}:{n}: {problem} in {line!r}; expected 'class cx cy w h' (YOLO: a class "
                                    "id and the box's centre and size divided by the image's width and height)")
        rows.append([float(p) for p in parts])
    return np.asarray(rows, np.float64).reshape(-1, 5)


def to_pixels(rows: np.ndarray, width: int, height: int) -> Tuple[np.ndarray, np.ndarray]:
    """Label rows (:func:`label_rows`) -> xyxy pixel boxes and class ids, clipped to the image.

    A box may run past the image's edge (cx 0.99, w 0.1 is valid YOLO): only its part inside
    can be seen, and every model's boxes are clipped to the image, so unclipped it would lower
    their IoU with it and count a found object as missed. A box with no area inside the image
    (w or h 0, or wholly outside) can be found by no model: it is left out, not scored."""
    if not len(rows):
        return np.zeros((0, 4), np.float32), np.zeros((0,), np.int32)
    cx, cy, w, h = rows[:, 1] * width, rows[:, 2] * height, rows[:, 3] * width, rows[:, 4] * height
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    boxes = np.clip(boxes, 0.0, [width, height, width, height]).astype(np.float32)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return boxes[keep], rows[keep, 0].astype(np.int32)


def _label_problem(parts: Sequence[str], nc: Optional[int]) -> str:
    """What is wrong with the five fields of a label line ("" when nothing)."""
    values = []
    for name, text in zip(("class", "cx", "cy", "w", "h"), parts):
        try:
            values.append(float(text))
        except ValueError:
            return f"{name} {text!r} is not a number"
    cls = values[0]
    if not cls.is_integer() or cls < 0:
        return f"class {parts[0]} is not a class id (an integer >= 0)"
    if nc is not None and cls >= nc:
        return f"class {int(cls)} is not one of the {nc} classes (0..{nc - 1})"
    for name, text, v in zip(("cx", "cy", "w", "h"), parts[1:], values[1:]):
        if not 0.0 <= v <= 1.0:  # NaN too
            what = "size" if name in ("w", "h") else "centre"
            return f"{name} {text} is not a normalised {what} (in [0, 1])"
    return ""


def _first(frames: List[Tuple[int, int, Path, Path]], limit: Optional[int]) -> List[Tuple[int, int, Path, Path]]:
    """The first ``limit`` frames (all of them for None)."""
    if limit is None:
        return frames
    if limit < 1:
        raise InvalidInputError(f"limit {limit}: must be >= 1 (the number of frames to use; None for all)")
    return frames[:limit]


def declared_classes(data: Path) -> Optional[int]:
    """How many classes ``dataset.json`` declares (``nc``, else its ``names``); None when it does not."""
    meta = dataset_meta(data)
    nc, names = meta.get("nc"), meta.get("names")
    if nc.__class__ is int and nc >= 1:
        return int(nc)
    if isinstance(names, list) and names:
        return len(names)
    return None


def _shown(names: Sequence[str], limit: int = 12) -> str:
    """A class list for a message: ``['0', '1', ...]``, long ones cut with how many more."""
    head = ", ".join(repr(str(n)) for n in list(names)[:limit])
    return f"[{head}" + (f", ... {len(names) - limit} more]" if len(names) > limit else "]")


def check_classes(edge: Any, cloud: Any, data: Path) -> None:
    """The edge and cloud models (``.names``, :class:`~edgewise.runtime.Detector`) have the same
    classes in the same order, and the dataset's ``dataset.json`` ``names`` (when it has them)
    mean the same ids: equal to the models' or their first ones (a set labelled with fewer of
    the models' classes). Else a class id would mean different objects to the two models or
    to the labels, and F1 would count right answers as wrong: ConfigError naming both lists."""
    e, c = [str(n) for n in edge.names], [str(n) for n in cloud.names]
    if e != c:
        raise ConfigError(f"the edge and cloud models have different classes: edge {len(e)} {_shown(e)}, cloud "
                          f"{len(c)} {_shown(c)}; the hybrid merges their answers by class id, so use a model pair "
                          "trained on the same classes in the same order")
    names = dataset_names(data)
    if names is not None and names != e[:len(names)]:
        raise ConfigError(f"{data / 'dataset.json'} names {len(names)} classes {_shown(names)} but the models have "
                          f"{len(e)} {_shown(e)}: the labels' class ids would mean other objects than the models'; "
                          "evaluate on a set labelled with the models' classes")


def _filter(d: Detections, conf: float) -> Detections:
    return d.select(d.scores >= conf)


def _run(det: Detector, img: np.ndarray, low: DecodeParams) -> Tuple[Detections, Detections, float]:
    t0 = time.perf_counter()
    batch, metas = det.preprocess([img])
    raw = det.infer(batch)
    op, lo = det.postprocess(raw, metas)[0], decode(raw, metas, det.names, low, det.source)[0]
    return op, lo, (time.perf_counter() - t0) * 1e3


def _roundtrip(img: np.ndarray, quality: int) -> Tuple[np.ndarray, int]:
    """``img`` as the receiver decodes it after a JPEG at ``quality``, and the bytes sent."""
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise InvalidInputError("could not JPEG-encode a payload")
    out = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    if out is None:
        raise InvalidInputError("could not decode a payload JPEG")
    return out, len(buf)


def _whole(rec: FrameRecord, img: np.ndarray, ref: Optional[Tuple[np.ndarray, int]], quality: int,
           cloud: Detector, low: DecodeParams) -> ModeResult:
    """The cloud's answer to ``img`` sent whole at ``quality``: the reference's when it ran at
    that quality, else a cloud pass on the frame decoded from ``ref`` (its JPEG at ``quality``:
    ``rec``'s reference image, or None to encode it here)."""
    if ref is not None and rec.has_full:
        return rec.sent("full")
    sent, nbytes = ref if ref is not None else _roundtrip(img, quality)
    op, lo, ms = _run(cloud, sent, low)
    return ModeResult(op, lo, nbytes, None, ms, whole=True)


@dataclass
class EdgeView:
    """What the edge has of one frame: its pixels, its detections and its motion evidence."""

    stream: int
    frame: int
    image: np.ndarray
    label_path: Path
    edge: Detections      # operating threshold
    edge_all: Detections  # low threshold, for mAP
    motion: MotionResult  # its signals and the blobs no detection explains
    config: SignalConfig  # the policy's signal settings for this stream and frame size


def edge_pass(data: Path, edge: Detector, policy: Policy, limit: Optional[int] = None) -> Iterator[EdgeView]:
    """The edge model and motion detector over ``data``, frame by frame in stream order, as the
    daemon runs them (one motion detector per stream)."""
    frames = _first(list_frames(Path(data)), limit)
    low = DecodeParams(conf_thres=MAP_CONF, iou_thres=edge.params.iou_thres, max_det=edge.params.max_det)
    motion_cfg = policy.spec.signals.motion.config()
    motion: Dict[int, MotionDetector] = {}
    for stream, fno, img_path, label_path in frames:
        # the edge daemon's folder source's read (EXIF orientation, 16-bit depth, limits): the
        # same file must be the same frame here (cv2.imread left a 12-bit PNG nearly black)
        img = read_image_file(img_path)
        h, w = img.shape[:2]
        e_op, e_all, _ = _run(edge, img, low)
        mot = motion.setdefault(stream, MotionDetector(motion_cfg)).update(img, e_op)
        yield EdgeView(stream, fno, img, label_path, e_op, e_all, mot, policy.signal_config(stream_id(stream), (w, h)))


def collect(
    data: Path,
    edge: Detector,
    cloud: Detector,
    policy: Policy,
    modes: Sequence[str] = ("full",),
    limit: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    reference_quality: Optional[int] = None,
) -> List[FrameRecord]:
    """Run the edge model, the edge's signals (motion included) and, per payload mode, the
    cloud model over ``data``, frame by frame in stream order. Without ``full`` among
    ``modes`` the cloud does not see whole frames (it is the slowest payload at camera
    resolution) and the records' ``cloud`` is empty. The reference (``FrameRecord.cloud``,
    ``jpeg_bytes``) is encoded at ``reference_quality`` (None: the policy's ``jpegQuality``);
    when the two differ the whole frame is also sent at the policy's quality, once per frame,
    for ``full`` and for every mode that falls back to the whole frame. Each answer is also carried through the
    stream's next frames under the policy's ``merge.carry*`` (:mod:`edgewise.carrying`), so
    a replay can keep it alive between escalations (``FrameRecord.carried``).

    Refused before any model runs: models whose classes differ (:func:`check_classes`), a
    malformed label, and a set with no labelled object at all (InvalidInputError)."""
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise InvalidInputError(f"payload modes {bad}: use {', '.join(MODES)}")
    used = _first(list_frames(Path(data)), limit)
    total = len(used)
    if not (Path(data) / "labels").is_dir():
        raise InvalidInputError(f"{data}: no labels/ folder: the frames are scored against their labels (YOLO txt, "
                                "labels/s<stream>_f<frame>.txt beside images/, as `edgewise synth` writes them); add them")
    check_classes(edge, cloud, Path(data))
    declared = declared_classes(Path(data))
    nc = len(edge.names) if declared is None else min(declared, len(edge.names))
    # every label read and checked before a model runs (minutes on a large set)
    labels = {label: label_rows(label, nc) for _, _, _, label in used}
    if not any(len(rows) for rows in labels.values()):
        raise InvalidInputError(
            f"no labelled objects in {data}: the {len(labels)} label files of the frames evaluated "
            f"(labels/s<stream>_f<frame>.txt) are all empty or missing, so every F1 would be 0 and no policy "
            "could be judged; label the objects (YOLO txt, one 'class cx cy w h' line each) or use a set "
            "written by `edgewise synth`")
    low_c = DecodeParams(conf_thres=MAP_CONF, iou_thres=cloud.params.iou_thres, max_det=cloud.params.max_det)
    pl = policy.spec.payload
    ref_q = pl.jpeg_quality if reference_quality is None else reference_quality
    if not 1 <= ref_q <= 100:
        raise InvalidInputError(f"reference JPEG quality {ref_q}: must be 1..100")
    records: List[FrameRecord] = []
    trackers: Dict[int, Optional[TrackerState]] = {}
    carrying: Dict[int, List[Tuple[FrameRecord, str, CarryState]]] = {}
    carry_cfg = policy.spec.merge.carry()
    for i, v in enumerate(edge_pass(data, edge, policy, limit)):
        stream, fno, img, e_op, e_all, mot, cfg = v.stream, v.frame, v.image, v.edge, v.edge_all, v.motion, v.config
        h, w = img.shape[:2]
        gt_boxes, gt_cls = to_pixels(labels[v.label_path], w, h)
        signals, trackers[stream] = recorded_signals(e_op, trackers.get(stream), cfg, (w, h), mot.signals)
        ref, ref_bytes = _roundtrip(img, ref_q)
        if "full" in modes:
            c_op, c_all, c_ms = _run(cloud, ref, low_c)
        else:
            c_op = c_all = Detections.empty(cloud.names, "cloud")
            c_ms = 0.0
        rec = FrameRecord(
            stream=stream, frame=fno, width=w, height=h, gt_boxes=gt_boxes, gt_cls=gt_cls,
            edge=e_op, cloud=c_op, edge_all=e_all, cloud_all=c_all, jpeg_bytes=ref_bytes, signals=signals,
            cloud_ms=c_ms, has_full="full" in modes, blobs=np.asarray(mot.blobs, np.float32).reshape(-1, 4),
        )
        whole: Optional[ModeResult] = None  # the whole frame at the policy's quality, sent once
        for mode in modes:
            if mode == "full" and ref_q == pl.jpeg_quality:
                continue  # the reference is what it sends
            plan = pl.plan(img, e_op, mot.blobs, score_bands(e_op, cfg), mode)
            if plan.image is img:  # this mode sends the whole frame here
                if whole is None:
                    whole = _whole(rec, img, (ref, ref_bytes) if ref_q == pl.jpeg_quality else None, pl.jpeg_quality,
                                   cloud, low_c)
                rec.modes[mode] = whole
                continue
            sent, nbytes = _roundtrip(plan.image, pl.jpeg_quality)
            m_op, m_all, m_ms = _run(cloud, sent, low_c)
            if plan.tiles:
                m_op, m_all = (tiles_to_frame(d, plan.tiles, (w, h)) for d in (m_op, m_all))
            else:
                m_op, m_all = (shift(d, plan.offset, (w, h)) for d in (m_op, m_all))
            rec.modes[mode] = ModeResult(m_op, m_all, nbytes, plan.regions, m_ms)
        if carry_cfg.enabled:
            carrying[stream] = _carry(carrying.get(stream, []), rec, img, modes, policy.spec.merge)
        records.append(rec)
        if progress is not None:
            progress(i + 1, total)
    return records


def _carry(active: List[Tuple[FrameRecord, str, CarryState]], rec: FrameRecord, img: np.ndarray,
           modes: Sequence[str], merge: Merge) -> List[Tuple[FrameRecord, str, CarryState]]:
    """Step the stream's earlier answers onto this frame (noting what each still carries) and
    seed this frame's answers (the boxes ``merge`` carries): the daemon's tracking, for every
    possible escalation."""
    cfg = merge.carry()
    kept = []
    for earlier, mode, state in active:
        state = step(state, img, cfg)
        if len(state):
            earlier.carried[mode].append(state.detections())
            kept.append((earlier, mode, state))
    for mode in modes:
        if mode == "full" and not rec.has_full:
            continue
        sent = rec.sent(mode)
        state = seed(img, merge.carried(rec.edge, sent.cloud, sent.regions), cfg)
        rec.carried[mode] = []
        if len(state):
            kept.append((rec, mode, state))
    return kept


def set_signals(records: Sequence[FrameRecord], policy: Policy) -> None:
    """Compute every frame's edge signals again under ``policy`` (its band and signal
    parameters, per stream as in :func:`collect`), stream by stream in frame order (the
    tracker signal carries state), as the daemon does. The motion signals need the
    frame's pixels, which the records do not keep: they stay what :func:`collect`
    measured (the motion detector's settings are part of what was collected)."""
    trackers: Dict[int, Optional[TrackerState]] = {}
    configs: Dict[Tuple[int, Tuple[int, int]], SignalConfig] = {}
    for r in records:
        size = (r.width, r.height)
        cfg = configs.get((r.stream, size))
        if cfg is None:
            cfg = configs[(r.stream, size)] = policy.signal_config(stream_id(r.stream), size)
        motion = {k: r.signals.get(k, 0.0) for k in MOTION_SIGNALS}
        r.signals, trackers[r.stream] = recorded_signals(r.edge, trackers.get(r.stream), cfg, size, motion)


def shift(d: Detections, offset: Tuple[int, int], size: Tuple[int, int]) -> Detections:
    """Boxes of a single crop at ``offset`` moved into frame pixels."""
    return shift_detections(d, float(offset[0]), float(offset[1]), size)


def dataset_names(data: Path) -> Optional[List[str]]:
    """Class names from ``dataset.json`` when present."""
    names = dataset_meta(data).get("names")
    if isinstance(names, list):
        return [str(n) for n in names]
    return None
