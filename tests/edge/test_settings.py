"""Settings: YAML + env + flags, validation, unknown keys rejected with file and key path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from edge.settings import describe, load_settings
from edgewise.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "edge.yaml"
    p.write_text(text)
    return str(p)


def test_example_file_loads_with_per_kind_defaults():
    s = load_settings(str(ROOT / "edge" / "edge.example.yaml"), env={})
    kinds = {st.id: st for st in s.streams}
    assert kinds["gate"].resolved_drop_policy() == "drop_oldest"
    assert kinds["gate"].resolved_queue_size() == 2
    assert kinds["archive"].resolved_drop_policy() == "wait"
    assert kinds["archive"].loop is True
    assert s.cloud.mqtt.port == 8883


def test_layering_file_env_flags(tmp_path):
    path = write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\nmetrics: {port: 1234}\n")
    s = load_settings(path, overrides=["metrics.port=4321", "streams.0.fps=7.5"],
                      env={"EDGEWISE_EDGE_DEVICE_ID": "from-env", "EDGEWISE_EDGE_CLOUD__TOKEN": "t0k",
                           "EDGEWISE_EDGE_METRICS__PORT": "999"})
    assert s.device_id == "from-env"
    assert s.cloud.token == "t0k"
    assert s.metrics.port == 4321  # flag beats env beats file
    assert s.streams[0].fps == 7.5


@pytest.mark.parametrize("text, needle", [
    ("streams: [{id: s, kind: synthetic}]\ncloud: {tokn: x}\n", "unknown key 'cloud.tokn'"),
    ("streams: [{id: s, kind: synthetic, fsp: 3}]\n", "unknown key 'streams[0].fsp'"),
    ("streams: [{id: s, kind: webcam}]\n", "streams[0].kind must be one of"),
    ("streams: [{id: s, kind: file}]\n", "streams[0].uri is required"),
    ("streams: [{id: s, kind: synthetic}, {id: s, kind: synthetic}]\n", "duplicate stream id"),
    ("streams: []\n", "streams needs at least one stream"),
    ("streams: [{id: s, kind: synthetic, drop_policy: newest}]\n", "drop_policy must be one of"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {conf_thres: 2}\n", "model.conf_thres must be within"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {max_batch: many}\n", "model.max_batch must be an integer"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {endpoints: [nohost]}\n", "cloud.endpoints[0] must be host:port"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {transport: http}\n", "cloud.transport must be one of"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {endpoints: ['gw:70000']}\n", "must be host:port, got 'gw:70000' (port 1..65535)"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {mqtt: {topic_prefix: 'a/+'}}\n", "cloud.mqtt.topic_prefix must be"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {keepalive_s: 0}\n", "cloud.keepalive_s"),
    ("streams: [{id: s, kind: synthetic}]\nspool: {replay_batch: 0}\n", "replay_batch must be >= 1"),
    ("streams: [{id: s, kind: synthetic}]\nspool: {replay_interval_s: -1}\n", "replay_interval_s > 0"),
    ("streams: [{id: s, kind: synthetic}]\nsinks: {mqtt: true}\n", "sinks.mqtt needs cloud.mqtt.host"),
    ("streams: [{id: s, kind: synthetic, uri: big}]\n", "streams[0].uri is not a synthetic scene"),
    ("streams: [{id: s, kind: synthetic, uri: 'digits:hard:8x8'}]\n", "WxH with 16..8192 pixels"),
    pytest.param("streams: [{id: s, kind: synthetic, uri: 'digits:nightmare'}]\n",
                 "streams[0].uri names no usable difficulty",
                 marks=pytest.mark.skipif(importlib.util.find_spec("edgewise.synth") is None,
                                          reason="edgewise.synth checks difficulties")),
    ("- a\n- b\n", "top level must be a mapping"),
    ("streams: [{id: s\n", "not valid YAML"),
])
def test_invalid_settings_name_file_and_key(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_settings(path, env={})
    assert needle in str(ei.value)
    assert str(path) in str(ei.value)


def test_bad_override_names_the_flag(tmp_path):
    path = write(tmp_path, "streams: [{id: s, kind: synthetic}]\n")
    with pytest.raises(ConfigError, match=r"--set spool.maxbytes: unknown key 'spool.maxbytes'"):
        load_settings(path, overrides=["spool.maxbytes=3"], env={})
    with pytest.raises(ConfigError, match="EDGEWISE_EDGE_MODEL__THREADS"):
        load_settings(path, env={"EDGEWISE_EDGE_MODEL__THREADS": "lots"})


def test_describe_documents_every_leaf():
    text = describe()
    assert "cloud.mqtt.topic_prefix (str, default 'edgewise'):" in text
    assert "streams[].drop_policy (str" in text
    for line in text.splitlines():
        assert not line.endswith(": "), f"undocumented setting: {line}"
