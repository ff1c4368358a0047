"""MQTT v5 bridge of the gateway: escalations over MQTT through the same request path as gRPC.

Subscribes ``$share/<group>/<prefix>/+/escalate`` at QoS 1 (topics:
``edgewise.mqtt_topics``), so gateway replicas in the same group split the
messages (MQTT v5 shared subscription). Each payload is a serialized
``DetectRequest``; it goes through the gateway's one request path
(``RequestHandler.read`` then ``handle``: the payload read in place, the same
``TokenAuth`` check, validation, rate limit, balancer and retries as a gRPC call, the
payload's bytes forwarded as they came) with the ``Caller`` extracted here: the
device of the request topic and the token of the request's User Property
``authorization: Bearer <token>``. That token is checked first (``RequestHandler.screen``),
before the payload is read or the request counted against its topic's device
(``mqtt.max_in_flight_per_device``) or the bridge's ``mqtt.max_in_flight``: a request that
fails it is answered UNAUTHENTICATED (``error_answered``) and takes no slot of the device whose
topic it came on. The serialized ``DetectResponse`` is
published at QoS 1 to the request's MQTT v5 Response Topic with its Correlation
Data, but only when that topic lies in the requesting device's own subtree
(``<prefix>/<device>/response/...``) or matches ``mqtt.response_topic_pattern``:
a foreign response topic is refused, counted, logged, and nothing is published.
Malformed payloads, requests of more than ``edgewise.mqtt_properties.MAX_PROPERTIES`` properties
(their response topic among the first of them) and overload are answered with an error response,
counted, and never crash the bridge. Each request is counted under its result when it is
handled (``answered``, ``error_answered``, ``malformed``, ``overloaded``); an answer
the broker then refuses (a PUBACK reason code >= 0x80, e.g. Not authorized when the
ACL does not let the gateway write ``<prefix>/+/response/#``) is also counted as
``response_refused`` and logged (throttled) with the topic and the reason. A
disconnect with "Session taken over" (another client connected with the same
client id, e.g. two gateways sharing ``mqtt.client_id``) is a throttled warning
naming the id; so is a run of connections the broker closed silently soon after
accepting them, which says both of its causes, a restarting broker or a client-id clash
(``edgewise.mqtt_sessions``); a broker that cannot be reached is one naming the cause, any other
disconnect a throttled warning with the reason.

No answer may take the bridge's connection down: a broker drops a client that publishes a
packet over the Maximum Packet Size it announced in CONNACK (Mosquitto: ``max_packet_size``),
and paho would send that unacknowledged QoS 1 answer again after every reconnect, so no
request would be served again. So every answer's packet size (``edgewise.mqtt_packets``) is
checked against the broker's limit before it is published: one that would not fit is not
published (``answer_too_large``, logged, throttled; its edge times out). A request whose
Correlation Data (echoed in the answer) is longer than ``mqtt.max_correlation_bytes`` is not
served: it is answered INVALID_ARGUMENT (``correlation_too_large``; that answer too only if it
fits).

A request the broker retained is never answered (``NO_RETAINED``): it would be answered again at
every subscribe.

The bridge's client is ``edgewise.mqtt_client.Client``, the edge's: Mosquitto's PUBACK
"Packet too large" (0x95, an answer over its ``message_size_limit``) is a refusal like any
other (``response_refused``), not a malformed packet that would drop the connection.

The bridge needs QoS 1 (``BRIDGE_QOS``): the broker's PUBACK is the only way to know that an
answer was refused. A broker that takes QoS 0 only (its CONNACK's *Maximum QoS*, Mosquitto
``max_qos 0``) grants the subscription at QoS 0, then drops the connection at the first answer
("QoS not supported"), and paho sends that answer again after every reconnect, for good. So on
such a broker the bridge logs one ERROR naming ``max_qos``, stays connected without subscribing
(it would accept requests it cannot answer; ``edgewise_gateway_mqtt_connected`` stays 0), and
counts every answer it still holds, or finishes, as ``response_refused`` (logged, throttled);
it subscribes at the first connection whose CONNACK allows QoS 1. A refused subscription (a
SUBACK failure reason code: an ACL enforced on subscribe, as Mosquitto's dynamic security
does; Mosquitto's ``acl_file`` grants it and delivers nothing) is an ERROR naming the
subscription, the reason and what to fix, and the bridge subscribes again every
``mqtt.reconnect_max_s``. That ERROR is the one line naming the subscription's group (an
operator allows it in the broker's ACL by that name); the others say where the group comes
from (``$share/<mqtt.group>/...``, ``$share/<derived from mqtt.password>/...``), for a device
that learns the name can join the gateways' group (``MqttSettings.share_group_shown``).

With ``mqtt.tls``, the bridge's TLS files (``mqtt.ca_file``, ``mqtt.cert_file``,
``mqtt.key_file``) are followed without a restart (``cloud.gateway.mqtt_tls.BridgeTls``): before each connection
attempt (paho's ``on_pre_connect``) they are looked at with the rule of the gateway's own TLS
files (``edgewise.filewatch.ReloadDecision``: ``edgewise.filereads.file_identity``, a
kubelet ``..data`` swap or a file rewritten in place), and when they changed they are loaded
into a new context that wraps the connections from then on: a renewed client certificate (a
cert-manager renewal) and a rotated broker CA bundle, a removed CA included, are in force at the
next connection; the connection already open keeps what its handshake used. Files that cannot be
loaded (a key that does not belong to the certificate, a file that does not parse or is gone)
are one ERROR per change naming them, and the files in force stay.

A stop (SIGTERM, a rolling restart) unsubscribes and serves what the broker routed to this replica
before its UNSUBACK (from then on the group's other replicas get the requests), those it had
queued behind its in-flight window and delivers later included, until nothing has come for
``DRAIN_QUIET_S`` and the requests in flight are answered, within the gateway's
``shutdown_grace_s`` (one delivered after that is answered UNAVAILABLE), and
disconnects only once the broker has acknowledged their answers
(at most ``STOP_FLUSH_S``): paho closes the socket right after its DISCONNECT, and answers the
broker had not read yet were lost with the reset.

paho-mqtt 2.x (CallbackAPIVersion.VERSION2) runs its network loop in a thread and
reconnects with backoff; work is handed to the gateway's event loop with
``run_coroutine_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Protocol

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from prometheus_client import Counter, Gauge

from cloud.gateway.admission import Caller
from cloud.gateway.envelope import Reply, RequestHead, error_reply
from cloud.gateway.metrics import GatewayMetrics
from cloud.gateway.mqtt_tls import BridgeTls
from cloud.gateway.settings import UNPROTECTED_GROUP, LimitSettings, MqttSettings, quote_id
from edgewise import mqtt_properties, mqtt_topics, status
from edgewise.errors import InvalidInputError
from edgewise.mqtt_client import Client
from edgewise.mqtt_packets import (
    PROTOCOL_MAX_PACKET,
    broker_max_packet_size,
    broker_max_qos,
    broker_receive_maximum,
    publish_packet_size,
)
from edgewise.mqtt_sessions import SILENT_CLOSES, STOP_FLUSH_S, TAKEN_OVER, SessionWatch
from edgewise.observability import LogThrottle

log = logging.getLogger("edgewise.gateway.mqtt")

#: MQTT v5 reason codes the bridge acts on by number.
NOT_AUTHORIZED = 0x87
TOPIC_FILTER_INVALID = 0x8F
QUOTA_EXCEEDED = 0x97
QOS_NOT_SUPPORTED = 0x9B
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2
#: The QoS of the bridge's subscription and answers: QoS 1, for the broker's PUBACK is the only way
#: to know that an answer was refused (its ACL), so that it is counted and logged, never lost unseen.
BRIDGE_QOS = 1
#: A retained request (published with the retain flag) would be answered again at every
#: subscribe, its token kept by the broker: the subscription asks for none (MQTT v5 Retain
#: Handling 2), and one delivered anyway (a broker that ignores it) is dropped (``retained``).
NO_RETAINED = SubscribeOptions.RETAIN_DO_NOT_SEND
SUBSCRIBE_OPTIONS = SubscribeOptions(qos=BRIDGE_QOS, retainHandling=NO_RETAINED)
#: seconds between two looks at the answers the broker has not acknowledged, before a stop disconnects
FLUSH_POLL_S = 0.01
#: After its UNSUBACK, a stop takes requests until none has come for this long and none is in
#: flight: the broker routes a request when it takes its PUBLISH, and one routed to this replica
#: but queued behind its in-flight window (Mosquitto's max_inflight_messages) comes after the
#: UNSUBACK (MQTT 5.0 section 3.10.4: it "MAY continue to deliver any existing messages buffered
#: for delivery"), one a PUBACK's round trip after the other; no other replica gets it.
DRAIN_QUIET_S = 0.25
#: Room for a request's topic and properties (response topic, correlation data, token) in the
#: largest packet the bridge takes (``receive_limit``).
HEADER_ROOM = 1 << 20


def receive_limit(max_message_bytes: int) -> int:
    """The Maximum Packet Size the bridge announces in its CONNECT: twice the gateway's message
    limit, and room for the headers. A broker discards a larger packet instead of sending it
    (MQTT 5.0 section 3.1.2.11.4), so no device can make the gateway hold hundreds of MB (the
    payload, paho's buffer and a copy; Mosquitto forwards up to 256 MB by default), while a
    request a little over the limit still gets its INVALID_ARGUMENT answer."""
    return min(PROTOCOL_MAX_PACKET - 5, 2 * max_message_bytes + HEADER_ROOM)


#: What the operator does about a refused subscription, by SUBACK reason code ("{user}",
#: "{prefix}" and "{subscription}" are filled in).
_SUBACK_HINTS: dict[int, str] = {
    NOT_AUTHORIZED: "the broker's ACL must let the gateway's MQTT user ({user}) subscribe to it (Mosquitto "
                    "dynamic security: a role with subscribePattern {subscription}; acl_file: "
                    "`topic read {prefix}/+/escalate` under `user <mqtt.username>`)",
    TOPIC_FILTER_INVALID: "the broker does not take this topic filter: check mqtt.group and mqtt.topic_prefix",
    QUOTA_EXCEEDED: "the broker's quota for this client is used up (its limit of subscriptions)",
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: "the bridge needs MQTT v5 shared subscriptions ($share/...): use a "
                                        "broker that has them (Mosquitto 1.6 or later)",
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: "the bridge needs wildcard subscriptions: use a broker that has them",
}


def _paho_seconds(seconds: float) -> int:
    """A delay as paho's reconnect backoff takes it: whole seconds, at least 1."""
    return max(1, int(seconds))


class RequestHandler(Protocol):
    """The gateway's one request path, as the bridge needs it: ``metrics`` counts the requests
    the bridge answers itself (overload) like every other answered request."""

    metrics: GatewayMetrics

    def read(self, body: bytes, transport: str) -> RequestHead | Reply: ...

    def screen(self, req: RequestHead | None, transport: str, caller: Caller) -> Reply | None: ...

    async def handle(self, req: RequestHead, transport: str, caller: Caller,
                     call_remaining: float | None = None) -> Reply: ...


class MqttBridge:
    """One MQTT v5 client feeding the gateway's request path."""

    def __init__(self, settings: MqttSettings, handler: RequestHandler, counter: Counter,
                 loop: asyncio.AbstractEventLoop | None = None, up: Gauge | None = None,
                 max_message_bytes: int | None = None) -> None:
        self.s = settings
        # (None: the gateway's default limits.max_message_bytes)
        self.receive_limit = receive_limit(max_message_bytes or LimitSettings().max_message_bytes)
        self.handler = handler
        self.counter = counter
        self.up = up  # 1 while connected and subscribed
        self.loop = loop or asyncio.get_running_loop()
        group = settings.share_group()
        self.subscription = mqtt_topics.shared_subscription(group, settings.topic_prefix)
        #: the subscription as the logs show it: its group is a secret (share_group_shown)
        self.shown_subscription = mqtt_topics.shared_subscription(settings.share_group_shown(), settings.topic_prefix)
        if group == UNPROTECTED_GROUP and (settings.username or settings.cert_file):
            # (a broker without credentials confines nobody: nothing to keep secret there)
            log.warning("MQTT bridge: its shared-subscription group is the public default %r (no mqtt.group and "
                        "no mqtt.password to derive one from): a device that joins it takes a share of every "
                        "device's requests and, if the broker's ACL denies it them, the broker drops them; set "
                        "mqtt.group to a name only the gateways know", UNPROTECTED_GROUP)
        self.response_pattern = settings.response_pattern()
        self._refusal_log = LogThrottle(10.0, burst=5)
        self._connect_log = LogThrottle(60.0, burst=3)
        self._takeover_log = LogThrottle(60.0, burst=2)
        self._response_log = LogThrottle(10.0, burst=5)
        self._disconnect_log = LogThrottle(60.0, burst=3)
        self._too_large_log = LogThrottle(10.0, burst=5)
        self._qos_log = LogThrottle(300.0, burst=1)
        self._subscribe_log = LogThrottle(300.0, burst=1)
        self.max_packet_size = PROTOCOL_MAX_PACKET  # the broker's, from its last CONNACK
        self.max_qos = 2  # the broker's Maximum QoS, from its last CONNACK
        self._qos_reported = False  # the ERROR about the broker's Maximum QoS was logged: once until it changes
        self._resubscribe: threading.Timer | None = None  # after a refused subscription
        self._stopping = False
        #: stop() took its last look at what is in flight (past its grace, its connection lost, or the
        #: broker quiet after the UNSUBACK): a request delivered from now on is answered UNAVAILABLE;
        #: one delivered before is served, and stop() waits for it
        self._closed = False
        self._delivered_at = float("-inf")  # (monotonic) when a request last came, for stop()'s DRAIN_QUIET_S
        self._unsubscribed: asyncio.Future[None] | None = None  # stop() waits on it for the UNSUBACK
        self._sessions = SessionWatch()  # how the broker accepts and ends the connections
        self.client_id = settings.client_id or f"gateway-{socket.gethostname()}-{os.getpid()}-{id(self) % 10000}"
        self.client = Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        if settings.username:
            self.client.username_pw_set(settings.username, settings.password or None)
        self.tls: BridgeTls | None = None
        if settings.tls:  # followed: read again before a connection attempt when they changed
            self.tls = BridgeTls(settings.ca_file, settings.cert_file, settings.key_file)
            self.client.tls_set_context(self.tls.context)
            self.client.on_pre_connect = self._on_pre_connect
        self.client.reconnect_delay_set(_paho_seconds(settings.reconnect_min_s), _paho_seconds(settings.reconnect_max_s))
        self.client.on_connect = self._on_connect
        self.client.on_connect_fail = self._on_connect_fail
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish
        self.client.on_unsubscribe = self._on_unsubscribe
        self._pending: dict[Future[None], str] = {}  # requests in flight -> their device
        # of those, how many each device has (kept with _pending under the lock: read per request,
        # where a scan of _pending costs mqtt.max_in_flight steps, a setting without a ceiling)
        self._per_device: collections.Counter[str] = collections.Counter()
        self._unacked: dict[int, str] = {}  # mid -> response topic, of answers handed to paho
        self._early: dict[int, Any] = {}  # mid -> reason code of a PUBACK that came before publish() returned
        self._lock = threading.Lock()
        self.connected = threading.Event()
        self.counts: dict[str, int] = {}

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in the background (retrying with backoff until the broker answers)."""
        props = Properties(PacketTypes.CONNECT)
        props.MaximumPacketSize = self.receive_limit
        self.client.connect_async(self.s.host, self.s.port, keepalive=self.s.keepalive_s,
                                  clean_start=True, properties=props)
        self.client.loop_start()

    async def stop(self, grace: float = 5.0) -> None:
        """Unsubscribe, serve what the broker routed here until it took the UNSUBSCRIBE (its UNSUBACK)
        and what was in flight (up to ``grace`` in all), then disconnect. The broker hands the group's
        requests to the other replicas from its UNSUBACK on; the requests it routed to this one
        before that were answered UNAVAILABLE ("gateway is shutting down") when they reached paho
        after the UNSUBSCRIBE was sent: 2 of 300 escalations at 250 a second were spooled at a
        rolling restart of one of two gateways (found by a probe); and those the broker had queued
        behind its in-flight window come after the UNSUBACK (``DRAIN_QUIET_S``): 19 of 20 were
        answered UNAVAILABLE with a window of 1 and paho's thread busy."""
        end = time.monotonic() + grace
        loop = asyncio.get_running_loop()
        unsubscribed: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._stopping = True
            timer, self._resubscribe = self._resubscribe, None
            self._unsubscribed = unsubscribed
        if timer is not None:
            timer.cancel()
        subscribed = self.connected.is_set()
        rc, _ = self.client.unsubscribe(self.subscription)
        if rc != mqtt.MQTT_ERR_SUCCESS or not subscribed:  # no subscription to take back
            self._close_to_new()
        else:
            with contextlib.suppress(asyncio.TimeoutError):  # a broker that does not answer: the grace
                await asyncio.wait_for(asyncio.shield(unsubscribed), max(0.0, end - time.monotonic()))
        while True:  # what comes now was routed here before the UNSUBACK: taken and waited for
            with self._lock:
                now = time.monotonic()
                pending = [asyncio.wrap_future(f) for f in self._pending]
                if now >= end or (not pending and (self._closed or now - self._delivered_at >= DRAIN_QUIET_S)):
                    self._closed = True  # every request taken is in _pending, and was waited for
                    break
            if pending:
                await asyncio.wait(pending, timeout=end - now)
            else:
                await asyncio.sleep(min(end - now, DRAIN_QUIET_S - (now - self._delivered_at)))
        await self._flushed()
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)

    def _close_to_new(self) -> None:
        """stop()'s connection is lost (its session and subscription end with it), or it has no
        subscription to take back: a request delivered from now on is answered UNAVAILABLE."""
        with self._lock:
            self._closed = True
        self._unsubacked()

    def _unsubacked(self) -> None:
        """stop()'s UNSUBSCRIBE took effect: it goes on to drain (``DRAIN_QUIET_S``)."""
        with self._lock:
            waiting = self._unsubscribed
        if waiting is not None:
            with contextlib.suppress(RuntimeError):  # a loop already closed waits for nothing
                self.loop.call_soon_threadsafe(_settle, waiting)

    def _on_unsubscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any,
                        properties: Any) -> None:
        if self._stopping:  # the bridge unsubscribes in stop() only
            self._unsubacked()

    async def _flushed(self) -> None:
        """Return once the broker has acknowledged every answer published (at most ``STOP_FLUSH_S``;
        at once without a connection). paho closes the socket right after it writes the DISCONNECT:
        with the PUBACKs to the last answers unread, the connection ended with a reset, and the
        broker dropped the answers it had not read yet (of 5 answered together at the end of a
        drain, all reached the edge in 1 run of 3; found by a probe)."""
        end = time.monotonic() + STOP_FLUSH_S
        while self.connected.is_set() and time.monotonic() < end:
            with self._lock:
                if not self._unacked:
                    return
            await asyncio.sleep(FLUSH_POLL_S)

    # ---- paho callbacks (network thread) ---------------------------------------------------
    def _on_pre_connect(self, client: mqtt.Client, userdata: Any) -> None:
        """Before each connection attempt, the first included: the TLS files, if they changed."""
        if self.tls is not None:
            self.tls.look()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        if reason_code.is_failure:
            log.error("MQTT broker %s:%d refused the connection: %s", self.s.host, self.s.port, reason_code)
            return
        self._sessions.connected(time.monotonic())
        self.max_packet_size = broker_max_packet_size(properties)
        if self.max_packet_size < PROTOCOL_MAX_PACKET:
            log.info("MQTT broker %s:%d takes packets of at most %d bytes (its Maximum Packet Size); larger "
                     "answers are not published", self.s.host, self.s.port, self.max_packet_size)
        self.max_qos = broker_max_qos(properties)
        if self.max_qos < BRIDGE_QOS:
            self._qos_too_low()  # first: what paho holds at QoS 1 must not go out
        # the answers paho holds go out now, within the broker's Receive Maximum
        self.client.on_connack(bool(getattr(flags, "session_present", False)), broker_receive_maximum(properties))
        if self.max_qos < BRIDGE_QOS:
            return
        if self._qos_reported:
            self._qos_reported = False
            log.info("MQTT broker %s:%d takes QoS %d now: the bridge subscribes", self.s.host, self.s.port,
                     self.max_qos)
        if not self._stopping:  # a reconnect while stop() drains takes no new requests
            client.subscribe(self.subscription, options=SUBSCRIBE_OPTIONS)

    def _qos_too_low(self) -> None:
        """(paho's thread, in CONNACK, before paho sends again what it holds) The broker takes QoS 0
        only: it would drop the connection at the first answer (QoS 1), and paho would send that
        answer again after every reconnect, for good. So: no subscription (requests it accepted
        could not be answered), the answers paho holds are dropped and counted, and one ERROR."""
        dropped = self.client.drop_queued_over(self.max_qos)
        with self._lock:
            for mid in dropped:
                self._unacked.pop(mid, None)
        if not self._qos_reported:
            self._qos_reported = True
            log.error("MQTT broker %s:%d takes QoS %d only (the Maximum QoS of its CONNACK; Mosquitto: max_qos "
                      "%d on the listener of port %d), and the bridge needs QoS %d for requests and answers "
                      "(the broker's PUBACK is how a refused answer is known; the broker drops a client that "
                      "publishes at QoS %d): the bridge stays connected without subscribing %s, so no MQTT "
                      "escalation is served (edgewise edges do not publish at QoS 0 either: theirs fail and "
                      "spool)%s; set max_qos 1, or remove it, in the broker's configuration and restart the "
                      "broker (Mosquitto does not reload max_qos on SIGHUP): the bridge subscribes at its next "
                      "connection", self.s.host, self.s.port, self.max_qos, self.max_qos, self.s.port,
                      BRIDGE_QOS, BRIDGE_QOS, self.shown_subscription,
                      f"; answers it held, not published: {len(dropped)} (response_refused)" if dropped else "")
        for topic in dropped.values():
            self._not_answered(topic)

    def _not_answered(self, topic: str) -> None:
        """An answer the broker cannot take at the bridge's QoS: counted and logged, not published."""
        self._count("response_refused")
        held = self._response_log.allow()
        if held is not None:
            log.warning("answer to %s not published: the broker %s:%d takes QoS %d only (Mosquitto max_qos) "
                        "and the bridge answers at QoS %d; the edge times out and replays%s", topic[:200],
                        self.s.host, self.s.port, self.max_qos, BRIDGE_QOS,
                        f" ({held} more not published)" if held else "")

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any,
                      properties: Any) -> None:
        refused = [rc for rc in reason_codes if rc.is_failure]
        if refused:
            self._subscription_refused(refused[0])
            return
        if self.up is not None:  # the gauge first: who waits on the event may read it next
            self.up.set(1)
        self.connected.set()  # requests published from now on reach this gateway
        log.info("MQTT bridge connected to %s:%d, subscribed %s", self.s.host, self.s.port, self.shown_subscription)

    def _subscription_refused(self, reason_code: Any) -> None:
        """(paho's thread) A SUBACK with a failure reason code: no request reaches this gateway.
        Say which subscription, why and what to fix (a few times an hour), and subscribe again
        every ``mqtt.reconnect_max_s`` (an ACL changed at run time, as Mosquitto's dynamic security
        does, then takes effect without a restart)."""
        code = int(getattr(reason_code, "value", reason_code))
        user = repr(self.s.username) if self.s.username else "anonymous: mqtt.username is empty"
        hint = _SUBACK_HINTS.get(code, "the broker's log says why").format(
            user=user, prefix=self.s.topic_prefix, subscription=self.subscription)
        held = self._subscribe_log.allow()
        if held is not None:
            log.error("MQTT broker %s:%d refused the bridge's subscription to %s (%s): no MQTT escalation reaches "
                      "this gateway (the edges time out and spool); %s; the bridge subscribes again every %g s%s",
                      self.s.host, self.s.port, self.subscription, reason_code, hint, self._resubscribe_s(),
                      f" ({held} more refusals not logged)" if held else "")
        with self._lock:
            if self._stopping or self._resubscribe is not None:
                return
            timer = self._resubscribe = threading.Timer(self._resubscribe_s(), self._subscribe_again)
        timer.daemon = True
        timer.start()

    def _resubscribe_s(self) -> float:
        """Seconds between subscriptions after a refusal: ``mqtt.reconnect_max_s``, at least 1 s,
        as paho's reconnect backoff takes it."""
        return float(_paho_seconds(self.s.reconnect_max_s))

    def _subscribe_again(self) -> None:
        """(a timer's thread) Subscribe again after a refusal; after a reconnect, ``_on_connect``
        has already done it."""
        with self._lock:
            self._resubscribe = None
            if self._stopping:
                return
        if not self.connected.is_set() and self.max_qos >= BRIDGE_QOS and not self._stopping:
            self.client.subscribe(self.subscription, options=SUBSCRIBE_OPTIONS)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        """The broker did not answer (refused, unreachable, name not found): paho retries with
        backoff; say so, a few times an interval, since no MQTT escalation reaches this gateway
        meanwhile (the edges time out and spool)."""
        self._count("connect_failed")
        self._sessions.unreachable()
        cause = sys.exc_info()[1]  # paho calls this while it handles the connection's OSError
        held = self._connect_log.allow()
        if held is not None:
            log.warning("MQTT bridge cannot connect to the broker at %s:%d (%s); retrying every %g-%g s (MQTT "
                        "escalations are not served until it answers: check mqtt.host and mqtt.port)%s",
                        self.s.host, self.s.port,
                        f"{type(cause).__name__}: {cause}" if cause is not None else "no answer",
                        self.s.reconnect_min_s, self.s.reconnect_max_s,
                        f" ({held} more failures not logged)" if held else "")

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        if self.up is not None:
            self.up.set(0)
        self.connected.clear()
        if self._stopping:  # the session and its subscription end with the connection (clean start)
            self._close_to_new()
        verdict = self._sessions.closed(time.monotonic(), reason_code, flags.is_disconnect_packet_from_server)
        if verdict == TAKEN_OVER:
            self._taken_over("disconnected it: Session taken over", sure=True)
        elif reason_code == QOS_NOT_SUPPORTED:
            # an answer published just before a CONNACK announced Maximum QoS 0 (then it is dropped
            # at the next CONNACK, and the ERROR was logged there), or a broker that did not announce it
            held = self._qos_log.allow() if not self._qos_reported else None
            if held is not None:
                log.error("MQTT broker %s:%d disconnected the bridge: %s: it takes a lower QoS than the bridge's "
                          "answers (QoS %d), without announcing it; set max_qos 1, or remove it, in the broker's "
                          "configuration and restart the broker%s", self.s.host, self.s.port, reason_code,
                          BRIDGE_QOS, f" ({held} more not logged)" if held else "")
        elif verdict == SILENT_CLOSES:
            self._taken_over(self._sessions.silent_closes(), sure=False)
        elif reason_code != 0:
            held = self._disconnect_log.allow()
            if held is not None:
                log.warning("MQTT bridge disconnected from %s:%d (%s); reconnecting with backoff (the broker's "
                            "log says why)%s", self.s.host, self.s.port, reason_code,
                            f" ({held} more disconnects not logged)" if held else "")

    def _taken_over(self, what: str, sure: bool) -> None:
        """Another client connects with the bridge's client id (``sure``: the broker said so), or the
        broker closed connections in a way that may mean it: say so, a couple of times a minute."""
        held = self._takeover_log.allow()
        if held is not None:
            if sure:
                log.warning("MQTT broker %s:%d %s, client id %r: another client connected with the same client "
                            "id, most likely another gateway with the same mqtt.client_id; they take the session "
                            "from each other on every reconnect: give each gateway its own mqtt.client_id, or "
                            "leave it empty (unique per process)%s", self.s.host, self.s.port, what, self.client_id,
                            f" ({held} more takeovers not logged)" if held else "")
            else:
                log.warning("MQTT broker %s:%d %s; client id %r: if the broker was not restarting, look for "
                            "another gateway with the same mqtt.client_id and give each its own (or leave it "
                            "empty: unique per process)%s", self.s.host, self.s.port, what, self.client_id,
                            f" ({held} more not logged)" if held else "")

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        """The broker's PUBACK to an answer: count and log a refusal."""
        with self._lock:
            entry = self._unacked.pop(mid, None)
            if entry is None:  # _publish has not noted this mid yet: it settles it
                self._early[mid] = reason_code
                return
        self._acked(entry, reason_code)

    def _acked(self, topic: str, reason_code: Any) -> None:
        if not reason_code.is_failure:
            return
        self._count("response_refused")
        hint = ("check the broker's ACL: the gateway's MQTT user (mqtt.username) needs write access to "
                f"{self.s.topic_prefix}/+/response/#" if reason_code == NOT_AUTHORIZED
                else "the broker's log says why")
        held = self._response_log.allow()
        if held is not None:
            log.warning("broker refused publish to %s: %s; %s (the edge times out and replays)%s", topic,
                        reason_code, hint, f" ({held} more refusals not logged)" if held else "")

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        self.counter.labels(result=what).inc()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self._accept(msg)
        except Exception:  # never let one message kill the network thread
            log.exception("MQTT message on %s could not be handled", msg.topic)
            self._count("internal_error")

    def _accept(self, msg: mqtt.MQTTMessage) -> None:
        props = msg.properties
        cut = mqtt_properties.cut(props)  # read no further than MAX_PROPERTIES (edgewise.mqtt_properties)
        response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
        correlation = getattr(props, "CorrelationData", None) if props is not None else None
        if msg.retain:
            self._refuse("retained",
                         f"MQTT request on {msg.topic[:200]!r} is one the broker retained (published with the retain "
                         "flag), delivered again at each subscribe; dropped unanswered: publish requests without "
                         "retain, and clear it (an empty retained message on that topic)")
            return
        try:
            device = mqtt_topics.device_of_request(self.s.topic_prefix, msg.topic)
        except InvalidInputError as exc:
            self._refuse("bad_topic", f"MQTT request dropped: {exc}")
            return
        too_many = (f"MQTT request on {msg.topic[:200]!r} carries more than {mqtt_properties.MAX_PROPERTIES} "
                    "properties (an edge sends a few)")
        if not response_topic:
            self._refuse("too_many_properties" if cut else "no_response_topic",
                         f"{too_many}; dropped unanswered (no response topic among the first of them)" if cut else
                         f"MQTT request on {msg.topic[:200]!r} has no response topic; dropped (set the MQTT v5 "
                         "Response Topic property)")
            return
        if not mqtt_topics.response_topic_allowed(self.response_pattern, device, response_topic):
            self._refuse("foreign_response_topic",
                         f"MQTT request on {msg.topic[:200]!r} asks for its answer on {response_topic[:200]!r}, "
                         f"outside {self.response_pattern.replace('{device}', device)!r}; refused, nothing published")
            return
        limit = self.s.max_correlation_bytes
        if correlation is not None and len(correlation) > limit:
            # told why, with its Correlation Data (so the client can match the answer): published only
            # if the answer fits the broker's Maximum Packet Size, as every answer (_publish)
            self._refuse("correlation_too_large",
                         f"MQTT request on {msg.topic[:200]!r} carries {len(correlation)} bytes of Correlation "
                         f"Data, more than mqtt.max_correlation_bytes ({limit}); answered INVALID_ARGUMENT (the "
                         "edge sends 16 bytes; raise the setting if a client needs more)")
            self._invalid(response_topic, correlation,
                          f"MQTT request with {len(correlation)} bytes of Correlation Data, more than the gateway's "
                          f"mqtt.max_correlation_bytes ({limit}); send at most {limit} bytes (the edge sends 16)")
            return
        if cut:  # told why, on the response topic it gave among the properties read
            self._refuse("too_many_properties", f"{too_many}; answered INVALID_ARGUMENT")
            self._invalid(response_topic, correlation,
                          f"MQTT request with more than {mqtt_properties.MAX_PROPERTIES} properties: the gateway "
                          "reads no further; send the response topic, correlation data, token and a few more at most")
            return
        caller = Caller(_metadata(props, device), topic_device=device, peer=f"MQTT topic {msg.topic[:200]!r}")
        # authentication first, before the request is read or counted against its topic's device
        # (as gRPC screens a call's headers): a client that may publish on another device's topic
        # must not use up that device's mqtt.max_in_flight_per_device, nor the bridge's slots, with
        # requests that fail it (on paho's thread, as the overload's own counting: the metrics are
        # thread-safe, and the refusals' log throttle at worst lets one more line through)
        refused = self.handler.screen(None, "mqtt", caller)
        if refused is not None:
            self._count("error_answered")
            self._publish(response_topic, correlation, refused)
            return
        req = self.handler.read(bytes(msg.payload), "mqtt")
        if isinstance(req, Reply):
            self._count("malformed")
            self._publish(response_topic, correlation, req)
            return
        full = self._full(device)
        if full:
            # a caller the gateway refuses is told so (not to retry), and learns nothing of its load:
            # the rest of its authentication, the request's device_id against the topic's
            refused = self.handler.screen(req, "mqtt", caller)
            if refused is not None:
                self._count("error_answered")
                self._publish(response_topic, correlation, refused)
                return
            self._count("overloaded")
            # an answered request like any other: requests_total{transport=mqtt} and
            # rejected_total{reason=mqtt_overloaded} (docs/metrics.md)
            self.handler.metrics.rejected.labels(reason="mqtt_overloaded").inc()
            self.handler.metrics.answered("mqtt", status.name(status.RESOURCE_EXHAUSTED))
            self._publish(response_topic, correlation, error_reply(req, status.RESOURCE_EXHAUSTED,
                                                                   f"{full}; retry later"))
            return
        # the edge's deadline: the Message Expiry Interval it set (whole seconds, rounded up), less
        # what the broker held it (MQTT 5.0 section 3.3.2.3.3); else the gateway's default. Kept as
        # the moment it passes, as a gRPC call's deadline is: what the request then waits for the
        # gateway's event loop counts against it (_serve)
        expiry = getattr(props, "MessageExpiryInterval", None) if props is not None else None
        expires = time.monotonic() + expiry if isinstance(expiry, int) and expiry > 0 else None
        with self._lock:  # one step with stop()'s look at what is in flight: it waits for all it admits
            stopping = self._closed
            self._delivered_at = time.monotonic()
            if not stopping:
                fut = asyncio.run_coroutine_threadsafe(
                    self._serve(req, caller, response_topic, correlation, expires), self.loop)
                self._pending[fut] = device
                self._per_device[device] += 1
        if stopping:
            # delivered after stop() took its last look at what is in flight (past the grace, the
            # connection lost, or the broker quiet for DRAIN_QUIET_S after the UNSUBACK): served now,
            # its answer would come after the disconnect and be lost; told at once, the edge spools
            # it and replays
            self._count("error_answered")
            self.handler.metrics.answered("mqtt", status.name(status.UNAVAILABLE))
            self._publish(response_topic, correlation, error_reply(
                req, status.UNAVAILABLE, "gateway is shutting down; retry on another gateway or after its restart"))
            return
        fut.add_done_callback(self._done)

    def _full(self, device: str) -> str:
        """Why a request of ``device`` cannot be taken now ("" when it can): the bridge's slots are
        all taken, or that device's share of them (one device must not starve the others)."""
        with self._lock:
            if len(self._pending) >= self.s.max_in_flight:
                return f"gateway MQTT bridge has {self.s.max_in_flight} requests in flight"
            if self._per_device[device] >= self.s.max_in_flight_per_device:
                return (f"device {quote_id(device)} has {self.s.max_in_flight_per_device} requests in flight over MQTT "
                        "(mqtt.max_in_flight_per_device)")
        return ""

    def _invalid(self, topic: str, correlation: bytes | None, message: str) -> None:
        """Answer INVALID_ARGUMENT a request refused before it was read (its properties), counted
        in the gateway's metrics as such an answer of the request path is."""
        self.handler.metrics.rejected.labels(reason="invalid_argument").inc()
        self.handler.metrics.answered("mqtt", status.name(status.INVALID_ARGUMENT))
        self._publish(topic, correlation, error_reply(None, status.INVALID_ARGUMENT, message))

    def _refuse(self, what: str, message: str) -> None:
        """Count a request nothing can be answered to; log a few per interval (a flood of
        them must not flood the log)."""
        self._count(what)
        held = self._refusal_log.allow()
        if held is not None:
            log.warning("%s%s", message, f" ({held} more refusals not logged)" if held else "")

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            device = self._pending.pop(fut, None)
            if device is not None:
                self._per_device[device] -= 1
                if not self._per_device[device]:
                    del self._per_device[device]
        if not fut.cancelled() and fut.exception() is not None:
            log.error("MQTT request failed: %r", fut.exception())
            self._count("internal_error")

    # ---- event-loop side ------------------------------------------------------------------
    async def _serve(self, req: RequestHead, caller: Caller, response_topic: str,
                     correlation: bytes | None, expires: float | None = None) -> None:
        """Serve one request; ``expires``: the ``time.monotonic()`` its edge's deadline passes."""
        remaining = expires - time.monotonic() if expires is not None else None
        reply = await self.handler.handle(req, "mqtt", caller, remaining)
        self._count("answered" if status.is_ok(reply.status) else "error_answered")
        self._publish(response_topic, correlation, reply)

    def _publish(self, topic: str, correlation: bytes | None, reply: Reply) -> None:
        """Publish an answer, unless it is larger than the broker takes, or the broker takes QoS 0
        only; its PUBACK is read by ``_on_publish``."""
        if self.max_qos < BRIDGE_QOS:  # the broker would drop the connection: QoS not supported
            self._not_answered(topic)
            return
        props = Properties(PacketTypes.PUBLISH)
        if correlation is not None:
            props.CorrelationData = correlation
        props.ContentType = "application/x-protobuf; proto=edgewise.v1.DetectResponse"
        size = publish_packet_size(topic, reply.body, props)
        limit = self.max_packet_size
        if size > limit:  # the broker would drop the connection, and paho send it again on each reconnect
            self._count("answer_too_large")
            held = self._too_large_log.allow()
            if held is not None:
                whose = "the broker announced" if limit < PROTOCOL_MAX_PACKET else "of MQTT"
                log.warning("answer to %s not published: %d bytes (%d of payload), over the Maximum Packet Size "
                            "of %d bytes %s; the edge times out and replays (raise the broker's max_packet_size "
                            "if answers of this size are expected)%s", topic[:200], size, len(reply.body),
                            limit, whose, f" ({held} more not published)" if held else "")
            return
        info = self.client.publish(topic, reply.body, qos=BRIDGE_QOS, properties=props)
        if info.rc == mqtt.MQTT_ERR_NO_CONN:  # queued: paho sends it after the reconnect (not a failure)
            log.debug("answer to %s queued until the broker connection is back", topic[:200])
        elif info.rc != mqtt.MQTT_ERR_SUCCESS:
            self._count("publish_failed")
            log.warning("could not publish the answer to %s (rc %s); the edge will time out and replay",
                        topic, info.rc)
            return  # not queued: no PUBACK comes
        with self._lock:  # queued (NO_CONN: paho sends it after the reconnect): a PUBACK comes
            early = self._early.pop(info.mid, None)
            if early is None:
                self._unacked[info.mid] = topic
        if early is not None:
            self._acked(topic, early)


def _settle(fut: asyncio.Future[None]) -> None:
    """(the event loop) ``fut`` done, once."""
    if not fut.done():
        fut.set_result(None)


def _metadata(props: Any, topic_device: str) -> dict[str, str]:
    """The request's User Property ``authorization`` and its topic's device, as the gRPC
    metadata keys ``TokenAuth`` reads."""
    md = {"x-edgewise-device": topic_device}
    for key, value in getattr(props, "UserProperty", None) or ():
        if key.lower() == mqtt_topics.AUTHORIZATION_PROPERTY:
            md["authorization"] = value
    return md
