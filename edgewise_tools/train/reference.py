"""Package and score the reference model pair: ``python -m edgewise_tools.train.reference --run runs/ref``.

``scripts/train_reference.sh`` trains in stages: ``RUN/edge`` and ``RUN/cloud`` on the
``reference`` mix (``RUN/data/train``), then ``RUN/edge-tune`` and ``RUN/cloud-tune``
fine-tuned from them on the ``episodes`` mix (``RUN/data/tune``: easy streams with short
hard episodes, the deployment situation the hybrid is judged on), then ``RUN/cloud-hr`` and
``RUN/edge-hr``: both continued at 288 input. This copies the final ``best.onnx`` files
(:data:`FINAL`) into ``models/``, INT8-quantizes the edge model with
``edgewise_tools.models.quantize`` (calibrated on fine-tuning frames), and scores all three with
:func:`score_onnx` on both held-out test splits (unseen handwriting and backgrounds):
``RUN/data/tune-test`` (episodes mix, the headline) and ``RUN/data/test`` (reference mix),
writing ``models/metrics.json``.

Scoring (ONNX Runtime, the runtime's letterbox, conf 0.001 / NMS IoU 0.6 as val.py):
mAP@0.5 over all labelled objects, and over the *hard* ones only (``HARD`` rule below);
objects too hidden to label (COCO ``iscrowd``) and, for the hard score, the easy objects
are "ignore" regions: an otherwise-unmatched detection on them is neither a true nor a
false positive. Precision/recall/F1 at conf 0.25 are given too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import cv2
import numpy as np

from edgewise.runtime.letterbox import letterbox, native_shape
from edgewise.runtime.nms import box_iou
from edgewise_tools.train.metrics import IOUV, ap_per_class, match_predictions, postprocess

#: run-folder layout of scripts/train_reference.sh: training stages in order, the
#: folders whose best.onnx is shipped, the calibration / hold-out frames of the INT8
#: edge model, and the test splits (headline first)
STAGES = ("edge", "cloud", "edge-tune", "cloud-tune", "cloud-hr", "edge-hr")
FINAL = {"edge": "edge-hr", "cloud": "cloud-hr"}
CALIB, HOLDOUT = "tune", "tune-val"
TESTS = {"episodes": "tune-test", "reference": "test"}

#: an object is hard when small, faint or occluded (COCO annotation fields of edgewise synth)
HARD = {"size_px_below": 20.0, "contrast_below": 0.2, "visible_below": 0.85}
#: object-size buckets of the by-size scores: box height in source-frame pixels, [low, high)
SIZE_BUCKETS: Tuple[Tuple[str, float, float], ...] = (("far", 0.0, 32.0), ("mid", 32.0, 64.0),
                                                       ("near", 64.0, float("inf")))


def is_hard(ann: Dict[str, Any]) -> bool:
    return bool(ann["size_px"] < HARD["size_px_below"] or ann["contrast"] < HARD["contrast_below"]
                or ann["visible"] < HARD["visible_below"])


def _xyxy(bbox: List[float]) -> List[float]:
    x, y, w, h = bbox
    return [x, y, x + w, y + h]


def load_ground_truth(data: Path) -> List[Dict[str, Any]]:
    """Per image: file, labels [m,5] (cls, xyxy), hard flags [m], ignore boxes [k,4]."""
    coco = json.loads((Path(data) / "annotations.json").read_text())
    per: Dict[int, Dict[str, Any]] = {im["id"]: {"file": im["file_name"], "gt": [], "hard": [], "ign": []}
                                      for im in coco["images"]}
    for a in coco["annotations"]:
        rec = per[a["image_id"]]
        if a["iscrowd"]:
            rec["ign"].append(_xyxy(a["bbox"]))
        else:
            rec["gt"].append([a["category_id"], *_xyxy(a["bbox"])])
            rec["hard"].append(is_hard(a))
    out = []
    for im_id in sorted(per):
        r = per[im_id]
        out.append({"file": r["file"], "labels": np.array(r["gt"], np.float32).reshape(-1, 5),
                    "hard": np.array(r["hard"], bool), "ignore": np.array(r["ign"], np.float32).reshape(-1, 4)})
    return out


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_model(path: Path, data: Path, gt: List[Dict[str, Any]], threads: int = 1,
              batch: int = 8) -> Tuple[List[np.ndarray], float]:
    """Detections [k,6] in source pixels per image, and median ms per frame (batched)."""
    sess = _session(path, threads)
    shape = sess.get_inputs()[0].shape
    # a symbolic height/width runs every frame at its native size (the runtime's input: native)
    native = not (isinstance(shape[2], int) and isinstance(shape[3], int))
    if native:
        batch = 1
    dets: List[np.ndarray] = []
    times = []
    for s in range(0, len(gt), batch):
        chunk = gt[s:s + batch]
        ims, metas = [], []
        for r in chunk:
            im = cv2.imread(str(Path(data) / r["file"]), cv2.IMREAD_COLOR)
            if im is None:
                raise FileNotFoundError(f"{Path(data) / r['file']}: cannot read image")
            hw = native_shape(im.shape[:2]) if native else (int(shape[2]), int(shape[3]))
            lb, meta = letterbox(im, hw, auto=False, scaleup=not native)
            ims.append(lb)
            metas.append(meta)
        x = np.ascontiguousarray(np.stack(ims)[..., ::-1].transpose(0, 3, 1, 2)).astype(np.float32) / 255.0
        t0 = time.perf_counter()
        out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        times.append((time.perf_counter() - t0) * 1000 / len(chunk))
        for j, meta in enumerate(metas):
            d = postprocess(out[j], 0.001, 0.6)
            d[:, [0, 2]] = (d[:, [0, 2]] - meta.pad[0]) / meta.ratio[0]
            d[:, [1, 3]] = (d[:, [1, 3]] - meta.pad[1]) / meta.ratio[1]
            dets.append(d)
    return dets, float(np.median(times))


def _match(dets: List[np.ndarray], labels: List[np.ndarray],
           ignores: List[np.ndarray]) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """Per image: detections kept for scoring (those on an ignore region and matching no
    object dropped) and their IoU 0.5 correctness."""
    kept, ok = [], []
    for d, lab, ign in zip(dets, labels, ignores):
        correct = match_predictions(d, lab, IOUV[:1])
        keep = np.ones(len(d), bool)
        if len(ign) and len(d):
            on_ign = box_iou(d[:, :4], ign).max(1) >= 0.5
            keep = correct[:, 0] | ~on_ign
        kept.append(d[keep])
        ok.append(correct[keep, 0])
    return kept, ok


def pr_at(kept: List[np.ndarray], ok: List[np.ndarray], n_gt: int, conf: float) -> Dict[str, float]:
    """Precision, recall and F1 of the matched detections (:func:`_match`) scoring >= ``conf``."""
    hits = [c[d[:, 4] >= conf] for d, c in zip(kept, ok)]
    tp = sum(int(h.sum()) for h in hits)
    fp = sum(len(h) for h in hits) - tp
    p, r = tp / max(tp + fp, 1), tp / max(n_gt, 1)
    return {"precision": round(p, 4), "recall": round(r, 4), "f1": round(2 * p * r / max(p + r, 1e-9), 4)}


def _map50(dets: List[np.ndarray], labels: List[np.ndarray], ignores: List[np.ndarray],
           nc: int, conf: Optional[float] = None) -> Tuple[float, Dict[str, Any]]:
    """mAP@0.5 and P/R/F1 at 0.25 (YOLOv5's default threshold); with ``conf``, also at the
    model's own threshold (``op``)."""
    kept, ok = _match(dets, labels, ignores)
    n_gt = sum(len(lab) for lab in labels)
    res = ap_per_class(np.concatenate([c[:, None] for c in ok]),
                       np.concatenate([d[:, 4] for d in kept]), np.concatenate([d[:, 5] for d in kept]),
                       np.concatenate([lab[:, 0] for lab in labels]), nc)
    m = float(res["ap"][:, 0].mean()) if len(res["ap"]) else 0.0
    at = pr_at(kept, ok, n_gt, 0.25)
    out: Dict[str, Any] = {"precision@0.25": at["precision"], "recall@0.25": at["recall"],
                           "f1@0.25": at["f1"], "objects": n_gt}
    if conf is not None:
        out["op"] = {"conf": conf, **pr_at(kept, ok, n_gt, conf)}
    return m, out


#: score thresholds :func:`choose_conf` tries
CONF_GRID = tuple(round(0.05 * i, 2) for i in range(1, 19))


def choose_conf(path: Path, data: Path, threads: int = 1) -> Dict[str, Any]:
    """The score threshold in :data:`CONF_GRID` with the best F1 of ``path`` on ``data`` (a
    validation split: never the test split), with the F1 curve; ties go to the lower one."""
    gt = load_ground_truth(data)
    dets, _ = run_model(path, data, gt, threads)
    kept, ok = _match(dets, [g["labels"] for g in gt], [g["ignore"] for g in gt])
    n_gt = sum(len(g["labels"]) for g in gt)
    curve = {c: pr_at(kept, ok, n_gt, c) for c in CONF_GRID}
    best = max(CONF_GRID, key=lambda c: (curve[c]["f1"], -c))
    return {"conf": best, "data": str(data), "images": len(gt), "curve": {str(c): v for c, v in curve.items()}}


def score_onnx(path: Path, data: Path, threads: int = 1, nc: int = 10) -> Dict[str, Any]:
    """mAP@0.5 (all and hard objects) and P/R/F1 of the ONNX model ``path`` on ``data``: at
    0.25 and, for a model that states its own threshold (``edgewise_conf_thres``), at it."""
    from edgewise.runtime.metadata import load_model_info

    conf = load_model_info(path).conf_thres
    gt = load_ground_truth(data)
    dets, ms = run_model(path, data, gt, threads)
    labels = [g["labels"] for g in gt]
    ignores = [g["ignore"] for g in gt]
    m_all, pr_all = _map50(dets, labels, ignores, nc, conf)
    hard_labels = [g["labels"][g["hard"]] for g in gt]
    hard_ign = [np.concatenate([g["ignore"], g["labels"][~g["hard"], 1:]], 0) for g in gt]
    m_hard, pr_hard = _map50(dets, hard_labels, hard_ign, nc)
    easy_labels = [g["labels"][~g["hard"]] for g in gt]
    easy_ign = [np.concatenate([g["ignore"], g["labels"][g["hard"], 1:]], 0) for g in gt]
    m_easy, pr_easy = _map50(dets, easy_labels, easy_ign, nc)
    return {"model": Path(path).name, "images": len(gt), "map50": round(m_all, 4),
            "map50_hard": round(m_hard, 4), "map50_easy": round(m_easy, 4), "all": pr_all,
            "hard": pr_hard, "easy": pr_easy, "by_size": score_by_size(dets, gt, nc, conf),
            "ms_per_frame_1thread": round(ms, 2), "size_bytes": Path(path).stat().st_size}


def score_by_size(dets: List[np.ndarray], gt: List[Dict[str, Any]], nc: int,
                  conf: Optional[float] = None) -> Dict[str, Dict[str, Any]]:
    """mAP@0.5 and P/R/F1 (:func:`_map50`) per object-size bucket (:data:`SIZE_BUCKETS`, box
    height): the objects of one bucket are scored, the others are ignore regions, as for hard/easy."""
    out: Dict[str, Dict[str, Any]] = {}
    for name, lo, hi in SIZE_BUCKETS:
        labels, ignores = [], []
        for g in gt:
            h = g["labels"][:, 4] - g["labels"][:, 2]
            sel = (h >= lo) & (h < hi)
            labels.append(g["labels"][sel])
            ignores.append(np.concatenate([g["ignore"], g["labels"][~sel, 1:]], 0))
        m, pr = _map50(dets, labels, ignores, nc, conf)
        out[name] = {"map50": round(m, 4), "px": [lo, hi if np.isfinite(hi) else None], **pr}
    return out


def _cached_score(path: Path, test: Path, threads: int, cache_dir: Path) -> Dict[str, Any]:
    """``score_onnx`` cached in ``cache_dir`` (valid while the model file is unchanged)."""
    cache = cache_dir / f"{path.name}.{test.name}.json"
    if cache.exists() and cache.stat().st_mtime >= path.stat().st_mtime:
        data: Dict[str, Any] = json.loads(cache.read_text())
        return data
    res = score_onnx(path, test, threads)
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(res))
    return res


