"""Edge daemon benchmark: N synthetic streams through the real daemon with YOLOv5s INT8.

Measures, in one run on this CPU: bare-model frames/s (preprocess + infer +
postprocess in a loop, same detector settings and batch), daemon frames/s,
per-stage medians, p99 capture→sink frame latency, pipeline efficiency (daemon
÷ bare, target >= 0.9) and hardness + policy cost per frame (target <= 1 ms), also
with the motion signal on 1280x720 frames (``edgewise.hardness.measure_cost``).
Prints a Markdown table, under a line with the CPU's flags (its INT8 kernels' speed depends on
them) and the load average.

    .venv/bin/python bench/edge.py --streams 2 --frames 60
    .venv/bin/python bench/edge.py --streams 2 --frames 24 --size 1280x720   # the camera world's frames
    .venv/bin/python bench/edge.py --live --cameras 1,2,4,8 --fps 5   # RTSP cameras (bench/_edge_live.py)
    .venv/bin/python bench/edge.py --paced    # CPU ms/frame at camera pace vs inference (bench/_edge_cpu.py)

The model is an architecture-exact YOLOv5s (seeded random weights, 80 classes)
at 640, quantized to INT8 (static QDQ, calibrated on opencv-doc's vtest.avi),
cached under .cache/bench-models.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from bench import _edge_cpu, _edge_live  # noqa: E402  (after the sys.path line above)

CACHE = ROOT / ".cache" / "bench-models"
VTEST = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")


def int8_model(imgsz: int) -> Path:
    from edgewise_tools.models import build_onnx
    from edgewise_tools.models.quantize import quantize

    CACHE.mkdir(parents=True, exist_ok=True)
    fp = CACHE / f"yolov5s-{imgsz}.onnx"
    q = CACHE / f"yolov5s-{imgsz}-int8.onnx"
    if not q.exists():
        if not fp.exists():
            print(f"building {fp.name} ...", file=sys.stderr)
            build_onnx("yolov5s", imgsz=imgsz, nc=80, path=fp, seed=0)
        print(f"quantizing to {q.name} (8 calibration frames) ...", file=sys.stderr)
        quantize(fp, VTEST, samples=8, out_path=q, holdout=0)
    return q


#: the default weights plus the motion signals, so the daemon's hardness stage includes the
#: motion detector (examples/policy.yaml's signals)
POLICY = """apiVersion: edgewise/v1
kind: EscalationPolicy
metadata: {name: bench}
spec:
  threshold: 0.5
  signals:
    weights: {uncertain_count: 1.0, missed_object: 1.0, tracker_disagreement: 0.8, entropy: 0.6, margin: 0.6,
              small_boxes: 0.4, mean_conf: 0.3, motion_blobs: 0.8, motion: 0.4}
