"""gRPC escalation transport (grpc.aio): keepalive, per-request deadline, retry on
UNAVAILABLE as channel service-config policy, TLS / mutual TLS and a bearer token.

Retries follow gRPC's ``examples/python/retry/retry_client.py`` (service config,
not a hand-written loop; docs/design/conventions.md#grpc-idioms). Several endpoints are tried in
order when one is UNAVAILABLE. Unlike Sedna's client (docs/design/escalation.md#sedna-baselines:
JSON pixels, no timeout), every call has a deadline. Callers:
``edge.escalating``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, List, Optional, Sequence, Tuple

import grpc
from grpc import aio

from edge.transports import (
    MAX_ANSWER_BYTES,
    TransportError,
    check_response,
    not_a_response,
    printable,
)
from edgewise import status

log = logging.getLogger(__name__)

MAX_MESSAGE = MAX_ANSWER_BYTES

def detect_method() -> str:
    """The method every escalation calls, from the generated service descriptor. Its answer
    is taken as bytes and decoded here (``_decode``): grpc's own deserializer logs a traceback
    and hands back None for bytes that are not a ``DetectResponse`` (or carry a string that is
    not UTF-8); here that is a clear failure."""
    from edgewise.v1 import service_pb2

    return f"/{service_pb2.DESCRIPTOR.services_by_name['Escalation'].full_name}/Detect"

SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [{"service": "edgewise.v1.Escalation"}],
            "retryPolicy": {
                "maxAttempts": 3,
                "initialBackoff": "0.05s",
                "maxBackoff": "0.5s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": sorted(status.grpc_code(s).name for s in status.RETRYABLE),
            },
        }
    ]
}


def _read(path: str) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def _decode(raw: Any) -> Any:
    """The ``DetectResponse`` in an answer's bytes; TransportError (INTERNAL) when they are
    not one."""
    from edgewise.v1 import detect_pb2

    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise not_a_response("no answer" if raw is None else type(raw).__name__)
    resp = detect_pb2.DetectResponse()
    try:
        resp.ParseFromString(bytes(raw))
    except Exception as exc:  # DecodeError, a string field that is not UTF-8
        raise not_a_response(f"{len(raw)} bytes: {exc}") from None
    return resp


class GrpcTransport:
    """Escalates over ``edgewise.v1.Escalation/Detect``."""

    name = "grpc"

    def __init__(
        self,
        endpoints: Sequence[str],
        tls_ca: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        token: str = "",
        keepalive_s: float = 20.0,
    ) -> None:
        if not endpoints:
            raise ValueError("gRPC transport needs at least one endpoint (cloud.endpoints)")
        self.endpoints = list(endpoints)
        self.tls = (tls_ca, tls_cert, tls_key)
        self.metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self.options = [
            ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", 10000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
        ]
        self.channels: List[Any] = []
        self.stubs: List[Any] = []
        self.preferred = 0

    async def start(self) -> None:
        from edgewise.v1 import detect_pb2

        ca, cert, key = self.tls
        creds = None
        if ca or cert:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(ca), private_key=_read(key), certificate_chain=_read(cert)
            )
        for ep in self.endpoints:
            ch = aio.secure_channel(ep, creds, options=self.options) if creds else aio.insecure_channel(
                ep, options=self.options
            )
            self.channels.append(ch)
            self.stubs.append(ch.unary_unary(
                detect_method(), request_serializer=detect_pb2.DetectRequest.SerializeToString,
                response_deserializer=None))  # raw bytes: decoded by _decode

    async def detect(self, request: Any, timeout_s: float) -> Any:
        if not self.stubs:
            await self.start()
        n = len(self.stubs)
        last: Optional[TransportError] = None
        for k in range(n):
            i = (self.preferred + k) % n
            try:
                raw = await self.stubs[i](
                    request, timeout=max(timeout_s, 0.001), metadata=self.metadata or None
                )
            except aio.AioRpcError as exc:
                st = status.from_grpc(exc.code(), exc.details())
                details = printable(exc.details()) if exc.details() else status.name(st)
                last = TransportError(st, f"{self.endpoints[i]}: {details}")
                if status.is_retryable(st) and k + 1 < n:
                    log.info("endpoint %s unavailable, trying the next one", self.endpoints[i])
                    continue
                raise last from None
            self.preferred = i
            return check_response(_decode(raw))
        assert last is not None
        raise last

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()
        self.channels = []
        self.stubs = []
