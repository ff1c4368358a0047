"""The gateway's view of a request and of a worker's answer, read from their wire bytes.

The gateway forwards a ``DetectRequest`` without parsing it into a message and without
serialising it again: the bytes the edge sent are the bytes the worker gets
(docs/design/balancing.md#a-lean-hop). ``read_request`` walks the protobuf wire format
(<https://protobuf.dev/programming-guides/encoding/>) once and keeps only what admission
and routing read: the ids, the frame sequence, the deadline, the priority and the replay flag, the image's fields with a
zero-copy ``memoryview`` of its bytes, and the number of edge detections. It follows a
parser's rules: the last value of a scalar field wins, occurrences of the embedded
``image`` merge (``shape`` packed or not), a field with another wire type than its
declared one is skipped as unknown, strings must be UTF-8. What it does not read (edge
detections, hardness, reason, the image's region tiles) is checked by the worker, which
answers INVALID_ARGUMENT for bytes it cannot parse or tiles outside the image
(``cloud.worker.server``).

A worker's answer is small: ``reply_of`` parses it (status, error, queue time) and keeps
its bytes; ``Reply.stamped`` sets ``timing.gateway_ms`` by appending one field, which
every parser merges into ``timing`` (concatenated messages merge: the same guide,
"Last One Wins"). Pure: no I/O, no clock.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from edgewise import status
from edgewise.errors import InvalidInputError
from edgewise.regions import MAX_TILES
from edgewise.status import RequestKeys, error_response
from edgewise.v1 import detect_pb2
from edgewise.wire import answer_mismatch, queue_rank

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1

# field numbers, from the generated descriptors so they cannot drift from the .proto
_R = {f.name: f.number for f in detect_pb2.DetectRequest.DESCRIPTOR.fields}
_I = {f.name: f.number for f in detect_pb2.Image.DESCRIPTOR.fields}
_DEVICE_ID, _STREAM_ID, _FRAME_SEQ, _PRIORITY = _R["device_id"], _R["stream_id"], _R["frame_seq"], _R["priority"]
_REPLAY = _R["replay"]
_DEADLINE, _TRACE_ID, _IMAGE, _EDGE_DETECTIONS = (_R["deadline_unix_ns"], _R["trace_id"], _R["image"],
                                                   _R["edge_detections"])
_ENCODING, _DATA, _SHAPE, _DTYPE = _I["encoding"], _I["data"], _I["shape"], _I["dtype"]
_IMAGE_U32 = {_I[n]: n for n in ("offset_x", "offset_y", "source_width", "source_height")}


def _key(number: int, wire_type: int) -> bytes:
    k = number << 3 | wire_type
    assert k < 0x80, "one-byte keys only"
    return bytes([k])


_TIMING = detect_pb2.DetectResponse.DESCRIPTOR.fields_by_name["timing"].number
_GATEWAY_MS = detect_pb2.Timing.DESCRIPTOR.fields_by_name["gateway_ms"].number
#: ``timing { gateway_ms: <float32> }``: the key and length before the 4 bytes of the float
_STAMP = _key(_TIMING, _LEN) + bytes([5]) + _key(_GATEWAY_MS, _I32)


class _Malformed(Exception):
    """Bytes that no protobuf parser accepts (the message says what and at which byte)."""


@dataclass(slots=True)
class ImageHead:
    """The request's ``image`` as ``edgewise.wire.check_image`` reads it (``WireImage``);
    ``data`` is a view into the request's bytes."""

    encoding: int = 0
    data: memoryview = field(default_factory=lambda: memoryview(b""))
    shape: list[int] = field(default_factory=list)
    dtype: str = ""
    offset_x: int = 0
    offset_y: int = 0
    source_width: int = 0
    source_height: int = 0


