"""The one image check: the declared size of an encoded image from its header, before decoding.

A decoder allocates what the header declares: an 8x8 JPEG whose frame header says
30000x30000 costs gigabytes before the first pixel is read. ``image_header`` reads
only headers (JPEG: the segment lengths up to the frame header, ITU-T T.81 section B.2;
PNG: IHDR, RFC 2083 section 4.1.1; BMP, PNM, WebP (RFC 9649 section 2.5-2.7), TIFF 6.0 baseline),
so a bomb costs nothing; ``check_pixels`` applies the limit. ``check_stream`` walks
the whole file for structural damage a decoder would paper over: a JPEG must be one
well-formed marker sequence ending in EOI (scan data may only contain stuffed
``FF00`` and restart markers in sequence), Huffman-coded (arithmetic coding is refused),
whose scans hold at least a bit per 8x8 block of the size its header declares and pass over
those blocks at most ``MAX_BLOCK_PASSES`` times, a PNG's chunks must all pass their
CRC-32 and end with IEND. JPEG has no checksum (T.81), so a bit flip inside the
entropy-coded data that keeps that structure decodes to a damaged picture that no
decoder can tell from a real one (and libjpeg's warning for scan data that ends early, "premature
end of data segment", does not reach OpenCV's caller: such a file is decoded, the missing part
filled in). ``read_image_file`` does all of it for a file, and
then turns the picture upright as its EXIF orientation says (a phone photo of
orientation 6 is stored sideways): files on disk are shown as their viewers show them,
while payloads on the wire (``decode_checked``) keep their stored pixels. A 16-bit
PNG is scaled to 8 bits by the depth its sBIT chunk gives (a 12-bit sensor's data is not
divided by 256); without one, a file (and a TIFF) by the depth it uses, a frame on the wire as
full range. The byte limit of a file follows from the pixel limit
(``file_byte_limit``); a file refused by a limit raises ``ImageLimitError``, which
says which limit and what to do, never that the file is corrupt. ``shown`` escapes a
path for a message (a newline in a file name cannot forge a log line).

Used by the wire codec (``edgewise.wire.check_image`` / ``decode_image``: gateway
admission, worker) and by every edge source that decodes image files.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple, Union

import cv2
import numpy as np

from edgewise.errors import InvalidInputError

#: What the header readers accept: the bytes of a file, or a zero-copy view of them (the
#: gateway reads an image's header inside the request it forwards, without copying it out).
Buffer = Union[bytes, bytearray, memoryview]

#: Default limits for decoded images: 8K UHD frames pass, decompression bombs do not.
DEFAULT_MAX_PIXELS = 7680 * 4320
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
"""The byte limit of a payload on the wire (``edgewise.wire``); files use ``file_byte_limit``."""
#: Bytes per pixel a file may take: 16-bit samples, 4 channels, uncompressed.
FILE_BYTES_PER_PIXEL = 8
#: Bytes a file may take beyond its pixels: headers, EXIF, ICC profiles, thumbnails.
FILE_HEADROOM_BYTES = 16 * 1024 * 1024


class ImageLimitError(InvalidInputError):
    """An image refused by a limit (pixels, bytes), not because it is damaged."""


#: File name endings read as images (folder sources, calibration folders); case-insensitive.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".pgm", ".ppm")


def dataset_hint(folder: Union[str, os.PathLike[str]]) -> str:
    """For a folder without images: ``"; it looks like a dataset folder: its images are in
    FOLDER/images"`` when that subfolder holds images (an ``edgewise synth`` dataset, YOLO's
    layout), else ``""``. The folder a user passes is often the dataset's, not its images'."""
    sub = os.path.join(os.fspath(folder), "images")
    try:
        names = os.listdir(sub)
    except OSError:
        return ""
    if any(n.lower().endswith(IMAGE_SUFFIXES) for n in names):
        return f"; it looks like a dataset folder: its images are in {sub}"
    return ""


#: Failed reads in a row that end a video before the frame count its header states (see
#: ``video_ended``): the edge daemon's and the calibration reader's rule.
VIDEO_FAIL_RUN_LIMIT = 1000


def video_ended(count: int, pos: int, run: int) -> bool:
    """Whether a video has ended after ``run`` failed reads in a row, ``pos`` frames read or
    failed so far, when its header states ``count`` frames (0: unknown).

    Before the stated count a failed read is one unreadable frame and reading goes on: a
    corrupt stretch in the middle is read past (its frames are counted as corrupt once a
    later one decodes). OpenCV's position (``CAP_PROP_POS_FRAMES``) counts decoded frames
    only, so whether a failed read moved on shows only when a later frame decodes; the run
    is bounded instead by the count and by ``VIDEO_FAIL_RUN_LIMIT``: a read at the real end
    of a file fails in microseconds, so a count far past it (a cut copy, a wrong header)
    costs at most that many quick reads per pass. Past the count, or without one, the
    first failed read ends the video."""
    return not (count > 0 and pos < count and run < VIDEO_FAIL_RUN_LIMIT)


def file_byte_limit(max_pixels: int) -> int:
    """The byte limit of an image file with at most ``max_pixels`` pixels: any uncompressed
    16-bit 4-channel image of that size fits (an 8K TIFF is 100 MB), a bigger file is no image
    the pixel limit would pass."""
    return max_pixels * FILE_BYTES_PER_PIXEL + FILE_HEADROOM_BYTES


def natural_key(name: str) -> Tuple[object, ...]:
    """Sort key for file names: digit runs compare as numbers (``frame2`` before ``frame10``)."""
    parts = re.split(r"(\d+)", name)
    # isdecimal is what \d matches (isdigit also takes '²', which int() refuses)
    return tuple((0, int(t), t) if t.isdecimal() else (1, 0, t.lower()) for t in parts) + (name,)


def hidden(name: str) -> bool:
    """A hidden file (``.name``), macOS AppleDouble twins (``._IMG_0001.jpg``) included:
    never an image to read."""
    return name.startswith(".")


def shown(path: Union[str, os.PathLike[str]]) -> str:
    """``path`` for a message: control characters (a newline that would start a forged
    log line), and bytes that are not text, escaped as Python writes them."""
    text = os.fspath(path)
    if isinstance(text, bytes):  # pragma: no cover - paths here are str
        text = text.decode("utf-8", "surrogateescape")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

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


#: The longest side each format's decoder takes (libpng's default user limit, libjpeg's
#: JPEG_MAX_DIMENSION, WebP's 14-bit sizes, OpenCV's CV_IO_MAX_IMAGE_WIDTH for the others): a
#: 1000001x1 PNG within the pixel limit failed to decode and was called corrupt.
MAX_SIDE = {"png": 1_000_000, "jpeg": 65_500, "webp": 16_383}
MAX_SIDE_OTHER = 1 << 20


#: What to do about an image over a limit: a sender's (the gateway's, a worker's) default,
#: and the advice for an image file on disk (a folder source, a calibration set).
FRAME_ADVICE = "send a smaller frame or a crop"
FILE_ADVICE = "shrink or crop the image file"


def check_pixels(header: ImageHeader, max_pixels: int, what: str = "image",
                 advice: str = FRAME_ADVICE) -> ImageHeader:
    """Refuse an empty declared size, one over ``max_pixels``, or a side longer than the format's
    decoder takes (:data:`MAX_SIDE`), before any decoding; ``advice`` ends the message of a
    refusal by a limit (``FRAME_ADVICE`` for a sender, ``FILE_ADVICE`` for a file on disk)."""
    w, h = header.width, header.height
    fmt = header.encoding.upper()
    if w <= 0 or h <= 0:
        raise InvalidInputError(f"{what}: {fmt} declares an empty size {w}x{h}")
    if w * h > max_pixels:
        raise ImageLimitError(
            f"{what}: {fmt} declares {w}x{h} = {w * h} pixels, over the limit "
            f"of {max_pixels}; {advice}")
    side = MAX_SIDE.get(header.encoding, MAX_SIDE_OTHER)
    if max(w, h) > side and header.encoding != "raw":  # RAW has no decoder: the pixel limit alone
        raise ImageLimitError(f"{what}: {fmt} declares {w}x{h}, a side longer than the {side} pixels its "
                              f"decoder takes; {advice}")
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


#: The first byte that is not a fill byte (0xFF), found in C: a run of fill bytes, which may
#: precede any marker (T.81 section B.1.1.2), was walked a byte at a time in Python.
_NOT_FILL = re.compile(rb"[^\xff]")
#: Fill bytes in a row before a header marker: T.81 sets no bound, encoders write a few at most.
MAX_FILL_RUN = 1024
#: Markers (segments and standalone ones) in one JPEG's headers, all scans together: a real file
#: has a few dozen (APPn, DQT, DHT, an ICC profile in up to 255 pieces, a few per progressive
#: scan); megabytes of empty segments held the gateway's event loop half a second.
MAX_JPEG_MARKERS = 4096
#: Scans one JPEG may have: libjpeg writes 10 for a progressive colour image, and each scan is
#: a walk here and a pass in the decoder (libjpeg-turbo advises a limit of 500 against
#: files of many tiny scans, its security advisory of 2018 on progressive JPEGs).
MAX_JPEG_SCANS = 500
#: Passes one JPEG's scans may make over the 8x8 blocks of its frame (each scan passes over the
#: blocks of the components it codes): libjpeg's progressive scripts make 4 to 6, a sequential
#: JPEG 1. The decoder spends time on every block of every scan, coded or not, so 486 scans of
#: one 7680x4320 grey image (155 KB, each scan a repeated refinement) took 10 s to decode where
#: the same image in its own 6 scans took 0.2 s, and the scan count alone did not bound it.
MAX_BLOCK_PASSES = 16


class _MarkerBudget:
    """What is left of ``MAX_JPEG_MARKERS`` for one file's walk, over all its scans."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_JPEG_MARKERS


