"""The gateway's in-place reading of requests against the protobuf parser (upb), on the same bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.gateway.envelope import Reply, error_reply, read_request, reply_of
from edgewise import status
from edgewise.errors import InvalidInputError
from edgewise.v1 import detect_pb2
from edgewise.wire import queue_rank

U32, U64 = (1 << 32) - 1, (1 << 64) - 1
I64 = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def requests(draw: st.DrawFn) -> detect_pb2.DetectRequest:
    req = detect_pb2.DetectRequest(
        device_id=draw(st.text(max_size=8)), stream_id=draw(st.text(max_size=8)),
        frame_seq=draw(st.integers(0, U64)), deadline_unix_ns=draw(I64), trace_id=draw(st.text(max_size=8)),
        capture_time_unix_ns=draw(I64), priority=draw(st.integers(0, U32)), reason=draw(st.text(max_size=8)),
        replay=draw(st.booleans()))
    if draw(st.booleans()):
        img = req.image
        img.encoding = draw(st.integers(-(1 << 31), (1 << 31) - 1))  # open enum: any int32 parses
        img.data = draw(st.binary(max_size=40))
        img.shape.extend(draw(st.lists(st.integers(0, U32), max_size=4)))
        img.dtype = draw(st.text(max_size=6))
        img.offset_x, img.offset_y = draw(st.integers(0, U32)), draw(st.integers(0, U32))
        img.source_width, img.source_height = draw(st.integers(0, U32)), draw(st.integers(0, U32))
    for _ in range(draw(st.integers(0, 3))):
        req.edge_detections.add(x2=1.0, y2=1.0, class_name=draw(st.text(max_size=4)), class_scores=[0.5])
    return req


def assert_same(body: bytes) -> None:
    """``read_request`` sees what the protobuf parser sees in ``body``."""
    want = detect_pb2.DetectRequest.FromString(body)
    got = read_request(body)
    assert got.body is body
    assert (got.device_id, got.stream_id, got.frame_seq, got.trace_id, got.deadline_unix_ns, got.priority) == (
        want.device_id, want.stream_id, want.frame_seq, want.trace_id, want.deadline_unix_ns, want.priority)
    assert got.replay == want.replay and got.rank == queue_rank(want.priority, want.replay)
    assert got.edge_detections == len(want.edge_detections)
    assert (got.image is not None) == want.HasField("image")
    if got.image is not None:
        w, g = want.image, got.image
        assert bytes(g.data) == w.data and g.shape == list(w.shape)
        assert (g.encoding, g.dtype, g.offset_x, g.offset_y, g.source_width, g.source_height) == (
            w.encoding, w.dtype, w.offset_x, w.offset_y, w.source_width, w.source_height)


@settings(max_examples=300, deadline=None)
@given(requests(), requests())
def test_reads_what_the_parser_reads_including_merged_occurrences(a, b):
    assert_same(a.SerializeToString())
    # concatenated messages merge: scalars last one wins, the image merges, repeated append
    assert_same(a.SerializeToString() + b.SerializeToString())


@settings(max_examples=100, deadline=None)
@given(requests())
def test_every_prefix_is_refused_exactly_when_the_parser_refuses_it(req):
    body = req.SerializeToString()
    for n in range(len(body)):
        prefix = body[:n]
        try:
            detect_pb2.DetectRequest.FromString(prefix)
        except Exception:
            with pytest.raises(InvalidInputError, match="not a serialized DetectRequest"):
                read_request(prefix)
        else:
            assert_same(prefix)


def test_unpacked_shape_wrong_wire_types_and_unknown_fields_are_read_as_the_parser_does():
    image = (b"\x18\x02" + b"\x18\x03"         # shape 2, 3 unpacked (varints)
             + b"\x1a\x02\x04\x05"             # shape 4, 5 packed
             + b"\x0a\x01x"                    # encoding (field 1) sent as bytes: unknown, skipped
             + b"\x12\x03abc"                  # data
             + b"\x2d\x01\x00\x00\x00")        # offset_x as fixed32: unknown, skipped
    body = (b"\x08\x07"                        # device_id as a varint: unknown, skipped
            + b"\x12\x02s1"                    # stream_id
            + b"\x42" + bytes([len(image)]) + image
            + b"\xf8\x06\x01"                  # field 111: unknown
            + b"\x19" + bytes(8))              # field 3 (frame_seq) as fixed64: unknown
    assert_same(body)
    head = read_request(body)
    assert head.image is not None and head.image.shape == [2, 3, 4, 5] and head.device_id == ""


@pytest.mark.parametrize("body, needle", [
    (b"\x0a\x05ab", "field 1 at byte 0 runs past the end of its message (byte 4)"),
    (b"\x0a\x02\xff\xfe", "device_id is not UTF-8 text"),
    (b"\x42\x04\x22\x02\xff\xfe", "image.dtype is not UTF-8 text"),
    (b"\x00\x01", "field number 0 at byte 0"),
    (b"\x18" + b"\xff" * 11, "bad varint at byte 1"),
    (b"\x42\x03\x12\x05a", "field 2 at byte 2 runs past the end of its message (byte 5)"),
])
def test_malformed_bytes_say_what_and_where(body, needle):
    with pytest.raises(InvalidInputError) as err:
        read_request(body)
    assert str(err.value) == f"request is not a serialized DetectRequest: {needle}"
    with pytest.raises(Exception):  # and the parser refuses them too
        detect_pb2.DetectRequest.FromString(body)


def test_groups_are_refused_though_a_parser_would_skip_them():
    # proto3 has no groups and no edgewise client sends one: refusing them keeps the reader small
    with pytest.raises(InvalidInputError, match="wire type 3 at byte 0 \\(groups are not part of this protocol\\)"):
        read_request(b"\x0b\x0c")


def test_the_image_bytes_are_not_copied():
    req = detect_pb2.DetectRequest(device_id="d", image=detect_pb2.Image(data=b"\xff\xd8" + bytes(100_000)))
    body = req.SerializeToString()
    head = read_request(body)
    assert head.image is not None and head.image.data.obj is body and len(head.image.data) == 100_002


def test_replies_keep_the_workers_bytes_and_stamp_gateway_time_by_appending():
    worker = detect_pb2.DetectResponse(status=detect_pb2.OK, frame_seq=9, worker_id="w",
                                       timing=detect_pb2.Timing(queue_ms=2.5, compute_ms=7.0, batch_size=4))
    body = worker.SerializeToString()
    reply = reply_of(body, read_request(detect_pb2.DetectRequest(frame_seq=9).SerializeToString()), "w")
    assert reply == Reply(status.OK, "", body, 2.5)
    stamped = reply.stamped(1.25)
    assert stamped.body.startswith(body)
    got = detect_pb2.DetectResponse.FromString(stamped.body)
    assert got.timing.gateway_ms == 1.25 and got.timing.compute_ms == 7.0 and got.timing.batch_size == 4
    assert got.frame_seq == 9 and got.worker_id == "w"
    # no timing from the worker: the stamp creates it
    assert reply_of(detect_pb2.DetectResponse(status=detect_pb2.OK).SerializeToString(),
                    read_request(b""), "w").queue_ms is None
    bare = detect_pb2.DetectResponse.FromString(error_reply(None, status.UNAVAILABLE, "x").stamped(3.0).body)
    assert bare.timing.gateway_ms == 3.0 and bare.status == detect_pb2.UNAVAILABLE


def test_an_answer_that_does_not_parse_is_the_workers_internal_error():
    keys = read_request(detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=4).SerializeToString())
    reply = reply_of(b"\x0a\x05ab", keys, "w1")
    assert reply.status == status.INTERNAL and reply.error.startswith("worker w1: its answer is not a DetectResponse")
    resp = detect_pb2.DetectResponse.FromString(reply.body)
    assert (resp.device_id, resp.stream_id, resp.frame_seq, resp.error) == ("d", "s", 4, reply.error)


def test_an_answer_for_another_frame_is_the_workers_internal_error():
    """A worker answering with another frame's ids (the edge's rule: device, stream and frame_seq
    echoed; an answer naming no device and stream is the request's unless it names another
    frame_seq) is INTERNAL naming the worker and the difference, keyed like the request."""
    keys = read_request(detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=4).SerializeToString())
    for wrong, said in ((dict(device_id="d", stream_id="s", frame_seq=5), "frame_seq 5, not 4"),
                        (dict(device_id="x", stream_id="s", frame_seq=4), "device_id 'x', not 'd'"),
                        (dict(device_id="d", frame_seq=4), "stream_id '', not 's'"),
                        (dict(frame_seq=7), "frame_seq 7, not 4")):
        body = detect_pb2.DetectResponse(status=detect_pb2.OK, **wrong).SerializeToString()
        reply = reply_of(body, keys, "w1")
        assert reply.status == status.INTERNAL, wrong
        assert reply.error.startswith("worker w1: its answer is for another frame: ") and said in reply.error
        resp = detect_pb2.DetectResponse.FromString(reply.body)
        assert (resp.device_id, resp.stream_id, resp.frame_seq) == ("d", "s", 4)
    for right in (dict(device_id="d", stream_id="s", frame_seq=4), dict(frame_seq=4), {}):
        body = detect_pb2.DetectResponse(status=detect_pb2.OK, **right).SerializeToString()
        assert reply_of(body, keys, "w1") == Reply(status.OK, "", body, None), right


def test_an_error_answer_without_a_message_gets_one_naming_the_worker():
    keys = read_request(detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=4).SerializeToString())
    empty = reply_of(b"", keys, "w1")  # parses: status unspecified, no error
    assert empty.status == detect_pb2.STATUS_UNSPECIFIED
    assert empty.error == "worker w1: answered STATUS_UNSPECIFIED without a message"
    said = detect_pb2.DetectResponse(status=detect_pb2.INTERNAL, error="boom").SerializeToString()
    assert reply_of(said, keys, "w1") == Reply(status.INTERNAL, "boom", said, None)


def test_a_request_of_countless_fields_is_refused_once_it_has_more_than_it_may():
    """8 MB of two-byte unknown fields took 1.5 s of the gateway's event loop to walk; the
    walk now stops past ``max_edge_detections`` + ``OTHER_FIELDS`` top-level fields."""
    from cloud.gateway.envelope import OTHER_FIELDS
    from tests.cloud.gateway.workers import request

    valid = request().SerializeToString()
    junk = b"\x78\x01" * 4_000_000  # field 15, varint 1: unknown to a DetectRequest
    with pytest.raises(InvalidInputError, match=r"more than 1000 edge detections and 64 other fields "
                                                r"\(limits.max_edge_detections\)"):
        read_request(valid + junk, 1000)
    edges = detect_pb2.DetectRequest(edge_detections=[detect_pb2.Detection()] * 1000).SerializeToString()
    extra = b"\x78\x01" * (OTHER_FIELDS - len(detect_pb2.DetectRequest.FromString(valid).ListFields()))
    assert read_request(valid + edges + extra, 1000).edge_detections == 1000  # right at the bound
    with pytest.raises(InvalidInputError):
        read_request(valid + edges + extra + b"\x78\x01", 1000)
    assert read_request(valid + junk[:2000]).frame_seq == 0  # no bound given: every field read


def _image_field(inner: bytes) -> bytes:
    """``image`` (field 8, length-delimited) holding ``inner``."""
    size, n = b"", len(inner)
    while True:
        size += bytes([(n & 0x7F) | (0x80 if n >> 7 else 0)])
        n >>= 7
        if not n:
            return bytes([8 << 3 | 2]) + size + inner


def test_an_image_of_countless_fields_is_refused_once_it_has_more_than_it_may():
    """The walk inside ``image`` had no bound: 8 MB of ``encoding: 1`` repeated (8 KB gzip'd on
    the wire) held the gateway's event loop 1.2 s, and a packed ``shape`` of 8 million values
    1.8 s and a list as long; over MQTT before the token was looked at (found by a probe). A
    real image, 64 tiles and all, split over two occurrences, is read as before."""
    from cloud.gateway.envelope import IMAGE_FIELDS
    from edgewise.wire import MAX_TILES

    base = detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=3).SerializeToString()
    for inner in (b"\x08\x01" * 4_000_000,  # encoding: JPEG, four million times
                  b"\x1a\x83\xa4\xe8\x03" + b"\x01" * 8_000_003):  # shape, packed: 8 million values
        with pytest.raises(InvalidInputError, match=rf"request.image has more than {IMAGE_FIELDS} fields"):
            read_request(base + _image_field(inner), 1000)
    tiles = [detect_pb2.Tile(x=i, width=1, height=1) for i in range(MAX_TILES)]
    full = detect_pb2.Image(encoding=detect_pb2.Image.RAW, data=b"\x00" * 12, shape=[2, 2, 3], dtype="uint8",
                            offset_x=0, source_width=9, source_height=9, tiles=tiles)
    first, second = detect_pb2.Image(), detect_pb2.Image()
    first.CopyFrom(full)
    del first.tiles[32:]
    second.tiles.extend(tiles[32:])
    body = base + _image_field(first.SerializeToString()) + _image_field(second.SerializeToString())
    head = read_request(body, 1000)
    assert head.image is not None
    assert (head.image.shape, head.image.dtype, bytes(head.image.data)) == ([2, 2, 3], "uint8", b"\x00" * 12)
    assert detect_pb2.DetectRequest.FromString(body).image == full  # what the worker will read
