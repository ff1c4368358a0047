"""Region payloads end to end: the daemon's motion detector proposes regions, one packed image
per escalated frame goes through the real gateway to a real worker running a model at native
size, and the boxes come back in frame pixels, merged, once per frame."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from edge.daemon import EdgeDaemon
from edgewise.synth import PRESETS, SynthJob, generate
from tests.conftest import in_process_cloud_class
from tests.edge.helpers import policy_yaml, read_jsonl
from tests.edge.test_pipeline import base_settings

# before any fixture builds a model (the Jetson lane's Python 3.8 has no torch)
pytestmark = pytest.mark.skipif(sys.version_info < (3, 10), reason="the in-process cloud tier needs Python >= 3.10 "
                                "(the Jetson lane checks the device against a gateway process instead)")


def test_regions_of_unexplained_motion_are_sent_packed_and_merged_back(tmp_path: Path, tiny_model: Path,
                                                                       native_model: Path) -> None:
    data = tmp_path / "cam"
    generate(SynthJob(out=data, frames=24, streams=1, seed=3, split="test", width=640, height=360,
                      difficulty=PRESETS["camera"]))
    # every frame is a candidate; a shared CPU may answer slowly, and this test is not about the spool
    doc = yaml.safe_load(policy_yaml("regions", mode="regions", threshold=0.0, deadline_ms=60000))
    doc["spec"]["signals"] = {"weights": {"missed_object": 1.0, "motion_blobs": 1.0, "motion": 1.0},
                              "motion": {"warmupFrames": 2}}
    doc["spec"]["payload"]["regionMin"] = 48
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(doc))
    InProcessCloud = in_process_cloud_class()
    with InProcessCloud(native_model) as cloud:
        s = base_settings(tmp_path, tiny_model, [{"id": "cam", "kind": "folder", "uri": str(data / "images"),
                                                  "fps": 20}],
                          policy_file=str(tmp_path / "policy.yaml"), cloud={"endpoints": [cloud.address], "max_in_flight": 64},
                          # the last escalations' answers are waited for as a run over files waits for them
                          spool={"path": str(tmp_path / "spool.db"), "replay_interval_s": 0.2, "replay_at_end_s": 120})
        assert asyncio.run(EdgeDaemon(s).run()) == 0
    final = {}
    for r in read_jsonl(tmp_path / "out.jsonl"):  # the last record of a frame is its result
        final[r["frame_seq"]] = r
    assert sorted(final) == list(range(24))
    recs = list(final.values())
    assert all(r["escalated"] and r["outcome"] == "cloud" for r in recs), [(r["frame_seq"], r["outcome"], r.get("error")) for r in recs if r["outcome"] != "cloud"]
    assert all({"motion", "motion_blobs"} <= set(r["signals"]) for r in recs)
    packed = [r for r in recs if r.get("regions")]
    assert packed, "the camera's moving digits must give unexplained motion, hence regions"
    full_bytes = max(r["payload_bytes"] for r in recs if not r.get("regions"))
    for r in packed:
        assert r["payload"] == "regions" and r["payload_bytes"] < full_bytes
        for x1, y1, x2, y2 in r["regions"]:
            assert 0 <= x1 < x2 <= 640 and 0 <= y1 < y2 <= 360
        for det in r["detections"]:  # cloud boxes mapped back into the frame
            x1, y1, x2, y2 = det["box"]
            assert 0 <= x1 <= x2 <= 640 and 0 <= y1 <= y2 <= 360
    assert any(det["source"] == "cloud" for r in packed for det in r["detections"])
    assert all(r["signals"]["motion"] == 0.0 for r in recs if r["frame_seq"] < 2)  # warm-up
