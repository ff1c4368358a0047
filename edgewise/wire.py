"""Wire codecs: numpy images and ``Detections`` <-> the v1 protobuf messages.

Everything arriving from the network is validated by ``check_image`` before any
decoder touches it: declared encoding vs magic bytes, byte and pixel limits (the
image size is read from the PNG/JPEG header *before* decoding, by
``edgewise.imagefiles``, so a small file that would inflate to gigapixels is
refused cheaply), RAW shape/dtype/length consistency, and (on the worker) no image or tile
field this build does not know: a newer edge's, which would map the boxes wrongly if ignored;
``decode_image`` adds the structural walk and the decode. Errors are ``InvalidInputError`` (INVALID_ARGUMENT,
``edgewise.status``) naming the field and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

import cv2
import numpy as np
from google.protobuf import unknown_fields
from google.protobuf.message import Message

from edgewise import imagefiles
from edgewise.detections import Detections
from edgewise.errors import InvalidInputError
from edgewise.imagefiles import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, Buffer, ImageHeader
from edgewise.images import check_bgr
from edgewise.regions import MAX_TILES, Tile, overlap, tiles_to_frame
from edgewise.v1 import detect_pb2

FORMATS = ("jpeg", "png", "raw")
#: The shortest keepalive ping interval the cloud's gRPC servers accept from a client, also
#: between calls (cloud.binding.server_options); the edge's `cloud.keepalive_s` may not go below.
MIN_PING_INTERVAL_S = 5
_WIRE_ENCODINGS: Dict[int, str] = {detect_pb2.Image.JPEG: "jpeg", detect_pb2.Image.PNG: "png"}

#: The rank of a replay from an edge's spool in a worker's queue and in the gateway's prediction
#: of it: below every live escalation (whose ``priority`` is 0 or more), whatever it was sent with.
REPLAY_RANK = -1


def queue_rank(priority: int, replay: bool) -> int:
    """The order a request waits in (higher = sooner; docs/design/batching.md#priority): its
    ``priority``, or :data:`REPLAY_RANK` for a replay (``DetectRequest.replay``). A replay's frame
    was published with the edge's result long ago; a live escalation's answer is what its edge
    publishes now. Replays keep the hardness percentile they were first sent with, and after an
    outage every device of a fleet replays at once (one each, ``spool.replay_concurrency``): 30
    devices replaying at percentile 80 had every live escalation at percentile 50 of another
    device refused as saturated (0 of 49 answered; ``tests/cloud/test_replay_rank.py``), so the
    live ones were spooled in turn. The one rule of the worker's batcher and the gateway's
    balancer, so the gateway predicts the order the worker keeps."""
    return REPLAY_RANK if replay else priority


def encode_image(bgr: np.ndarray, fmt: str = "jpeg", quality: int = 90) -> detect_pb2.Image:
    """Encode a BGR uint8 HxWx3 image as ``jpeg`` (``quality`` 1..100), ``png`` or ``raw``."""
    check_bgr(bgr)
    if fmt == "raw":
        data = np.ascontiguousarray(bgr).tobytes()
        return detect_pb2.Image(
            encoding=detect_pb2.Image.RAW, data=data, shape=list(bgr.shape), dtype="uint8"
        )
    if fmt == "jpeg":
        if not 1 <= int(quality) <= 100:
            raise InvalidInputError(f"jpeg quality must be 1..100, got {quality}")
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        enc = detect_pb2.Image.JPEG
    elif fmt == "png":
        ok, buf = cv2.imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        enc = detect_pb2.Image.PNG
    else:
        raise InvalidInputError(f"image format {fmt!r}: use one of {', '.join(FORMATS)}")
    if not ok:
        raise InvalidInputError(f"OpenCV could not encode the image as {fmt}")
    return detect_pb2.Image(encoding=enc, data=buf.tobytes())


class WireImage(Protocol):
    """What ``check_image`` reads of a wire image: a ``detect_pb2.Image`` (the worker), or
    the gateway's view of one inside the request bytes it forwards, whose ``data`` is a
    ``memoryview`` of them (``cloud/gateway/envelope.py``)."""

    @property
    def encoding(self) -> int: ...
    @property
    def data(self) -> Buffer: ...
    @property
    def shape(self) -> Sequence[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def offset_x(self) -> int: ...
    @property
    def offset_y(self) -> int: ...
    @property
    def source_width(self) -> int: ...
    @property
    def source_height(self) -> int: ...


def check_image(
    img: WireImage,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ImageHeader:
    """The one check of a wire image, from its header only (no decoding, microseconds).

    Byte limit, declared encoding vs magic bytes, declared size vs ``max_pixels`` (for
    every encoding), RAW shape [height, width, 3] / dtype uint8 / length, a JPEG's
    end-of-image marker, a crop offset inside its source frame (and with the frame's size),
    and (for a parsed ``detect_pb2.Image``: the worker) no field of the image or its tiles that
    this build does not know (``_check_known_fields``), the crop inside the frame or the tiles
    of a packed region payload. The gateway's
    admission and the worker (before it decodes) both call it with the same limits.
    Reads only the first and last bytes of ``data``: its cost does not grow with the image.
    """
    data = img.data
    if not data:
        raise InvalidInputError("image.data is empty: send the encoded frame (JPEG, PNG or RAW)")
    if len(data) > max_bytes:
        raise InvalidInputError(f"image.data is {len(data)} bytes, over the limit of {max_bytes} bytes "
                                f"(send a smaller crop or lower the JPEG quality)")
    enc = img.encoding
    if enc == detect_pb2.Image.RAW:
        header = _raw_header(img)
    elif enc in _WIRE_ENCODINGS:
        want = _WIRE_ENCODINGS[enc]
        found = imagefiles.sniff(data)
        if found != want:
            raise InvalidInputError(f"image.data is not a {want.upper()} (its magic bytes say "
                                    f"{(found or 'unknown').upper()}); check image.encoding")
        if want == "jpeg" and _last_two(data) != b"\xff\xd9":
            raise InvalidInputError("image.data: truncated JPEG, or bytes after its end (image.data must end with "
                                    "the end-of-image marker FFD9)")
        header = imagefiles.image_header(data, "image.data")
    else:
        raise InvalidInputError(
            f"image.encoding {enc} is not supported: set JPEG ({detect_pb2.Image.JPEG}), "
            f"PNG ({detect_pb2.Image.PNG}) or RAW ({detect_pb2.Image.RAW})"
        )
    imagefiles.check_pixels(header, max_pixels, f"image ({header.encoding.upper()})")
    if bool(img.source_width) != bool(img.source_height):
        raise InvalidInputError(f"image.source_width {img.source_width} and source_height {img.source_height}: "
                                "give both (the source frame's size) or neither")
    if (img.offset_x or img.offset_y) and not img.source_width:
        raise InvalidInputError(f"image crop offset ({img.offset_x},{img.offset_y}) without the source frame's "
                                "size: set image.source_width and image.source_height")
    if img.source_width and (img.offset_x >= img.source_width or img.offset_y >= img.source_height):
        raise InvalidInputError(
            f"image crop offset ({img.offset_x},{img.offset_y}) lies outside the "
            f"{img.source_width}x{img.source_height} source frame")
    if isinstance(img, detect_pb2.Image):  # the gateway's view reads no tiles: the worker checks them
        _check_known_fields(img)
        if img.tiles:
            _check_tiles(img, header)
        elif img.source_width and (img.offset_x + header.width > img.source_width
                                   or img.offset_y + header.height > img.source_height):
            raise InvalidInputError(
                f"image: a {header.width}x{header.height} crop at ({img.offset_x},{img.offset_y}) does not fit "
                f"in the {img.source_width}x{img.source_height} source frame (a crop is full-resolution pixels "
                "of the frame; a scaled payload needs image.tiles)")
    return header


def _unknown_numbers(msg: Message) -> List[int]:
    """The field numbers of ``msg`` that its parser did not know (a newer sender's fields, or a
    known one sent with another wire type), in order, once each."""
    found = unknown_fields.UnknownFieldSet(msg)
    return sorted({int(found[i].field_number) for i in range(len(found))})


def _check_known_fields(img: detect_pb2.Image) -> None:
    """An image, and each of its tiles, must carry only fields this build knows: each of their
    fields says which source pixels the payload shows or how to read them, so one ignored maps
    every box to the wrong place while the answer looks fine. An edge's downscaled or region
    payload (``Image.tiles``) read by a worker older than the field was answered OK with boxes
    at half their size or in the wrong corner. So the receiver refuses, naming the fields:
    fields a receiver may ignore belong in ``DetectRequest``, never in ``Image`` or ``Tile``
    (detect.proto)."""
    where = [("image", _unknown_numbers(img))]
    where += [(f"image.tiles[{i}]", _unknown_numbers(t)) for i, t in enumerate(img.tiles)]
    for name, numbers in where:
        if numbers:
            raise InvalidInputError(
                f"{name} carries field{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}, "
                "unknown to this worker's wire contract (edgewise.v1; or a known field sent with another wire "
                "type): the sender is newer than this worker, which would map the boxes to the wrong source "
                "pixels if it ignored them; upgrade the cloud's workers before the edges")


#: a tile's scale (source pixels per image pixel): up to 64 times down, or up (0 means 1)
MAX_TILE_SCALE = 64.0
MIN_TILE_SCALE = 1.0 / MAX_TILE_SCALE


def _check_tiles(img: detect_pb2.Image, header: ImageHeader) -> None:
    if len(img.tiles) > MAX_TILES:
        raise InvalidInputError(f"image.tiles: {len(img.tiles)} tiles, at most {MAX_TILES}")
    if img.tiles and not (img.source_width and img.source_height):
        raise InvalidInputError("image.tiles: a packed image must say the frame its tiles come from "
                                "(image.source_width and image.source_height)")
    rects: List[Tuple[int, int, int, int]] = []  # the tiles' places in the image, (x1, y1, x2, y2)
    for i, t in enumerate(img.tiles):
        where = f"image.tiles[{i}]"
        if t.width == 0 or t.height == 0 or t.x + t.width > header.width or t.y + t.height > header.height:
            raise InvalidInputError(f"{where}: {t.width}x{t.height} at ({t.x},{t.y}) is empty or outside the "
                                    f"{header.width}x{header.height} image")
        if not (math.isfinite(t.scale) and (t.scale == 0.0 or MIN_TILE_SCALE <= t.scale <= MAX_TILE_SCALE)):
            raise InvalidInputError(f"{where}.scale {t.scale:g}: source pixels per image pixel, within "
                                    f"[1/{MAX_TILE_SCALE:g}, {MAX_TILE_SCALE:g}] (0: 1)")
        if t.source_x >= img.source_width or t.source_y >= img.source_height:
            raise InvalidInputError(f"{where}: source corner ({t.source_x},{t.source_y}) lies outside the "
                                    f"{img.source_width}x{img.source_height} source frame")
        # Every pixel of a tile must start inside the frame: a downscaled frame's last row may
        # overhang it by a fraction of a pixel (its height is rounded), but a tile reaching
        # further shows no pixels of this frame, and its boxes would be clamped onto the
        # frame's edge (check_image refuses a crop that does not fit the same way).
        s = float(t.scale) or 1.0
        if t.source_x + (t.width - 1) * s >= img.source_width or t.source_y + (t.height - 1) * s >= img.source_height:
            raise InvalidInputError(
                f"{where}: {t.width}x{t.height} at scale {s:g} from source ({t.source_x},{t.source_y}) reaches "
                f"({t.source_x + t.width * s:g},{t.source_y + t.height * s:g}), past the "
                f"{img.source_width}x{img.source_height} source frame")
        # A box is mapped back by the tile it lies in: where tiles overlap in the image, the
        # same pixels would belong to two places of the frame.
        rects.append((t.x, t.y, t.x + t.width, t.y + t.height))
        for j in range(i):
            if overlap(rects[j], rects[i]):
                o = img.tiles[j]
                raise InvalidInputError(f"{where}: {t.width}x{t.height} at ({t.x},{t.y}) overlaps image.tiles[{j}] "
                                        f"({o.width}x{o.height} at ({o.x},{o.y})) in the image: each image pixel "
                                        "belongs to one tile")


def tiles_to_proto(tiles: Sequence[Tile]) -> List[detect_pb2.Tile]:
    """The ``Image.tiles`` of a packed payload (:func:`edgewise.regions.pack`)."""
    return [detect_pb2.Tile(x=t.x, y=t.y, width=t.width, height=t.height, source_x=t.source_x,
                            source_y=t.source_y, scale=float(t.scale)) for t in tiles]


def tiles_from_proto(img: detect_pb2.Image) -> List[Tile]:
    """:class:`edgewise.regions.Tile` of each ``Image.tiles`` entry (scale 0 read as 1)."""
    return [Tile(int(t.x), int(t.y), int(t.width), int(t.height), int(t.source_x), int(t.source_y),
                 float(t.scale) or 1.0) for t in img.tiles]


def _last_two(data: Buffer) -> bytes:
    """The last two bytes before any trailing zero padding (some encoders pad a JPEG)."""
    tail = bytes(data[-64:]).rstrip(b"\x00")
    if len(tail) < 2 and len(data) > 64:  # long zero padding: strip it all (rare; C speed)
        tail = bytes(data).rstrip(b"\x00")
    return tail[-2:]


def _raw_header(img: WireImage) -> ImageHeader:
    if img.dtype not in ("", "uint8"):
        raise InvalidInputError(f"image.dtype {img.dtype!r}: RAW images must be 'uint8'")
    shape = [int(s) for s in img.shape]
    if len(shape) != 3 or shape[2] != 3:
        raise InvalidInputError(f"image.shape {shape}: RAW images must be [height, width, 3] (BGR)")
    header = ImageHeader("raw", shape[1], shape[0])
    if header.pixels > 0 and len(img.data) != header.pixels * 3:
        raise InvalidInputError(
            f"image.data has {len(img.data)} bytes but image.shape {shape} needs {header.pixels * 3}")
    return header


def decode_image(
    img: detect_pb2.Image,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> np.ndarray:
    """``check_image``, then decode to a BGR uint8 HxWx3 array.

    RAW payloads are returned zero-copy as a *read-only* view of the message
    bytes (the runtime never writes into its input); copy it to modify it.
    """
    header = check_image(img, max_pixels, max_bytes)
    if header.encoding == "raw":
        return np.frombuffer(img.data, np.uint8).reshape(header.height, header.width, 3)
    imagefiles.check_stream(img.data, header.encoding, "image.data")
    return imagefiles.decode_checked(img.data, header, "image.data")


def detections_to_proto(d: Detections, source: Optional[str] = None) -> List[detect_pb2.Detection]:
    """One ``Detection`` per box; ``source`` overrides the per-box producers."""
    boxes = d.boxes.tolist()
    scores = d.scores.tolist()
    cls = d.class_ids.tolist()
    cs = d.class_scores.tolist() if d.class_scores is not None else None
    srcs = (source,) * len(d) if source is not None else d.box_sources()
    out = []
    for i in range(len(d)):
        c = int(cls[i])
        x1, y1, x2, y2 = boxes[i]
        out.append(
            detect_pb2.Detection(
                x1=x1, y1=y1, x2=x2, y2=y2,
                score=scores[i],
                class_id=c,
                class_name=d.names[c] if 0 <= c < len(d.names) else "",
                class_scores=cs[i] if cs is not None else (),
                source=srcs[i],
            )
        )
    return out


def detections_from_proto(
    items: Iterable[detect_pb2.Detection], names: Sequence[str] = (), source: str = "",
    class_scores: bool = True,
) -> Detections:
    """Validate wire detections and make them columnar.

    Coordinates and scores must be finite, boxes not inverted, ``class_id``
    inside ``names`` (when names are known). ``class_scores`` are kept only if
    every detection carries the same number (and not read at all with
    ``class_scores`` False). Per-box ``source`` fields that differ from ``source``
    are kept in ``sources``.
    """
    items = list(items)
    n = len(items)
    if n == 0:
        return Detections.empty(names, source)
    boxes = np.array([(d.x1, d.y1, d.x2, d.y2) for d in items], np.float32).reshape(n, 4)
    scores = np.array([d.score for d in items], np.float32)
    cls = np.array([d.class_id for d in items], np.int64)
    bad = ~np.isfinite(boxes).all(axis=1) | ~np.isfinite(scores)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidInputError(f"detections[{i}]: coordinates and score must be finite numbers")
    inv = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    if inv.any():
        i = int(np.flatnonzero(inv)[0])
        raise InvalidInputError(f"detections[{i}]: box is inverted (need x1 <= x2 and y1 <= y2): {boxes[i].tolist()}")
    if names and (cls >= len(names)).any():
        i = int(np.flatnonzero(cls >= len(names))[0])
        raise InvalidInputError(
            f"detections[{i}].class_id {int(cls[i])} is out of range: the model has {len(names)} classes"
        )
    lens = {len(d.class_scores) for d in items} if class_scores else set()
    scores_per_class = None
    if len(lens) == 1 and 0 not in lens:
        scores_per_class = np.array([list(d.class_scores) for d in items], np.float32)
        if not np.isfinite(scores_per_class).all():
            raise InvalidInputError("detections: class_scores must be finite numbers")
    srcs = tuple(d.source or source for d in items)
    return Detections(
        boxes=boxes,
        scores=scores,
        class_ids=cls.astype(np.int32),
        class_scores=scores_per_class,
        objectness=None,
        names=tuple(names),
        source=source,
        sources=None if all(s == source for s in srcs) else srcs,
    )


#: The most detections the edge takes from one cloud answer: an answer with more is
#: unusable (refused whole, never cut), for a real model's answer has far fewer (its NMS keeps
#: at most a few hundred) and a hundred thousand boxes stall the pipeline and bloat records.
MAX_ANSWER_DETECTIONS = 1000
#: How far outside [0, 1] a cloud score may be and still be taken (clipped into it): a
#: float's rounding, not a model's output.
SCORE_TOLERANCE = 1e-3
#: A cloud box coordinate more than this many frame widths (heights) outside the frame makes
#: the answer unusable: it is not in this frame's pixels. Boxes closer than that are clipped
#: to the frame, and dropped when nothing of them is inside it.
FRAME_MARGIN = 1.0


def _short(text: str, limit: int = 60) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def answer_detections(
    items: Sequence[detect_pb2.Detection],
    names: Sequence[str] = (),
    frame_size: Optional[Tuple[int, int]] = None,
    source: str = "cloud",
    max_count: int = MAX_ANSWER_DETECTIONS,
) -> Detections:
    """The detections of a cloud answer (untrusted input), validated by
    :func:`detections_from_proto` and more: at most ``max_count`` of them; scores in [0, 1]
    (within ``SCORE_TOLERANCE``, then clipped); a ``class_name`` the answer gives must be the
    edge's name of its ``class_id``; with ``frame_size`` ``(width, height)``, boxes clipped to
    the frame and those with no area inside it dropped, and a coordinate more than
    ``FRAME_MARGIN`` frames outside it refused. ``InvalidInputError`` naming the first problem:
    the answer is unusable as a whole."""
    n = len(items)
    if n > max_count:
        raise InvalidInputError(f"{n} detections, over the {max_count} one answer may have")
    # the per-class scores are not read: nothing of the edge uses a cloud box's, and 30 MiB of
    # them (under the receive limit) took the event loop 0.6 s
    d = detections_from_proto(items, names=names, source=source, class_scores=False)
    if n == 0:
        return d
    out = (d.scores < -SCORE_TOLERANCE) | (d.scores > 1.0 + SCORE_TOLERANCE)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise InvalidInputError(f"detections[{i}].score {float(d.scores[i]):.6g} is outside [0, 1]")
    if names:
        for i, item in enumerate(items):
            given = item.class_name
            if given and given != names[item.class_id]:
                raise InvalidInputError(
                    f"detections[{i}].class_name {_short(given)} is not the edge model's name of class_id "
                    f"{item.class_id}, {_short(names[item.class_id])}: the cloud's model names its classes "
                    "differently")
    scores = np.clip(d.scores, 0.0, 1.0).astype(np.float32)
    boxes = d.boxes
    keep = None
    if frame_size is not None and frame_size[0] > 0 and frame_size[1] > 0:
        w, h = float(frame_size[0]), float(frame_size[1])
        xs, ys = boxes[:, 0::2].astype(np.float64), boxes[:, 1::2].astype(np.float64)
        far = ((xs < -FRAME_MARGIN * w) | (xs > (1 + FRAME_MARGIN) * w)).any(axis=1) | (
            (ys < -FRAME_MARGIN * h) | (ys > (1 + FRAME_MARGIN) * h)).any(axis=1)
        if far.any():
            i = int(np.flatnonzero(far)[0])
            raise InvalidInputError(
                f"detections[{i}]: box {boxes[i].tolist()} lies far outside the {int(w)}x{int(h)} frame")
        boxes = boxes.copy()
        np.clip(boxes[:, 0::2], 0, w, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, h, out=boxes[:, 1::2])
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    d = dataclasses.replace(d, boxes=boxes, scores=scores)
    return d if keep is None or keep.all() else d.select(keep)


def shift_detections(
    d: Detections, dx: float, dy: float, source_size: Optional[Tuple[int, int]] = None
) -> Detections:
    """Boxes of a crop moved by its offset into source-frame pixels, clipped to
    ``source_size`` ``(width, height)`` when given."""
    if len(d) == 0 or (dx == 0 and dy == 0 and source_size is None):
        return d
    boxes = d.boxes.astype(np.float32, copy=True)
    boxes[:, 0::2] += np.float32(dx)
    boxes[:, 1::2] += np.float32(dy)
    if source_size is not None:
        w, h = source_size
        np.clip(boxes[:, 0::2], 0, w, out=boxes[:, 0::2])
        np.clip(boxes[:, 1::2], 0, h, out=boxes[:, 1::2])
    return dataclasses.replace(d, boxes=boxes)


def source_mapping(img: detect_pb2.Image) -> Tuple[Tuple[float, float], Optional[Tuple[int, int]], Tuple[Tile, ...]]:
    """(crop offset, source size or None, tiles) of a wire image: what :func:`map_to_source` needs."""
    size = (int(img.source_width), int(img.source_height)) if img.source_width and img.source_height else None
    return (float(img.offset_x), float(img.offset_y)), size, tuple(tiles_from_proto(img))


def map_to_source(d: Detections, offset: Tuple[float, float], size: Optional[Tuple[int, int]],
                  tiles: Sequence[Tile] = ()) -> Detections:
    """Boxes found on a payload in source-frame pixels: through its tiles when it packs parts
    of the frame (:func:`edgewise.regions.tiles_to_frame`), else shifted by its crop offset;
    clipped to the source size when known, and then dropped when no area of them is left."""
    out = tiles_to_frame(d, tiles, size) if tiles else shift_detections(d, offset[0], offset[1], size)
    if size is None or len(out) == 0:
        return out
    keep = (out.boxes[:, 2] > out.boxes[:, 0]) & (out.boxes[:, 3] > out.boxes[:, 1])
    return out if keep.all() else out.select(keep)  # nothing of it inside the frame


def to_source_frame(d: Detections, img: detect_pb2.Image) -> Detections:
    """:func:`map_to_source` with what ``img`` carries."""
    return map_to_source(d, *source_mapping(img))


def answer_mismatch(resp: detect_pb2.DetectResponse, device_id: str, stream_id: str, frame_seq: int) -> str:
    """How an answer names another frame than ``device_id/stream_id/frame_seq`` (empty: it is
    that frame's). A worker echoes device, stream and frame_seq; an answer naming neither
    device nor stream (an older or minimal cloud) is taken as the request's unless it names
    another frame_seq (0, the field's default, names none). The gateway checks a worker's
    answer with it and the edge the cloud's: another frame's detections must never become
    this frame's result."""
    if not (resp.device_id or resp.stream_id):
        if resp.frame_seq and resp.frame_seq != frame_seq:
            return f"frame_seq {resp.frame_seq!r}, not {frame_seq!r}"
        return ""
    return "; ".join(f"{name} {got!r:.80}, not {want!r:.80}" for name, got, want in (
        ("device_id", resp.device_id, device_id), ("stream_id", resp.stream_id, stream_id),
        ("frame_seq", resp.frame_seq, frame_seq)) if got != want)
