"""Edge settings: YAML + env + flags, validation, errors naming the file line, variable or flag."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from edge.settings import ModelSettings, describe, load_settings
from edgewise.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "edge.yaml"
    p.write_text(text)
    return str(p)


REAL_CLOUD = ["cloud.endpoints.0=gw.plant.lan:443", "cloud.mqtt.host=broker.plant.lan"]


def test_example_file_loads_with_per_kind_defaults():
    s = load_settings(str(ROOT / "edge" / "edge.example.yaml"), overrides=REAL_CLOUD, env={})
    kinds = {st.id: st for st in s.streams}
    assert kinds["gate"].resolved_drop_policy() == "drop_oldest"
    assert kinds["gate"].resolved_queue_size() == 2
    assert kinds["archive"].resolved_drop_policy() == "wait"
    assert kinds["archive"].loop is True
    assert s.cloud.mqtt.port == 8883


@pytest.mark.parametrize("override, where", [
    ([], "edge.example.yaml:36: cloud.endpoints[0]: 'gateway.example.com:443' is a placeholder"),
    (REAL_CLOUD[:1], "edge.example.yaml:42: cloud.mqtt.host: 'broker.example.com' is a placeholder"),
])
def test_example_file_placeholders_must_be_replaced(override, where):
    """The shipped examples name reserved example domains (RFC 2606): the daemon refuses to
    start against them and says which line to edit."""
    with pytest.raises(ConfigError, match=re.escape(where)):
        load_settings(str(ROOT / "edge" / "edge.example.yaml"), overrides=override, env={})


@pytest.mark.parametrize("host, placeholder", [
    ("edgewise-gateway.example.com", True), ("EXAMPLE.ORG.", True), ("gw.invalid", True), ("x.example", True),
    ("example.com.evil.net", False), ("notexample.com", False), ("10.0.0.5", False), ("[::1]", False),
])
def test_placeholder_hosts(host, placeholder):
    from edge.settings import is_placeholder

    assert is_placeholder(host) is placeholder


def test_device_id_may_be_left_empty(tmp_path):
    s = load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\n"), env={})
    assert s.device_id == ""  # resolved at start: edge.preflight.resolve_device_id


@pytest.mark.parametrize("override, says", [
    ("device_id=cámara-ü1", r"device_id: the id 'cámara-ü1' has characters outside .*gateway refuses such device ids"),
    ("device_id=" + "x" * 129, r"device_id: the id is 129 characters; the limit is 128"),
    ("streams.0.id=entrée nord", r"streams.0.id: the id 'entrée nord' has characters outside .*such stream ids"),
    ("device_id=cam/1", r"device_id: must be usable as an MQTT topic level"),
])
def test_ids_the_gateway_refuses_are_refused_at_start(tmp_path, override, says):
    """Every escalation of such a device ended INVALID_ARGUMENT at the gateway, for hours;
    the rule is the gateway's own (edgewise.ids)."""
    with pytest.raises(ConfigError, match=says):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\n"),
                      overrides=[override], env={})


@pytest.mark.parametrize("override, says", [
    ("cloud.endpoints=[[a:1, b:2]", r"cloud.endpoints\[0\]: the gateway address: '\[a:1' is not '\[ipv6\]:port'"),
    ("cloud.endpoints=[a b:1]", r"cloud.endpoints\[0\]: the gateway address: 'a b:1': the host 'a b' is not a host name"),
    ("cloud.mqtt.host=broker lan", r"cloud.mqtt.host: 'broker lan' is not a host name"),
])
def test_gateway_and_broker_addresses_that_cannot_work_are_refused(tmp_path, override, says):
    """'[a:1' was accepted as a gateway address and failed at every escalation."""
    with pytest.raises(ConfigError, match=says):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\n"),
                      overrides=[override], env={})


