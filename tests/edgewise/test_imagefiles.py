"""Image files from disk: EXIF orientation (JPEG, TIFF), the byte limit that follows from the
pixel limit, 16-bit images with 10/12-bit data, and file names escaped in messages."""

from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgewise import imagefiles, wire
from edgewise.errors import InvalidInputError
from edgewise.v1 import detect_pb2
from tests.edgewise.test_wire import _with_exif_orientation


def _scene(h: int = 40, w: int = 64) -> np.ndarray:
    """A picture no flip or turn maps onto itself: a gradient plus a bright top-left corner."""
    im = np.zeros((h, w, 3), np.uint8)
    im[:, :, 1] = np.linspace(0, 200, w, dtype=np.uint8)[None, :]
    im[:, :, 2] = np.linspace(0, 200, h, dtype=np.uint8)[:, None]
    im[: h // 4, : w // 4] = 255
    return im


def _tiff(img: np.ndarray, orientation: int) -> bytes:
    """A baseline uncompressed RGB TIFF of ``img`` (BGR) with an Orientation tag."""
    h, w = img.shape[:2]
    pixels = np.ascontiguousarray(img[:, :, ::-1]).tobytes()
    n = 10
    ifd_end = 8 + 2 + 12 * n + 4
    bits_at, data_at = ifd_end, ifd_end + 6
    entries = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, bits_at), (259, 3, 1, 1), (262, 3, 1, 2),
               (273, 4, 1, data_at), (274, 3, 1, orientation), (277, 3, 1, 3), (278, 3, 1, h),
               (279, 4, 1, len(pixels))]
    out = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", n)
    for tag, typ, count, value in entries:
        field = struct.pack("<HH", value, 0) if typ == 3 and count == 1 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, typ, count) + field
    return out + struct.pack("<I", 0) + struct.pack("<HHH", 8, 8, 8) + pixels


@pytest.mark.parametrize("orientation", range(1, 9))
def test_a_photo_from_disk_is_turned_upright_by_its_exif_orientation(orientation, tmp_path):
    """A phone's portrait photo (orientation 6) was processed sideways; 5-8 the wrong size."""
    data = _with_exif_orientation(cv2.imencode(".jpg", _scene(), [cv2.IMWRITE_JPEG_QUALITY, 98])[1].tobytes(),
                                  orientation)
    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    viewer = cv2.imread(str(path), cv2.IMREAD_COLOR)  # OpenCV applies a JPEG's orientation itself
    out = imagefiles.read_image_file(path)
    assert out.shape == viewer.shape == ((40, 64, 3) if orientation < 5 else (64, 40, 3))
    assert np.abs(out.astype(int) - viewer).mean() < 1.0
    stored = imagefiles.read_image_file(path, upright=False)
    assert stored.shape == (40, 64, 3)  # the header's size: what the wire keeps


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_tiff_orientation_follows_the_same_rule(orientation, tmp_path):
    """OpenCV's TIFF decoder turned orientation 3 by itself and refused 5-8 as corrupt."""
    img = _scene()
    path = tmp_path / "t.tif"
    path.write_bytes(_tiff(img, orientation))
    out = imagefiles.read_image_file(path)
    expected = imagefiles.orient(img, orientation)
    assert out.shape == expected.shape and np.array_equal(out, expected)
    jpeg = tmp_path / "p.jpg"
    stored = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 100])[1].tobytes()
    jpeg.write_bytes(_with_exif_orientation(stored, orientation))
    assert np.abs(cv2.imread(str(jpeg)).astype(int) - expected).mean() < 2.0  # orient() is a viewer's turn


def test_an_uncompressed_machine_vision_image_is_not_refused_by_size(tmp_path):
    """A 12 MP BMP is 36.9 MB: the fixed 32 MiB cap refused it as a corrupt frame."""
    path = tmp_path / "cam_4096x3000.bmp"
    assert cv2.imwrite(str(path), np.full((3000, 4096, 3), 90, np.uint8))
    assert path.stat().st_size > 32 * 1024 * 1024
    assert imagefiles.read_image_file(path).shape == (3000, 4096, 3)


