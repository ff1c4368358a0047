"""Settings of the edge daemon: one root object of nested, documented dataclasses.

Loaded by the shared mechanism of :mod:`edgewise.settings`: defaults < YAML file
(``--config``) < environment ``EDGEWISE_EDGE__SECTION__KEY`` (e.g.
``EDGEWISE_EDGE__CLOUD__TOKEN``) < ``--set key.path=value`` < the named flags below,
each error naming the file line, variable or flag of the bad value
(docs/design/conventions.md#settings). This module
keeps the dataclasses (doc, choices and ranges per field), the rules that span
fields (:func:`validate`) and the flag table. Callers: ``edge.daemon`` (the process)
and ``edge.cli`` (``edgewise edge run``).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from edge.sinks import CLOSE_TIMEOUT_S
from edge.sources.live import BACKENDS as LIVE_BACKENDS
from edge.sources.live import (
    CODECS,
    RTSP_TRANSPORTS,
    choose_backend,
    describe_backend,
    hardware_decoder,
    latest_appsink,
    opencv_video_io,
    url_problem,
)
from edge.transports.uplink import DEFAULT_MAX_BYTES as UPLINK_MAX_BYTES
from edgewise import mqtt_topics
from edgewise.addresses import host_problem, parse_hostport
from edgewise.errors import ConfigError, InvalidInputError
from edgewise.ids import bearer_token_problem, credential_problem, id_problem
from edgewise.mqtt_sessions import STOP_FLUSH_S
from edgewise.runtime.detector import BACKENDS
from edgewise.runtime.metadata import IMGSZ_SETTING_DOC, MAX_FIXED_BATCH, imgsz_problem
from edgewise.settings import Flag, Invalid, Schema, setting
from edgewise.settings import describe as describe_schema
from edgewise.wire import MIN_PING_INTERVAL_S

SOURCE_KINDS = ("file", "folder", "rtsp", "http", "camera", "gstreamer", "synthetic")
LIVE_KINDS = ("rtsp", "http", "camera", "gstreamer")
DROP_POLICIES = ("drop_oldest", "wait")
#: The lowest frame-rate cap, frames/s (one frame a day): below it the frame period is
#: no longer a finite wait (``fps: 1e-320`` gave one frame, then nothing, while healthy).
MIN_FPS = 1.0 / 86400
TRANSPORTS = ("grpc", "mqtt")
#: How long the daemon may take to stop before it is SIGKILLed, seconds: the edge unit's
#: ``TimeoutStopSec`` (deploy/jetson/edgewise-edge.service) and the L4T container's ``docker run
#: --stop-timeout`` (deploy/jetson/README.md); tests/edge/test_bundle.py holds both to this.
STOP_TIMEOUT_S = 30
#: What a stop takes after ``shutdown_grace_s``, at most: the sinks' close (``CLOSE_TIMEOUT_S``
#: each for the two durable sinks and ``sinks.stdout``), the MQTT connection's last flush
#: (``STOP_FLUSH_S``) and about 1 s of fixed steps (the spool's close, the model, the HTTP server).
STOP_AFTER_GRACE_S = 3 * CLOSE_TIMEOUT_S + STOP_FLUSH_S + 1.0
#: What is left of ``STOP_TIMEOUT_S`` at the end of the slowest stop with the longest grace.
STOP_MARGIN_S = 3.0
#: The longest ``shutdown_grace_s`` (15 s). A grace of 30 s or more had systemd SIGKILL the
#: daemon mid-drain, and the records of the escalations still in flight were lost.
MAX_SHUTDOWN_GRACE_S = STOP_TIMEOUT_S - STOP_AFTER_GRACE_S - STOP_MARGIN_S
_GRACE_WHY = (f"the stop must end within systemd's TimeoutStopSec ({STOP_TIMEOUT_S} s), which SIGKILLs the "
              f"daemon, and the escalations still in flight lose their records; after the grace the sinks' "
              f"close and the last MQTT flush take up to {STOP_AFTER_GRACE_S:g} s more")


@dataclass
class StreamSettings:
    """One frame source."""

    id: str = setting("Stream id, unique in the daemon; part of every idempotency key.", "")
    kind: str = setting("What the source is.", "synthetic", choices=SOURCE_KINDS)
    uri: str = setting(
        "file: video path; folder: directory of images; rtsp/http: URL; camera: device index (`0`) "
        "or path (`/dev/video0`); gstreamer: a pipeline string ending in `appsink`; synthetic: empty "
        "or `WxH` (e.g. `640x480`) for the built-in pattern, or `digits[:DIFFICULTY[:WxH]]` for "
        "`edgewise.synth` camera scenes (DIFFICULTY: easy | medium | hard | reference | episodes, "
        "or a difficulty YAML/JSON file).", "")
    loop: bool = setting("file/folder/synthetic: start again at the end instead of ending the stream.", False)
    fps: float = setting("Frame-rate cap in frames/s; 0 = as fast as the source and pipeline allow; "
                         "otherwise at least one frame a day (1/86400). A `file` stream without a cap "
                         "runs its policy's cooldown, `maxPerSecond` and whole-frame refresh on the "
                         "video's own timeline (frame index over its frame rate); with one it is "
                         "replayed as a camera at that rate, on the daemon's clock.", 0.0, lo=0)
    queue_size: int = setting("Frames buffered between capture and inference; 0 = per-kind default "
                              "(live: 2, file/folder/synthetic: 8).", 0, lo=0)
    drop_policy: str = setting(
        "What capture does when the queue is full: `drop_oldest` (discard the oldest queued frame; "
        "counted) or `wait` (block capture). Empty = per-kind default (live kinds: drop_oldest; "
        "file/folder/synthetic: wait).", "", choices=("",) + DROP_POLICIES)
    max_frames: int = setting("Stop the stream after this many frames (0 = no limit); for tests and "
                              "benchmarks.", 0, lo=0)
    reconnect_min_s: float = setting("First reconnect delay of a live stream, seconds (doubles up to "
                                     "`reconnect_max_s`).", 0.5, lo=0, lo_open=True)
    reconnect_max_s: float = setting("Largest reconnect delay, seconds.", 30.0, lo=0, lo_open=True)
    stall_timeout_s: float = setting(
        "Live kinds: a stream that delivers no new frame for this long is declared down, the frames "
        "queued from before are discarded and it reconnects with the backoff above; 0 = five frame "
        "periods of the source's nominal rate, at least 1 s and at most 60 s (2 s when the source "
        "reports no rate, or only an invented one: FFmpeg's 25 fps for MJPEG over HTTP; set it for a "
        "camera slower than one frame every 2 s).",
        0.0, lo=0)
    backend: str = setting(
        "rtsp: how the stream is decoded. `ffmpeg` (OpenCV's FFmpeg, CPU decode), `gstreamer` (an "
        "`rtspsrc ! nvv4l2decoder` pipeline: Jetson hardware decode; needs an OpenCV built with "
        "GStreamer, such as JetPack's), `auto` (gstreamer when OpenCV has GStreamer and the Jetson "
        "decoder plugin is installed, else ffmpeg; `--describe-settings` shows the choice on this machine).",
        "auto", choices=LIVE_BACKENDS)
    rtsp_transport: str = setting(
        "rtsp: RTP over the RTSP TCP connection (`tcp`: no loss, passes NAT and firewalls) or over "
        "`udp` (lower latency on a clean LAN; lost packets smear frames).", "tcp", choices=RTSP_TRANSPORTS)
    codec: str = setting("rtsp with the gstreamer backend: the camera's video codec (selects the "
                         "depayloader and parser).", "h264", choices=CODECS)
    open_timeout_s: float = setting("rtsp/http: how long opening the stream may take, seconds (OpenCV "
                                    "`CAP_PROP_OPEN_TIMEOUT_MSEC`).", 10.0, lo=0, lo_open=True)
    io_timeout_s: float = setting(
        "rtsp/http: socket I/O timeout, seconds: FFmpeg's `timeout` (`stimeout` before FFmpeg 5) and "
        "OpenCV's `CAP_PROP_READ_TIMEOUT_MSEC`, or rtspsrc's `tcp-timeout`; bounds how long a dead "
        "connection holds its thread after `stall_timeout_s` gave up on it.", 5.0, lo=0, lo_open=True)

    def resolved_queue_size(self) -> int:
        return self.queue_size or (2 if self.kind in LIVE_KINDS else 8)

    def resolved_drop_policy(self) -> str:
        return self.drop_policy or ("drop_oldest" if self.kind in LIVE_KINDS else "wait")


@dataclass
class ModelSettings:
    """The edge detector."""

    path: str = setting("YOLOv5 ONNX (Ultralytics export layout) or TensorRT engine file; the default is "
                        "the shipped edge model, relative to a checkout's root.",
                        "models/camera/edge-int8.onnx")
    backend: str = setting("Runtime backend: auto (TensorRT when usable, else ONNX Runtime), onnxruntime "
                           "or tensorrt.", "auto", choices=BACKENDS)
    conf_thres: Optional[float] = setting(
        "Minimum final score of a kept box; null: the model's own (ONNX metadata edgewise_conf_thres, "
        "chosen where the model was made), else 0.25.", None, lo=0, hi=1)
    iou_thres: float = setting("NMS IoU threshold.", 0.45, lo=0, hi=1)
    max_det: int = setting("Most boxes kept per frame.", 300, lo=1)
    threads: int = setting("Intra-op threads of the runtime; 0 = runtime default.", 0, lo=0, hi=256)
    spin: bool = setting(
        "ONNX Runtime: let idle pool threads busy-wait for the next inference (its own default). Off: at "
        "camera pace a spinning pool burns every thread's idle time, several times the inference's own "
        "CPU (docs/design/edge-runtime.md#cpu-per-frame); on only for back-to-back inference.", False)
    max_batch: int = setting("Most frames (from all streams) run in one inference call (with a model of dynamic "
                             "batch the daemon runs one batch this large as it starts).", 4, lo=1, hi=MAX_FIXED_BATCH)
    imgsz: str = setting(IMGSZ_SETTING_DOC, "0")


@dataclass
class MqttSettings:
    """The MQTT broker used by the MQTT transport and the MQTT sink."""

    host: str = setting("Broker host; empty = MQTT disabled.", "")
    port: int = setting("Broker port.", 1883, lo=1, hi=65535)
    tls: bool = setting("Use TLS (with `cloud.tls_ca` / `tls_cert` / `tls_key` when set).", False)
    username: str = setting("Username (optional).", "")
    password: str = setting("Password (optional; prefer the environment variable "
                            "EDGEWISE_EDGE__CLOUD__MQTT__PASSWORD).", "", secret=True)
    keepalive_s: int = setting("MQTT keepalive, seconds (MQTT carries it in two bytes).", 30, lo=1, hi=65535)
    topic_prefix: str = setting("Topics are `<prefix>/<device>/escalate|response/<client>|detections`.",
                                "edgewise")
    max_in_flight_bytes: int = setting(
        "Most bytes of escalation requests the broker has not acknowledged yet (paho holds each until then, "
        "past its deadline too). An escalation that would pass it, or that a queueing uplink would carry too "
        "late for its deadline at the rate the broker has been acknowledging, or that would wait behind a request "
        "unacknowledged for longer than its deadline (a hung broker), fails at once and takes the policy's "
        "`onCloudUnavailable`, as a gRPC call past its deadline. With nothing unacknowledged any one "
        "request is sent, whatever its size.", UPLINK_MAX_BYTES, lo=1)


@dataclass
class CloudSettings:
    """How to reach the cloud tier."""

    endpoints: List[str] = setting("gRPC gateway addresses `host:port`, tried in order (fail-over on "
                                   "UNAVAILABLE, or after 3 calls in a row that one let run out their deadline "
                                   "unanswered; an earlier one is used again once it is connected, "
                                   "from 10 s after the fail-over).", factory=list)
    transport: str = setting(
        "Transport of the escalations of a policy that leaves `spec.transport` unset, and of spooled "
        "escalations whose own transport these settings no longer configure (a device moved from gRPC to "
        "MQTT replays its spool over MQTT). Empty: the one these settings configure (gRPC when both "
        "`endpoints` and `mqtt.host` are set). A transport these settings do not configure is not used "
        "(a warning at start says so).",
        "", choices=("",) + TRANSPORTS)
    tls_ca: str = setting("PEM CA bundle; set to use TLS for gRPC (and MQTT when `mqtt.tls`).", "")
    tls_cert: str = setting("PEM client certificate for mutual TLS (with `tls_key`).", "")
    tls_key: str = setting("PEM client key for mutual TLS.", "")
    token: str = setting("Bearer token of this device, sent as `authorization` gRPC metadata and as the MQTT v5 "
                         "User Property `authorization` of every MQTT request (prefer the environment variable "
                         "EDGEWISE_EDGE__CLOUD__TOKEN).", "", secret=True)
    keepalive_s: float = setting("gRPC keepalive ping interval, seconds (also between escalations; the gateway "
                                 f"accepts pings down to {MIN_PING_INTERVAL_S} s and disconnects a client that "
                                 "pings more often).", 20.0, lo=MIN_PING_INTERVAL_S, hi=86400)
    max_in_flight: int = setting("Most escalations waiting for the cloud at once; more are spooled/dropped "
                                 "per policy. Over gRPC each is one call: with device tokens the gateway lets "
                                 "one device hold `limits.max_calls_per_device` (64 by default) calls, replays "
                                 "(`spool.replay_concurrency`) included.", 16, lo=1)
    mqtt: MqttSettings = setting("MQTT broker settings.", factory=MqttSettings)


@dataclass
class SpoolSettings:
    """Durable on-disk queue of escalations that could not be delivered."""

    path: str = setting("SQLite file of the spool.", "/var/lib/edgewise/spool.db")
    max_bytes: int = setting("Byte cap of the spooled payloads and their metadata; a new entry that would "
                             "pass it evicts the oldest ones (counted, logged), and an entry larger than the "
                             "whole cap is refused (counted).", 256 * 1024 * 1024, lo=1)
    max_age_s: float = setting("Entries older than this are expired (counted, logged).", 24 * 3600.0,
                               lo=0, lo_open=True)
    replay_interval_s: float = setting("How often the replay task tries the cloud while the spool is "
                                       "non-empty, seconds.", 2.0, lo=0, lo_open=True)
    replay_batch: int = setting("Entries taken from the spool per replay round.", 8, lo=1, hi=10000)
    replay_concurrency: int = setting(
        "Replayed escalations in flight at once (at most `replay_batch`); their late records are still written "
        "in spool order. 1 (the default) sends them one by one, so a recovering cloud serves live escalations "
        "first, but one slow answer holds the entries behind it for up to `replay_deadline_s`; raise it where "
        "the cloud has capacity to spare.", 1, lo=1)
    replay_deadline_s: float = setting(
        "Least deadline of one replayed escalation, seconds (the policy's `deadlineMs` when longer). A replay "
        "is late anyway; held to a live deadline that a backlogged or slow cloud cannot meet, every replay "
        "would time out and the spool would never drain.", 10.0, lo=0, lo_open=True)
    replay_at_end_s: float = setting(
        "When every source has ended by itself (files, `max_frames`), keep replaying the spool for up to "
        "this long before exiting, so a recorded video's escalations get their answers; what is left stays "
        "spooled for the next start. 0: exit at once. A stop signal never waits for it.", 60.0, lo=0)


@dataclass
class SinkSettings:
    """Where per-frame records go."""

    jsonl: str = setting("JSON Lines file (appended; a regular file: a pipe or a device is refused, see `stdout`); "
                         "empty = off.", "")
    mqtt: bool = setting("Publish each record to `<prefix>/<device>/detections` (needs `cloud.mqtt.host`).",
                         False)
    stdout: bool = setting("Print each record as one JSON line on stdout (to pipe records to a program). "
                           "A reader that falls behind holds up only this sink: up to 16 MiB of records "
                           "wait for it, the oldest dropped beyond (counted in "
                           "`edgewise_edge_sink_dropped_total{sink=\"stdout\"}`).", False)
    fsync: bool = setting("fsync the JSON Lines file after each record (slower; survives power loss).", False)
    jsonl_max_bytes: int = setting(
        "Rotate the JSON Lines file when the next record would make it larger than this (renamed "
        "`<file>.<UTC time>`); 0 = never. The default with `jsonl_keep` bounds the records on disk to about "
        "64 MiB + 32 gzip'd files of 4-5 MiB: sized for a 16 GB eMMC (deploy/jetson/README.md).",
        64 * 1024 * 1024, lo=0)
    jsonl_keep: int = setting("Rotated JSON Lines files kept; older ones are deleted.", 32, lo=0)
    jsonl_compress: bool = setting("gzip rotated JSON Lines files (records compress about 14x), in a "
                                   "background thread.", True)
    mqtt_outbox: str = setting(
        "SQLite file where the MQTT sink keeps each record until the broker acknowledged it (survives "
        "broker outages and daemon restarts); empty = `mqtt-outbox.db` next to `spool.path`.", "")
    mqtt_outbox_max: int = setting(
        "Most records the MQTT sink keeps while the broker is unreachable (about 1 KB each, plus about 100 bytes per box: 2 KB at 9 boxes a frame); beyond it the "
        "oldest are dropped, counted in `edgewise_edge_sink_dropped_total`.", 50000, lo=1)


@dataclass
class MetricsSettings:
    """Prometheus ``/metrics`` and ``/healthz`` HTTP endpoint."""

    host: str = setting("Bind address.", "127.0.0.1")
    port: int = setting("Port; 0 = pick a free one (logged); -1 = off.", 9108, lo=-1, hi=65535)
    tegrastats: str = setting("Jetson telemetry (GPU and EMC load, temperatures, power rails) from the "
                              "`tegrastats` command: `auto` = when it is on PATH, `off`.", "auto",
                              choices=("auto", "off"))
    tegrastats_interval_s: float = setting("Interval of the Jetson telemetry, seconds.", 2.0, lo=0.1)


@dataclass
class EdgeSettings:
    """Root settings of one edge daemon process."""

    device_id: str = setting(
        "Device id, part of every idempotency key and MQTT topic; empty = this Jetson's serial number "
        "(`/proc/device-tree/serial-number`), else the host name (logged at start).", "")
    streams: List[StreamSettings] = setting("Frame sources (at least one).", factory=list)
    model: ModelSettings = setting("The edge detector.", factory=ModelSettings)
    policy_file: str = setting("Escalation policy YAML (`kind: EscalationPolicy`); empty = never escalate.", "")
    policy_poll_s: float = setting("How often the policy file is checked for changes, seconds (SIGHUP also "
                                   "reloads); at least 0.05 (a check is a stat of the file).", 1.0, lo=0.05)
    cloud: CloudSettings = setting("How to reach the cloud tier.", factory=CloudSettings)
    spool: SpoolSettings = setting("Durable spool.", factory=SpoolSettings)
    sinks: SinkSettings = setting("Per-frame record sinks.", factory=SinkSettings)
    metrics: MetricsSettings = setting("Metrics and health endpoint.", factory=MetricsSettings)
    shutdown_grace_s: float = setting("On SIGTERM, how long queued frames and in-flight escalations may "
                                      "take to finish, seconds from the signal; then frames still queued are "
                                      "dropped (counted as `shutdown` drops) and escalations still in flight "
                                      "are spooled. At most "
                                      f"{MAX_SHUTDOWN_GRACE_S:g} s: {_GRACE_WHY}. A run over files waits for "
                                      "its last escalations with `spool.replay_at_end_s`.",
                                      5.0, lo=0, hi=MAX_SHUTDOWN_GRACE_S, why=_GRACE_WHY)


#: the MQTT sink's outbox file when ``sinks.mqtt_outbox`` is empty: next to the spool
MQTT_OUTBOX_NAME = "mqtt-outbox.db"


def mqtt_outbox_path(s: EdgeSettings) -> str:
    """The MQTT sink's outbox file: ``sinks.mqtt_outbox``, else ``mqtt-outbox.db`` next to the spool."""
    return s.sinks.mqtt_outbox or os.path.join(os.path.dirname(os.path.abspath(s.spool.path)), MQTT_OUTBOX_NAME)


