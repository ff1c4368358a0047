"""Gateway admission checks, pure: request validation, device auth, per-device rate limits.

Validation reads the gateway's view of a request (``cloud.gateway.envelope.RequestHead``:
read from the request's bytes, the image not copied). Each check returns ``None`` when
the request may pass, or a ``Rejection``
(wire status + a message that says what is wrong and what to do). The gateway's
one request path (``Gateway.handle``) runs them for both transports, with the
``Caller`` each transport extracted, and turns rejections into error responses
(the gRPC servicer into aborts). Clocks are injected.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cloud.gateway.envelope import RequestHead
from cloud.gateway.settings import LimitSettings, quote_id
from edgewise import status
from edgewise.errors import InvalidInputError
from edgewise.ids import id_problem
from edgewise.imagefiles import ImageHeader
from edgewise.wire import check_image


@dataclass(frozen=True)
class Rejection:
    status: int   # wire status (edgewise.status): INVALID_ARGUMENT, UNAUTHENTICATED, RESOURCE_EXHAUSTED…
    message: str  # what the client is told
    #: for the gateway's log only, never sent (e.g. which of "unknown device" / "bad token" it was)
    detail: str = ""


def _check_id(value: str, name: str, limit: int, required: bool = True) -> Rejection | None:
    if not value:
        if required:
            return Rejection(status.INVALID_ARGUMENT, f"{name} is empty; set it to the device/stream identifier")
        return None
    problem = id_problem(value, name, limit)
    return Rejection(status.INVALID_ARGUMENT, problem) if problem else None


def oversize(size: int, limit: int) -> Rejection | None:
    """The one verdict on a request's size, ``size`` bytes against the gateway's
    ``limits.max_message_bytes`` (``limit``), on every path (``Gateway.read``): INVALID_ARGUMENT,
    since the request never passes (RESOURCE_EXHAUSTED would have it spooled and replayed). Worded
    as gRPC core words its own refusal of a gRPC message over the same limit, which reaches a
    client before the gateway reads the call ("Received message larger than max (N vs. M)", sent
    RESOURCE_EXHAUSTED, which the edge reads as INVALID_ARGUMENT: ``edgewise.status.TOO_LARGE``),
    so one phrase names the refusal on both transports."""
    if size <= limit:
        return None
    return Rejection(status.INVALID_ARGUMENT,
                     f"request {status.TOO_LARGE} ({size} vs. {limit} bytes, the gateway's limits.max_message_bytes); "
                     "send a smaller image (lower the payload's resolution or JPEG quality, or send regions)")


def validate_request(req: RequestHead, limits: LimitSettings) -> Rejection | ImageHeader:
    """Cheap structural checks of a request: ids, and the image's header through the same
    ``edgewise.wire.check_image`` the worker runs before decoding (no decode here).
    Returns the image's header when the request may pass (routing reads its pixels)."""
    for value, name, required in ((req.device_id, "device_id", True), (req.stream_id, "stream_id", True),
                                  (req.trace_id, "trace_id", False)):
        bad = _check_id(value, name, limits.max_id_length, required)
        if bad:
            return bad
    if req.deadline_unix_ns < 0:
        return Rejection(status.INVALID_ARGUMENT,
                         f"deadline_unix_ns is {req.deadline_unix_ns}; send the deadline as nanoseconds since the "
                         f"Unix epoch, or 0 for none")
    if req.image is None or not req.image.data:
        return Rejection(status.INVALID_ARGUMENT,
                         "image is missing or empty; send the frame (or crop) in image.data")
    try:
        header = check_image(req.image, limits.max_image_pixels, limits.max_image_bytes)
    except InvalidInputError as exc:
        return Rejection(status.status_of(exc), str(exc))
    if req.edge_detections > limits.max_edge_detections:
        return Rejection(status.INVALID_ARGUMENT,
                         f"{req.edge_detections} edge_detections; the limit is {limits.max_edge_detections}")
    return header


@dataclass(frozen=True)
class Caller:
    """What a transport extracted about the sender of a request, before any check.

    ``metadata``: lower-case keys, ``authorization`` (``Bearer <token>``) and the
    claimed ``x-edgewise-device`` (gRPC metadata; the MQTT bridge fills them from the
    request's User Property and topic). ``cert_names``: the names of the verified
    client certificate selected by ``tls.client_identity`` (None: no binding; empty:
    a certificate without such a name). ``topic_device``: MQTT, the device level of
    the request topic. ``peer``: where the request came from, for the log only (gRPC's
    ``context.peer()``, the MQTT request topic).
    """

    metadata: Mapping[str, str] = field(default_factory=dict)
    cert_names: tuple[str, ...] | None = None
    topic_device: str | None = None
    peer: str = ""


MISSING_TOKEN = "missing 'authorization: Bearer <token>' (gRPC metadata, or MQTT v5 user property)"
#: the start of every answer to a token that is not the device's (quoted in docs/troubleshooting.md)
BAD_TOKEN = "unknown device or bad token"


