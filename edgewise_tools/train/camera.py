"""Package and score the camera reference pair: ``python -m edgewise_tools.train.camera --run runs/camera``.

``scripts/train_camera.sh`` writes the run folder (:data:`DATA` splits of the ``camera``
preset at 1280x720, ``RUN/edge`` and ``RUN/cloud``, each fine-tuned from the previous
shipped pair). This step makes the files the demo, the Jetson bundle and the benches
load (fixed names in ``models/``):

* ``edge.onnx``: ``RUN/edge/best.pt`` exported at the camera's aspect (``--edge-shape``,
  default 192x320: a 1280x720 frame letterboxes to 320x180 with 6 px of padding instead
  of 140, the same pixels the square training size saw, 40% less compute);
  ``edge-int8.onnx``: its static INT8 build (calibrated on training frames, agreement
  measured on validation frames, ``edgewise_tools.models.quantize``);
* ``cloud.onnx``: ``RUN/cloud/best.pt`` exported with a symbolic height/width and the
  metadata ``input_size: native``, so worker and evaluator run it at each image's
  native size (input size ``auto``: a whole frame as 1280x736, a region at its own size);

then scores all three (:func:`~edgewise_tools.train.reference.score_onnx`: mAP@0.5, P/R/F1
at 0.25, and per object-size bucket) on the held-out ``camera`` test split (the headline)
and, for continuity, on the ``episodes`` test split of the previous pair, and writes
``models/metrics.json``. Scores are cached under ``RUN/scores`` while a model file is
unchanged, so a rerun after an interrupted one only does what is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from edgewise_tools.train.reference import SIZE_BUCKETS, _cached_score

#: run-folder layout of scripts/train_camera.sh
DATA = {"train": "cam-train", "val": "cam-val", "test": "cam-test", "policy": "cam-policy",
        "train_crops": "cam-train-crops", "val_crops": "cam-val-crops", "episodes_test": "tune-test"}
STAGES = ("edge", "cloud")
TESTS = {"camera": DATA["test"], "episodes": DATA["episodes_test"]}


def _newer(dst: Path, src: Path) -> bool:
    return dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime


def export_pair(run: Path, models: Path, edge_shape: Tuple[int, int]) -> Dict[str, Path]:
    """``models/edge.onnx`` (``edge_shape`` input) and ``models/cloud.onnx`` (symbolic H/W) from
    the stages' ``best.pt``; a file newer than its checkpoint is kept."""
    from edgewise_tools.models.export import export_onnx
    from edgewise_tools.train.onnxinit import export_model_native
    from edgewise_tools.train.trainer import load_checkpoint

    models.mkdir(parents=True, exist_ok=True)
    out = {"edge": models / "edge.onnx", "cloud": models / "cloud.onnx"}
    for stage, dst in out.items():
        ck = run / stage / "best.pt"
        if not ck.exists():
            raise FileNotFoundError(f"{ck}: the {stage} stage has not written a checkpoint yet "
                                    "(run scripts/train_camera.sh first)")
        if _newer(dst, ck):
            continue
        model = load_checkpoint(ck)
        summary = json.loads((run / stage / "summary.json").read_text()) if (run / stage / "summary.json").exists() \
            else {}
        meta = {"edgewise_val_map50": f"{summary.get('best_map50', float('nan')):.4f}",
                "edgewise_world": "camera"}
        names: List[str] = list(model.names)  # type: ignore[arg-type]  # set by load_checkpoint
        if stage == "edge":
            export_onnx(model, dst, imgsz=edge_shape, names=names, arch=model.arch, extra_metadata=meta)
        else:
            export_model_native(model, dst, int(summary.get("imgsz", 320)), names, model.arch, meta)
    return out


def quantize_edge(run: Path, edge: Path, samples: int, threads: int) -> Path:
    """``edge-int8.onnx`` next to ``edge`` (kept when newer); the report goes to ``RUN/quantize.json``."""
    from edgewise_tools.models.quantize import quantize

    int8 = edge.with_name(edge.stem + "-int8.onnx")
    if _newer(int8, edge):
        return int8
    t0 = time.monotonic()
    report = quantize(edge, run / "data" / DATA["train"] / "images", samples=samples, out_path=int8, holdout=50,
                      holdout_source=run / "data" / DATA["val"] / "images", threads=threads)
    (run / "quantize.json").write_text(json.dumps({"seconds": round(time.monotonic() - t0, 1),
                                                   "report": report.as_dict()}, indent=1, default=str))
    return int8