"""


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--frames", type=int, default=60, help="frames per stream")
    ap.add_argument("--imgsz", type=int, default=640)
    ap.add_argument("--size", default="640x480", help="synthetic frame size WxH")
    ap.add_argument("--batch", type=int, default=1, help="max batch (daemon) = batch (bare)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="", help="ONNX model (default: build YOLOv5s INT8; live: YOLOv5n 160)")
    _edge_live.add_arguments(ap)
    _edge_cpu.add_arguments(ap)
    args = ap.parse_args()
    if args.live:
        return _edge_live.live_main(args)
    if args.paced:
        return _edge_cpu.paced_main(args)

    from edge.daemon import EdgeDaemon
    from edge.settings import load_settings
    from edge.sources.synthetic import SyntheticSource
    from edgewise.hardness import measure_cost
    from edgewise.runtime.detector import Detector
    from edgewise_tools.cpu import simd_summary
    from tests.edge.helpers import read_jsonl, settings_yaml

    model = Path(args.model) if args.model else int8_model(args.imgsz)
    tmp = Path(tempfile.mkdtemp(prefix="ew-bench-edge-"))

    # --- bare model, same frames, same batch; measured before and after the daemon
    # so load drift on a shared machine shows up (and is averaged) ----------------
    det = Detector.from_file(model, backend="onnxruntime", threads=args.threads, source="edge")
    src = SyntheticSource("bare", args.size)
    frames = [src.read() for _ in range(16)]
    n_bare = max(args.batch * 4, min(args.streams * args.frames // 2, 24))

    def bare() -> float:
        b, m = det.preprocess(frames[:args.batch])
        det.postprocess(det.infer(b), m)  # warm-up
        t0 = time.perf_counter()
        done = 0
        while done < n_bare:
            imgs = [frames[(done + k) % len(frames)] for k in range(args.batch)]
            batch, metas = det.preprocess(imgs)
            det.postprocess(det.infer(batch), metas)
            done += len(imgs)
        return done / (time.perf_counter() - t0)

    bare_before = bare()

    # --- the daemon --------------------------------------------------------------
    (tmp / "policy.yaml").write_text(POLICY)
    s = load_settings(str(settings_yaml(
        tmp / "edge.yaml", device_id="bench",
        streams=[{"id": f"s{i}", "kind": "synthetic", "uri": args.size, "max_frames": args.frames}
                 for i in range(args.streams)],
        model={"path": str(model), "backend": "onnxruntime", "threads": args.threads,
               "max_batch": args.batch},
        policy_file=str(tmp / "policy.yaml"),
        spool={"path": str(tmp / "spool.db")},
        sinks={"jsonl": str(tmp / "out.jsonl")}, metrics={"port": -1},
    )), env={})
    d = EdgeDaemon(s)
    asyncio.run(d.run())
    bare_after = bare()
    det.close()
    bare_fps = (bare_before + bare_after) / 2.0
    recs = read_jsonl(tmp / "out.jsonl")
    shutil.rmtree(tmp, ignore_errors=True)  # settings, spool and records of this run only
    assert len(recs) == args.streams * args.frames, f"{len(recs)} records"
    warm = sorted(recs, key=lambda r: r["emit_unix_ns"])[max(2, args.batch):]
    span = (warm[-1]["emit_unix_ns"] - warm[0]["emit_unix_ns"]) / 1e9
    daemon_fps = (len(warm) - 1) / span
    stages = ["read", "queue", "preprocess", "infer", "postprocess", "hardness_policy", "total"]
    med = {k: statistics.median(r["latency_ms"][k] for r in warm) for k in stages}
    p99 = pct([r["latency_ms"]["total"] for r in warm], 99)
    hp = [r["latency_ms"]["hardness_policy"] for r in warm]
    eff = daemon_fps / bare_fps

    print(f"\n### Edge daemon: {args.streams} synthetic stream(s) {args.size}, {model.name} @ {det.info.imgsz[0]}, "
          f"batch {args.batch}, {args.threads} threads; CPU {simd_summary()}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| metric | value | target |")
    print("|---|---|---|")
    print(f"| bare model frames/s (pre+infer+post; before / after the daemon) | {bare_fps:.2f} "
          f"({bare_before:.2f} / {bare_after:.2f}) | |")
    print(f"| daemon frames/s | {daemon_fps:.2f} | |")
    print(f"| pipeline efficiency | {eff:.3f} | >= 0.9 |")
    for k in stages[:-1]:
        print(f"| median {k} ms | {med[k]:.2f} | |")
    print(f"| median frame latency ms (capture→sink, saturated) | {med['total']:.1f} | |")
    print(f"| p99 frame latency ms (capture→sink, saturated) | {p99:.1f} | |")
    age = [r["latency_ms"]["frame_age"] for r in warm]
    print(f"| frame age at inference ms (median / p99; synthetic: from the read) | {statistics.median(age):.1f} / "
          f"{pct(age, 99):.1f} | |")
    print(f"| hardness + policy ms/frame (median / p99) | {statistics.median(hp):.3f} / {pct(hp, 99):.3f} | <= 1 |")
    print(f"| frames | {len(recs)} | |")
    # the hardness stage with the motion signal at camera resolution (CPU time, the
    # daemon's own functions on 20 boxes of 80 classes and noisy 1280x720 frames)
    cost = measure_cost(n_frames=300, n_boxes=20, nc=80, frame_size=(1280, 720))
    print(f"| hardness stage with motion at 1280x720, CPU ms/frame (signals + motion + policy) | "
          f"{cost['total_us'] / 1e3:.3f} ({cost['signals_us'] / 1e3:.3f} + {cost['motion_us'] / 1e3:.3f} + "
          f"{cost['policy_us'] / 1e3:.3f}) | <= 1 |")
    carry_ms, kept = carry_cost()
    print(f"| carrying 20 cloud boxes (16-128 px) at 1280x720, CPU ms/frame (track + combine; {kept} still "
          f"carried after 30 frames) | {carry_ms:.3f} | |")
    print(f"| carry-state features (carry-aware policies only: 20 edge boxes, 20 carried, 8 blobs, the region "
          f"proposals), CPU ms/frame | {carry_state_cost():.3f} | |")
    return 0


def carry_state_cost(frames: int = 300, size: Tuple[int, int] = (1280, 720)) -> float:
    """CPU ms per frame of what a carry-aware policy adds to the hardness stage
    (``edge.deciding``): the uncertain boxes, the region proposals of examples/policy.yaml's
    payload and :func:`edgewise.hardness.carrystate.carry_features`, on 20 edge boxes, 20
    carried ones and 8 unexplained blobs."""
    import numpy as np

    from edgewise.detections import Detections
    from edgewise.hardness.carrystate import carry_features
    from edgewise.hardness.signals import SignalConfig, score_bands
    from edgewise.policy.loading import load_policy

    payload = load_policy(ROOT / "examples" / "policy.yaml").spec.payload
    rng = np.random.default_rng(1)
    w, h = size

    def boxes(n: int) -> np.ndarray:
        x0, y0, side = rng.uniform(0, w - 130, n), rng.uniform(0, h - 130, n), rng.uniform(16, 128, n)
        return np.stack([x0, y0, x0 + 0.7 * side, y0 + side], 1).astype(np.float32)

    names = tuple(str(i) for i in range(80))
    cases = []
    for _ in range(frames):
        edge = Detections(boxes=boxes(20), scores=rng.uniform(0.25, 0.95, 20).astype(np.float32),
                          class_ids=rng.integers(0, 80, 20).astype(np.int32), names=names, source="edge")
        carried = Detections(boxes=boxes(20), scores=np.full(20, 0.8, np.float32),
                             class_ids=rng.integers(0, 80, 20).astype(np.int32), names=names, source="carried")
        cases.append((edge, carried, boxes(8)))
    cfg = SignalConfig()
    last = None
    t0 = time.process_time()
    for i, (edge, carried, blobs) in enumerate(cases):
        band = score_bands(edge, cfg)
        proposed = payload.proposals(edge, blobs, size, band)
        carry_features(edge, edge.scored_within(*band), carried, i % 30, blobs, proposed, last)
        last = proposed
    return (time.process_time() - t0) * 1e3 / frames


def carry_cost(n_boxes: int = 20, frames: int = 30, size: Tuple[int, int] = (1280, 720)) -> Tuple[float, int]:
    """CPU ms per frame of carrying ``n_boxes`` cloud boxes (edgewise.carrying: one tracker step
    and the combine with as many edge boxes), on a textured 1280x720 scene whose sensor noise
    changes every frame, and how many boxes were still carried at the end."""
    import cv2
    import numpy as np

    from edgewise.carrying import CarryConfig, combine, seed, step
    from edgewise.detections import Detections

    rng = np.random.default_rng(0)
    w, h = size
    base = cv2.GaussianBlur(rng.integers(0, 255, (h, w), np.uint8), (0, 0), 3)
    base = cv2.normalize(base, None, 0, 255, cv2.NORM_MINMAX)
    pics = [cv2.cvtColor(np.clip(base + rng.normal(0, 4, base.shape), 0, 255).astype(np.uint8),
                         cv2.COLOR_GRAY2BGR) for _ in range(frames + 1)]
    sides = rng.uniform(16, 128, n_boxes)
    x0, y0 = rng.uniform(0, w - 130, n_boxes), rng.uniform(0, h - 130, n_boxes)
    boxes = np.stack([x0, y0, x0 + 0.7 * sides, y0 + sides], 1).astype(np.float32)
    names = tuple(str(i) for i in range(80))
    cloud = Detections(boxes=boxes, scores=np.full(n_boxes, 0.8, np.float32),
                       class_ids=np.arange(n_boxes, dtype=np.int32) % 80, names=names, source="cloud")
    edge = Detections(boxes=boxes + 3, scores=np.full(n_boxes, 0.5, np.float32),
                      class_ids=np.arange(n_boxes, dtype=np.int32) % 80, names=names, source="edge")
    cfg = CarryConfig(frames=30, min_match=0.5)
    state = seed(pics[0], cloud, cfg)
    t0 = time.process_time()
    for pic in pics[1:]:
        state = step(state, pic, cfg)
        combine(edge, state.detections())
    return (time.process_time() - t0) * 1e3 / frames, len(state)


if __name__ == "__main__":
    sys.exit(main())