#: the setting that configures each transport
TRANSPORT_SETTINGS = {"grpc": "cloud.endpoints", "mqtt": "cloud.mqtt.host"}


def configured_transports(s: EdgeSettings) -> List[str]:
    """The transports these settings configure (none: the device runs edge-only)."""
    return [t for t, on in (("grpc", bool(s.cloud.endpoints)), ("mqtt", bool(s.cloud.mqtt.host))) if on]


def default_transport(s: EdgeSettings) -> str:
    """The transport of a policy that names none (``spec.transport`` unset): ``cloud.transport``
    when these settings configure it, else the one they configure (gRPC when both are, or none)."""
    configured = configured_transports(s)
    if s.cloud.transport and (s.cloud.transport in configured or not configured):
        return s.cloud.transport
    return configured[0] if configured else TRANSPORTS[0]


def transport_warning(s: EdgeSettings) -> Optional[str]:
    """The line said at start (and by ``check-config``) when ``cloud.transport`` names a transport
    these settings do not configure: it is not used (:func:`default_transport`), else None.
    Not refused: such settings ran before ``cloud.transport`` was used (with ``spec.transport``
    naming the configured one)."""
    configured = configured_transports(s)
    if not s.cloud.transport or not configured or s.cloud.transport in configured:
        return None
    return (f"cloud.transport is {s.cloud.transport!r}, but these settings configure only {', '.join(configured)}: "
            f"{default_transport(s)} is used; set {TRANSPORT_SETTINGS[s.cloud.transport]}, or remove cloud.transport")


