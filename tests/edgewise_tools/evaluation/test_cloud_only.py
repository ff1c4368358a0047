"""The cloud-only reference of `edgewise eval` and `check-policy --data` is the cloud model alone.

Every frame escalated and merged under a ``fuse`` policy keeps the edge's boxes the cloud did not
confirm (above ``edgeFloor``): a hybrid, not the cloud. It was the denominator of every "% of
cloud-only F1", the gap closed and the edge's mAP ratio, and its "F1 vs cloud" was below 1."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, List

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.policy.schema import Merge
from edgewise_tools.evaluation import evaluating, hybrid
from edgewise_tools.evaluation.evaluating import EvalConfig, run_eval
from edgewise_tools.evaluation.frames import FrameRecord

ROOT = Path(__file__).resolve().parents[3]
FUSE = Merge(strategy="fuse", iou=0.55, edge_floor=0.5)
OBJ, GHOST = [10, 10, 30, 30], [60, 60, 80, 80]


def _d(boxes: List[List[float]], scores: List[float], source: str) -> Detections:
    return Detections(boxes=np.asarray(boxes, np.float32).reshape(-1, 4), scores=np.asarray(scores, np.float32),
                      class_ids=np.zeros(len(scores), np.int32), names=("a", "b"), source=source)


def _records(streams: int = 1, frames: int = 2) -> List[FrameRecord]:
    """The cloud finds the one object; the edge finds it too and, confidently, a ghost."""
    out = []
    for s in range(streams):
        for f in range(frames):
            edge = _d([OBJ, GHOST], [0.9, 0.8], "edge")
            cloud = _d([OBJ], [0.9], "cloud")
            out.append(FrameRecord(stream=s, frame=f, width=100, height=100,
                                   gt_boxes=np.asarray([OBJ], np.float32), gt_cls=np.zeros(1, np.int32),
                                   edge=edge, cloud=cloud, edge_all=edge, cloud_all=cloud, jpeg_bytes=100))
    return out


def test_cloud_only_is_the_cloud_model_not_every_frame_fused() -> None:
    records = _records()
    fused = hybrid.evaluate(records, np.ones(len(records), bool), 2, FUSE)
    assert fused["f1"] == pytest.approx(2 / 3) and fused["f1_vs_cloud"] < 1.0  # the ghost stays
    alone, per_frame = hybrid.cloud_only(records, 2)
    assert alone["f1"] == 1.0 and alone["f1_vs_cloud"] == 1.0 and alone["map50"] == 1.0
    assert per_frame.tolist() == [[1, 0, 0]] * len(records)
    assert alone["uplink_saved"] == 0.0 and alone["escalated"] == 1.0


def test_run_eval_scores_cloud_only_as_the_cloud_under_a_fuse_policy(tmp_path, monkeypatch) -> None:
    from edgewise.synth import PRESETS, SynthJob, generate

    data = tmp_path / "test"
    generate(SynthJob(out=data, frames=2, streams=2, seed=5, split="test", width=96, height=64,
                      difficulty=PRESETS["easy"]))
    records = _records(streams=2)

    def loaded(*_a: Any, **_k: Any) -> Any:
        return SimpleNamespace(names=("a", "b"), input_size="model")

    monkeypatch.setattr(evaluating.Detector, "from_file", loaded)
    monkeypatch.setattr(evaluating, "_collect", lambda *_a, **_k: records)
    policy = tmp_path / "policy.yaml"  # the camera example policy (merge fuse, edgeFloor 0.5), whole frames
    text = (ROOT / "examples" / "policy.yaml").read_text()
    assert "strategy: fuse" in text and "mode: regions " in text
    policy.write_text(text.replace("mode: regions ", "mode: full "))
    result = run_eval(EvalConfig(edge=tmp_path / "e.onnx", cloud=tmp_path / "c.onnx", policy=policy, data=data,
                                 rates=(0.5,), target_rate=0.5, samples=40, payloads=("full",)))
    cloud = result["baselines"]["cloud_only"]
    assert cloud["f1"] == 1.0 and cloud["f1_vs_cloud"] == 1.0 and cloud["f1_ci"] == [1.0, 1.0]
    assert result["payloads"]["full"]["cloud_only"]["f1"] == 1.0
    assert result["target"]["edge_f1_ratio"] == pytest.approx(2 / 3)


def test_with_a_reference_quality_of_its_own_cloud_only_is_the_reference_not_the_policys_whole_frame(
        tmp_path, monkeypatch) -> None:
    """`--reference-quality`: cloud only (the denominator of every share) and the uplink are the
    reference's; the policy's whole frame at its own quality is a payload row, and the verdict
    also says what the same escalations save against every frame at the policy's quality."""
    from edgewise.synth import PRESETS, SynthJob, generate
    from edgewise_tools.evaluation import report
    from edgewise_tools.evaluation.frames import ModeResult

    data = tmp_path / "test"
    generate(SynthJob(out=data, frames=2, streams=2, seed=5, split="test", width=96, height=64,
                      difficulty=PRESETS["easy"]))
    records = _records(streams=2)
    for r in records:  # at the policy's lower quality the cloud misses the object, in half the bytes
        r.modes["full"] = ModeResult(_d([], [], "cloud"), _d([], [], "cloud"), 50, None, whole=True)
    monkeypatch.setattr(evaluating.Detector, "from_file",
                        lambda *_a, **_k: SimpleNamespace(names=("a", "b"), input_size="model"))
    monkeypatch.setattr(evaluating, "_collect", lambda *_a, **_k: records)
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "examples" / "policies" / "whole-frames.yaml").read_text())
    result = run_eval(EvalConfig(edge=tmp_path / "e.onnx", cloud=tmp_path / "c.onnx", policy=policy, data=data,
                                 rates=(0.5,), target_rate=0.5, samples=40, payloads=("full",),
                                 reference_quality=85))
    assert result["baselines"]["cloud_only"]["f1"] == 1.0 and result["baselines"]["cloud_only"]["uplink_saved"] == 0
    full = result["payloads"]["full"]["cloud_only"]
    assert full["f1"] < 1.0 and full["uplink_saved"] == 0.5 and full["bytes_per_escalation"] == 50
    assert (result["reference_quality"], result["payload_quality"]) == (85, 60)
    assert result["uplink_all_frames_bytes"] == 400 and result["uplink_all_frames_bytes_at_payload_quality"] == 200
    assert result["target"]["ours_uplink_saved"] == pytest.approx(0.75)  # 2 of 4 frames, 50 of 100 bytes each
    text = report.markdown(result)
    assert "payload `full` at JPEG quality 60, against a reference of every frame whole at quality 85" in text
    assert ("against every frame whole at full resolution at JPEG quality 85: 75.0% -> NOT met (against every "
            "frame whole at the payload's own JPEG quality 60, which a cloud-only deployment could send too: "
            "50.0%)") in text
    with pytest.raises(evaluating.ConfigError, match="--reference-quality 101: a JPEG quality is 1..100"):
        run_eval(EvalConfig(edge=tmp_path / "e.onnx", cloud=tmp_path / "c.onnx", policy=policy, data=data,
                            reference_quality=101))


