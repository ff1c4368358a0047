"""paho-mqtt's client as both MQTT ends of edgewise need it: the edge's connection
(``edge.transports.mqtt``) and the gateway's bridge (``cloud.gateway.mqtt_bridge``).

Two things paho does not do, each of which would otherwise keep a connection down for good,
because paho sends an unacknowledged QoS 1 message again after every reconnect:

* Mosquitto answers a message over its ``message_size_limit`` with a PUBACK "Packet too
  large" (0x95), a reason code MQTT 5.0 lists for CONNACK and DISCONNECT only. paho calls
  that a malformed packet and drops the connection; ``Client`` hands it to ``on_publish``
  as the refusal it is (paho then forgets the message).
* A broker that takes QoS 0 only (its CONNACK's *Maximum QoS*, Mosquitto ``max_qos 0``)
  drops a client that publishes at QoS 1. ``Client.drop_queued_over`` forgets what paho
  holds above the broker's QoS, from ``on_connect``, before paho sends it again.
"""

from __future__ import annotations

import struct
from typing import Any, Dict

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode


class OffTableReason(ReasonCode):
    """A PUBACK reason code paho's table does not name for PUBACK (Mosquitto's 0x95 Packet
    too large); named as MQTT names it for the other packets."""

    def __init__(self, value: int) -> None:
        super().__init__(PacketTypes.PUBACK)
        self.value = value

    def getName(self) -> str:
        return next(iter(self.names.get(self.value, ())), f"reason code {self.value}")


def _named_for_puback(code: int) -> bool:
    try:
        ReasonCode(PacketTypes.PUBACK, identifier=code)
    except (KeyError, ValueError):
        return False
    return True


class Client(mqtt.Client):
    """paho's client, with the two additions the module docstring gives."""

    def _handle_pubackcomp(self, cmd: Any) -> Any:
        packet = self._in_packet["packet"]
        if (cmd == "PUBACK" and self._protocol == mqtt.MQTTv5 and len(packet) >= 3
                and packet[2] >= 0x80 and not _named_for_puback(packet[2])):
            mid = struct.unpack("!H", bytes(packet[:2]))[0]
            with self._out_message_mutex:
                if mid in self._out_messages:
                    return self._do_on_publish(mid, OffTableReason(packet[2]), Properties(PacketTypes.PUBACK))
            return mqtt.MQTT_ERR_SUCCESS
        return super()._handle_pubackcomp(cmd)

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
