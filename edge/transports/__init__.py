"""Escalation transports: the ``Transport`` seam and its failure type.

Both transports carry the same serialized ``DetectRequest`` / ``DetectResponse``
protobufs (docs/design/README.md#one-wire-contract). ``TransportError.status`` is a wire status
(``edgewise.status``); ``edge.escalating`` spools what ``status.is_spoolable``
says and keeps the edge result otherwise. Implementations:
``edge.transports.grpc`` (grpc.aio), ``edge.transports.mqtt`` (paho-mqtt 2.x, MQTT v5).
"""

from __future__ import annotations

from typing import Any, Callable

from edgewise import status

try:
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore[assignment]


class TransportError(Exception):
    """An escalation failed; ``status`` is its wire status (``detect_pb2.Status``)."""

    def __init__(self, status_value: int, message: str) -> None:
        super().__init__(f"{status.name(status_value)}: {message}")
        self.status = status.row(status_value).status
        self.message = message

    @property
    def spoolable(self) -> bool:
        """Worth keeping in the spool for a later replay (the cloud may take it then)."""
        return status.is_spoolable(self.status)


class Transport(Protocol):
    """Sends one ``DetectRequest`` and returns its ``DetectResponse``.

    ``detect`` raises ``TransportError`` for every failure, including a response
    whose ``status`` is not OK, and never waits longer than ``timeout_s``.
    """

    name: str

    async def start(self) -> None: ...

    async def detect(self, request: Any, timeout_s: float) -> Any: ...

    async def close(self) -> None: ...


class MeteredTransport:
    """A ``Transport`` that reports the serialized size of every request it is given
    (``on_send(transport name, bytes)``) before sending it: the uplink an escalation costs,
    first sends and spool replays alike."""

    def __init__(self, inner: Transport, on_send: Callable[[str, int], None]) -> None:
        self.inner = inner
        self.name = inner.name
        self.on_send = on_send

    async def start(self) -> None:
        await self.inner.start()

    async def detect(self, request: Any, timeout_s: float) -> Any:
        self.on_send(self.name, request.ByteSize())
        return await self.inner.detect(request, timeout_s)

    async def close(self) -> None:
        await self.inner.close()


def check_response(resp: Any) -> Any:
    """Raise TransportError for a DetectResponse whose status is not OK."""
    if status.is_ok(resp.status):
        return resp
    raise TransportError(resp.status, resp.error or "cloud answered with an error status")
