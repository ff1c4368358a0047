"""Live mode of ``bench/edge.py``: N RTSP cameras through the real daemon on one core.

One gst-rtsp-server camera (``tests/rtsp.py``; one shared encoder, so the server's
cost does not grow with N) serves ``--camera-fps`` H.264; the daemon
(``edgewise edge run``, pinned to one CPU with ``sched_setaffinity``) opens it N
times as N ``kind: rtsp`` streams capped at ``--fps`` each, so it drains and
decodes N full-rate streams, exactly as with N cameras. For each N, after a
warm-up, it measures over ``--seconds``: the daemon's CPU (``/proc/<pid>/stat``)
per stream, frame age at inference (now - the camera's timestamp; p50/p99 from
the records), frames/s per stream. N is *sustained* when frame age p99 < 2 camera
frame periods and every stream gets >= 90% of its fps. The model defaults to
YOLOv5n at 160 px so the table is about capture, not about this CPU's inference
speed (``--model`` to change).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(ap: Any) -> None:
    """The live mode's flags on ``bench/edge.py``'s parser."""
    ap.add_argument("--live", action="store_true", help="live mode: N RTSP cameras through the daemon on one core")
    ap.add_argument("--cameras", default="1,2,4,8,12,16,24,32", help="live: the N to try, ascending")
    ap.add_argument("--camera-fps", type=int, default=25, help="live: the cameras' frame rate")
    ap.add_argument("--camera-size", default="640x480", help="live: the cameras' WxH")
    ap.add_argument("--fps", type=float, default=5.0, help="live: the daemon's fps cap per stream")
    ap.add_argument("--seconds", type=float, default=10.0, help="live: measured window per N")
    ap.add_argument("--cpu", type=int, default=-1, help="live: the CPU to pin the daemon to (default: the last)")


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100.0 * (len(s) - 1))))]


def live_row(recs: List[Dict[str, Any]], n: int, cpu_s: float, window: float, fps: float,
             camera_fps: int) -> Dict[str, Any]:
    """One table row from the records emitted in the measured window."""
    ages = [r["latency_ms"]["frame_age"] for r in recs]
    per_stream = [sum(1 for r in recs if r["stream"] == f"cam{i}") / window for i in range(n)]
    period_ms = 1000.0 / camera_fps
    row = {
        "n": n, "frames": len(recs), "cpu_core": cpu_s / window, "cpu_per_stream": cpu_s / window / n,
        "age_p50_ms": pct(ages, 50) if ages else float("nan"), "age_p99_ms": pct(ages, 99) if ages else float("nan"),
        "fps_min": min(per_stream), "infer_ms": statistics.median(r["latency_ms"]["infer"] for r in recs) if recs else 0,
    }
    row["sustained"] = bool(ages) and row["age_p99_ms"] < 2 * period_ms and row["fps_min"] >= 0.9 * fps
    return row


@contextlib.contextmanager
def edge_daemon(cfg: Path, out: Path, ready: Callable[[List[Dict[str, Any]]], bool], what: str,
                preexec_fn: Optional[Callable[[], Any]] = None) -> Iterator[subprocess.Popen[bytes]]:
    """``edgewise edge run --config cfg``, yielded once ``ready`` holds for its JSONL records in
    ``out`` (within 120 s), for the caller to measure; then SIGTERM (killed after 30 s)."""
    from tests.edge.helpers import read_jsonl

    proc = subprocess.Popen([sys.executable, "-m", "edgewise.cli", "--log-level", "WARNING", "edge", "run",
                             "--config", str(cfg)], cwd=str(ROOT), preexec_fn=preexec_fn)
    try:
        t_end = time.monotonic() + 120
        while not ready(read_jsonl(out)):
            if proc.poll() is not None or time.monotonic() > t_end:
                raise RuntimeError(f"{what}: the daemon did not start (exit {proc.poll()})")
            time.sleep(0.2)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def emitted_between(out: Path, w0: int, w1: int) -> List[Dict[str, Any]]:
    """The records of ``out`` emitted in [w0, w1) (unix ns): a measured window."""
    from tests.edge.helpers import read_jsonl

    return [r for r in read_jsonl(out) if w0 <= r["emit_unix_ns"] < w1]


def tiny_model() -> Path:
    from edgewise_tools.models import build_onnx

    path = ROOT / ".cache" / "bench-models" / "yolov5n-160.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_onnx("yolov5n", imgsz=160, nc=10, path=path, seed=0)
    return path


def run_n(n: int, url: str, model: Path, args: Any, tmp: Path, cpu: int) -> Dict[str, Any]:
    from edgewise_tools.cpu import busy_s, proc_cpu_s
    from tests.edge.helpers import settings_yaml

    out = tmp / f"live-{n}.jsonl"
    cfg = settings_yaml(tmp / f"live-{n}.yaml", device_id="bench", streams=[
        {"id": f"cam{i}", "kind": "rtsp", "uri": url, "fps": args.fps} for i in range(n)],
        model={"path": str(model), "backend": "onnxruntime", "threads": 1, "max_batch": min(n, 4)},
        sinks={"jsonl": str(out)}, spool={"path": str(tmp / f"spool-{n}.db")}, metrics={"port": -1})
    every_stream = lambda recs: len({r["stream"] for r in recs}) >= n  # noqa: E731
    with edge_daemon(cfg, out, every_stream, f"the daemon with {n} streams",
                     preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) as proc:
        time.sleep(2.0)  # warm-up: connections settled, buffers drained
        c0, b0, w0 = proc_cpu_s(proc.pid) or 0.0, busy_s(cpu), time.time_ns()
        time.sleep(args.seconds)
        c1, b1, w1 = proc_cpu_s(proc.pid) or 0.0, busy_s(cpu), time.time_ns()
    recs = emitted_between(out, w0, w1)
    row = live_row(recs, n, c1 - c0, (w1 - w0) / 1e9, args.fps, args.camera_fps)
    row["core_busy"] = (b1 - b0) / ((w1 - w0) / 1e9)  # the pinned CPU, all processes
    return row


def live_main(args: Any) -> int:
    """Run the live table and print it (Markdown)."""
    from tests.rtsp import RtspCamera, missing

    why = missing()
    if why:
        print(f"live mode needs the RTSP test camera: {why}", file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else tiny_model()
    cpus = sorted(os.sched_getaffinity(0))
    cpu = args.cpu if args.cpu >= 0 else cpus[-1]
    tmp = Path(tempfile.mkdtemp(prefix="ew-bench-live-"))
    cam = RtspCamera(fps=args.camera_fps, size=args.camera_size, codec="h264").start()
    rows = []
    try:
        for n in (int(x) for x in args.cameras.split(",")):
            row = run_n(n, cam.url, model, args, tmp, cpu)
            rows.append(row)
            print(f"N={n}: {row}", file=sys.stderr)
            if not row["sustained"]:
                break
    finally:
        cam.stop()
    period = 1000.0 / args.camera_fps
    print(f"\n### Edge daemon, live: N RTSP cameras ({args.camera_size} H.264 at {args.camera_fps} fps) at "
          f"{args.fps:g} fps each, daemon pinned to CPU {cpu}, {model.name}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| cameras | daemon CPU (cores) | CPU per stream | pinned core busy (all processes) | frame age p50 ms "
          f"| frame age p99 ms | min fps per stream | median infer ms | sustained (p99 < {2 * period:.0f} ms, "
          "fps >= 90%) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['cpu_core']:.2f} | {100 * r['cpu_per_stream']:.1f}% | {100 * r['core_busy']:.0f}% | "
              f"{r['age_p50_ms']:.1f} | {r['age_p99_ms']:.1f} | {r['fps_min']:.2f} | {r['infer_ms']:.1f} | "
              f"{'yes' if r['sustained'] else 'no'} |")
    ok = [r["n"] for r in rows if r["sustained"]]
    per = statistics.median(r["cpu_per_stream"] for r in rows)
    print(f"\nLargest N one core sustains: {max(ok) if ok else 0}"
          + ("" if not rows[-1]["sustained"] else " (the largest tried; try more with --cameras)")
          + f". CPU per stream (median over rows) {100 * per:.1f}% of a core: a core of its own would "
          f"hold about {int(1 / per)} such streams.")
    return 0
