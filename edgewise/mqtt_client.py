"""paho-mqtt's client as both MQTT ends of edgewise need it: the edge's connection
(``edge.transports.mqtt``) and the gateway's bridge (``cloud.gateway.mqtt_bridge``).

Things paho does not do, each of which would otherwise keep a connection down for good
(paho sends an unacknowledged message again after every reconnect) or deliver a message twice:

* Mosquitto answers a message over its ``message_size_limit`` with a PUBACK (or PUBREC)
  "Packet too large" (0x95), a reason code MQTT 5.0 lists for CONNACK and DISCONNECT only.
  paho calls that a malformed packet and drops the connection; ``Client`` hands it to
  ``on_publish`` as the refusal it is (paho then forgets the message).
* A PUBREC with a failure reason code ends a QoS 2 exchange (MQTT 5.0, 4.3.3): paho ignores
  the code and sends PUBREL anyway. ``Client`` hands the refusal to ``on_publish``.
* A broker that takes QoS 0 only (its CONNACK's *Maximum QoS*, Mosquitto ``max_qos 0``)
  drops a client that publishes at QoS 1. ``Client.drop_queued_over`` forgets what paho
  holds above the broker's QoS, from ``on_connect``, before paho sends it again.
* QoS 2 exactly once across a restart of the process (MQTT 5.0, 4.3.3 and 4.4): the
  publisher keeps each message's packet identifier on disk before the broker can see it
  (``reserve_mid``, ``publish_as``) and whether the broker's PUBREC came (``on_pubrec``, called
  before paho sends the PUBREL); the next process, in the same session (same client id,
  clean start off), sends those messages again with the same identifiers (``resume``): the
  PUBLISH of one the broker holds unreleased, the PUBREL of one it already received. The
  broker delivers each once. Where the broker did not keep the session (its CONNACK says
  so), ``reset_out`` starts those exchanges over with a PUBLISH: at least once, never lost.
* paho's reconnect reset (``_messages_reconnect_reset_out``) turns a PUBREL still owed from
  the last connection into a new PUBLISH when a connection attempt fails in between (a
  second delivery), and marks every held message for sending at once, past the in-flight
  bound and the broker's *Receive Maximum* (refused "Quota exceeded"). ``reset_out`` keeps
  owed PUBRELs, puts them first, and queues what is over the bound.
"""

from __future__ import annotations

import struct
import threading
from typing import Any, Callable, Dict, List, Optional, Set

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

#: packet identifiers MQTT has (1..65535)
MAX_MID = 65535
#: QoS 1 and 2 messages in flight at once: paho's default, and Mosquitto's default Receive Maximum
MAX_INFLIGHT = 20
_OWES_PUBREL = (mqtt.mqtt_ms_wait_for_pubcomp, mqtt.mqtt_ms_resend_pubrel)
_SENT = (mqtt.mqtt_ms_wait_for_puback, mqtt.mqtt_ms_wait_for_pubrec)


class OffTableReason(ReasonCode):
    """A PUBACK or PUBREC reason code paho's table does not name for that packet (Mosquitto's
    0x95 Packet too large); named as MQTT names it for the other packets."""

    def __init__(self, value: int, packet_type: int = PacketTypes.PUBACK) -> None:
        super().__init__(packet_type)
        self.value = value

    def getName(self) -> str:
        return next(iter(self.names.get(self.value, ())), f"reason code {self.value}")


def _reason(packet_type: int, code: int) -> ReasonCode:
    try:
        return ReasonCode(packet_type, identifier=code)
    except (KeyError, ValueError):
        return OffTableReason(code, packet_type)


