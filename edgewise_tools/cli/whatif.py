"""``edgewise edge check-policy --data DIR``: a policy's accuracy on labelled frames.

The edge command (``edge.cli``) ships on the Jetson, where the evaluation tools do
not, and must not import them (tests/test_layers.py). So this module, registered in
the ``edge`` group after ``edge.cli`` (``edgewise.cli.COMMAND_MODULES``), *extends*
the ``check-policy`` parser it finds there: it adds ``--data`` and the model options
and sets ``args.accuracy`` to :func:`accuracy`, which ``edge.cli`` calls. Without the
tools installed, ``check-policy`` simply has no ``--data``.

:func:`accuracy` is ``edgewise eval``'s machinery, not a second implementation: both
models run once over the dataset (``evaluation.frames.collect``, whole frames and the
policy's payload mode; the outputs are cached, keyed by the models' and the dataset's
bytes and by what of the policy the collection depends on, :func:`collection`, so trying
another threshold or budget does not run them again; each file carries a checksum, and a damaged
one runs them again, :func:`_read_cache`), each policy's signals are
computed again under its own parameters (``evaluation.frames.set_signals``), and each
policy is scored as the daemon runs it (``evaluation.hybrid.policy_run``: the real
Escalator on the stream timeline with its budget, its payload mode and whole-frame
refresh, its merge and its carrying): F1, precision, recall, mAP@0.5, the escalated
share and the uplink, next to edge-only and cloud-only (whole frames).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import pickle
import stat
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from edgewise.errors import ConfigError, InvalidInputError
from edgewise.outputs import check_output_folder
from edgewise.policy.schema import Policy

log = logging.getLogger(__name__)

#: Bump when what the cache holds changes shape, or what collecting it checks (4: the models' and
#: labels' classes, unreadable label files and sets without objects are refused; 5: a checksum;
#: 6: the key of the inputs, inside).
CACHE_VERSION = 6
#: What a cache file opens with: this, the SHA-256 of the pickle after it (hex) and a newline.
CACHE_MAGIC = b"edgewise-check-policy-cache\n"


#: the accuracy options' defaults (given without --data, an option is refused: :func:`without_data`)
_ACCURACY_DEFAULTS: Dict[str, Any] = {"edge": None, "cloud": None, "fps": 10.0, "limit": None, "threads": None,
                                      "cache": None}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the accuracy options to ``edge check-policy`` (when ``edge.cli`` registered it)."""
    chk = subparsers.choices.get("check-policy")
    if chk is None:
        return
    g = chk.add_argument_group("accuracy on labelled frames (edgewise eval's machinery)")
    g.add_argument("--data", metavar="DIR", help="labelled frames: `edgewise synth` output or a folder in that format")
    g.add_argument("--edge", metavar="MODEL", help="edge model ONNX (required with --data)")
    g.add_argument("--cloud", metavar="MODEL", help="cloud model ONNX (required with --data)")
    g.add_argument("--fps", type=float, default=_ACCURACY_DEFAULTS["fps"],
                   help="frame rate of the streams, for the budget (default 10)")
    g.add_argument("--limit", type=int, default=None, help="use only the first N frames")
    g.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per model")
    g.add_argument("--cache", metavar="DIR", default=None,
                   help="where the models' outputs are cached (default $XDG_CACHE_HOME/edgewise/check-policy)")
    chk.set_defaults(accuracy=accuracy, accuracy_without_data=without_data)



def without_data(args: argparse.Namespace) -> Optional[str]:
    """What ``check-policy`` says of accuracy options given without ``--data`` (they were ignored
    in silence: an operator who wrote ``--edge M --cloud C`` and forgot ``--data`` saw no accuracy
    and no reason); None when there are none, or ``--data`` is given."""
    if args.data:
        return None
    given = [f"--{dest}" for dest, default in _ACCURACY_DEFAULTS.items() if getattr(args, dest) != default]
    if not given:
        return None
    return (f"{', '.join(given)} {'sets' if len(given) == 1 else 'set'} how the accuracy on labelled frames is "
            "measured: give --data DIR (with --edge and --cloud), or leave "
            f"{'it' if len(given) == 1 else 'them'} out")


