"""Paced mode of ``bench/edge.py``: the daemon's CPU per frame at camera pace, beside the
model's own inference time.

A Jetson Xavier NX has six Carmel cores; what the daemon spends around the model is taken
from the cameras' decode and everything else on the device. This runs the real daemon
(``edgewise edge run``, a process of its own) on ``--streams`` file streams of opencv-doc's
``vtest.avi`` (768x576) looped at ``--paced-fps`` each, not saturated, with the daemon's
default model (``model.path``: the camera pair's INT8 YOLOv5n at 256x416 in ONNX Runtime's CPU
layout; the Jetson bundle ships another INT8 file, laid out for TensorRT, which ONNX Runtime runs
slower than float), and measures over ``--paced-seconds`` after a warm-up:

* CPU milliseconds per frame: the process's user + system time (``/proc/<pid>/stat``, all
  threads) over the frames it emitted;
* peak RSS (``VmHWM`` of ``/proc/<pid>/status``);
* the model's own inference time: ``Detector.infer`` of the same letterboxed frames in this
  process, with the same backend options, one frame at a time at the same pace (median wall
  and CPU time, so ONNX Runtime's thread pool shows when it burns more CPU than wall time);

once per variant of the settings that decide the overhead (``--paced-variants``; the first is
the shipped defaults of ``model.threads``, ``spin`` and ``max_batch``), with the
CPU flags and the load average before and after each (other work on a shared machine takes
CPU from the daemon but is not counted in its CPU time). Target: CPU per frame <= 1.5x the
model's inference time (docs/design/edge-runtime.md, "CPU per frame").
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

from edge.settings import ModelSettings

ROOT = Path(__file__).resolve().parents[1]
VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
_DEFAULTS = ModelSettings()
#: the daemon's default model: this mode runs ONNX Runtime on the CPU, so not the Jetson bundle's
#: default (``edge.bundle.DEFAULT_MODEL``, TensorRT's Q/DQ layout since 1455341, which ONNX Runtime
#: runs at 0.6x float speed: its Q/DQ pairs are TensorRT's to fuse)
SHIPPED = ROOT / _DEFAULTS.path
#: name -> model settings; "before" is what the daemon did before this measurement existed
VARIANTS: Dict[str, Dict[str, Any]] = {
    "shipped defaults": {"threads": _DEFAULTS.threads, "spin": _DEFAULTS.spin, "max_batch": _DEFAULTS.max_batch},
    "spinning (before)": {"threads": 0, "spin": True, "max_batch": 1},
    "no spinning 1 thread": {"threads": 1, "spin": False, "max_batch": 1},
    "no spinning 2 threads": {"threads": 2, "spin": False, "max_batch": 1},
}


def add_arguments(ap: Any) -> None:
    """The paced mode's flags on ``bench/edge.py``'s parser."""
    ap.add_argument("--paced", action="store_true",
                    help="paced mode: CPU ms per frame and peak RSS at camera pace vs the model's inference time")
    ap.add_argument("--paced-fps", type=float, default=10.0, help="paced: frames/s of each stream")
    ap.add_argument("--paced-seconds", type=float, default=20.0, help="paced: measured window per variant")
    ap.add_argument("--paced-variants", default=",".join(VARIANTS),
                    help=f"paced: comma-separated, of: {', '.join(VARIANTS)}")


def model_time(model: Path, threads: int, spin: bool, fps: float, n: int = 40) -> Tuple[float, float]:
    """Median (wall ms, CPU ms) of one paced ``infer`` call on letterboxed vtest frames."""
    import cv2

    from edgewise.runtime.backends.onnxruntime import OnnxRuntimeBackend
    from edgewise.runtime.detector import Detector
    from edgewise.runtime.metadata import load_model_info

    info = load_model_info(model)
    det = Detector(info, OnnxRuntimeBackend(info, threads=threads or None, spinning=spin))
    cap = cv2.VideoCapture(str(VTEST))
    frames = [cap.read()[1] for _ in range(n)]
    cap.release()
    batches = [det.preprocess([f])[0] for f in frames]
    det.infer(batches[0])
    walls, cpus = [], []
    for b in batches:
        t0, c0 = time.perf_counter(), time.process_time()
        det.infer(b)
        walls.append((time.perf_counter() - t0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
        time.sleep(max(0.0, 1.0 / fps - walls[-1] / 1e3))  # paced, as in the daemon
    det.close()
    return statistics.median(walls), statistics.median(cpus)


def run_variant(name: str, opts: Dict[str, Any], args: Any, model: Path, tmp: Path) -> Dict[str, Any]:
    from bench._edge_live import edge_daemon, emitted_between
    from edgewise_tools.cpu import memory_mb, proc_cpu_s, thread_cpu_s
    from tests.edge.helpers import settings_yaml

    tag = name.split(" (")[0].replace(" ", "-")
    out = tmp / f"{tag}.jsonl"
    cfg = settings_yaml(
        tmp / f"{tag}.yaml", device_id="bench",
        streams=[{"id": f"cam{i}", "kind": "file", "uri": str(VTEST), "loop": True, "fps": args.paced_fps}
                 for i in range(args.streams)],
        model={"path": str(model), "backend": "onnxruntime", "threads": opts["threads"],
               "spin": opts["spin"], "max_batch": opts["max_batch"]},
        sinks={"jsonl": str(out)}, spool={"path": str(tmp / f"{tag}-spool.db")}, metrics={"port": -1})
    load0 = os.getloadavg()[0]
    enough = lambda recs: len(recs) >= 2 * args.streams  # noqa: E731
    with edge_daemon(cfg, out, enough, name) as proc:
        time.sleep(3.0)  # warm-up
        c0, t0, w0 = proc_cpu_s(proc.pid) or 0.0, thread_cpu_s(proc.pid), time.time_ns()
        time.sleep(args.paced_seconds)
        c1, t1, w1 = proc_cpu_s(proc.pid) or 0.0, thread_cpu_s(proc.pid), time.time_ns()
        rss = memory_mb(proc.pid)[1]
    recs = emitted_between(out, w0, w1)
    wall_ms, cpu_ms = model_time(model, opts["threads"], opts["spin"], args.paced_fps)
    window = (w1 - w0) / 1e9
    stages = {k: statistics.median(r["latency_ms"][k] for r in recs) if recs else 0.0
              for k in ("read", "preprocess", "infer", "postprocess", "hardness_policy")}
    n = max(1, len(recs))
    per_thread = sorted(((tid == proc.pid, (t1[tid] - t0.get(tid, 0.0)) * 1e3 / n) for tid in t1), reverse=True)
    main_ms = next((ms for is_main, ms in per_thread if is_main), 0.0)
    others = sorted((ms for is_main, ms in per_thread if not is_main), reverse=True)
    return {"name": name, "frames": len(recs), "fps": len(recs) / window, "main_ms": main_ms,
            "threads_ms": [round(ms, 1) for ms in others if ms >= 0.05][:4],
            "cpu_ms": (c1 - c0) * 1e3 / max(1, len(recs)), "cores": (c1 - c0) / window, "rss_mb": rss,
            "model_ms": wall_ms, "model_cpu_ms": cpu_ms, "stages": stages, "load": (load0, os.getloadavg()[0])}


def paced_main(args: Any) -> int:
    """Run every variant and print the table (Markdown)."""
    from edgewise_tools.cpu import simd_summary

    if not VTEST.exists():
        print(f"paced mode needs {VTEST} (apt-get install opencv-doc)", file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else SHIPPED
    tmp = Path(tempfile.mkdtemp(prefix="ew-bench-paced-"))
    # The model's own inference time: one thread, no spinning, paced: the CPU work of one
    # inference, which contention on a shared machine does not inflate (wall time it does).
    # Measured before and after the daemon runs and averaged, as load drifts on a shared machine.
    before = model_time(model, 1, False, args.paced_fps)
    rows: List[Dict[str, Any]] = []
    for name in (v.strip() for v in args.paced_variants.split(",") if v.strip()):
        rows.append(run_variant(name, VARIANTS[name], args, model, tmp))
        print(f"{name}: {rows[-1]}", file=sys.stderr)
    after = model_time(model, 1, False, args.paced_fps)
    shutil.rmtree(tmp, ignore_errors=True)  # the variants' settings, spools and records
    work_wall, work_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
    print(f"\n### Edge daemon CPU per frame at camera pace: {args.streams} x {args.paced_fps:g} fps of "
          f"vtest.avi (768x576), {model.name}; CPU {simd_summary()}; {os.cpu_count()} CPUs\n")
    print(f"The model's own inference time (1 thread, no spinning, paced): {work_cpu:.1f} ms CPU, "
          f"{work_wall:.1f} ms wall.\n")
    print("| variant | frames/s | daemon CPU ms/frame | daemon cores | CPU / inference CPU | model inference "
          "with these settings ms (wall / CPU) | peak RSS MB | load avg (start / end) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        r["ratio"] = r["cpu_ms"] / work_cpu
        print(f"| {r['name']} | {r['fps']:.1f} | {r['cpu_ms']:.1f} | {r['cores']:.2f} | {r['ratio']:.2f}x | "
              f"{r['model_ms']:.1f} / {r['model_cpu_ms']:.1f} | {r['rss_mb']:.0f} | {r['load'][0]:.1f} / "
              f"{r['load'][1]:.1f} |")
    print("\nWhere each variant's CPU per frame goes, by thread (ms/frame, /proc/<pid>/task): the main "
          "thread runs the event loop, hardness, policy and the sinks; the busiest other thread is the "
          "inference thread (letterbox, ONNX Runtime's calling thread, decode + NMS), the next ones ONNX "
          "Runtime's pool workers (with more than one thread) and the capture threads (video decode).\n")
    for r in rows:
        print(f"- {r['name']}: main {r['main_ms']:.1f}; other threads {', '.join(map(str, r['threads_ms']))}")
    best = min(rows, key=lambda r: r["ratio"])
    st = best["stages"]
    print(f"\nStages of {best['name']} (median wall ms per frame in the daemon): read {st['read']:.2f}, "
          f"preprocess {st['preprocess']:.2f}, infer {st['infer']:.2f}, postprocess {st['postprocess']:.2f}, "
          f"hardness + policy {st['hardness_policy']:.2f}.")
    print(f"\nTarget CPU per frame <= 1.5x the model's inference time: "
          f"{'met' if best['ratio'] <= 1.5 else 'NOT met'} ({best['name']}: {best['cpu_ms']:.1f} ms for "
          f"{work_cpu:.1f} ms, {best['ratio']:.2f}x).")
    return 0
