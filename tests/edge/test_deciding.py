"""The daemon's Decider: per-stream state stays bounded whatever the frames bring."""

from __future__ import annotations

import numpy as np

from edge.deciding import Decider
from edgewise.detections import Detections
from edgewise.policy.loading import parse_policy
from tests.edge.helpers import policy_yaml


def _one_box() -> Detections:
    return Detections(boxes=np.asarray([[10, 10, 30, 30]], np.float32), scores=np.asarray([0.4], np.float32),
                      class_ids=np.zeros(1, np.int32), names=("a",), source="edge")


def test_signal_configs_do_not_pile_up_with_frame_sizes() -> None:
    # A folder of images of many sizes (or a camera that comes back at other resolutions)
    # kept one signal config per (stream, size) for the daemon's life: 10,000 sizes, 10,000
    # entries. One per stream is enough, for the size its last frame had.
    decider = Decider(parse_policy(policy_yaml("p")), clock=lambda: 0.0)
    for i in range(2000):
        size = (64 + i, 48 + i % 7)
        decider.decide("cam", i, _one_box(), size, now=float(i))
        assert decider._signal_config("cam", size).frame_size == size
    decider.decide("other", 0, _one_box(), (640, 480), now=0.0)
    assert len(decider._cfg) == 2


def test_signal_config_follows_the_frame_size_back_and_forth() -> None:
    decider = Decider(parse_policy(policy_yaml("p")), clock=lambda: 0.0)
    for size in ((640, 480), (1280, 720), (640, 480)):
        decider.decide("cam", 0, _one_box(), size, now=0.0)
        assert decider._signal_config("cam", size).frame_size == size


def test_a_stream_that_changes_resolution_is_not_hard_for_it() -> None:
    # the same object at the new scale: the old tracks (old frame's pixels) must not "vanish"
    decider = Decider(parse_policy(policy_yaml("p")), clock=lambda: 0.0)
    for i in range(4):
        v = decider.decide("cam", i, _one_box(), (640, 480), now=float(i))
        assert v.decision.signals["tracker_disagreement"] == 0.0
    big = Detections(boxes=np.asarray([[20, 20, 60, 60]], np.float32), scores=np.asarray([0.4], np.float32),
                     class_ids=np.zeros(1, np.int32), names=("a",), source="edge")
    v = decider.decide("cam", 4, big, (1280, 960), now=4.0)
    assert v.decision.signals["tracker_disagreement"] == 0.0
