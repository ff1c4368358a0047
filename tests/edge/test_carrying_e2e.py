"""Carrying end to end: the real daemon escalates a camera stream every few frames through a
real in-process cloud, and the frames between publish the cloud's boxes found again on their
own pixels (``source: carried``); with ``merge.carryFrames: 0`` they publish the edge's alone."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from edge.daemon import EdgeDaemon
from edgewise.synth import PRESETS, SynthJob, generate
from tests.conftest import in_process_cloud_class
from tests.edge.helpers import policy_yaml, read_jsonl
from tests.edge.test_pipeline import base_settings

pytestmark = pytest.mark.skipif(sys.version_info < (3, 10), reason="the in-process cloud tier needs Python >= 3.10 "
                                "(the Jetson lane checks the device against a gateway process instead)")

FRAMES = 30


def _daemon(tmp_path: Path, tiny_model: Path, native_model: Path, doc: Dict[str, Any], tag: str) -> Path:
    """Run the daemon over the camera stream under the policy ``doc`` (written to
    ``policy-<tag>.yaml``) against an in-process cloud; its output folder."""
    data = tmp_path / "cam"
    if not data.exists():
        generate(SynthJob(out=data, frames=FRAMES, streams=1, seed=5, split="test", width=640, height=360,
                          difficulty=PRESETS["camera"]))
    policy = tmp_path / f"policy-{tag}.yaml"
    policy.write_text(yaml.safe_dump(doc))
    out = tmp_path / f"run-{tag}"
    out.mkdir()
    with in_process_cloud_class()(native_model) as cloud:
        s = base_settings(out, tiny_model, [{"id": "cam", "kind": "folder", "uri": str(data / "images"), "fps": 20}],
                          policy_file=str(policy), cloud={"endpoints": [cloud.address], "max_in_flight": 64},
                          # the last escalations' answers are waited for as a run over files waits for them
                          spool={"path": str(out / "spool.db"), "replay_interval_s": 0.2, "replay_at_end_s": 120})
        assert asyncio.run(EdgeDaemon(s).run()) == 0
    return out


def _run(tmp_path: Path, tiny_model: Path, native_model: Path, carry_frames: int,
         regions_scope: bool = False) -> List[Dict[str, Any]]:
    doc = yaml.safe_load(policy_yaml("carry", threshold=0.0, deadline_ms=60000))
    # every frame is hard; the cooldown (0.25 s at 20 fps: 5 frames) spaces the escalations
    doc["spec"]["cooldownSeconds"] = 0.25
    doc["spec"]["merge"]["carryFrames"] = carry_frames
    tag = f"{carry_frames}{'-regions' if regions_scope else ''}"
    if regions_scope:  # region payloads (around unexplained motion, as tests/edge/test_regions_e2e.py)
        doc["spec"]["merge"]["carryScope"] = "regions"
        doc["spec"]["payload"].update(mode="regions", regionMin=48)
        doc["spec"]["signals"] = {"weights": {"missed_object": 1.0, "motion_blobs": 1.0, "motion": 1.0},
                                  "motion": {"warmupFrames": 2}}
    out = _daemon(tmp_path, tiny_model, native_model, doc, tag)
    final: Dict[int, Dict[str, Any]] = {}
    for r in read_jsonl(out / "out.jsonl"):  # the last record of a frame is its result
        final[r["frame_seq"]] = r
    assert sorted(final) == list(range(FRAMES))
    return [final[k] for k in sorted(final)]


def test_the_clouds_boxes_are_carried_between_escalations(tmp_path: Path, tiny_model: Path,
                                                          native_model: Path) -> None:
    recs = _run(tmp_path, tiny_model, native_model, carry_frames=30)
    answered = [r["frame_seq"] for r in recs if r["escalated"] and r["outcome"] == "cloud"
                and any(d["source"] in ("cloud", "fused") for d in r["detections"])]
    assert answered, "the cloud must answer with boxes for this test to mean anything"
    assert any(not r["escalated"] for r in recs), "the cooldown must leave frames between escalations"
    carried = [r for r in recs if any(d["source"] == "carried" for d in r["detections"])]
    assert carried, "frames between escalations must carry the cloud's boxes"
    for r in carried:
        assert not r["escalated"]
        assert any(a < r["frame_seq"] for a in answered)  # only after an answer with boxes
        for d in r["detections"]:
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 < x2 <= 640 and 0 <= y1 < y2 <= 360
    assert all(d["source"] != "carried" for r in recs[:answered[0] + 1] for d in r["detections"])

    off = _run(tmp_path, tiny_model, native_model, carry_frames=0)
    assert not any(d["source"] == "carried" for r in off for d in r["detections"])


def test_under_scope_regions_the_daemon_keeps_older_answers_under_region_answers(
        tmp_path: Path, tiny_model: Path, native_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon hands each answer's regions (those its request sent) to the carrier, which
    keeps the older answers under a region answer (watched at the carrier; the rule itself is
    tests/edge/test_carrying.py's)."""
    from edge.carrying import Carrier

    seen: Dict[int, Any] = {}
    layers: List[int] = []
    answered = Carrier.answered

    def watch(self: Carrier, stream: str, seq: int, cloud: Any, cfg: Any, regions: Any = None) -> None:
        answered(self, stream, seq, cloud, cfg, regions)
        seen[seq] = None if regions is None else regions.tolist()
        layers.append(len(self._layers.get(stream, [])))

    monkeypatch.setattr(Carrier, "answered", watch)
    recs = _run(tmp_path, tiny_model, native_model, carry_frames=30, regions_scope=True)
    by_seq = {r["frame_seq"]: r for r in recs}
    assert seen and all(by_seq[k]["escalated"] for k in seen)
    for k, regions in seen.items():  # the regions the request sent, or None for a whole frame
        sent = by_seq[k].get("regions") or None
        assert regions == (None if sent is None else [[float(v) for v in box] for box in sent]), k
    assert any(r is not None for r in seen.values()), "the moving digits must give region payloads"
    assert max(layers) >= 2, "a region answer within 30 frames of an older one keeps it underneath"


