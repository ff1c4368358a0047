"""YOLOv5 training loss, ported from Ultralytics YOLOv5 v7.0 ``utils/loss.py`` (ComputeLoss).

Anchor matching keeps a target for an anchor when both width and height ratios
are within ``anchor_t`` (4.0); each target is assigned to its own cell and the
two nearest neighbour cells (offset ``g = 0.5``), box loss is ``1 - CIoU``
(``utils/metrics.py::bbox_iou``), objectness is BCE against the detached,
clamped IoU (``gr = 1``) with per-level balance [4.0, 1.0, 0.4], class loss is
BCE with (optionally smoothed) one-hot targets. The total is
``(box*lbox + obj*lobj + cls*lcls) * batch_size`` with the gains scaled as
train.py does (:func:`scaled_gains`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Tuple

import torch
from torch import nn


@dataclass(frozen=True)
class LossGains:
    """Loss hyper-parameters (hyp.scratch-low.yaml), before :func:`scaled_gains`."""

    box: float = 0.05
    obj: float = 1.0
    cls: float = 0.5
    cls_pw: float = 1.0
    obj_pw: float = 1.0
    anchor_t: float = 4.0
    label_smoothing: float = 0.0


def scaled_gains(g: LossGains, nl: int, nc: int, imgsz: int) -> LossGains:
    """train.py: ``box *= 3/nl``, ``cls *= nc/80 * 3/nl``, ``obj *= (imgsz/640)**2 * 3/nl``."""
    return LossGains(box=g.box * 3 / nl, obj=g.obj * (imgsz / 640) ** 2 * 3 / nl,
                     cls=g.cls * nc / 80 * 3 / nl, cls_pw=g.cls_pw, obj_pw=g.obj_pw,
                     anchor_t=g.anchor_t, label_smoothing=g.label_smoothing)


def smooth_bce(eps: float = 0.1) -> Tuple[float, float]:
    """Positive and negative BCE targets with label smoothing (https://arxiv.org/pdf/1902.04103)."""
    return 1.0 - 0.5 * eps, 0.5 * eps


def bbox_iou(box1: torch.Tensor, box2: torch.Tensor, xywh: bool = True, ciou: bool = False,
             eps: float = 1e-7) -> torch.Tensor:
    """IoU (or CIoU, https://arxiv.org/abs/1911.08287) of box1 [...,4] and box2 [...,4], elementwise."""
    if xywh:
        (x1, y1, w1, h1), (x2, y2, w2, h2) = box1.chunk(4, -1), box2.chunk(4, -1)
        w1_, h1_, w2_, h2_ = w1 / 2, h1 / 2, w2 / 2, h2 / 2
        b1_x1, b1_x2, b1_y1, b1_y2 = x1 - w1_, x1 + w1_, y1 - h1_, y1 + h1_
        b2_x1, b2_x2, b2_y1, b2_y2 = x2 - w2_, x2 + w2_, y2 - h2_, y2 + h2_
    else:
        b1_x1, b1_y1, b1_x2, b1_y2 = box1.chunk(4, -1)
        b2_x1, b2_y1, b2_x2, b2_y2 = box2.chunk(4, -1)
        w1, h1 = b1_x2 - b1_x1, (b1_y2 - b1_y1).clamp(eps)
        w2, h2 = b2_x2 - b2_x1, (b2_y2 - b2_y1).clamp(eps)
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * \
            (torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    if not ciou:
        return iou
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)  # convex width
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)  # convex height
    c2 = cw ** 2 + ch ** 2 + eps  # convex diagonal squared
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi ** 2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


