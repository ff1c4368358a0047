"""The one-pass MQTT v5 property reader (``edgewise.mqtt_properties``) reads what paho's own reads,
refuses what it refuses, in time linear in the properties, and stops at MAX_PROPERTIES."""

from __future__ import annotations

import random
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import MalformedPacket, Properties

from edgewise import mqtt_client  # noqa: F401 (installs the reader, as both MQTT ends do)
from edgewise.mqtt_properties import MAX_PROPERTIES, PAHO_UNPACK, cut, unpack


def _bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))  # (Random.randbytes: Python 3.9)


def _publish_props(rng: random.Random, users: int) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    p.ResponseTopic = f"edgewise/cam-{rng.randrange(100)}/response/ü{rng.random()}"
    p.CorrelationData = _bytes(rng, rng.randrange(0, 40))
    p.MessageExpiryInterval = rng.randrange(1, 1 << 31)
    p.PayloadFormatIndicator = rng.randrange(2)
    p.ContentType = "application/x-protobuf; proto=edgewise.v1.DetectRequest"
    if users:
        p.UserProperty = [(f"k{i}", f"v{rng.random()}") for i in range(users)]
    return p


def _attrs(p: Properties) -> dict:
    return {k: v for k, v in vars(p).items() if k[:1].isupper()}


@pytest.mark.parametrize("seed", range(20))
def test_reads_what_paho_reads(seed: int) -> None:
    rng = random.Random(seed)
    packed = _publish_props(rng, rng.randrange(0, 20)).pack() + _bytes(rng, rng.randrange(0, 30))  # + payload
    ours, theirs = Properties(PacketTypes.PUBLISH), Properties(PacketTypes.PUBLISH)
    _, n = unpack(ours, packed)
    _, m = PAHO_UNPACK(theirs, packed)
    assert (n, _attrs(ours)) == (m, _attrs(theirs)) and not cut(ours)
    connack = Properties(PacketTypes.CONNACK)
    connack.MaximumPacketSize, connack.ReceiveMaximum, connack.MaximumQoS = 17825792, 100, 1
    ours, theirs = Properties(PacketTypes.CONNACK), Properties(PacketTypes.CONNACK)
    assert unpack(ours, connack.pack())[1] == PAHO_UNPACK(theirs, connack.pack())[1]
    assert _attrs(ours) == _attrs(theirs)


@pytest.mark.parametrize("bad", [
    b"\x05\x08\x00\x09ab",  # a response topic longer than the properties
    b"\x06\x08\x00\x03a\x00b",  # a NUL in a string
    b"\x06\x08\x00\x03\xed\xa0\x80",  # an encoded surrogate (D800)
    b"\x04\x01\x01\x01\x00",  # Payload Format Indicator twice
    b"\xff\xff\xff\xff\x7f",  # a five-byte length
    b"\x02\x0b\x00",  # a Subscription Identifier of 0
])
def test_refuses_what_paho_refuses(bad: bytes) -> None:
    with pytest.raises(MalformedPacket):
        unpack(Properties(PacketTypes.PUBLISH), bad)
    with pytest.raises(Exception):  # (paho: MalformedPacket or its MQTTException)
        PAHO_UNPACK(Properties(PacketTypes.PUBLISH), bad)


def test_a_zero_width_no_break_space_is_read_as_it_is() -> None:
    """MQTT 5.0 1.5.4-3: U+FEFF must not be skipped or stripped, so a broker forwards it; paho
    refuses it, which dropped the gateway bridge's connection at every request carrying one."""
    props = Properties(PacketTypes.PUBLISH)
    _, n = unpack(props, b"\x0d\x08\x00\x03\xef\xbb\xbf\x26\x00\x01k\x00\x01v")
    assert n == 14 and props.ResponseTopic == "\ufeff" and props.UserProperty == [("k", "v")]
    with pytest.raises(Exception):
        PAHO_UNPACK(Properties(PacketTypes.PUBLISH), b"\x06\x08\x00\x03\xef\xbb\xbf")


def test_a_flood_of_user_properties_is_read_in_one_pass_and_cut() -> None:
    """100,000 User Properties (1.2 MB) held paho's reader, and the gateway's bridge with it,
    for 18 s (found by a probe). Read in one pass, at most MAX_PROPERTIES of them: the packet's
    length is still all of it, and the properties say they were cut."""
    from paho.mqtt.properties import VariableByteIntegers

    def text(t: str) -> bytes:
        return len(t).to_bytes(2, "big") + t.encode()

    head = _publish_props(random.Random(0), 0).pack()
    _, vbi = VariableByteIntegers.decode(head)
    body = head[vbi:] + b"".join(b"\x26" + text(f"k{i}") + text("v") for i in range(100_000))  # (paho packs slowly)
    packed = VariableByteIntegers.encode(len(body)) + body
    props = Properties(PacketTypes.PUBLISH)
    t0 = time.perf_counter()
    _, n = unpack(props, packed)
    assert time.perf_counter() - t0 < 1.0 and n == len(packed)
    assert cut(props) and len(props.UserProperty) == MAX_PROPERTIES - 5  # after the 5 others
    small = _publish_props(random.Random(0), 3).pack()
    props = Properties(PacketTypes.PUBLISH)
    unpack(props, small)
    assert not cut(props) and len(props.UserProperty) == 3


def test_installed_for_paho() -> None:
    assert Properties.unpack is unpack