def transport_problem(s: EdgeSettings, transport: Optional[str]) -> str:
    """Why a policy's ``spec.transport`` cannot be used on this device ("" when it can): a
    device with a cloud configured must have the one its policy sends escalations over, or
    every escalation is spooled as "not configured" forever. Unset: the device's own
    (:func:`default_transport`), which its settings' checks keep to a configured one."""
    configured = configured_transports(s)
    if not configured or transport is None or transport in configured:
        return ""
    return (f"spec.transport is {transport!r}, but this device's settings configure only "
            f"{', '.join(configured)}: set {TRANSPORT_SETTINGS.get(transport, 'cloud.*')} in the edge settings, "
            f"or spec.transport: {configured[0]} in the policy")


def policy_fit(s: EdgeSettings) -> Callable[[Any], str]:
    """What this device checks of a valid policy before it runs it (start and every reload)."""
    return lambda policy: transport_problem(s, policy.spec.transport)


def check_device_id(device_id: str) -> None:
    """A device id the cloud accepts (:mod:`edgewise.ids`) that is also one MQTT topic level."""
    problem = id_problem(device_id, "the id")
    if problem:
        raise Invalid("device_id", f"{problem}: the gateway refuses such device ids")
    try:
        mqtt_topics.check_segment(device_id, "value")
    except InvalidInputError as exc:
        raise Invalid("device_id", f"must be usable as an MQTT topic level: {exc}") from None


