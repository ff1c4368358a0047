"""An edge of a newer release than its cloud: the edge's real transports, the real gateway
and worker on port 0 (``real_cloud``; for MQTT the gateway's bridge on a real Mosquitto), requests carrying fields this build's wire contract does
not have (appended as the raw bytes a newer sender's generated classes would write).

Fields a newer edge adds outside the image are ignored and the frame is served (proto3). A
field of the image, or of one of its tiles, says which source pixels the payload shows: a
worker that ignored one answered OK with every box in the wrong place (a worker older than
``Image.tiles`` put a downscaled payload's boxes at half their size), so the worker refuses
it, naming it (detect.proto, "Must understand").
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from edge.transports import TransportError
from edge.transports.grpc import GrpcTransport
from edge.transports.mqtt import MqttConnection, MqttTransport
from edgewise import status
from edgewise.v1 import detect_pb2
from edgewise.wire import encode_image
from tests.conftest import in_process_cloud_class
from tests.waiting import async_wait_until


def key(number: int, wire_type: int) -> bytes:
    """A field's key as the wire format writes it: a varint, 7 bits a byte, low ones first."""
    value, out = number << 3 | wire_type, bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


#: field 20 (a number no message of edgewise.v1 uses), varint 90: e.g. a newer edge's rotation
NEWER_VARINT = key(20, 0) + bytes([90])
#: field 21, a length-delimited string "x": e.g. a newer edge's note
NEWER_STRING = key(21, 2) + bytes([1]) + b"x"


def frame() -> np.ndarray:
    rng = np.random.default_rng(3)
    return rng.integers(0, 255, (96, 128, 3), np.uint8)


def request(seq: int) -> detect_pb2.DetectRequest:
    req = detect_pb2.DetectRequest(device_id="cam", stream_id="skew", frame_seq=seq)
    req.image.CopyFrom(encode_image(frame(), "jpeg"))
    req.edge_detections.add(x1=1, y1=2, x2=30, y2=40, score=0.5, class_id=0)
    return req


def newer(req: detect_pb2.DetectRequest, where: str) -> detect_pb2.DetectRequest:
    """``req`` as a newer edge sends it: a field this build does not know added ``where``."""
    if where == "request":
        req.MergeFromString(NEWER_VARINT + NEWER_STRING)
    elif where == "detection":
        req.edge_detections[0].MergeFromString(NEWER_VARINT)
    elif where == "hardness":
        req.hardness.MergeFromString(NEWER_STRING)
    elif where == "image":
        req.image.MergeFromString(NEWER_VARINT)
    elif where == "tile":
        w, h = 128, 96
        req.image.source_width, req.image.source_height = 2 * w, 2 * h
        req.image.tiles.add(x=0, y=0, width=w, height=h, scale=2.0)
        req.image.tiles[0].MergeFromString(NEWER_STRING)
    else:
        raise AssertionError(where)
    return req


def send(cloud: Any, req: detect_pb2.DetectRequest) -> Any:
    async def main() -> Any:
        t = GrpcTransport([cloud.address])
        await t.start()
        try:
            return await t.detect(req, 20.0)
        except TransportError as exc:
            return exc
        finally:
            await t.close()

    return asyncio.run(main())


@pytest.mark.parametrize("where", ["request", "detection", "hardness"])
def test_fields_of_a_newer_edge_outside_the_image_are_ignored_and_the_frame_served(real_cloud, where):
    answer = send(real_cloud, newer(request(1), where))
    assert isinstance(answer, detect_pb2.DetectResponse), answer
    assert answer.status == detect_pb2.OK and answer.frame_seq == 1


@pytest.mark.parametrize("where, named", [("image", "image carries field 20"),
                                          ("tile", "image.tiles[0] carries field 21")])
def test_an_image_field_of_a_newer_edge_is_refused_naming_it_not_answered_with_misplaced_boxes(
        real_cloud, where, named):
    answer = send(real_cloud, newer(request(2), where))
    assert isinstance(answer, TransportError), f"answered {answer.status} with {len(answer.detections)} boxes"
    assert answer.status == status.INVALID_ARGUMENT  # not spooled: a replay would be refused the same way
    assert named in answer.message
    assert "upgrade the cloud's workers before the edges" in answer.message
    # the same request without the unknown field is served: only the field was refused
    assert isinstance(send(real_cloud, request(3)), detect_pb2.DetectResponse)


def test_a_known_image_field_sent_with_another_wire_type_is_refused_too(real_cloud):
    # offset_x (field 5, varint) sent as fixed32: a parser keeps it as an unknown field and reads
    # offset_x 0, so the crop's boxes would land at the frame's left edge
    req = request(4)
    req.image.source_width, req.image.source_height = 400, 300
    req.image.MergeFromString(key(5, 5) + (200).to_bytes(4, "little"))
    answer = send(real_cloud, req)
    assert isinstance(answer, TransportError) and answer.status == status.INVALID_ARGUMENT
    assert "image carries field 5" in answer.message


def test_over_mqtt_the_same_fields_are_served_and_refused_as_over_grpc(tiny_model, mosquitto):
    """The MQTT bridge carries the same bytes to the same worker: a newer edge's request field is
    ignored and its image field refused, as over gRPC."""
    bridge = {"mqtt.enabled": True, "mqtt.host": mosquitto.host, "mqtt.port": mosquitto.port,
              "mqtt.reconnect_min_s": 0.2, "mqtt.reconnect_max_s": 1.0}
    with in_process_cloud_class()(tiny_model, gateway=bridge) as cloud:
        async def run() -> Any:
            conn = MqttConnection(mosquitto.host, mosquitto.port, client_id="edge-skew")
            conn.start()
            t = MqttTransport(conn, "cam")
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set() and cloud.gateway.bridge.connected.is_set(),
                                   10, "the edge and the bridge connected")

            async def one(req: detect_pb2.DetectRequest) -> Any:
                try:
                    return await t.detect(req, 5.0)
                except TransportError as exc:
                    return exc

            # the response subscription may still be settling: the first answer may time out
            await async_wait_until(lambda: _answered(one(request(0))), 15, "a first answer over MQTT")
            served = await one(newer(request(5), "request"))
            refused = await one(newer(request(6), "image"))
            await t.close()
            conn.stop()
            return served, refused

        served, refused = asyncio.run(run())
    assert isinstance(served, detect_pb2.DetectResponse) and served.status == detect_pb2.OK
    assert isinstance(refused, TransportError) and refused.status == status.INVALID_ARGUMENT
    assert "image carries field 20" in refused.message


async def _answered(pending: Any) -> bool:
    return isinstance(await pending, detect_pb2.DetectResponse)
