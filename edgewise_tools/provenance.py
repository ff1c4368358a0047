"""What produced a report: version, commit, model files, policy, data, date.

Every report the tools write (``edgewise eval``, the demo report, ``bench/system.py``)
carries this block, so a figure can be traced to the code, models and data behind it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import edgewise
from edgewise.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[1]
PathLike = Union[str, Path]
NAMED = 8  # uncommitted files a provenance block names


def git_state(root: Path = ROOT) -> Tuple[str, List[str]]:
    """``<sha>`` of HEAD (``+dirty`` with uncommitted changes to tracked files, "unknown" when git
    cannot say) and the tracked files so changed. A run takes it before it writes anything: a
    report folder in the tree (``models/camera/eval``) would otherwise call its own run dirty.
    Only a work tree whose top is ``root`` counts: a pip-installed edgewise in a venv inside some
    project's repository (``myproject/.venv/lib/.../site-packages``) is "unknown", not that
    project's commit with its changed files."""
    try:
        top, _, sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "--short=12", "HEAD"],
                                     capture_output=True, text=True, timeout=10, check=True).stdout.partition("\n")
        if Path(top).resolve() != Path(root).resolve():
            return "unknown", []
        sha = sha.strip()
        # -z writes paths as they are, not quoted: a name that is not UTF-8 is shown with U+FFFD, not a crash
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-z", "--untracked-files=no"],
                                capture_output=True, text=True, errors="replace", timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", []
    changed: List[str] = []
    entries = iter(status.split("\0"))
    for e in entries:  # "XY path", NUL-terminated; a rename's or copy's source follows as an entry of its own
        if len(e) > 3:
            changed.append(e[3:])
            if "R" in e[:2] or "C" in e[:2]:
                next(entries, None)
    return (sha + ("+dirty" if changed else "") if sha else "unknown"), changed


def git_commit(root: Path = ROOT) -> str:
    """:func:`git_state`'s commit."""
    return git_state(root)[0]


def file_id(path: PathLike) -> Dict[str, Any]:
    """Path, size and the first 12 hex digits of the sha256 of a file (None fields if absent)."""
    p = Path(path)
    if not p.is_file():
        return {"path": str(p), "sha256": None, "bytes": None}
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"path": str(p), "sha256": h.hexdigest()[:12], "bytes": p.stat().st_size}


def dataset_meta(data: PathLike) -> Dict[str, Any]:
    """The ``dataset.json`` of a dataset folder (``edgewise synth`` writes it), {} when there
    is none; InvalidInputError when it is there but not a JSON object."""
    path = Path(data) / "dataset.json"
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past the decoder's depth
        raise InvalidInputError(f"{path}: not valid JSON ({exc}); fix it or generate the dataset again with "
                                "`edgewise synth`") from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not isinstance(meta, dict):
        raise InvalidInputError(f"{path}: must be a JSON object (names, nc, streams, frames, ... as `edgewise synth` "
                                f"writes it), not a {type(meta).__name__}")
    nc, names = meta.get("nc"), meta.get("names")
    if nc.__class__ is int and isinstance(names, list) and nc != len(names):
        # the evaluation counted classes by nc and the trainer by names: a label of class 2 under
        # {"nc": 3, "names": ["a", "b"]} was scored by one and refused by the other
        raise InvalidInputError(f"{path}: nc {nc} but {len(names)} names; make them agree (`edgewise synth` writes "
                                "nc = the number of names)")
    return meta


def dataset_id(data: PathLike) -> Dict[str, Any]:
    """Preset, split, seed, streams, frames and size of an ``edgewise synth`` folder."""
    meta = dataset_meta(data)
    out: Dict[str, Any] = {"path": str(data)}
    for k in ("preset", "split", "seed", "streams", "frames", "stride", "images", "width", "height"):
        if k in meta:
            out[k] = meta[k]
    return out


def provenance(models: Mapping[str, PathLike], policy: Optional[PathLike] = None,
               data: Optional[Mapping[str, PathLike]] = None, state: Optional[Tuple[str, List[str]]] = None,
               **extra: Any) -> Dict[str, Any]:
    """The provenance block of a report; ``state`` is :func:`git_state` as the run began (taken
    now when not given). A dirty tree's changed files are named (the first :data:`NAMED`)."""
    commit, changed = git_state() if state is None else state
    return {
        "edgewise": edgewise.__version__,
        "commit": commit,
        **({"uncommitted": changed[:NAMED] + ([f"{len(changed) - NAMED} more"] if len(changed) > NAMED else [])}
           if changed else {}),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "models": {k: file_id(v) for k, v in models.items()},
        "policy": file_id(policy) if policy is not None else None,
        "data": {k: dataset_id(v) for k, v in (data or {}).items()},
        **extra,
    }


def data_text(name: str, d: Mapping[str, Any], fields: Sequence[str] = ("preset", "split", "seed", "streams", "frames"),
              quote: str = "`") -> str:
    """``test data `PATH` (preset camera, split test, seed 21, ...)``: a data set of a provenance
    block, with those of ``fields`` it has (nothing in brackets when it has none: a folder
    without ``dataset.json``)."""
    desc = ", ".join(f"{f} {d[f]}" for f in fields if f in d)
    return f"{name} data {quote}{d['path']}{quote}" + (f" ({desc})" if desc else "")


def markdown(prov: Mapping[str, Any]) -> str:
    """One paragraph naming everything in the block."""
    models = ", ".join(f"{k} `{v['path']}` (sha256 {v['sha256']})" for k, v in prov["models"].items())
    commit = f"commit {prov['commit']}" + (f" (uncommitted: {', '.join(prov['uncommitted'])})"
                                           if prov.get("uncommitted") else "")
    parts = [f"edgewise {prov['edgewise']}, {commit}, {prov['date']}", f"models: {models}"]
    if prov.get("policy"):
        parts.append(f"policy `{prov['policy']['path']}` (sha256 {prov['policy']['sha256']})")
    parts += [data_text(k, d) for k, d in prov.get("data", {}).items()]
    extra = {k: v for k, v in prov.items() if k not in ("edgewise", "commit", "uncommitted", "date", "models", "policy", "data")}
    parts += [f"{k}: {v}" for k, v in extra.items()]
    return "Produced by " + "; ".join(parts) + "."