def _stage_edge(run: Path, models: Path, calib_samples: int, threads: int) -> Tuple[Path, Path, float]:
    from edgewise_tools.models.quantize import quantize

    # Fixed names: the demo, the Jetson bundle, the chart and the benches load these
    # defaults, so a retrained pair replaces the files without a code change (the
    # architecture and input size are in each file's metadata and the model card).
    edge = models / "edge.onnx"
    int8 = edge.with_name(edge.stem + "-int8.onnx")
    src = run / FINAL["edge"] / "best.onnx"
    q_s = 0.0
    if not edge.exists() or edge.stat().st_mtime < src.stat().st_mtime:
        shutil.copyfile(src, edge)
    if not int8.exists() or int8.stat().st_mtime < edge.stat().st_mtime:
        t0 = time.monotonic()
        report = quantize(edge, run / "data" / CALIB / "images", samples=calib_samples, out_path=int8,
                          holdout=50, holdout_source=run / "data" / HOLDOUT / "images", threads=threads)
        q_s = time.monotonic() - t0
        (run / "quantize.json").write_text(json.dumps({"seconds": round(q_s, 1), "report": report.as_dict()},
                                                      indent=1, default=str))
    return edge, int8, q_s


def package(run: Path, models: Path, calib_samples: int = 200, threads: int = 1,
            stage: str = "all") -> Dict[str, Any]:
    """Copy, quantize and score the pair; writes ``models/metrics.json``; returns it.

    ``stage="edge"`` does only the edge part (copy, INT8, scores), e.g. while the cloud
    model is still training; scores are cached under ``RUN/scores``.
    """
    from concurrent.futures import ProcessPoolExecutor

    models.mkdir(parents=True, exist_ok=True)
    cache_dir = run / "scores"
    edge, int8, _ = _stage_edge(run, models, calib_samples, threads)
    todo = [("edge_float", edge), ("edge_int8", int8)]
    if stage == "all":
        cloud = models / "cloud.onnx"
        shutil.copyfile(run / FINAL["cloud"] / "best.onnx", cloud)
        todo.append(("cloud_float", cloud))
    by_test: Dict[str, Dict[str, Any]] = {mix: {} for mix in TESTS}
    with ProcessPoolExecutor(max_workers=len(todo)) as pool:  # one share of the CPU each
        futs = {(mix, name): pool.submit(_cached_score, path, run / "data" / folder, threads, cache_dir)
                for mix, folder in TESTS.items() for name, path in todo}
        for (mix, name), fut in futs.items():
            by_test[mix][name] = fut.result()
            print(mix, name, json.dumps(by_test[mix][name]), file=sys.stderr)
    summary: Dict[str, Any] = {"hard_rule": HARD, "tests": {}}
    for mix, folder in TESTS.items():
        meta = json.loads((run / "data" / folder / "dataset.json").read_text())
        meta.pop("difficulty", None)
        summary["tests"][mix] = {"data": {"path": str(run / "data" / folder), **meta}, "results": by_test[mix]}
    summary["training"] = {k: json.loads((run / k / "summary.json").read_text())
                           for k in STAGES if (run / k / "summary.json").exists()}
    summary["pretrain"] = {k: json.loads((run / k / "backbone.json").read_text())
                           for k in ("edge", "cloud") if (run / k / "backbone.json").exists()}
    if (run / "quantize.json").exists():
        summary["quantize"] = json.loads((run / "quantize.json").read_text())
    for k in summary["training"].values():
        k.pop("history", None)
    if stage == "all":
        (models / "metrics.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def markdown_table(summary: Dict[str, Any]) -> str:
    rows = ["| test mix | model | file size | mAP@0.5 all | mAP@0.5 hard | mAP@0.5 easy | F1@0.25 "
            "| hard recall@0.25 | ms/frame (1 thread) |", "|---|---|---|---|---|---|---|---|---|"]
    for mix, test in summary["tests"].items():
        for name, r in test["results"].items():
            rows.append(f"| {mix} | {name} ({r['model']}) | {r['size_bytes'] / 1e6:.1f} MB | {r['map50']:.3f} | "
                        f"{r['map50_hard']:.3f} | {r['map50_easy']:.3f} | {r['all']['f1@0.25']:.3f} | "
                        f"{r['hard']['recall@0.25']:.3f} | {r['ms_per_frame_1thread']:.1f} |")
    return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgewise_tools.train.reference", description=__doc__)
    p.add_argument("--run", required=True, type=Path, help="run folder of scripts/train_reference.sh")
    p.add_argument("--models", default=Path("models"), type=Path, help="where the ONNX files go")
    p.add_argument("--calib-samples", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stage", choices=("edge", "all"), default="all",
                   help="edge: only copy/quantize/score the edge model (cloud still training)")
    p.add_argument("--score", type=Path, nargs="*", default=None,
                   help=f"only score these ONNX files on RUN/data/{TESTS['episodes']} and print JSON")
    args = p.parse_args(argv)
    if args.score:
        for path in args.score:
            print(json.dumps(score_onnx(path, args.run / "data" / TESTS["episodes"], args.threads)))
        return 0
    summary = package(args.run, args.models, args.calib_samples, args.threads, args.stage)
    print(markdown_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
