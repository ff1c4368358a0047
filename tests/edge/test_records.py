"""The per-frame record: its JSON keeps the field names other tools read, new fields
are additive, it is built from the policy's Decision with the whole explanation, and
a spooled record written by an older daemon still reads back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge.deciding import Decider
from edge.records import FrameRecord
from edgewise.detections import Detections
from edgewise.policy.loading import parse_policy
from tests.edge.helpers import frame_record, policy_yaml

#: The keys a record had before it was typed (edgewise_tools.demo, bench/ and the tests read them).
LEGACY_KEYS = {"device", "stream", "frame_seq", "capture_unix_ns", "emit_unix_ns", "width", "height",
               "detections", "escalated", "reason", "suppressed_by", "hardness", "signals",
               "policy_generation", "policy", "latency_ms", "cloud_rtt_ms", "outcome", "late"}


def test_json_keeps_every_legacy_key_adds_the_explanation_and_omits_unset_optionals():
    rec = frame_record("cam", 7)
    doc = json.loads(rec.to_json())
    assert LEGACY_KEYS <= set(doc)
    assert set(doc) - LEGACY_KEYS == {"detail", "threshold", "origin", "priority", "read_unix_ns", "capture_clock",
                                      "decided_s", "edge_boxes", "edge_classes", "edge_max_score", "policy_digest"}
    assert doc["frame_seq"] == 7 and doc["cloud_rtt_ms"] is None and doc["late"] is False
    rec.error, rec.crop, rec.cloud_model, rec.payload_bytes = "UNAVAILABLE: down", [1, 2, 3, 4], "big", 1234
    doc = json.loads(rec.to_json())
    assert (doc["error"], doc["crop"], doc["cloud_model"], doc["payload_bytes"]) == (
        "UNAVAILABLE: down", [1, 2, 3, 4], "big", 1234)
    assert b"\n" not in rec.to_json() and rec.key == "dev/cam/7"


def test_from_dict_reads_an_older_daemons_spooled_record_and_rejects_what_is_not_one():
    old = {k: v for k, v in frame_record("cam", 3).to_dict().items() if k in LEGACY_KEYS}
    old["some_future_field"] = 1
    rec = FrameRecord.from_dict(old)
    assert rec.frame_seq == 3 and rec.detail == "" and rec.threshold == 0.0
    assert FrameRecord.from_dict(rec.to_dict()) == rec
    with pytest.raises(ValueError, match="not a frame record"):
        FrameRecord.from_dict({"stream": "cam"})
    with pytest.raises(ValueError, match="not a frame record"):
        FrameRecord.from_dict(dict(old, frame_seq="7"))


def test_the_decision_reaches_the_verdict_whole():
    """The Decider passes the policy's Decision through (detail, threshold, origin are
    no longer dropped) next to the policy generation and what deciding cost."""
    policy = parse_policy(policy_yaml("p", threshold=0.0))
    dets = Detections(boxes=np.array([[1, 2, 30, 40]], np.float32), scores=np.array([0.5], np.float32),
                      class_ids=np.array([0], np.int32), names=("a",), source="edge")
    decider = Decider(policy, clock=lambda: 100.0)
    v = decider.decide("cam", 1, dets, (64, 48))
    d = v.decision
    assert d.escalate and d.reason == "hard" and d.origin == "global" and d.threshold == 0.0
    assert d.detail.startswith("hardness ") and ">= threshold 0.000 (global)" in d.detail
    assert d.policy_name == "p" and v.policy_generation == 1 and v.cost_ms > 0
    # the rest of what the decision read, for the record (and a replay of it)
    assert v.now == 100.0 and v.facts == (("a",), 1, 0.5) and len(v.policy_digest) == 12
    assert all(round(x, 4) == x for x in d.signals.values())
    v = Decider(None).decide("cam", 1, dets, (64, 48))
    assert not v.decision.escalate and v.decision.reason == "no policy" and "no policy file" in v.decision.detail


def test_motion_runs_only_when_the_policy_uses_it_and_its_blobs_reach_the_verdict():
    import yaml

    empty = Detections.empty(("a",), "edge")
    rng = np.random.default_rng(0)
    base = rng.integers(60, 120, (360, 640, 3)).astype(np.uint8)
    moved = base.copy()
    moved[100:108, 300:308] = 250  # a small object appears: motion no detection explains
    plain = Decider(parse_policy(policy_yaml("p")))
    v = plain.decide("cam", 0, empty, (640, 360), frame=base)
    assert v.motion_blobs is None and v.decision.signals["motion"] == 0.0 and not plain.motion
    doc = yaml.safe_load(policy_yaml("m", threshold=0.3))
    doc["spec"]["signals"] = {"weights": {"motion_blobs": 1.0}, "motion": {"warmupFrames": 3, "blobSaturation": 1}}
    decider = Decider(parse_policy(yaml.safe_dump(doc)))
    for seq in range(4):
        v = decider.decide("cam", seq, empty, (640, 360), frame=base)
        assert not v.decision.escalate and v.motion_blobs is not None and len(v.motion_blobs) == 0
    v = decider.decide("cam", 4, empty, (640, 360), frame=moved)
    assert v.decision.signals["motion_blobs"] == 1.0 and v.decision.escalate and v.decision.reason == "hard"
    (x1, y1, x2, y2), = v.motion_blobs
    assert x1 <= 300 and y1 <= 100 and x2 >= 308 and y2 >= 108
    # new motion settings on reload: a fresh background model; a policy without motion drops it
    doc["spec"]["signals"]["motion"]["varThreshold"] = 30
    decider.swap(parse_policy(yaml.safe_dump(doc)))
    assert decider.decide("cam", 5, empty, (640, 360), frame=moved).decision.signals["motion"] == 0.0  # warm-up
    decider.swap(parse_policy(policy_yaml("p")))
    decider.decide("cam", 6, empty, (640, 360), frame=moved)
    assert "cam" not in decider.motion