def test_a_carry_aware_policy_decides_on_the_carried_state_and_its_records_replay_exactly(
        tmp_path: Path, tiny_model: Path, native_model: Path, capsys: pytest.CaptureFixture) -> None:
    """The daemon computes the carry-state features from its carrier before deciding (a gain
    model fitted on them: the longer since the stream's last escalation, the higher; threshold 0.6:
    a stream's first frame, then about 18 frames after each escalation), records
    them with the signals, and `check-policy --replay` decides every frame as it did."""
    import json

    import numpy as np

    from edgewise.cli import main
    from edgewise.hardness.carrystate import CARRY_FEATURES
    from edgewise.hardness.learned import FEATURE_NAMES, GainModel

    rows = np.random.default_rng(0).random((400, len(FEATURE_NAMES)))
    GainModel.fit(rows, rows[:, FEATURE_NAMES.index("answer_age")], {}, features=FEATURE_NAMES).save(
        tmp_path / "carry.json")
    doc = yaml.safe_load(policy_yaml("carry-aware", threshold=0.6, deadline_ms=60000))
    doc["spec"]["signals"] = {"learnedModel": "carry.json"}
    doc["spec"]["cooldownSeconds"] = 0.1
    doc["spec"]["merge"]["carryFrames"] = 30
    out = _daemon(tmp_path, tiny_model, native_model, doc, "carry-aware")
    policy = tmp_path / "policy-carry-aware.yaml"
    recs = read_jsonl(out / "out.jsonl")
    assert all(set(CARRY_FEATURES) <= set(r["signals"]) for r in recs)
    first = min(recs, key=lambda r: r["frame_seq"])
    assert first["signals"]["answer_age"] == 1.0  # nothing escalated before the first frame
    escalated = sorted({r["frame_seq"] for r in recs if r["escalated"]})
    assert 1 < len(escalated) < FRAMES, "the state must make some frames worth escalating and others not"
    after = [r for r in recs if r["frame_seq"] == escalated[0] + 1]
    assert after and after[0]["signals"]["answer_age"] == round(1 / 30, 4)  # one frame after the escalation
    assert main(["edge", "check-policy", str(policy), "--replay", str(out / "out.jsonl"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)["replay"]
    mine = rep["sides"][0]["reproduction"]
    assert mine["checked"] == FRAMES and mine["agreed"] == mine["checked"], mine["mismatches"]
