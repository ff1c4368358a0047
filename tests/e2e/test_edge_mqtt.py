"""MQTT path end to end with a real Mosquitto: the daemon escalates every frame over
MQTT v5 request/response to the real gateway's MQTT bridge in front of a real worker
(the tiny model), and publishes each frame record to ``edgewise/<device>/detections``.
Also ``edgewise edge check-policy`` on a valid and an invalid file."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from edge.daemon import EdgeDaemon
from edge.settings import load_settings
from tests.conftest import TopicRecorder
from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml
from tests.realcloud import InProcessCloud
from tests.waiting import async_wait_until, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_mqtt_escalation_and_detections_topic(tmp_path, tiny_model, mosquitto):
    topic = TopicRecorder(mosquitto, "edgewise/nx1/detections")
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("mqtt-all", {"cam": "always"}, transport="mqtt", deadline_ms=3000,
                                  mode="crops"))
    s = load_settings(str(settings_yaml(
        tmp_path / "edge.yaml", device_id="nx1",
        streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "max_frames": 12, "fps": 20}],
        model={"path": str(tiny_model), "conf_thres": 0.05},
        policy_file=str(policy),
        cloud={"mqtt": {"host": mosquitto.host, "port": mosquitto.port}},
        spool={"path": str(tmp_path / "spool.db")},
        sinks={"jsonl": str(tmp_path / "out.jsonl"), "mqtt": True}, metrics={"port": -1},
    )), env={})
    bridge = {"mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port}
    with InProcessCloud(tiny_model, gateway=bridge) as cloud:
        wait_until(cloud.gateway.bridge.connected.is_set, 10, "the gateway's MQTT bridge")
        d = EdgeDaemon(s)

        async def main():
            task = asyncio.ensure_future(d.run())
            await async_wait_until(lambda: d.mqtt is not None and d.mqtt.connected.is_set(), 10,
                                   "the edge's MQTT connection")
            assert await asyncio.wait_for(task, 60) == 0

        asyncio.run(main())
        wait_until(lambda: len(topic.messages) >= 12, 10, "12 records on the detections topic")
        bridged = cloud.gateway.bridge.counts.get("answered", 0)
    topic.stop()
    recs = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(r["frame_seq"] for r in recs) == list(range(12))
    answered = [r for r in recs if r["outcome"] == "cloud"]
    # The very first frames may race the broker connection (and spool); the rest went over MQTT.
    assert len(answered) >= 10 and bridged >= len(answered)
    assert all(r["cloud_model"] == "yolov5n-160-10" for r in answered)
    assert sorted(r["frame_seq"] for r in topic.json()) == list(range(12))  # the detections topic


def test_check_policy_cli(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(policy_yaml("ok-policy", {"cam": "always"}))
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy_yaml("bad").replace("transport: grpc", "transport: carrier-pigeon"))
    cmd = [sys.executable, "-c", "import sys; from edgewise.cli import main; sys.exit(main())",
           "edge", "check-policy"]
    ok = subprocess.run(cmd + [str(good)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "ok-policy" in ok.stdout
    ko = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ko.returncode == 2  # like every configuration error
    assert str(bad) in ko.stderr and "transport" in ko.stderr and "carrier-pigeon" in ko.stderr