def test_a_file_over_the_byte_limit_is_refused_as_a_limit(tmp_path):
    path = tmp_path / "big.bmp"
    assert cv2.imwrite(str(path), np.full((100, 100, 3), 90, np.uint8))
    limit = imagefiles.file_byte_limit(1000)
    assert limit == 1000 * 8 + imagefiles.FILE_HEADROOM_BYTES
    with pytest.raises(imagefiles.ImageLimitError, match="over the file size limit of 100 bytes"):
        imagefiles.read_image_file(path, max_bytes=100)
    with pytest.raises(imagefiles.ImageLimitError, match="over the limit of 1000"):
        imagefiles.read_image_file(path, max_pixels=1000)
    assert imagefiles.file_byte_limit(imagefiles.DEFAULT_MAX_PIXELS) > 100 * 1000 * 1000  # an 8K TIFF


def _with_sbit(png: bytes, bits: int, channels: int) -> bytes:
    body = b"sBIT" + bytes([bits] * channels)
    chunk = struct.pack(">I", channels) + body + struct.pack(">I", zlib.crc32(body))
    return png[:33] + chunk + png[33:]  # after IHDR


@pytest.mark.parametrize("scale,sbit", [(257, 0), (16, 0), (4, 0), (16, 12), (16 * 16, 12)])
def test_sixteen_bit_images_are_scaled_by_the_depth_they_use(scale, sbit, tmp_path):
    """12- and 10-bit sensor data in a 16-bit PNG decoded nearly black (divided by 256);
    a PNG whose sBIT says 12 but whose values are left-aligned (the spec's way) is not
    brightened past white."""
    img = _scene()
    data = cv2.imencode(".png", np.minimum(img.astype(np.uint32) * scale, 65535).astype(np.uint16))[1].tobytes()
    if sbit:
        data = _with_sbit(data, sbit, 3)
    path = tmp_path / "d16.png"
    path.write_bytes(data)
    out = imagefiles.read_image_file(path)
    assert out.dtype == np.uint8 and out.shape == img.shape
    assert abs(float(out.mean()) - float(img.mean())) < 3.0, (out.mean(), img.mean())


@pytest.mark.parametrize("channels", [3, 1])
def test_a_sixteen_bit_png_on_the_wire_is_scaled_by_its_sbit_else_as_full_range(channels):
    """A 12-bit camera's frame sent as a 16-bit PNG labelled sBIT 12 reached the worker divided
    by 256 (mean 7 for a frame of mean 126, answered OK with what a black frame gives, found by a
    probe). Unlabelled, it is full range (the PNG spec), not judged per frame as files are: one
    hot pixel would halve a stream's next frame (found by the review)."""
    img = _scene() if channels == 3 else _scene()[:, :, 1]
    expected = img if channels == 3 else cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    data = cv2.imencode(".png", img.astype(np.uint16) * 16)[1].tobytes()  # 12-bit samples

    def wired(png: bytes) -> np.ndarray:
        out = wire.decode_image(detect_pb2.Image(encoding=detect_pb2.Image.PNG, data=png))
        assert out.dtype == np.uint8 and out.shape == _scene().shape
        return out

    assert np.abs(wired(_with_sbit(data, 12, channels)).astype(int) - expected).max() <= 1
    assert np.array_equal(wired(data), expected >> 4)  # unlabelled: 16-bit range
    hot = img.astype(np.uint16) * 16
    hot.flat[0] = 65535
    hot_out = wired(cv2.imencode(".png", hot)[1].tobytes())
    assert np.array_equal(hot_out.reshape(-1)[3:], (expected >> 4).reshape(-1)[3:])  # the rest of the frame kept


def test_a_sixteen_bit_gray_image_is_bgr(tmp_path):
    path = tmp_path / "mono16.png"
    assert cv2.imwrite(str(path), np.full((20, 30), 1000, np.uint16))  # 10-bit data
    out = imagefiles.read_image_file(path)
    assert out.shape == (20, 30, 3) and int(out[0, 0, 0]) == 1000 >> 2


