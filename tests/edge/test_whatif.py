"""``edgewise edge check-policy --replay`` on the records of real daemon runs: replaying them
with the policy that decided them reproduces every decision (100%, budget, cooldown, priority,
audits and class thresholds included) across a daemon restart, with the files rotated, gzip'd
and given in any order; the what-if table, the JSON document and the exit codes of the CI gates.

The daemon runs in-process with the reference INT8 edge model on two procedural camera
streams (real detections of ten digit classes), escalating to the real gateway and worker
(``real_cloud``), so records arrive out of order (an escalated frame's record is written when
the cloud answered) and carry real payload sizes."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from edge.daemon import EdgeDaemon
from edgewise.cli import main
from edgewise.policy.schema import DEFAULT_WEIGHTS
from tests.edge.helpers import read_jsonl
from tests.edge.test_pipeline import base_settings

ROOT = Path(__file__).resolve().parents[2]
EDGE_MODEL = ROOT / "models" / "edge-int8.onnx"

#: Every limit bites on these streams: low thresholds (class "7" lower, "1" higher), a tight
#: fraction and token bucket, hardest-first, a cooldown on stream b, random audits; motion weighed.
POLICY: Dict[str, Any] = {
    "apiVersion": "edgewise/v1", "kind": "EscalationPolicy", "metadata": {"name": "busy"},
    "spec": {
        "threshold": 0.65,
        # the motion signals weigh in: the replay reads them from the records (no pixels)
        "signals": {"weights": {**DEFAULT_WEIGHTS, "motion": 0.7, "motion_blobs": 0.8}},
        "classes": {"7": {"threshold": 0.5}, "1": {"threshold": 0.9}},
        "streams": {"b": {"cooldownSeconds": 0.12}},
        "budget": {"maxFraction": 0.3, "windowFrames": 20, "maxPerSecond": 4.0, "burst": 2, "priority": "hardest"},
        "auditFraction": 0.05,
        "deadlineMs": 5000,
        "payload": {"jpegQuality": 80},
    },
}


def _run_daemon(tmp_path: Path, cloud: Any, frames: int) -> None:
    streams = [{"id": sid, "kind": "synthetic", "uri": "digits:hard:224x224", "fps": 25, "max_frames": frames}
               for sid in ("a", "b")]
    s = base_settings(tmp_path, EDGE_MODEL, streams, policy_file=str(tmp_path / "policy.yaml"),
                      cloud={"endpoints": [cloud.address]})
    d = EdgeDaemon(s)
    assert asyncio.run(asyncio.wait_for(d.run(), 180)) == 0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, _in_process_cloud) -> Dict[str, Any]:
    """Two daemon runs (a restart between them) under POLICY; the first run's file rotated and gzip'd."""
    tmp = tmp_path_factory.mktemp("whatif")
    (tmp / "policy.yaml").write_text(yaml.safe_dump(POLICY, sort_keys=False))
    _run_daemon(tmp, _in_process_cloud, 90)
    rotated = tmp / "out.jsonl.20261201T120000.000000Z.gz"  # edge.rotation's name for it
    with open(tmp / "out.jsonl", "rb") as src, gzip.open(rotated, "wb") as dst:
        shutil.copyfileobj(src, dst)
    (tmp / "out.jsonl").unlink()
    _run_daemon(tmp, _in_process_cloud, 60)
    with gzip.open(rotated, "rt") as f:
        records = [json.loads(line) for line in f] + read_jsonl(tmp / "out.jsonl")
    return {"dir": tmp, "files": [str(tmp / "out.jsonl"), str(rotated)], "records": records}


def _check(args: List[str], capsys) -> Any:
    rc = main(["edge", "check-policy", *args])
    return rc, capsys.readouterr()


def test_the_records_hold_every_limit_biting(recorded) -> None:
    """The run exercised what the replay must reproduce (so agreement is not trivial)."""
    recs = recorded["records"]
    assert len(recs) == 2 * 90 + 2 * 60
    assert {r["frame_seq"] >> 32 for r in recs} == {0, 1}  # two daemon runs
    escalated = [r for r in recs if r["escalated"]]
    assert 20 <= len(escalated) < len(recs) // 2
    assert all(isinstance(r["payload_bytes"], int) and r["outcome"] == "cloud" for r in escalated)
    held = {r["suppressed_by"] for r in recs}
    assert {"cooldown", "priority", "budget_rate"} <= held, held
    assert {r["reason"] for r in recs} >= {"hard", "below_threshold"}
    assert {o for r in recs for o in [r["origin"]]} >= {"global", "class 7"}
    # the motion detector ran, and motion alone made some frames hard
    assert any(r["signals"]["motion"] > 0 for r in recs)
    assert any(r["hardness"] == round(0.7 * r["signals"]["motion"], 4) >= r["threshold"] for r in recs)


def test_replay_with_the_same_policy_reproduces_every_decision(recorded, capsys) -> None:
    policy = str(recorded["dir"] / "policy.yaml")
    rc, out = _check([policy, "--replay", *recorded["files"], "--json"], capsys)
    assert rc == 0, out.err
    doc = json.loads(out.out)
    rep = doc["replay"]
    assert rep["records"]["frames"] == len(recorded["records"]) and rep["records"]["streams"] == 2
    assert rep["records"]["daemon_runs"] == {"a": 2, "b": 2}
    mine, rec = rep["sides"]
    assert mine["reproduction"]["checked"] == len(recorded["records"])
    assert mine["reproduction"]["agreed"] == mine["reproduction"]["checked"], mine["reproduction"]["mismatches"]
    assert rep["changes"]["newly_escalated"] == rep["changes"]["no_longer_escalated"] == 0
    # the figures of both sides are the same, budget and cooldown included
    for key in ("escalated", "suppressed", "budget_saturated", "uplink_bytes"):
        assert mine["overall"][key] == rec["overall"][key], key
    assert mine["overall"]["uplink_bytes"] == sum(r.get("payload_bytes", 0) for r in recorded["records"])
    assert len(rep["notes"]) == 1 and "per-hour and per-day figures are extrapolated" in rep["notes"][0]
    assert doc["policy"]["digest"] == recorded["records"][0]["policy_digest"]


def test_a_stricter_policy_what_if_table(recorded, capsys, tmp_path) -> None:
    stricter = dict(POLICY, metadata={"name": "stricter"}, spec=dict(POLICY["spec"], threshold=0.8))
    path = tmp_path / "stricter.yaml"
    path.write_text(yaml.safe_dump(stricter, sort_keys=False))
    rc, out = _check([str(path), "--replay", *recorded["files"], "--top", "3"], capsys)
    assert rc == 0, out.err
    text = out.out
    assert "What-if replay over 300 frames of 2 stream(s)" in text
    assert "recorded under policy 'busy'" in text
    for row in ("escalated", "escalations/hour p50 / p95", "uplink per day", "budget saturated", "longest saturation",
                "held back (cool/prio/frac/rate)", "stream a (150 frames)", "Decisions that change:",
                "Hardest frames held back", "records/s"):
        assert row in text, row
    assert "reproduced exactly" not in text  # another policy decided them
    # JSON: the changes add up
    rc, out = _check([str(path), "--replay", *recorded["files"], "--json"], capsys)
    rep = json.loads(out.out)["replay"]
    mine, rec = rep["sides"]
    ch = rep["changes"]
    assert mine["overall"]["escalated"] - rec["overall"]["escalated"] == ch["newly_escalated"] - ch["no_longer_escalated"]
    assert ch["no_longer_escalated"] > 0 and "reproduction" not in mine


def test_against_another_policy_file_and_the_ci_gates(recorded, capsys, tmp_path) -> None:
    policy = str(recorded["dir"] / "policy.yaml")
    lax = dict(POLICY, metadata={"name": "lax"}, spec=dict(POLICY["spec"], threshold=0.0,
                                                             budget={"maxFraction": 1.0, "maxPerSecond": None}))
    path = tmp_path / "lax.yaml"
    path.write_text(yaml.safe_dump(lax, sort_keys=False))
    rc, out = _check([str(path), "--replay", *recorded["files"], "--against", policy, "--json"], capsys)
    assert rc == 0
    rep = json.loads(out.out)["replay"]
    lax_side, busy_side = rep["sides"]
    assert busy_side["label"] == policy and busy_side["reproduction"]["share"] == 1.0
    assert lax_side["overall"]["share"] > busy_side["overall"]["share"]
    # gates: exit 1 and say why; the JSON carries the same
    rc, out = _check([str(path), "--replay", *recorded["files"], "--max-share", "0.5"], capsys)
    assert rc == 1 and "gate failed: --max-share 0.5" in out.out
    rc, out = _check([policy, "--replay", *recorded["files"], "--max-bytes-per-day", "1000", "--json"], capsys)
    assert rc == 1 and json.loads(out.out)["gates"]["failed"][0].startswith("--max-bytes-per-day 1000")
    rc, out = _check([policy, "--replay", *recorded["files"], "--max-share", "0.9", "--max-bytes-per-day", "1e15"],
                     capsys)
    assert rc == 0


def test_unusable_records_and_bad_gates_exit_2_with_one_line(recorded, tmp_path, capsys) -> None:
    policy = str(recorded["dir"] / "policy.yaml")
    rc, out = _check([policy, "--max-share", "0.1"], capsys)
    assert rc == 2 and "give --replay RECORDS" in out.err
    cmd = [sys.executable, "-m", "edgewise.cli", "edge", "check-policy", policy, "--replay"]
    for args, expected in (([str(tmp_path / "none.jsonl")], "records file not found"),
                           ([str(tmp_path)], "is a folder"),
                           ([*recorded["files"], "--max-share", "1.5"], "--max-share 1.5: must be a fraction in [0, 1]")):
        r = subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("edgewise: error: ") and expected in r.stderr and "Traceback" not in r.stderr


def test_check_policy_with_the_devices_settings_refuses_and_warns_as_its_daemon_does(tmp_path, tiny_model,
                                                                                     capsys, monkeypatch) -> None:
    """`check-policy new.yaml && mv` (docs/policies.md) passed a policy naming MQTT on a gRPC-only
    device, which its daemon then refused at the reload (found by a probe). With --config the
    device's own checks run: the refusal, exit 2; the warnings, a --strict gate."""
    from tests.edge.helpers import policy_yaml, settings_yaml

    for key in [k for k in os.environ if k.startswith("EDGEWISE_EDGE__")]:
        monkeypatch.delenv(key)
    config = settings_yaml(tmp_path / "edge.yaml", device_id="dev", model={"path": str(tiny_model)},
                           streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120"}],
                           cloud={"endpoints": ["127.0.0.1:50051"]}, spool={"path": str(tmp_path / "s.db")})
    mqtt = tmp_path / "mqtt.yaml"
    mqtt.write_text(policy_yaml("p", transport="mqtt"))
    rc, out = _check([str(mqtt)], capsys)
    assert rc == 0  # alone it is a valid policy
    rc, out = _check([str(mqtt), "--config", str(config)], capsys)
    assert rc == 2 and "mqtt.yaml: spec.transport is 'mqtt', but this device's settings configure only grpc" in out.err
    other = tmp_path / "other.yaml"
    other.write_text(policy_yaml("p", {"Cam": "never"}))
    rc, out = _check([str(other), "--config", str(config)], capsys)
    assert rc == 0 and "warning: policy " in out.out and "spec.streams Cam are not streams of this device (cam)" in out.out
    rc, out = _check([str(other), "--config", str(config), "--strict"], capsys)
    assert rc == 1