def validate(s: EdgeSettings) -> None:
    """The rules that span fields or need more than a range; raises :class:`Invalid`."""
    if s.device_id:  # empty: resolved at start (edge.preflight.resolve_device_id)
        check_device_id(s.device_id)
    _validate_streams(s.streams)
    if not s.model.path:
        raise Invalid("model.path", "is required")
    bad = imgsz_problem(s.model.imgsz)
    if bad:
        raise Invalid("model.imgsz", bad)
    _validate_cloud(s.cloud)
    _check_file_names(s)
    _check_files_apart(s)
    if "\n" in s.spool.path or "\r" in s.spool.path:
        # edge.spool_salvage's marker (<spool>.salvaging) lists the moved files one a line
        raise Invalid("spool.path", "holds a line break: a damaged spool is salvaged through a list of its "
                                    "moved files, one a line, which cannot name such a file; remove it")
    name = os.path.basename(s.spool.path)
    if not name.isprintable() or name != name.strip():
        # the salvage takes a marker line (stripped) as a moved file only when it is printable
        # (edge.spool_salvage._is_moved_name): it could not find or go on with such a file
        raise Invalid("spool.path", f"the file name {name!r} holds a tab, an invisible or special blank, or "
                                    "begins or ends with a blank: a damaged spool is salvaged through a list of "
                                    "its moved files, one a line, which cannot name such a file; remove it")
    if s.sinks.mqtt and not s.cloud.mqtt.host:
        raise Invalid("sinks.mqtt", "needs cloud.mqtt.host")