@dataclass(slots=True)
class RequestHead:
    """What the gateway reads of one request; ``body`` is the request as received."""

    body: bytes
    device_id: str = ""
    stream_id: str = ""
    frame_seq: int = 0
    trace_id: str = ""
    deadline_unix_ns: int = 0
    priority: int = 0  # as sent, higher = sooner
    replay: bool = False  # replayed from the edge's spool
    image: ImageHead | None = None
    edge_detections: int = 0

    @property
    def rank(self) -> int:
        """The order it waits in at the worker, and in the gateway's prediction of it (higher =
        sooner; a replay below every live request): ``edgewise.wire.queue_rank``."""
        return queue_rank(self.priority, self.replay)


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer: its wire status and error, and the serialized ``DetectResponse``."""

    status: int
    error: str
    body: bytes
    queue_ms: float | None = None  # the worker's timing.queue_ms, when it sent one

    def stamped(self, gateway_ms: float) -> Reply:
        """This reply with ``timing.gateway_ms`` set (appended: the answer is not re-encoded)."""
        return Reply(self.status, self.error, self.body + _STAMP + struct.pack("<f", gateway_ms), self.queue_ms)


def error_reply(keys: RequestKeys | None, wire_status: int, message: str) -> Reply:
    """A reply carrying ``wire_status`` and ``message``, keyed like ``keys`` (when given)."""
    resp = error_response(keys, wire_status, message)
    return Reply(int(resp.status), message, resp.SerializeToString())


def reply_of(body: bytes, keys: RequestKeys, worker: str) -> Reply:
    """A worker's serialized answer as a ``Reply``: INTERNAL when it does not parse or answers
    another frame than ``keys`` (``edgewise.wire.answer_mismatch``: forwarded as OK, another
    frame's detections became the client's result, never counted against the worker, which
    answered fast and so got more than its share), which counts against the worker like any
    INTERNAL; an error answer without a message gets one naming the worker."""
    try:
        resp = detect_pb2.DetectResponse.FromString(body)
    except DecodeError as exc:
        return error_reply(keys, status.INTERNAL, f"worker {worker}: its answer is not a DetectResponse: {exc}")
    wrong = answer_mismatch(resp, keys.device_id, keys.stream_id, keys.frame_seq)
    if wrong:
        return error_reply(keys, status.INTERNAL, f"worker {worker}: its answer is for another frame: {wrong}")
    if not status.is_ok(resp.status) and not resp.error:
        return error_reply(keys, resp.status, f"worker {worker}: answered {status.name(resp.status)} "
                                              f"without a message")
    queue_ms = float(resp.timing.queue_ms) if resp.HasField("timing") else None
    return Reply(int(resp.status), resp.error, body, queue_ms)


#: top-level fields a request may have besides its edge detections: its own (one each, a few
#: repeated by a sender that merges messages) and unknown ones of a newer sender
OTHER_FIELDS = 64


def read_request(body: bytes, max_edge_detections: int | None = None) -> RequestHead:
    """The head of a serialized ``DetectRequest``; ``InvalidInputError`` when the bytes are
    not one (truncated, bad framing, ids that are not UTF-8) or, with ``max_edge_detections``,
    when they hold more top-level fields than that many edge detections and ``OTHER_FIELDS``:
    the walk is Python on the gateway's event loop, and 8 MB of two-byte fields took 1.5 s,
    stalling every other client, before any check refused them."""
    head = RequestHead(body)
    images: list[tuple[int, int]] = []
    n = len(body)
    i = 0
    left = n if max_edge_detections is None else max_edge_detections + OTHER_FIELDS
    try:
        # One pass over the top-level fields, inlined (a generator per field costs more than
        # the rest of admission): one-byte keys and one- or two-byte lengths take no call.
        while i < n:
            left -= 1
            if left < 0:
                raise InvalidInputError(f"request has more than {max_edge_detections} edge detections and "
                                        f"{OTHER_FIELDS} other fields (limits.max_edge_detections); send fewer "
                                        "edge detections")
            at = i
            key = body[i]
            if key < 0x80:
                i += 1
            else:
                key, i = _varint(body, i, n)
            if key < 8:
                raise _Malformed(f"field number 0 at byte {at}")
            wire_type = key & 7
            if wire_type == _LEN:
                if i < n and body[i] < 0x80:
                    size, i = body[i], i + 1
                elif i + 1 < n and body[i + 1] < 0x80:
                    size, i = (body[i] & 0x7F) | body[i + 1] << 7, i + 2
                else:
                    size, i = _varint(body, i, n)
                a, i = i, i + size
                if i > n:
                    raise _Malformed(f"field {key >> 3} at byte {at} runs past the end of its message (byte {n})")
                number = key >> 3
                if number == _EDGE_DETECTIONS:
                    head.edge_detections += 1
                elif number == _IMAGE:
                    images.append((a, i))
                elif number == _DEVICE_ID:
                    head.device_id = _text(body, a, i, "device_id")
                elif number == _STREAM_ID:
                    head.stream_id = _text(body, a, i, "stream_id")
                elif number == _TRACE_ID:
                    head.trace_id = _text(body, a, i, "trace_id")
            elif wire_type == _VARINT:
                value, i = _varint(body, i, n)
                number = key >> 3
                if number == _FRAME_SEQ:
                    head.frame_seq = value & _U64
                elif number == _DEADLINE:
                    head.deadline_unix_ns = _int64(value)
                elif number == _PRIORITY:
                    head.priority = value & _U32
                elif number == _REPLAY:
                    head.replay = bool(value)
            else:
                i = _skip(key, wire_type, at, i, n)
        if images:
            head.image = _read_image(memoryview(body), images)
    except _Malformed as exc:
        raise InvalidInputError(f"request is not a serialized DetectRequest: {exc}") from None
    return head


#: fields the request's ``image`` may have, over all its occurrences, counting each value of
#: ``shape`` (three for RAW): its own scalars, a few repeated by a sender that merges messages,
#: unknown ones of a newer sender, and its tiles (``edgewise.regions.MAX_TILES``)
IMAGE_FIELDS = MAX_TILES + OTHER_FIELDS
_TOO_MANY_IMAGE_FIELDS = (f"request.image has more than {IMAGE_FIELDS} fields (each shape value and tile counted; a "
                          f"RAW shape has 3, at most {MAX_TILES} tiles): send one image")


def _read_image(buf: memoryview, spans: list[tuple[int, int]]) -> ImageHead:
    """The image's fields, at most ``IMAGE_FIELDS``: the walk is Python on the gateway's event
    loop (or the MQTT network thread), and 8 MB of two-byte fields inside the image (8 KB
    gzip'd) held it for over a second before any check refused them."""
    img = ImageHead()
    left = IMAGE_FIELDS
    for start, end in spans:  # several occurrences of a message field merge
        for number, wire_type, a, b in _fields(buf, start, end):
            left -= 1
            if left < 0:
                raise InvalidInputError(_TOO_MANY_IMAGE_FIELDS)
            if wire_type == _LEN:
                if number == _DATA:
                    img.data = buf[a:b]
                elif number == _SHAPE:  # packed
                    for v in _packed(buf, a, b):
                        left -= 1
                        if left < 0:
                            raise InvalidInputError(_TOO_MANY_IMAGE_FIELDS)
                        img.shape.append(v & _U32)
                elif number == _DTYPE:
                    img.dtype = _text(buf, a, b, "image.dtype")
            elif wire_type == _VARINT:
                if number == _ENCODING:
                    v = a & _U32
                    img.encoding = v - (1 << 32) if v >= 1 << 31 else v
                elif number == _SHAPE:
                    img.shape.append(a & _U32)
                elif number in _IMAGE_U32:
                    setattr(img, _IMAGE_U32[number], a & _U32)
    return img


def _fields(buf: memoryview, i: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(number, wire type, a, b)`` of each field in ``buf[i:end]``: a varint's value in
    ``a``; for the other wire types the span of the value, ``buf[a:b]``."""
    while i < end:
        at = i
        key = buf[i]
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(buf, i, end)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise _Malformed(f"field number 0 at byte {at}")
        if wire_type == _VARINT:
            if i < end and buf[i] < 0x80:  # one-byte value: most of them
                value, i = buf[i], i + 1
            else:
                value, i = _varint(buf, i, end)
            yield number, wire_type, value, i
            continue
        if wire_type == _LEN:
            n, i = _varint(buf, i, end)
            a, i = i, i + n
            if i > end:
                raise _Malformed(f"field {number} at byte {at} runs past the end of its message (byte {end})")
        else:
            a, i = i, _skip(key, wire_type, at, i, end)
        yield number, wire_type, a, i


def _skip(key: int, wire_type: int, at: int, i: int, end: int) -> int:
    """Where a fixed-size field (I64, I32) that starts its value at ``i`` ends."""
    if wire_type == _I64 or wire_type == _I32:
        i += 8 if wire_type == _I64 else 4
        if i > end:
            raise _Malformed(f"field {key >> 3} at byte {at} runs past the end of its message (byte {end})")
        return i
    raise _Malformed(f"wire type {wire_type} at byte {at} (groups are not part of this protocol)")


def _varint(buf: bytes | memoryview, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    start = i
    while i < end and shift < 70:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
    raise _Malformed(f"bad varint at byte {start}")


def _packed(buf: memoryview, i: int, end: int) -> Iterator[int]:
    while i < end:
        value, i = _varint(buf, i, end)
        yield value


def _int64(v: int) -> int:
    v &= _U64
    return v - (1 << 64) if v >= 1 << 63 else v


def _text(buf: bytes | memoryview, a: int, b: int, name: str) -> str:
    try:
        return str(buf[a:b], "utf-8")
    except UnicodeDecodeError:
        raise _Malformed(f"{name} is not UTF-8 text") from None