def test_control_characters_in_a_file_name_are_escaped(tmp_path):
    path = tmp_path / "x\n2026-12-04 ERROR forged\r.jpg"
    path.write_bytes(b"\xff\xd8junk")
    with pytest.raises(InvalidInputError) as err:
        imagefiles.read_image_file(path)
    assert "\n" not in str(err.value) and "\r" not in str(err.value) and "x\\n2026" in str(err.value)
    assert imagefiles.shown(Path("caf\u00e9/a.jpg")) == "caf\u00e9/a.jpg"  # printable text stays


def test_natural_key_orders_numbers_as_numbers():
    names = ["frame10.png", "frame2.png", "Frame1.png", "frame1.png"]
    assert sorted(names, key=imagefiles.natural_key) == ["Frame1.png", "frame1.png", "frame2.png", "frame10.png"]


def test_natural_order_takes_any_character_a_name_has():
    """'²' is a digit to str.isdigit but not to the regex or int(): no crash, plain order."""
    names = ["a10.jpg", "a2.jpg", "a1²2.jpg", "b①.jpg"]
    assert sorted(names, key=imagefiles.natural_key) == ["a1²2.jpg", "a2.jpg", "a10.jpg", "b①.jpg"]


def test_a_header_past_the_first_256_kib_is_found(tmp_path):
    """A phone's portrait JPEG carries its depth map in APP segments before the frame header:
    the folder check reads on instead of calling the photo corrupt."""
    jpeg = cv2.imencode(".jpg", _scene())[1].tobytes()
    app = b"\xff\xeb" + struct.pack(">H", 60002) + bytes(60000)  # APP11, 60 kB each
    path = tmp_path / "portrait.jpg"
    path.write_bytes(jpeg[:2] + app * 6 + jpeg[2:])
    header = imagefiles.read_image_header(path)
    assert (header.width, header.height) == (_scene().shape[1], _scene().shape[0])
    assert imagefiles.read_image_file(path).shape == _scene().shape
    (tmp_path / "short.jpg").write_bytes(jpeg[:2] + app)  # no frame header at all: still refused
    with pytest.raises(imagefiles.InvalidInputError):
        imagefiles.read_image_header(tmp_path / "short.jpg")


def test_a_png_labelled_sixteen_bits_keeps_one_scale():
    """sBIT 16 says full range: a dark frame stays dark (divided by 256) rather than being
    brightened by its own maximum, so frames of one stream share a scale."""
    dark = np.full((4, 4, 3), 1000, np.uint16)
    assert int(imagefiles.to_eight_bits(dark.copy(), 16)[0, 0, 0]) == 1000 >> 8
    assert int(imagefiles.to_eight_bits(dark.copy())[0, 0, 0]) == 1000 >> 2  # unlabelled: its own depth
    assert int(imagefiles.to_eight_bits(dark.copy(), judge=False)[0, 0, 0]) == 1000 >> 8  # the wire's: full range


def _resized_sof(jpeg: bytes, w: int, h: int) -> bytes:
    """``jpeg`` with its frame header (SOF0) claiming ``w`` x ``h``."""
    at = jpeg.index(b"\xff\xc0") + 5  # marker, length (2), precision (1): then height, width
    return jpeg[:at] + struct.pack(">HH", h, w) + jpeg[at + 4:]


def test_a_jpeg_whose_header_claims_more_than_its_scans_can_code_is_refused():
    """A few KB declaring 5760x5760 decoded for seconds (libjpeg filling in what was missing)
    and was answered with no boxes; a Huffman-coded scan needs at least a bit per 8x8 block.
    The flattest real frame (one grey) passes at its own size, with room to spare."""
    flat = cv2.imencode(".jpg", np.full((360, 640, 3), 128, np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 50])[1].tobytes()
    imagefiles.check_stream(flat, "jpeg")  # 4.3 KB in all where the bound asks 450 bytes of scans
    busy = cv2.imencode(".jpg", _scene(360, 640))[1].tobytes()
    imagefiles.check_stream(busy, "jpeg")
    with pytest.raises(InvalidInputError, match=r"image: corrupt JPEG \(\d+ bytes of scan data cannot code the "
                                                r"5760x5760 its header declares, which needs at least 64800\)"):
        imagefiles.check_stream(_resized_sof(busy, 5760, 5760), "jpeg")


