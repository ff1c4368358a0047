"""`edgewise demo` in its short mode: real processes end to end, summary and report checked.

The tiny random-weight models keep this fast; the policy adds a 30% random audit so
escalations (and the worker kill in the middle of them) are exercised whatever the
untrained edge model sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgewise_tools.demo import DemoConfig, run_demo
from edgewise_tools.demo.records import accounting, latest_per_frame

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def audit_policy(tmp_path) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "policy.yaml").read_text())
    doc["spec"]["auditFraction"] = 0.3
    doc["spec"]["budget"]["maxFraction"] = 0.5
    doc["spec"]["budget"]["maxPerSecond"] = 20.0
    doc["spec"]["budget"]["burst"] = 20
    doc["spec"]["deadlineMs"] = 3000
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_short_demo_loses_nothing_and_writes_the_report(tmp_path, tiny_model, small_model, audit_policy) -> None:
    out = tmp_path / "report"
    cfg = DemoConfig(edge_model=tiny_model, cloud_model=small_model, policy=audit_policy, frames=40, fps=10.0,
                     kill_seconds=2.0, out=out, live=False, preset="camera", size=(640, 360), score_frames=20)
    summary = run_demo(cfg)
    acct = summary["accounting"]
    assert summary["frames_generated"] == 80
    assert acct["frames"] == 80, "every generated frame must come out of the daemon"
    assert acct["escalated"] >= 5 and acct["answered"] == acct["escalated"] and acct["lost"] == 0
    assert [e["event"] for e in summary["events"]] == ["worker 0 killed (SIGKILL)", "worker 0 restarted"]
    assert 0 < summary["escalation_rate"] <= 0.6
    assert set(summary["accuracy"]) >= {"edge_only", "hybrid", "cloud_only"}
    assert summary["uplink"]["escalated_bytes"] < summary["uplink"]["all_frames_bytes"]
    assert summary["latency_ms"]["escalated_p50"] is not None
    saved = json.loads((out / "summary.json").read_text())
    assert saved["accounting"] == acct
    assert summary["world"] == {"preset": "camera", "size": [640, 360], "seed": 2026, "streams": 2,
                                "frames_per_stream": 40, "fps": 10.0}
    assert summary["accuracy"]["scored_frames"] == 20 and summary["accuracy"]["scored_every"] == 4
    assert summary["cloud_cpu"]["seconds"] > 0 and summary["cloud_cpu"]["ms_per_escalation"] > 0
    assert summary["provenance"]["models"]["cloud"]["sha256"] and summary["provenance"]["data"]["demo"]["preset"] == "camera"
    page = (out / "index.html").read_text()
    assert "edgewise demo report" in page and page.count("data:image/png;base64,") == 4
    assert "How these figures relate to the README's headline" in page and "Produced by edgewise" in page


def test_records_keep_the_cloud_answer_over_the_spooled_copy() -> None:
    spooled = {"stream": "cam0", "frame_seq": (3 << 32) | 7, "escalated": True, "outcome": "spooled"}
    late = dict(spooled, outcome="cloud", late=True)
    edge = {"stream": "cam0", "frame_seq": (3 << 32) | 8, "escalated": False, "outcome": "edge"}
    final = latest_per_frame([spooled, edge, late, dict(spooled)])  # a re-spooled copy after the answer
    assert final[("cam0", 7)]["outcome"] == "cloud"
    acct = accounting(final)
    assert acct == {"frames": 2, "escalated": 1, "answered": 1, "answered_late": 1, "still_spooled": 0,
                    "edge_only_fallback": 0, "lost": 0}


def test_demo_shows_the_world_the_cloud_model_was_trained_for(tmp_path, tiny_model) -> None:
    import onnx

    episodes = DemoConfig(cloud_model=tiny_model)  # no edgewise_world metadata: the episodes pair
    assert (episodes.preset, episodes.frame_size, episodes.frames, episodes.score_frames) == ("episodes", (224, 224), 200, 0)
    assert episodes.policy_file == ROOT / "examples" / "policies" / "episodes.yaml"
    model = onnx.load(str(tiny_model))
    prop = model.metadata_props.add()
    prop.key, prop.value = "edgewise_world", "camera"  # what the camera packaging writes
    onnx.save(model, str(tmp_path / "camera.onnx"))
    camera = DemoConfig(cloud_model=tmp_path / "camera.onnx", frames=30)
    assert (camera.preset, camera.frame_size, camera.frames, camera.score_frames) == ("camera", (1280, 720), 30, 100)
    assert camera.policy_file == ROOT / "examples" / "policy.yaml" and camera.policy_file.is_file()
    assert DemoConfig(cloud_model=tmp_path / "missing.onnx").preset == "episodes"


def test_demo_config_rejects_missing_models(tmp_path) -> None:
    from edgewise.errors import ConfigError

    with pytest.raises(ConfigError, match="demo edge-model: .* not found"):
        DemoConfig(edge_model=tmp_path / "nope.onnx").validate()


def test_too_few_frames_are_one_rule_with_one_message(tiny_model, small_model) -> None:
    """``--frames`` (edgewise_tools.cli.demo) and ``DemoConfig.frames`` are one rule: the config said
    only "demo needs >= 1 stream, >= 10 frames, ..." of what the flag names itself."""
    from edgewise.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--frames 9: must be >= 10 \(frames per stream"):
        DemoConfig(edge_model=tiny_model, cloud_model=small_model, frames=9).validate()


@pytest.mark.parametrize("field, value, said", [("streams", 0, "demo --streams 0: must be >= 1"),
                                                ("workers", 0, "demo --workers 0: must be >= 1"),
                                                ("fps", -1.0, "demo --fps -1.0: must be > 0")])
def test_a_count_out_of_range_is_named_alone(tiny_model, small_model, field, value, said) -> None:
    """``--streams 0`` was refused as "demo needs >= 1 stream, fps > 0, >= 1 worker and >= 0
    scored frames": four rules for the one flag that was wrong."""
    from edgewise.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        DemoConfig(edge_model=tiny_model, cloud_model=small_model, **{field: value}).validate()
    assert str(e.value) == said


