"""Gateway admission checks, pure: request validation, device auth, per-device rate limits.

Each check returns ``None`` when the request may pass, or a ``Rejection``
(gRPC status name + a message that says what is wrong and what to do). The
shells (gRPC servicer, MQTT bridge) turn rejections into aborts or error
responses. Clocks are injected.
"""

from __future__ import annotations

import hmac
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cloud.gateway.settings import LimitSettings
from edgewise.v1 import detect_pb2

_ID_RE = re.compile(r"^[A-Za-z0-9._:/@+-]+$")
_JPEG_SOI = b"\xff\xd8\xff"
_PNG_SIG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Rejection:
    status: str   # gRPC status name: INVALID_ARGUMENT, UNAUTHENTICATED, RESOURCE_EXHAUSTED…
    message: str


def _check_id(value: str, name: str, limit: int, required: bool = True) -> Rejection | None:
    if not value:
        if required:
            return Rejection("INVALID_ARGUMENT", f"{name} is empty; set it to the device/stream identifier")
        return None
    if len(value) > limit:
        return Rejection("INVALID_ARGUMENT", f"{name} is {len(value)} characters; the limit is {limit}")
    if not _ID_RE.match(value):
        return Rejection("INVALID_ARGUMENT",
                         f"{name} {value[:40]!r} has characters outside [A-Za-z0-9._:/@+-]")
    return None


def validate_request(req: detect_pb2.DetectRequest, limits: LimitSettings) -> Rejection | None:
    """Cheap structural checks of a DetectRequest (the worker decodes the image)."""
    for value, name, required in ((req.device_id, "device_id", True), (req.stream_id, "stream_id", True),
                                  (req.trace_id, "trace_id", False)):
        bad = _check_id(value, name, limits.max_id_length, required)
        if bad:
            return bad
    if not req.HasField("image") or not req.image.data:
        return Rejection("INVALID_ARGUMENT", "image is missing or empty; send the frame (or crop) in image.data")
    img = req.image
    size = len(img.data)
    if size > limits.max_image_bytes:
        return Rejection("RESOURCE_EXHAUSTED",
                         f"image.data is {size} bytes; the limit is {limits.max_image_bytes} bytes "
                         f"(send a smaller crop or lower the JPEG quality)")
    enc = img.encoding
    if enc == detect_pb2.Image.JPEG:
        if not img.data.startswith(_JPEG_SOI):
            return Rejection("INVALID_ARGUMENT", "image.data is not a JPEG (no SOI marker ff d8 ff); "
                                                 "check image.encoding")
        if b"\xff\xd9" not in img.data[-64:]:
            return Rejection("INVALID_ARGUMENT", "image.data is a truncated JPEG (no EOI marker ff d9 at the end)")
    elif enc == detect_pb2.Image.PNG:
        if not img.data.startswith(_PNG_SIG):
            return Rejection("INVALID_ARGUMENT", "image.data is not a PNG (bad signature); check image.encoding")
    elif enc == detect_pb2.Image.RAW:
        if len(img.shape) != 3 or img.shape[2] not in (1, 3):
            return Rejection("INVALID_ARGUMENT",
                             f"RAW image.shape must be [height, width, 1|3], got {list(img.shape)}")
        h, w, c = img.shape
        if h == 0 or w == 0 or h * w > limits.max_image_pixels:
            return Rejection("INVALID_ARGUMENT",
                             f"RAW image {h}x{w}: needs 1..{limits.max_image_pixels} pixels")
        if img.dtype not in ("", "uint8"):
            return Rejection("INVALID_ARGUMENT", f"RAW image.dtype {img.dtype!r}: only 'uint8' is accepted")
        if size != h * w * c:
            return Rejection("INVALID_ARGUMENT",
                             f"RAW image.data is {size} bytes but shape {h}x{w}x{c} needs {h * w * c}")
    else:
        return Rejection("INVALID_ARGUMENT", "image.encoding is unspecified; set JPEG, PNG or RAW")
    if img.source_width and img.source_height:
        if img.offset_x >= img.source_width or img.offset_y >= img.source_height:
            return Rejection("INVALID_ARGUMENT",
                             f"image crop offset ({img.offset_x},{img.offset_y}) lies outside the "
                             f"{img.source_width}x{img.source_height} source frame")
    if len(req.edge_detections) > limits.max_edge_detections:
        return Rejection("INVALID_ARGUMENT",
                         f"{len(req.edge_detections)} edge_detections; the limit is {limits.max_edge_detections}")
    return None


class TokenAuth:
    """Per-device bearer tokens: ``authorization: Bearer <token>`` must match the device's."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self.tokens = dict(tokens)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def check(self, metadata: Mapping[str, str], device_id: str) -> tuple[str | None, Rejection | None]:
        """Authenticate a call. ``device_id`` is the request's (may be '' for a stream's start).

        Returns (authenticated device, None) or (None, rejection).
        """
        if not self.enabled:
            return device_id or metadata.get("x-edgewise-device", ""), None
        claimed = metadata.get("x-edgewise-device", "") or device_id
        if not claimed:
            return None, Rejection("UNAUTHENTICATED", "no device identity: send metadata x-edgewise-device "
                                                      "or set device_id")
        if device_id and claimed != device_id:
            return None, Rejection("UNAUTHENTICATED",
                                   f"device_id {device_id!r} does not match x-edgewise-device {claimed!r}")
        expected = self.tokens.get(claimed)
        if expected is None:
            return None, Rejection("UNAUTHENTICATED", f"unknown device {claimed!r}; add it to auth.tokens")
        header = metadata.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None, Rejection("UNAUTHENTICATED", "missing 'authorization: Bearer <token>' metadata")
        if not hmac.compare_digest(token.strip().encode(), expected.encode()):
            return None, Rejection("UNAUTHENTICATED", f"bad token for device {claimed!r}")
        return claimed, None


class RateLimiter:
    """Token bucket per device (rate/s, burst); remembers at most ``max_devices`` (LRU)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 max_devices: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.max_devices = max_devices
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.limited = 0

    def allow(self, device: str) -> Rejection | None:
        if self.rate <= 0:
            return None
        now = self.clock()
        tokens, last = self._buckets.pop(device, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        if ok:
            tokens -= 1.0
        self._buckets[device] = (tokens, now)
        if len(self._buckets) > self.max_devices:
            self._buckets.popitem(last=False)
        if ok:
            return None
        self.limited += 1
        return Rejection("RESOURCE_EXHAUSTED",
                         f"device {device!r} is over its rate limit of {self.rate:g} requests/s "
                         f"(burst {self.burst:g}); slow down or raise limits.rate_per_device")
