"""The daemon's carrying bookkeeping: which answer a stream carries, over real pixels, and the
pipeline letting a stream's answers go after its outage."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import yaml

from edge.carrying import MAX_WAITING, Carrier
from edge.deciding import Decider
from edge.escalating import Escalating
from edge.metrics import EdgeMetrics
from edge.pipeline import Pipeline
from edge.sources import CaptureSource
from edge.sources.base import Frame
from edge.sources.capturing import Capturer, FrameQueue
from edgewise.carrying import CARRIED, CarryConfig
from edgewise.detections import Detections
from edgewise.policy import parse_policy
from tests.edge.helpers import policy_yaml

NAMES = ("a", "b")


def D(rows, source="edge"):
    a = np.asarray(rows, np.float32).reshape(-1, 6)
    return Detections(boxes=a[:, :4], scores=a[:, 4], class_ids=a[:, 5].astype(np.int32), names=NAMES,
                      source=source)


def frame(x, k=0, second=None):
    """A noisy BGR frame with one textured 20x14 object at (x, 80), and another at (second, 180)."""
    rng = np.random.default_rng(k)
    img = np.clip(120 + rng.normal(0, 3, (240, 320, 3)), 0, 255).astype(np.uint8)
    patch = np.where(np.random.default_rng(1).random((20, 14)) < 0.35, 30, 200).astype(np.uint8)
    img[80:100, x:x + 14] = patch[..., None]
    if second is not None:
        other = np.where(np.random.default_rng(2).random((20, 14)) < 0.35, 30, 200).astype(np.uint8)
        img[180:200, second:second + 14] = other[..., None]
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
    assert [layer.seq for layer in c._layers["cam"]] == [12]
    c.answered("cam", 99, CLOUD, CFG)  # never sent (or its pixels were let go): nothing to seed from
    assert [layer.seq for layer in c._layers["cam"]] == [12]
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


def test_under_scope_regions_a_region_answer_replaces_the_carried_boxes_only_where_it_looked():
    """A whole frame finds two objects; the next escalation sends one region, around the
    first, and the cloud finds nothing there: the second object stays carried (scope
    ``regions``) or is forgotten with the rest (scope ``answer``)."""
    both = D([[100, 80, 114, 100, 0.9, 1], [200, 180, 214, 200, 0.8, 0]], source="cloud")
    around_first = np.array([[80, 60, 140, 120]], np.float64)
    for scope, expect in (("regions", [[204, 180, 218, 200]]), ("answer", [])):
        cfg = CarryConfig(frames=30, min_match=0.5, scope=scope)
        c = Carrier()
        c.sent("cam", 0, frame(100, 0, second=200), cfg)
        c.answered("cam", 0, both, cfg)  # a whole frame (regions None)
        assert len(c.apply("cam", 1, frame(101, 1, second=201), NONE, cfg)) == 2
        c.sent("cam", 2, frame(102, 2, second=202), cfg)
        c.answered("cam", 2, NONE, cfg, regions=around_first)
        out = c.apply("cam", 4, frame(104, 4, second=204), NONE, cfg)
        want = np.array(expect, np.float32).reshape(-1, 4)
        assert out.boxes.shape == want.shape and np.allclose(out.boxes, want, atol=1), scope
        if scope == "regions":  # both answers kept: the empty one still hides its region
            assert [layer.seq for layer in c._layers["cam"]] == [2, 0] and sources(out) == [CARRIED]
        # a later whole-frame answer replaces everything, whatever the scope
        c.sent("cam", 5, frame(105, 5, second=205), cfg)
        c.answered("cam", 5, NONE, cfg)
        assert c.apply("cam", 6, frame(106, 6, second=206), NONE, cfg) is NONE
        assert [layer.seq for layer in c._layers["cam"]] == [5]


def test_every_carried_answer_expires_after_its_own_frames():
    cfg = CarryConfig(frames=3, min_match=0.5, scope="regions")
    c = Carrier()
    c.sent("cam", 0, frame(100, 0, second=200), cfg)
    c.answered("cam", 0, D([[200, 180, 214, 200, 0.8, 0]], source="cloud"), cfg)
    c.sent("cam", 2, frame(100, 2, second=200), cfg)
    c.answered("cam", 2, CLOUD, cfg, regions=np.array([[80, 60, 140, 120]], np.float64))
    assert len(c.apply("cam", 3, frame(100, 3, second=200), NONE, cfg)) == 2
    # frame 4: the first answer is 4 frames old (past its 3), the second 2
    out = c.apply("cam", 4, frame(100, 4, second=200), NONE, cfg)
    assert out.boxes.shape == (1, 4) and np.allclose(out.boxes, [[100, 80, 114, 100]], atol=1)
    assert [layer.seq for layer in c._layers["cam"]] == [2]
    assert c.apply("cam", 6, frame(100, 6, second=200), NONE, cfg) is NONE and "cam" not in c._layers


def test_an_object_a_region_cut_is_carried_once_not_beside_the_edges_box():
    """The region of a region payload cut the object (its centre inside, right and bottom sides
    outside); the worker clipped the cloud's box to it. The escalated frame's record held one
    fused box, but the carrier was given the cut box: on the next frames it overlapped the edge's
    box of the object by 0.31 and was published beside it. It is now given the box with the sides
    the region cut taken from the edge's (the policy's merge.carried, as the daemon calls it)."""
    from edgewise.policy import parse_policy

    merge = parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: m}\n"
                         "spec:\n  merge: {strategy: fuse, carryFrames: 30}\n").spec.merge
    cfg = merge.carry()
    regions = np.array([[0, 0, 108, 91]], np.float32)
    edge0 = D([[100, 80, 114, 100, 0.8, 1]])
    cut = D([[100, 80, 108, 91, 0.9, 1]], source="cloud")
    assert merge.apply(edge0, cut, regions).box_sources() == ("fused",)
    c = Carrier()
    c.sent("cam", 10, frame(100), cfg)
    c.answered("cam", 10, merge.carried(edge0, cut, regions), cfg, regions)
    out = c.apply("cam", 11, frame(102, 11), D([[102, 80, 116, 100, 0.8, 1]]), cfg)
    assert sources(out) == ["fused"] and np.allclose(out.boxes[0], [102, 80, 116, 100])
    old = Carrier()  # the cut box as it came: the object twice
    old.sent("cam", 10, frame(100), cfg)
    old.answered("cam", 10, cut, cfg, regions)
    assert sorted(sources(old.apply("cam", 11, frame(102, 11), D([[102, 80, 116, 100, 0.8, 1]]), cfg))) == [
        CARRIED, "edge"]


def test_with_the_edge_floor_a_doubtful_edge_box_goes_while_a_whole_frame_answer_is_in_force():
    """The daemon's path (``Carrier.in_force`` then ``publish``): an answer that found nothing
    keeps ruling out the edge's doubtful box where it looked until its carryFrames run out."""
    cfg = CarryConfig(frames=3, min_match=0.5, edge_floor=0.5)
    doubtful = D([[200, 150, 214, 170, 0.3, 0]])
    c = Carrier()
    assert c.apply("cam", 0, frame(100, 0), doubtful, cfg) is doubtful  # no answer in force yet
    c.sent("cam", 1, frame(100, 1), cfg)
    c.answered("cam", 1, NONE, cfg)  # the whole frame: the cloud found nothing
    assert len(c.apply("cam", 2, frame(100, 2), doubtful, cfg)) == 0
    boxes, looked = c.in_force("cam", 4, frame(100, 4), cfg)
    assert len(boxes) == 0 and looked == (None,)
    # past its 3 frames the answer no longer rules: the edge's box is published again
    assert c.apply("cam", 5, frame(100, 5), doubtful, cfg) is doubtful
    # the floor off (the default): the answer in force does not drop it
    c.sent("cam", 6, frame(100, 6), CFG)
    c.answered("cam", 6, NONE, CFG)
    assert c.apply("cam", 7, frame(100, 7), doubtful, CFG) is doubtful


