"""Write synthetic camera streams to disk: frame folders + YOLO txt + COCO json (+ optional videos).

Layout of ``out``::

    images/s{stream:03d}_f{frame:06d}.jpg   frames (or .png)
    labels/s{stream:03d}_f{frame:06d}.txt   YOLO lines "cls cx cy w h" (normalised)
    annotations.json                        COCO detection json (same boxes, pixels)
    dataset.json                            names, nc, split, seed, size, difficulty
    videos/s{stream:03d}.avi                only with ``video=True`` (MJPG)

``out`` must be new or empty: a dataset written over another would keep the old
one's frames next to the new ones (and an evaluation of the folder would mix them
in). With ``overwrite=True`` (``edgewise synth --overwrite``) the files synth writes
(the names above) are removed first; anything else is left where it is, and a file
of another name inside ``images/``, ``labels/`` or ``videos/`` is refused rather
than deleted; ``annotations.json`` and ``dataset.json`` are removed only when their
content shows synth wrote them (another tool's COCO file of that name is refused too).
Both are written atomically, so an interrupted run never leaves half of one.

While it writes, ``out`` holds ``.synth-incomplete`` (:data:`INCOMPLETE`), removed once
``dataset.json`` is in place: a run that was interrupted (Ctrl-C, a full disk, a kill) leaves
it, and the readers of the layout (``edgewise train`` and its backbone pre-training, ``eval``,
``check-policy --data``) refuse such a folder (:func:`incomplete_problem`) instead of training
or scoring on part of the frames, the last perhaps without its labels. ``--overwrite`` removes it with the rest.
The training crops (``edgewise_tools.train.crops``) write the same layout by the same rules
(:func:`prepare_output`, :class:`OwnFiles`) and leave a marker of their own
(:data:`INCOMPLETE_MARKERS`).

COCO ``category_id`` equals the YOLO class index (0..9, category names "0".."9").
COCO images carry ``stream`` and ``frame`` (0-based) so streams can be replayed
in order; annotations carry ``visible``, ``contrast``, ``size_px``, ``hardness``,
``lookalike`` and ``track_id``. Objects too hidden to label are COCO
``iscrowd=1, ignore=1`` and have no YOLO line (see edgewise.synth.render).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Pattern, Sequence, Tuple

import cv2

from edgewise.errors import ConfigError, InvalidInputError
from edgewise.outputs import replace_durably
from edgewise.synth.render import CLASS_NAMES, MAX_SEED, ObjectLabel, StreamGenerator
from edgewise.synth.settings import Difficulty

#: the largest ``--stride``: one kept frame per 100 s of a 10 fps stream already decorrelates
#: training frames, and every skipped frame is still rendered (the scene must move on)
MAX_STRIDE = 1000


@dataclass(frozen=True)
class SynthJob:
    """What to generate. ``frames`` is per stream."""

    out: Path
    frames: int
    streams: int
    seed: int
    split: str
    width: int
    height: int
    difficulty: Difficulty
    image_format: str = "jpg"
    jpeg_quality: int = 90
    video: bool = False
    stride: int = 1  # keep every ``stride``-th frame (decorrelates training frames)
    preset: str = ""  # the preset name or difficulty file it came from, recorded in dataset.json
    overwrite: bool = False  # replace a dataset already in ``out`` (only the files synth writes)

    def validate(self) -> SynthJob:
        if self.frames < 1 or self.streams < 1:
            raise ConfigError("--frames and --streams must be >= 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed {self.seed}: must be 0..{MAX_SEED} (2**64 - 1)")
        if not (32 <= self.width <= 4096 and 32 <= self.height <= 4096):
            raise ConfigError(f"image size {self.width}x{self.height} must be within 32..4096")
        if self.video and (self.width % 2 or self.height % 2):
            even = f"{self.width + self.width % 2}x{self.height + self.height % 2}"
            raise ConfigError(f"--video needs an even frame size: the MJPG video stores colour at half the width and "
                              f"height, so {self.width}x{self.height} would decode one pixel smaller than its labels "
                              f"({self.width - self.width % 2}x{self.height - self.height % 2}); use --imgsz {even}")
        if self.image_format not in ("jpg", "png"):
            raise ConfigError("--format must be jpg or png")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"--quality {self.jpeg_quality}: must be 1..100")
        if not 1 <= self.stride <= MAX_STRIDE:
            raise ConfigError(f"--stride {self.stride}: must be 1..{MAX_STRIDE} (every frame is generated, "
                              "kept or not: a larger stride only multiplies the time)")
        where = f"difficulty {self.preset!r}" if self.preset else "difficulty"
        self.difficulty.validate(where).check_frame(self.width, self.height, where)
        return self


#: what :func:`generate` writes into ``out``: file names in each of its folders, top-level files
_OWN_FOLDERS = {
    "images": re.compile(r"s\d{3,}_f\d{6,}\.(?:jpg|png)"),
    "labels": re.compile(r"s\d{3,}_f\d{6,}\.txt"),
    "videos": re.compile(r"s\d{3,}\.avi"),
}
_OWN_FILES = ("annotations.json", "dataset.json")
#: the marker of a dataset being written (or a run that never finished writing it)
INCOMPLETE = ".synth-incomplete"
#: every such marker a dataset writer of this layout leaves (synth's, the training crops'), with
#: the command that writes it: :func:`incomplete_problem` refuses a folder that holds one
CROPS_INCOMPLETE = ".crops-incomplete"
INCOMPLETE_MARKERS = {INCOMPLETE: ("edgewise synth", "synth"),
                      CROPS_INCOMPLETE: ("python -m edgewise_tools.train.crops", "crops")}
#: what the COCO file's ``info.description`` says (how ``--overwrite`` knows synth wrote it)
_COCO_DESCRIPTION = "edgewise synthetic digits"
#: keys every dataset.json synth writes has (how ``--overwrite`` knows synth wrote it)
_SUMMARY_KEYS = frozenset(("names", "nc", "split", "seed", "width", "height", "streams", "frames", "images"))


@dataclass(frozen=True)
class OwnFiles:
    """What one dataset writer puts into its output folder: what its ``--overwrite`` may remove
    (:func:`prepare_output`)."""

    tool: str  # how messages name it: "synth"
    folders: Dict[str, Pattern[str]]  # sub-folder -> the names of the files it writes there
    files: Tuple[str, ...]  # top-level files
    written_by: Callable[[Path], bool]  # whether a top-level file's content shows the tool wrote it
    marker: str  # its INCOMPLETE_MARKERS name


def _tmp_name(name: str) -> str:
    """The name a top-level file is written under before it is renamed into place."""
    return f".{name}.tmp"


def _written_by_synth(p: Path) -> bool:
    """Whether the top-level file ``p`` (annotations.json or dataset.json) is one synth wrote:
    a symlink (removing it loses nothing) or JSON whose content is synth's."""
    if p.is_symlink():
        return True
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError, RecursionError):  # (nested past the decoder's depth: not the tool's)
        return False
    if not isinstance(data, dict):
        return False
    if p.name == "annotations.json":
        info = data.get("info")
        return isinstance(info, dict) and info.get("description") == _COCO_DESCRIPTION
    return _SUMMARY_KEYS <= set(data)