@pytest.mark.parametrize("override, says", [
    # a \r from a file edited on Windows: gRPC refused every escalation, and none was spooled
    ("cloud.token=abc\r", r"cloud.token: holds a blank, control or non-ASCII character"),
    ("cloud.token=two words", r"cloud.token: holds a blank"),
    # a password file's last newline: the broker refused the login, for good, quietly
    ("cloud.mqtt.password=pw\n", r"cloud.mqtt.password: holds a line break or another control character"),
    ("cloud.mqtt.username=edge\r", r"cloud.mqtt.username: holds a line break"),
    # values that passed and then crashed or stopped a part of the daemon
    ("cloud.mqtt.keepalive_s=70000", r"cloud.mqtt.keepalive_s: '70000' is out of range; allowed: an integer in "
                                     r"\[1, 65535\]"),
    ("cloud.keepalive_s=3000000", r"cloud.keepalive_s: '3000000' is out of range"),
    ("model.threads=100000", r"model.threads: '100000' is out of range"),
    # the daemon runs a batch this large at start: 100000 frames of a 640 model are 123 GB
    ("model.max_batch=257", r"model.max_batch: '257' is out of range; allowed: an integer in \[1, 256\]"),
    ("spool.replay_batch=99999999999999999999", r"spool.replay_batch: '99999999999999999999' is out of range"),
    ("streams.0.uri=abc", r"streams.0.uri: 'abc' is neither a device index \(0, 1, ...\) nor a device path"),
    # a \r from an environment file edited on Windows: Mosquitto dropped the connection at each
    # subscribe and publish ('malformed packet'), and no record or escalation got through
    ("cloud.mqtt.topic_prefix=edgewise\r", r"cloud.mqtt.topic_prefix: must be a valid MQTT topic prefix"),
    ("streams.0.uri=99999999999999999999", r"streams.0.uri: '99999999999999999999' is neither"),
])
def test_settings_that_passed_and_then_failed_at_run_time_are_refused_at_start(tmp_path, override, says):
    """Found by a probe: each was accepted, then failed every escalation (the token), killed
    paho's thread for good (the MQTT keepalive), crashed or stalled the start (threads,
    gRPC keepalive), failed every replay round (replay_batch) or retried a camera for ever."""
    with pytest.raises(ConfigError, match=says) as info:
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: camera, uri: '0'}]\n"),
                      overrides=[override], env={})
    assert "abc" not in str(info.value) or "token" not in override  # a secret is never echoed


def test_a_default_device_id_the_gateway_refuses_is_named(tmp_path):
    from edge.preflight import resolve_device_id

    s = load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\n"), env={})
    with pytest.raises(ConfigError, match=r"^device_id: the default from the host name cannot be used "
                                          r"\(the id 'héte' has characters outside"):
        resolve_device_id(s, serial_path=str(tmp_path / "none"), hostname="héte")


def test_layering_file_env_flags(tmp_path):
    path = write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\nmetrics: {port: 1234}\n")
    s = load_settings(path, overrides=["metrics.port=4321", "streams.0.fps=7.5"],
                      env={"EDGEWISE_EDGE__DEVICE_ID": "from-env", "EDGEWISE_EDGE__CLOUD__TOKEN": "t0k",
                           "EDGEWISE_EDGE__METRICS__PORT": "999"})
    assert s.device_id == "from-env"
    assert s.cloud.token == "t0k"
    assert s.metrics.port == 4321  # flag beats env beats file
    assert s.streams[0].fps == 7.5