#: 208 bytes written by ``cjpeg -arithmetic -quality 50`` from one grey 7680x4320 picture
_ARITHMETIC_GREY_8K = bytes.fromhex(
    "ffd8ffe000104a46494600010100000100010000ffdb004300100b0c0e0c0a100e0d0e1211101318281a181616183123"
    "251d283a333d3c3933383740485c4e404457453738506d51575f626768673e4d71797064785c656763ffdb004301111212"
    "1815182f1a1a2f634238426363636363636363636363636363636363636363636363636363636363636363636363636363"
    "636363636363636363636363ffc900110810e01e0003012200021101031101ffcc000a0010100501101105ffda000c0301"
    "0002110311003f001eb780ffd9")


def test_an_arithmetic_coded_jpeg_is_refused_since_its_bytes_cannot_bound_its_size(tmp_path):
    """Arithmetic coding spends far less than a bit on a flat block: 208 bytes decode to 33
    megapixels (OpenCV's libjpeg-turbo reads them), beyond any bound on scan bytes. No camera or
    encoder people use writes them, so they are refused with what to send instead."""
    assert len(_ARITHMETIC_GREY_8K) == 208
    decoded = cv2.imdecode(np.frombuffer(_ARITHMETIC_GREY_8K, np.uint8), cv2.IMREAD_COLOR)
    assert decoded is not None and decoded.shape == (4320, 7680, 3)  # a real file, not a made-up one
    with pytest.raises(InvalidInputError, match=r"image: arithmetic-coded JPEG \(SOF9\), which is not accepted: "
                                                r".*baseline or progressive \(Huffman-coded\) JPEG"):
        imagefiles.check_stream(_ARITHMETIC_GREY_8K, "jpeg")
    path = tmp_path / "grey.jpg"
    path.write_bytes(_ARITHMETIC_GREY_8K)
    with pytest.raises(InvalidInputError, match="arithmetic-coded JPEG"):
        imagefiles.read_image_file(path)


def _with_restarts(h: int = 64, w: int = 64) -> bytes:
    """A real JPEG with a restart marker after every MCU row (OpenCV's libjpeg writes them)."""
    ok, buf = cv2.imencode(".jpg", _scene(h, w), [cv2.IMWRITE_JPEG_RST_INTERVAL, 1])
    assert ok
    data = buf.tobytes()
    assert data.count(b"\xff\xd0") >= 2 and data.count(b"\xff\xd1") >= 1
    return data


def test_restart_markers_must_run_in_order() -> None:
    """RST0, RST1, ... RST7, RST0 (T.81 B.1.1.5): a real file with them passes, decodes; one with
    two swapped is refused naming the byte and the marker expected."""
    good = _with_restarts()
    imagefiles.check_stream(good, "jpeg")
    assert cv2.imdecode(np.frombuffer(good, np.uint8), cv2.IMREAD_COLOR) is not None
    first, second = good.index(b"\xff\xd0"), good.index(b"\xff\xd1")
    bad = bytearray(good)
    bad[first + 1], bad[second + 1] = 0xD1, 0xD0
    with pytest.raises(InvalidInputError, match=rf"corrupt JPEG \(restart marker RST1 at byte {first}, "
                                                r"expected RST0\)"):
        imagefiles.check_stream(bytes(bad), "jpeg")