def _check_file_names(s: EdgeSettings) -> None:
    """Each file the settings name can be named in this system's file name encoding: under a
    locale without UTF-8 (C with PYTHONUTF8=0, ISO-8859-1) a character beyond it passed here and
    the daemon died at the file's open (a UnicodeEncodeError traceback, exit 1, restarted)."""
    paths = [("model.path", s.model.path), ("policy_file", s.policy_file), ("spool.path", s.spool.path),
             ("sinks.jsonl", s.sinks.jsonl), ("sinks.mqtt_outbox", s.sinks.mqtt_outbox),
             ("cloud.tls_ca", s.cloud.tls_ca), ("cloud.tls_cert", s.cloud.tls_cert),
             ("cloud.tls_key", s.cloud.tls_key)]
    paths += [(f"streams[{i}].uri", st.uri) for i, st in enumerate(s.streams) if st.kind in ("file", "folder")]
    for key, path in paths:
        try:
            os.fsencode(path)
        except UnicodeEncodeError as exc:
            raise Invalid(key, f"{path!r}: {path[exc.start:exc.end]!r} cannot be part of a file name in this "
                               f"system's encoding ({sys.getfilesystemencoding()}, from the locale); start "
                               "edgewise under a UTF-8 locale (LANG=C.UTF-8) or with PYTHONUTF8=1") from None


