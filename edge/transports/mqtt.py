"""MQTT v5 escalation transport (paho-mqtt 2.x, ``CallbackAPIVersion.VERSION2``).

Request/response per MQTT v5: the serialized ``DetectRequest`` is published QoS 1
to ``<prefix>/<device>/escalate`` with a *Response Topic*
``<prefix>/<device>/response/<client>``, *Correlation Data* and the device's token
as the User Property ``authorization: Bearer <token>`` (topics and property name:
``edgewise.mqtt_topics``); the cloud bridge answers there with the
``DetectResponse`` bytes and the same correlation data.
TLS, username/password or client certificates; paho's loop thread reconnects
with exponential backoff (``reconnect_delay_set``). The TLS files (``cloud.tls_ca``,
``cloud.tls_cert``, ``cloud.tls_key``) are followed without a restart, as the gateway's bridge
follows its own: paho is given an ``edgewise.clienttls.FollowedContext``, and before each
connection attempt (paho's ``on_pre_connect``) the files are looked at
(``edgewise.filewatch``); when they changed they are checked as at start (``edge.tlsfiles``)
and loaded into a new context that wraps the connections from then on. A client certificate
renewed on the device or a rotated CA bundle is used at the next reconnect; files that cannot
be used are one ERROR per change naming the setting, and the files in force stay. (paho's
``tls_set`` read them once: after a renewal the edge reconnected with the old certificate
until the daemon restarted.) ``MqttConnection`` is shared
with the MQTT sink; every publish goes through ``MqttConnection.publish``, which
is where the broker's answers are read:

* a message larger than the *Maximum Packet Size* the broker announced in its
  CONNACK (or MQTT's own bound, 256 MiB) is refused before it is sent: the broker
  would drop the connection, and paho would send the same message again after
  every reconnect, for good;
* a PUBACK with a failure reason code (>= 0x80: not authorized by the ACL, packet
  too large, quota exceeded, ...) is a ``Refusal``: logged (throttled) with the
  topic, the reason and what to do, counted, and handed to the publisher, never
  taken as a delivery. Mosquitto answers a message over its ``message_size_limit``
  with a PUBACK "Packet too large" (0x95), a code MQTT 5.0 lists for CONNACK and
  DISCONNECT only; paho would call that a malformed packet and reconnect, and send
  the message again, forever: ``edgewise.mqtt_client.Client`` takes it as the refusal it is;
* the edge announces the largest packet it takes in its CONNECT (*Maximum Packet Size*,
  ``receive_limit``): the largest answer, ``MAX_ANSWER_BYTES`` (the gRPC transport's receive
  limit), and room for its topic and properties. The broker discards a larger packet instead
  of sending it (MQTT 5.0 section 3.1.2.11.4; Mosquitto does), so no one who can publish to
  this device's response topic can make the edge read and hold hundreds of MB (MQTT allows
  256 MiB); the escalation it answers times out and spools. An answer over
  ``MAX_ANSWER_BYTES`` that fits the packet still comes, and is refused with its reason;
* a broker that takes QoS 0 only (its CONNACK's *Maximum QoS*, Mosquitto ``max_qos 0``)
  drops a client that publishes at QoS 1 ("QoS not supported"), and paho would send the
  message again after every reconnect, once a second, for good: every publish is then a
  ``Refusal`` before it is sent (the edge needs the broker's PUBACK: QoS 1), and what paho
  still holds from before is dropped at the CONNACK and settled as refused.

A refused escalation fails at once with the wire status that the gRPC code of the
same meaning has (``Refusal.status``, through ``edgewise.status.from_grpc``): not
authorized is PERMISSION_DENIED, so UNAUTHENTICATED (a configuration problem, not
spooled); too large is INVALID_ARGUMENT like gRPC's "message larger than max"
(the frame keeps its edge result); a quota is RESOURCE_EXHAUSTED (spooled).

An escalation is handed to paho only while the uplink can carry it in time: paho holds a
request until the broker's PUBACK, past its deadline too, and cannot take one back once it is
written. ``MqttTransport.window`` (``edge.transports.uplink``) refuses it at once when the
requests the broker has not acknowledged would pass ``cloud.mqtt.max_in_flight_bytes`` with it,
or would reach the broker only after its deadline (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED: the
policy's ``onCloudUnavailable``, as for a gRPC call past its deadline).

The connection reports itself: a throttled WARNING with the cause while the broker
cannot be reached, a clear one when the broker says another client took the session
over (the same client id used twice), one naming both causes when the broker keeps closing
the connection silently (a restarting broker, or such a clash: ``edgewise.mqtt_sessions``),
and the metrics ``edgewise_edge_mqtt_connected`` and
``edgewise_edge_mqtt_refused_total`` (``measure``). The edge's client id is the
device id plus a random suffix (``unique_client_id``): new at every process start, or,
with the MQTT sink, made once per device and kept in the sink's outbox, so that the broker's session
(``session_expiry_s``) carries the sink's QoS 2 exchanges over a restart (``edge.sinks``).
Callers: ``edge.escalating``, ``edge.daemon``, ``edge.sinks``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import sys
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, NoReturn, Optional, Set, Tuple

import grpc
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import Counter, Gauge

from edge.tlsfiles import check_files
from edge.transports import (
    MAX_ANSWER_BYTES,
    RECONNECT_DELAY_S,
    TLS_SETTINGS,
    TransportError,
    check_response,
    not_a_response,
)
from edge.transports.uplink import DEFAULT_MAX_BYTES, UplinkWindow
from edgewise import mqtt_topics, status
from edgewise.clienttls import FollowedContext, client_context
from edgewise.filewatch import FollowedFiles
from edgewise.mqtt_client import Client, OffTableReason
from edgewise.mqtt_packets import (
    PROTOCOL_MAX_PACKET,
    broker_max_packet_size,
    broker_max_qos,
    broker_receive_maximum,
    publish_packet_size,
)
from edgewise.mqtt_sessions import SILENT_CLOSES, TAKEN_OVER, SessionWatch
from edgewise.observability import LogThrottle

log = logging.getLogger(__name__)

#: MQTT v5 reason codes this module acts on by number.
PACKET_TOO_LARGE = 0x95
QOS_NOT_SUPPORTED = 0x9B
CLIENT_ID_NOT_VALID = 0x85
#: Room for an answer's topic and properties (its topic, correlation data and content type:
#: at most 64 KiB each in MQTT) on top of its payload, in the largest packet the edge takes.
ANSWER_HEADER_ROOM = 256 * 1024


def receive_limit() -> int:
    """The Maximum Packet Size the edge announces in its CONNECT: the largest answer it reads
    (``MAX_ANSWER_BYTES``, the one rule of an answer's size) and room for its headers. Nothing
    else comes to the edge over MQTT: its only subscription is its response topic."""
    return MAX_ANSWER_BYTES + ANSWER_HEADER_ROOM


#: Random hex digits after the device id in the edge's client id.
CLIENT_ID_SUFFIX_HEX = 8
#: How long the broker keeps the session of an edge with the MQTT sink while the daemon is
#: away (MQTT 5.0 Session Expiry Interval): a restart within it completes the sink's QoS 2
#: exchanges without a repeat (a reboot takes a minute; an hour costs the broker a few
#: packet identifiers and what it queues for the device's response topic).
SESSION_EXPIRY_S = 3600
#: PUBCOMP "Packet identifier not found": the broker no longer knows a QoS 2 exchange this
#: client resumed (it completed it before a restart, or lost the session)
PACKET_ID_NOT_FOUND = 0x92

#: What a PUBACK failure reason code means, as the gRPC code (and details) of the same
#: meaning: ``edgewise.status.from_grpc`` turns it into the wire status, so an MQTT refusal
#: is classified exactly as the gRPC transport's answer would be. Codes not listed: INTERNAL.
_GRPC_OF_REASON: Dict[int, Tuple[grpc.StatusCode, Optional[str]]] = {
    0x87: (grpc.StatusCode.PERMISSION_DENIED, None),  # Not authorized
    0x90: (grpc.StatusCode.INVALID_ARGUMENT, None),  # Topic name invalid
    0x91: (grpc.StatusCode.UNAVAILABLE, None),  # Packet identifier in use
    PACKET_TOO_LARGE: (grpc.StatusCode.RESOURCE_EXHAUSTED, status.TOO_LARGE),  # Packet too large
    0x97: (grpc.StatusCode.RESOURCE_EXHAUSTED, None),  # Quota exceeded
    0x99: (grpc.StatusCode.INVALID_ARGUMENT, None),  # Payload format invalid
    QOS_NOT_SUPPORTED: (grpc.StatusCode.UNAVAILABLE, None),  # the broker's max_qos: spooled until it changes
}

#: What the operator does about each refusal ("{topic}" is the refused topic).
_HINTS: Dict[int, str] = {
    0x87: "check the broker's ACL for this device: its MQTT user must be allowed to publish to {topic}",
    0x90: "the broker does not take this topic name; check cloud.mqtt.topic_prefix",
    PACKET_TOO_LARGE: "the message is over the broker's size limit (Mosquitto: message_size_limit or "
                      "max_packet_size); raise it on the broker, or send less (spec.payload.mode crops or "
                      "regions, a lower spec.payload.jpegQuality)",
    0x97: "the broker's quota for this client is used up (Mosquitto: max_queued_messages, "
          "max_queued_bytes); check that the subscribers keep up",
    0x99: "the broker refused the payload's format",
    QOS_NOT_SUPPORTED: "the broker takes QoS 0 only (Mosquitto: max_qos 0) and edgewise publishes at QoS 1, "
                       "for it needs the broker's acknowledgement: set max_qos 1 (or remove it) on the broker",
}


#: Every failure reason code a publish can be refused with: those of PUBACK and PUBREC (MQTT 5.0
#: sections 3.4.2.1, 3.5.2.1), Mosquitto's Packet too large, the edge's own QoS refusal.
REFUSAL_CODES = (0x80, 0x83, 0x87, 0x90, 0x91, PACKET_TOO_LARGE, 0x97, 0x99, QOS_NOT_SUPPORTED)


def reason_label(reason: str) -> str:
    """A reason code's name as a metric label: ``not_authorized``, ``packet_too_large``."""
    return reason.lower().replace(" ", "_")


_QOS2_HINT = ("the MQTT sink publishes at QoS 2 where the broker takes it, and sends the message again at "
              "QoS 1 (at least once); let the broker take QoS 2 (Mosquitto: remove max_qos)")


class Refusal(NamedTuple):
    """One publish the broker refused (a PUBACK reason code >= 0x80), or that the edge
    refused for it before sending (over the broker's Maximum Packet Size)."""

    topic: str
    code: int
    reason: str  # paho's name of the reason code, e.g. "Not authorized"
    message: str  # what happened and what to do, for the log and the frame's record

    @property
    def status(self) -> int:
        """The wire status (``edgewise.status``) of the refusal."""
        code, details = _GRPC_OF_REASON.get(self.code, (grpc.StatusCode.INTERNAL, None))
        return status.from_grpc(code, details)

    @property
    def label(self) -> str:
        """The reason as a metric label: ``not_authorized``, ``packet_too_large``."""
        return reason_label(self.reason)


def refusal(topic: str, reason: Any) -> Refusal:
    """The ``Refusal`` of a PUBACK failure ``reason`` (a paho ``ReasonCode``)."""
    code = int(getattr(reason, "value", reason))
    name = str(reason)
    hint = _HINTS.get(code, "the broker's log says why").format(topic=topic)
    return Refusal(topic, code, name, f"broker refused publish to {topic}: {name}; {hint}")


class PublishRefused(Exception):
    """A message was not handed to paho: the broker could not take it (``refusal``)."""

    def __init__(self, refused: Refusal) -> None:
        super().__init__(refused.message)
        self.refusal = refused


class MqttMetrics:
    """The MQTT connection's metrics, registered once per registry (a daemon's ``EdgeMetrics``)."""

    def __init__(self, registry: Any) -> None:
        self.connected = Gauge(
            "edgewise_edge_mqtt_connected", "1 while the edge is connected to its MQTT broker (cloud.mqtt.host)",
            registry=registry)
        self.refused = Counter(
            "edgewise_edge_mqtt_refused", "Publishes the MQTT broker refused (PUBACK reason code >= 0x80) or "
            "that were over its maximum packet size, by topic and reason", ["topic", "reason"], registry=registry)

    def publishing_to(self, topic: str) -> None:
        """Export ``topic``'s refusals at 0 with every reason (``REFUSAL_CODES``): a series that first
        appears at 1 has no increase() in Prometheus, so the first refusal on a topic (a broker ACL
        that denies the device: every escalation refused) never fired the MQTT refusal alert."""
        for code in REFUSAL_CODES:
            self.refused.labels(topic, reason_label(OffTableReason(code).getName()))


_METRICS: weakref.WeakKeyDictionary[Any, MqttMetrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.Lock()


def _metrics_of(registry: Any) -> MqttMetrics:
    with _METRICS_LOCK:
        m = _METRICS.get(registry)
        if m is None:
            m = _METRICS[registry] = MqttMetrics(registry)
        return m


OnDone = Callable[[Optional[Refusal]], None]


def load_tls_context(ca: str, cert: str, key: str) -> Tuple[ssl.SSLContext, List[str]]:
    """The context of the edge's TLS files, checked first as at start (``edge.tlsfiles``: the CA
    bundle parses, the key belongs to the certificate), built as paho's ``tls_set`` builds it
    (``edgewise.clienttls.client_context``, the code of the gateway's bridge), and what may be wrong
    with the certificate (expired, not yet valid): a ``ConfigError`` naming the setting and the
    problem when they cannot be used."""
    warnings = check_files(ca, cert, key, "")
    return client_context(ca, cert, key, TLS_SETTINGS), warnings


class MqttConnection:
    """One paho client with its own network thread, reconnecting with backoff."""

    def __init__(
        self,
        host: str,
        port: int = 1883,
        client_id: str = "",
        username: str = "",
        password: str = "",
        tls: bool = False,
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        keepalive_s: int = 30,
        metrics: Any = None,
        session_expiry_s: int = 0,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id or f"edgewise-edge-{uuid.uuid4().hex[:8]}"
        self.keepalive_s = keepalive_s
        #: > 0: every connection continues one MQTT session (clean start off) that the broker keeps
        #: this long while the client is away, which QoS 2 publishing (``exactly_once``) needs
        self.session_expiry_s = int(session_expiry_s)
        self.client = Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
        )
        if username:
            self.client.username_pw_set(username, password or None)
        #: the TLS files, followed (None: no TLS); ``tls_context`` is what paho wraps connections with
        self.tls_files: Optional[FollowedFiles[Tuple[ssl.SSLContext, List[str]]]] = None
        self.tls_context: Optional[FollowedContext] = None
        if tls:
            paths = (tls_ca, tls_cert, tls_key)
            # every connection attempt looks (paho's backoff spaces them at least a second apart)
            self.tls_files = FollowedFiles(paths, TLS_SETTINGS, lambda: load_tls_context(*paths),
                                           "the MQTT connection", log, interval_s=0.0)
            self.tls_context = FollowedContext.following(self.tls_files.loaded[0])
            self.client.tls_set_context(self.tls_context)
            self.client.on_pre_connect = self._on_pre_connect
        self.client.reconnect_delay_set(min_delay=RECONNECT_DELAY_S[0], max_delay=RECONNECT_DELAY_S[1])
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_pubrec = self._on_pubrec
        self._subscribing: Dict[int, str] = {}  # SUBSCRIBE mid -> topic, until its SUBACK
        #: SUBSCRIBE mid -> the reason codes of a SUBACK that came before subscribe() returned
        self._early_subacks: Dict[int, Any] = {}
        self.connected = threading.Event()
        self.subscriptions: Dict[str, Any] = {}  # topic -> handler(msg), resubscribed on reconnect
        self.lock = threading.Lock()
        self.stopping = False
        self.max_packet_size = PROTOCOL_MAX_PACKET  # the broker's, from its last CONNACK
        #: the largest packet the broker may send us, announced in CONNECT (``receive_limit``)
        self.receive_limit = receive_limit()
        self.max_qos = 2  # the broker's Maximum QoS, from its last CONNACK
        self.last_error = ""  # why the last connection attempt failed ("" once connected)
        self._waiting: Dict[int, Tuple[str, Optional[OnDone], str]] = {}  # mid -> (topic, on_done, after)
        self._early: Dict[int, Any] = {}  # mid -> reason code of a PUBACK that came before publish() returned
        #: QoS 2 mid -> told True at its PUBREC, False when the exchange starts over (a lost session)
        self._exchanges: Dict[int, Callable[[bool], None]] = {}
        self._sessions = SessionWatch()  # how the broker accepts and ends the connections
        self._connect_log = LogThrottle(60.0, burst=3)
        self._disconnect_log = LogThrottle(60.0, burst=3)
        self._takeover_log = LogThrottle(60.0, burst=2)
        self._refusal_log = LogThrottle(10.0, burst=5)
        self._note_log = LogThrottle(60.0, burst=3)
        self._subscribe_log = LogThrottle(300.0, burst=1)  # a few times an hour, as the bridge
        #: topic -> the broker's reason, while its last SUBACK refused the subscription
        self.refused: Dict[str, str] = {}
        #: seconds between subscriptions after a refusal (paho's longest reconnect delay)
        self.resubscribe_s = float(RECONNECT_DELAY_S[1])
        self._resubscribe: Optional[threading.Timer] = None
        self.metrics: Optional[MqttMetrics] = None
        self.topics: List[str] = []  # what is published through this connection (``publishes_to``)
        if metrics is not None:
            self.measure(metrics)

    @staticmethod
    def unique_client_id(device_id: str) -> str:
        """``<device_id>-<8 hex digits>``, new at every process start: two devices started from
        one copied configuration (in a container the daemon is PID 1 on both) must not share a
        client id, or the broker hands the session from one to the other on every reconnect.
        The device id stays readable in the broker's log; MQTT obliges brokers to take ids of
        up to 23 bytes only (Mosquitto takes far longer ones), so on such a broker keep
        device ids to 14 characters (a refusal says so)."""
        return f"{device_id}-{secrets.token_hex(CLIENT_ID_SUFFIX_HEX // 2)}"

    def measure(self, metrics: Any) -> None:
        """Count into this daemon's registry (``metrics.registry``, an ``EdgeMetrics``); the
        first one given stays."""
        if self.metrics is None:
            self.metrics = _metrics_of(metrics.registry)
            self.metrics.connected.set(1 if self.connected.is_set() else 0)
            for topic in self.topics:
                self.metrics.publishing_to(topic)

    def publishes_to(self, topic: str) -> None:
        """Note a topic the caller publishes to: its refusal counts are exported from the start."""
        if topic not in self.topics:
            self.topics.append(topic)
            if self.metrics is not None:
                self.metrics.publishing_to(topic)

    def start(self) -> None:
        # connect_async + loop_start: the first connection and every reconnect
        # happen in paho's thread, so a broker that is down never blocks us.
        # paho sends the same CONNECT properties at every reconnect.
        props = Properties(PacketTypes.CONNECT)
        props.MaximumPacketSize = self.receive_limit
        if self.session_expiry_s > 0:
            props.SessionExpiryInterval = self.session_expiry_s
            self.client.connect_async(self.host, self.port, keepalive=self.keepalive_s, clean_start=False,
                                      properties=props)
        else:
            self.client.connect_async(self.host, self.port, keepalive=self.keepalive_s, properties=props)
        self.client.loop_start()

    @property
    def in_flight_bound(self) -> int:
        """QoS 1/2 messages in flight at once on this connection (``Client.in_flight_bound``)."""
        return self.client.in_flight_bound

    @property
    def exactly_once(self) -> bool:
        """Whether a publish can be QoS 2 with a packet identifier that outlives this process
        (``reserve_mid``): the session is kept (``session_expiry_s``) and the broker's Maximum
        QoS is 2."""
        return self.session_expiry_s > 0 and self.max_qos >= 2

    def reserve_mid(self) -> int:
        """A packet identifier for ``publish(mid=...)``, to be noted on disk before the publish."""
        return self.client.reserve_mid()

    def release_mid(self, mid: int) -> None:
        """A reserved packet identifier not published after all."""
        self.client.release_mid(mid)

    def resume(self, topic: str, payload: bytes, mid: int, received: bool, on_done: Optional[OnDone] = None,
               on_received: Optional[Callable[[bool], None]] = None, after_refusal: str = "") -> None:
        """Before ``start``: a QoS 2 message the last process published with ``mid`` and did not
        see completed, sent again in the same session (``Client.resume``); ``on_done`` and
        ``on_received`` as for ``publish``."""
        with self.lock:
            self._waiting[mid] = (topic, on_done, after_refusal)
            if on_received is not None:
                self._exchanges[mid] = on_received
        self.client.resume(mid, topic, payload, received)

    def withdraw(self, info: Any) -> bool:
        """The message ``publish`` returned ``info`` for is no longer wanted (an escalation given up
        at its deadline, spooled): not sent, nor sent again after a reconnect (``Client.withdraw``);
        its ``on_done`` is never called once paho forgot it. True when it never left the edge."""
        withdrawn = self.client.withdraw(info)
        if withdrawn.forgotten:
            with self.lock:
                self._forget(info.mid)
        return not withdrawn.written

    def holds(self, info: Any) -> bool:
        """Whether the message ``publish`` returned ``info`` for is still paho's (``Client.holds``)."""
        return self.client.holds(info)

    def _forget(self, mid: int) -> Optional[Tuple[str, Optional[OnDone], str]]:
        """(under ``lock``) Everything kept for a message paho no longer holds; its waiting entry."""
        self._exchanges.pop(mid, None)
        self._early.pop(mid, None)
        return self._waiting.pop(mid, None)

    def stop(self) -> None:
        """Disconnect and end paho's thread; again: nothing."""
        if self.stopping:
            return
        self.stopping = True
        with self.lock:
            timer, self._resubscribe = self._resubscribe, None
        if timer is not None:
            timer.cancel()
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()
        self._set_connected(False)

    def subscribe(self, topic: str, handler: Any) -> None:
        with self.lock:
            self.subscriptions[topic] = handler
        if self.connected.is_set():
            self._subscribe(self.client, topic)

    def _subscribe(self, client: Any, topic: str) -> None:
        _, mid = client.subscribe(topic, qos=1)
        if mid is None:
            return
        with self.lock:
            early = self._early_subacks.pop(mid, None)
            if early is None:
                self._subscribing[mid] = topic
        if early is not None:  # paho's thread read the SUBACK before subscribe() returned
            self._subacked(topic, early)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        """(paho's thread) A SUBACK: a refused subscription is the broker's ACL (or its limits).
        Without it this device's answers never come: every escalation would time out and spool,
        and every replay the same, with nothing saying why.

        The subscription is tried again every ``resubscribe_s`` while connected (an ACL changed at
        run time, as Mosquitto's dynamic security does, takes effect without a restart), and
        ``refused`` names it meanwhile: ``MqttTransport`` then fails an escalation at once (spooled)
        instead of sending a frame whose answer cannot arrive."""
        with self.lock:
            topic = self._subscribing.pop(mid, None)
            if topic is None:  # ``_subscribe`` (another thread) has not noted this mid yet: it settles it
                self._early_subacks[mid] = reason_codes or ()
                return
        self._subacked(topic, reason_codes)

    def _subacked(self, topic: str, reason_codes: Any) -> None:
        """The SUBACK to the subscription to ``topic``: a refusal is noted (``refused``), the
        retry timer started and the refusal logged; a grant ends the refusal."""
        with self.lock:
            refusal = next((rc for rc in reason_codes or () if getattr(rc, "is_failure", False)), None)
            if refusal is None:
                self.refused.pop(topic, None)
                return
            if topic in self.subscriptions:
                self.refused[topic] = str(refusal)
            retry = self._resubscribe is None and not self.stopping
            if retry:
                self._resubscribe = threading.Timer(self.resubscribe_s, self._subscribe_again)
                self._resubscribe.daemon = True
                self._resubscribe.start()
        held = self._subscribe_log.allow()
        if held is not None:
            log.error("MQTT broker %s:%d refused the subscription to %s (%s): this device's answers cannot "
                      "arrive, so escalations are spooled until it is granted; the broker's ACL must let this "
                      "device's user read it (the shipped ACL: username = device_id); subscribing again every "
                      "%g s%s", self.host, self.port, topic, refusal, self.resubscribe_s,
                      f" ({held} more refusals not logged)" if held else "")

    def _subscribe_again(self) -> None:
        """(a timer's thread) Subscribe again to the refused topics; not connected, ``_on_connect``
        subscribes to every topic when the connection comes back."""
        with self.lock:
            self._resubscribe = None
            topics = [] if self.stopping else list(self.refused)
        if topics and self.connected.is_set():
            for t in topics:
                self._subscribe(self.client, t)

    def publish(self, topic: str, payload: bytes, properties: Optional[Properties] = None,
                on_done: Optional[OnDone] = None, after_refusal: str = "", mid: Optional[int] = None,
                on_received: Optional[Callable[[bool], None]] = None) -> Any:
        """Hand one QoS 1 message to paho (sent now, or after the reconnect), or a QoS 2 one with the
        packet identifier ``mid`` (``reserve_mid``; ``on_received`` is called from paho's thread
        with True when the broker's PUBREC came, before the PUBREL goes out, and with False when
        the exchange starts over, the broker having lost the session; a failure there is logged
        and the exchange goes on); its paho
        ``MQTTMessageInfo``. ``on_done`` is called once, from paho's thread or this one, when the
        broker answered: with None for a delivery, with the ``Refusal`` otherwise (already
        logged, throttled, with ``after_refusal`` saying what happens next, and counted).
        Raises ``PublishRefused`` (nothing sent, logged and counted the same way) for a message
        over the broker's Maximum Packet Size; without one announced, over MQTT's own bound
        (which is also where paho's "Payload too large" check lies, so that one never fires)."""
        qos = 1 if mid is None else 2
        try:
            return self._publish(topic, payload, qos, properties, on_done, after_refusal, mid, on_received)
        finally:
            if mid is not None:
                self.client.release_mid(mid)

    def _publish(self, topic: str, payload: bytes, qos: int, properties: Optional[Properties],
                 on_done: Optional[OnDone], after_refusal: str, mid: Optional[int],
                 on_received: Optional[Callable[[bool], None]]) -> Any:
        if self.max_qos < qos:
            self._refuse(self._qos_refusal(topic, qos), after_refusal)
        size = publish_packet_size(topic, payload, properties)
        limit = self.max_packet_size
        if size > limit:
            whose = (f"that the broker {self.host}:{self.port} announced" if limit < PROTOCOL_MAX_PACKET
                     else "of MQTT")
            self._refuse(Refusal(
                topic, PACKET_TOO_LARGE, "Packet too large",
                f"MQTT message to {topic} is {size} bytes ({len(payload)} bytes of payload), over the "
                f"Maximum Packet Size of {limit} bytes {whose}, so it is not sent; {_HINTS[PACKET_TOO_LARGE]}"),
                after_refusal)
        if mid is None:
            info = self.client.publish(topic, payload, qos=1, properties=properties)
        else:
            if on_received is not None:
                with self.lock:  # noted first: the PUBREC may come before publish_as returns
                    self._exchanges[mid] = on_received
            info = self.client.publish_as(mid, topic, payload, 2, properties)
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                with self.lock:
                    self._exchanges.pop(mid, None)
        if info.rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):  # queued: a PUBACK will come
            with self.lock:
                early = self._early.pop(info.mid, None)
                if early is None:
                    self._waiting[info.mid] = (topic, on_done, after_refusal)
            if early is not None:
                self._settle(topic, on_done, after_refusal, early)
        return info

    def _qos_refusal(self, topic: str, qos: Optional[int] = None) -> Refusal:
        at = "over it" if qos is None else str(qos)
        return Refusal(topic, QOS_NOT_SUPPORTED, "QoS not supported",
                       f"MQTT message to {topic} at QoS {at} is not sent: the broker {self.host}:{self.port} "
                       f"announced a Maximum QoS of {self.max_qos}; "
                       + (_HINTS[QOS_NOT_SUPPORTED] if self.max_qos < 1 else _QOS2_HINT))

    def _refuse(self, refused: Refusal, after: str) -> NoReturn:
        self._report(refused, after)
        raise PublishRefused(refused)

    def _report(self, refused: Refusal, after: str) -> None:
        """Count a refusal; log a few per interval."""
        if self.metrics is not None:
            self.metrics.refused.labels(refused.topic, refused.label).inc()
        held = self._refusal_log.allow()
        if held is not None:
            log.warning("%s%s%s", refused.message, f"; {after}" if after else "",
                        f" ({held} more refusals not logged)" if held else "")

    def _settle(self, topic: str, on_done: Optional[OnDone], after: str, reason: Any) -> None:
        refused = refusal(topic, reason) if reason.is_failure else None
        if (refused is not None and refused.code == PACKET_ID_NOT_FOUND
                and getattr(reason, "packetType", None) == PacketTypes.PUBCOMP):
            # a resumed PUBREL the broker no longer knows, in a session it kept: it completed the
            # exchange before the restart (a lost session restarts it with a PUBLISH instead)
            log.info("MQTT broker %s:%d no longer knew a QoS 2 message to %s resumed after a restart: "
                     "taken as delivered", self.host, self.port, topic)
            refused = None
        if refused is not None:
            self._report(refused, after)
        if on_done is not None:
            try:
                on_done(refused)
            except Exception:
                log.exception("MQTT publish callback for %s failed", topic)

    def _set_connected(self, up: bool) -> None:
        """The gauge first, then the event: whoever sees the event (a caller waiting for the
        connection, or for its loss) reads the gauge already in step with it."""
        if self.metrics is not None:
            self.metrics.connected.set(1 if up else 0)
        if up:
            self.connected.set()
        else:
            self.connected.clear()

    def _on_pre_connect(self, client: Any, userdata: Any) -> None:
        """(paho's thread, before each connection attempt) When the TLS files changed and can be
        used, this attempt and the next ones use them. Never raises (``FollowedFiles.look``)."""
        if self.tls_files is None or self.tls_context is None:
            return
        new = self.tls_files.look()
        if new is not None:
            self.tls_context.current = new[0]
            for warning in new[1]:
                log.warning("%s", warning)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        if reason_code.is_failure:
            self.last_error = f"the broker refused the connection: {reason_code}"
            held = self._connect_log.allow()
            if held is not None:
                hint = (f"the client id {self.client_id!r} is {len(self.client_id.encode())} bytes; brokers "
                        "need only take 23: shorten the device_id"
                        if reason_code == CLIENT_ID_NOT_VALID else
                        "check cloud.mqtt.username, the password and the broker's ACL")
                log.warning("MQTT broker %s:%d refused the connection: %s; %s%s", self.host, self.port,
                            reason_code, hint, f" ({held} more failures not logged)" if held else "")
            return
        self.max_packet_size = broker_max_packet_size(properties)
        self.max_qos = broker_max_qos(properties)
        self.last_error = ""
        self._drop_unsendable()
        # subscribed first: the requests paho sends again next are answered at once, and an answer
        # the broker routed before it read the SUBSCRIBE (behind them, on a slow uplink) was lost
        # (a new session has none): its escalation timed out and was spooled, to be computed again
        with self.lock:
            topics = list(self.subscriptions)
        for t in topics:
            self._subscribe(client, t)
        self._restarted(self.client.on_connack(bool(getattr(flags, "session_present", False)),
                                               broker_receive_maximum(properties)))
        if self.session_expiry_s > 0 and self.max_qos == 1:
            log.warning("MQTT broker %s:%d takes QoS 1 at most: the MQTT sink publishes at QoS 1, so a record in "
                        "flight when the daemon is killed may reach the topic twice; let the broker take QoS 2 "
                        "(Mosquitto: remove max_qos)", self.host, self.port)
        self._sessions.connected(time.monotonic())
        log.info("MQTT connected to %s:%d as %s%s", self.host, self.port, self.client_id,
                 f" (maximum packet size {self.max_packet_size} bytes)"
                 if self.max_packet_size < PROTOCOL_MAX_PACKET else "")
        self._set_connected(True)
        # a topic ``subscribe`` added from another thread meanwhile found no connection yet and left it
        # to this: without this look it waited for the next reconnect (an MqttTransport started just
        # after ``start`` got no answers, every escalation timing out)
        with self.lock:
            late = [t for t in self.subscriptions if t not in topics]
        for t in late:
            self._subscribe(client, t)

    def _drop_unsendable(self) -> None:
        """(paho's thread, in CONNACK) What paho holds at a QoS over the broker's Maximum QoS
        would make it drop the connection again at once, after every reconnect. Drop it, and
        settle each as refused (an escalation fails and spools, a record stays in the outbox).
        An escalation request past its deadline (its Message Expiry Interval) is dropped too,
        unsettled: its escalation gave up at the deadline (spooled, or kept its edge result),
        and sent again the broker would hand it to the gateway as new (``Client.drop_expired``)."""
        expired = self.client.drop_expired()
        with self.lock:
            for mid in expired:
                self._forget(mid)
        if expired:
            log.info("MQTT reconnected to %s:%d: %d escalation requests past their deadline are not sent again "
                     "(their escalations were spooled or kept their edge result)", self.host, self.port, len(expired))
        for mid, topic in self.client.drop_queued_over(self.max_qos).items():
            with self.lock:
                entry = self._forget(mid)
            refused = self._qos_refusal(topic)
            if entry is None:
                self._report(refused, "")
                continue
            self._report(refused, entry[2])
            if entry[1] is not None:
                try:
                    entry[1](refused)
                except Exception:
                    log.exception("MQTT publish callback for %s failed", topic)

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        """The broker could not be reached (paho calls this while it handles the connection's
        OSError: name not resolved, refused, timed out, TLS); paho retries with backoff."""
        cause = sys.exc_info()[1]
        self.last_error = f"{type(cause).__name__}: {cause}" if cause is not None else "no answer"
        self._set_connected(False)
        self._sessions.unreachable()
        held = self._connect_log.allow()
        if held is not None:
            log.warning("MQTT broker %s:%d cannot be reached (%s); retrying every %d-%d s. Meanwhile MQTT "
                        "escalations fail (and spool) and MQTT records wait in the outbox: check "
                        "cloud.mqtt.host, cloud.mqtt.port and the network%s", self.host, self.port,
                        self.last_error, RECONNECT_DELAY_S[0], RECONNECT_DELAY_S[1],
                        f" ({held} more failures not logged)" if held else "")

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        was_connected = self.connected.is_set()
        self._set_connected(False)
        if self.stopping:
            return
        silent = not getattr(flags, "is_disconnect_packet_from_server", False)
        verdict = self._sessions.closed(time.monotonic(), reason_code, not silent) if was_connected else None
        if verdict == TAKEN_OVER:
            self._taken_over("disconnected it: Session taken over", sure=True)
        elif verdict == SILENT_CLOSES:
            self._taken_over(self._sessions.silent_closes(), sure=False)
        elif was_connected:
            held = self._disconnect_log.allow()
            if held is not None:
                log.warning("MQTT disconnected from %s:%d (%s); reconnecting with backoff%s", self.host, self.port,
                            reason_code, f" ({held} more disconnects not logged)" if held else "")

    def _taken_over(self, what: str, sure: bool) -> None:
        """Another client connects with our client id (``sure``: the broker said so): the two take
        the session from each other on every reconnect; or the broker closed connections in a way
        that may mean it (:mod:`edgewise.mqtt_sessions`). Say so, a couple of times a minute."""
        held = self._takeover_log.allow()
        if sure:
            self.last_error = f"another client uses the client id {self.client_id!r}"
            if held is not None:
                log.warning("MQTT broker %s:%d %s, client id %r: "
                            "another client connected with the same client id "
                            "(two processes using one id: two edges with a fixed id, or another program), and they "
                            "take the session from each other on every reconnect: give each its own client id%s",
                            self.host, self.port, what, self.client_id,
                            f" ({held} more takeovers not logged)" if held else "")
            return
        self.last_error = (f"the broker closed the connection {self._sessions.short_sessions} times in a row soon "
                           f"after accepting it: a restarting broker, or another client with the client id "
                           f"{self.client_id!r}")
        if held is not None:
            log.warning("MQTT broker %s:%d %s; client id %r: if the broker was not restarting, look for another "
                        "process using this client id (two edges with a fixed id, or another program) and give "
                        "each its own client id%s", self.host, self.port, what, self.client_id,
                        f" ({held} more not logged)" if held else "")

    def _on_pubrec(self, mid: int) -> None:
        """(paho's thread) The broker received QoS 2 message ``mid``; its PUBREL goes out next.
        Where that cannot be noted (the outbox's disk) it goes out all the same: holding it back
        would hold up the connection the escalations share; a kill before its PUBCOMP may then
        deliver the record twice."""
        with self.lock:
            note = self._exchanges.get(mid)
        if note is None:
            return
        try:
            note(True)
        except Exception as exc:
            held = self._note_log.allow()
            if held is not None:
                log.warning("MQTT message %d: the broker's PUBREC could not be noted (%s); a kill before its "
                            "exchange completes may deliver it twice%s", mid, exc,
                            f" ({held} more not logged)" if held else "")

    def _restarted(self, mids: List[int]) -> None:
        """(paho's thread, in CONNACK) The broker did not keep the session: these QoS 2 exchanges
        start over with a PUBLISH."""
        if mids:
            log.warning("MQTT broker %s:%d did not keep this client's session: %d QoS 2 messages whose PUBREL "
                        "was owed are published again (a record may reach the topic twice)", self.host, self.port,
                        len(mids))
        for mid in mids:
            with self.lock:
                note = self._exchanges.get(mid)
            if note is not None:
                try:
                    note(False)
                except Exception:
                    log.exception("MQTT message %d: its restart could not be noted", mid)

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        with self.lock:
            self._exchanges.pop(mid, None)
            entry = self._waiting.pop(mid, None)
            if entry is None:  # publish() has not noted this mid yet: it settles it
                self._early[mid] = reason_code
                return
        self._settle(entry[0], entry[1], entry[2], reason_code)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        with self.lock:  # subscribe() may add a topic from another thread meanwhile
            handler = self.subscriptions.get(msg.topic)
            if handler is None:
                handler = next((h for topic, h in self.subscriptions.items()
                                if mqtt.topic_matches_sub(topic, msg.topic)), None)
        if handler is not None:
            try:
                handler(msg)
            except Exception:
                log.exception("MQTT handler for %s failed", msg.topic)


def _resolve(fut: asyncio.Future[bytes], payload: bytes) -> None:
    if not fut.done():
        fut.set_result(payload)


def _fail(fut: asyncio.Future[bytes], exc: TransportError) -> None:
    if not fut.done():
        fut.set_exception(exc)


class MqttTransport:
    """Escalates over MQTT v5 request/response."""

    name = "mqtt"

    def __init__(self, conn: MqttConnection, device_id: str, topic_prefix: str = "edgewise",
                 token: str = "", max_in_flight_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.conn = conn
        #: the requests the broker has not acknowledged: what is refused before it reaches paho
        self.window = UplinkWindow(max_in_flight_bytes)
        #: requests the broker acknowledged whose ``window.acknowledged`` has not run yet (added in
        #: paho's thread, under its lock, where paho stops holding them): ``keep_only`` keeps them
        self._acking: Set[Any] = set()
        self.request_topic = mqtt_topics.escalate_topic(topic_prefix, device_id)
        self.response_topic = mqtt_topics.response_topic(
            topic_prefix, device_id, mqtt_topics.check_segment(conn.client_id, "MQTT client id"))
        conn.publishes_to(self.request_topic)
        self.token = token
        self.pending: Dict[bytes, asyncio.Future[bytes]] = {}
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        #: Responses dropped unread, by why: ``no_correlation`` (none given), ``unknown_correlation``
        #: (not an escalation waiting: a late answer after its deadline, a repeat, another's).
        self.dropped: Dict[str, int] = {"no_correlation": 0, "unknown_correlation": 0}
        self._dropped_log = LogThrottle(60.0)

    def _acknowledged(self, info: Any, at: float) -> None:
        self._acking.discard(info)
        self.window.acknowledged(info, at)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.conn.subscribe(self.response_topic, self._on_response)

    def _drop(self, why: str, topic: str) -> None:
        """Count a response dropped unread; say so at most once a minute, with the counts."""
        self.dropped[why] += 1
        log.debug("MQTT response on %s dropped: %s", topic, why.replace("_", " "))
        held = self._dropped_log.allow()
        if held is not None:
            log.warning("MQTT response on %s dropped: %s (so far: %d without correlation data, %d whose "
                        "correlation data no escalation waits for: late after their deadline, repeated, or "
                        "another client's)", topic,
                        "no correlation data" if why == "no_correlation" else "unknown correlation data",
                        self.dropped["no_correlation"], self.dropped["unknown_correlation"])

    def _on_response(self, msg: Any) -> None:
        props = getattr(msg, "properties", None)
        corr = getattr(props, "CorrelationData", None) if props is not None else None
        if corr is None:
            self._drop("no_correlation", msg.topic)
            return
        fut = self.pending.get(bytes(corr))
        loop = self.loop
        if fut is None or loop is None:
            # a late answer after our deadline (the frame was spooled or kept edge-only), a repeat
            self._drop("unknown_correlation", msg.topic)
            return
        size = len(msg.payload)
        if size > MAX_ANSWER_BYTES:  # the gRPC transport's receive limit, the same refusal
            loop.call_soon_threadsafe(_fail, fut, TransportError(
                status.from_grpc(grpc.StatusCode.RESOURCE_EXHAUSTED, status.TOO_LARGE),
                f"MQTT response is {size} bytes, over the {MAX_ANSWER_BYTES} bytes an answer may have "
                f"({status.TOO_LARGE}, as the gRPC transport's receive limit); not read"))
            return
        payload = bytes(msg.payload)
        loop.call_soon_threadsafe(_resolve, fut, payload)

    async def detect(self, request: Any, timeout_s: float) -> Any:
        from edgewise.v1 import detect_pb2

        if self.loop is None:
            await self.start()
        if not self.conn.connected.is_set():
            why = f" ({self.conn.last_error})" if self.conn.last_error else ""
            raise TransportError(status.UNAVAILABLE, f"MQTT broker {self.conn.host}:{self.conn.port} not "
                                                     f"connected{why}", sent=False)
        refusal = self.conn.refused.get(self.response_topic)
        if refusal is not None:
            raise TransportError(status.UNAVAILABLE, f"MQTT broker {self.conn.host}:{self.conn.port} refused the "
                                                     f"subscription to {self.response_topic} ({refusal}): no answer "
                                                     "can arrive; not sent", sent=False)
        body = request.SerializeToString()
        # withdrawn, or dropped at a reconnect; not one acknowledged whose ``acknowledged`` is still
        # to run (paho stops holding it first: dropped here, its rate and round trip went unmeasured)
        self.window.keep_only(lambda info: self.conn.holds(info) or info in self._acking)
        held = self.window.refusal(len(body), timeout_s)
        if held is not None:
            raise TransportError(held.status, held.message, sent=False)
        corr = uuid.uuid4().bytes
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.response_topic
        props.CorrelationData = corr
        props.MessageExpiryInterval = max(1, int(timeout_s + 0.999))
        if self.token:  # checked by the gateway exactly as the gRPC metadata of the same name
            props.UserProperty = [(mqtt_topics.AUTHORIZATION_PROPERTY, f"Bearer {self.token}")]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        self.pending[corr] = fut
        sent: List[Any] = []  # its MQTTMessageInfo, once paho has it
        acked: List[float] = []  # when the broker's PUBACK came

        def refused(r: Optional[Refusal]) -> None:  # the broker's PUBACK (paho's thread, or this one)
            if loop.is_closed():
                return
            acked.append(time.monotonic())
            if sent:  # else it came before publish returned: acknowledged below, once sent
                self._acking.add(sent[0])
                loop.call_soon_threadsafe(self._acknowledged, sent[0], acked[0])
            if r is not None:
                loop.call_soon_threadsafe(_fail, fut, TransportError(r.status, r.message))

        info = None
        answered = False
        failed: Optional[TransportError] = None
        handed = self.window.clock()  # before publish: its PUBACK may come before publish returns
        try:
            try:
                info = self.conn.publish(self.request_topic, body, props, refused, "the escalation fails")
            except PublishRefused as exc:
                raise TransportError(exc.refusal.status, exc.refusal.message, sent=False) from None
            self.window.sent(info, len(body), handed)  # (paho may hold it whatever its rc: ``keep_only`` looks)
            sent.append(info)
            if acked:  # its PUBACK came before publish returned (settled then, in this thread)
                self.window.acknowledged(info, acked[0])
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise TransportError(status.UNAVAILABLE, f"MQTT publish failed: {mqtt.error_string(info.rc)}")
            try:
                payload = await asyncio.wait_for(fut, timeout=timeout_s)
                answered = True
            except asyncio.TimeoutError:
                if not self.conn.connected.is_set():
                    raise TransportError(status.UNAVAILABLE, "MQTT broker connection lost") from None
                raise TransportError(status.DEADLINE_EXCEEDED, f"no MQTT response within {timeout_s:.2f} s") from None
        except TransportError as exc:
            failed = exc
            raise
        finally:
            self.pending.pop(corr, None)
            if info is not None and not answered:
                # given up (its deadline, the transport closed, a stop): a broker that stopped reading
                # left it in paho's hands, and once it read again every escalation given up meanwhile
                # (spooled, to be replayed) reached the cloud, all at once (a refused one: paho
                # forgot it already)
                if self.conn.withdraw(info) and failed is not None:
                    failed.sent = False  # it never left: published while disconnected, or held back
        resp = detect_pb2.DetectResponse()
        try:
            resp.ParseFromString(payload)
        except Exception as exc:  # DecodeError, a string field that is not UTF-8
            raise not_a_response(f"MQTT response of {len(payload)} bytes: {exc}") from None
        return check_response(resp)

    async def close(self) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(TransportError(status.UNAVAILABLE, "transport closed"))
        self.pending.clear()