class Client(mqtt.Client):
    """paho's client, with the additions the module docstring gives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: called (paho's thread) with the mid of a QoS 2 message the broker received (its PUBREC
        #: succeeded), before the PUBREL goes out: where the publisher notes that on disk
        self.on_pubrec: Optional[Callable[[int], None]] = None
        self._reserved: Set[int] = set()  # mids handed out by reserve_mid, not yet in _out_messages
        self._forced = threading.local()  # publish_as: the mid this thread's next publish takes

    def _mid_generate(self) -> int:
        forced = getattr(self._forced, "mid", None)
        if forced is not None:
            self._forced.mid = None
            return int(forced)
        with self._mid_generate_mutex:
            return self._free_mid()

    def _free_mid(self) -> int:
        """(under ``_mid_generate_mutex``) The next mid neither paho nor a reservation holds: a
        message resumed from the last process keeps its own."""
        for _ in range(MAX_MID):
            self._last_mid = self._last_mid % MAX_MID + 1
            if self._last_mid not in self._out_messages and self._last_mid not in self._reserved:
                break
        return self._last_mid

    def reserve_mid(self) -> int:
        """A packet identifier for ``publish_as``, kept from every other publish meanwhile."""
        with self._mid_generate_mutex:
            mid = self._free_mid()
            self._reserved.add(mid)
            return mid

    def release_mid(self, mid: int) -> None:
        with self._mid_generate_mutex:
            self._reserved.discard(mid)

    def publish_as(self, mid: int, topic: str, payload: bytes, qos: int,
                   properties: Optional[Properties] = None) -> mqtt.MQTTMessageInfo:
        """``publish`` with the packet identifier ``mid`` (from ``reserve_mid``)."""
        self._forced.mid = mid
        try:
            return self.publish(topic, payload, qos=qos, properties=properties)
        finally:
            self._forced.mid = None
            self.release_mid(mid)

    def resume(self, mid: int, topic: str, payload: bytes, received: bool,
               properties: Optional[Properties] = None) -> mqtt.MQTTMessageInfo:
        """Take over a QoS 2 message the last process sent with ``mid`` and did not see completed:
        paho sends its PUBREL (``received``: the broker's PUBREC had come) or its PUBLISH again
        (DUP set) at the next connection, which must continue the session (clean start off).
        Call it before the first connection: the messages go out in the order resumed."""
        if self._sock is not None:
            raise RuntimeError("resume() is for messages of the last process, before the first connection")
        m = mqtt.MQTTMessage(mid, topic.encode("utf-8"))
        m.payload, m.qos, m.retain, m.dup, m.properties = payload, 2, False, True, properties
        m.state = mqtt.mqtt_ms_wait_for_pubcomp if received else mqtt.mqtt_ms_wait_for_pubrec
        with self._out_message_mutex:
            if mid in self._out_messages:
                raise ValueError(f"MQTT packet identifier {mid} is resumed twice")
            self._out_messages[mid] = m
        return m.info

    def _handle_pubackcomp(self, cmd: Any) -> Any:
        packet = self._in_packet["packet"]
        if (cmd == "PUBACK" and self._protocol == mqtt.MQTTv5 and len(packet) >= 3 and packet[2] >= 0x80
                and isinstance(_reason(PacketTypes.PUBACK, packet[2]), OffTableReason)):
            return self._refused(packet, PacketTypes.PUBACK)
        return super()._handle_pubackcomp(cmd)

    def _handle_pubrec(self) -> Any:
        packet = self._in_packet["packet"]
        if self._protocol == mqtt.MQTTv5 and len(packet) >= 3 and packet[2] >= 0x80:
            return self._refused(packet, PacketTypes.PUBREC)
        hook = self.on_pubrec
        if hook is not None and len(packet) >= 2:
            mid = struct.unpack("!H", bytes(packet[:2]))[0]
            with self._out_message_mutex:
                ours = mid in self._out_messages and self._out_messages[mid].qos == 2
            if ours:
                try:
                    hook(mid)
                except Exception:  # not noted: no PUBREL; the reconnect sends the PUBLISH again
                    return mqtt.MQTTErrorCode.MQTT_ERR_UNKNOWN
        return super()._handle_pubrec()

    def _messages_reconnect_reset_out(self) -> None:
        self.reset_out(session_kept=not self._check_clean_session())

    def reset_out(self, session_kept: bool, receive_maximum: Optional[int] = None) -> List[int]:
        """Before (re)sending what paho holds on a new connection: a QoS 2 message whose PUBREC
        came gets its PUBREL (first, whatever the bound) where the broker kept the session, and
        starts over with a PUBLISH where it did not (those mids are returned); the others are
        sent (DUP set once sent before) up to ``_max_inflight_messages``, the rest queued. Paho
        calls it before connecting; call it again from ``on_connect`` with the CONNACK's
        Session Present and Receive Maximum (the bound becomes at most that)."""
        restarted: List[int] = []
        with self._out_message_mutex:
            if receive_maximum is not None:  # paho's setter refuses on an open connection
                self._max_inflight_messages = max(1, min(MAX_INFLIGHT, int(receive_maximum)))
            owed = [mid for mid, m in self._out_messages.items() if m.qos == 2 and m.state in _OWES_PUBREL]
            if session_kept:
                for mid in reversed(owed):  # paho's CONNACK sends in order and stops at the first queued
                    self._out_messages.move_to_end(mid, last=False)
            bound = self._max_inflight_messages or MAX_MID
            self._inflight_messages = 0
            slots = 0
            for m in self._out_messages.values():
                m.timestamp = 0
                if m.qos == 0:
                    m.state = mqtt.mqtt_ms_publish
                    continue
                if m.qos == 2 and m.state in _OWES_PUBREL:
                    if session_kept:
                        m.state = mqtt.mqtt_ms_resend_pubrel
                        slots += 1
                        continue
                    restarted.append(m.mid)
                    m.dup = False  # a new message in the new session
                elif m.state in _SENT:
                    m.dup = True
                if slots < bound:
                    m.state = mqtt.mqtt_ms_publish
                    slots += 1
                else:
                    m.state = mqtt.mqtt_ms_queued
        return restarted

    def _refused(self, packet: Any, packet_type: int) -> Any:
        """The broker refused the message (a PUBACK or PUBREC reason code >= 0x80): the
        exchange ends there, ``on_publish`` gets the reason."""
        mid = struct.unpack("!H", bytes(packet[:2]))[0]
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, _reason(packet_type, packet[2]), Properties(packet_type))
        return mqtt.MQTT_ERR_SUCCESS

    def drop_queued_over(self, max_qos: int) -> Dict[int, str]:
        """Forget the messages paho holds to send (again) at a QoS over ``max_qos``: called from
        ``on_connect``, before paho sends them again; their mids and topics."""
        dropped: Dict[int, str] = {}
        with self._out_message_mutex:
            for mid, m in list(self._out_messages.items()):
                if m.qos > max_qos:
                    del self._out_messages[mid]
                    dropped[mid] = m.topic
        return dropped
