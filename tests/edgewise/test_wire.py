"""Wire codecs: round trips and every corrupt or oversized payload."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgewise import imagefiles, wire
from edgewise.detections import Detections
from edgewise.errors import InvalidInputError
from edgewise.v1 import detect_pb2


def _img(h: int = 48, w: int = 64) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 4 % 256, y * 5 % 256, (x + y) % 256], -1).astype(np.uint8)


@pytest.mark.parametrize("fmt, tol", [("png", 0), ("raw", 0), ("jpeg", 12)])
def test_image_round_trip(fmt, tol):
    im = _img()
    msg = wire.encode_image(im, fmt)
    back = wire.decode_image(detect_pb2.Image.FromString(msg.SerializeToString()))
    assert back.shape == im.shape and back.dtype == np.uint8
    assert np.abs(back.astype(int) - im).mean() <= tol


def test_header_sizes():
    im = _img(30, 70)
    assert imagefiles.jpeg_size(wire.encode_image(im, "jpeg").data) == (70, 30)
    assert imagefiles.png_size(wire.encode_image(im, "png").data) == (70, 30)


def test_encode_rejects_bad_input():
    with pytest.raises(InvalidInputError, match="dtype uint8"):
        wire.encode_image(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(InvalidInputError, match="format 'gif'"):
        wire.encode_image(_img(), "gif")
    with pytest.raises(InvalidInputError, match="quality"):
        wire.encode_image(_img(), "jpeg", quality=0)


def test_corrupt_jpeg():
    data = wire.encode_image(_img(), "jpeg").data
    with pytest.raises(InvalidInputError, match="truncated JPEG"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=data[: len(data) // 2]))
    with pytest.raises(InvalidInputError, match="not a JPEG"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=b"hello world, not jpeg"))
    garbage = data[:2] + b"\xff\xc0\x00\x11" + bytes(200) + b"\xff\xd9"
    with pytest.raises(InvalidInputError, match="JPEG"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=garbage))


def test_png_declared_as_jpeg_and_corrupt_png():
    png = wire.encode_image(_img(), "png").data
    with pytest.raises(InvalidInputError, match="not a JPEG"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=png))
    bad = png[:40] + bytes(len(png) - 40)
    with pytest.raises(InvalidInputError, match="corrupt PNG"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.PNG, data=bad))


def test_size_limits_checked_before_decoding():
    big = wire.encode_image(np.zeros((200, 300, 3), np.uint8), "jpeg")
    with pytest.raises(InvalidInputError, match=r"300x200 = 60000 pixels, over the limit of 50000"):
        wire.decode_image(big, max_pixels=50_000)
    with pytest.raises(InvalidInputError, match="over the limit of 10 bytes"):
        wire.decode_image(big, max_bytes=10)
    # a forged PNG header claiming 100k x 100k is refused without decoding
    png = bytearray(wire.encode_image(_img(), "png").data)
    png[16:24] = (100_000).to_bytes(4, "big") * 2
    with pytest.raises(InvalidInputError, match="over the limit"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.PNG, data=bytes(png)))


def test_raw_validation():
    im = _img()
    msg = wire.encode_image(im, "raw")
    ok = wire.decode_image(msg)
    assert not ok.flags.writeable  # zero-copy view of the message bytes
    with pytest.raises(InvalidInputError, match="needs 9216"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.RAW, data=msg.data[:-1], shape=[48, 64, 3], dtype="uint8"))
    with pytest.raises(InvalidInputError, match="dtype 'float32'"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.RAW, data=msg.data, shape=[48, 64, 3], dtype="float32"))
    with pytest.raises(InvalidInputError, match=r"\[height, width, 3\]"):
        wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.RAW, data=msg.data, shape=[48, 192], dtype="uint8"))
    with pytest.raises(InvalidInputError, match="over the limit"):
        wire.decode_image(msg, max_pixels=100)


def test_empty_and_unspecified():
    with pytest.raises(InvalidInputError, match="image.data is empty"):
        wire.decode_image(detect_pb2.Image())
    with pytest.raises(InvalidInputError, match="encoding 0 is not supported"):
        wire.decode_image(detect_pb2.Image(data=b"xx"))


def _dets() -> Detections:
    return Detections(
        boxes=np.array([[1, 2, 30, 40], [5, 5, 6, 7]], np.float32),
        scores=np.array([0.9, 0.3], np.float32),
        class_ids=np.array([1, 0], np.int32),
        class_scores=np.array([[0.1, 0.9], [0.3, 0.05]], np.float32),
        objectness=np.array([0.95, 0.5], np.float32),
        names=("cat", "dog"),
        source="edge",
    )


def test_detections_round_trip():
    d = _dets()
    msgs = wire.detections_to_proto(d)
    assert [m.class_name for m in msgs] == ["dog", "cat"] and msgs[0].source == "edge"
    wired = [detect_pb2.Detection.FromString(m.SerializeToString()) for m in msgs]
    back = wire.detections_from_proto(wired, names=d.names, source="edge")
    np.testing.assert_array_equal(back.boxes, d.boxes)
    np.testing.assert_array_equal(back.scores, d.scores)
    np.testing.assert_array_equal(back.class_ids, d.class_ids)
    np.testing.assert_array_equal(back.class_scores, d.class_scores)
    assert back.sources is None and back.names == d.names


def test_detections_sources_and_override():
    msgs = wire.detections_to_proto(_dets(), source="cloud")
    assert {m.source for m in msgs} == {"cloud"}
    back = wire.detections_from_proto(msgs, names=("cat", "dog"), source="edge")
    assert back.sources == ("cloud", "cloud")
    assert len(wire.detections_from_proto([], names=("a",))) == 0


def test_detections_validation():
    def one(**kw):
        base = dict(x1=0, y1=0, x2=1, y2=1, score=0.5, class_id=0)
        base.update(kw)
        return [detect_pb2.Detection(**base)]

    with pytest.raises(InvalidInputError, match=r"detections\[0\]: coordinates and score must be finite"):
        wire.detections_from_proto(one(x2=float("nan")), names=("a",))
    with pytest.raises(InvalidInputError, match="finite"):
        wire.detections_from_proto(one(score=float("inf")), names=("a",))
    with pytest.raises(InvalidInputError, match=r"class_id 3 is out of range: the model has 2 classes"):
        wire.detections_from_proto(one(class_id=3), names=("a", "b"))
    with pytest.raises(InvalidInputError, match="inverted"):
        wire.detections_from_proto(one(x1=5, x2=1), names=("a",))
    mixed = one(class_scores=[0.1, 0.2]) + one(class_scores=[0.3])
    assert wire.detections_from_proto(mixed, names=("a", "b")).class_scores is None


def test_crop_offsets_back_to_source_frame():
    d = _dets()
    img = detect_pb2.Image(offset_x=100, offset_y=50, source_width=120, source_height=400)
    s = wire.to_source_frame(d, img)
    np.testing.assert_array_equal(s.boxes, [[101, 52, 120, 90], [105, 55, 106, 57]])  # clipped at w=120
    assert wire.to_source_frame(d, detect_pb2.Image()) is d
    np.testing.assert_array_equal(wire.shift_detections(d, 1, 2).boxes[0], [2, 4, 31, 42])


def test_check_image_reads_only_the_header():
    data = bytearray(wire.encode_image(_img(8, 8), "jpeg").data)
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = (30000).to_bytes(2, "big") * 2  # an 8x8 JPEG declaring 30000x30000
    bomb = detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=bytes(data))
    with pytest.raises(InvalidInputError, match="declares 30000x30000 = 900000000 pixels, over the limit"):
        wire.check_image(bomb)
    with pytest.raises(InvalidInputError, match="over the limit"):
        wire.decode_image(bomb)  # refused before the decoder allocates 2.7 GB
    data[sof + 5:sof + 9] = (4300).to_bytes(2, "big") + (7600).to_bytes(2, "big")
    header = wire.check_image(detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=bytes(data)))
    assert (header.encoding, header.width, header.height) == ("jpeg", 7600, 4300)  # under 7680x4320
    raw = wire.encode_image(_img(), "raw")
    assert wire.check_image(raw).pixels == 48 * 64
    raw.source_width, raw.source_height, raw.offset_x = 100, 100, 100
    with pytest.raises(InvalidInputError, match="outside the 100x100 source frame"):
        wire.check_image(raw)
    one_channel = detect_pb2.Image(encoding=detect_pb2.Image.RAW, data=bytes(48 * 64), shape=[48, 64, 1],
                                   dtype="uint8")
    with pytest.raises(InvalidInputError, match=r"\[height, width, 3\]"):
        wire.check_image(one_channel)


class _View:
    """A wire image whose ``data`` is a view into a larger buffer (as the gateway reads one)."""

    def __init__(self, img: detect_pb2.Image) -> None:
        buf = b"head" + img.data + b"tail"
        self.data = memoryview(buf)[4:-4]
        self.encoding, self.shape, self.dtype = img.encoding, list(img.shape), img.dtype
        self.offset_x, self.offset_y = img.offset_x, img.offset_y
        self.source_width, self.source_height = img.source_width, img.source_height


@pytest.mark.parametrize("pad", [0, 10, 63, 64, 65, 5000])
def test_check_image_on_a_buffer_view_and_zero_padded_jpegs(pad):
    jpeg = wire.encode_image(_img(), "jpeg").data
    for data, ok in ((jpeg + bytes(pad), True), (jpeg[:-1] + bytes(pad), False), (jpeg[:-2] + bytes(pad), False)):
        img = detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=data)
        for candidate in (img, _View(img)):
            if ok:
                assert wire.check_image(candidate) == imagefiles.ImageHeader("jpeg", 64, 48)
            else:
                with pytest.raises(InvalidInputError, match="truncated JPEG"):
                    wire.check_image(candidate)
    png = _View(wire.encode_image(_img(), "png"))
    assert wire.check_image(png) == imagefiles.ImageHeader("png", 64, 48)


@pytest.mark.parametrize("ext", [".bmp", ".webp", ".tiff", ".ppm"])
def test_file_headers_of_other_formats(tmp_path, ext):
    import cv2

    path = tmp_path / f"x{ext}"
    assert cv2.imwrite(str(path), _img(30, 70))
    header = imagefiles.image_header(path.read_bytes(), str(path))
    assert (header.width, header.height) == (70, 30)
    assert imagefiles.read_image_file(path).shape == (30, 70, 3)
    with pytest.raises(InvalidInputError, match=r"x\..*over the limit of 100"):
        imagefiles.read_image_file(path, max_pixels=100)


def _with_exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The JPEG with an APP1 EXIF segment holding only the Orientation tag (0x0112), as a
    phone camera writes it."""
    import struct

    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1)
    tiff += struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    body = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_ignored_so_pixels_match_the_header(orientation, tmp_path):
    """OpenCV rotated EXIF-oriented JPEGs: orientation 6 (a portrait phone photo) was refused
    as corrupt, orientation 3 answered with boxes in upside-down coordinates. On the wire the
    stored pixels stand; a file read from disk is turned upright only after its header
    check (``upright=False`` gives the stored pixels)."""
    im = np.zeros((40, 64, 3), np.uint8)
    im[:10, :16] = 255  # a bright top-left corner: it stays there
    import cv2

    ok, buf = cv2.imencode(".jpg", im)
    data = _with_exif_orientation(buf.tobytes(), orientation)
    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    out = imagefiles.read_image_file(path, upright=False)
    assert out.shape == (40, 64, 3) and out[:10, :16].mean() > 200 and out[30:, 48:].mean() < 50
    upright = imagefiles.read_image_file(path)
    assert upright.shape == ((40, 64, 3) if orientation == 3 else (64, 40, 3))
    decoded = wire.decode_image(detect_pb2.Image(data=data, encoding=detect_pb2.Image.JPEG))
    assert decoded.shape == (40, 64, 3) and decoded[:10, :16].mean() > 200


