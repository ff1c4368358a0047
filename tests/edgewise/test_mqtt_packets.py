"""MQTT v5 PUBLISH packet sizes (``edgewise.mqtt_packets``) against the bytes paho sends, and the
broker's Maximum Packet Size read from CONNACK properties."""

from __future__ import annotations

from typing import Any, List

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edgewise.mqtt_packets import (
    PROTOCOL_MAX_PACKET,
    broker_max_packet_size,
    broker_max_qos,
    publish_packet_size,
)


def _paho_packet(topic: str, payload: bytes, props: Any, qos: int) -> bytes:
    """The PUBLISH packet paho builds for this message (its send queue, captured)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    sent: List[bytes] = []

    def capture(command: int, packet: Any, mid: int, qos: int, info: Any = None) -> Any:
        sent.append(bytes(packet))
        return mqtt.MQTT_ERR_SUCCESS

    client._packet_queue = capture  # type: ignore[method-assign]
    client._sock = object()  # type: ignore[assignment]  # "connected": paho builds the packet
    try:
        client._send_publish(1, topic.encode(), payload, qos, properties=props)
    finally:
        client._sock = None
    (packet,) = sent
    return packet


@pytest.mark.parametrize("payload_len", [0, 1, 100, 16_000, 16_400, 2_100_000])
@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("with_props", [False, True])
def test_size_is_what_paho_sends(payload_len: int, qos: int, with_props: bool) -> None:
    """Every length-field width (1 to 4 bytes), with and without properties and packet id."""
    topic = "edgewise/cam-1/response/ü"
    props = None
    if with_props:
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = b"c" * 200
        props.ContentType = "application/x-protobuf; proto=edgewise.v1.DetectResponse"
    payload = b"x" * payload_len
    assert publish_packet_size(topic, payload, props, qos=qos) == len(_paho_packet(topic, payload, props, qos))


def test_broker_max_packet_size() -> None:
    props = Properties(PacketTypes.CONNACK)
    assert broker_max_packet_size(props) == PROTOCOL_MAX_PACKET  # none announced
    assert broker_max_packet_size(None) == PROTOCOL_MAX_PACKET
    props.MaximumPacketSize = 65536
    assert broker_max_packet_size(props) == 65536


def test_broker_max_qos() -> None:
    """MQTT 5.0 section 3.2.2.3.4: no Maximum QoS in CONNACK means every QoS; 0 and 1 are announced."""
    props = Properties(PacketTypes.CONNACK)
    assert broker_max_qos(props) == 2
    assert broker_max_qos(None) == 2
    props.MaximumQoS = 0
    assert broker_max_qos(props) == 0