def _jpeg_segments(data: Buffer, i: int, what: str,
                   budget: Optional[_MarkerBudget] = None) -> Iterator[Tuple[int, int, int]]:
    """Yield ``(marker, payload_start, payload_end)`` of the header segments from byte ``i``
    up to and including SOS (whose scan data is not walked), spending ``budget`` (a new one
    when None)."""
    n = len(data)
    budget = budget or _MarkerBudget()
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise InvalidInputError(f"{what}: corrupt JPEG (bad marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:  # fill bytes: to the last one before the marker
            found = _NOT_FILL.search(data, i + 1, i + 2 + MAX_FILL_RUN)
            if found is None:
                if i + 2 + MAX_FILL_RUN < n:
                    raise InvalidInputError(f"{what}: corrupt JPEG (more than {MAX_FILL_RUN} fill bytes at byte {i})")
                return
            i = found.start() - 1
            continue
        budget.left -= 1
        if budget.left < 0:
            raise InvalidInputError(f"{what}: corrupt JPEG (more than {MAX_JPEG_MARKERS} markers, at byte {i}; a "
                                    "real JPEG has a few dozen)")
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


#: Huffman-coded frames (baseline, extended, progressive, lossless): every 8x8 block of a
#: component gets at least one Huffman code (its DC difference) in some scan, one bit or more
_HUFFMAN_SOF = {0xC0, 0xC1, 0xC2, 0xC3}
#: Arithmetic-coded frames (T.81 table B.1: SOF9-11, SOF13-15). Their coder spends far less than
#: a bit on a flat block, so no size of scan data bounds the frame they declare: 208 bytes of
#: one grey decode to 7680x4320 (libjpeg-turbo decodes them, `cjpeg -arithmetic` writes them).
#: Cameras, browsers and OpenCV write Huffman JPEGs only, so they are refused, not bounded.
_ARITHMETIC_SOF = _SOF - _HUFFMAN_SOF - {0xC5, 0xC6, 0xC7}


def _component_blocks(data: bytes, start: int, end: int, w: int, h: int) -> Dict[int, int]:
    """Component id -> its 8x8 blocks, from a frame header's payload ``data[start:end]`` and the
    frame's size (T.81 section A.1.1: a component is the frame scaled by its sampling factors
    over the largest ones); empty when the header is too short to say."""
    count = data[start + 5] if start + 6 <= end else 0
    comps = [(data[k], data[k + 1] >> 4, data[k + 1] & 15) for k in range(start + 6, start + 6 + 3 * count, 3)]
    if not comps or start + 6 + 3 * count > end:
        return {}
    hmax, vmax = max(max(c[1] for c in comps), 1), max(max(c[2] for c in comps), 1)

    def ceil(a: int, b: int) -> int:
        return -(-a // b)
    return {cid: ceil(ceil(w * hs, hmax), 8) * ceil(ceil(h * vs, vmax), 8) for cid, hs, vs in comps}


def _check_jpeg(data: bytes, what: str) -> None:
    i, frame, scanned, scans = 2, (0, 0, 0), 0, 0
    blocks: Dict[int, int] = {}  # of the frame's components
    passed = 0  # blocks the scans so far pass over
    budget = _MarkerBudget()
    while True:
        last = None
        for marker, start, end in _jpeg_segments(data, i, what, budget):
            if end > len(data):
                raise InvalidInputError(f"{what}: truncated JPEG (segment at byte {start - 4} runs past the end)")
            if marker in _ARITHMETIC_SOF:
                raise InvalidInputError(f"{what}: arithmetic-coded JPEG (SOF{marker - 0xC0}), which is not "
                                        "accepted: its size cannot be bounded by its bytes; encode it as a "
                                        "baseline or progressive (Huffman-coded) JPEG")
            if marker in _SOF and not frame[0] and start + 5 <= len(data):
                h, w = struct.unpack(">HH", data[start + 1 : start + 5])
                frame = (marker, w, h)
                blocks = _component_blocks(data, start, end, w, h)
            if marker == 0xDA and start < end:
                passed += sum(blocks.get(data[k], 0) for k in range(start + 1, min(end, start + 1 + 2 * data[start]), 2))
            last, i = marker, end
        if last != 0xDA:  # no further scan: what follows must be EOI
            break
        if not frame[0]:
            raise InvalidInputError(f"{what}: corrupt JPEG (scan before a frame header)")
        scans += 1
        if scans > MAX_JPEG_SCANS:
            raise InvalidInputError(f"{what}: corrupt JPEG (more than {MAX_JPEG_SCANS} scans; a real JPEG has at "
                                    "most a few dozen)")
        if passed > MAX_BLOCK_PASSES * sum(blocks.values()):
            raise InvalidInputError(f"{what}: corrupt JPEG (its first {scans} scans pass over the {frame[1]}x"
                                    f"{frame[2]} frame's blocks {passed / sum(blocks.values()):.1f} times, more than "
                                    f"{MAX_BLOCK_PASSES}: a real JPEG's scans pass over them 1 to 6 times, and each "
                                    "pass costs decoding time); re-encode it")
        begin, i = i, _scan_data_end(data, i, what)
        scanned += i - begin
        if data[i + 1] == 0xD9:
            _check_jpeg_scans(frame, scanned, what)
            return
    if not (frame[0] and data[i:i + 2] == b"\xff\xd9"):
        raise InvalidInputError(f"{what}: truncated or corrupt JPEG (no end-of-image marker FFD9 after the scans)")
    _check_jpeg_scans(frame, scanned, what)


def _check_jpeg_scans(frame: Tuple[int, int, int], scanned: int, what: str) -> None:
    """A Huffman-coded frame's scans must hold at least one bit per 8x8 block of its size: a
    JPEG whose header claims a larger frame than its data codes (a few KB declaring 5760x5760)
    decoded for seconds, libjpeg filling in what was missing, and was answered with no boxes.
    (Hierarchical frames, SOF5-7, are not bounded here: libjpeg refuses to decode them.)"""
    marker, w, h = frame
    need = -(-w // 8) * -(-h // 8) // 8
    if marker in _HUFFMAN_SOF and scanned < need:
        raise InvalidInputError(f"{what}: corrupt JPEG ({scanned} bytes of scan data cannot code the {w}x{h} its "
                                f"header declares, which needs at least {need}); the header or the data is wrong")


#: The marker that ends entropy-coded data: 0xFF followed by neither a stuffed 0x00, a fill
#: byte nor a restart marker (T.81 section B.1.1.5), found in C.
_SCAN_END = re.compile(rb"\xff[^\x00\xff\xd0-\xd7]")


#: Bytes of scan data checked for restart markers at a time: numpy's temporaries stay small.
_RST_WINDOW = 1 << 20


def _scan_data_end(data: bytes, i: int, what: str) -> int:
    """Index of the marker that ends entropy-coded data starting at ``i``, its restart markers
    checked to run RST0, RST1, ... RST7, RST0, ... Both in C or numpy: megabytes of stuffed or
    fill bytes took a second a scan in a Python loop."""
    found = _SCAN_END.search(data, i)
    if found is None:
        raise InvalidInputError(f"{what}: truncated JPEG (scan data ends without a marker)")
    end = found.start()
    seen = 0  # restart markers so far in this scan
    for start in range(i, end, _RST_WINDOW):  # each window and the byte after it (the end's 0xFF at most)
        stop = min(start + _RST_WINDOW, end)
        scan = np.frombuffer(data, np.uint8, count=stop - start + 1, offset=start)
        at = np.flatnonzero(scan[:-1] == 0xFF)
        at = at[(scan[at + 1] & 0xF8) == 0xD0]
        if len(at):
            got = scan[at + 1] - 0xD0
            wrong = np.flatnonzero(got != (np.arange(len(got)) + seen) % 8)
            if len(wrong):
                k = int(wrong[0])
                raise InvalidInputError(f"{what}: corrupt JPEG (restart marker RST{int(got[k])} at byte "
                                        f"{start + int(at[k])}, expected RST{(seen + k) % 8})")
            seen += len(got)
    return end


#: Ancillary chunks (tEXt, pHYs, iCCP, ...: a lower-case first letter) a PNG may have, the
#: frames of an animated PNG aside; and empty chunks (IEND aside): real files have a handful
#: of the one and none of the other. 500,000 empty tEXt chunks (6 MB) took 0.3 s to walk here
#: and 0.9 s to decode, libpng printing a warning for each.
MAX_PNG_ANCILLARY = 256
MAX_PNG_EMPTY = 256
#: An animated PNG's chunks (APNG): a frame each, besides its image data.
_APNG = {b"acTL", b"fcTL", b"fdAT"}


def _check_png(data: bytes, what: str) -> None:
    i, n = 8, len(data)
    ancillary = empty = 0
    while i + 12 <= n:
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        end = i + 12 + length
        if end > n:
            break
        if kind[0] >= 0x61 and kind not in _APNG:  # a lower-case first letter: ancillary (PNG spec 5.4)
            ancillary += 1
            if ancillary > MAX_PNG_ANCILLARY:
                raise InvalidInputError(f"{what}: corrupt PNG (more than {MAX_PNG_ANCILLARY} ancillary chunks, at "
                                        f"byte {i}; a real PNG has a handful)")
        if not length and kind != b"IEND":
            empty += 1
            if empty > MAX_PNG_EMPTY:
                raise InvalidInputError(f"{what}: corrupt PNG (more than {MAX_PNG_EMPTY} empty chunks, at byte {i})")
        if zlib.crc32(data[i + 4:end - 4]) != struct.unpack(">I", data[end - 4:end])[0]:
            raise InvalidInputError(f"{what}: corrupt PNG (CRC mismatch in chunk {kind!r} at byte {i})")
        if kind == b"IEND":
            return
        i = end
    raise InvalidInputError(f"{what}: truncated PNG (no IEND chunk)")


def decode_checked(data: Buffer, header: ImageHeader, what: str = "image", judge_depth: bool = False) -> np.ndarray:
    """Decode to BGR uint8 HxWx3 once the header passed; the result must have the declared size.

    A JPEG's EXIF orientation is ignored: the pixels are the stored ones, as the header,
    crop offsets, tiles and the boxes of an answer count them (OpenCV would rotate a
    portrait photo, which then no longer matched its header, and turn boxes of orientation
    3 upside down, silently).

    A 16-bit PNG or TIFF is scaled to 8 bits by its sBIT chunk (``to_eight_bits``; OpenCV
    divided by 256 whatever it said, which left a 12-bit camera's frame sent on the wire nearly
    black), and without one as full range, or with ``judge_depth`` (files) by the depth the
    image uses.
    """
    sixteen = _sixteen_bit(data, header.encoding)
    flags = (cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR if sixteen else cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION
    out = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    if out is None or out.shape[:2] != (header.height, header.width) or (out.ndim != 3 and not sixteen):
        raise InvalidInputError(f"{what}: corrupt {header.encoding.upper()} (it does not decode to the "
                                f"{header.width}x{header.height} its header declares)")
    if sixteen:
        if out.dtype == np.uint16:
            out = to_eight_bits(out, _png_sbit(data) if header.encoding == "png" else 0, judge_depth)
        if out.ndim == 3 and out.shape[2] == 2:
            out = out[:, :, 0]
        if out.ndim == 2:
            out = cv2.cvtColor(out, cv2.COLOR_GRAY2BGR)
        elif out.shape[2] == 4:
            out = cv2.cvtColor(out, cv2.COLOR_BGRA2BGR)
    return out


_TIFF_ORIENTATION = 274
_TIFF_BITS = 258
_TIFF_TYPE_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 6: 1, 7: 1, 8: 2, 9: 4}


def _ifd0(tiff: Buffer) -> Dict[int, Tuple[int, int, int]]:
    """IFD0 of a TIFF structure (a TIFF file, or an EXIF block) as ``{tag: (value, count,
    offset of the value field)}``; a SHORT or LONG value in the field, else the field itself."""
    end = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack(end + "I", tiff[4:8])
    (count,) = struct.unpack(end + "H", tiff[ifd:ifd + 2])
    out: Dict[int, Tuple[int, int, int]] = {}
    for k in range(count):
        e = ifd + 2 + 12 * k
        tag, typ, n = struct.unpack(end + "HHI", tiff[e:e + 8])
        size = _TIFF_TYPE_SIZE.get(typ, 4) * n
        if typ in (3, 4) and size <= 4:
            fmt = end + ("H" if typ == 3 else "I")
            out[tag] = (struct.unpack(fmt, tiff[e + 8:e + 8 + struct.calcsize(fmt)])[0], n, e + 8)
        else:
            out[tag] = (struct.unpack(end + "I", tiff[e + 8:e + 12])[0], n, e + 8)
    return out


def _exif_block(data: Buffer, fmt: str) -> Tuple[int, Optional[Buffer]]:
    """Where a file's EXIF (TIFF-structured) block starts, and the block; None if it has none."""
    if fmt == "tiff":
        return 0, data
    if fmt == "jpeg":
        for marker, start, end in _jpeg_segments(data, 2, "image"):
            if marker == 0xE1 and bytes(data[start:start + 6]) == b"Exif\x00\x00":
                return start + 6, data[start + 6:end]
        return 0, None
    if fmt == "png":
        i = 8
        while i + 8 <= len(data):
            length, kind = struct.unpack(">I4s", data[i:i + 8])
            if kind == b"eXIf":
                return i + 8, data[i + 8:i + 8 + length]
            if kind in (b"IDAT", b"IEND"):
                break
            i += 12 + length
        return 0, None
    if fmt == "webp":
        i = 12
        while i + 8 <= len(data):
            kind = bytes(data[i:i + 4])
            (length,) = struct.unpack("<I", data[i + 4:i + 8])
            if kind == b"EXIF":
                block = data[i + 8:i + 8 + length]
                skip = 6 if bytes(block[:6]) == b"Exif\x00\x00" else 0
                return i + 8 + skip, block[skip:]
            i += 8 + length + (length & 1)
    return 0, None


def exif_orientation(data: Buffer, fmt: str) -> Tuple[int, int]:
    """The EXIF orientation (1-8; 1 when absent or unreadable) of a JPEG, TIFF, PNG or WebP,
    and the offset in ``data`` of its value (0 when absent)."""
    try:
        base, block = _exif_block(data, fmt)
        if block is None or bytes(block[:4]) not in (b"II*\x00", b"MM\x00*"):
            return 1, 0
        value, _n, at = _ifd0(block).get(_TIFF_ORIENTATION, (1, 0, -base))
    except (struct.error, IndexError, ValueError, InvalidInputError):
        return 1, 0
    return (int(value), base + at) if 1 <= value <= 8 else (1, 0)


def orient(img: np.ndarray, orientation: int) -> np.ndarray:
    """The stored pixels ``img`` as shown upright under EXIF ``orientation`` (1-8; 5-8
    swap width and height)."""
    if orientation in (5, 6, 7, 8):
        img = cv2.transpose(img)
        orientation = {5: 1, 6: 2, 7: 3, 8: 4}[orientation]  # then mirror as 1-4 say
    if orientation == 2:
        return cv2.flip(img, 1)
    if orientation == 3:
        return cv2.rotate(img, cv2.ROTATE_180)
    if orientation == 4:
        return cv2.flip(img, 0)
    return img


def _sixteen_bit(data: Buffer, fmt: str) -> bool:
    """Whether a PNG or TIFF stores 16-bit samples."""
    try:
        if fmt == "png":
            return data[24] == 16
        if fmt == "tiff":
            bits, n, at = _ifd0(data).get(_TIFF_BITS, (1, 1, 0))
            if n > 2:  # one value per sample, stored elsewhere
                end = "<" if data[:2] == b"II" else ">"
                bits = struct.unpack(end + "H", data[bits:bits + 2])[0]
            return bits == 16
    except (struct.error, IndexError):
        return False
    return False


def _png_sbit(data: Buffer) -> int:
    """The significant bits a PNG's sBIT chunk declares (the most of its channels); 0 if none."""
    i = 8
    while i + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[i:i + 8])
        if kind == b"sBIT":
            return max(bytes(data[i + 8:i + 8 + length]) or b"\x00")
        if kind in (b"IDAT", b"IEND"):
            break
        i += 12 + length
    return 0


def to_eight_bits(img: np.ndarray, sbit: int = 0, judge: bool = True) -> np.ndarray:
    """16-bit samples to 8 by the depth they use: the PNG ``sbit`` when the values fit in it
    (a 12-bit sensor's data stored as is; 16: full range, divide by 256), else, with ``judge``,
    the bit length of the largest value (at least 8), so that unlabelled 10- or 12-bit data is
    not nearly black: the depth is judged per image, and a 16-bit image darker than half its
    range is brightened (files; label them with sBIT for one scale over a stream). Without
    ``judge`` (frames on the wire, where one hot pixel must not halve the next frame's
    brightness) unlabelled samples are full range, as the PNG spec says. Values over ``sbit``
    are left-aligned as the PNG spec says (divide by 256). ``img`` is shifted in place."""
    top = int(img.max()) if img.size else 0
    bits = max(8, top.bit_length()) if judge else 16
    if 8 <= sbit <= 16 and top.bit_length() <= sbit:
        bits = sbit
    np.right_shift(img, bits - 8, out=img)
    return np.minimum(img, 255, out=img).astype(np.uint8)


def _decode_file(data: Buffer, header: ImageHeader, what: str) -> np.ndarray:
    """Decode a file's stored pixels to BGR uint8 and turn them upright (EXIF orientation)."""
    orientation, at = exif_orientation(data, header.encoding)
    if header.encoding == "tiff" and orientation != 1 and at:
        # OpenCV's TIFF decoder applies orientations 2-4 itself and fails on 5-8: decode
        # the stored pixels (orientation 1) and turn them here, as for every format
        end = "<" if data[:2] == b"II" else ">"
        patched = bytearray(data)  # one copy of the file (the caller still holds the original)
        patched[at:at + 2] = struct.pack(end + "H", 1)
        data = patched
    return orient(decode_checked(data, header, what, judge_depth=True), orientation)


def read_image_file(path: Union[str, os.PathLike[str]], max_pixels: int = DEFAULT_MAX_PIXELS,
                    max_bytes: Optional[int] = None, upright: bool = True) -> np.ndarray:
    """Read, check (size, header, pixel limit, structure) and decode an image file to BGR.

    Every failure is an ``InvalidInputError`` naming the file (``ImageLimitError`` for a
    file over ``max_pixels`` or ``max_bytes``, by default ``file_byte_limit(max_pixels)``);
    a decompression bomb is refused after reading its header, before any pixel memory is
    allocated. ``upright``: turn the picture as its EXIF orientation says (the result of
    orientations 5-8 is the header's size transposed); else the stored pixels.
    A 16-bit PNG or TIFF is scaled to 8 bits by the depth it uses (``to_eight_bits``).
    """
    what = shown(path)
    limit = file_byte_limit(max_pixels) if max_bytes is None else max_bytes
    try:
        # O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; only a
        # regular file is read
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidInputError(f"{what}: not a regular file (a FIFO, socket or device); skipped")
            if st.st_size > limit:
                raise ImageLimitError(
                    f"{what}: {st.st_size} bytes, over the file size limit of {limit} bytes (which follows "
                    f"from the pixel limit of {max_pixels}); {FILE_ADVICE}")
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InvalidInputError(f"{what}: cannot read: {exc.strerror or exc}") from None
    if not data:
        raise InvalidInputError(f"{what}: empty file")
    header = check_pixels(image_header(data, what), max_pixels, what, FILE_ADVICE)
    check_stream(data, header.encoding, what)
    if not upright:
        return decode_checked(data, header, what, judge_depth=True)
    return _decode_file(data, header, what)


def read_image_header(path: Union[str, os.PathLike[str]], max_pixels: int = DEFAULT_MAX_PIXELS,
                      head_bytes: int = 256 * 1024) -> ImageHeader:
    """Check an image file's header only (format, declared size, pixel limit), reading
    ``head_bytes`` first: cheap enough to check a folder before streaming it. A header past
    them (a JPEG whose metadata, such as a phone's depth map in extended XMP, comes before
    its frame header) is looked for in the rest of the file, up to the file byte limit."""
    what = shown(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InvalidInputError(f"{what}: not a regular file (a FIFO, socket or device)")
            data = fh.read(head_bytes)
            if not data:
                raise InvalidInputError(f"{what}: empty file")
            try:
                header = image_header(data, what)
            except InvalidInputError:
                if len(data) < head_bytes:  # the whole file was read: it is what it says
                    raise
                header = image_header(data + fh.read(file_byte_limit(max_pixels) - len(data)), what)
    except OSError as exc:
        raise InvalidInputError(f"{what}: cannot read: {exc.strerror or exc}") from None
    return check_pixels(header, max_pixels, what, FILE_ADVICE)
