"""The one image check: the declared size of an encoded image from its header, before decoding.

A decoder allocates what the header declares: an 8x8 JPEG whose frame header says
30000x30000 costs gigabytes before the first pixel is read. ``image_header`` reads
only headers (JPEG: the segment lengths up to the frame header, ITU-T T.81 section B.2;
PNG: IHDR, RFC 2083 section 4.1.1; BMP, PNM, WebP (RFC 9649 section 2.5-2.7), TIFF 6.0 baseline),
so a bomb costs nothing; ``check_pixels`` applies the limit. ``check_stream`` walks
the whole file for structural damage a decoder would paper over: a JPEG must be one
well-formed marker sequence ending in EOI (scan data may only contain stuffed
``FF00`` and restart markers in sequence), a PNG's chunks must all pass their
CRC-32 and end with IEND. JPEG has no checksum (T.81), so a bit flip inside the
entropy-coded data that keeps that structure decodes to a damaged picture that no
decoder can tell from a real one. ``read_image_file`` does all of it for a file.

Used by the wire codec (``edgewise.wire.check_image`` / ``decode_image``: gateway
admission, worker) and by every edge source that decodes image files.
"""

from __future__ import annotations

import os
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple, Union

import cv2
import numpy as np

from edgewise.errors import InvalidInputError

#: What the header readers accept: the bytes of a file, or a zero-copy view of them (the
#: gateway reads an image's header inside the request it forwards, without copying it out).
Buffer = Union[bytes, memoryview]

#: Default limits for decoded images: 8K UHD frames pass, decompression bombs do not.
DEFAULT_MAX_PIXELS = 7680 * 4320
DEFAULT_MAX_BYTES = 32 * 1024 * 1024

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8"
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, 0xD8} | set(range(0xD0, 0xD8))  # TEM, SOI, RST0-7: no length field


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header declares."""

    encoding: str  # jpeg | png | bmp | pnm | webp | tiff | raw
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def sniff(data: Buffer) -> Optional[str]:
    """The format named by the magic bytes, or None."""
    if data[:2] == JPEG_MAGIC:
        return "jpeg"
    if data[:8] == PNG_MAGIC:
        return "png"
    if data[:2] == b"BM":
        return "bmp"
    if data[:1] == b"P" and data[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6"):
        return "pnm"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


def image_header(data: Buffer, what: str = "image") -> ImageHeader:
    """Format and declared size from the header only; InvalidInputError naming ``what``."""
    fmt = sniff(data)
    if fmt is None:
        raise InvalidInputError(f"{what}: not an image this build reads (JPEG, PNG, BMP, PNM, WebP, TIFF)")
    try:
        w, h = jpeg_size(data, what) if fmt == "jpeg" else png_size(data, what) if fmt == "png" \
            else _READERS[fmt](bytes(data))
    except InvalidInputError:
        raise
    except (struct.error, IndexError, ValueError, KeyError):
        raise InvalidInputError(f"{what}: truncated or corrupt {fmt.upper()} header") from None
    return ImageHeader(fmt, int(w), int(h))


def check_pixels(header: ImageHeader, max_pixels: int, what: str = "image") -> ImageHeader:
    """Refuse an empty declared size or one over ``max_pixels`` (before any decoding)."""
    w, h = header.width, header.height
    if w <= 0 or h <= 0:
        raise InvalidInputError(f"{what}: {header.encoding.upper()} declares an empty size {w}x{h}")
    if w * h > max_pixels:
        raise InvalidInputError(
            f"{what}: {header.encoding.upper()} declares {w}x{h} = {w * h} pixels, over the limit "
            f"of {max_pixels}; send a smaller frame or a crop")
    return header


def png_size(data: Buffer, what: str = "image.data") -> Tuple[int, int]:
    """``(width, height)`` from a PNG's IHDR chunk."""
    if len(data) < 24 or data[:8] != PNG_MAGIC or data[12:16] != b"IHDR":
        raise InvalidInputError(f"{what}: not a PNG (bad signature or missing IHDR header)")
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def jpeg_size(data: Buffer, what: str = "image.data") -> Tuple[int, int]:
    """``(width, height)`` from a JPEG's start-of-frame marker (walks the segment headers)."""
    if data[:2] != JPEG_MAGIC:
        raise InvalidInputError(f"{what}: not a JPEG (missing SOI marker FFD8)")
    for marker, start, _end in _jpeg_segments(data, 2, what):
        if marker in _SOF:
            if start + 5 > len(data):
                break
            h, w = struct.unpack(">HH", data[start + 1 : start + 5])  # after the sample precision
            return int(w), int(h)
        if marker == 0xDA:  # start of scan before a frame header
            break
    raise InvalidInputError(f"{what}: corrupt or truncated JPEG (no frame header found)")