@pytest.mark.parametrize("text, needle", [
    ("streams: [{id: s, kind: synthetic}]\ncloud: {tokn: x}\n", ":2: cloud.tokn: unknown key (did you mean 'token'?)"),
    ("streams:\n  - id: s\n    fsp: 3\n", ":3: streams[0].fsp: unknown key (did you mean 'fps'?)"),
    ("streams: [{id: s, kind: webcam}]\n", "streams[0].kind: 'webcam' is not allowed; allowed: file | folder"),
    ("streams: [{id: s, kind: file}]\n", "streams[0].uri: is required"),
    ("streams: [{id: s, kind: synthetic}, {id: s, kind: synthetic}]\n", "duplicate stream id"),
    ("streams: []\n", "streams: needs at least one stream"),
    ("streams: [{id: s, kind: synthetic, drop_policy: newest}]\n", "streams[0].drop_policy: 'newest' is not allowed"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {conf_thres: 2}\n",
     ":2: model.conf_thres: 2 is out of range; allowed: a number in [0, 1]"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {max_batch: many}\n", "model.max_batch: 'many' is not an integer"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {backend: tensorflow}\n", "model.backend: 'tensorflow' is not allowed"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {endpoints: [nohost]}\n", "cloud.endpoints[0]: the gateway address: 'nohost' is not 'host:port'"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {transport: http}\n", "cloud.transport: 'http' is not allowed"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {endpoints: ['gw:70000']}\n", "the gateway address: 'gw:70000': port 70000 is outside 1..65535"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {mqtt: {topic_prefix: 'a/+'}}\n", "cloud.mqtt.topic_prefix: must be"),
    ("streams: [{id: s, kind: synthetic}]\ncloud: {keepalive_s: 0}\n", "cloud.keepalive_s: 0 is out of range"),
    ("streams: [{id: s, kind: synthetic}]\nspool: {replay_batch: 0}\n", "spool.replay_batch: 0 is out of range"),
    # the salvage marker names a damaged spool's moved files one a line: a name with a line break
    # in it cannot be listed, and the copy of a salvage cut short was not finished (a probe lost
    # 156 of 200 escalations at the next start)
    ("streams: [{id: s, kind: synthetic}]\nspool: {path: \"/var/lib/edgewise/sp\\nool.db\"}\n",
     "spool.path: holds a line break"),
    ("streams: [{id: s, kind: synthetic}]\nspool: {replay_interval_s: -1}\n", "allowed: a number > 0"),
    ("streams: [{id: s, kind: synthetic}]\nsinks: {mqtt: true}\n", ":2: sinks.mqtt: needs cloud.mqtt.host"),
    ("streams: [{id: s, kind: synthetic, uri: big}]\n", "streams[0].uri: is not a synthetic scene"),
    ("streams: [{id: s, kind: synthetic, uri: 'digits:hard:8x8'}]\n", "WxH with 16..8192 pixels"),
    pytest.param("streams: [{id: s, kind: synthetic, uri: 'digits:nightmare'}]\n",
                 "streams[0].uri: names no usable difficulty",
                 marks=pytest.mark.skipif(importlib.util.find_spec("edgewise.synth") is None,
                                          reason="edgewise.synth checks difficulties")),
    pytest.param("streams: [{id: s, kind: synthetic, uri: 'digits:camera:64x64'}]\n",
                 "streams[0].uri: camera scene: frame size 64x64 is too small",
                 marks=pytest.mark.skipif(importlib.util.find_spec("edgewise.synth") is None,
                                          reason="edgewise.synth checks difficulties")),
    ("- a\n- b\n", "top level must be a mapping"),
    ("streams: [{id: s\n", "not valid YAML"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {imgsz: -1}\n", "model.imgsz: '-1' is not a size; write 640 (square) "
                                                                  "or 384,640 (height, width), or 0 for the model's own"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {imgsz: 384x}\n", "model.imgsz: '384x' is not a size"),
    ("streams: [{id: s, kind: synthetic}]\nmodel: {imgsz: '9000'}\n", "model.imgsz: '9000': each side at most 8192"),
    # the JSON Lines sink on the spool's file: the records went into the SQLite database, which
    # overwrote them with its pages
    ("streams: [{id: s, kind: synthetic}]\nspool: {path: /data/edge.db}\nsinks: {jsonl: /data/../data/edge.db}\n",
     ":3: sinks.jsonl: '/data/../data/edge.db' is also spool.path, a file the daemon writes; give each its own file"),
    ("streams: [{id: s, kind: synthetic}]\nspool: {path: /d/mqtt-outbox.db}\nsinks: {mqtt: true}\n"
     "cloud: {mqtt: {host: b.lan}}\n", "sinks.mqtt_outbox: '/d/mqtt-outbox.db' (sinks.mqtt_outbox is empty: "
     "mqtt-outbox.db next to spool.path) is also spool.path"),
    ("streams: [{id: s, kind: synthetic}]\nsinks: {jsonl: /d/p.yaml}\npolicy_file: /d/p.yaml\n",
     ":3: policy_file: '/d/p.yaml' is also sinks.jsonl, a file the daemon writes"),
    # a watcher polling every microsecond took a whole core
    ("streams: [{id: s, kind: synthetic}]\npolicy_poll_s: 1e-06\n", "policy_poll_s: 1e-06 is out of range; allowed: a number >= 0.05"),
])
def test_invalid_settings_name_file_and_key(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_settings(path, env={})
    assert needle in str(ei.value)
    assert str(path) in str(ei.value)


def test_bad_override_names_the_flag_or_variable(tmp_path):
    path = write(tmp_path, "streams: [{id: s, kind: synthetic}]\n")
    with pytest.raises(ConfigError, match=r"^--set spool.maxbytes: unknown key \(did you mean 'spool.max_bytes'\?\)"):
        load_settings(path, overrides=["spool.maxbytes=3"], env={})
    with pytest.raises(ConfigError, match="^EDGEWISE_EDGE__MODEL__THREADS: 'lots' is not an integer"):
        load_settings(path, env={"EDGEWISE_EDGE__MODEL__THREADS": "lots"})
    with pytest.raises(ConfigError, match=r"^--set streams.1.fps: streams: has no item 1"):
        load_settings(path, overrides=["streams.1.fps=5"], env={})


def test_old_variable_names_are_refused_not_ignored(tmp_path):
    """A device upgraded with EDGEWISE_EDGE_CLOUD__TOKEN in its environment file must not run
    without its token: the variable is refused with its new name."""
    path = write(tmp_path, "streams: [{id: s, kind: synthetic}]\n")
    with pytest.raises(ConfigError, match=r"^EDGEWISE_EDGE_CLOUD__TOKEN: not a settings variable; .*"
                                          r"did you mean EDGEWISE_EDGE__CLOUD__TOKEN\?"):
        load_settings(path, env={"EDGEWISE_EDGE_CLOUD__TOKEN": "t0k"})


def test_secrets_stay_out_of_repr_and_messages(tmp_path):
    path = write(tmp_path, "streams: [{id: s, kind: synthetic}]\n")
    s = load_settings(path, env={"EDGEWISE_EDGE__CLOUD__TOKEN": "s3cret-token"})
    assert s.cloud.token == "s3cret-token" and "s3cret" not in repr(s)
    with pytest.raises(ConfigError) as ei:
        load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\ncloud: {mqtt: {password: [s3cret]}}\n"),
                      env={})
    assert "cloud.mqtt.password" in str(ei.value) and "s3cret" not in str(ei.value)


def test_describe_documents_every_key():
    text = describe()
    assert "\ncloud.mqtt.topic_prefix\n  type str, default edgewise; allowed: a string\n" in text
    assert "\nstreams[].drop_policy\n" in text and "EDGEWISE_EDGE__STREAMS__<N>__FPS" in text
    assert "env EDGEWISE_EDGE__METRICS__PORT; flag --metrics-port" in text
    keys, machine = text.split("\n\nOn this machine:\n")
    blocks = keys.split("\n\n")[1:]
    assert len(blocks) > 40
    for block in blocks:
        assert block.count("\n") == 3 and block.splitlines()[3].strip(), f"undocumented setting: {block}"
    # What backend: auto means here (the PyPI OpenCV has FFmpeg and no GStreamer).
    assert re.match(r"  streams\[\]\.backend auto: (ffmpeg|gstreamer) for kind rtsp \(", machine)


@pytest.mark.parametrize("cloud, expected", [
    ({"mqtt.host": "broker.local"}, "mqtt"),  # was "grpc", unconfigured: spooled escalations never replayed
    ({"endpoints": ["gw.local:50051"]}, "grpc"),
    ({"endpoints": ["gw.local:50051"], "mqtt.host": "broker.local"}, "grpc"),
    ({"endpoints": ["gw.local:50051"], "mqtt.host": "broker.local", "transport": "mqtt"}, "mqtt"),
    ({"mqtt.host": "broker.local", "transport": "grpc"}, "mqtt"),  # not configured: not used (and said)
    ({}, "grpc"),  # edge-only: nothing is sent
])
def test_the_device_transport_is_cloud_transport_else_the_one_configured(tmp_path, cloud, expected):
    """What a policy that leaves ``spec.transport`` unset sends over, and what spooled escalations
    replay over when theirs is no longer configured (``default_transport``): ``cloud.transport``
    was "grpc" by default on a device configuring only MQTT, and was read by the replay only."""
    from edge.settings import default_transport, transport_problem

    overrides = [f"cloud.{k}={v if isinstance(v, str) else '[' + ','.join(v) + ']'}" for k, v in cloud.items()]
    s = load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\n"), overrides=overrides, env={})
    assert default_transport(s) == expected
    assert transport_problem(s, None) == ""


def test_a_cloud_transport_the_settings_do_not_configure_is_not_used_and_said(tmp_path, caplog):
    """Such settings ran before cloud.transport was used (the shipped files said `grpc`, and a
    device moved to MQTT set `spec.transport: mqtt`): not refused, not used, and said."""
    import logging

    from edge.preflight import preflight
    from edge.settings import default_transport

    s = load_settings(write(tmp_path, "device_id: d1\nstreams: [{id: s, kind: synthetic}]\ncloud: {transport: grpc, "
                                      f"mqtt: {{host: broker.local}}}}\nspool: {{path: {tmp_path}/spool.db}}\n"), env={})
    assert default_transport(s) == "mqtt"
    with caplog.at_level(logging.WARNING):
        preflight(s)
    assert "cloud.transport is 'grpc', but these settings configure only mqtt: mqtt is used; set cloud.endpoints, " \
           "or remove cloud.transport" in caplog.text


@pytest.mark.parametrize("kind, uri, says", [
    ("rtsp", "192.168.1.20:554/stream1", r"streams.0.uri: stream 'gate': '192.168.1.20:554/stream1' is not an RTSP "
                                         r"URL: give rtsp://host\[:port\]/path \(rtsp:// or rtsps://\)"),
    ("rtsp", "/videos/gate.mp4", r"streams.0.uri: stream 'gate': '/videos/gate.mp4' is not an RTSP URL"),
    ("rtsp", "http://u:secret@cam/x", r"'http://u:\*\*\*@cam/x' is not an RTSP URL"),
    ("http", "cam.local/mjpg", r"is not an HTTP URL: give http://host\[:port\]/path \(http:// or https://\)"),
    # a port FFmpeg cannot use (a typo, out of range, another script's digits) or no host
    ("rtsp", "rtsp://u:secret@cam:554x/s", r"'rtsp://u:\*\*\*@cam:554x/s': host:port: 'cam:554x': port '554x' is "
                                          r"not an integer"),
    ("rtsp", "rtsp://cam:99999/s", r"port 99999 is outside 1..65535"),
    ("rtsp", "rtsp://cam:\u0661\u0662/s", r"write it in the ASCII digits 0-9"),
    ("http", "http://:8080/mjpg", r"host:port: ':8080' is not 'host:port'"),
])
def test_a_network_stream_without_its_url_scheme_is_refused(tmp_path, kind, uri, says):
    """`kind: rtsp` with `uri: 192.168.1.20:554/stream1` passed check-config, and the daemon
    backed off forever without a reason (FFmpeg refuses it at every open). So did a port typo
    (`:554x`), and Python 3.8's urllib even read Arabic-Indic digits as a port."""
    with pytest.raises(ConfigError, match=says):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: gate, kind: synthetic}]\n"),
                      overrides=[f"streams.0.kind={kind}", f"streams.0.uri={uri}"], env={})
    for ok in ("rtsp://u:p@192.168.1.20:554/stream1", "RTSPS://cam/x") if kind == "rtsp" else ("https://cam/x",):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: gate, kind: synthetic}]\n"),
                      overrides=[f"streams.0.kind={kind}", f"streams.0.uri={ok}"], env={})


