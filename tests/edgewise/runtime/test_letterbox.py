"""Letterbox geometry (YOLOv5's arithmetic), pixels, batching and the inverse mapping."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgewise.runtime.letterbox import (
    PAD_VALUE,
    letterbox,
    letterbox_shape,
    preprocess_batch,
    scale_boxes,
    to_chw_rgb,
    unscale_boxes,
)


def _img(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8)


def test_fixed_shape_480x640_to_640():
    out, meta = letterbox(_img(480, 640), 640, auto=False)
    assert out.shape == (640, 640, 3)
    assert meta.ratio == (1.0, 1.0) and meta.pad == (0.0, 80.0)
    assert (out[:80] == PAD_VALUE).all() and (out[-80:] == PAD_VALUE).all()
    assert np.array_equal(out[80:560], _img(480, 640))


def test_auto_is_stride_aligned_minimum_rectangle():
    # 720x1280 -> r = 0.5 -> 360x640; 640-360 = 280, 280 % 32 = 24 -> pad 12/12 -> 384x640
    out, meta = letterbox(_img(720, 1280), 640, auto=True, stride=32)
    assert out.shape == (384, 640, 3)
    assert meta.pad == (0.0, 12.0) and meta.ratio == (0.5, 0.5)


def test_odd_padding_split_like_yolov5():
    # 100x99 into 64: r = 0.64, unpad (63, 64) -> dw = 1 -> left 0, right 1 (round(0.4), round(0.6))
    new_unpad, out_hw, (top, bottom, left, right), meta = letterbox_shape((100, 99), 64, auto=False)
    assert new_unpad == (63, 64) and out_hw == (64, 64)
    assert (left, right, top, bottom) == (0, 1, 0, 0)
    assert meta.pad == (0.5, 0.0)


def test_scaleup_false_only_shrinks():
    out, meta = letterbox(_img(100, 200), 640, auto=False, scaleup=False)
    assert meta.ratio == (1.0, 1.0)
    assert out.shape == (640, 640, 3)
    assert meta.pad == (220.0, 270.0)


def test_scale_fill_stretches():
    out, meta = letterbox(_img(100, 200), (64, 64), auto=False, scale_fill=True)
    assert out.shape == (64, 64, 3) and meta.ratio == (0.32, 0.64) and meta.pad == (0.0, 0.0)


def test_chw_rgb_scaled():
    im = _img(8, 8)
    blob = to_chw_rgb([im])
    assert blob.shape == (1, 3, 8, 8) and blob.dtype == np.float32
    np.testing.assert_allclose(blob[0, 0], im[..., 2] / 255.0, rtol=0, atol=1e-7)  # R first
    np.testing.assert_allclose(blob[0, 2], im[..., 0] / 255.0, rtol=0, atol=1e-7)


def test_batch_equals_single_images_and_falls_back_to_fixed_shape():
    ims = [_img(480, 640, 1), _img(300, 200, 2)]
    batch, metas = preprocess_batch(ims, 320, auto=True)
    assert batch.shape == (2, 3, 320, 320)  # shapes differ -> fixed shape for both
    for i, im in enumerate(ims):
        single, m = preprocess_batch([im], 320, auto=False)
        assert m[0] == metas[i]
        assert np.array_equal(single[0], batch[i])
    same, _ = preprocess_batch([ims[0], ims[0]], 320, auto=True)
    assert same.shape == (2, 3, 256, 320)  # 480x640 -> 240x320 -> 256 (stride 32)


@settings(max_examples=100, deadline=None)
@given(
    h=st.integers(1, 1500), w=st.integers(1, 1500), size=st.sampled_from([160, 320, 640]),
    auto=st.booleans(), scaleup=st.booleans(),
    fx=st.floats(0, 1), fy=st.floats(0, 1), fw=st.floats(0, 1), fh=st.floats(0, 1),
)
def test_round_trip_source_to_input_and_back(h, w, size, auto, scaleup, fx, fy, fw, fh):
    _, out_hw, _, meta = letterbox_shape((h, w), size, auto=auto, scaleup=scaleup)
    x1, y1 = fx * w, fy * h
    box = np.array([[x1, y1, x1 + fw * (w - x1), y1 + fh * (h - y1)]], np.float32)
    inp = unscale_boxes(box, meta)
    # boxes land inside the letterboxed input (up to rounding of the resize)
    assert (inp[:, 0::2] >= -1).all() and (inp[:, 0::2] <= out_hw[1] + 1).all()
    back = scale_boxes(inp.copy(), meta)
    np.testing.assert_allclose(back, box, atol=1e-3 * max(h, w, 1) + 1e-3)


def test_scale_boxes_clips_to_source():
    _, _, _, meta = letterbox_shape((100, 200), 64, auto=False)
    boxes = np.array([[-10, -10, 1000, 1000]], np.float32)
    assert scale_boxes(boxes, meta).tolist() == [[0, 0, 200, 100]]


@pytest.mark.parametrize("shape", [(1, 1), (3, 7000)])
def test_extreme_aspect_ratios(shape):
    out, meta = letterbox(_img(*shape), 64, auto=False)
    assert out.shape == (64, 64, 3)


@pytest.mark.parametrize("shape, size, auto", [((480, 640), 640, False), ((97, 301), 160, False),
                                              ((720, 1280), 640, True), ((160, 160), 160, False)])
def test_fused_batch_equals_letterbox_then_chw(shape, size, auto):
    im = _img(*shape, seed=3)
    batch, metas = preprocess_batch([im], size, auto=auto)
    boxed, meta = letterbox(im, size, auto=auto)
    assert metas[0] == meta
    np.testing.assert_array_equal(batch, to_chw_rgb([boxed]))


def test_native_shape_pads_to_the_stride_and_caps_the_long_side() -> None:
    from edgewise.runtime.letterbox import native_shape

    assert native_shape((720, 1280)) == (736, 1280)
    assert native_shape((10, 50)) == (32, 64)
    assert native_shape((720, 1280), max_side=640) == (384, 640)
    assert native_shape((720, 1280), max_side=4000) == (736, 1280)  # never scaled up


def _upstream_detect_scale_boxes(img1_shape, boxes, img0_shape):
    """YOLOv5 v7.0 utils/general.py::scale_boxes with ratio_pad=None (how detect.py calls it)."""
    gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
    pad = (img1_shape[1] - img0_shape[1] * gain) / 2, (img1_shape[0] - img0_shape[0] * gain) / 2
    boxes[:, [0, 2]] -= pad[0]
    boxes[:, [1, 3]] -= pad[1]
    boxes[:, :4] /= gain
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, img0_shape[1])
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, img0_shape[0])
    return boxes


@pytest.mark.parametrize("src", [(576, 768), (1080, 1920), (480, 640), (333, 517), (719, 1281), (1000, 37)])
@pytest.mark.parametrize("size", [640, (384, 640), 288])
def test_scale_boxes_reproduces_detect_py_exactly(src, size):
    """Decision (docs/models.md): boxes equal detect.py's, not the letterbox's integer-pad
    mapping, so users comparing against upstream see no sub-pixel offset."""
    _, out_hw, _, meta = letterbox_shape(src, size, auto=False)
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, min(out_hw) - 40, (200, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(1, 40, (200, 2))], 1)
    ours = scale_boxes(boxes.astype(np.float64), meta)
    theirs = _upstream_detect_scale_boxes(out_hw, boxes.copy(), src)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    # the letterbox's own padding (val.py's ratio_pad) is what it was: half the rounded border
    (rx, _), (dw, _) = meta.ratio, meta.pad
    assert dw == (out_hw[1] - round(src[1] * rx)) / 2


def test_one_pixel_image_is_broadcast_as_bilinear_resize_would():
    """OpenCV 4.5.4 (JetPack 5.1's) raises on a 1x1 colour image; ours gives what a newer
    OpenCV's bilinear resize gives."""
    from edgewise.runtime.letterbox import resize

    im = _img(1, 1)
    out = resize(im, (48, 32))
    assert out.shape == (32, 48, 3) and (out == im[0, 0]).all() and out.flags["C_CONTIGUOUS"]
    try:
        np.testing.assert_array_equal(out, cv2.resize(im, (48, 32), interpolation=cv2.INTER_LINEAR))
    except cv2.error:
        assert cv2.__version__.startswith("4.5.")
    batch, _ = preprocess_batch([im], 64, auto=False)
    assert batch.shape == (1, 3, 64, 64)
