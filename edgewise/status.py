"""One status vocabulary: error types <-> wire status <-> gRPC code, and what each one means.

Every request outcome in edgewise is a wire status, a ``detect_pb2.Status`` value
(an ``int``). ``TABLE`` is the one place that says, for each of them, the gRPC code
used at a gRPC boundary, the ``edgewise.errors`` classes that map to it, the other
gRPC codes a peer may send that mean the same, whether the gateway retries it on
another worker (``RETRYABLE``) and whether the edge keeps the escalation for a
later replay (``SPOOLABLE``). Callers convert only through the helpers below:
``status_of(exc)``, ``error_of(status, message)``, ``grpc_code(status)``,
``from_grpc(code)``, ``name(status)``, ``error_response(req, status, message)``. The gateway's balancer derives its
``Outcome`` from the wire status (``cloud.gateway.balancing.outcome_of``).

Decisions the table encodes (gRPC's status code guide, grpc/grpc
``doc/statuscodes.md``):

* ``STATUS_UNSPECIFIED`` (a response that does not say) is not success: it pairs
  with gRPC UNKNOWN, which is also what a peer's uncaught exception becomes.
* A CANCELLED that reaches us from a peer was not asked for by us (our own
  cancellations raise ``asyncio.CancelledError``): the peer is shutting down, so it
  means UNAVAILABLE and is retried elsewhere.
* ``DeploymentError`` (e.g. TensorRT not installed where a model asks for it) is
  UNAVAILABLE, not INVALID_ARGUMENT: the request is fine and the caller cannot fix
  the host; gRPC's FAILED_PRECONDITION ("do not retry until the system is fixed")
  would stop the retry on a healthy replica and the edge's spool, which are
  exactly the right reactions to one badly installed worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Protocol, Tuple, Type

import grpc

from edgewise.errors import (
    DeadlineExceededError,
    DeploymentError,
    EdgewiseError,
    InvalidInputError,
    OverloadedError,
    UnauthenticatedError,
    UnavailableError,
)
from edgewise.v1 import detect_pb2

_C = grpc.StatusCode


@dataclass(frozen=True)
class Row:
    """One wire status and everything that maps to or from it."""

    status: int
    code: grpc.StatusCode
    errors: Tuple[Type[EdgewiseError], ...] = ()
    also_from: Tuple[grpc.StatusCode, ...] = ()
    retryable: bool = False
    """The gateway retries it once on another worker (within the retry budget)."""
    spoolable: bool = False
    """The edge keeps the escalation in its spool and replays it later."""


TABLE: Tuple[Row, ...] = (
    Row(detect_pb2.STATUS_UNSPECIFIED, _C.UNKNOWN),
    Row(detect_pb2.OK, _C.OK),
    Row(detect_pb2.INVALID_ARGUMENT, _C.INVALID_ARGUMENT, (InvalidInputError,), (_C.OUT_OF_RANGE,)),
    Row(detect_pb2.RESOURCE_EXHAUSTED, _C.RESOURCE_EXHAUSTED, (OverloadedError,), spoolable=True),
    Row(detect_pb2.UNAVAILABLE, _C.UNAVAILABLE, (UnavailableError, DeploymentError), (_C.CANCELLED,),
        retryable=True, spoolable=True),
    Row(detect_pb2.DEADLINE_EXCEEDED, _C.DEADLINE_EXCEEDED, (DeadlineExceededError,), spoolable=True),
    Row(detect_pb2.UNAUTHENTICATED, _C.UNAUTHENTICATED, (UnauthenticatedError,), (_C.PERMISSION_DENIED,)),
    Row(detect_pb2.INTERNAL, _C.INTERNAL, (EdgewiseError,)),
)

_BY_STATUS: Dict[int, Row] = {r.status: r for r in TABLE}
_BY_CODE: Dict[grpc.StatusCode, Row] = {c: r for r in TABLE for c in (*r.also_from, r.code)}
_BY_ERROR: Dict[Type[EdgewiseError], Row] = {e: r for r in TABLE for e in r.errors}
_INTERNAL = _BY_STATUS[detect_pb2.INTERNAL]

#: Wire statuses the gateway retries once on another worker.
RETRYABLE: FrozenSet[int] = frozenset(r.status for r in TABLE if r.retryable)
#: Wire statuses after which the edge spools the escalation for a replay.
SPOOLABLE: FrozenSet[int] = frozenset(r.status for r in TABLE if r.spoolable)

OK = detect_pb2.OK
INVALID_ARGUMENT = detect_pb2.INVALID_ARGUMENT
RESOURCE_EXHAUSTED = detect_pb2.RESOURCE_EXHAUSTED
UNAVAILABLE = detect_pb2.UNAVAILABLE
DEADLINE_EXCEEDED = detect_pb2.DEADLINE_EXCEEDED
UNAUTHENTICATED = detect_pb2.UNAUTHENTICATED
INTERNAL = detect_pb2.INTERNAL


def row(status: int) -> Row:
    """The table row of a wire status; a value this build does not know is INTERNAL."""
    return _BY_STATUS.get(int(status), _INTERNAL)


def name(status: int) -> str:
    """``"UNAVAILABLE"`` for ``detect_pb2.UNAVAILABLE`` (unknown values: ``"INTERNAL"``)."""
    return detect_pb2.Status.Name(row(status).status)  # type: ignore[no-any-return]


def grpc_code(status: int) -> grpc.StatusCode:
    """The gRPC code a wire status is answered with on a gRPC boundary."""
    return row(status).code


#: gRPC core's words when a message is over a channel's or a server's size limit ("Sent
#: message larger than max (N vs. M)", "Received message larger than max ..."), sent as
#: RESOURCE_EXHAUSTED.
TOO_LARGE = "message larger than max"


def from_grpc(code: Optional[grpc.StatusCode], details: Optional[str] = None) -> int:
    """The wire status for a gRPC code received from a peer (codes outside the table: INTERNAL).

    A RESOURCE_EXHAUSTED whose ``details`` say the message was over a size limit is the
    request's fault, INVALID_ARGUMENT: overload is worth a retry and a spool, a message too
    large for the hop never passes."""
    if code is None:
        return detect_pb2.STATUS_UNSPECIFIED
    if code is _C.RESOURCE_EXHAUSTED and details and TOO_LARGE in details:
        return detect_pb2.INVALID_ARGUMENT
    return _BY_CODE.get(code, _INTERNAL).status


def status_of(exc: BaseException) -> int:
    """The wire status an exception is answered with: the table's entry for the nearest
    ``EdgewiseError`` class, the code of a ``grpc.RpcError``, else INTERNAL."""
    for cls in type(exc).__mro__:
        r = _BY_ERROR.get(cls)  # type: ignore[call-overload]
        if r is not None:
            return r.status
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        details = getattr(exc, "details", None)
        return from_grpc(exc.code(), details() if callable(details) else None)
    return detect_pb2.INTERNAL


def error_of(status: int, message: str) -> EdgewiseError:
    """An exception that ``status_of`` maps back to ``status`` (OK and unknown: INTERNAL)."""
    errors = row(status).errors
    return (errors[0] if errors else EdgewiseError)(message)


def is_ok(status: int) -> bool:
    return int(status) == detect_pb2.OK


def is_retryable(status: int) -> bool:
    return row(status).retryable


def is_spoolable(status: int) -> bool:
    return row(status).spoolable


class RequestKeys(Protocol):
    """The keys an answer repeats from its request: a ``DetectRequest``, or the gateway's
    view of one read from its bytes."""

    @property
    def device_id(self) -> str: ...
    @property
    def stream_id(self) -> str: ...
    @property
    def frame_seq(self) -> int: ...
    @property
    def trace_id(self) -> str: ...


def error_response(req: Optional[RequestKeys], status: int, message: str) -> detect_pb2.DetectResponse:
    """A ``DetectResponse`` carrying ``status`` and ``message``, keyed like ``req`` (when given)."""
    resp = detect_pb2.DetectResponse(status=row(status).status, error=message)  # type: ignore[arg-type]
    if req is not None:
        resp.device_id, resp.stream_id = req.device_id, req.stream_id
        resp.frame_seq, resp.trace_id = req.frame_seq, req.trace_id
    return resp