def test_a_fifo_or_folder_in_an_image_folder_is_refused_without_waiting(tmp_path):
    """A FIFO named like an image blocked the folder source forever (and SIGTERM with it)."""
    import os
    import threading

    fifo = tmp_path / "a_fifo.jpg"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(pytest.raises(InvalidInputError, imagefiles.read_image_file,
                                                                     fifo)), daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # release the reader before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("read_image_file waited on a FIFO")
    assert "not a regular file" in str(result[0].value)
    with pytest.raises(InvalidInputError, match="cannot read: Is a directory"):
        imagefiles.read_image_file(tmp_path)


@pytest.mark.parametrize("fields, says", [
    ({"offset_x": 4_000_000_000, "offset_y": 4_000_000_000}, r"crop offset .* without the source frame's size"),
    ({"source_width": 10, "source_height": 10}, r"a 64x48 crop at \(0,0\) does not fit in the 10x10 source frame"),
    ({"offset_x": 600, "source_width": 640, "source_height": 480}, r"crop at \(600,0\) does not fit"),
    ({"source_width": 640}, r"give both \(the source frame's size\) or neither"),
])
def test_crop_geometry_that_maps_boxes_nowhere_is_invalid(fields, says):
    """Answered OK before, with zero-area boxes near 4e9 or every box clipped to (10,10,10,10)."""
    im = wire.encode_image(np.zeros((48, 64, 3), np.uint8), "jpeg")
    for name, value in fields.items():
        setattr(im, name, value)
    with pytest.raises(InvalidInputError, match=says):
        wire.check_image(im)
    ok = wire.encode_image(np.zeros((48, 64, 3), np.uint8), "jpeg")
    ok.offset_x, ok.offset_y, ok.source_width, ok.source_height = 576, 432, 640, 480  # the bottom-right crop
    assert wire.check_image(ok).width == 64


