"""`edgewise demo`: local cloud + edge daemon on generated camera streams, with a report."""

from __future__ import annotations

import argparse
import math
import signal
from pathlib import Path
from typing import Any, Dict

from edgewise.errors import ConfigError


def _fps(text: str) -> float:
    """A frame rate: a finite number above 0 (``nan`` and ``inf`` are floats, not frame rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number above 0 (got {text!r})") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0 (got {text!r})")
    return value


#: the signals that stop the demo as Ctrl-C does (a `timeout`, a CI job's cancel; a closed terminal)
_STOPPING = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, _frame: object) -> None:
    """Stop as Ctrl-C does, once: a second SIGTERM while the demo stops what it started (a cancel
    sent twice) raised in the middle of that clean-up and could leave the cloud's processes
    running; later ones are ignored until the command's handlers are put back."""
    for sig in _STOPPING:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def _handler(args: argparse.Namespace) -> int:
    from edgewise.outputs import check_output_folder
    from edgewise_tools.demo import DemoConfig, run_demo
    from edgewise_tools.demo.report import INDEX, SUMMARY
    from edgewise_tools.demo.running import frames_problem

    check_output_folder(args.out, "--out", (INDEX, SUMMARY))

    few = frames_problem(args.frames) if args.frames is not None else None  # (0 was the world's in silence)
    if few:
        raise ConfigError(few)
    frames = args.frames if args.frames is not None else (60 if args.short else 0)  # 0: the world's
    kw: Dict[str, Any] = dict(transport=args.transport, out=Path(args.out), workers=args.workers, fps=args.fps,
                              streams=args.streams, keep_workdir=args.keep, frames=frames)
    if args.short:
        kw["kill_seconds"] = 2.0
    for name in ("edge_model", "cloud_model", "policy"):
        value = getattr(args, name)
        if value:
            kw[name] = Path(value)
    cfg = DemoConfig(**kw)  # what is left out follows the world of the cloud model
    # SIGTERM (a `timeout`, a CI job's cancel) and SIGHUP (a closed terminal) stop it as Ctrl-C does: they
    # ended the process at once, and the gateway and workers it had started ran on, orphaned
    previous = {sig: signal.signal(sig, _interrupt) for sig in _STOPPING}
    try:
        summary = run_demo(cfg)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stages = summary["edge_stage_median_ms"]
    print("\nedge per-stage medians (ms): " + ", ".join(f"{k} {v}" for k, v in stages.items()))
    return 0 if summary["accounting"]["lost"] == 0 and summary["accounting"]["frames"] > 0 else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the top-level ``demo`` command."""
    p = subparsers.add_parser("demo", help="run the whole hybrid locally and write demo-report/index.html")
    p.add_argument("--transport", choices=("grpc", "mqtt"), default="grpc",
                   help="escalation transport (default %(default)s; mqtt needs a local mosquitto)")
    p.add_argument("--short", action="store_true", help="a short run (60 frames per stream), as the tests use")
    p.add_argument("--frames", type=int, default=None, help="frames per stream (default: the world's, 150 in the camera world)")
    p.add_argument("--streams", type=int, default=2, help="generated camera streams (default %(default)s)")
    p.add_argument("--fps", type=_fps, default=10.0, help="camera frame rate (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="cloud workers (default %(default)s)")
    p.add_argument("--out", default="demo-report", help="report folder (default %(default)s)")
    p.add_argument("--edge-model", default="", help="edge model (default models/camera/edge-int8.onnx)")
    p.add_argument("--cloud-model", default="", help="cloud model (default models/camera/cloud.onnx; the episodes pair: --edge-model models/edge-int8.onnx --cloud-model models/cloud.onnx)")
    p.add_argument("--policy", default="", help="escalation policy (default: the world's, examples/policy.yaml in the camera world)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, data, sink)")
    p.set_defaults(func=_handler)