@pytest.mark.parametrize("window", [3, 7, 1 << 20])
def test_restart_markers_are_followed_across_the_windows_they_are_checked_in(window: int, monkeypatch) -> None:
    """The scan is checked a window at a time (numpy's temporaries stay small): a marker split
    over two windows, and the count carried from one to the next, read as in one piece."""
    monkeypatch.setattr(imagefiles, "_RST_WINDOW", window)
    good = _with_restarts(128, 128)
    imagefiles.check_stream(good, "jpeg")
    last = [m.start() for m in re.finditer(rb"\xff[\xd0-\xd7]", good)][-1]
    bad = bytearray(good)
    bad[last + 1] = 0xD0 + (good[last + 1] - 0xD0 + 1) % 8
    with pytest.raises(InvalidInputError, match=rf"restart marker RST{bad[last + 1] - 0xD0} at byte {last}, "):
        imagefiles.check_stream(bytes(bad), "jpeg")


def test_a_few_fill_bytes_pass_where_a_real_encoder_could_write_them() -> None:
    """Fill bytes (0xFF) may precede any marker; a handful before the frame header and before
    the end of the scans is a valid file and passes the header walk and the stream check."""
    good = _with_restarts()
    sof = good.index(b"\xff\xc0")
    padded = good[:sof] + b"\xff" * 7 + good[sof:-2] + b"\xff" * 5 + b"\xff\xd9"
    assert imagefiles.jpeg_size(padded) == (64, 64)
    imagefiles.check_stream(padded, "jpeg")
    assert cv2.imdecode(np.frombuffer(padded, np.uint8), cv2.IMREAD_COLOR).shape == (64, 64, 3)


_SOF_320 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 240, 320, 1) + b"\x01\x11\x00"


@pytest.mark.parametrize("filler, message", [
    (b"\xff" * 600_000, "more than 1024 fill bytes at byte 2"),
    (b"\xff\xd0" * 300_000, "more than 4096 markers, at byte 8194"),  # standalone RSTs
    (b"\xff\xfe\x00\x02" * 150_000, "more than 4096 markers, at byte 16386"),  # empty comments
], ids=["fill", "restarts", "comments"])
def test_megabytes_of_markers_before_the_frame_are_refused(filler: bytes, message: str) -> None:
    """Fill bytes or empty segments before the frame header were walked in Python, a byte or a
    marker at a time, on the gateway's and the worker's event loops: 6 MB (6 KB gzip'd on the
    wire) held each for half a second per request (found by a probe). The walk now skips fill
    runs in C and stops at a bound no real file comes near."""
    data = b"\xff\xd8" + filler + _SOF_320 + b"\xff\xd9"
    for check in (lambda: imagefiles.jpeg_size(data), lambda: imagefiles.check_stream(data, "jpeg")):
        with pytest.raises(InvalidInputError, match=re.escape(f"corrupt JPEG ({message}")):
            check()