def _cache_dir(arg: Optional[str]) -> Path:
    if arg:
        return Path(arg)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgewise" / "check-policy"


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def modes(policy: Policy) -> Tuple[str, ...]:
    """The payload modes collected for a policy: whole frames (cloud only, a refresh) and its own."""
    return tuple(dict.fromkeys(("full", policy.spec.payload.mode)))


def collection(policy: Policy) -> str:
    """What of a policy the collected frames depend on: its payload settings and modes, the
    uncertainty bands and signal parameters behind its regions, the motion detector, and the
    carrying that tracks each answer through the next frames; not its weights, thresholds or
    budget, which are replayed on the collected frames."""
    import dataclasses

    s = policy.spec
    signals = dataclasses.replace(s.signals, weights={}, learned_model="", combine="max")
    return repr((modes(policy), s.payload, s.band, s.classes, s.streams, signals, s.merge.carry()))


def _cache_key(data: Path, edge: Path, cloud: Path, policy: Policy, limit: Optional[int]) -> str:
    """What the collected frames depend on: the models, the data, the limit and
    :func:`collection`."""
    h = hashlib.sha256(f"{CACHE_VERSION}|{_file_digest(edge)}|{_file_digest(cloud)}|{limit}|"
                       f"{collection(policy)}".encode())
    for p in sorted(data.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(data)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def _collect(args: argparse.Namespace, policy: Policy) -> Tuple[List[Any], int]:
    """(frames with both models' outputs, number of classes): from the cache or by running the models."""
    from edgewise.runtime import Detector
    from edgewise_tools.evaluation.frames import collect, fit_warnings, list_frames, stride_problem

    data, edge, cloud = Path(args.data), Path(args.edge), Path(args.cloud)
    list_frames(data)  # a folder without its frames is refused before the models load
    strided = stride_problem(data)
    if strided:
        raise InvalidInputError(f"--data {data}: {strided}; give a set written with `edgewise synth --stride 1`")
    from edgewise.runtime.metadata import load_model_info

    # the edge model's classes as the daemon checks them (its metadata, no session): also from the cache
    for warning in fit_warnings(policy, data, load_model_info(edge).names, str(edge)):
        log.warning("%s", warning)
    cache = _cache_dir(args.cache) / f"{_cache_key(data, edge, cloud, policy, args.limit)}.pkl"
    cached = _read_cache(cache)
    if cached is not None:
        log.info("models' outputs on %s read from %s", data, cache)
        return cached
    det_edge = Detector.from_file(edge, threads=args.threads, source="edge")
    det_cloud = Detector.from_file(cloud, threads=args.threads, source="cloud", input_size="auto")  # as eval's
    records = collect(data, det_edge, det_cloud, policy, modes(policy), args.limit)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        body = pickle.dumps({"version": CACHE_VERSION, "key": cache.stem, "records": records,
                             "classes": len(det_edge.names)})
        # a new file of this user's, mode 0600 whatever the umask (_own_file_bytes reads no other)
        fd, tmp = tempfile.mkstemp(dir=cache.parent, prefix=cache.stem, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(CACHE_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
            os.replace(tmp, cache)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("cannot cache the models' outputs in %s: %s", cache.parent, exc)
    return records, len(det_edge.names)


def _own_file_bytes(cache: Path) -> Optional[bytes]:
    """The bytes of the cache file when only this user can have written them: a regular file of
    this user's (or root's), which no one else may write, opened without following a link.
    Unpickling runs code, and a checksum proves nothing against someone who can write the
    file: with ``--cache`` in a shared folder, another user could plant one under the name
    check-policy computes (the key depends only on the inputs). None, logged, otherwise."""
    try:
        fd = os.open(cache, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cache file %s cannot be read (%s): running the models again", cache, exc.strerror or exc)
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif st.st_uid not in (os.geteuid(), 0):
            why = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"may be written by other users (mode {stat.S_IMODE(st.st_mode):04o})"
        else:
            return f.read()
    log.warning("cache file %s %s: not read (a cache is unpickled, which runs code); running the models again",
                cache, why)
    return None


def _read_cache(cache: Path) -> Optional[Tuple[List[Any], int]]:
    """(records, classes) of a cache file :func:`_collect` wrote; None when there is none, or it
    is of another version or damaged (a flipped byte, a cut): its checksum must match, else the
    models run again. Unchecked, a damaged file crashed check-policy (any exception unpickling
    may raise) or, worse, changed the figures it printed."""
    raw = _own_file_bytes(cache)
    if raw is None:
        return None
    head, _, body = raw[len(CACHE_MAGIC):].partition(b"\n")
    if not raw.startswith(CACHE_MAGIC) or head != hashlib.sha256(body).hexdigest().encode():
        log.warning("cache file %s is damaged or of an older version: running the models again", cache)
        return None
    try:
        doc = pickle.loads(body)
        if doc["version"] != CACHE_VERSION:
            return None
        if doc["key"] == cache.stem:  # the inputs it was made from, not a file copied under another name
            return list(doc["records"]), int(doc["classes"])
        log.warning("cache file %s holds the models' outputs of other inputs (key %s; copied or renamed?): "
                    "running the models again", cache, str(doc["key"])[:40])
    except Exception as exc:  # whatever unpickling the classes of another edgewise version raises
        log.warning("cache file %s cannot be used (%s: %s): running the models again", cache,
                    exc.__class__.__name__, exc)
    return None


def accuracy(args: argparse.Namespace, policy: Policy, other: Optional[Policy]) -> Tuple[Dict[str, Any], str]:
    """The accuracy section of ``check-policy``: (JSON document, text table)."""
    import numpy as np

    from edgewise_tools.evaluation import hybrid
    from edgewise_tools.evaluation.frames import set_signals
    from edgewise_tools.options import check_option

    for flag, value in (("--edge", args.edge), ("--cloud", args.cloud)):
        if not value:
            raise ConfigError(f"--data needs {flag} MODEL (the models whose outputs are scored)")
        if not Path(value).is_file():
            raise ConfigError(f"{flag} {value}: file not found")
    check_option("--fps", args.fps, "> 0", "the streams' frame rate")
    check_option("--limit", args.limit, ">= 1", "the number of frames to use; leave it out for all")
    if args.cache:  # named: refused now, not a warning after the models ran (the default is only tried)
        check_output_folder(args.cache, "--cache")
    records, nc = _collect(args, policy)
    collected = {collection(policy): records}
    n = len(records)
    merge = policy.spec.merge
    rows: List[Dict[str, Any]] = [dict(hybrid.evaluate(records, np.zeros(n, bool), nc, merge), label="edge only")]
    for label, p in ((args.file, policy), (args.against, other)):
        if p is None:
            continue
        key = collection(p)
        if key not in collected:  # its payload, regions or motion signals need the pixels again
            collected[key] = _collect(args, p)[0]
        mine = collected[key]
        set_signals(mine, p)  # the policy's band and signal parameters
        rows.append(dict(hybrid.policy_run(mine, p, nc, args.fps), label=label))
    rows.append(dict(hybrid.cloud_only(records, nc)[0], label="cloud only"))
    doc = {"data": str(args.data), "frames": n, "edge_model": str(args.edge), "cloud_model": str(args.cloud),
           "fps": args.fps, "rows": rows}
    width = max(14, *(len(r["label"]) + 2 for r in rows))
    lines = [f"Accuracy on {args.data} ({n} labelled frames; budget on a {args.fps:g} fps timeline):",
             f"  {'':<{width}}{'F1':>7}{'precision':>11}{'recall':>8}{'mAP@0.5':>9}{'escalated':>11}{'uplink':>12}"]
    for r in rows:
        lines.append(f"  {r['label']:<{width}}{r['f1']:>7.3f}{r['precision']:>11.3f}{r['recall']:>8.3f}"
                     f"{r['map50']:>9.3f}{r['escalated']:>11.1%}{r['uplink_bytes'] / 1e6:>9.2f} MB")
    return doc, "\n".join(lines)
