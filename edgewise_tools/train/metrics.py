"""Detection metrics for validation: NMS on decoded outputs and mAP, after Ultralytics YOLOv5 v7.0.

``ap_per_class`` / ``compute_ap`` follow ``utils/metrics.py`` (101-point COCO
interpolation); ``match_predictions`` follows val.py ``process_batch``
(greedy highest-IoU matches per IoU threshold). Pure numpy: the eval tooling can use it
without torch.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from edgewise.runtime.nms import box_iou, nms

IOUV = np.linspace(0.5, 0.95, 10)


def postprocess(pred: np.ndarray, conf_thres: float = 0.001, iou_thres: float = 0.6,
                max_det: int = 300) -> np.ndarray:
    """One image's decoded output [N, 5+nc] (xywh, obj, cls...) -> [k, 6] (x0,y0,x1,y1,conf,cls)."""
    obj = pred[:, 4]
    keep = obj > conf_thres
    p = pred[keep]
    if not len(p):
        return np.zeros((0, 6), np.float32)
    scores = p[:, 5:] * p[:, 4:5]
    cls = scores.argmax(1)
    conf = scores[np.arange(len(p)), cls]
    ok = conf > conf_thres
    p, cls, conf = p[ok], cls[ok], conf[ok]
    xyxy = np.empty((len(p), 4), np.float32)
    xyxy[:, :2] = p[:, :2] - p[:, 2:4] / 2
    xyxy[:, 2:] = p[:, :2] + p[:, 2:4] / 2
    if len(p) > 30000:
        top = np.argsort(-conf)[:30000]
        xyxy, conf, cls = xyxy[top], conf[top], cls[top]
    k = nms(xyxy, conf, cls, iou_thres=iou_thres, max_det=max_det)
    return np.concatenate([xyxy[k], conf[k, None], cls[k, None].astype(np.float32)], 1)


def match_predictions(det: np.ndarray, labels: np.ndarray, iouv: np.ndarray = IOUV) -> np.ndarray:
    """[k, len(iouv)] bool: detection k is a true positive at each IoU threshold.

    ``det`` [k, 6] (xyxy, conf, cls); ``labels`` [m, 5] (cls, xyxy).
    """
    correct = np.zeros((len(det), len(iouv)), bool)
    if not len(det) or not len(labels):
        return correct
    iou = box_iou(labels[:, 1:], det[:, :4])
    correct_class = labels[:, 0:1] == det[:, 5]
    for i, t in enumerate(iouv):
        x = np.nonzero((iou >= t) & correct_class)
        if x[0].shape[0]:
            matches = np.concatenate((np.stack(x, 1), iou[x[0], x[1]][:, None]), 1)
            if x[0].shape[0] > 1:
                matches = matches[matches[:, 2].argsort()[::-1]]
                matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
                matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
            correct[matches[:, 1].astype(int), i] = True
    return correct


def compute_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the precision envelope, 101-point interpolation (COCO)."""
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.concatenate(([1.0], precision, [0.0]))
    mpre = np.flip(np.maximum.accumulate(np.flip(mpre)))
    x = np.linspace(0, 1, 101)
    y = np.interp(x, mrec, mpre)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))  # trapezoid rule


def ap_per_class(tp: np.ndarray, conf: np.ndarray, pred_cls: np.ndarray, target_cls: np.ndarray,
                 nc: int) -> Dict[str, np.ndarray]:
    """Per-class AP at every IoU threshold of ``tp``'s columns; classes without labels are skipped."""
    order = np.argsort(-conf, kind="stable")
    tp, conf, pred_cls = tp[order], conf[order], pred_cls[order]
    classes = [c for c in range(nc) if (target_cls == c).any()]
    ap = np.zeros((len(classes), tp.shape[1]))
    for ci, c in enumerate(classes):
        i = pred_cls == c
        n_l = int((target_cls == c).sum())
        if not i.any():
            continue
        fpc = (1 - tp[i]).cumsum(0)
        tpc = tp[i].cumsum(0)
        recall = tpc / (n_l + 1e-16)
        precision = tpc / (tpc + fpc)
        for j in range(tp.shape[1]):
            ap[ci, j] = compute_ap(recall[:, j], precision[:, j])
    return {"classes": np.array(classes, int), "ap": ap}


def evaluate(dets: Sequence[np.ndarray], labels: Sequence[np.ndarray], nc: int) -> Dict[str, float]:
    """mAP@0.5 and mAP@0.5:0.95 over images. dets: [k,6] per image; labels: [m,5] (cls, xyxy)."""
    stats: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    tcls: List[np.ndarray] = []
    for d, lab in zip(dets, labels):
        stats.append((match_predictions(d, lab), d[:, 4], d[:, 5]))
        tcls.append(lab[:, 0])
    if not stats:
        return {"map50": 0.0, "map": 0.0, "labels": 0}
    tp = np.concatenate([s[0] for s in stats], 0)
    conf = np.concatenate([s[1] for s in stats], 0)
    pcls = np.concatenate([s[2] for s in stats], 0)
    tc = np.concatenate(tcls, 0) if tcls else np.zeros(0)
    res = ap_per_class(tp, conf, pcls, tc, nc)
    ap = res["ap"]
    if not len(ap):
        return {"map50": 0.0, "map": 0.0, "labels": int(len(tc))}
    return {"map50": float(ap[:, 0].mean()), "map": float(ap.mean()), "labels": int(len(tc))}