@pytest.mark.parametrize("fps, says", [
    ("1e-320", r"'1e-320' is too close to 0 .*write 0 where 0 is allowed"),  # (the range rule of every number)
    ("0.00001", r".* frames/s is less than one frame a day .*give 0 for no cap"),
])
def test_an_fps_cap_below_one_frame_a_day_is_refused(tmp_path, fps, says):
    """`fps: 1e-320` passed (lo=0) and made the frame period infinite: one frame, then nothing,
    while /healthz said streaming."""
    with pytest.raises(ConfigError, match=r"streams.0.fps: " + says):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\n"),
                      overrides=[f"streams.0.fps={fps}"], env={})
    for ok in ("0", str(1 / 86400), "0.5"):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\n"),
                      overrides=[f"streams.0.fps={ok}"], env={})


def test_the_default_model_is_the_shipped_edge_model():
    # the default was models/yolov5s-int8.onnx, which nothing ships: a config without model.path
    # failed with "model file models/yolov5s-int8.onnx does not exist" naming a file the user never wrote
    assert (ROOT / ModelSettings().path).is_file()


@pytest.mark.parametrize("written, size", [
    ("640", (640, 640)), ("384,640", (384, 640)), ("384x640", (384, 640)), ("'[384, 640]'", (384, 640)), ("0", None),
])
def test_model_imgsz_takes_a_height_and_a_width(tmp_path, written, size):
    """A non-square dynamic export (``[B,3,H,W]`` without imgsz metadata) could be given only a
    square size: ``model.imgsz`` was an int, where ``edgewise model info`` took ``384,640``."""
    from edgewise.runtime.metadata import setting_imgsz

    s = load_settings(write(tmp_path, f"streams: [{{id: s, kind: synthetic}}]\nmodel:\n  imgsz: {written}\n"), env={})
    assert setting_imgsz(s.model.imgsz) == size
    env = load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\n"),
                        env={"EDGEWISE_EDGE__MODEL__IMGSZ": "384,640"})
    assert setting_imgsz(env.model.imgsz) == (384, 640)


