"""Sizes of MQTT v5 packets, as the broker's *Maximum Packet Size* limits them.

A broker announces its Maximum Packet Size in CONNACK (Mosquitto: ``max_packet_size``) and
drops the connection of a client that sends a larger packet; paho keeps an unacknowledged
QoS 1 message and sends it again after every reconnect, so one oversize message would keep
the connection down for good. Both sides therefore compute a message's packet size before
they publish it and keep one that would not fit: the edge (``edge.transports.mqtt``) and the
gateway's MQTT bridge (``cloud.gateway.mqtt_bridge``).
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

#: The largest MQTT packet when the broker announces no Maximum Packet Size: a Remaining
#: Length of at most 268,435,455 bytes (MQTT 5.0 section 1.5.5) after a 5-byte fixed header.
PROTOCOL_MAX_PACKET = 268_435_455 + 5


class PackedProperties(Protocol):
    """What the size needs of a message's properties (paho's ``Properties``): their bytes."""

    def pack(self) -> Any: ...


def publish_packet_size(topic: str, payload: bytes, properties: Optional[PackedProperties] = None,
                        qos: int = 1) -> int:
    """Bytes of the MQTT v5 PUBLISH packet paho sends for this message (what the broker's
    Maximum Packet Size limits): fixed header, topic, packet id, properties, payload."""
    packed = properties.pack() if properties is not None else b"\x00"
    remaining = 2 + len(topic.encode("utf-8")) + (2 if qos > 0 else 0) + len(packed) + len(payload)
    length_bytes = 1 if remaining < 128 else 2 if remaining < 16_384 else 3 if remaining < 2_097_152 else 4
    return 1 + length_bytes + remaining


def broker_max_packet_size(connack_properties: Any) -> int:
    """The Maximum Packet Size a broker announced in its CONNACK properties (paho's
    ``Properties``, or None); MQTT's own bound when it announced none."""
    limit = getattr(connack_properties, "MaximumPacketSize", None) if connack_properties is not None else None
    return int(limit) if limit else PROTOCOL_MAX_PACKET


def broker_max_qos(connack_properties: Any) -> int:
    """The Maximum QoS a broker announced in its CONNACK properties (paho's ``Properties``, or
    None); 2 when it announced none (MQTT 5.0 section 3.2.2.3.4: the broker takes every QoS)."""
    max_qos = getattr(connack_properties, "MaximumQoS", None) if connack_properties is not None else None
    return int(max_qos) if max_qos is not None else 2


def broker_receive_maximum(connack_properties: Any) -> int:
    """The Receive Maximum a broker announced in its CONNACK properties (paho's ``Properties``,
    or None): how many QoS 1 and 2 messages it takes in flight from a client at once; 65535
    when it announced none (MQTT 5.0 section 3.2.2.3.3)."""
    value = getattr(connack_properties, "ReceiveMaximum", None) if connack_properties is not None else None
    return max(1, int(value)) if value is not None else 65535