def _packed(h: int = 48, w: int = 64) -> detect_pb2.Image:
    im = wire.encode_image(np.zeros((h, w, 3), np.uint8), "png")
    im.source_width, im.source_height = 640, 480
    return im


@pytest.mark.parametrize("tile, says", [
    # at the frame's bottom-right corner, 63 of its 64 columns beyond the frame
    (dict(x=0, y=0, width=64, height=48, source_x=639, source_y=0), r"reaches \(703,48\), past the 640x480"),
    # a 2x tile whose last rows show nothing of the frame
    (dict(x=0, y=0, width=64, height=48, source_x=0, source_y=400, scale=2.0), r"at scale 2 .* past the"),
    # scale 0 is 1: one column too many
    (dict(x=0, y=0, width=64, height=48, source_x=577, source_y=0), r"64x48 at scale 1 from source \(577,0\)"),
])
def test_a_tile_reaching_past_its_source_frame_is_invalid(tile: dict, says: str) -> None:
    """Answered OK before, its boxes clamped onto the frame's edge (two thirds of a real answer
    had no area left), where a crop of the same geometry is refused."""
    im = _packed()
    im.tiles.add(**tile)
    with pytest.raises(InvalidInputError, match=r"image.tiles\[0\]: .*" + says):
        wire.check_image(im)
    for corner in (dict(source_x=576, source_y=432), dict(source_x=512, source_y=384, scale=2.0)):
        fits = _packed()
        fits.tiles.add(x=0, y=0, width=64, height=48, **corner)  # at the bottom-right corner
        assert wire.check_image(fits).width == 64