def test_a_policy_or_model_that_cannot_be_read_is_refused_before_anything_starts(
        tmp_path, tiny_model, capsys, monkeypatch) -> None:
    """A policy that is not UTF-8 was a traceback (the demo's own copy of it); a damaged edge model
    failed only in the edge daemon, after the frames were generated and the cloud was warm."""
    import tempfile

    from edgewise.cli import main

    made = []
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(1) or str(tmp_path / "work"))
    policy = tmp_path / "policy.yaml"
    policy.write_bytes(b"\xff\xfe spec: {}\n")
    broken = tmp_path / "edge.onnx"
    broken.write_bytes(b"\x08\x07garbage" * 50)
    for extra, said in ((["--policy", str(policy)], f"{policy}: not UTF-8 text ("),
                        (["--edge-model", str(broken)], f"demo --edge-model: {broken} is not a valid ONNX model")):
        assert main(["demo", "--cloud-model", str(tiny_model), "--out", str(tmp_path / "report"), *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"edgewise: error: {said}") and err.count("\n") == 1, err
    assert not made  # no work dir: nothing was started


def test_make_demo_defaults_point_at_shipped_files() -> None:
    cfg = DemoConfig()  # the camera pair: its cloud model sees what the edge model cannot
    assert cfg.preset == "camera" and cfg.frame_size == (1280, 720)
    assert cfg.policy_file == ROOT / "examples" / "policy.yaml"
    for p in (cfg.edge_model, cfg.cloud_model, cfg.policy_file):
        assert Path(p).is_file(), f"{p} is what `make demo` runs with; it must ship in the repository"