def package(run: Path, models: Path, edge_shape: Tuple[int, int] = (192, 320), calib_samples: int = 200,
            threads: int = 1) -> Dict[str, Any]:
    """Export, quantize and score the pair; writes ``models/metrics.json`` and returns it."""
    files = export_pair(run, models, edge_shape)
    int8 = quantize_edge(run, files["edge"], calib_samples, threads)
    todo = [("edge_float", files["edge"]), ("edge_int8", int8), ("cloud_float", files["cloud"])]
    tests = {mix: run / "data" / folder for mix, folder in TESTS.items() if (run / "data" / folder).is_dir()}
    by_test: Dict[str, Dict[str, Any]] = {mix: {} for mix in tests}
    with ProcessPoolExecutor(max_workers=len(todo)) as pool:  # one share of the CPU each
        futs = {(mix, name): pool.submit(_cached_score, path, folder, threads, run / "scores")
                for mix, folder in tests.items() for name, path in todo}
        for (mix, name), fut in futs.items():
            by_test[mix][name] = fut.result()
            print(mix, name, json.dumps(by_test[mix][name]), file=sys.stderr)
    summary: Dict[str, Any] = {"world": "camera", "size_buckets": [list(b[:2]) for b in SIZE_BUCKETS],
                               "edge_input": list(edge_shape), "cloud_input": "native", "tests": {}}
    for mix, folder in tests.items():
        meta = json.loads((folder / "dataset.json").read_text())
        meta.pop("difficulty", None)
        summary["tests"][mix] = {"data": {"path": str(folder), **meta}, "results": by_test[mix]}
    summary["training"] = {k: json.loads((run / k / "summary.json").read_text())
                           for k in STAGES if (run / k / "summary.json").exists()}
    for k in summary["training"].values():
        k.pop("history", None)
    if (run / "quantize.json").exists():
        summary["quantize"] = json.loads((run / "quantize.json").read_text())
    cam = by_test.get("camera", {})
    if "edge_int8" in cam and "cloud_float" in cam:
        e, c = cam["edge_int8"], cam["cloud_float"]
        summary["gap"] = {"edge_int8_over_cloud_f1": round(e["all"]["f1@0.25"] / max(c["all"]["f1@0.25"], 1e-9), 4),
                          "edge_int8_over_cloud_map50": round(e["map50"] / max(c["map50"], 1e-9), 4)}
    (models / "metrics.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def markdown_table(summary: Dict[str, Any]) -> str:
    """The model card's table: all objects, then recall per object-size bucket."""
    buckets = [b[0] for b in SIZE_BUCKETS]
    rows = ["| test | model | file size | mAP@0.5 | F1@0.25 | " + " | ".join(f"recall {b}" for b in buckets)
            + " | ms/frame (1 thread) |", "|---|---|---|---|---|" + "---|" * len(buckets) + "---|"]
    for mix, test in summary["tests"].items():
        for name, r in test["results"].items():
            rec = " | ".join(f"{r['by_size'][b]['recall@0.25']:.3f} ({r['by_size'][b]['objects']})" for b in buckets)
            rows.append(f"| {mix} | {name} (`{r['model']}`) | {r['size_bytes'] / 1e6:.1f} MB | {r['map50']:.3f} | "
                        f"{r['all']['f1@0.25']:.3f} | {rec} | {r['ms_per_frame_1thread']:.1f} |")
    if "gap" in summary:
        g = summary["gap"]
        rows.append("")
        rows.append(f"Camera test: edge INT8 / cloud F1 = {g['edge_int8_over_cloud_f1']:.3f}, "
                    f"mAP@0.5 = {g['edge_int8_over_cloud_map50']:.3f} (target <= 0.85 each).")
    return "\n".join(rows)


def _shape(text: str) -> Tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--edge-shape {text!r}: expected H,W such as 192,320") from None
    if min(h, w) < 32 or h % 32 or w % 32:
        raise argparse.ArgumentTypeError(f"--edge-shape {text!r}: height and width must be multiples of 32")
    return h, w


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgewise_tools.train.camera", description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="run folder of scripts/train_camera.sh")
    p.add_argument("--models", default=Path("models"), type=Path, help="where the ONNX files go")
    p.add_argument("--edge-shape", type=_shape, default=(192, 320), help="edge model input H,W (192,320)")
    p.add_argument("--calib-samples", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    summary = package(args.run, args.models, args.edge_shape, args.calib_samples, args.threads)
    print(markdown_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