@pytest.mark.parametrize("key, yaml_text", [
    ("spool.path", "spool: {path: '/var/lib/edgewise/\u76e3\u8996.db'}\n"),
    ("sinks.jsonl", "sinks: {jsonl: '/data/caf\u00e9.jsonl'}\n"),
    ("streams[0].uri", ""),
])
def test_a_path_the_locale_cannot_name_is_refused_at_start_not_a_crash(tmp_path, key, yaml_text):
    """Under a locale without UTF-8 (LC_ALL=C with PYTHONUTF8=0, or ISO-8859-1 for characters
    beyond it) a path written in edge.yaml that the file system encoding cannot hold passed
    `check-config`, and the daemon died at the file's open with a UnicodeEncodeError traceback
    (exit 1: restarted every RestartSec). Now the settings refuse it in one line, with what to do."""
    import os
    import subprocess
    import sys

    uri = "/data/\u00e9t\u00e9.mp4" if key.startswith("streams") else "/data/a.mp4"
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"device_id: a\nstreams: [{{id: s, kind: file, uri: '{uri}'}}]\nmodel: {{path: m.onnx}}\n"
                   + yaml_text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", PYTHONUTF8="0")
    code = ("import sys\nfrom edge.settings import load_settings\nfrom edgewise.errors import ConfigError\n"
            "try:\n    load_settings(sys.argv[1], env={})\n"
            "except ConfigError as exc:\n    sys.stdout.reconfigure(errors='backslashreplace')\n    print(exc)\n"
            "    sys.exit(2)\n")
    p = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, timeout=60,
                       env=env, cwd=str(Path(__file__).resolve().parents[2]))
    said = p.stdout.decode("ascii", "backslashreplace")
    assert p.returncode == 2, p.stderr.decode(errors="replace")[-600:]
    assert f"{key}: " in said and "UTF-8 locale" in said, said


