"""MQTT v5 escalation transport (paho-mqtt 2.x, ``CallbackAPIVersion.VERSION2``).

Request/response per MQTT v5: the serialized ``DetectRequest`` is published QoS 1
to ``<prefix>/<device>/escalate`` with a *Response Topic*
``<prefix>/<device>/response/<client>``, *Correlation Data* and the device's token
as the User Property ``authorization: Bearer <token>`` (topics and property name:
``edgewise.mqtt_topics``); the cloud bridge answers there with the
``DetectResponse`` bytes and the same correlation data.
TLS, username/password or client certificates; paho's loop thread reconnects
with exponential backoff (``reconnect_delay_set``). ``MqttConnection`` is shared
with the MQTT sink. Callers: ``edge.escalating``, ``edge.daemon``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge.transports import TransportError, check_response
from edgewise import mqtt_topics, status

log = logging.getLogger(__name__)


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
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id or f"edgewise-edge-{uuid.uuid4().hex[:8]}"
        self.keepalive_s = keepalive_s
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
        )
        if username:
            self.client.username_pw_set(username, password or None)
        if tls:
            self.client.tls_set(ca_certs=tls_ca or None, certfile=tls_cert or None, keyfile=tls_key or None)
        self.client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.publish_listeners: List[Callable[[int], None]] = []  # called with the mid of each PUBACK
        self.connected = threading.Event()
        self.subscriptions: Dict[str, Any] = {}  # topic -> handler(msg), resubscribed on reconnect
        self.lock = threading.Lock()
        self.stopping = False

    def start(self) -> None:
        # connect_async + loop_start: the first connection and every reconnect
        # happen in paho's thread, so a broker that is down never blocks us.
        self.client.connect_async(self.host, self.port, keepalive=self.keepalive_s)
        self.client.loop_start()

    def stop(self) -> None:
        self.stopping = True
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()

    def subscribe(self, topic: str, handler: Any) -> None:
        with self.lock:
            self.subscriptions[topic] = handler
        if self.connected.is_set():
            self.client.subscribe(topic, qos=1)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        if reason_code.is_failure:
            log.warning("MQTT %s:%d refused the connection: %s", self.host, self.port, reason_code)
            return
        log.info("MQTT connected to %s:%d as %s", self.host, self.port, self.client_id)
        with self.lock:
            topics = list(self.subscriptions)
        for t in topics:
            client.subscribe(t, qos=1)
        self.connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        if self.connected.is_set() and not self.stopping:
            log.warning("MQTT disconnected from %s:%d (%s); reconnecting with backoff", self.host, self.port, reason_code)
        self.connected.clear()

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        for fn in list(self.publish_listeners):
            try:
                fn(mid)
            except Exception:
                log.exception("MQTT publish listener failed")

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


class MqttTransport:
    """Escalates over MQTT v5 request/response."""

    name = "mqtt"

    def __init__(self, conn: MqttConnection, device_id: str, topic_prefix: str = "edgewise",
                 token: str = "") -> None:
        self.conn = conn
        self.request_topic = mqtt_topics.escalate_topic(topic_prefix, device_id)
        self.response_topic = mqtt_topics.response_topic(
            topic_prefix, device_id, mqtt_topics.check_segment(conn.client_id, "MQTT client id"))
        self.token = token
        self.pending: Dict[bytes, asyncio.Future[bytes]] = {}
        self.loop: Optional[asyncio.AbstractEventLoop] = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.conn.subscribe(self.response_topic, self._on_response)

    def _on_response(self, msg: Any) -> None:
        props = getattr(msg, "properties", None)
        corr = getattr(props, "CorrelationData", None) if props is not None else None
        if corr is None:
            log.warning("MQTT response on %s without correlation data ignored", msg.topic)
            return
        fut = self.pending.get(bytes(corr))
        if fut is None or self.loop is None:
            return  # late answer after our deadline: dropped (the frame was spooled or kept edge-only)
        payload = bytes(msg.payload)
        self.loop.call_soon_threadsafe(_resolve, fut, payload)

    async def detect(self, request: Any, timeout_s: float) -> Any:
        from edgewise.v1 import detect_pb2

        if self.loop is None:
            await self.start()
        if not self.conn.connected.is_set():
            raise TransportError(status.UNAVAILABLE, f"MQTT broker {self.conn.host}:{self.conn.port} not connected")
        corr = uuid.uuid4().bytes
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.response_topic
        props.CorrelationData = corr
        props.MessageExpiryInterval = max(1, int(timeout_s + 0.999))
        if self.token:  # checked by the gateway exactly as the gRPC metadata of the same name
            props.UserProperty = [(mqtt_topics.AUTHORIZATION_PROPERTY, f"Bearer {self.token}")]
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.pending[corr] = fut
        try:
            info = self.conn.client.publish(self.request_topic, request.SerializeToString(), qos=1, properties=props)
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                raise TransportError(status.UNAVAILABLE, f"MQTT publish failed: {mqtt.error_string(info.rc)}")
            try:
                payload = await asyncio.wait_for(fut, timeout=timeout_s)
            except asyncio.TimeoutError:
                if not self.conn.connected.is_set():
                    raise TransportError(status.UNAVAILABLE, "MQTT broker connection lost") from None
                raise TransportError(status.DEADLINE_EXCEEDED, f"no MQTT response within {timeout_s:.2f} s") from None
        finally:
            self.pending.pop(corr, None)
        resp = detect_pb2.DetectResponse()
        try:
            resp.ParseFromString(payload)
        except Exception:
            raise TransportError(status.INTERNAL, "MQTT response is not a DetectResponse") from None
        return check_response(resp)

    async def close(self) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(TransportError(status.UNAVAILABLE, "transport closed"))
        self.pending.clear()
