"""Per-stage runtime benchmark: JPEG decode, letterbox, inference, decode+NMS.

YOLOv5s at 640 (architecture-exact, random weights) in float32 and INT8 (static
QDQ from ``edgewise_tools.models.quantize``) on this CPU, for batches of 1, 4 and 8
real frames (``vtest.avi`` from Debian's opencv-doc, JPEG-encoded at quality 90
as the edge sends them). Float and INT8 runs are interleaved iteration by
iteration so both see the same machine load. Prints one Markdown table of
per-image medians plus the ratios the foundation issue asks for:

* pre+post processing (letterbox + decode/NMS) as % of model time,
* INT8 speed-up over float,
* decode + NMS of a full 640x640 head (25,200 x 85) shaped like a trained
  model's output (a few hundred candidates around 20 objects; target < 3 ms),
* what this CPU offers INT8 kernels (VNNI or not: it decides the speed-up), and the
  INT8-vs-float detection agreement of the shipped edge pair (the daemon's default model,
  ``models/camera/edge-int8.onnx``, against ``models/camera/edge.onnx``) on generated held-out
  scenes (the random-weight YOLOv5s has no detections worth comparing).

Usage::

    python bench/runtime.py                       # full run (minutes, CPU heavy)
    python bench/runtime.py --iters 5 --quick     # yolov5n @ 320, smoke run
    python bench/runtime.py --int8 yolov5s-int8.onnx --float yolov5s.onnx
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from edge.settings import ModelSettings  # noqa: E402  (the package, not bench/edge.py: see above)
from edgewise.runtime import DecodeParams, Detector, decode  # noqa: E402

VIDEO = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")


def median_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1000.0


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def read_frames(n: int, size: Optional[int]) -> List[np.ndarray]:
    """``n`` real frames from vtest.avi (or synthetic ones when it is absent)."""
    frames: List[np.ndarray] = []
    cap = cv2.VideoCapture(str(VIDEO)) if VIDEO.exists() else None
    while cap is not None and len(frames) < n:
        ok, fr = cap.read()
        if not ok:
            break
        frames.append(fr)
    if cap is not None:
        cap.release()
    rng = np.random.default_rng(0)
    while len(frames) < n:
        frames.append(rng.integers(0, 255, (576, 768, 3), dtype=np.uint8))
    return frames


def synthetic_head(n_rows: int = 25200, nc: int = 80, objects: int = 20, seed: int = 0) -> np.ndarray:
    """A head output shaped like a trained YOLOv5's: low objectness almost everywhere,
    ~15 high-objectness rows (same class, jittered boxes) around each object."""
    rng = np.random.default_rng(seed)
    head = np.zeros((1, n_rows, 5 + nc), np.float32)
    head[0, :, 0:2] = rng.uniform(0, 640, (n_rows, 2))
    head[0, :, 2:4] = rng.uniform(5, 200, (n_rows, 2))
    head[0, :, 4] = 1 / (1 + np.exp(-rng.normal(-7, 2, n_rows)))
    head[0, :, 5:] = 1 / (1 + np.exp(-rng.normal(-5, 2, (n_rows, nc))))
    for o in rng.choice(n_rows, objects, replace=False):
        nb = rng.choice(n_rows, 15, replace=False)
        head[0, nb, :4] = head[0, o, :4] + rng.normal(0, 3, (15, 4))
        head[0, nb, 4] = rng.uniform(0.3, 0.95, 15)
        head[0, nb, 5 + rng.integers(nc)] = rng.uniform(0.6, 0.99, 15)
    return head


def build_models(args: argparse.Namespace) -> Dict[str, Path]:
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    fpath = Path(args.float) if args.float else cache / f"{args.arch}-{args.imgsz}-80.onnx"
    if not fpath.exists():
        from edgewise_tools.models import build_onnx

        print(f"building {fpath} ...", file=sys.stderr)
        build_onnx(args.arch, imgsz=args.imgsz, nc=80, path=fpath, seed=0)
    models = {"float32": fpath}
    if args.no_int8:
        return models
    try:
        from edgewise_tools.models.quantize import DEFAULT_KEEP_FLOAT, quantize
    except ImportError:
        if not args.int8:
            sys.exit("edgewise_tools.models.quantize is not available: pass --int8 PATH to an INT8 model")
        DEFAULT_KEEP_FLOAT = ()
    recipe = "-".join(DEFAULT_KEEP_FLOAT) or "all"  # a new default recipe is a new file
    qpath = Path(args.int8) if args.int8 else cache / f"{args.arch}-{args.imgsz}-80-int8-{recipe}.onnx"
    if not qpath.exists():
        print(f"quantizing {qpath} with {args.calib_samples} frames of {VIDEO} ...", file=sys.stderr)
        quantize(fpath, VIDEO, samples=args.calib_samples, out_path=qpath, holdout=0,
                 threads=args.threads or 0)
    models["int8"] = qpath
    return models


def run(args: argparse.Namespace) -> str:
    models = build_models(args)
    dets = {k: Detector.from_file(p, backend="onnxruntime", threads=args.threads or None)
            for k, p in models.items()}
    bmax = max(args.batches)
    frames = read_frames(bmax, None)
    jpegs = [cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, 90])[1] for f in frames]

    t_jpeg: List[float] = []
    t_pre: Dict[int, List[float]] = {b: [] for b in args.batches}
    t_inf: Dict[str, Dict[int, List[float]]] = {k: {b: [] for b in args.batches} for k in dets}
    t_post: Dict[str, Dict[int, List[float]]] = {k: {b: [] for b in args.batches} for k in dets}
    any_det = next(iter(dets.values()))
    for it in range(args.warmup + args.iters):
        record = it >= args.warmup
        dt = timed(lambda: [cv2.imdecode(j, cv2.IMREAD_COLOR) for j in jpegs]) / len(jpegs)
        if record:
            t_jpeg.append(dt)
        for b in args.batches:
            imgs = frames[:b]
            holder: Dict[str, object] = {}
            dt = timed(lambda: holder.update(pm=any_det.preprocess(imgs)))
            batch, metas = holder["pm"]  # type: ignore[misc]
            if record:
                t_pre[b].append(dt / b)
            for name, det in dets.items():  # interleaved: same load for float and INT8
                out: Dict[str, np.ndarray] = {}
                dt = timed(lambda: out.update(raw=det.infer(batch)))
                if record:
                    t_inf[name][b].append(dt / b)
                dt = timed(lambda: det.postprocess(out["raw"], metas))
                if record:
                    t_post[name][b].append(dt / b)
        print(f"iteration {it + 1}/{args.warmup + args.iters}", file=sys.stderr)

    head = synthetic_head()
    names = [str(i) for i in range(80)]
    params = DecodeParams()
    n_kept = len(decode(head, [None], names, params)[0])
    t_head = [timed(lambda: decode(head, [None], names, params)) for _ in range(max(50, args.iters * 5))]

    lines = []
    info = any_det.info
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines.append(
        f"{info.path.name} @ {info.imgsz[0]}, {args.threads or 'default'} intra-op threads, "
        f"{args.iters} iterations (medians, ms per image), load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    lines.append("")
    lines.append("| model | batch | JPEG decode | letterbox | inference | decode+NMS | pre+post % of model | INT8 speed-up |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for name in dets:
        for b in args.batches:
            inf = median_ms(t_inf[name][b])
            pre = median_ms(t_pre[b])
            post = median_ms(t_post[name][b])
            speed = ""
            if name == "int8" and "float32" in dets:
                speed = f"{median_ms(t_inf['float32'][b]) / inf:.2f}x"
            lines.append(
                f"| {name} | {b} | {median_ms(t_jpeg):.2f} | {pre:.2f} | {inf:.1f} | {post:.2f} | "
                f"{100 * (pre + post) / inf:.1f}% | {speed} |"
            )
    lines.append("")
    lines.append(
        f"decode+NMS of a full 640x640 head (25,200 x 85, {int((head[0, :, 4] > params.conf_thres).sum())} "
        f"candidates over conf {params.conf_thres}, {n_kept} kept): median {median_ms(t_head):.2f} ms "
        f"(target < 3 ms)"
    )
    from edgewise.runtime.cpu import cpu_int8_support

    lines.append(f"CPU: {cpu_int8_support()}")
    if args.agreement_frames > 0:
        lines.append(shipped_pair_agreement(args.agreement_frames, args.threads))
    return "\n".join(lines)


def shipped_pair_agreement(frames: int, threads: int) -> str:
    """INT8-vs-float agreement of the shipped edge model (the daemon's default ``model.path``, the
    camera pair's ``edge-int8.onnx`` in ONNX Runtime's CPU layout; not the Jetson bundle's default,
    laid out for TensorRT) against its float model, on ``frames`` generated validation frames of its
    world (1280x720 camera scenes, as its quantization report was checked)."""
    import tempfile

    from edgewise.synth import SynthJob, generate, load_difficulty
    from edgewise_tools.models.calibration import open_frames
    from edgewise_tools.models.heldout import check_agreement

    i8 = ROOT / ModelSettings().path
    f32 = i8.with_name("edge.onnx")
    if not (f32.exists() and i8.exists()):
        return f"agreement: {f32} or {i8} missing"
    with tempfile.TemporaryDirectory(prefix="edgewise-bench-") as tmp:
        streams = -(-frames // 30)
        generate(SynthJob(out=tmp, frames=30, streams=streams, seed=12, split="val", width=1280, height=720,
                          difficulty=load_difficulty("camera")))
        agreement, speed = check_agreement(f32, i8, open_frames(Path(tmp) / "images"), range(frames),
                                           threads=threads)
    sp = f"; {speed.summary()}" if speed is not None else ""
    return (f"shipped edge pair ({f32.relative_to(ROOT)} -> {i8.name}, {frames} camera val frames), conf 0.25: "
            f"{agreement.summary()}{sp}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per stage (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up iterations (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (0 = default)")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8],
                    help="batch sizes, comma separated (default 1,4,8)")
    ap.add_argument("--arch", default="yolov5s")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--float", help="float ONNX model to use instead of building one")
    ap.add_argument("--int8", help="INT8 ONNX model to use instead of quantizing the float one")
    ap.add_argument("--no-int8", action="store_true", help="float only")
    ap.add_argument("--calib-samples", type=int, default=32, help="calibration frames when quantizing")
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "bench"), help="where built models are kept")
    ap.add_argument("--quick", action="store_true", help="yolov5n @ 320: a fast smoke run")
    ap.add_argument("--agreement-frames", type=int, default=100,
                    help="held-out scenes for the shipped edge pair's INT8 agreement (0 = skip)")
    args = ap.parse_args(argv)
    if args.quick:
        args.arch, args.imgsz = "yolov5n", 320
    print(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