SYNTH_FILES = OwnFiles("synth", _OWN_FOLDERS, _OWN_FILES, _written_by_synth, INCOMPLETE)


def _put(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``; an OSError names ``path`` (a full disk's does not by itself)."""
    try:
        path.write_bytes(data)
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary name: no half-written file under ``path``."""
    tmp = path.with_name(_tmp_name(path.name))
    try:
        _put(tmp, text.encode())
        replace_durably(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _listing(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _remove_dataset(out: Path, own: OwnFiles) -> None:
    """Remove the files a previous run of ``own.tool`` wrote into ``out``; refuse (deleting
    nothing) when its folders hold anything it did not write."""
    doomed: List[Path] = []
    foreign: List[str] = []
    for folder, pattern in own.folders.items():
        sub = out / folder
        if not (sub.exists() or sub.is_symlink()):
            continue
        if sub.is_symlink() or not sub.is_dir():
            foreign.append(folder)
            continue
        for p in sorted(sub.iterdir()):
            if pattern.fullmatch(p.name) and (p.is_file() or p.is_symlink()):
                doomed.append(p)
            else:
                foreign.append(f"{folder}/{p.name}")
    for name in own.files:
        p = out / name
        if (p.is_symlink() or p.is_file()) and own.written_by(p):
            doomed.append(p)
        elif p.exists() or p.is_symlink():
            foreign.append(name)
        tmp = out / _tmp_name(name)
        if tmp.is_symlink() or tmp.is_file():
            doomed.append(tmp)  # left by a run killed while it wrote ``name``
    marker = out / own.marker
    if marker.is_symlink() or marker.is_file():
        doomed.append(marker)
    if foreign:
        raise InvalidInputError(
            f"output folder {out}: --overwrite removes only the files {own.tool} writes, but {_listing(foreign)} "
            f"{'is' if len(foreign) == 1 else 'are'} not one of them; move {'it' if len(foreign) == 1 else 'them'} "
            f"away or choose an empty folder")
    for p in doomed:
        p.unlink()
    for folder in own.folders:
        sub = out / folder
        if sub.is_dir() and not sub.is_symlink() and not any(sub.iterdir()):
            sub.rmdir()


def prepare_output(out: Path, overwrite: bool, folders: Sequence[str], own: Optional[OwnFiles] = None) -> None:
    """Make ``out`` ready for a new dataset of ``own.tool`` (default synth's): new or empty, or
    (``overwrite``) emptied of one it wrote before; creates ``folders`` in it."""
    own = own or SYNTH_FILES
    try:
        if out.exists() and not out.is_dir():
            raise InvalidInputError(f"output folder {out} is a file, not a folder; choose a new or empty folder")
        if out.is_dir():
            entries = sorted(p.name for p in out.iterdir())
            if entries and not overwrite:
                raise InvalidInputError(
                    f"output folder {out} is not empty (it holds {_listing(entries)}), and a new dataset written "
                    f"into it would be mixed with what is there; choose an empty or new folder, remove this one, "
                    f"or pass --overwrite to replace the dataset {own.tool} wrote there (only {own.tool}'s own "
                    f"files are removed)")
            if entries:
                _remove_dataset(out, own)
        for folder in folders:
            (out / folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = exc.filename if exc.filename is not None else out
        raise InvalidInputError(
            f"output folder {out}: cannot use {what}: {exc.strerror or exc}; choose a folder you can write to "
            f"(no part of its path may be a file)") from None


def incomplete_problem(root: Path) -> Optional[str]:
    """Why the dataset folder ``root`` cannot be read: an ``edgewise synth`` run (or another
    writer of :data:`INCOMPLETE_MARKERS`) that was writing it did not finish (its marker is
    there); None otherwise. The one check every reader of the layout makes."""
    for marker, (command, tool) in INCOMPLETE_MARKERS.items():
        if (Path(root) / marker).exists():
            return (f"{root}: an `{command}` run that wrote this dataset did not finish ({marker} is "
                    f"there): it holds only part of the frames; run the same {tool} again with --overwrite")
    return None


def yolo_lines(labels: List[ObjectLabel], width: int, height: int) -> List[str]:
    """YOLO txt lines for the labelled objects of one frame."""
    out = []
    for lb in labels:
        if not lb.labelled:
            continue
        x0, y0, x1, y1 = lb.box
        out.append(f"{lb.class_id} {(x0 + x1) / 2 / width:.6f} {(y0 + y1) / 2 / height:.6f} "
                   f"{(x1 - x0) / width:.6f} {(y1 - y0) / height:.6f}")
    return out


def generate(job: SynthJob, progress: Optional[Any] = None) -> Dict[str, Any]:
    """Generate ``job``; returns a summary dict (also written to dataset.json).

    Raises:
        ConfigError: a knob or size of ``job`` is invalid (nothing is written or removed).
        InvalidInputError: ``job.out`` is a file, cannot be created, or is not empty
            (and ``job.overwrite`` is off, or synth's folders in it hold other files).
    """
    job.validate()
    out = Path(job.out)
    prepare_output(out, job.overwrite, ("images", "labels", "videos") if job.video else ("images", "labels"))
    try:
        _put(out / INCOMPLETE, b"edgewise synth is writing this dataset, or was interrupted while it did\n")
        summary = _write(job, out, progress)
        (out / INCOMPLETE).unlink()
        return summary
    except OSError as exc:  # the disk filled up, the folder went away or read-only, ...
        what = f" {exc.filename}" if exc.filename is not None else ""
        raise InvalidInputError(
            f"output folder {out}: cannot write{what}: {exc.strerror or exc}; the dataset there is incomplete: "
            f"make room (or choose another folder) and run again with --overwrite") from None


def _write(job: SynthJob, out: Path, progress: Optional[Any]) -> Dict[str, Any]:
    images: List[Dict[str, Any]] = []
    anns: List[Dict[str, Any]] = []
    params = ([cv2.IMWRITE_JPEG_QUALITY, job.jpeg_quality] if job.image_format == "jpg"
              else [cv2.IMWRITE_PNG_COMPRESSION, 3])
    n_labelled = 0
    for s in range(job.streams):
        gen = StreamGenerator(job.width, job.height, job.difficulty, job.split, job.seed, s)
        writer = None
        if job.video:
            fourcc = cv2.VideoWriter_fourcc(*"MJPG")  # type: ignore[attr-defined]
            writer = cv2.VideoWriter(str(out / "videos" / f"s{s:03d}.avi"), fourcc, 10.0,
                                     (job.width, job.height))
        for f in range(job.frames * job.stride):
            img, labels = gen.next_frame()
            if f % job.stride:
                continue
            fi = f // job.stride
            stem = f"s{s:03d}_f{fi:06d}"
            name = f"{stem}.{job.image_format}"
            ok, buf = cv2.imencode("." + job.image_format, img, params)
            if not ok:
                raise ConfigError(f"could not encode {name}")
            _put(out / "images" / name, buf.tobytes())
            lines = yolo_lines(labels, job.width, job.height)
            _put(out / "labels" / f"{stem}.txt", "".join(line + "\n" for line in lines).encode())
            if writer is not None:
                writer.write(img)
            image_id = len(images) + 1
            images.append({"id": image_id, "file_name": f"images/{name}", "width": job.width,
                           "height": job.height, "stream": s, "frame": fi,
                           "hardness": round(gen.state.hardness, 4), "low_light": gen.state.low_light,
                           "episode": any(o.episodic for o in gen.objects)})
            for lb in labels:
                if lb.box[2] <= lb.box[0]:
                    continue  # nothing of it is visible at all
                x0, y0, x1, y1 = lb.box
                n_labelled += int(lb.labelled)
                anns.append({
                    "id": len(anns) + 1, "image_id": image_id, "category_id": lb.class_id,
                    "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0),
                    "iscrowd": 0 if lb.labelled else 1, "ignore": 0 if lb.labelled else 1,
                    "visible": lb.visible, "contrast": lb.contrast, "size_px": lb.size_px,
                    "hardness": lb.hardness, "lookalike": lb.lookalike, "track_id": lb.track_id})
            if progress is not None:
                progress(len(images))
        if writer is not None:
            writer.release()
    coco = {
        "info": {"description": _COCO_DESCRIPTION, "split": job.split, "seed": job.seed},
        "images": images, "annotations": anns,
        "categories": [{"id": i, "name": n} for i, n in enumerate(CLASS_NAMES)],
    }
    _write_atomically(out / "annotations.json", json.dumps(coco, separators=(",", ":")))
    summary = {
        "names": list(CLASS_NAMES), "nc": len(CLASS_NAMES), "split": job.split, "seed": job.seed,
        "width": job.width, "height": job.height, "streams": job.streams, "frames": job.frames,
        "stride": job.stride, "images": len(images), "objects": n_labelled,
        "format": job.image_format, "difficulty": job.difficulty.to_dict(),
    }
    if job.preset:
        summary["preset"] = job.preset
    _write_atomically(out / "dataset.json", json.dumps(summary, indent=1))
    return summary
