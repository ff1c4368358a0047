"""INT8 layout variants: speed against float, and agreement with float, per keep-float set.

Quantizes one float YOLOv5 ONNX once per variant (``edgewise_tools.models.quantize``,
the code ``edgewise model quantize`` runs), then times float and every INT8 variant on
the same letterboxed real frame, round-robin iteration by iteration (the order rotates)
so all of them see the same machine load. Speed-ups are the median of the per-round
ratios float / INT8, in wall-clock time and in CPU time (``time.thread_time`` with one
thread, where ONNX Runtime computes on the calling thread; process CPU time otherwise,
which counts spin-waiting too). On a shared, loaded machine the CPU-time ratio of a
one-thread run is the steadier measure of the kernels themselves. With ``--holdout N`` each variant's agreement with float (F1 of
matched detections, ``edgewise_tools.models.agreement``) is measured on held-out frames.

Usage::

    python bench/int8_variants.py                       # YOLOv5s@640 random weights, speed only
    python bench/int8_variants.py --model models/edge.onnx --calib DIR --holdout-source DIR \\
        --holdout 200 --samples 200 --iters 0           # agreement only, on a trained model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from bench.runtime import VIDEO, read_frames  # noqa: E402
from edgewise.runtime.cpu import cpu_int8_support  # noqa: E402
from edgewise.runtime.letterbox import preprocess_batch  # noqa: E402
from edgewise.runtime.metadata import load_model_info  # noqa: E402

#: name -> keep-float groups (the decode tail is always float)
VARIANTS: Dict[str, str] = {
    "first_conv+head": "first_conv,head",
    "head": "head",
    "first_conv": "first_conv",
    "none": "none",
    "silu": "silu",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="float model (default: build yolov5s@640, 80 classes)")
    p.add_argument("--calib", default=str(VIDEO), help="calibration folder/video (vtest.avi)")
    p.add_argument("--samples", type=int, default=16, help="calibration frames (speed needs few)")
    p.add_argument("--method", default="minmax")
    p.add_argument("--holdout", type=int, default=0, help="held-out frames for agreement (0 = skip)")
    p.add_argument("--holdout-source", default=None)
    p.add_argument("--conf", type=float, default=0.25)
    p.add_argument("--iters", type=int, default=20, help="timed rounds (0 = no timing)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    p.add_argument("--out-dir", default=str(ROOT / ".cache" / "bench" / "variants"))
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    from edgewise_tools.models.quantize import DEFAULT_KEEP_FLOAT, parse_keep_float, quantize

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.model:
        fpath = Path(args.model)
    else:
        fpath = ROOT / ".cache" / "bench" / "yolov5s-640-80.onnx"
        if not fpath.exists():
            from edgewise_tools.models import build_onnx

            build_onnx("yolov5s", imgsz=640, nc=80, path=fpath, seed=0)
    names = [v for v in args.variants.split(",") if v]
    results: Dict[str, Dict[str, object]] = {}
    paths: Dict[str, Path] = {}
    for name in names:
        q = out_dir / f"{fpath.stem}-{name}.onnx"
        rep = quantize(fpath, args.calib, samples=args.samples, out_path=q, method=args.method,
                       keep_float=VARIANTS[name], holdout=args.holdout,
                       holdout_source=args.holdout_source, conf_thres=args.conf, threads=args.threads)
        paths[name] = q
        a = rep.agreement
        results[name] = {"keep_float": VARIANTS[name], "int8_mb": round(rep.int8_bytes / 1e6, 2),
                         "agreement": a.as_dict() if a is not None else None}
        print(f"{name}: {a.summary() if a is not None else 'quantized'}", file=sys.stderr, flush=True)

    if args.iters > 0:
        from edgewise.runtime.backends.onnxruntime import OnnxRuntimeBackend

        info = load_model_info(fpath)
        frame = read_frames(1, None)[0]
        x, _ = preprocess_batch([frame], info.imgsz, stride=info.stride)
        backends = {"float": OnnxRuntimeBackend(info, providers=["CPUExecutionProvider"], threads=args.threads)}
        for name, q in paths.items():
            backends[name] = OnnxRuntimeBackend(load_model_info(q), providers=["CPUExecutionProvider"],
                                                threads=args.threads)
        order = list(backends)
        times: Dict[str, List[float]] = {k: [] for k in order}
        cpu: Dict[str, List[float]] = {k: [] for k in order}
        clock = time.thread_time if args.threads == 1 else time.process_time
        load: List[float] = []
        for it in range(args.warmup + args.iters):
            rot = order[it % len(order):] + order[: it % len(order)]
            for k in rot:
                t, c = time.perf_counter(), clock()
                backends[k].run(x)
                if it >= args.warmup:
                    times[k].append(time.perf_counter() - t)
                    cpu[k].append(clock() - c)
            load.append(os.getloadavg()[0])
            print(f"round {it + 1}/{args.warmup + args.iters}", file=sys.stderr, flush=True)
        f_ms = statistics.median(times["float"]) * 1e3
        results["float"] = {"ms": round(f_ms, 1)}
        for name in paths:
            ratios = [f / q for f, q in zip(times["float"], times[name])]
            cpu_ratios = [f / q for f, q in zip(cpu["float"], cpu[name])]
            results[name].update(ms=round(statistics.median(times[name]) * 1e3, 1),
                                 speedup=round(statistics.median(ratios), 3),
                                 speedup_p25_p75=[round(float(np.percentile(ratios, 25)), 3),
                                                  round(float(np.percentile(ratios, 75)), 3)],
                                 cpu_speedup=round(statistics.median(cpu_ratios), 3),
                                 cpu_speedup_p25_p75=[round(float(np.percentile(cpu_ratios, 25)), 3),
                                                      round(float(np.percentile(cpu_ratios, 75)), 3)])
        results["_machine"] = {"cpu": cpu_int8_support(), "threads": args.threads,
                               "load1_min_max": [min(load), max(load)], "model": str(fpath),
                               "imgsz": list(info.imgsz), "rounds": args.iters}

    print("| variant | keep float | INT8 ms | speed-up wall (p25-p75) | speed-up CPU time (p25-p75) "
          "| agreement F1 | P | R |")
    print("|---|---|---|---|---|---|---|---|")
    if "float" in results:
        print(f"| float | all | {results['float']['ms']} | 1.00 | 1.00 | | | |")

    def spread(r: Dict[str, object], key: str) -> str:
        if key not in r:
            return ""
        lo, hi = r[f"{key}_p25_p75"]  # type: ignore[misc]
        return f"{r[key]:.2f} ({lo:.2f}-{hi:.2f})"

    def measured(a: Dict[str, object], key: str) -> str:
        """An agreement figure; "-" where it is undefined (no boxes at ``--conf``: NaN, None in JSON)."""
        return "" if not a else "-" if a.get(key) is None else str(a[key])

    for name in paths:
        r = results[name]
        a = r.get("agreement") or {}
        shipped = " (shipped default)" if parse_keep_float(VARIANTS[name]) == DEFAULT_KEEP_FLOAT else ""
        print(f"| {name}{shipped} | {r['keep_float']} | {r.get('ms', '')} | {spread(r, 'speedup')} "
              f"| {spread(r, 'cpu_speedup')} | {measured(a, 'f1')} | {measured(a, 'precision')} "
              f"| {measured(a, 'recall')} |")
    if "_machine" in results:
        print(f"\nCPU: {results['_machine']['cpu']}; {args.threads} threads; "
              f"load average (1 min) {results['_machine']['load1_min_max']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
