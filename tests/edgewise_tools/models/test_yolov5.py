"""YOLOv5 v7.0 graph: exact parameter counts, training/eval outputs, determinism by seed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgewise_tools.models.yolov5 import ARCHS, YOLOv5, build_model, count_parameters  # noqa: E402

# Ultralytics' fused model summaries for 80 classes (README table: 1.9M/7.2M/21.2M/46.5M/86.7M).
OFFICIAL_PARAMS = {
    "yolov5n": 1_867_405,
    "yolov5s": 7_225_885,
    "yolov5m": 21_172_173,
    "yolov5l": 46_533_693,
    "yolov5x": 86_705_005,
}


@pytest.mark.parametrize("arch", sorted(OFFICIAL_PARAMS))
def test_parameter_count_matches_official(arch):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = YOLOv5(arch, nc=80).eval()
        model.fuse()
    assert count_parameters(model) == OFFICIAL_PARAMS[arch]


def test_all_architectures_covered():
    assert set(ARCHS) == set(OFFICIAL_PARAMS)


def test_training_forward_returns_raw_maps_and_eval_decodes():
    model = build_model("yolov5n", nc=10, seed=0)
    x = torch.rand(2, 3, 160, 128)
    model.train()
    raw = model(x)
    assert [tuple(t.shape) for t in raw] == [
        (2, 3, 20, 16, 15),
        (2, 3, 10, 8, 15),
        (2, 3, 5, 4, 15),
    ]
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert tuple(out.shape) == (2, 3 * (20 * 16 + 10 * 8 + 5 * 4), 15)
    # Sigmoid applied to objectness and classes; centres inside the padded grid extent.
    assert float(out[..., 4:].min()) >= 0.0 and float(out[..., 4:].max()) <= 1.0
    assert float(out[..., 0].max()) < 128 + 32 and float(out[..., 1].max()) < 160 + 32


def test_detect_bias_init_follows_ultralytics():
    import math

    model = build_model("yolov5n", nc=10)
    det = model.detect
    for mi, s in zip(det.m, (8, 16, 32)):
        assert isinstance(mi, torch.nn.Conv2d) and mi.bias is not None
        b = mi.bias.detach().view(det.na, -1)
        # Conv default init puts the raw bias within +-1/sqrt(fan_in); the offset dominates.
        fan_in = mi.weight.shape[1]
        tol = 1 / math.sqrt(fan_in) + 1e-6
        assert torch.all((b[:, 4] - math.log(8 / (640 / s) ** 2)).abs() <= tol)
        assert torch.all((b[:, 5:] - math.log(0.6 / (10 - 0.99))).abs() <= tol)


def test_seed_makes_weights_deterministic_and_keeps_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("yolov5n", nc=3, seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = build_model("yolov5n", nc=3, seed=7)
    c = build_model("yolov5n", nc=3, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    # Ultralytics state-dict layout.
    assert "model.0.conv.weight" in sa and "model.24.m.2.bias" in sa


def test_unknown_arch_rejected():
    with pytest.raises(ValueError, match="yolov5q"):
        YOLOv5("yolov5q")