def test_a_jpeg_of_hundreds_of_scans_is_refused() -> None:
    """Each scan is one more walk here and one more pass in the decoder; libjpeg writes 10 for a
    progressive colour image."""
    ok, buf = cv2.imencode(".jpg", _scene(64, 64), [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    data = buf.tobytes()
    imagefiles.check_stream(data, "jpeg")
    sos = data.index(b"\xff\xda")
    seg = struct.unpack(">H", data[sos + 2:sos + 4])[0]
    scan = data[sos:data.index(b"\xff", sos + 2 + seg)]  # one SOS header and its scan data
    nobody = bytearray(scan)
    for k in range(scan[4]):  # its components are none of the frame's: it passes over no block
        nobody[5 + 2 * k] = 100 + k
    nobody = bytes(nobody)
    many = data[:sos] + nobody * (imagefiles.MAX_JPEG_SCANS + 1) + b"\xff\xd9"
    with pytest.raises(InvalidInputError, match=f"more than {imagefiles.MAX_JPEG_SCANS} scans"):
        imagefiles.check_stream(many, "jpeg")


def _sos_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each scan: its SOS segment and its entropy-coded data."""
    spans, i = [], 2
    while data[i + 1] != 0xD9:
        seg = struct.unpack(">H", data[i + 2:i + 4])[0]
        end = i + 2 + seg
        if data[i + 1] == 0xDA:
            end = data.index(b"\xff", end) if b"\xff" in data[end:] else len(data)
            while data[end + 1] in (0x00, 0xFF) or 0xD0 <= data[end + 1] <= 0xD7:
                end = data.index(b"\xff", end + 2)
            spans.append((i, end))
        i = end
    return spans


def test_a_progressive_jpeg_whose_scans_pass_over_its_blocks_too_often_is_refused() -> None:
    """A refinement scan repeated: 486 scans of a 7680x4320 grey image (155 KB, under the scan
    limit) took 10 s of a worker's decode thread, the same image in its own 6 scans 0.2 s (found by
    a probe). The decoder's time goes with the blocks each scan passes over; real encoders pass
    over them 1 to 6 times."""
    y, x = np.mgrid[0:256, 0:384]
    scene = np.stack([(x // 3) % 256, (y // 2) % 256, (x + y) % 256], -1).astype(np.uint8)
    variants = [[cv2.IMWRITE_JPEG_PROGRESSIVE, 1], []]
    if hasattr(cv2, "IMWRITE_JPEG_SAMPLING_FACTOR"):  # OpenCV 4.5.5 and later (not the Jetson lane's)
        variants.append([cv2.IMWRITE_JPEG_PROGRESSIVE, 1, cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
                         cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444])
    for flags in variants:
        for image in (scene, scene[:, :, 0]):
            ok, buf = cv2.imencode(".jpg", image, flags)
            imagefiles.check_stream(buf.tobytes(), "jpeg")  # real files, grey and colour: 1 to 6 passes
    ok, buf = cv2.imencode(".jpg", scene[:, :, 0], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    data = buf.tobytes()
    start, end = _sos_spans(data)[-1]  # the last refinement scan
    bomb = data[:end] + data[start:end] * 30 + b"\xff\xd9"
    with pytest.raises(InvalidInputError, match=re.escape(
            "corrupt JPEG (its first 17 scans pass over the 384x256 frame's blocks 17.0 times, more than 16: ")):
        imagefiles.check_stream(bomb, "jpeg")


def _png_chunk(kind: bytes, data: bytes = b"") -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_a_png_of_countless_chunks_is_refused_and_a_real_one_passes() -> None:
    """500,000 empty tEXt chunks (6 MB) took 0.3 s to walk and 0.9 s to decode in the worker's
    decode pool, libpng printing a warning line for each; empty image-data chunks cost the walk
    the same. A real PNG, its text chunks included, passes."""
    png = cv2.imencode(".png", _scene(360, 640))[1].tobytes()
    idat = png.index(b"IDAT") - 4
    texts = b"".join(_png_chunk(b"tEXt", b"k\x00v%d" % i) for i in range(20))
    real = png[:idat] + texts + png[idat:]
    imagefiles.check_stream(real, "png")
    assert cv2.imdecode(np.frombuffer(real, np.uint8), cv2.IMREAD_COLOR).shape == (360, 640, 3)
    for extra, message in ((_png_chunk(b"tEXt", b"k\x00v") * 257, "more than 256 ancillary chunks"),
                           (_png_chunk(b"IDAT") * 257, "more than 256 empty chunks")):
        with pytest.raises(InvalidInputError, match=rf"corrupt PNG \({message}, at byte \d+"):
            imagefiles.check_stream(png[:idat] + extra + png[idat:], "png")


def _png_file(h: int, w: int, chunks: list) -> bytes:
    """A greyscale PNG of ``h`` x ``w`` from its chunks after IHDR (IEND added)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return imagefiles.PNG_MAGIC + _png_chunk(b"IHDR", ihdr) + b"".join(chunks) + _png_chunk(b"IEND")


def test_real_pngs_of_many_chunks_pass() -> None:
    """An animated PNG (a frame control and a frame data chunk per frame, both ancillary by their
    names) and an encoder that writes one image-data chunk per row (a streaming one) are real
    files: they pass, and OpenCV decodes them (an APNG's default image)."""
    h, w = 64, 64
    rows = [b"\x00" + bytes([y * 3 % 256]) * w for y in range(h)]
    still = zlib.compress(b"".join(rows))
    frames = 300
    apng = [_png_chunk(b"acTL", struct.pack(">II", frames, 0))]
    for k in range(frames):
        fctl = struct.pack(">IIIIIHHBB", 2 * k, w, h, 0, 0, 1, 10, 0, 0)
        apng.append(_png_chunk(b"fcTL", fctl))
        apng.append(_png_chunk(b"IDAT", still) if k == 0 else
                    _png_chunk(b"fdAT", struct.pack(">I", 2 * k + 1) + still))
    animated = _png_file(h, w, apng)
    tall, z = [], zlib.compressobj()
    for y in range(10_000):  # one IDAT per row, each flushed
        tall.append(_png_chunk(b"IDAT", z.compress(b"\x00" + b"\x80" * w) + z.flush(zlib.Z_SYNC_FLUSH)))
    tall.append(_png_chunk(b"IDAT", z.flush()))
    streamed = _png_file(10_000, w, tall)
    for data, shape in ((animated, (h, w, 3)), (streamed, (10_000, w, 3))):
        imagefiles.check_stream(data, "png")
        assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).shape == shape


