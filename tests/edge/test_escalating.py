"""Pure parts of escalation: the crop around uncertain boxes and the DetectRequest."""

from __future__ import annotations

import cv2
import numpy as np

from edge.deciding import Verdict
from edge.escalating import build_request, crop_region, detections_json, idempotency_key
from edge.sources.base import Frame
from edgewise.detections import Detections
from edgewise.policy.loading import parse_policy
from tests.edge.helpers import policy_yaml


def dets(boxes, scores):
    n = len(scores)
    return Detections(boxes=np.asarray(boxes, np.float32).reshape(-1, 4), scores=np.asarray(scores, np.float32),
                      class_ids=np.zeros(n, np.int32), names=("a",), source="edge")


def test_crop_region_pads_uncertain_boxes_and_clips():
    d = dets([[10, 10, 30, 30], [50, 50, 60, 60], [0, 0, 5, 5]], [0.4, 0.5, 0.95])
    # boxes 0 and 1 uncertain (band 0.25..0.6); 20% padding of each box's size
    assert crop_region(d, (100, 80), (0.25, 0.6), 0.2) == (6, 6, 62, 62)
    assert crop_region(d, (55, 55), (0.25, 0.6), 0.2) == (6, 6, 55, 55)
    assert crop_region(dets([[0, 0, 5, 5]], [0.95]), (100, 80), (0.25, 0.6), 0.2) is None  # nothing uncertain
    assert crop_region(dets([], []), (100, 80), (0.25, 0.6), 0.2) is None  # empty frame: full frame


def test_build_request_crop_carries_offset_and_source_size():
    img = np.zeros((80, 100, 3), np.uint8)
    img[20:40, 20:40] = 255
    frame = Frame("cam", 7, img, 123, 0.0)
    d = dets([[10, 10, 30, 30]], [0.4])
    policy = parse_policy(policy_yaml("p", mode="crops"))
    v = Verdict(True, "hard", 0.8, {"entropy": 0.5}, priority=90)
    req, region = build_request("dev", frame, d, v, policy)
    assert region == (6, 6, 34, 34)
    assert (req.device_id, req.stream_id, req.frame_seq) == ("dev", "cam", 7)
    assert (req.image.offset_x, req.image.offset_y) == (6, 6)
    assert (req.image.source_width, req.image.source_height) == (100, 80)
    crop = cv2.imdecode(np.frombuffer(req.image.data, np.uint8), cv2.IMREAD_COLOR)
    assert crop.shape == (28, 28, 3)
    assert len(req.edge_detections) == 1 and req.reason == "hard" and req.priority == 90
    assert abs(req.hardness.score - 0.8) < 1e-6 and abs(req.hardness.signals["entropy"] - 0.5) < 1e-6
    full, region = build_request("dev", frame, d, v, parse_policy(policy_yaml("p", mode="full")))
    assert region is None and (full.image.offset_x, full.image.source_width) == (0, 100)
    assert cv2.imdecode(np.frombuffer(full.image.data, np.uint8), cv2.IMREAD_COLOR).shape == (80, 100, 3)


def test_record_boxes_name_their_model_and_key_format():
    d = Detections(boxes=np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32), scores=np.array([0.9, 0.5], np.float32),
                   class_ids=np.array([0, 1], np.int32), names=("x", "y"), source="edge", sources=("edge", "cloud"))
    out = detections_json(d)
    assert [(o["class_name"], o["source"]) for o in out] == [("x", "edge"), ("y", "cloud")]
    assert idempotency_key("d", "s", 5) == "d/s/5"
