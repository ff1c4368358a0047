"""MQTT path end to end with a real Mosquitto: the daemon escalates every frame over
MQTT v5 request/response to a responder running the real tiny model, and
publishes each frame record to ``edgewise/<device>/detections``. Also
``edgewise edge check-policy`` on a valid and an invalid file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge.daemon import EdgeDaemon
from edge.settings import load_settings
from tests.edge.cloudstub import MqttResponder, StubCloud
from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_mqtt_escalation_and_detections_topic(tmp_path, tiny_model, mosquitto):
    cloud = StubCloud(str(tiny_model))
    responder = MqttResponder(cloud, mosquitto.host, mosquitto.port)
    got = []
    subscribed = threading.Event()
    watcher = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="watcher",
                          protocol=mqtt.MQTTv5)
    watcher.on_connect = lambda c, u, f, rc, p: c.subscribe("edgewise/nx1/detections", qos=1)
    watcher.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
    watcher.on_message = lambda c, u, msg: got.append(json.loads(msg.payload))
    watcher.connect(mosquitto.host, mosquitto.port)
    watcher.loop_start()
    assert subscribed.wait(10)
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
    try:
        d = EdgeDaemon(s)

        async def run():
            while not d.mqtt or not d.mqtt.connected.is_set():
                if d.mqtt is None:
                    await asyncio.sleep(0.01)
                    continue
                await asyncio.sleep(0.05)

        async def main():
            task = asyncio.ensure_future(d.run())
            await asyncio.wait_for(run(), 10)
            assert await asyncio.wait_for(task, 60) == 0

        asyncio.run(main())
        for _ in range(50):
            if len(got) >= 12:
                break
            threading.Event().wait(0.1)
    finally:
        responder.stop()
        watcher.loop_stop()
    recs = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(r["frame_seq"] for r in recs) == list(range(12))
    answered = [r for r in recs if r["outcome"] == "cloud"]
    # The very first frames may race the broker connection; the rest went over MQTT.
    assert len(answered) >= 10
    assert sorted(q.frame_seq for q in cloud.seen) == sorted(r["frame_seq"] for r in answered)
    for q in cloud.seen:
        assert q.device_id == "nx1" and q.image.source_width == 160 and q.image.source_height == 120
    assert sorted(r["frame_seq"] for r in got) == list(range(12))  # the detections topic


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