def test_the_marker_budget_holds_over_all_scans_and_the_fill_bound_is_exact() -> None:
    """The bound on markers was counted per scan: 500 scans of 1022 empty comments each (2 MB,
    3 KB gzip'd) passed in 0.2 s, as before the bound (found by a review). And 1024 fill bytes
    before a marker pass, 1025 do not."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 8, 8, 1) + b"\x01\x11\x00"
    sos = b"\xff\xda" + struct.pack(">HB", 8, 1) + b"\x01\x00\x00\x3f\x00"
    scan = b"\xff\xfe\x00\x02" * 1022 + sos + b"\x01"
    with pytest.raises(InvalidInputError, match="more than 4096 markers"):
        imagefiles.check_stream(b"\xff\xd8" + sof + scan * 500 + b"\xff\xd9", "jpeg")
    good = _with_restarts()
    at = good.index(b"\xff\xc0")
    assert imagefiles.jpeg_size(good[:at] + b"\xff" * 1024 + good[at:]) == (64, 64)
    with pytest.raises(InvalidInputError, match="more than 1024 fill bytes"):
        imagefiles.jpeg_size(good[:at] + b"\xff" * 1025 + good[at:])


def test_a_side_longer_than_the_decoder_takes_is_a_limit_not_corruption() -> None:
    """A 1000001x1 PNG is within the pixel limit, but libpng refuses a side over 1,000,000: it
    was called "corrupt PNG (it does not decode to ...)" (found by a probe). A RAW payload has no
    decoder, and keeps to the pixel limit."""
    def grey_png(w: int) -> bytes:  # by hand: OpenCV does not write such a PNG
        ihdr = struct.pack(">IIBBBBB", w, 1, 8, 0, 0, 0, 0)
        return (imagefiles.PNG_MAGIC + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(bytes(w + 1)))
                + _png_chunk(b"IEND"))

    data = grey_png(1_000_001)
    header = imagefiles.image_header(data, "wide.png")
    with pytest.raises(imagefiles.ImageLimitError,
                       match=r"wide: PNG declares 1000001x1, a side longer than the 1000000 pixels its decoder takes"):
        imagefiles.check_pixels(header, imagefiles.DEFAULT_MAX_PIXELS, "wide")
    raw = imagefiles.ImageHeader("raw", 1_048_577, 1)
    assert imagefiles.check_pixels(raw, imagefiles.DEFAULT_MAX_PIXELS) is raw  # no decoder, no side limit
    ok = grey_png(1_000_000)
    assert imagefiles.decode_checked(ok, imagefiles.check_pixels(imagefiles.image_header(ok), 1 << 25)).shape == \
        (1, 1_000_000, 3)
