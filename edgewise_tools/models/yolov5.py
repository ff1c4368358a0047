"""YOLOv5 v7.0 in PyTorch: the architecture-exact graph ``edgewise model build`` and the trainer use.

Follows Ultralytics YOLOv5 v7.0 (``models/common.py``: Conv, Bottleneck, C3, SPPF,
Concat; ``models/yolo.py``: Detect, DetectionModel, parse_model; ``models/yolov5*.yaml``).
State-dict keys match Ultralytics (``model.0.conv.weight`` ... ``model.24.m.2.bias``) so a
checkpoint's tensors map one to one.

This is the only module of ``edgewise`` that imports torch (the ``train`` extra); the edge
(Jetson) has no torch and never imports it.

Forward: in training mode the model returns the raw per-level maps, a list of
``[B, na, H, W, 5+nc]`` tensors (for the loss); in eval mode it returns the decoded,
concatenated ``[B, N, 5+nc]`` tensor exactly as Ultralytics' Detect does in export mode:
xywh in input pixels, sigmoid applied to objectness and class scores.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

#: (depth_multiple, width_multiple) of the official configurations.
ARCHS: Dict[str, Tuple[float, float]] = {
    "yolov5n": (0.33, 0.25),
    "yolov5s": (0.33, 0.50),
    "yolov5m": (0.67, 0.75),
    "yolov5l": (1.0, 1.0),
    "yolov5x": (1.33, 1.25),
}

#: Default anchors (pixels) of P3/8, P4/16, P5/32.
DEFAULT_ANCHORS: Tuple[Tuple[int, ...], ...] = (
    (10, 13, 16, 30, 33, 23),
    (30, 61, 62, 45, 59, 119),
    (116, 90, 156, 198, 373, 326),
)
STRIDES: Tuple[int, int, int] = (8, 16, 32)

# models/yolov5s.yaml (v7.0): [from, number, module, args]
_BACKBONE: List[List[Any]] = [
    [-1, 1, "Conv", [64, 6, 2, 2]],  # 0-P1/2 (v6.0+ stem: 6x6, stride 2, padding 2)
    [-1, 1, "Conv", [128, 3, 2]],  # 1-P2/4
    [-1, 3, "C3", [128]],
    [-1, 1, "Conv", [256, 3, 2]],  # 3-P3/8
    [-1, 6, "C3", [256]],
    [-1, 1, "Conv", [512, 3, 2]],  # 5-P4/16
    [-1, 9, "C3", [512]],
    [-1, 1, "Conv", [1024, 3, 2]],  # 7-P5/32
    [-1, 3, "C3", [1024]],
    [-1, 1, "SPPF", [1024, 5]],  # 9
]
_HEAD: List[List[Any]] = [
    [-1, 1, "Conv", [512, 1, 1]],
    [-1, 1, "Upsample", [None, 2, "nearest"]],
    [[-1, 6], 1, "Concat", [1]],  # cat backbone P4
    [-1, 3, "C3", [512, False]],  # 13
    [-1, 1, "Conv", [256, 1, 1]],
    [-1, 1, "Upsample", [None, 2, "nearest"]],
    [[-1, 4], 1, "Concat", [1]],  # cat backbone P3
    [-1, 3, "C3", [256, False]],  # 17 (P3/8-small)
    [-1, 1, "Conv", [256, 3, 2]],
    [[-1, 14], 1, "Concat", [1]],  # cat head P4
    [-1, 3, "C3", [512, False]],  # 20 (P4/16-medium)
    [-1, 1, "Conv", [512, 3, 2]],
    [[-1, 10], 1, "Concat", [1]],  # cat head P5
    [-1, 3, "C3", [1024, False]],  # 23 (P5/32-large)
    [[17, 20, 23], 1, "Detect", ["nc", "anchors"]],  # Detect(P3, P4, P5)
]


def autopad(k: int, p: Optional[int] = None) -> int:
    """'Same' padding for an odd kernel unless given."""
    return k // 2 if p is None else p


def make_divisible(x: float, divisor: int = 8) -> int:
    """Round channels up to a multiple of ``divisor`` (utils/general.py)."""
    return int(math.ceil(x / divisor) * divisor)


class Conv(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + SiLU; ``fuse()`` folds BN into the conv."""

    def __init__(
        self, c1: int, c2: int, k: int = 1, s: int = 1, p: Optional[int] = None, g: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn: Optional[nn.BatchNorm2d] = nn.BatchNorm2d(c2)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn is None:
            return self.act(self.conv(x))
        return self.act(self.bn(self.conv(x)))

    def fuse(self) -> None:
        """Fold BatchNorm into the convolution (utils/torch_utils.py fuse_conv_and_bn)."""
        if self.bn is None:
            return
        conv, bn = self.conv, self.bn
        fused = nn.Conv2d(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,  # type: ignore[arg-type]
            conv.stride,  # type: ignore[arg-type]
            conv.padding,  # type: ignore[arg-type]
            groups=conv.groups,
            bias=True,
        ).to(conv.weight.device)
        var: torch.Tensor = bn.running_var  # type: ignore[assignment]
        mean: torch.Tensor = bn.running_mean  # type: ignore[assignment]
        with torch.no_grad():
            std = torch.sqrt(var + bn.eps)
            scale = bn.weight / std
            fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
            bias: torch.Tensor = fused.bias  # type: ignore[assignment]
            bias.copy_(bn.bias - bn.weight * mean / std)
        fused.requires_grad_(False)
        self.conv = fused
        self.bn = None


class Bottleneck(nn.Module):
    """Standard bottleneck: 1x1 then 3x3, residual when shapes allow."""

    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """CSP bottleneck with 3 convolutions."""

    def __init__(
        self, c1: int, c2: int, n: int = 1, shortcut: bool = True, g: int = 1, e: float = 0.5
    ) -> None:
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(Bottleneck(c_, c_, shortcut, g, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling - fast: three chained 5x5 max pools."""

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        c_ = c1 // 2
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c_ * 4, c2, 1, 1)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Concat(nn.Module):
    """Concatenate a list of tensors along ``dimension``."""

    def __init__(self, dimension: int = 1) -> None:
        super().__init__()
        self.d = dimension

    def forward(self, x: List[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)


class Detect(nn.Module):
    """YOLOv5 detection head (models/yolo.py Detect, non-inplace export path).

    ``anchors`` buffer is in grid units (pixels / stride), as Ultralytics stores it.
    ``dynamic`` (upstream's ``Detect.dynamic``, set by ``export.py --dynamic``) builds the
    grids from the feature-map shape on every call, so a traced export computes them in
    the graph and takes any input size; otherwise they are cached per size.
    """

    def __init__(
        self, nc: int, anchors: Sequence[Sequence[float]], ch: Sequence[int], strides: Sequence[int]
    ) -> None:
        super().__init__()
        self.nc = nc
        self.no = nc + 5
        self.nl = len(anchors)
        self.na = len(anchors[0]) // 2
        self.strides: Tuple[int, ...] = tuple(int(s) for s in strides)
        stride = torch.tensor([float(s) for s in strides])
        self.register_buffer("stride", stride)
        a = torch.tensor([list(map(float, row)) for row in anchors]).view(self.nl, -1, 2)
        self.register_buffer("anchors", a / stride.view(-1, 1, 1))
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
        self._grid: Dict[Tuple[int, int, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        self.dynamic = False

    def _make_grid(self, nx: Any, ny: Any, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        anchors: torch.Tensor = self.anchors  # type: ignore[assignment]
        stride: torch.Tensor = self.stride  # type: ignore[assignment]
        if not self.dynamic:
            nx, ny = int(nx), int(ny)
            cached = self._grid.get((i, ny, nx))
            if (
                cached is not None
                and cached[0].device == anchors.device
                and cached[0].dtype == anchors.dtype
            ):
                return cached
        d, t = anchors.device, anchors.dtype
        shape = (1, self.na, ny, nx, 2)
        y, x = torch.arange(ny, device=d, dtype=t), torch.arange(nx, device=d, dtype=t)
        yv, xv = torch.meshgrid(y, x, indexing="ij")
        grid = (
            torch.stack((xv, yv), 2).expand(shape) - 0.5
        )  # add grid offset, i.e. y = 2.0 * x - 0.5
        anchor_grid = (anchors[i] * stride[i]).view((1, self.na, 1, 1, 2)).expand(shape)
        if not self.dynamic:
            self._grid[(i, ny, nx)] = (grid, anchor_grid)
        return grid, anchor_grid

    def forward(self, xs: List[torch.Tensor]) -> Union[List[torch.Tensor], torch.Tensor]:
        raw: List[torch.Tensor] = []
        z: List[torch.Tensor] = []
        stride: torch.Tensor = self.stride  # type: ignore[assignment]
        for i in range(self.nl):
            x = self.m[i](xs[i])
            bs, _, ny, nx = x.shape
            x = x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            raw.append(x)
            if not self.training:
                grid, anchor_grid = self._make_grid(nx, ny, i)
                xy, wh, conf = x.sigmoid().split((2, 2, self.nc + 1), 4)
                xy = (xy * 2 + grid) * stride[i]
                wh = (wh * 2) ** 2 * anchor_grid
                y = torch.cat((xy, wh, conf), 4)
                z.append(y.view(bs, self.na * nx * ny, self.no))
        return raw if self.training else torch.cat(z, 1)

    def initialize_biases(self) -> None:
        """Ultralytics ``_initialize_biases`` (https://arxiv.org/abs/1708.02002 section 3.3)."""
        for mi, s in zip(self.m, self.strides):
            b = mi.bias.view(self.na, -1)  # type: ignore[union-attr,operator]
            b.data[:, 4] += math.log(8 / (640 / s) ** 2)  # obj (8 objects per 640 image)
            b.data[:, 5 : 5 + self.nc] += math.log(0.6 / (self.nc - 0.99))  # cls
            mi.bias = nn.Parameter(b.view(-1), requires_grad=True)


_MODULES = {"Conv": Conv, "C3": C3, "SPPF": SPPF}


class YOLOv5(nn.Module):
    """YOLOv5 v7.0 detection model built from ``models/yolov5*.yaml``'s layer table.

    ``cfg`` is an architecture name (``yolov5n/s/m/l/x``) or a dict with
    ``depth_multiple`` and ``width_multiple`` (optionally ``backbone``/``head`` tables).
    """

    def __init__(
        self,
        cfg: Union[str, Dict[str, Any]] = "yolov5s",
        nc: int = 80,
        anchors: Optional[Sequence[Sequence[float]]] = None,
        ch: int = 3,
    ) -> None:
        super().__init__()
        if isinstance(cfg, str):
            if cfg not in ARCHS:
                raise ValueError(
                    f"unknown architecture {cfg!r}; expected one of {', '.join(ARCHS)}"
                )
            gd, gw = ARCHS[cfg]
            self.arch = cfg
            backbone, head = _BACKBONE, _HEAD
        else:
            gd, gw = float(cfg["depth_multiple"]), float(cfg["width_multiple"])
            self.arch = str(cfg.get("name", "custom"))
            backbone, head = cfg.get("backbone", _BACKBONE), cfg.get("head", _HEAD)
        if nc < 1:
            raise ValueError(f"nc must be >= 1, got {nc}")
        anchors = DEFAULT_ANCHORS if anchors is None else anchors
        if len(anchors) != 3:
            raise ValueError("anchors: expected 3 levels (P3, P4, P5)")
        self.nc = nc
        self.depth_multiple, self.width_multiple = gd, gw
        self.model, self.save = self._parse(backbone + head, gd, gw, nc, anchors, ch)
        detect = self.detect
        # utils/torch_utils.py initialize_weights: BN eps/momentum, in-place activations.
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps = 1e-3
                m.momentum = 0.03
            elif isinstance(m, nn.SiLU):
                m.inplace = True
        detect.initialize_biases()

    @staticmethod
    def _parse(
        table: List[List[Any]],
        gd: float,
        gw: float,
        nc: int,
        anchors: Sequence[Sequence[float]],
        ch0: int,
    ) -> Tuple[nn.Sequential, List[int]]:
        """models/yolo.py parse_model for the module types YOLOv5 v7.0 detection uses."""
        chans: List[int] = [ch0]
        layers: List[nn.Module] = []
        save: List[int] = []
        c2 = ch0
        no = nc + 5
        for i, (f, n, mname, args) in enumerate(table):
            n = max(round(n * gd), 1) if n > 1 else n
            m: nn.Module
            if mname in _MODULES:
                c1, c2 = chans[f], args[0]
                if c2 != no:
                    c2 = make_divisible(c2 * gw, 8)
                margs: List[Any] = [c1, c2, *args[1:]]
                if mname == "C3":
                    margs.insert(2, n)
                    n = 1
                cls = _MODULES[mname]
                m = nn.Sequential(*(cls(*margs) for _ in range(n))) if n > 1 else cls(*margs)
            elif mname == "Concat":
                c2 = sum(chans[x] for x in f)
                m = Concat(args[0])
            elif mname == "Upsample":
                c2 = chans[f]
                m = nn.Upsample(size=args[0], scale_factor=args[1], mode=args[2])
            elif mname == "Detect":
                m = Detect(nc, anchors, [chans[x] for x in f], STRIDES)
            else:
                raise ValueError(f"layer {i}: unsupported module {mname!r}")
            m.f, m.i = f, i  # type: ignore[assignment]
            save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
            layers.append(m)
            if i == 0:
                chans = []
            chans.append(c2)
        return nn.Sequential(*layers), sorted(save)

    @property
    def detect(self) -> Detect:
        d = self.model[-1]
        assert isinstance(d, Detect)
        return d

    @property
    def stride(self) -> torch.Tensor:
        return self.detect.stride  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> Union[List[torch.Tensor], torch.Tensor]:
        y: List[Optional[torch.Tensor]] = []
        out: Any = x
        for m in self.model.children():
            f: Any = m.f
            if f != -1:
                out = y[f] if isinstance(f, int) else [out if j == -1 else y[j] for j in f]
            out = m(out)
            y.append(out if m.i in self.save else None)
        return out  # type: ignore[no-any-return]

    def fuse(self) -> YOLOv5:
        """Fold every BatchNorm into its convolution (inference/export only)."""
        for m in self.modules():
            if isinstance(m, Conv):
                m.fuse()
        return self


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (Ultralytics' ``model.info()`` figure when the model is fused)."""
    return sum(p.numel() for p in model.parameters())


def build_model(
    arch: str, nc: int = 80, seed: int = 0, anchors: Optional[Sequence[Sequence[float]]] = None
) -> YOLOv5:
    """A randomly initialised YOLOv5, deterministic for a given ``seed``; leaves global RNG alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return YOLOv5(arch, nc=nc, anchors=anchors)