def test_the_training_frames_are_not_sent_at_the_reference_quality_too(tmp_path, monkeypatch) -> None:
    """The learned policies are fitted on what escalating sends (``sent(mode)``), never on the
    reference: with a reference quality of its own, collecting the training set at it ran the
    cloud a second time on every training frame, the whole frame at the reference quality, for
    nothing (about 6 of the 33 minutes of the camera run's cloud time)."""
    from edgewise.synth import PRESETS, SynthJob, generate

    data, train = tmp_path / "test", tmp_path / "train"
    for out, seed in ((data, 5), (train, 6)):
        generate(SynthJob(out=out, frames=2, streams=2, seed=seed, split="test", width=96, height=64,
                          difficulty=PRESETS["easy"]))
    asked = {}

    def collect(folder, edge, cloud, policy, modes, limit=None, progress=None, reference_quality=None):
        asked[Path(folder).name] = reference_quality
        records = _records(streams=2)
        for r in records:
            r.modes["full"] = r.sent("full")
        return records

    monkeypatch.setattr(evaluating.Detector, "from_file",
                        lambda *_a, **_k: SimpleNamespace(names=("a", "b"), input_size="model"))
    monkeypatch.setattr(evaluating, "collect", collect)
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "examples" / "policies" / "whole-frames.yaml").read_text())
    run_eval(EvalConfig(edge=tmp_path / "e.onnx", cloud=tmp_path / "c.onnx", policy=policy, data=data,
                        train_data=train, rates=(0.5,), target_rate=0.5, samples=40, payloads=("full",),
                        reference_quality=85))
    assert asked == {"test": 85, "train": None}
