"""The daemon's carrying bookkeeping: which answer a stream carries, over real pixels."""

from __future__ import annotations

import numpy as np

from edge.carrying import MAX_WAITING, Carrier
from edgewise.carrying import CARRIED, CarryConfig
from edgewise.detections import Detections

NAMES = ("a", "b")


def D(rows, source="edge"):
    a = np.asarray(rows, np.float32).reshape(-1, 6)
    return Detections(boxes=a[:, :4], scores=a[:, 4], class_ids=a[:, 5].astype(np.int32), names=NAMES,
                      source=source)


def frame(x, k=0):
    """A noisy BGR frame with one textured 20x14 object at (x, 80)."""
    rng = np.random.default_rng(k)
    img = np.clip(120 + rng.normal(0, 3, (240, 320, 3)), 0, 255).astype(np.uint8)
    patch = np.where(np.random.default_rng(1).random((20, 14)) < 0.35, 30, 200).astype(np.uint8)
    img[80:100, x:x + 14] = patch[..., None]
    return img


CFG = CarryConfig(frames=30, min_match=0.5)
CLOUD = D([[100, 80, 114, 100, 0.9, 1]], source="cloud")
NONE = D([])


def sources(d):
    return list(d.box_sources())


def test_an_answer_is_carried_from_the_frame_it_answers_across_skipped_frames():
    c = Carrier()
    c.sent("cam", 10, frame(100), CFG)
    assert c.apply("cam", 11, frame(102, 11), NONE, CFG) is NONE  # no answer yet
    c.answered("cam", 10, CLOUD, CFG)
    out = c.apply("cam", 13, frame(106, 13), NONE, CFG)  # 3 frames after the escalated one
    assert sources(out) == [CARRIED] and np.allclose(out.boxes[0], [106, 80, 120, 100], atol=1)
    assert c.carrying("cam") == 1 and c.carrying("other") == 0
    assert c.apply("cam", 13, frame(106, 13), NONE, CFG) is NONE  # a frame is stepped once


def test_older_late_and_unknown_answers_are_not_carried():
    c = Carrier()
    c.sent("cam", 10, frame(100), CFG)
    c.sent("cam", 12, frame(104), CFG)
    c.answered("cam", 12, D([[104, 80, 118, 100, 0.9, 1]], source="cloud"), CFG)
    c.answered("cam", 10, CLOUD, CFG)  # came back after a newer one: older than what is carried
    assert c._state["cam"][0] == 12
    c.answered("cam", 99, CLOUD, CFG)  # never sent (or its pixels were let go): nothing to seed from
    assert c._state["cam"][0] == 12
    assert c.carrying("cam") == 1


def test_the_carry_ends_when_the_object_is_gone_or_carrying_is_off():
    c = Carrier()
    c.sent("cam", 0, frame(100), CFG)
    c.answered("cam", 0, CLOUD, CFG)
    blank = np.clip(120 + np.random.default_rng(5).normal(0, 3, (240, 320, 3)), 0, 255).astype(np.uint8)
    assert c.apply("cam", 1, blank, NONE, CFG) is NONE and c.carrying("cam") == 0
    c.sent("cam", 2, frame(100), CFG)
    c.answered("cam", 2, CLOUD, CarryConfig(frames=0, min_match=0.5))  # the policy turned it off
    assert c.carrying("cam") == 0
    c.sent("cam", 3, frame(100), CarryConfig(frames=0, min_match=0.5))  # off: no pixels kept
    assert 3 not in c._waiting["cam"]


def test_only_the_latest_escalated_frames_are_kept():
    c = Carrier()
    for seq in range(MAX_WAITING + 3):
        c.sent("cam", seq, frame(100), CFG)
    assert list(c._waiting["cam"]) == list(range(3, MAX_WAITING + 3))
    assert all(img.ndim == 2 for img in c._waiting["cam"].values())  # kept grey