def _check_files_apart(s: EdgeSettings) -> None:
    """The files the daemon writes (the spool, the JSON Lines sink, the MQTT sink's outbox) are
    three files, none of them the model or the policy: 'sinks.jsonl' naming the spool's file was
    taken, and the records were appended into the SQLite database, which overwrote them with its
    pages (records lost, the spool at risk). Compared as paths with symlinks resolved as far as
    they exist (``..``, a relative path, a link to another of them): the settings may be checked
    where their files do not exist yet."""
    written = [("spool.path", s.spool.path), ("sinks.jsonl", s.sinks.jsonl)]
    if s.sinks.mqtt:
        written.append(("sinks.mqtt_outbox", mqtt_outbox_path(s)))
    read = [("model.path", s.model.path), ("policy_file", s.policy_file)]
    seen: Dict[str, str] = {}
    for key, path in written + read:
        if not path:
            continue
        where = os.path.realpath(path)  # a symlink to another of them is that file
        if where in seen:  # (the written come first: the one seen is a file the daemon writes)
            default = (f" (sinks.mqtt_outbox is empty: {MQTT_OUTBOX_NAME} next to spool.path)"
                       if key == "sinks.mqtt_outbox" and not s.sinks.mqtt_outbox else "")
            raise Invalid(key, f"{path!r}{default} is also {seen[where]}, a file the daemon writes; give each its "
                               "own file")
        if (key, path) in written:
            seen[where] = key