def bad_token(device: str, detail: str) -> Rejection:
    """The one answer to a bearer token that is not ``device``'s, on every path (gRPC's screen of a
    call's headers, the check of a request, the MQTT bridge's): the same words whether the device
    is unknown or its token wrong, so a client cannot tell which devices exist (``detail``, for the
    gateway's log, says which). ``device`` is named where the gateway knows it ("" before a gRPC
    call's request is read, unless it sent x-edgewise-device)."""
    whose = f" for device {quote_id(device)}" if device else ""
    return Rejection(status.UNAUTHENTICATED,
                     f"{BAD_TOKEN}{whose}; check the device's token (the gateway's auth.tokens / auth.tokens_file "
                     "must list the device with it)", detail=detail)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _bearer(metadata: Mapping[str, str]) -> str:
    """The token of ``authorization: Bearer <token>`` without surrounding blanks ("" when none)."""
    scheme, _, token = metadata.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class TokenAuth:
    """Per-device bearer tokens: ``authorization: Bearer <token>`` must match the device's."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        self.tokens = dict(tokens)

    @property
    def tokens(self) -> dict[str, str]:
        return self._tokens

    @tokens.setter
    def tokens(self, tokens: dict[str, str]) -> None:
        self._tokens = tokens
        # the digest of each token -> its device (a token is one device's: settings.token_problem)
        self._known = {_digest(t): device for device, t in tokens.items()}

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def screen(self, metadata: Mapping[str, str]) -> Rejection | None:
        """The check a gRPC call gets from its metadata alone, before its request is read: its
        bearer token must be some device's. Without it, a client that never sends its request
        would hold one of ``limits.max_concurrent_rpcs`` for ever. Which device, and the
        rest of :meth:`authenticate`, is checked once the request is there."""
        if not self.enabled:
            return None
        token = _bearer(metadata)
        if not token:
            return Rejection(status.UNAUTHENTICATED, MISSING_TOKEN)
        # digests of the tokens: one lookup whatever the fleet's size, and its time tells nothing
        if _digest(token) not in self._known:
            return bad_token(metadata.get("x-edgewise-device", ""),
                             "no device in auth.tokens/auth.tokens_file has this token")
        return None

    def holder(self, metadata: Mapping[str, str]) -> str:
        """The device whose bearer token ``metadata`` carries ("" when none, or with authentication
        off): who holds a call before its request says anything (``limits.max_calls_per_device``)."""
        token = _bearer(metadata)
        return self._known.get(_digest(token), "") if token else ""

    def authenticate(self, caller: Caller, device_id: str) -> Rejection | None:
        """The one identity check of both transports, for a request of ``device_id``: the
        MQTT topic's device, the client certificate's name and the bearer token must all
        be that device's (each where present)."""
        if caller.topic_device is not None and device_id and device_id != caller.topic_device:
            return Rejection(status.UNAUTHENTICATED,
                             f"device_id {quote_id(device_id)} does not match the topic's device "
                             f"{quote_id(caller.topic_device)}")
        if caller.cert_names is not None and device_id and device_id not in caller.cert_names:
            names = ", ".join(quote_id(n) for n in caller.cert_names) or "none"
            return Rejection(status.UNAUTHENTICATED,
                             f"device_id {quote_id(device_id)} is not a name of the client certificate ({names}, "
                             f"per tls.client_identity); each device must use its own certificate")
        return self.check(caller.metadata, device_id)[1]

    def check(self, metadata: Mapping[str, str], device_id: str,
              stream: bool = False) -> tuple[str | None, Rejection | None]:
        """Authenticate a call. ``device_id`` is the request's ('' at a stream's start, ``stream``).

        Returns (authenticated device, None) or (None, rejection).
        """
        if not self.enabled:
            return device_id or metadata.get("x-edgewise-device", ""), None
        claimed = metadata.get("x-edgewise-device", "") or device_id
        if not claimed:
            return None, Rejection(status.UNAUTHENTICATED, (
                "no device identity: a DetectStream call must send the gRPC metadata x-edgewise-device "
                "(its token is checked when the stream opens, before any frame)" if stream else
                "no device identity: set the request's device_id"))
        if device_id and claimed != device_id:
            return None, Rejection(status.UNAUTHENTICATED,
                                   f"device_id {quote_id(device_id)} does not match x-edgewise-device "
                                   f"{quote_id(claimed)}")
        expected = self.tokens.get(claimed)
        token = _bearer(metadata)
        if not token:
            return None, Rejection(status.UNAUTHENTICATED, MISSING_TOKEN)
        # one answer for both, so a client cannot tell which devices exist; the log has which
        if expected is None or not hmac.compare_digest(token.encode(), expected.encode()):
            return None, bad_token(claimed, "device not in auth.tokens/auth.tokens_file" if expected is None
                                   else "token does not match")
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
        return Rejection(status.RESOURCE_EXHAUSTED,
                         f"device {quote_id(device)} is over its rate limit of {self.rate:g} requests/s "
                         f"(burst {self.burst:g}); slow down or raise limits.rate_per_device")
