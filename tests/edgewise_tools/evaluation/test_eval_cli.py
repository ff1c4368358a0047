"""`edgewise eval` end to end on real models and a real generated held-out set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgewise.cli import main
from edgewise.hardness.carrystate import CARRY_FEATURES
from edgewise.hardness.learned import GainModel

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_sets(tmp_path_factory):
    from edgewise.synth import PRESETS, SynthJob, generate

    root = tmp_path_factory.mktemp("evaldata")
    for split, seed in (("test", 7), ("train", 3)):
        generate(SynthJob(out=root / split, frames=6, streams=2, seed=seed, split=split, width=160, height=120,
                          difficulty=PRESETS["medium"]))
    return root


def test_eval_writes_json_markdown_and_plot(tiny_sets, tiny_model, small_model, tmp_path, capsys) -> None:
    out = tmp_path / "report"
    policy = tmp_path / "policy.yaml"  # the camera example policy, downscaling the 160 px test frames to 96
    text = (ROOT / "examples" / "policy.yaml").read_text()
    assert "downscaleWidth: 640" in text
    policy.write_text(text.replace("downscaleWidth: 640", "downscaleWidth: 96"))
    rc = main(["eval", "--edge", str(tiny_model), "--cloud", str(small_model),
               "--policy", str(policy), "--data", str(tiny_sets / "test"),
               "--train-data", str(tiny_sets / "train"), "--out", str(out), "--rates", "0.25,0.5", "--target-rate", "0.25",
               "--threads", "1"])
    assert rc == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["frames"] == 12
    assert set(result["at_rates"]) == {"random", "sedna_threshold", "sedna_ibt", "combined", "learned", "learned_carry",
                                       "oracle"}
    assert result["target"]["best_policy"] != "oracle" and "oracle_f1_fraction" in result["target"]
    for name, rows in result["at_rates"].items():
        assert [r["rate"] for r in rows] == [0.25, 0.5]
        # every row, the oracle's too, keeps the example policy's cooldown, 0.3 s at 10 fps: 3 frames
        # apart, so 2 of each 6-frame stream at most (4 of 12), never more than the rate
        assert [round(r["escalated"] * 12) for r in rows] == [3, 4], name
        # 4 of 12 is more than one frame short of 50%: that cell is not at its column's rate
        assert [r["short"] for r in rows] == [False, True], name
    # answers are carried one frame after their escalation (examples/policy.yaml: merge.carryFrames 30)
    carry = result["carry"]
    assert carry["frames"] == 30 and carry["lag_frames"] == 1 and carry["cooldown_frames"] == 3
    assert carry["ours_at_target_rate"]["escalated"] == carry["ours_without_carry"]["escalated"]
    assert set(carry["first_frame_share"]) == {"ours", "random"}
    assert all(0.0 <= v <= 1.0 for v in carry["first_frame_share"].values())
    assert result["baselines"]["cloud_only"]["f1_vs_cloud"] == pytest.approx(1.0)
    assert result["baselines"]["edge_only"]["uplink_saved"] == 1.0
    assert len(result["threshold_sweep"]) == 21 and result["learned"]["trained"]
    md = (out / "eval.md").read_text()
    assert "the edge carries each answer's boxes up to 30 frames" in md
    assert "Policies at equal escalation rates" in md and "Payload modes" in md and "Produced by edgewise" in md
    # the short cells show what they escalated and are footnoted; the target is judged at 25%
    assert " at 33.3%†" in md and "† escalated less than the column's rate by more than one frame" in md
    assert "judged at 25.0% for edgewise learned gain (the policy declared before looking at the test set), which "\
           "escalates 25.0% of the frames there:" in md
    assert result["target"]["compared_at_rate"] == 0.25 and result["target"]["ours_escalated"] == 0.25
    # every payload mode measured from real encodes; a downscaled frame costs fewer bytes than a whole one
    pay = result["payloads"]
    assert set(pay) == {"full", "downscaled", "regions", "low+regions"} and result["payload"] == "regions"
    assert 0 < pay["downscaled"]["cloud_only"]["bytes_per_escalation"] < pay["full"]["cloud_only"]["bytes_per_escalation"]
    assert pay["full"]["cloud_only"]["f1"] == result["baselines"]["cloud_only"]["f1"]
    # intervals by resampling the 2 streams; our declared policy against each baseline
    assert result["streams"] == 2 and result["ours"] == "learned"
    for rows in result["at_rates"].values():
        assert all(0.0 <= r["f1_ci"][0] <= r["f1_ci"][1] <= 1.0 for r in rows)
    assert set(result["differences"]) == {"random", "sedna_threshold", "sedna_ibt"}
    for rows in result["differences"].values():
        for d in rows:
            assert set(d) == {"rate", "diff", "ci", "beats", "comparable"}
            # at 50% every policy escalated at most 33% (the cooldown's most): not comparable;
            # and 2 streams judge no lead at all (bootstrap.MIN_STREAMS)
            assert d["comparable"] == (d["rate"] == 0.25)
            assert d["ci"][0] <= d["ci"][1] and d["beats"] is None
    prov = result["provenance"]
    assert prov["models"]["edge"]["sha256"] and prov["data"]["test"]["split"] == "test"
    assert prov["policy"]["path"].endswith("policy.yaml") and prov["cloud_input"] == "model"
    assert (out / "eval.png").read_bytes()[:4] == b"\x89PNG"
    # the learned policy is written for deployment; a policy file can replay it
    assert result["learned"]["file"] == str(out / "gain-model.json")
    # and the carry-aware one beside it, fitted on the carry state (two rounds: its own selection the second)
    carry_model = GainModel.load(result["learned"]["carry"]["file"])
    assert result["learned"]["carry"]["file"] == str(out / "gain-model-carry.json") and carry_model.uses_carry()
    assert carry_model.info["rounds"] == 2 and set(CARRY_FEATURES) <= set(carry_model.features)
    (out / "learned.yaml").write_text(
        "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: learned}\n"
        "spec:\n  threshold: 0.5\n  signals: {learnedModel: gain-model.json}\n"
        "  budget: {maxFraction: 1.0}\n  merge: {strategy: fuse}\n")
    again = tmp_path / "again"
    assert main(["eval", "--edge", str(tiny_model), "--cloud", str(small_model), "--policy", str(out / "learned.yaml"),
                 "--data", str(tiny_sets / "test"), "--out", str(again), "--rates", "0.5", "--target-rate", "0.5",
                 "--threads", "1"]) == 0
    replay = json.loads((again / "eval.json").read_text())
    assert not replay["learned"]["trained"] and not (again / "gain-model.json").exists()
    assert "from an earlier run" not in capsys.readouterr().err
    # a run without --train-data into the first run's folder leaves its gain models, and says so
    assert main(["eval", "--edge", str(tiny_model), "--cloud", str(small_model), "--policy", str(out / "learned.yaml"),
                 "--data", str(tiny_sets / "test"), "--out", str(out), "--rates", "0.5", "--target-rate", "0.5",
                 "--threads", "1"]) == 0
    assert (f"note: {out / 'gain-model.json'} and {out / 'gain-model-carry.json'} are from an earlier run into this "
            "folder: this one fitted no gain model (no --train-data)") in capsys.readouterr().err
    assert 0.0 < replay["policy_run"]["escalated"] < 1.0  # threshold 0.5: the upper half of the ranking
    assert replay["ours"] == "combined" and replay["carry"]["cooldown_frames"] == 0
    # --ours declares the policy judged; --carry-lag 0 carries nothing; the policy's whole-frame
    # refresh gets its own payload row beside the pure modes
    third = tmp_path / "third"
    refresh = tmp_path / "refresh.yaml"
    refresh.write_text(policy.read_text().replace("    downscaleWidth: 96", "    downscaleWidth: 96\n"
                                                  "    wholeFrameEverySeconds: 0.3"))
    assert main(["eval", "--edge", str(tiny_model), "--cloud", str(small_model), "--policy", str(refresh),
                 "--data", str(tiny_sets / "test"), "--train-data", str(tiny_sets / "train"), "--ours", "combined",
                 "--carry-lag", "0", "--payloads", "regions", "--out", str(third), "--rates", "0.5", "--target-rate", "0.5",
                 "--threads", "1"]) == 0
    declared = json.loads((third / "eval.json").read_text())
    assert declared["ours"] == "combined" and declared["target"]["ours"] == "combined"
    assert declared["carry"]["lag_frames"] is None and "carries no answer" in (third / "eval.md").read_text()
    assert set(declared["payloads"]) == {"full", "regions", "regions+whole"}
    assert declared["whole_frame_every_s"] == 0.3
    assert "regions (uncertain boxes + unexplained motion), the whole frame every 0.3 s" in (third / "eval.md").read_text()
    # every frame escalated: each stream's frames 0 and 3 go whole, at least as many bytes as regions
    both = declared["payloads"]
    assert both["regions+whole"]["cloud_only"]["bytes_per_escalation"] >= both["regions"]["cloud_only"]["bytes_per_escalation"]
    assert main(["eval", "--edge", str(tiny_model), "--cloud", str(small_model), "--policy", str(policy),
                 "--data", str(tiny_sets / "test"), "--ours", "learned", "--out", str(tmp_path / "x"),
                 "--rates", "0.5", "--target-rate", "0.5", "--threads", "1"]) == 2  # learned needs --train-data


def test_eval_bad_inputs(tiny_model, tmp_path, capsys) -> None:
    rc = main(["eval", "--edge", str(tmp_path / "none.onnx"), "--cloud", str(tiny_model),
               "--policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(tmp_path)])
    assert rc == 2 and "--edge" in capsys.readouterr().err
    rc = main(["eval", "--edge", str(tiny_model), "--cloud", str(tiny_model),
               "--policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(tmp_path)])
    assert rc == 2 and "no images/ folder" in capsys.readouterr().err