class ComputeLoss:
    """Ultralytics ``ComputeLoss`` for a :class:`edgewise_tools.models.yolov5.YOLOv5` (autobalance off)."""

    def __init__(self, model: nn.Module, gains: LossGains) -> None:
        device = next(model.parameters()).device
        det: Any = model.detect  # type: ignore[attr-defined]
        self.bce_cls = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([gains.cls_pw], device=device))
        self.bce_obj = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([gains.obj_pw], device=device))
        self.cp, self.cn = smooth_bce(gains.label_smoothing)
        self.balance = {3: [4.0, 1.0, 0.4]}.get(det.nl, [4.0, 1.0, 0.25, 0.06, 0.02])
        self.gr = 1.0
        self.gains = gains
        self.na: int = int(det.na)
        self.nc: int = int(det.nc)
        self.nl: int = int(det.nl)
        self.anchors: torch.Tensor = det.anchors  # grid units, [nl, na, 2]
        self.device = device

    def __call__(self, p: List[torch.Tensor], targets: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """``p``: raw maps [B,na,H,W,5+nc]; ``targets``: [n, 6] (image, class, x, y, w, h) normalised."""
        lcls = torch.zeros(1, device=self.device)
        lbox = torch.zeros(1, device=self.device)
        lobj = torch.zeros(1, device=self.device)
        tcls, tbox, indices, anchors = self.build_targets(p, targets)
        bs = p[0].shape[0]
        for i, pi in enumerate(p):
            b, a, gj, gi = indices[i]
            tobj = torch.zeros(pi.shape[:4], dtype=pi.dtype, device=self.device)
            n = b.shape[0]
            if n:
                pxy, pwh, _, pcls = pi[b, a, gj, gi].split((2, 2, 1, self.nc), 1)
                pxy = pxy.sigmoid() * 2 - 0.5
                pwh = (pwh.sigmoid() * 2) ** 2 * anchors[i]
                pbox = torch.cat((pxy, pwh), 1)
                iou = bbox_iou(pbox, tbox[i], ciou=True).squeeze(-1)
                lbox += (1.0 - iou).mean()
                iou = iou.detach().clamp(0).type(tobj.dtype)
                if self.gr < 1:
                    iou = (1.0 - self.gr) + self.gr * iou
                tobj[b, a, gj, gi] = iou
                if self.nc > 1:
                    t = torch.full_like(pcls, self.cn, device=self.device)
                    t[range(n), tcls[i]] = self.cp
                    lcls += self.bce_cls(pcls, t)
            lobj += self.bce_obj(pi[..., 4], tobj) * self.balance[i]
        lbox *= self.gains.box
        lobj *= self.gains.obj
        lcls *= self.gains.cls
        return (lbox + lobj + lcls) * bs, torch.cat((lbox, lobj, lcls)).detach()

    def build_targets(self, p: List[torch.Tensor], targets: torch.Tensor) -> Tuple[
            List[torch.Tensor], List[torch.Tensor],
            List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]], List[torch.Tensor]]:
        """Targets per level: classes, boxes (xy offset within cell, wh in grid units), indices, anchors."""
        na, nt = self.na, targets.shape[0]
        tcls, tbox, indices, anch = [], [], [], []
        gain = torch.ones(7, device=self.device)
        ai = torch.arange(na, device=self.device).float().view(na, 1).repeat(1, nt)
        targets = torch.cat((targets.repeat(na, 1, 1), ai[..., None]), 2)  # append anchor index
        g = 0.5  # bias
        off = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], device=self.device).float() * g
        for i in range(self.nl):
            anchors, shape = self.anchors[i], p[i].shape
            gain[2:6] = torch.tensor(shape, device=self.device)[[3, 2, 3, 2]].float()  # xyxy gain
            t = targets * gain
            if nt:
                r = t[..., 4:6] / anchors[:, None]  # wh ratio
                j = torch.max(r, 1 / r).max(2)[0] < self.gains.anchor_t
                t = t[j]
                gxy = t[:, 2:4]
                gxi = gain[[2, 3]] - gxy  # inverse
                j, k = ((gxy % 1 < g) & (gxy > 1)).T
                l, m = ((gxi % 1 < g) & (gxi > 1)).T  # noqa: E741 - names as in Ultralytics
                j = torch.stack((torch.ones_like(j), j, k, l, m))
                t = t.repeat((5, 1, 1))[j]
                offsets = (torch.zeros_like(gxy)[None] + off[:, None])[j]
            else:
                t = targets[0]
                offsets = torch.zeros(1, device=self.device)
            bc, gxy, gwh, a = t.chunk(4, 1)
            a, (b, c) = a.to(torch.int64).view(-1), bc.to(torch.int64).T
            gij = (gxy - offsets).to(torch.int64)
            gi, gj = gij.T
            indices.append((b, a, gj.clamp_(0, shape[2] - 1), gi.clamp_(0, shape[3] - 1)))
            tbox.append(torch.cat((gxy - gij, gwh), 1))
            anch.append(anchors[a])
            tcls.append(c)
        return tcls, tbox, indices, anch