def _validate_streams(streams: List[StreamSettings]) -> None:
    if not streams:
        raise Invalid("streams", "needs at least one stream")
    seen = set()
    for i, st in enumerate(streams):
        p = f"streams[{i}]"
        if not st.id:
            raise Invalid(f"{p}.id", "is required")
        if st.id in seen:
            raise Invalid(f"{p}.id", f"duplicate stream id {st.id!r}")
        problem = id_problem(st.id, "the id")
        if problem:
            raise Invalid(f"{p}.id", f"{problem}: the gateway refuses such stream ids")
        seen.add(st.id)
        if st.kind != "synthetic" and not st.uri:
            raise Invalid(f"{p}.uri", f"is required for kind {st.kind!r}")
        if st.kind == "synthetic":
            _check_synthetic_uri(f"{p}.uri", st.uri)
        if 0 < st.fps < MIN_FPS:
            raise Invalid(f"{p}.fps", f"{st.fps:g} frames/s is less than one frame a day ({MIN_FPS:.3g}); "
                                      "give 0 for no cap")
        if st.reconnect_min_s > st.reconnect_max_s:
            raise Invalid(f"{p}.reconnect_min_s", "must be <= reconnect_max_s", also=(f"{p}.reconnect_max_s",))
        if st.kind in LIVE_KINDS:
            _check_live(p, st)


def _check_live(p: str, st: StreamSettings) -> None:
    bad_url = url_problem(st.kind, st.uri)
    if bad_url:
        raise Invalid(f"{p}.uri", f"stream {st.id!r}: {bad_url}")
    if st.kind == "camera" and not (re.fullmatch(r"[0-9]{1,4}", st.uri) or st.uri.startswith("/")):
        raise Invalid(f"{p}.uri", f"{st.uri[:80]!r} is neither a device index (0, 1, ...) nor a device path "
                                  "(/dev/video0)")
    if st.kind == "gstreamer":
        try:
            latest_appsink(st.uri)
        except ValueError as exc:
            raise Invalid(f"{p}.uri", str(exc)) from None
    if st.kind == "rtsp" and st.backend == "gstreamer":
        try:
            choose_backend(st.kind, st.backend, opencv_video_io()[0], hardware_decoder())
        except ValueError as exc:
            raise Invalid(f"{p}.backend", str(exc)) from None


