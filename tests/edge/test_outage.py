"""A live stream's outage in the pipeline: the frames after it are not compared with the frames
before it. Its tracker and motion model start afresh at its first frame after the capture
shell's cut, as at a stream's start (the carried answers: tests/edge/test_carrying.py)."""

from __future__ import annotations

import asyncio
import time
from typing import List

import numpy as np
import yaml

from edge.deciding import Decider
from edge.metrics import EdgeMetrics
from edge.pipeline import Pipeline
from edge.records import FrameRecord
from edge.sources import CaptureSource
from edge.sources.base import Frame
from edge.sources.capturing import Capturer, FrameQueue
from edgewise.detections import Detections
from edgewise.policy import parse_policy
from tests.edge.helpers import policy_yaml

H, W = 240, 320
BACKGROUND = (np.random.default_rng(0).random((H, W)) * 60 + 90).astype(np.uint8)


def scene(cars, k):
    """The same textured background, sensor noise, dark 40x24 cars at ``cars``."""
    img = BACKGROUND.astype(np.int16) + np.random.default_rng(k).integers(-3, 4, (H, W))
    for x, y in cars:
        img[y:y + 24, x:x + 40] = 30
    return np.repeat(np.clip(img, 0, 255).astype(np.uint8)[..., None], 3, 2)


def boxes(cars):
    b = np.array([[x, y, x + 40, y + 24] for x, y in cars], np.float32).reshape(-1, 4)
    return Detections(b, np.full(len(b), 0.9, np.float32), np.zeros(len(b), np.int32), names=("car",), source="edge")


def test_a_stream_back_after_an_outage_is_not_hard_for_what_changed_while_it_was_down():
    """Parked cars left while the camera was down. Compared with the frames before the outage,
    its first frames back had every confirmed track vanish (``tracker_disagreement`` 1.0, hard
    at the example policy's weight 0.8: one escalation per reconnect, every reconnect of a
    flapping camera) and the cars' old places as unexplained motion (``motion`` 1.0) until the
    background model relearned them. A stream that starts, or changes resolution, starts both
    afresh; a stream back from an outage now does too."""
    doc = yaml.safe_load(policy_yaml("outage", stream_modes={"cam": "never"}))
    doc["spec"]["signals"] = {"combine": "max", "weights": {"tracker_disagreement": 0.8, "motion": 0.4}}
    policy = parse_policy(yaml.safe_dump(doc))
    records: List[FrameRecord] = []

    async def run():
        ready = asyncio.Event()
        queue = FrameQueue(2, "drop_oldest", ready)
        cap = Capturer("cam", CaptureSource("rtsp", "rtsp://127.0.0.1:9/cam"), queue)
        pipeline = Pipeline("dev", None, [cap], {"cam": queue}, ready, Decider(policy), None, records.append,
                            EdgeMetrics())
        stages = {"preprocess": 0.0, "infer": 0.0, "postprocess": 0.0}

        def emit(seq, cars):
            pipeline._emit(Frame("cam", seq, scene(cars, seq), time.time_ns(), time.monotonic()), boxes(cars),
                           stages, time.monotonic())

        try:
            before, after = [(20, 30), (150, 100), (250, 180)], [(60, 190)]
            for seq in range(40):
                emit(seq, before)
            cap.seq = 40
            cap._went_down("delivered no new frame for 5.0 s")  # the camera rebooted
            for seq in range(40, 50):  # minutes later: two cars gone, one new
                emit(seq, after)
        finally:
            pipeline.executor.shutdown(wait=True)

    asyncio.run(run())
    back = [r.signals for r in records if r.frame_seq >= 40]
    assert [s["tracker_disagreement"] for s in back] == [0.0] * 10, back
    assert [s["motion"] for s in back] == [0.0] * 10, back
