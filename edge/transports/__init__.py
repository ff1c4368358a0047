"""Escalation transports: the ``Transport`` seam and its failure type.

Both transports carry the same serialized ``DetectRequest`` / ``DetectResponse``
protobufs (docs/design/README.md#one-wire-contract). ``TransportError.code`` is a gRPC status
name; ``edge.escalating`` maps it to spool / edge_only / drop per policy.
Implementations: ``edge.transports.grpc`` (grpc.aio), ``edge.transports.mqtt``
(paho-mqtt 2.x, MQTT v5).
"""

from __future__ import annotations

from typing import Any

try:
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]

#: Failures after which an escalation is worth spooling for a later replay.
SPOOLABLE = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})


class TransportError(Exception):
    """An escalation failed; ``code`` is the gRPC status name (UNAVAILABLE, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Transport(Protocol):
    """Sends one ``DetectRequest`` and returns its ``DetectResponse``.

    ``detect`` raises ``TransportError`` for every failure, including a response
    whose ``status`` is not OK, and never waits longer than ``timeout_s``.
    """

    name: str

    async def start(self) -> None: ...

    async def detect(self, request: Any, timeout_s: float) -> Any: ...

    async def close(self) -> None: ...


def check_response(resp: Any) -> Any:
    """Raise TransportError for a DetectResponse whose status is not OK."""
    from edgewise.v1 import detect_pb2

    if resp.status in (detect_pb2.OK, detect_pb2.STATUS_UNSPECIFIED):
        return resp
    name = detect_pb2.Status.Name(resp.status)
    raise TransportError(name, resp.error or "cloud answered with an error status")