@pytest.mark.parametrize("name", ["sp\tool.db", "sp\u00a0ool.db", "sp\u2028ool.db", "sp\u200bool.db", " spool.db"])
def test_a_spool_file_name_the_salvage_cannot_list_is_refused_like_a_line_break(tmp_path, name):
    """A damaged spool's moved file is ``<spool file>.damaged-<time>``, and the salvage takes a
    name as one of them only when it is printable and as its marker line keeps it (stripped of
    blanks): a line break was refused at start for that reason (6329efc), but a tab, a
    no-break space pasted from a page, a line separator or a leading blank passed, and the
    salvage could no more find or go on with the file moved aside than with a line break."""
    from edge.spool_salvage import MOVED_INFIX, _is_moved_name

    moved = name + MOVED_INFIX + "20261207T074000Z"
    assert not _is_moved_name(Path("/var/lib/edgewise") / name, moved.strip())  # what the marker gives back
    with pytest.raises(ConfigError, match=r"SPOOL__PATH: the file name .* cannot name such a file"):
        load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\n"),
                      env={"EDGEWISE_EDGE__SPOOL__PATH": f"/var/lib/edgewise/{name}"})


@pytest.mark.parametrize("name", ["my spool.db", "sp\u00f8ol.db", "\u76e3\u8996.db"])
def test_a_spool_file_name_the_salvage_can_list_is_taken(tmp_path, name):
    from edge.spool_salvage import MOVED_INFIX, _is_moved_name

    assert _is_moved_name(Path("/var/lib/edgewise") / name, name + MOVED_INFIX + "20261207T074000Z")
    s = load_settings(write(tmp_path, "streams: [{id: s, kind: synthetic}]\n"),
                      env={"EDGEWISE_EDGE__SPOOL__PATH": f"/var/lib/edgewise/{name}"})
    assert s.spool.path == f"/var/lib/edgewise/{name}"


