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
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import edgewise
from edgewise.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[1]
PathLike = Union[str, Path]


def git_commit(root: Path = ROOT) -> str:
    """``<sha>`` of HEAD (``+dirty`` with uncommitted changes to tracked files), or "unknown"."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "") if sha else "unknown"


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
    except ValueError as exc:  # not JSON, or not UTF-8
        raise InvalidInputError(f"{path}: not valid JSON ({exc}); fix it or generate the dataset again with "
                                "`edgewise synth`") from None
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not isinstance(meta, dict):
        raise InvalidInputError(f"{path}: must be a JSON object (names, nc, streams, frames, ... as `edgewise synth` "
                                f"writes it), not a {type(meta).__name__}")
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
               data: Optional[Mapping[str, PathLike]] = None, **extra: Any) -> Dict[str, Any]:
    """The provenance block of a report."""
    return {
        "edgewise": edgewise.__version__,
        "commit": git_commit(),
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
    parts = [f"edgewise {prov['edgewise']}, commit {prov['commit']}, {prov['date']}", f"models: {models}"]
    if prov.get("policy"):
        parts.append(f"policy `{prov['policy']['path']}` (sha256 {prov['policy']['sha256']})")
    parts += [data_text(k, d) for k, d in prov.get("data", {}).items()]
    extra = {k: v for k, v in prov.items() if k not in ("edgewise", "commit", "date", "models", "policy", "data")}
    parts += [f"{k}: {v}" for k, v in extra.items()]
    return "Produced by " + "; ".join(parts) + "."
