"""YOLOv5 letterbox preprocessing and its inverse (boxes back to source pixels).

``letterbox`` follows Ultralytics YOLOv5 ``utils/augmentations.py::letterbox``
line by line (keep aspect ratio, pad with 114, ``auto`` = minimum rectangle
aligned to the stride, ``scaleup`` flag, ``scaleFill`` stretch), and
``scale_boxes`` follows ``utils/general.py::scale_boxes`` + ``clip_boxes`` as
``detect.py`` calls them (``source_pad``).
``preprocess_batch`` turns several BGR images into one NCHW float32 RGB /255
array without Python loops over pixels (OpenCV resize/pad, then one fused
numpy pass per image for the colour swap, transpose and scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import cv2
import numpy as np

PAD_VALUE = 114
ShapeLike = Union[int, Tuple[int, int], Sequence[int]]


@dataclass(frozen=True)
class LetterboxMeta:
    """How one source image was mapped into the network input.

    Attributes:
        src_shape: source ``(height, width)``.
        input_shape: letterboxed ``(height, width)``.
        ratio: ``(rx, ry)`` scale applied to source x and y (equal unless scaleFill).
        pad: ``(dw, dh)`` left/top padding in input pixels (half of the total, as YOLOv5).
    """

    src_shape: Tuple[int, int]
    input_shape: Tuple[int, int]
    ratio: Tuple[float, float]
    pad: Tuple[float, float]


def _as_hw(new_shape: ShapeLike) -> Tuple[int, int]:
    if isinstance(new_shape, (int, np.integer)):
        return int(new_shape), int(new_shape)
    h, w = new_shape
    return int(h), int(w)


def letterbox_shape(
    src_shape: Tuple[int, int],
    new_shape: ShapeLike = 640,
    auto: bool = True,
    scale_fill: bool = False,
    scaleup: bool = True,
    stride: int = 32,
) -> Tuple[Tuple[int, int], Tuple[int, int], Tuple[int, int, int, int], LetterboxMeta]:
    """Geometry of YOLOv5's letterbox without touching pixels.

    Returns ``(resized (w, h), output (h, w), (top, bottom, left, right), meta)``.
    """
    # Ultralytics YOLOv5 utils/augmentations.py::letterbox, verbatim arithmetic.
    shape = (int(src_shape[0]), int(src_shape[1]))
    nh, nw = _as_hw(new_shape)
    r = min(nh / shape[0], nw / shape[1])
    if not scaleup:  # only scale down, do not scale up (for better val mAP)
        r = min(r, 1.0)
    ratio = (r, r)
    # max(1, .): YOLOv5 would hand OpenCV a zero size for extreme aspect ratios.
    new_unpad = (max(1, int(round(shape[1] * r))), max(1, int(round(shape[0] * r))))
    dw, dh = float(nw - new_unpad[0]), float(nh - new_unpad[1])
    if auto:  # minimum rectangle
        dw, dh = float(np.mod(dw, stride)), float(np.mod(dh, stride))
    elif scale_fill:  # stretch
        dw, dh = 0.0, 0.0
        new_unpad = (nw, nh)
        ratio = (nw / shape[1], nh / shape[0])
    dw /= 2
    dh /= 2
    top, bottom = int(round(dh - 0.1)), int(round(dh + 0.1))
    left, right = int(round(dw - 0.1)), int(round(dw + 0.1))
    out_hw = (new_unpad[1] + top + bottom, new_unpad[0] + left + right)
    meta = LetterboxMeta(src_shape=shape, input_shape=out_hw, ratio=ratio, pad=(dw, dh))
    return new_unpad, out_hw, (top, bottom, left, right), meta


def resize(im: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
    """``cv2.resize`` to ``size`` (width, height), bilinear. A 1x1 colour image is broadcast
    instead (what bilinear gives): OpenCV 4.5.4's Python bindings, JetPack 5.1's, refuse to
    wrap one (``_step >= minstep``; found by the Jetson lane of ``make test``)."""
    if im.shape[0] == 1 and im.shape[1] == 1:
        return np.ascontiguousarray(np.broadcast_to(im, (size[1], size[0]) + im.shape[2:]))
    return cv2.resize(im, size, interpolation=cv2.INTER_LINEAR)


def letterbox(
    im: np.ndarray,
    new_shape: ShapeLike = 640,
    color: Tuple[int, int, int] = (PAD_VALUE, PAD_VALUE, PAD_VALUE),
    auto: bool = True,
    scale_fill: bool = False,
    scaleup: bool = True,
    stride: int = 32,
) -> Tuple[np.ndarray, LetterboxMeta]:
    """Resize and pad ``im`` (HxWxC uint8) like YOLOv5; returns ``(image, meta)``.

    ``new_shape`` is ``(height, width)`` or an int. The output keeps the input's
    channel order and dtype; ``meta`` holds ratio and padding for ``scale_boxes``.
    """
    new_unpad, _, (top, bottom, left, right), meta = letterbox_shape(
        im.shape[:2], new_shape, auto, scale_fill, scaleup, stride
    )
    if (im.shape[1], im.shape[0]) != new_unpad:  # resize
        im = resize(im, new_unpad)
    if top or bottom or left or right:
        im = cv2.copyMakeBorder(im, top, bottom, left, right, cv2.BORDER_CONSTANT, value=color)
    return im, meta


def native_shape(src_shape: Tuple[int, int], stride: int = 32, max_side: int = 0) -> Tuple[int, int]:
    """``(height, width)`` at which an image runs at its own scale: its size rounded up to
    the stride (padding, never scaling up), after scaling down to ``max_side`` on its
    longer side when that is set (0: no cap)."""
    h, w = int(src_shape[0]), int(src_shape[1])
    r = min(1.0, max_side / max(h, w)) if max_side > 0 else 1.0
    return (max(stride, -(-int(round(h * r)) // stride) * stride),
            max(stride, -(-int(round(w * r)) // stride) * stride))


def to_chw_rgb(images: Sequence[np.ndarray], out: Optional[np.ndarray] = None) -> np.ndarray:
    """Equal-sized BGR HWC uint8 images -> NCHW float32 RGB in [0, 1] (``/ 255``).

    One fused numpy pass per image writes straight into the batch (BGR->RGB and
    HWC->CHW are strided views, no intermediate copies); measured faster here
    than ``cv2.dnn.blobFromImages`` (1.8 ms vs 6 ms at 640x640).
    """
    n = len(images)
    h, w = images[0].shape[:2]
    if out is None:
        out = np.empty((n, 3, h, w), np.float32)
    for i, im in enumerate(images):
        np.divide(im[..., ::-1].transpose(2, 0, 1), np.float32(255.0), out=out[i])
    return out


def preprocess_batch(
    images: Sequence[np.ndarray],
    new_shape: ShapeLike = 640,
    auto: bool = False,
    scaleup: bool = True,
    stride: int = 32,
) -> Tuple[np.ndarray, List[LetterboxMeta]]:
    """Letterbox several BGR uint8 images into one NCHW float32 RGB /255 batch.

    With ``auto=True`` the stride-aligned minimum rectangle is used only when
    every image yields the same rectangle (same source shape, as YOLOv5's
    ``LoadStreams`` requires for ``rect``); otherwise all images go to the
    fixed ``new_shape`` so the batch stays rectangular.
    """
    if len(images) == 0:
        return np.zeros((0, 3) + _as_hw(new_shape), np.float32), []
    if auto:
        shapes = {letterbox_shape(im.shape[:2], new_shape, True, False, scaleup, stride)[1] for im in images}
        auto = len(shapes) == 1
    # Fused letterbox + normalise: resize in uint8, write the resized pixels
    # (RGB, CHW, /255) straight into the batch and fill the borders with the
    # pad value, instead of padding in uint8 and converting the border too.
    hw = letterbox_shape(images[0].shape[:2], new_shape, auto, False, scaleup, stride)[1]
    out = np.empty((len(images), 3) + hw, np.float32)
    pad = np.float32(PAD_VALUE) / np.float32(255.0)
    metas: List[LetterboxMeta] = []
    for i, im in enumerate(images):
        new_unpad, out_hw, (top, bottom, left, right), meta = letterbox_shape(
            im.shape[:2], new_shape, auto, False, scaleup, stride
        )
        if (im.shape[1], im.shape[0]) != new_unpad:
            im = resize(im, new_unpad)
        o = out[i]
        h, w = out_hw
        if top:
            o[:, :top] = pad
        if bottom:
            o[:, h - bottom :] = pad
        if left:
            o[:, top : h - bottom, :left] = pad
        if right:
            o[:, top : h - bottom, w - right :] = pad
        np.divide(im[..., ::-1].transpose(2, 0, 1), np.float32(255.0),
                  out=o[:, top : h - bottom, left : w - right])
        metas.append(meta)
    return out, metas


def clip_boxes(boxes: np.ndarray, shape: Tuple[int, int]) -> np.ndarray:
    """Clip xyxy boxes in place to an image of ``(height, width)`` (YOLOv5 clip_boxes)."""
    np.clip(boxes[..., 0::2], 0, shape[1], out=boxes[..., 0::2])
    np.clip(boxes[..., 1::2], 0, shape[0], out=boxes[..., 1::2])
    return boxes


def source_pad(meta: LetterboxMeta) -> Tuple[float, float]:
    """The ``(dw, dh)`` offset ``scale_boxes`` removes: YOLOv5 ``detect.py``'s.

    ``detect.py`` calls ``scale_boxes(im.shape[2:], det[:, :4], im0.shape)`` without
    ``ratio_pad``, so upstream recomputes the padding from the *unrounded* gain,
    ``(W_in - W_src * gain) / 2``, instead of using the letterbox's own ``meta.pad``
    (half the padding around the *rounded* resize). The two differ by less than half an
    input pixel; edgewise reproduces ``detect.py`` exactly so its boxes can be compared
    with upstream's output (``docs/models.md``). ``val.py`` passes the letterbox's
    ``ratio_pad`` instead; ``meta.pad`` keeps that value.
    """
    (rx, ry) = meta.ratio
    return (
        (meta.input_shape[1] - meta.src_shape[1] * rx) / 2,
        (meta.input_shape[0] - meta.src_shape[0] * ry) / 2,
    )


def scale_boxes(boxes: np.ndarray, meta: LetterboxMeta, clip: bool = True) -> np.ndarray:
    """Map xyxy boxes from network-input pixels back to source pixels, in place.

    YOLOv5 utils/general.py::scale_boxes as ``detect.py`` calls it (padding from the
    unrounded gain, ``source_pad``), generalised to the separate x/y ratios of ``scaleFill``.
    """
    (rx, ry), (dw, dh) = meta.ratio, source_pad(meta)
    boxes[..., 0::2] -= dw
    boxes[..., 1::2] -= dh
    boxes[..., 0::2] /= rx
    boxes[..., 1::2] /= ry
    if clip:
        clip_boxes(boxes, meta.src_shape)
    return boxes


def unscale_boxes(boxes: np.ndarray, meta: LetterboxMeta) -> np.ndarray:
    """Inverse of ``scale_boxes`` (source pixels -> network input pixels), new array."""
    out = np.array(boxes, dtype=np.float32, copy=True)
    (rx, ry), (dw, dh) = meta.ratio, source_pad(meta)
    out[..., 0::2] = out[..., 0::2] * rx + dw
    out[..., 1::2] = out[..., 1::2] * ry + dh
    return out