def test_answers_from_before_a_live_streams_outage_are_not_carried_after_it():
    """``merge.carryFrames`` counts frames, and a stream's frame numbers run on across an
    outage: a camera that reboots and comes back minutes later would have the cloud's boxes of
    the frame before the outage carried onto its first frames after it (found again on a
    scene that did not change, ``source: carried``), as if only a frame had passed. The
    pipeline lets the stream's answers go at its first frame after the capture shell's cut."""
    doc = yaml.safe_load(policy_yaml("carry", stream_modes={"cam": "never"}))
    doc["spec"]["merge"].update(carryFrames=30, carryMatch=0.5)
    policy = parse_policy(yaml.safe_dump(doc))
    cfg = policy.spec.merge.carry()
    records = []

    async def run():
        ready = asyncio.Event()
        queue = FrameQueue(2, "drop_oldest", ready)
        cap = Capturer("cam", CaptureSource("rtsp", "rtsp://127.0.0.1:9/cam"), queue)
        metrics = EdgeMetrics()
        escalating = Escalating("dev", {}, records.append, metrics)
        pipeline = Pipeline("dev", None, [cap], {"cam": queue}, ready, Decider(policy), escalating,
                            records.append, metrics)
        stages = {"preprocess": 0.0, "infer": 0.0, "postprocess": 0.0}

        def emit(seq):
            img = frame(100, seq)
            pipeline._emit(Frame("cam", seq, img, time.time_ns(), time.monotonic()), NONE, stages, time.monotonic())

        try:
            escalating.carrier.sent("cam", 0, frame(100), cfg)  # frame 0 went to the cloud ...
            escalating.carrier.answered("cam", 0, CLOUD, cfg)  # ... and its answer came back
            emit(1)
            escalating.carrier.sent("cam", 1, frame(100, 1), cfg)  # frame 1 went, its answer on its way
            cap.seq = 2
            cap._went_down("delivered no new frame for 5.0 s")  # the camera rebooted
            emit(2)  # its first frame minutes later, of the same scene
            escalating.carrier.answered("cam", 1, CLOUD, cfg)  # the answer to frame 1 comes back late
            emit(3)
        finally:
            pipeline.executor.shutdown(wait=True)

    asyncio.run(run())
    carried = {r.frame_seq: [d["source"] for d in r.detections] for r in records}
    assert carried == {1: [CARRIED], 2: [], 3: []}, carried


def test_with_the_edge_floor_an_answer_for_another_resolution_drops_nothing():
    """A stream whose resolution changed (a camera reconfigured, same stream id): the answers
    in force were for frames of the old size, their boxes are dropped (``step``), and where
    they looked is in the old frame's pixels, not a place the cloud saw on this frame. The
    edge's doubtful boxes of the new frames are kept, not dropped for carryFrames frames."""
    cfg = CarryConfig(frames=30, min_match=0.5, edge_floor=0.5)
    doubtful = D([[200, 150, 214, 170, 0.3, 0]])
    c = Carrier()
    c.sent("cam", 1, frame(100, 1), cfg)
    c.answered("cam", 1, NONE, cfg)  # the whole 320x240 frame: the cloud found nothing
    assert len(c.apply("cam", 2, frame(100, 2), doubtful, cfg)) == 0
    bigger = np.zeros((480, 640, 3), np.uint8)
    boxes, looked = c.in_force("cam", 3, bigger, cfg)
    assert len(boxes) == 0 and looked == ()
    assert c.apply("cam", 4, bigger, doubtful, cfg) is doubtful
