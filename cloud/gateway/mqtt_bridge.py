"""MQTT v5 bridge of the gateway: escalations over MQTT through the same balancer path.

Subscribes ``$share/<group>/<prefix>/+/escalate`` at QoS 1, so gateway replicas
in the same group split the messages (MQTT v5 shared subscription). Each
payload is a serialized ``DetectRequest``; it goes through ``Gateway.handle``
(validation, rate limit, balancer, retries) exactly as a gRPC call does, and
the serialized ``DetectResponse`` is published at QoS 1 to the request's MQTT v5
Response Topic with its Correlation Data. Malformed payloads, a device in the
topic that differs from the payload's ``device_id``, and overload are answered
with an error response when a response topic exists, counted, and never crash
the bridge. paho-mqtt 2.x (CallbackAPIVersion.VERSION2) runs its network loop
in a thread and reconnects with backoff; work is handed to the gateway's event
loop with ``run_coroutine_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as mqtt
from google.protobuf.message import DecodeError
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from cloud.gateway.pool import error_response
from cloud.gateway.settings import MqttSettings
from edgewise.v1 import detect_pb2

if TYPE_CHECKING:
    from cloud.gateway.server import Gateway

log = logging.getLogger("edgewise.gateway.mqtt")


class MqttBridge:
    """One MQTT v5 client feeding the gateway's request path."""

    def __init__(self, settings: MqttSettings, gateway: Gateway,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.s = settings
        self.gateway = gateway
        self.loop = loop or asyncio.get_running_loop()
        self.topic_filter = f"{settings.topic_prefix}/+/escalate"
        self.subscription = f"$share/{settings.group}/{self.topic_filter}"
        client_id = settings.client_id or f"gateway-{socket.gethostname()}-{os.getpid()}-{id(self) % 10000}"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5)
        if settings.username:
            self.client.username_pw_set(settings.username, settings.password or None)
        if settings.tls:
            self.client.tls_set(ca_certs=settings.ca_file or None, certfile=settings.cert_file or None,
                                keyfile=settings.key_file or None)
        self.client.reconnect_delay_set(max(1, int(settings.reconnect_min_s)), max(1, int(settings.reconnect_max_s)))
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self._pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self.connected = threading.Event()
        self.counts: dict[str, int] = {}

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Connect in the background (retrying with backoff until the broker answers)."""
        self.client.connect_async(self.s.host, self.s.port, keepalive=self.s.keepalive_s,
                                  clean_start=True)
        self.client.loop_start()

    async def stop(self, grace: float = 5.0) -> None:
        """Finish in-flight requests (up to ``grace``), then disconnect."""
        self.client.unsubscribe(self.subscription)
        with self._lock:
            pending = [asyncio.wrap_future(f) for f in self._pending]
        if pending:
            await asyncio.wait(pending, timeout=grace)
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)

    # ---- paho callbacks (network thread) ---------------------------------------------------
    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        if reason_code.is_failure:
            log.error("MQTT broker %s:%d refused the connection: %s", self.s.host, self.s.port, reason_code)
            return
        client.subscribe(self.subscription, options=SubscribeOptions(qos=1))
        self.connected.set()
        log.info("MQTT bridge connected to %s:%d, subscribed %s", self.s.host, self.s.port, self.subscription)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        self.connected.clear()
        if reason_code != 0:
            log.warning("MQTT bridge disconnected (%s); reconnecting with backoff", reason_code)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        self.gateway.metrics.mqtt.labels(result=what).inc()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self._accept(msg)
        except Exception:  # never let one message kill the network thread
            log.exception("MQTT message on %s could not be handled", msg.topic)
            self._count("internal_error")

    def _accept(self, msg: mqtt.MQTTMessage) -> None:
        props = msg.properties
        response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
        correlation = getattr(props, "CorrelationData", None) if props is not None else None
        if not response_topic:
            self._count("no_response_topic")
            log.warning("MQTT request on %s has no response topic; dropped (set the MQTT v5 "
                        "Response Topic property)", msg.topic)
            return
        try:
            req = detect_pb2.DetectRequest.FromString(bytes(msg.payload))
        except DecodeError as exc:
            self._count("malformed")
            self._publish(response_topic, correlation,
                          error_response(None, "INVALID_ARGUMENT",
                                         f"payload on {msg.topic} is not a serialized DetectRequest: {exc}"))
            return
        parts = msg.topic.split("/")
        topic_device = parts[-2] if len(parts) >= 3 else ""
        if req.device_id and topic_device != req.device_id:
            self._count("device_mismatch")
            self._publish(response_topic, correlation, error_response(
                req, "UNAUTHENTICATED",
                f"device_id {req.device_id!r} does not match topic device {topic_device!r}"))
            return
        with self._lock:
            busy = len(self._pending) >= self.s.max_in_flight
        if busy:
            self._count("overloaded")
            self._publish(response_topic, correlation, error_response(
                req, "RESOURCE_EXHAUSTED",
                f"gateway MQTT bridge has {self.s.max_in_flight} requests in flight; retry later"))
            return
        fut = asyncio.run_coroutine_threadsafe(self._serve(req, response_topic, correlation), self.loop)
        with self._lock:
            self._pending.add(fut)
        fut.add_done_callback(self._done)

    def _done(self, fut: Future[None]) -> None:
        with self._lock:
            self._pending.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            log.error("MQTT request failed: %r", fut.exception())
            self._count("internal_error")

    # ---- event-loop side ------------------------------------------------------------------
    async def _serve(self, req: detect_pb2.DetectRequest, response_topic: str, correlation: bytes | None) -> None:
        timeout = self.gateway.timeout_for(req, None)
        resp = await self.gateway.handle(req, timeout, "mqtt")
        self._count("answered" if resp.status == detect_pb2.OK else "error_answered")
        self._publish(response_topic, correlation, resp)

    def _publish(self, topic: str, correlation: bytes | None, resp: detect_pb2.DetectResponse) -> None:
        props = Properties(PacketTypes.PUBLISH)
        if correlation is not None:
            props.CorrelationData = correlation
        props.ContentType = "application/x-protobuf; proto=edgewise.v1.DetectResponse"
        info = self.client.publish(topic, resp.SerializeToString(), qos=1, properties=props)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self._count("publish_failed")
            log.warning("could not publish the answer to %s (rc %s); the edge will time out and replay",
                        topic, info.rc)