def test_a_state_file_that_is_a_symlink_to_another_is_refused(tmp_path):
    """``sinks.jsonl`` named through a symlink to the spool's file passed the files-apart check
    (it compared paths, not what they lead to), and the records were appended into the SQLite
    spool (probe C)."""
    (tmp_path / "spool.db").write_bytes(b"")
    (tmp_path / "records.jsonl").symlink_to(tmp_path / "spool.db")
    path = tmp_path / "edge.yaml"
    path.write_text(f"streams: [{{id: s, kind: synthetic}}]\nspool: {{path: {tmp_path / 'spool.db'}}}\n"
                    f"sinks: {{jsonl: {tmp_path / 'records.jsonl'}}}\n")
    with pytest.raises(ConfigError, match=r"sinks\.jsonl: .* is also spool\.path, a file the daemon writes"):
        load_settings(str(path), env={})


def test_a_grace_the_stop_timeout_would_cut_short_is_refused_saying_why(tmp_path):
    """``shutdown_grace_s`` had no upper bound: 30 s or more (or 20 s with sinks slow to close) and
    systemd's TimeoutStopSec=30 SIGKILLed the daemon mid-drain, losing the records of the escalations
    still in flight (found by a probe). The bound leaves the sinks' close and the MQTT flush their
    time, with a margin, and the error says why."""
    from edge.settings import (
        MAX_SHUTDOWN_GRACE_S,
        STOP_AFTER_GRACE_S,
        STOP_MARGIN_S,
        STOP_TIMEOUT_S,
    )

    assert MAX_SHUTDOWN_GRACE_S + STOP_AFTER_GRACE_S + STOP_MARGIN_S == STOP_TIMEOUT_S and MAX_SHUTDOWN_GRACE_S >= 10
    path = write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\nshutdown_grace_s: 30\n")
    with pytest.raises(ConfigError, match=r"edge.yaml:3: shutdown_grace_s: 30 is out of range \(the stop must end "
                                          r"within systemd's TimeoutStopSec \(30 s\), which SIGKILLs the daemon, .*"
                                          r"take up to 12 s more\); allowed: a number in \[0, 15\]$"):
        load_settings(path, env={})
    with pytest.raises(ConfigError, match=r"^EDGEWISE_EDGE__SHUTDOWN_GRACE_S: '15.5' is out of range \(the stop"):
        load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\n"),
                      env={"EDGEWISE_EDGE__SHUTDOWN_GRACE_S": "15.5"})
    assert load_settings(write(tmp_path, "device_id: a\nstreams: [{id: s, kind: synthetic}]\n"),
                         overrides=[f"shutdown_grace_s={MAX_SHUTDOWN_GRACE_S:g}"], env={}).shutdown_grace_s == 15
