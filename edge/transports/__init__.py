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

#: How the edge reconnects to its cloud, either transport: the first wait and the largest, in
#: seconds (paho's reconnect delay, doubling in between; gRPC's reconnect backoff, growing 1.6
#: times with +-20% jitter, whose own largest, 120 s, kept escalations failing for up to two
#: minutes after a long outage ended).
RECONNECT_DELAY_S = (1, 30)


class TransportError(Exception):
    """An escalation failed; ``status`` is its wire status (``detect_pb2.Status``). ``sent``:
    whether the request may have left the edge, one rule for both transports: a connection to
    the cloud (the MQTT broker, a gRPC server) was up when it was written. False: refused before
    it was sent, the MQTT broker not connected, given up before paho wrote it, or a gRPC channel
    that had no connection at any time during the call ("failed to connect", still connecting
    at the deadline: ``edge.transports.grpc.connected``)."""

    def __init__(self, status_value: int, message: str, sent: bool = True) -> None:
        super().__init__(f"{status.name(status_value)}: {message}")
        self.status = status.row(status_value).status
        self.message = message
        self.sent = sent

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
    """A ``Transport`` that reports the serialized size of every request it sends
    (``on_send(transport name, bytes)``, once the call ended): the uplink an escalation costs,
    first sends and spool replays alike, answered or not. A request that never left
    (``TransportError.sent`` False: the MQTT broker not connected, the MQTT uplink window, a
    request paho held back and gave up unsent, a gRPC call that never had a connection) cost
    none: counted, the refusals of a slow uplink doubled what it was said to carry, and every
    escalation to an unreachable gRPC cloud counted as sent."""

    def __init__(self, inner: Transport, on_send: Callable[[str, int], None]) -> None:
        self.inner = inner
        self.name = inner.name
        self.on_send = on_send

    async def start(self) -> None:
        await self.inner.start()

    async def detect(self, request: Any, timeout_s: float) -> Any:
        size = request.ByteSize()
        sent = True
        try:
            return await self.inner.detect(request, timeout_s)
        except TransportError as exc:
            sent = exc.sent
            raise
        finally:
            if sent:
                self.on_send(self.name, size)

    async def close(self) -> None:
        await self.inner.close()


#: The largest answer the edge takes from the cloud, bytes, over either transport (gRPC's
#: receive limit; the MQTT transport refuses a larger response the same way, and announces
#: this and room for the headers as its Maximum Packet Size, ``edge.transports.mqtt.receive_limit``,
#: so the broker does not send it a larger packet at all).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
#: The most characters of the cloud's ``error`` text (or a gRPC status's details) that reach
#: a record or a log line; control characters are escaped (``printable``).
MAX_ERROR_CHARS = 500
#: The most characters of the model name a cloud answer gives (``model_name``) that reach a
#: record's ``cloud_model``; escaped and cut like the error text (``printable``). A real
#: model's name is a few dozen characters; a hostile one of megabytes went into every record.
MAX_MODEL_NAME_CHARS = 200
#: The settings of the TLS files both transports use and follow without a restart (CA bundle,
#: client certificate, key), as the messages name them.
TLS_SETTINGS = ("cloud.tls_ca", "cloud.tls_cert", "cloud.tls_key")
#: Why an answer that is not a ``DetectResponse`` is refused (gRPC and MQTT alike).
NOT_A_RESPONSE = "the cloud's answer is not a DetectResponse"


def printable(text: Any, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` (untrusted: the cloud's words) fit for one log line and a record: control and
    other unprintable characters escaped (``\\n``, ``\\x1b``), at most ``limit`` characters,
    a cut one ending with how many more there were."""
    if not isinstance(text, str):
        text = str(text)
    head = text[:limit]
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in head)
    cut = len(text) > len(head) or len(out) > limit  # too long, or its escapes made it so
    if cut:
        out = out[:limit] + f"... ({len(text)} characters in all)"
    return out


def not_a_response(why: str = "") -> TransportError:
    """The failure of an answer that does not decode as a ``DetectResponse`` (bytes of
    something else, a string field that is not UTF-8): INTERNAL, so the frame keeps its edge
    result (a spooled one leaves the spool with it) instead of being sent again for the same
    answer."""
    return TransportError(status.INTERNAL, NOT_A_RESPONSE + (f" ({printable(why, 200)})" if why else ""))


def check_response(resp: Any) -> Any:
    """The ``DetectResponse`` ``resp`` when its status is OK; else TransportError: for no
    answer or not a DetectResponse (INTERNAL), or the answer's status with its ``error`` text
    made printable and cut to ``MAX_ERROR_CHARS``."""
    from edgewise.v1 import detect_pb2

    if not isinstance(resp, detect_pb2.DetectResponse):
        raise not_a_response("no answer could be decoded" if resp is None else type(resp).__name__)
    if status.is_ok(resp.status):
        return resp
    raise TransportError(resp.status, printable(resp.error) if resp.error else "cloud answered with an error status")
