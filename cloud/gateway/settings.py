"""Gateway settings: the dataclasses, their cross-field rules and the gateway's named flags.

Loaded by the shared mechanism of :mod:`edgewise.settings`: defaults < YAML file
(``--config``) < environment ``EDGEWISE_GATEWAY__SECTION__KEY`` < ``--set
section.key=value`` < the named flags (``--listen``, ``--metrics-port``,
``--worker``, ``--mode``). Unknown keys, wrong types and values out of range are
refused at start with the file line, variable or flag that set them. See
``cloud/gateway/gateway.example.yaml`` for a documented example and
``docs/settings/gateway.md`` for every key.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud.binding import GRPC_INT_MAX
from cloud.discovery.static import parse_endpoints
from cloud.gateway.balancing import BalancerConfig
from edgewise import mqtt_topics
from edgewise.addresses import host_problem, parse_hostport
from edgewise.errors import ConfigError, InvalidInputError
from edgewise.filereads import kind_of
from edgewise.ids import DEFAULT_MAX_ID_LENGTH, bearer_token_problem, credential_problem, id_problem
from edgewise.imagefiles import DEFAULT_MAX_PIXELS
from edgewise.settings import Flag, Invalid, Schema, setting
from edgewise.settings.building import load_list_file
from edgewise.yamlnodes import SizeLimits

DISCOVERY_KINDS = ("static", "dns", "kubernetes")
CLIENT_IDENTITIES = ("cn", "san_dns", "san_uri", "none")


@dataclass
class TlsSettings:
    """Server TLS. Empty cert_file = plaintext (only for local runs / inside a mesh)."""

    cert_file: str = setting("PEM server certificate chain; empty = plaintext (local runs or inside a mesh "
                             "only). Followed with `key_file` and `client_ca_file`: looked at on new "
                             "connections, at most once a second, and a renewed certificate (cert-manager, "
                             "certbot) is served to new connections without a restart; files that do not "
                             "pass the start's checks are logged once and the current certificate stays.", "")
    key_file: str = setting("PEM private key of `cert_file`.", "")
    client_ca_file: str = setting("PEM CA bundle that signs client certificates (mTLS; needs `cert_file` and "
                                  "`key_file`). A rotated bundle is in force for new connections without a "
                                  "restart, like `cert_file`.", "")
    require_client_cert: bool = setting("mTLS: refuse clients without a valid certificate (needs "
                                        "`client_ca_file`).", False)
    client_identity: str = setting(
        "With client certificates: the certificate name that must equal the request's device_id, so a "
        "device's certificate cannot send with another device's id or token: `cn` (subject common name), "
        "`san_dns` (one of its DNS subjectAltNames), `san_uri` (one of its URI subjectAltNames, e.g. a "
        "SPIFFE id) or `none` (any valid certificate may send for any device).", "cn",
        choices=CLIENT_IDENTITIES)


@dataclass
class DeviceToken:
    """One device allowed to call the gateway, with its bearer token."""

    device: str = setting("Device id (the edge's `device_id`).", "")
    token: str = setting("Its bearer token (`authorization: Bearer <token>`).", "", secret=True)


@dataclass
class AuthSettings:
    """Per-device bearer tokens. Neither tokens nor tokens_file = authentication off (log says so)."""

    tokens: list[DeviceToken] = setting("Devices allowed to call, with their tokens; none here and no "
                                        "`tokens_file` = authentication off (logged).", factory=list)
    tokens_file: str = setting("YAML file holding a list of `{device, token}`; merged with `tokens`. Re-read "
                               "when it changes (`tokens_poll_s`) and on SIGHUP (with `tokens`): a token revoked "
                               "or added is in force without a restart. A result listing no device, or a file "
                               "that is invalid, is refused, at start and at a reload (the tokens in force stay; "
                               "remove this key to run without authentication).", "")
    tokens_poll_s: float = setting(
        "How often `tokens_file` is looked at, seconds: its resolved path, inode, times and size (one `stat`), "
        "so an edit, a file moved over it and a Kubernetes Secret update (kubelet swaps the mounted folder's "
        "`..data` link; the chart mounts the Secret as a folder) are all seen, and the tokens are re-read as "
        "on SIGHUP. A file that is half-written or invalid is refused, logged once per change, and the tokens "
        "in force stay. 0 = only on SIGHUP. A SIGHUP puts a changed value in force.", 5.0, lo=0, hi=3600)


@dataclass
class LimitSettings:
    """Input limits, deadlines and per-device rate limits."""

    max_message_bytes: int = setting("gRPC message limit, bytes, on both hops (edge to gateway, gateway to "
                                     "worker); MQTT requests too. The MQTT bridge takes packets of up to twice "
                                     "this and 1 MiB from the broker (its CONNECT Maximum Packet Size): a larger "
                                     "request is discarded by the broker and its edge times out.",
                                     8 * 1024 * 1024, lo=1024, hi=GRPC_INT_MAX)
    max_image_bytes: int = setting("Largest encoded image, bytes (at most `max_message_bytes`).",
                                   6 * 1024 * 1024, lo=1)
    max_image_pixels: int = setting("Largest image, width x height as its header declares (every encoding; "
                                    "read before any decoding). The workers check their own "
                                    "`max_image_pixels` too: the chart passes this value to them.",
                                    DEFAULT_MAX_PIXELS, lo=1)
    max_id_length: int = setting("Longest device_id / stream_id / trace_id.", DEFAULT_MAX_ID_LENGTH, lo=1)
    max_edge_detections: int = setting("Most edge detections one request may carry.", 1000, lo=0)
    default_deadline_s: float = setting("Deadline when neither the call nor the request sets one, seconds "
                                        "(at most `max_deadline_s`).", 5.0, lo=0, lo_open=True)
    max_deadline_s: float = setting("Longest deadline a request may ask for, seconds.", 60.0, lo=0, lo_open=True)
    rate_per_device: float = setting("Requests/s per device (token bucket); 0 = unlimited.", 0.0, lo=0)
    burst_per_device: float = setting("Token-bucket depth per device.", 20.0, lo=1)
    max_stream_in_flight: int = setting("Frames per DetectStream in flight or answered but not yet written to the "
                                        "client; more wait (backpressure).", 64, lo=1)
    max_concurrent_rpcs: int = setting(
        "Most gRPC calls the gateway serves at once, from all clients together (Detect, DetectStream and "
        "the gRPC health checks; also calls whose request has not arrived yet); gRPC refuses one more at "
        "once with RESOURCE_EXHAUSTED (the edge spools it; gRPC health checks fail then too, while "
        "the chart's probes ask the side port's `/healthz`, which it does not bound). Every open "
        "call holds memory, about 20 KB before its request arrives and its image after: the default suits "
        "the chart's 1 GiB pod. With authentication on, a call whose bearer token is no device's (Detect, "
        "gRPC health checks) is refused from its headers, before its request arrives, and a DetectStream "
        "at its start.",
        2048, lo=1, hi=GRPC_INT_MAX)
    max_connections: int = setting(
        "Most client connections the gateway's gRPC port holds at once; one more is closed as it arrives (the "
        "edge sees UNAVAILABLE \"Socket closed\" and spools; not counted in the gateway's metrics). An edge "
        "keeps one connection open. Each idle connection holds about 15 KB, 43 KB with TLS (measured): "
        "without a bound, anyone who reaches the port could hold connections that never call (no token is "
        "needed to connect) until the pod ran out of memory. The connections open when the bound is reached "
        "keep being served; raise it with the pods' memory limit, or scale the gateways out.",
        4096, lo=1, hi=GRPC_INT_MAX)
    max_connection_age_s: float = setting(
        "Seconds after which a client connection is sent GOAWAY, so that its client's next call opens a new "
        "one (0: never). A Service spreads connections, not calls, and an edge keeps its connection: after a "
        "rolling restart, or with a replica added, the edges stayed on the replicas they had. Calls in flight, "
        "DetectStreams included, go on to their end; the price is one TCP (and TLS) handshake per edge per "
        "age (gRPC adds up to 10% jitter).", 1800.0, lo=0, hi=GRPC_INT_MAX / 1000)
    max_streams_per_connection: int = setting(
        "Most calls open at once on one client connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a "
        "client's further calls wait on its side until one ends, but of calls a client starts together past "
        "the limit gRPC may refuse some at once (UNAVAILABLE, \"Received RST_STREAM with error code 7\"; not "
        "counted in the gateway's metrics; the edge spools them). The edge has at most `cloud.max_in_flight` "
        "escalations (16 by default) and `spool.replay_concurrency` replays (1) in flight.",
        100, lo=1, hi=GRPC_INT_MAX)
    max_calls_per_device: int = setting(
        "With device tokens (`auth.tokens`), most gRPC calls one device (the device of the bearer token) may "
        "hold open at once: Detect (from its headers on, before its request arrives), DetectStream and the gRPC "
        "health checks; one more is refused with RESOURCE_EXHAUSTED, so one device cannot hold all of "
        "`max_concurrent_rpcs` and freeze the others out. An edgewise edge holds one Detect call per "
        "escalation in flight: at most `cloud.max_in_flight` (16 by default) plus `spool.replay_concurrency` "
        "replays (1); raise this above their sum if you raised those. Without tokens (none, or client "
        "certificates only) the device is not known before the request: `max_concurrent_rpcs` only.",
        64, lo=1, hi=GRPC_INT_MAX)
    max_streams_per_device: int = setting(
        "Most DetectStream calls one device (its `x-edgewise-device` metadata, which authentication "
        "requires) may hold open; one more is refused with RESOURCE_EXHAUSTED. Streams without that "
        "metadata (authentication off) are bounded by `max_concurrent_rpcs` only.", 4, lo=1)
    stream_idle_timeout_s: float = setting(
        "A DetectStream that sends no frame for this long, and has no answer pending, is ended with "
        "UNAVAILABLE (open a new stream to send again), seconds.", 120.0, lo=0, lo_open=True)


@dataclass
class RetrySettings:
    """One retry on another worker for UNAVAILABLE, or for a worker's refusal of a deadline too
    short for it or for its own load when another may make it, bounded by a budget
    (docs/design/balancing.md#retries-and-the-retry-budget)."""

    enabled: bool = setting("Retry a request once on another worker after UNAVAILABLE, or after a worker refused "
                            "its deadline as closer than its batch of one, or refused it for its own load (queue "
                            "full, decode budget spent), when another worker may answer in the time left.", True)
    budget_ratio: float = setting("Retries at most this fraction of the requests over `window_s`.", 0.2,
                                  lo=0, hi=1)
    min_per_s: float = setting("...but always allow this many retries per second.", 3.0, lo=0)
    window_s: float = setting("Window of the retry budget, seconds.", 10.0, lo=0, lo_open=True)
    min_attempt_ms: float = setting("No retry with less time than this left before the deadline, ms.", 5.0, lo=0)


@dataclass
class DiscoverySettings:
    """Where the workers come from."""

    kind: str = setting("Worker discovery: a static list, DNS (a headless Service) or the Kubernetes "
                        "EndpointSlice API.", "static", choices=DISCOVERY_KINDS)
    static: list[str] = setting("static: workers as `host:port` or `host:port=weight`; SIGHUP re-reads "
                                "the list.", factory=list)
    dns: dict[str, Any] = setting("dns: options of `cloud.discovery.dns.DnsDiscovery` (name, port, "
                                  "interval_s, ...).", factory=dict)
    kubernetes: dict[str, Any] = setting("kubernetes: options of `cloud.discovery.kubernetes."
                                         "KubernetesDiscovery` (service, namespace, port_name, ...).",
                                         factory=dict)


#: the shared-subscription group of a bridge with no broker credential
UNPROTECTED_GROUP = "edgewise-gateway"


@dataclass
class MqttSettings:
    """MQTT v5 bridge: shared subscription to edgewise/+/escalate."""

    enabled: bool = setting("Serve escalations arriving over MQTT too.", False)
    host: str = setting("Broker host.", "127.0.0.1")
    port: int = setting("Broker port.", 1883, lo=1, hi=65535)
    group: str = setting("Shared-subscription group (`$share/<group>/<topic_prefix>/+/escalate`): "
                         "replicas split the load. Empty = one derived from the bridge's broker "
                         "`password`, which devices cannot guess (without a password: "
                         "`edgewise-gateway`, with a WARNING at start): a "
                         "device that joins the group takes a share of every device's requests and, "
                         "denied them by the broker's ACL, drops them (Mosquitto's acl_file does not "
                         "check subscriptions). A name set here must be as secret as a password.", "",
                         secret=True)
    topic_prefix: str = setting("Topic prefix, as the edges' `cloud.mqtt.topic_prefix`.", "edgewise")
    client_id: str = setting("MQTT client id; empty = `gateway-<hostname>-<pid>`.", "")
    username: str = setting("Broker username (optional).", "")
    password: str = setting("Broker password (optional; prefer EDGEWISE_GATEWAY__MQTT__PASSWORD).", "",
                            secret=True)
    tls: bool = setting("Connect to the broker with TLS.", False)
    ca_file: str = setting("PEM CA bundle of the broker's certificate (needs `tls: true`; empty = the system's "
                           "CAs). Followed with `cert_file` and `key_file`: looked at before each connection "
                           "attempt, and a rotated bundle (a CA taken out is no longer trusted) or a renewed client "
                           "certificate is used from the next connection without a restart; files that do not "
                           "load are logged once and the ones in force stay.", "")
    cert_file: str = setting("PEM client certificate for mutual TLS (needs `tls: true`); followed like `ca_file`.",
                             "")
    key_file: str = setting("PEM client key for mutual TLS (needs `tls: true`).", "")
    keepalive_s: int = setting("MQTT keepalive, seconds (MQTT carries it in two bytes). The broker drops a bridge "
                               "that sent nothing for 1.5 times this and until then hands it its share of the "
                               "group's requests: a hung replica's share goes unanswered that long.", 10,
                               lo=1, hi=65535)
    max_in_flight: int = setting("Concurrent requests from MQTT in the balancer.", 64, lo=1)
    max_in_flight_per_device: int = setting(
        "Concurrent requests from MQTT of one device (the topic's), at most: one more is answered "
        "RESOURCE_EXHAUSTED, so one device cannot take every slot of `max_in_flight` from the others (an edge "
        "has at most `cloud.max_in_flight`, 16 by default, plus its replays).", 32, lo=1)
    reconnect_min_s: float = setting("First reconnect delay, seconds (doubles up to `reconnect_max_s`).", 0.5,
                                     lo=0, lo_open=True)
    reconnect_max_s: float = setting("Largest reconnect delay, seconds.", 30.0, lo=0, lo_open=True)
    max_correlation_bytes: int = setting(
        "Longest MQTT v5 Correlation Data a request may carry, bytes (the edge sends 16). The answer "
        "echoes it, so a longer one could make the answer larger than the broker's Maximum Packet Size; "
        "such a request is not served but answered INVALID_ARGUMENT (when that answer fits the broker's "
        "Maximum Packet Size), counted "
        "(`edgewise_gateway_mqtt_messages_total{result=\"correlation_too_large\"}`) and logged.",
        256, lo=1, hi=65535)
    response_topic_pattern: str = setting(
        "Topics answers may be published to: an MQTT topic filter with a level `{device}` (the device of "
        "the request topic), e.g. `replies/{device}/#`; empty = `<topic_prefix>/{device}/response/#`. A "
        "request whose MQTT v5 Response Topic does not match is refused: counted "
        "(`edgewise_gateway_mqtt_messages_total{result=\"foreign_response_topic\"}`), logged, nothing "
        "published.", "")

    def response_pattern(self) -> str:
        return self.response_topic_pattern or mqtt_topics.response_pattern(self.topic_prefix)

    def share_group(self) -> str:
        """``group``, or one derived from the broker password every replica has and no device
        has. (Not from a client key: replicas may each have their own, and would then each
        get every request.) Without either, the public :data:`UNPROTECTED_GROUP`."""
        if self.group:
            return self.group
        if not self.password:
            return UNPROTECTED_GROUP
        digest = hashlib.sha256(b"edgewise mqtt share group\0" + self.username.encode() + b"\0" +
                                self.password.encode())
        return f"{UNPROTECTED_GROUP}-{digest.hexdigest()[:32]}"

    def share_group_shown(self) -> str:
        """:meth:`share_group` as the logs name it: the public default as it is, a secret one
        (set, or derived from the password) by where it comes from: a device that reads the name
        in the logs could join the gateways' group (docs/install-cloud.md#mqtt-security)."""
        if self.group:
            return "<mqtt.group>"
        return "<derived from mqtt.password>" if self.password else UNPROTECTED_GROUP


@dataclass
class GatewaySettings:
    """Everything one gateway process needs."""

    listen: str = setting("Edge-facing gRPC address `host:port` (Escalation service and gRPC health); "
                          "port 0 = any free port.", "0.0.0.0:50051")
    metrics_host: str = setting("Address of the HTTP side port (`::`: every IPv6 and IPv4 address).", "0.0.0.0")
    metrics_port: int = setting("HTTP side port: `/metrics`, `/pool` (JSON for the autoscaler), `/healthz`; "
                                "0 = any free port, -1 = off.", 9100, lo=-1, hi=65535)
    load_poll_interval_s: float = setting("How often each worker's Load (capacity, queue, serving) is polled, "
                                          "seconds.", 1.0, lo=0, lo_open=True)
    shutdown_delay_s: float = setting(
        "On SIGTERM, how long the gateway says NOT_SERVING (`/healthz` 503, gRPC health) while it still takes "
        "new connections and calls, seconds, before it drains for `shutdown_grace_s`: Kubernetes takes a "
        "stopping pod out of its Service a few seconds after the signal, and edges that connect meanwhile would "
        "be refused. The chart sets 5; 0 (the default: `cloud up`, systemd) drains at once. A second SIGTERM "
        "or SIGINT ends the wait.", 0.0, lo=0, hi=300)
    shutdown_grace_s: float = setting("On SIGTERM, how long in-flight requests may finish, seconds, after "
                                      "`shutdown_delay_s` (the chart gives the pod both and 15 s to stop).",
                                      10.0, lo=0, hi=3600)
    tls: TlsSettings = setting("Server TLS.", factory=TlsSettings)
    auth: AuthSettings = setting("Per-device bearer tokens.", factory=AuthSettings)
    limits: LimitSettings = setting("Input limits, deadlines, rate limits.", factory=LimitSettings)
    balancer: BalancerConfig = setting("The balancer.", factory=BalancerConfig)
    retry: RetrySettings = setting("Retries on another worker.", factory=RetrySettings)
    discovery: DiscoverySettings = setting("Where the workers come from.", factory=DiscoverySettings)
    mqtt: MqttSettings = setting("MQTT v5 bridge.", factory=MqttSettings)

    def device_tokens(self) -> dict[str, str]:
        """device -> token, from ``auth.tokens`` and ``auth.tokens_file``.

        Raises:
            ConfigError: the tokens file is unreadable or malformed (with its line), or, with
                ``auth.tokens_file`` set, the two list no device at all (authentication is off
                only when neither is configured).
        """
        out = {t.device: t.token for t in self.auth.tokens}
        if self.auth.tokens_file:
            _regular_file(self.auth.tokens_file, "the device tokens file (YAML)")
            holders = {token: device for device, token in out.items()}
            for i, (tok, line) in enumerate(load_list_file(DeviceToken, self.auth.tokens_file, "tokens",
                                                           TOKENS_FILE_SIZE)):
                bad = token_problem(tok, out, holders, self.limits.max_id_length)
                if bad:  # file:line, as the loader's own errors (an unknown key) name the entry
                    raise ConfigError(f"{line}: [{i}]: {bad} (in auth.tokens and this file)")
                out[tok.device] = tok.token
                holders[tok.token] = tok.device
            if not out:  # an emptied or half-written file must not switch authentication off
                raise ConfigError(f"{self.auth.tokens_file}: lists no device (and auth.tokens none): the gateway "
                                  "would accept any client; list the devices, or remove auth.tokens_file to run "
                                  "without authentication")
        return out


#: How large ``auth.tokens_file`` may be: it grows with the fleet, about 100 bytes and 5 YAML values
#: a device (``- device: cam-00001`` and a 64-character token). The settings files' 1 MiB and
#: 100,000 values refused a fleet of about 11,000 devices ("tokens file is 1880000 bytes, over the
#: 1048576-byte limit; is this the right file?" for 20,000), with nothing an operator could change.
#: The limit is 100,000 devices: reading takes about 4.5 KB of memory a device while it lasts (the
#: YAML trees; 90 MB for 20,000), which a gateway pod's 1 GiB (the chart's limit) holds beside the rest.
TOKENS_FILE_SIZE = SizeLimits(max_bytes=16 << 20, max_values=500_000,
                              usual="a tokens file holds about 100 bytes and 5 values a device: room for "
                                    "100,000 devices")


def _regular_file(path: str, what: str) -> None:
    """A named pipe, a device or a socket at ``path`` is a ``ConfigError`` found without opening
    it: reading a FIFO without a writer blocks, and the tokens file is read again by itself when
    it changes (``auth.tokens_poll_s``), on the gateway's event loop. A missing file is left to
    the read, which names it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ConfigError(f"{path}: is {kind_of(mode)}, expected {what}")


#: how much of an id an error message quotes (a client may send a huge one)
QUOTED_ID_CHARS = 64


def quote_id(value: str) -> str:
    """``value`` quoted for a message, cut to its first ``QUOTED_ID_CHARS`` characters."""
    return repr(value) if len(value) <= QUOTED_ID_CHARS else repr(value[:QUOTED_ID_CHARS]) + "…"


def token_problem(t: DeviceToken, seen: Mapping[str, str], holders: Mapping[str, str],
                  max_id_length: int = DEFAULT_MAX_ID_LENGTH) -> str:
    """What is wrong with one ``{device, token}`` entry given the devices before it, ``seen``
    (device -> token) and ``holders`` (the same, token -> device) ("" when nothing): a device
    listed twice would let one token silently win, and a presented token is read without
    surrounding blanks, so a token with them could never match. One look-up each, whatever the
    fleet's size (a scan of ``seen`` per entry took 4.9 s for 20,000 devices, at each reload, on
    the gateway's event loop)."""
    if not t.device or not t.token.strip():
        return "both device and token must be non-empty"
    bad = id_problem(t.device, "device", max_id_length)
    if bad:
        return f"{bad}: no request could name it"
    bad = bearer_token_problem(t.token)
    if bad:
        return f"the token of device {quote_id(t.device)} {bad}"
    if t.device in seen:
        return f"device {quote_id(t.device)} is listed twice; give each device one token"
    same = holders.get(t.token)
    if same is not None:
        return (f"devices {quote_id(same)} and {quote_id(t.device)} have the same token, so either could "
                "send as the other; give each device its own")
    return ""


def validate(s: GatewaySettings) -> None:
    """The rules that span fields; raises :class:`Invalid`."""
    try:  # the edge's and the worker lists' rule (edgewise.addresses), port 0 allowed
        _, port = parse_hostport(s.listen, where="listen", any_port=True)
    except ConfigError as e:
        raise Invalid("listen", str(e).removeprefix("listen: ")) from None
    if port and port == s.metrics_port:
        raise Invalid("metrics_port", f"{s.metrics_port} is also the port of listen ({s.listen}); give each its "
                                      "own port", also=("listen",))
    s.balancer.validate()
    if s.limits.max_image_bytes > s.limits.max_message_bytes:
        raise Invalid("limits.max_image_bytes", "must be at most limits.max_message_bytes",
                      also=("limits.max_message_bytes",))
    if s.mqtt.reconnect_min_s > s.mqtt.reconnect_max_s:
        raise Invalid("mqtt.reconnect_min_s", "must be at most mqtt.reconnect_max_s", also=("mqtt.reconnect_max_s",))
    if s.limits.default_deadline_s > s.limits.max_deadline_s:
        raise Invalid("limits.default_deadline_s", "must be at most limits.max_deadline_s",
                      also=("limits.max_deadline_s",))
    if s.discovery.kind == "static" and not s.discovery.static:
        raise Invalid("discovery.static", "list at least one worker 'host:port[=weight]' (or use --worker)")
    if s.discovery.kind == "static":
        # the static discovery's own rule, checked here so that a SIGHUP reload refuses a bad list
        # as it refuses any bad setting (the workers and tokens in force stay, one ERROR line):
        # found only when applied, it raised in the signal handler, a traceback and no reload
        try:
            parse_endpoints(s.discovery.static, where="")
        except ConfigError as e:
            raise Invalid("discovery.static", str(e)) from None
    if bool(s.tls.cert_file) != bool(s.tls.key_file):
        raise Invalid("tls", "set both cert_file and key_file, or neither")
    if (s.tls.client_ca_file or s.tls.require_client_cert) and not s.tls.cert_file:
        # without a server certificate the port is plaintext and no client certificate is asked for
        raise Invalid("tls", "client_ca_file/require_client_cert need cert_file and key_file: without them the "
                             "gateway serves plaintext and checks no client certificate; set tls.cert_file and "
                             "tls.key_file, or remove client_ca_file and require_client_cert")
    if s.tls.require_client_cert and not s.tls.client_ca_file:
        raise Invalid("tls.require_client_cert", "needs tls.client_ca_file")
    if s.tls.client_ca_file and not s.tls.require_client_cert:
        # gRPC's Python server can only "require and verify" or "never ask": with the flag
        # off, a client CA would be ignored and any certificate go unchecked.
        raise Invalid("tls.client_ca_file", "set tls.require_client_cert: true as well (gRPC Python cannot "
                                            "verify optional client certificates), or remove client_ca_file")
    seen: dict[str, str] = {}
    holders: dict[str, str] = {}
    for i, t in enumerate(s.auth.tokens):
        bad = token_problem(t, seen, holders, s.limits.max_id_length)
        if bad:
            raise Invalid(f"auth.tokens[{i}]", bad)
        seen[t.device] = t.token
        holders[t.token] = t.device
    if not s.mqtt.tls and (s.mqtt.ca_file or s.mqtt.cert_file or s.mqtt.key_file):
        # the bridge uses them only with mqtt.tls: the broker credentials would go in plaintext
        raise Invalid("mqtt.tls", "mqtt.ca_file/cert_file/key_file are set but mqtt.tls is false, so the bridge "
                                  "would connect in plaintext and ignore them; set mqtt.tls: true (and the broker's "
                                  "TLS port), or remove them")
    bad = host_problem(s.mqtt.host)
    if bad:
        raise Invalid("mqtt.host", f"{s.mqtt.host!r} {bad}")
    for key in ("username", "password"):
        credential_bad = credential_problem(getattr(s.mqtt, key))
        if credential_bad:
            raise Invalid(f"mqtt.{key}", credential_bad)
    if s.mqtt.group:
        _check_topic("mqtt.group", mqtt_topics.check_segment, s.mqtt.group)
    _check_topic("mqtt.topic_prefix", mqtt_topics.check_prefix, s.mqtt.topic_prefix)
    if s.mqtt.response_topic_pattern:
        _check_topic("mqtt.response_topic_pattern", mqtt_topics.check_pattern, s.mqtt.response_topic_pattern)


def _check_topic(path: str, check_fn: Callable[[str, str], str], value: str) -> None:
    try:
        check_fn(value, "value")
    except InvalidInputError as exc:
        raise Invalid(path, str(exc)) from None


SCHEMA: Schema[GatewaySettings] = Schema(
    "gateway", GatewaySettings, command="edgewise cloud gateway", validate=validate,
    flags=(
        Flag("--listen", "listen", metavar="HOST:PORT"),
        Flag("--metrics-port", "metrics_port", metavar="PORT"),
        Flag("--worker", "discovery.static", repeat=True, implies=(("discovery.kind", "static"),),
             metavar="HOST:PORT[=WEIGHT]", help="a static worker (repeatable); replaces discovery.static"),
        Flag("--mode", "balancer.mode", metavar="MODE"),
    ),
)


def load_settings(path: str | Path | None = None, overrides: Sequence[str] | Mapping[str, Any] = (),
                  env: Mapping[str, str] | None = None) -> GatewaySettings:
    """Validated settings from a YAML file, the environment (default ``os.environ``) and
    overrides (``key.path=value`` strings or a mapping of key path to value)."""
    return SCHEMA.load(path, overrides, env)