#: Domains reserved for documentation and tests (RFC 2606 section 3, RFC 6761): never a real
#: gateway or broker, so a config naming one still holds the shipped placeholder.
PLACEHOLDER_DOMAINS = ("example.com", "example.net", "example.org", "example", "invalid")


def is_placeholder(host: str) -> bool:
    """``host`` is in a reserved example domain (``edgewise-gateway.example.com``)."""
    h = host.strip("[]").rstrip(".").lower()
    return any(h == d or h.endswith("." + d) for d in PLACEHOLDER_DOMAINS)


def _placeholder(what: str) -> str:
    return (f"{what} is a placeholder (a domain reserved for examples, RFC 2606): replace it with "
            "your gateway's address before starting the daemon")


def _validate_cloud(c: CloudSettings) -> None:
    for i, ep in enumerate(c.endpoints):
        try:
            host, _ = parse_hostport(ep, where="the gateway address")
        except ConfigError as exc:
            raise Invalid(f"cloud.endpoints[{i}]", str(exc)) from None
        if is_placeholder(host):
            raise Invalid(f"cloud.endpoints[{i}]", _placeholder(repr(ep)))
    bad = host_problem(c.mqtt.host) if c.mqtt.host else ""
    if bad:
        raise Invalid("cloud.mqtt.host", f"{c.mqtt.host!r} {bad}")

    if c.mqtt.host and is_placeholder(c.mqtt.host):
        raise Invalid("cloud.mqtt.host", _placeholder(repr(c.mqtt.host)).replace("gateway", "broker"))
    if bool(c.tls_cert) != bool(c.tls_key):
        raise Invalid("cloud.tls_cert", "tls_cert and tls_key must be given together", also=("cloud.tls_key",))
    token_bad = bearer_token_problem(c.token) if c.token else None
    if token_bad:
        raise Invalid("cloud.token", token_bad)
    for key in ("username", "password"):
        credential_bad = credential_problem(getattr(c.mqtt, key))
        if credential_bad:
            raise Invalid(f"cloud.mqtt.{key}", credential_bad)
    try:
        mqtt_topics.check_prefix(c.mqtt.topic_prefix, "value")
    except InvalidInputError as exc:
        raise Invalid("cloud.mqtt.topic_prefix", f"must be a valid MQTT topic prefix: {exc}") from None


def _check_synthetic_uri(path: str, uri: str) -> None:
    from edge.sources.synthetic import parse_uri

    try:
        spec = parse_uri(uri)
    except ValueError as exc:
        raise Invalid(path, f"is not a synthetic scene: {exc}") from None
    if spec.scene != "digits":
        return
    try:
        from edgewise.synth import load_difficulty
    except ImportError:
        return  # the source falls back to the built-in pattern, and says so
    try:
        difficulty = load_difficulty(spec.difficulty)
    except ConfigError as exc:
        raise Invalid(path, f"names no usable difficulty: {exc}") from None
    try:
        difficulty.check_frame(spec.width, spec.height, f"{spec.difficulty} scene")
    except ConfigError as exc:
        raise Invalid(path, str(exc)) from None


SCHEMA: Schema[EdgeSettings] = Schema(
    "edge", EdgeSettings, command="edgewise edge run", validate=validate,
    flags=(
        Flag("--device-id", "device_id"),
        Flag("--policy", "policy_file", metavar="FILE"),
        Flag("--metrics-port", "metrics.port", metavar="PORT"),
        Flag("--jsonl", "sinks.jsonl", metavar="FILE"),
    ),
    notes=lambda: [describe_backend()],
)


def load_settings(path: Optional[str] = None, overrides: Union[Sequence[str], Mapping[str, Any]] = (),
                  env: Optional[Mapping[str, str]] = None) -> EdgeSettings:
    """Build and validate the settings: ``path`` YAML < ``env`` (default ``os.environ``) <
    ``overrides`` (``key.path=value`` strings, list items by index: ``streams.0.fps=5``).

    Raises:
        ConfigError: naming the file line, variable or flag of the first problem.
    """
    return SCHEMA.load(path, overrides, env)


def describe() -> str:
    """Every settings key with its type, default, allowed values, variable and doc."""
    return describe_schema(SCHEMA)
