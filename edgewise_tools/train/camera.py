"""Package and score the camera reference pair: ``python -m edgewise_tools.train.camera --run runs/camera``.

``scripts/train_camera.sh`` writes the run folder (:data:`DATA` splits of the ``camera``
preset at 1280x720, the edge's resolution steps ``RUN/edge-<size>`` and ``RUN/cloud``,
fine-tuned from the previous shipped pair). This step makes the files the demo, the Jetson bundle and the benches
load (fixed names in ``models/``):

* ``edge.onnx``: the last edge stage's ``best.pt`` (``RUN/edge-<size>``, ``--edge-stage``)
  exported at the camera's aspect (:func:`edge_shape`: a 1280x720 frame at a square
  training size of 416 letterboxes to 416x234, exported as 256x416 instead of 416x416,
  the same pixels the square training size saw at 60% of the compute);
  ``edge-int8.onnx``: its static INT8 build (calibrated on training frames, agreement
  measured on validation frames, ``edgewise_tools.models.quantize``) in ONNX Runtime's CPU
  layout, and ``edge-int8-trt.onnx`` in TensorRT's (symmetric int8, float biases: the Jetson
  bundle's model, ``edgewise.runtime.opsets.tensorrt_problems``);
* ``cloud.onnx``: ``RUN/cloud/best.pt`` exported with a symbolic height/width and the
  metadata ``input_size: native``, so worker and evaluator run it at each image's
  native size (input size ``auto``: a whole frame as 1280x736, a region at its own size);

then picks each model's score threshold for the best F1 on the validation split and writes it
into the file (:func:`operating_points`, metadata ``edgewise_conf_thres``: the runtime's default
threshold for that model), and scores all three (:func:`~edgewise_tools.train.reference.score_onnx`:
mAP@0.5, P/R/F1 at 0.25 and at the model's threshold, and per object-size bucket) on the held-out ``camera`` test split (the headline)
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from edgewise.runtime.metadata import CONF_KEY, load_model_info
from edgewise_tools.train.reference import SIZE_BUCKETS, _cached_score

#: run-folder layout of scripts/train_camera.sh
DATA = {"train": "cam-train", "val": "cam-val", "test": "cam-test", "policy": "cam-policy",
        "train_crops": "cam-train-crops", "val_crops": "cam-val-crops", "episodes_test": "tune-test"}
TESTS = {"camera": DATA["test"], "episodes": DATA["episodes_test"]}


def _newer(dst: Path, src: Path) -> bool:
    return dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime


def edge_shape(imgsz: int, frame_hw: Tuple[int, int]) -> Tuple[int, int]:
    """The edge model's export input for frames of ``frame_hw`` trained at square ``imgsz``: the
    letterboxed frame's long side stays ``imgsz``, the short side rounds up to a multiple of 32
    (the detector's stride). 1280x720 at 320 gives 192x320, at 416 gives 256x416."""
    if imgsz < 32 or imgsz % 32:
        raise ValueError(f"edge training size {imgsz}: expected a multiple of 32")
    h, w = frame_hw
    short = -(-min(h, w) * imgsz // max(h, w))  # ceil
    short = -(-short // 32) * 32
    return (short, imgsz) if w >= h else (imgsz, short)


def edge_stages(run: Path) -> List[str]:
    """The edge's resolution steps in ``run`` (``edge-<size>`` folders), smallest size first."""
    return sorted((d.name for d in run.glob("edge-*") if d.name[5:].isdigit()), key=lambda n: int(n[5:]))


def export_pair(run: Path, models: Path, edge_stage: str, shape: Optional[Tuple[int, int]] = None) -> Dict[str, Path]:
    """``models/edge.onnx`` (``RUN/edge_stage``, input ``shape``, by default :func:`edge_shape` of its
    training size and the training frames) and ``models/cloud.onnx`` (symbolic H/W) from the
    stages' ``best.pt``; a file newer than its checkpoint is kept."""
    from edgewise_tools.models.export import export_onnx
    from edgewise_tools.train.onnxinit import export_model_native
    from edgewise_tools.train.trainer import load_checkpoint

    models.mkdir(parents=True, exist_ok=True)
    out = {"edge": models / "edge.onnx", "cloud": models / "cloud.onnx"}
    for kind, dst in out.items():
        stage = edge_stage if kind == "edge" else kind
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
        if kind == "edge":
            if shape is None:
                frames = json.loads((run / "data" / DATA["train"] / "dataset.json").read_text())
                shape = edge_shape(int(summary.get("imgsz", 320)), (int(frames["height"]), int(frames["width"])))
            export_onnx(model, dst, imgsz=shape, names=names, arch=model.arch, extra_metadata=meta)
        else:
            export_model_native(model, dst, int(summary.get("imgsz", 320)), names, model.arch, meta)
    return out


#: quantize target -> (the INT8 file's suffix next to ``edge.onnx``, its report in the run folder)
INT8_FILES = {"cpu": ("-int8.onnx", "quantize.json"), "tensorrt": ("-int8-trt.onnx", "quantize-trt.json")}


def quantize_edge(run: Path, edge: Path, samples: int, threads: int, target: str = "cpu") -> Path:
    """``edge-int8.onnx`` (ONNX Runtime's CPU layout: the demo, the evaluations) or, for
    ``target="tensorrt"``, ``edge-int8-trt.onnx`` (symmetric int8, what a Jetson's TensorRT
    builds: the bundle's model) next to ``edge``, kept when newer; the report goes to
    ``RUN/quantize.json`` / ``RUN/quantize-trt.json``."""
    from edgewise_tools.models.quantize import quantize

    suffix, report_name = INT8_FILES[target]
    int8 = edge.with_name(edge.stem + suffix)
    if _newer(int8, edge):
        return int8
    t0 = time.monotonic()
    report = quantize(edge, run / "data" / DATA["train"] / "images", samples=samples, out_path=int8, holdout=50,
                      holdout_source=run / "data" / DATA["val"] / "images", threads=threads, target=target)
    (run / report_name).write_text(json.dumps({"seconds": round(time.monotonic() - t0, 1),
                                               "report": report.as_dict()}, indent=1, default=str))
    return int8


def operating_points(run: Path, files: Sequence[Path], threads: int) -> Dict[str, Any]:
    """Each model's score threshold, chosen for the best F1 on the validation split
    (:func:`~edgewise_tools.train.reference.choose_conf`; the cloud model on whole validation
    frames at native size, as it runs) and written into its metadata (``edgewise_conf_thres``),
    so the edge daemon, the worker and ``edgewise eval`` use it by default. The choice and its F1
    curve go to ``RUN/conf-<model>.json``; a model that states a threshold and has that record
    keeps it (a rerun only does what is missing)."""
    from edgewise_tools.models.quantize import set_metadata
    from edgewise_tools.train.reference import choose_conf

    out: Dict[str, Any] = {}
    for path in files:  # in order: a file written later is newer (edge-int8.onnx after edge.onnx)
        record = run / f"conf-{path.stem}.json"
        if load_model_info(path).conf_thres is None or not record.exists():
            choice = choose_conf(path, run / "data" / DATA["val"], threads)
            record.write_text(json.dumps(choice, indent=1))
            set_metadata(path, {CONF_KEY: f"{choice['conf']:g}"})
            print(f"{path.name}: score threshold {choice['conf']:g} "
                  f"(validation F1 {choice['curve'][str(choice['conf'])]['f1']:.3f})", file=sys.stderr)
        out[path.name] = json.loads(record.read_text())
    return out


def package(run: Path, models: Path, edge_stage: Optional[str] = None, shape: Optional[Tuple[int, int]] = None,
            calib_samples: int = 200, threads: int = 1) -> Dict[str, Any]:
    """Export, quantize and score the pair (the edge from ``edge_stage``, default the last of
    :func:`edge_stages`); writes ``models/metrics.json`` and returns it."""
    steps = edge_stages(run)
    if edge_stage is None:
        if not steps:
            raise FileNotFoundError(f"{run}: no edge-<size> stage folder (run scripts/train_camera.sh first)")
        edge_stage = steps[-1]
    files = export_pair(run, models, edge_stage, shape)
    int8 = quantize_edge(run, files["edge"], calib_samples, threads)
    int8_trt = quantize_edge(run, files["edge"], calib_samples, threads, target="tensorrt")
    conf = operating_points(run, [files["edge"], files["cloud"], int8, int8_trt], max(threads, 2))
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
                               "edge_input": list(load_model_info(files["edge"]).imgsz), "edge_stage": edge_stage,
                               "cloud_input": "native", "tests": {},
                               "operating_points": {k: {"conf": v["conf"], "data": v["data"]} for k, v in conf.items()}}
    for mix, folder in tests.items():
        meta = json.loads((folder / "dataset.json").read_text())
        meta.pop("difficulty", None)
        summary["tests"][mix] = {"data": {"path": str(folder), **meta}, "results": by_test[mix]}
    summary["training"] = {k: json.loads((run / k / "summary.json").read_text())
                           for k in (*steps, "cloud") if (run / k / "summary.json").exists()}
    for k in summary["training"].values():
        k.pop("history", None)
    for key, (_, report_name) in (("quantize", INT8_FILES["cpu"]), ("quantize_tensorrt", INT8_FILES["tensorrt"])):
        if (run / report_name).exists():
            summary[key] = json.loads((run / report_name).read_text())
    cam = by_test.get("camera", {})
    if "edge_int8" in cam and "cloud_float" in cam:
        e, c = cam["edge_int8"], cam["cloud_float"]
        summary["gap"] = {"edge_int8_over_cloud_f1": round(_op(e["all"])["f1"] / max(_op(c["all"])["f1"], 1e-9), 4),
                          "edge_int8_over_cloud_f1_at_0.25": round(e["all"]["f1@0.25"] / max(c["all"]["f1@0.25"], 1e-9), 4),
                          "edge_int8_over_cloud_map50": round(e["map50"] / max(c["map50"], 1e-9), 4)}
    (models / "metrics.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _op(pr: Dict[str, Any]) -> Dict[str, Any]:
    """P/R/F1 at the model's own threshold (``op``), else at 0.25."""
    return dict(pr.get("op") or {"conf": 0.25, "precision": pr["precision@0.25"], "recall": pr["recall@0.25"],
                                 "f1": pr["f1@0.25"]})


def markdown_table(summary: Dict[str, Any]) -> str:
    """The model card's table: all objects at each model's own threshold, recall per
    object-size bucket, and F1 at YOLOv5's 0.25 for comparison."""
    buckets = [b[0] for b in SIZE_BUCKETS]
    rows = ["| test | model | file size | mAP@0.5 | threshold | precision | recall | F1 | "
            + " | ".join(f"recall {b}" for b in buckets) + " | F1@0.25 | ms/frame (1 thread) |",
            "|---|---|---|---|---|---|---|---|" + "---|" * len(buckets) + "---|---|"]
    for mix, test in summary["tests"].items():
        for name, r in test["results"].items():
            op = _op(r["all"])
            rec = " | ".join(f"{_op(r['by_size'][b])['recall']:.3f} ({r['by_size'][b]['objects']})" for b in buckets)
            rows.append(f"| {mix} | {name} (`{r['model']}`) | {r['size_bytes'] / 1e6:.1f} MB | {r['map50']:.3f} | "
                        f"{op['conf']:g} | {op['precision']:.3f} | {op['recall']:.3f} | {op['f1']:.3f} | {rec} | "
                        f"{r['all']['f1@0.25']:.3f} | {r['ms_per_frame_1thread']:.1f} |")
    if "gap" in summary:
        g = summary["gap"]
        rows.append("")
        rows.append(f"Camera test: edge INT8 / cloud F1 = {g['edge_int8_over_cloud_f1']:.3f} at each model's own "
                    f"threshold ({g['edge_int8_over_cloud_f1_at_0.25']:.3f} at 0.25), mAP@0.5 = "
                    f"{g['edge_int8_over_cloud_map50']:.3f} (target <= 0.85 each).")
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
    p.add_argument("--edge-stage", default=None,
                   help="the edge stage folder in RUN to export (default: the edge-<size> with the largest size)")
    p.add_argument("--edge-shape", type=_shape, default=None,
                   help="edge model input H,W (default: the stage's training size at the frames' aspect)")
    p.add_argument("--calib-samples", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    summary = package(args.run, args.models, args.edge_stage, args.edge_shape, args.calib_samples, args.threads)
    print(markdown_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