def test_tiles_that_overlap_in_the_image_or_scale_by_next_to_nothing_are_invalid() -> None:
    """Overlapping tiles were taken, each box mapped back by whichever was listed first; a scale
    of 1e-30 mapped 24 boxes to specks at a tile's corner, answered OK (found by a probe)."""
    im = _packed()
    im.tiles.add(x=0, y=0, width=32, height=48, source_x=0, source_y=0)
    im.tiles.add(x=31, y=0, width=33, height=48, source_x=100, source_y=0)
    with pytest.raises(InvalidInputError, match=re.escape(
            "image.tiles[1]: 33x48 at (31,0) overlaps image.tiles[0] (32x48 at (0,0)) in the image")):
        wire.check_image(im)
    im.tiles[1].x, im.tiles[1].width = 32, 32  # side by side
    assert wire.check_image(im).width == 64
    im.tiles[1].scale = 1e-30
    with pytest.raises(InvalidInputError, match=re.escape("image.tiles[1].scale 1e-30: source pixels per image "
                                                          "pixel, within [1/64, 64] (0: 1)")):
        wire.check_image(im)
    im.tiles[1].scale = 1 / 64
    assert wire.check_image(im).width == 64


@pytest.mark.parametrize("w, h", [(640, 480), (1282, 1082), (1000, 721), (333, 1001), (1920, 1082), (97, 61)])
@pytest.mark.parametrize("low_width", [0, 64, 320, 640])
def test_the_edges_packed_payloads_pass_the_tile_check(w: int, h: int, low_width: int) -> None:
    """A downscaled frame's rounded height overhangs the frame by up to half a packed pixel
    (1920x1082 at 640 wide: 361 rows of 3 px, 1083): still valid, every packed pixel starts
    inside the frame."""
    from edgewise.regions import pack

    frame = np.zeros((h, w, 3), np.uint8)
    regions = [(0, 0, min(w, 40), min(h, 30)), (w - min(w, 50), h - min(h, 20), w, h)]
    packed, tiles = pack(frame, regions, low_width)
    im = wire.encode_image(packed, "png")
    im.source_width, im.source_height = w, h
    im.tiles.extend(wire.tiles_to_proto(tiles))
    assert wire.check_image(im).width == packed.shape[1]


def test_boxes_with_no_area_left_in_the_frame_are_dropped() -> None:
    from edgewise.regions import Tile

    found = Detections(boxes=np.array([[0, 0, 10, 10], [60, 47.9, 64, 48]], np.float32),
                       scores=np.array([0.9, 0.8], np.float32), class_ids=np.zeros(2, np.int32),
                       class_scores=None, objectness=None, names=("a",), source="cloud")
    # the last packed pixel of a downscaled frame may overhang it (see above): a box in it is gone
    out = wire.map_to_source(found, (0.0, 0.0), (320, 239), [Tile(0, 0, 64, 48, 0, 0, 5.0)])
    np.testing.assert_array_equal(out.boxes, [[0, 0, 50, 50]])
    assert out.scores.tolist() == pytest.approx([0.9])
    assert len(wire.map_to_source(found, (0.0, 0.0), None, [Tile(0, 0, 64, 48, 0, 0, 5.0)])) == 2


def test_a_jpeg_with_bytes_after_its_end_is_not_called_truncated() -> None:
    """Bytes after the end-of-image marker were refused as "truncated JPEG", which it is not."""
    im = wire.encode_image(np.zeros((16, 16, 3), np.uint8), "jpeg")
    im.data += b"junk"
    with pytest.raises(InvalidInputError, match=re.escape("image.data: truncated JPEG, or bytes after its end "
                                                          "(image.data must end with the end-of-image marker FFD9)")):
        wire.check_image(im)
