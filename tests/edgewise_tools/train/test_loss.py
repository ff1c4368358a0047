"""YOLOv5 loss pieces against hand-computed cases: CIoU and build_targets' anchor/cell assignment."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from edgewise_tools.models.yolov5 import build_model  # noqa: E402
from edgewise_tools.train.loss import ComputeLoss, LossGains, bbox_iou, scaled_gains  # noqa: E402


def test_ciou_of_offset_squares() -> None:
    # xyxy (0,0,2,2) vs (1,1,3,3): IoU 1/7; enclosing 3x3 -> c2 = 18; centre distance^2 = 2; v = 0
    b1 = torch.tensor([[0.0, 0.0, 2.0, 2.0]])
    b2 = torch.tensor([[1.0, 1.0, 3.0, 3.0]])
    iou = bbox_iou(b1, b2, xywh=False)
    ciou = bbox_iou(b1, b2, xywh=False, ciou=True)
    assert iou.item() == pytest.approx(1 / 7, abs=1e-6)
    assert ciou.item() == pytest.approx(1 / 7 - 2 / 18, abs=1e-6)


def test_ciou_aspect_term() -> None:
    # same centre, 2x1 vs 1x2 (xywh): IoU 1/3, rho = 0, v = 4/pi^2 (atan(1/2) - atan(2))^2
    b1 = torch.tensor([[5.0, 5.0, 2.0, 1.0]])
    b2 = torch.tensor([[5.0, 5.0, 1.0, 2.0]])
    iou = 1 / 3
    v = 4 / math.pi ** 2 * (math.atan(0.5) - math.atan(2.0)) ** 2
    alpha = v / (v - iou + 1 + 1e-7)
    assert bbox_iou(b1, b2, ciou=True).item() == pytest.approx(iou - v * alpha, abs=1e-5)
    # identical boxes: CIoU 1
    assert bbox_iou(b1, b1, ciou=True).item() == pytest.approx(1.0, abs=1e-5)


def test_scaled_gains_follow_train_py() -> None:
    g = scaled_gains(LossGains(), nl=3, nc=10, imgsz=320)
    assert g.box == pytest.approx(0.05)
    assert g.cls == pytest.approx(0.5 * 10 / 80)
    assert g.obj == pytest.approx(1.0 * (320 / 640) ** 2)


def test_build_targets_on_a_known_label() -> None:
    model = build_model("yolov5n", nc=10, seed=0).train()
    loss = ComputeLoss(model, LossGains())
    p = model(torch.zeros(1, 3, 128, 128))
    assert [tuple(x.shape[2:4]) for x in p] == [(16, 16), (8, 8), (4, 4)]
    # one label: image 0, class 3, centre (0.53, 0.27), size 0.1 x 0.15 (12.8 x 19.2 px at 128)
    targets = torch.tensor([[0.0, 3.0, 0.53, 0.27, 0.10, 0.15]])
    tcls, tbox, indices, anch = loss.build_targets(p, targets)
    got = []
    for lvl in range(3):
        b, a, gj, gi = indices[lvl]
        got += [(lvl, int(a_), int(j_), int(i_)) for a_, j_, i_ in zip(a, gj, gi)]
        assert (b == 0).all() and (tcls[lvl] == 3).all()
    # P3 (grid 16, stride 8): w,h = 1.6, 2.4 cells; all three anchors (10,13),(16,30),(33,23) px are
    # within ratio 4. Centre (8.48, 4.32): fractional parts < 0.5 -> also the left (x-1) and upper (y-1)
    # neighbours. P4 (grid 8): w,h = 0.8, 1.2 cells; only anchor (30,61) px fits (ratio 3.18);
    # (62,45) and (59,119) exceed 4. Centre (4.24, 2.16): left and upper neighbours. P5: no anchor fits.
    want = []
    for a in range(3):
        want += [(0, a, 4, 8), (0, a, 4, 7), (0, a, 3, 8)]
    want += [(1, 0, 2, 4), (1, 0, 2, 3), (1, 0, 1, 4)]
    assert sorted(got) == sorted(want)
    # box targets: xy relative to the assigned cell (in [-0.5, 1.5]), wh in grid units
    b0 = tbox[0]
    assert torch.allclose(b0[:, 2:], torch.tensor([1.6, 2.4]).expand(len(b0), 2), atol=1e-5)
    own = [k for k, (lv, a, j, i) in enumerate(got[:9]) if (j, i) == (4, 8)]
    assert torch.allclose(b0[own[0], :2], torch.tensor([0.48, 0.32]), atol=1e-5)
    left = [k for k, (lv, a, j, i) in enumerate(got[:9]) if (j, i) == (4, 7)]
    assert torch.allclose(b0[left[0], :2], torch.tensor([1.48, 0.32]), atol=1e-5)
    assert torch.allclose(anch[1], torch.tensor([[30 / 16, 61 / 16]] * 3), atol=1e-6)


def test_loss_is_finite_and_positive_with_and_without_labels() -> None:
    model = build_model("yolov5n", nc=10, seed=1).train()
    loss = ComputeLoss(model, scaled_gains(LossGains(), 3, 10, 128))
    p = model(torch.rand(2, 3, 128, 128))
    total, items = loss(p, torch.tensor([[1.0, 7.0, 0.5, 0.5, 0.2, 0.3]]))
    assert total.item() > 0 and torch.isfinite(items).all() and (items > 0).all()
    total0, items0 = loss(p, torch.zeros((0, 6)))
    assert items0[0] == 0 and items0[2] == 0 and items0[1] > 0