def _jpeg_segments(data: Buffer, i: int, what: str) -> Iterator[Tuple[int, int, int]]:
    """Yield ``(marker, payload_start, payload_end)`` of the header segments from byte ``i``
    up to and including SOS (whose scan data is not walked)."""
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise InvalidInputError(f"{what}: corrupt JPEG (bad marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _STANDALONE:
            i += 2
            continue
        seglen = struct.unpack(">H", data[i + 2 : i + 4])[0]
        if seglen < 2:
            raise InvalidInputError(f"{what}: corrupt JPEG (segment length {seglen} at byte {i})")
        yield marker, i + 4, i + 2 + seglen
        if marker == 0xDA:
            return
        i += 2 + seglen


def _bmp_size(d: bytes) -> Tuple[int, int]:
    w, h = struct.unpack("<ii", d[18:26])
    return w, abs(h)  # a negative height is a top-down bitmap


def _pnm_size(d: bytes) -> Tuple[int, int]:
    tokens: List[int] = []
    i = 2
    head = d[:1024]
    while len(tokens) < 2:
        while i < len(head) and head[i:i + 1].isspace():
            i += 1
        if head[i:i + 1] == b"#":  # comment to the end of the line
            while i < len(head) and head[i:i + 1] not in (b"\n", b"\r"):
                i += 1
            continue
        j = i
        while j < len(head) and head[j:j + 1].isdigit():
            j += 1
        if j == i:
            raise ValueError("no size in PNM header")
        tokens.append(int(head[i:j]))
        i = j
    return tokens[0], tokens[1]


def _webp_size(d: bytes) -> Tuple[int, int]:
    kind = d[12:16]
    if kind == b"VP8 ":
        if d[23:26] != b"\x9d\x01\x2a":
            raise ValueError("bad VP8 start code")
        w, h = struct.unpack("<HH", d[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if kind == b"VP8L":
        if d[20] != 0x2F:
            raise ValueError("bad VP8L signature")
        bits = struct.unpack("<I", d[21:25])[0]
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if kind == b"VP8X":
        return 1 + int.from_bytes(d[24:27], "little"), 1 + int.from_bytes(d[27:30], "little")
    raise ValueError("unknown WebP chunk")


def _tiff_size(d: bytes) -> Tuple[int, int]:
    end = "<" if d[:2] == b"II" else ">"
    (ifd,) = struct.unpack(end + "I", d[4:8])
    (count,) = struct.unpack(end + "H", d[ifd:ifd + 2])
    size = {}
    for k in range(count):
        e = ifd + 2 + 12 * k
        tag, typ = struct.unpack(end + "HH", d[e:e + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT (3) or LONG (4)
            fmt = end + ("H" if typ == 3 else "I")
            size[tag] = struct.unpack(fmt, d[e + 8:e + 8 + struct.calcsize(fmt)])[0]
    return size[256], size[257]


_READERS = {"bmp": _bmp_size, "pnm": _pnm_size, "webp": _webp_size, "tiff": _tiff_size}


def check_stream(data: bytes, fmt: str, what: str = "image") -> None:
    """Walk the whole JPEG or PNG for structural damage (see the module docstring);
    other formats are left to their decoder."""
    if fmt == "jpeg":
        _check_jpeg(data, what)
    elif fmt == "png":
        _check_png(data, what)


def _check_jpeg(data: bytes, what: str) -> None:
    i, frame = 2, False
    while True:
        last = None
        for marker, start, end in _jpeg_segments(data, i, what):
            if end > len(data):
                raise InvalidInputError(f"{what}: truncated JPEG (segment at byte {start - 4} runs past the end)")
            frame = frame or marker in _SOF
            last, i = marker, end
        if last != 0xDA:  # no further scan: what follows must be EOI
            break
        if not frame:
            raise InvalidInputError(f"{what}: corrupt JPEG (scan before a frame header)")
        i = _scan_data_end(data, i, what)
        if data[i + 1] == 0xD9:
            return
    if not (frame and data[i:i + 2] == b"\xff\xd9"):
        raise InvalidInputError(f"{what}: truncated or corrupt JPEG (no end-of-image marker FFD9 after the scans)")


def _scan_data_end(data: bytes, i: int, what: str) -> int:
    """Index of the marker that ends entropy-coded data starting at ``i`` (T.81 section B.1.1.5)."""
    rst = 0
    while True:
        j = data.find(b"\xff", i)
        if j < 0 or j + 1 >= len(data):
            raise InvalidInputError(f"{what}: truncated JPEG (scan data ends without a marker)")
        nxt = data[j + 1]
        if nxt == 0x00 or nxt == 0xFF:  # stuffed byte, fill byte
            i = j + (2 if nxt == 0x00 else 1)
            continue
        if 0xD0 <= nxt <= 0xD7:
            if nxt - 0xD0 != rst:
                raise InvalidInputError(
                    f"{what}: corrupt JPEG (restart marker RST{nxt - 0xD0} at byte {j}, expected RST{rst})")
            rst = (rst + 1) % 8
            i = j + 2
            continue
        return j


def _check_png(data: bytes, what: str) -> None:
    i, n = 8, len(data)
    while i + 12 <= n:
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        end = i + 12 + length
        if end > n:
            break
        if zlib.crc32(data[i + 4:end - 4]) != struct.unpack(">I", data[end - 4:end])[0]:
            raise InvalidInputError(f"{what}: corrupt PNG (CRC mismatch in chunk {kind!r} at byte {i})")
        if kind == b"IEND":
            return
        i = end
    raise InvalidInputError(f"{what}: truncated PNG (no IEND chunk)")


def decode_checked(data: bytes, header: ImageHeader, what: str = "image") -> np.ndarray:
    """Decode to BGR uint8 HxWx3 once the header passed; the result must have the declared size.

    A JPEG's EXIF orientation is ignored: the pixels are the stored ones, as the header,
    crop offsets, tiles and the boxes of an answer count them (OpenCV would rotate a
    portrait photo, which then no longer matched its header, and turn boxes of orientation
    3 upside down, silently).
    """
    out = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    if out is None or out.ndim != 3 or out.shape[:2] != (header.height, header.width):
        raise InvalidInputError(f"{what}: corrupt {header.encoding.upper()} (it does not decode to the "
                                f"{header.width}x{header.height} its header declares)")
    return out


def read_image_file(path: Union[str, os.PathLike[str]], max_pixels: int = DEFAULT_MAX_PIXELS,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> np.ndarray:
    """Read, check (size, header, pixel limit, structure) and decode an image file to BGR.

    Every failure is an ``InvalidInputError`` naming the file; a decompression bomb is
    refused after reading its header, before any pixel memory is allocated.
    """
    what = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; only a
        # regular file is read
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidInputError(f"{what}: not a regular file (a FIFO, socket or device); skipped")
            if st.st_size > max_bytes:
                raise InvalidInputError(f"{what}: {st.st_size} bytes, over the limit of {max_bytes} bytes")
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInputError(f"{what}: cannot read: {exc.strerror or exc}") from None
    if not data:
        raise InvalidInputError(f"{what}: empty file")
    header = check_pixels(image_header(data, what), max_pixels, what)
    check_stream(data, header.encoding, what)
    return decode_checked(data, header, what)
