"""Reading MQTT v5 properties in linear time, and at most :data:`MAX_PROPERTIES` of them.

paho-mqtt reads a packet's properties (``Properties.unpack``) by cutting the bytes it has not
read yet off the buffer after every property, and adds each User Property to a list it copies:
the time grows with the square of their number. A request of 100,000 User Properties (1.2 MB,
far under the Maximum Packet Size the gateway's bridge announces for images) held the bridge's
network thread for 18 s before any token was checked, so no device was answered meanwhile, and
at a 5 s keepalive the broker dropped the bridge (found by a probe); the edge's connection
reads its answers the same way.

:func:`install` puts :func:`unpack` in paho's place (both ends import it through
``edgewise.mqtt_client``). It reads the same properties into the same attributes, with the same
checks (MQTT 5.0 sections 1.5 and 2.2.2: a length that reaches past the properties, a string
that is not UTF-8 or holds U+0000, a property that may not repeat, a Subscription Identifier of
0), in one pass over the bytes; each refusal is paho's ``MalformedPacket``, which
paho's loop answers by dropping the connection (paho raised ``MQTTException`` for some). Past
:data:`MAX_PROPERTIES` it stops reading and marks the properties as cut (:func:`cut`): the
packet is still read whole (its length says where the properties end), and the bridge drops
such a request, counted; an edgewise client sends a few.

A U+FEFF (ZERO WIDTH NO-BREAK SPACE) in a string is read as it is: MQTT 5.0 (1.5.4-3) says a
receiver must not skip or strip it, so a broker forwards it (Mosquitto does). paho refuses it as
malformed, and so did this reader: one request with a U+FEFF in any string property (its token,
its content type), which any client allowed to publish a request can send, dropped the gateway
bridge's connection, and every device's requests went unserved until it was back, at every such
request (found by a probe).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from paho.mqtt.properties import MalformedPacket, Properties

#: properties read of one packet; an edgewise request has at most 6 (response topic,
#: correlation data, expiry, content type, the token, the payload format)
MAX_PROPERTIES = 64
_CUT = "_edgewise_cut"


def _vbi(data: bytes, pos: int) -> Tuple[int, int]:
    """A Variable Byte Integer at ``pos``: (value, the position after it) (MQTT 5.0 section 1.5.5)."""
    value, shift = 0, 0
    for i in range(4):
        if pos + i >= len(data):
            raise MalformedPacket("Not enough data to decode Variable Byte Integer")
        digit = data[pos + i]
        value += (digit & 0x7F) << shift
        if not digit & 0x80:
            return value, pos + i + 1
        shift += 7
    raise MalformedPacket("Variable Byte Integer is more than four bytes long")


def _length_prefixed(data: bytes, pos: int, end: int) -> Tuple[bytes, int]:
    if end - pos < 2:
        raise MalformedPacket("Not enough data to read a length")
    n = int.from_bytes(data[pos:pos + 2], "big")
    if pos + 2 + n > end:
        raise MalformedPacket("Length delimited data too long")
    return data[pos + 2:pos + 2 + n], pos + 2 + n


def _text(data: bytes, pos: int, end: int) -> Tuple[str, int]:
    raw, pos = _length_prefixed(data, pos, end)
    try:
        text = raw.decode("utf-8")  # (refuses encoded surrogates, D800-DFFF: MQTT-1.5.4-1)
    except UnicodeDecodeError:
        raise MalformedPacket("Invalid UTF-8 string") from None
    if "\x00" in text:
        raise MalformedPacket("[MQTT-1.5.4-2] Null found in UTF-8 data")
    return text, pos  # (a U+FEFF is kept: MQTT-1.5.4-3, the module doc)


def _value(data: bytes, pos: int, end: int, kind: str) -> Tuple[Any, int]:
    if kind == "Byte":
        if pos + 1 > end:
            raise MalformedPacket("Not enough data to read a byte")
        return data[pos], pos + 1
    if kind in ("Two Byte Integer", "Four Byte Integer"):
        n = 2 if kind == "Two Byte Integer" else 4
        if pos + n > end:
            raise MalformedPacket(f"Not enough data to read a {kind}")
        return int.from_bytes(data[pos:pos + n], "big"), pos + n
    if kind == "Variable Byte Integer":
        return _vbi(data, pos)
    if kind == "Binary Data":
        return _length_prefixed(data, pos, end)
    if kind == "UTF-8 Encoded String":
        return _text(data, pos, end)
    if kind == "UTF-8 String Pair":
        key, pos = _text(data, pos, end)
        value, pos = _text(data, pos, end)
        return (key, value), pos
    raise MalformedPacket(f"unknown property type {kind!r}")


def unpack(self: Properties, buffer: Any) -> Tuple[Properties, int]:
    """``Properties.unpack`` in one pass (module doc): the properties at the start of ``buffer``,
    set as attributes of ``self``; returns ``(self, bytes they take)``."""
    self.clear()
    object.__setattr__(self, _CUT, False)
    data = bytes(buffer)
    length, pos = _vbi(data, 0)
    end = pos + length
    if end > len(data):
        raise MalformedPacket("Properties longer than the packet")
    repeated: Dict[str, List[Any]] = {}
    count = 0
    while pos < end:
        if count == MAX_PROPERTIES:
            object.__setattr__(self, _CUT, True)
            break
        count += 1
        identifier, pos = _vbi(data, pos)
        kind = self.types[self.properties[identifier][0]]  # (an unknown identifier: KeyError, as paho)
        value, pos = _value(data, pos, end, kind)
        name = self.getNameFromIdent(identifier).replace(" ", "")
        if self.allowsMultiple(name):
            repeated.setdefault(name, []).append(value)
        elif hasattr(self, name):
            raise MalformedPacket(f"Property '{name}' must not exist more than once")
        else:
            setattr(self, name, value)
    for name, values in repeated.items():
        if name == "SubscriptionIdentifier" and not all(1 <= v <= 268_435_455 for v in values):
            raise MalformedPacket("Subscription Identifier must be in the range 1-268435455")
        setattr(self, name, values)  # once (paho's setter copies the list on every addition; it checks
        # single values only, so the range check of the one repeated number is made above)
    return self, end


def cut(properties: Any) -> bool:
    """Whether :func:`unpack` stopped reading these properties at :data:`MAX_PROPERTIES`."""
    return bool(getattr(properties, _CUT, False))


#: paho's own reader, kept for comparison (tests/edgewise/test_mqtt_properties.py)
PAHO_UNPACK = Properties.__dict__["unpack"]


def install() -> None:
    """Read every MQTT v5 property of this process with :func:`unpack` (idempotent)."""
    Properties.unpack = unpack  # type: ignore[method-assign]
