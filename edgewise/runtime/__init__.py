"""Detector runtime: YOLOv5 ONNX models on ONNX Runtime or TensorRT.

Public API: ``Detector`` (from_file / detect / preprocess / infer / postprocess),
``ModelInfo`` / ``load_model_info``, ``letterbox`` / ``scale_boxes`` /
``preprocess_batch``, ``decode`` / ``DecodeParams``, ``nms`` / ``box_iou``.
"""

from __future__ import annotations

from edgewise.runtime.backends import InferenceBackend
from edgewise.runtime.decoding import DecodeParams, decode, decode_one, xywh2xyxy
from edgewise.runtime.detector import Detector, validate_images
from edgewise.runtime.letterbox import (
    LetterboxMeta,
    clip_boxes,
    letterbox,
    preprocess_batch,
    scale_boxes,
    unscale_boxes,
)
from edgewise.runtime.metadata import ModelInfo, load_model_info, parse_names
from edgewise.runtime.nms import box_iou, nms

__all__ = [
    "Detector",
    "InferenceBackend",
    "validate_images",
    "DecodeParams",
    "LetterboxMeta",
    "ModelInfo",
    "box_iou",
    "clip_boxes",
    "decode",
    "decode_one",
    "letterbox",
    "load_model_info",
    "nms",
    "parse_names",
    "preprocess_batch",
    "scale_boxes",
    "unscale_boxes",
    "xywh2xyxy",
]
