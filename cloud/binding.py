"""Binding the cloud daemons' listening sockets, with errors that name the setting.

grpcio raises a bare ``RuntimeError`` ("Failed to bind to address ...") for an address in
use or not on this host, older versions return port 0, and asyncio and ``http.server``
raise ``OSError`` or ``socket.gaierror``: each becomes a :class:`ConfigError` that says
which setting holds the address and what to do, so ``edgewise cloud gateway`` and
``edgewise cloud worker`` exit with one line instead of a traceback.

Also what both daemons' gRPC servers share: their options (``server_options``), requests
parsed by the handlers themselves (``parsed``), and the standard health service
(``HealthServicer``, served by ``add_health``), and the guard around an answer to a client that
may have left (``unless_client_gone``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import grpc
from grpc_health.v1.health import aio as health_aio

from edgewise.errors import ConfigError
from edgewise.wire import MIN_PING_INTERVAL_S

T = TypeVar("T")

#: Clients' keepalive pings are accepted down to this interval (with a margin), also between calls. The edge
#: pings every `cloud.keepalive_s` (20 s by default, at least this), the gateway its workers
#: every 10 s. gRPC's server default (5 minutes, and none without a call in flight) answers
#: such pings with GOAWAY "too_many_pings" after a minute: an idle edge was disconnected every
#: minute and paid a new TCP and TLS handshake on its next escalation, against its deadline.
MIN_CLIENT_PING_INTERVAL_S = MIN_PING_INTERVAL_S
#: The server pings a client silent this long and drops it after KEEPALIVE_TIMEOUT_S without
#: an answer: a vanished edge (power cut, a NAT that forgot the flow) frees its streams.
KEEPALIVE_S = 60
KEEPALIVE_TIMEOUT_S = 20


#: the largest value a gRPC channel argument takes (a C int); a larger setting is refused
GRPC_INT_MAX = 2**31 - 1


def server_options(max_message_bytes: int, max_streams_per_connection: int | None = None,
                   max_connections: int | None = None,
                   max_connection_age_s: float | None = None) -> list[tuple[str, Any]]:
    """gRPC options of the gateway's and the workers' servers: message limits, the keepalive
    policy above, one process per port, and, for a server facing many clients (the gateway's
    ``limits.max_streams_per_connection``), the calls one connection may hold open: HTTP/2's
    SETTINGS_MAX_CONCURRENT_STREAMS, so a client's further calls wait on its side instead of
    holding the server's memory (of calls a client starts together past the limit, gRPC may
    refuse some at once: RST_STREAM REFUSED_STREAM, UNAVAILABLE for the caller). The workers
    leave it unset: each gateway sends all its requests to a worker over one connection.

    ``max_connections`` (the gateway's ``limits.max_connections``): the connections the server
    holds at once; one more is closed as it arrives. Each idle connection holds about 15 KB
    (43 KB with TLS, measured): without a bound, anyone who reaches the port (no token needed
    to connect) could open connections, answer their keepalive pings and never call, until
    the pod ran out of memory (24,000 TLS connections fill the chart's 1 GiB).

    No ``grpc.max_connection_idle_ms``: an edge keeps one connection open between escalations
    (its keepalive pings, accepted above, keep it alive), and closing it would make the next
    escalation pay a new TCP and TLS handshake against its deadline. ``max_connection_age_s``
    (the gateway's ``limits.max_connection_age_s``; None or 0: never): a connection that old
    is sent GOAWAY, so its client's next call opens a new one, which a Service may send to
    another gateway replica. A Service spreads connections, not calls, and an edge keeps its
    connection for good: after a rolling restart every edge sat on the replica restarted last
    (each moved to the other while its own restarted). Its calls in flight, a long
    DetectStream included, go on to their end (no ``max_connection_age_grace_ms``: gRPC's is
    unbounded); the price is one handshake per edge per age, gRPC adding up to 10% jitter so
    that edges do not reconnect together. The workers leave it unset: a gateway spreads its
    own calls over them."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        # half: a client's timer runs from its last ping's ack, so two pings may arrive a little
        # closer than its interval, and two such strikes would close the connection
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_S * 500),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
    ]
    if max_streams_per_connection is not None:
        options.append(("grpc.max_concurrent_streams", max_streams_per_connection))
    if max_connections is not None:
        options.append(("grpc.max_allowed_incoming_connections", max_connections))
    if max_connection_age_s:
        options.append(("grpc.max_connection_age_ms", int(max_connection_age_s * 1000)))
    return options

_WHAT_TO_DO = ("is the port in use by another process, or the host not an address of this machine? "
               "Choose another port (0 picks a free one) or host")


def _error(setting: str, address: str, why: object) -> ConfigError:
    return ConfigError(f"{setting}: cannot bind {address}: {why}; {_WHAT_TO_DO}")


def grpc_port(server: grpc.aio.Server, address: str, setting: str,
              creds: grpc.ServerCredentials | None = None) -> int:
    """Add ``address`` (``host:port``) to ``server``; the bound port."""
    try:
        port = server.add_insecure_port(address) if creds is None else server.add_secure_port(address, creds)
    except RuntimeError as exc:  # grpcio >= 1.59: "Failed to bind to address ..."
        raise _error(setting, address, str(exc).split(";")[0]) from None
    if not port:
        raise _error(setting, address, "gRPC could not bind it")
    return port


def socket_port(bind: Callable[[], T], address: str, setting: str) -> T:
    """Run ``bind`` (it opens a listening socket), turning an OSError into a ConfigError."""
    try:
        return bind()
    except OSError as exc:  # in use (EADDRINUSE), not on this host (EADDRNOTAVAIL), name unknown (gaierror)
        raise _error(setting, address, exc.strerror or exc) from None


async def socket_port_async(bind: Callable[[], Awaitable[T]], address: str, setting: str) -> T:
    """:func:`socket_port` for a coroutine (asyncio servers)."""
    try:
        return await bind()
    except OSError as exc:
        raise _error(setting, address, exc.strerror or exc) from None


def parsed(message: Any, what: str) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Any]]:
    """A parser of ``message`` (a protobuf class) for a handler that takes the request's bytes:
    bytes that are not one are answered INVALID_ARGUMENT naming ``what``. A handler whose
    ``request_deserializer`` is the class's ``FromString`` leaves the parsing to gRPC, which
    answers UNKNOWN and logs a 7-line traceback at ERROR per request (1000 bad requests: 700 KB
    of log)."""
    from google.protobuf.message import DecodeError

    async def parse(body: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return message.FromString(body)
        except DecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request is not a serialized {what}: {exc}")
    return parse


class HealthServicer(health_aio.HealthServicer):  # type: ignore[misc]
    """grpc_health's asyncio health servicer, whose ``Watch`` calls leave one another notified.

    Upstream, the ``Watch`` calls of one service wait on one shared condition, which each of them
    deletes when it ends (grpc/grpc#43403): once any watcher left (a client cancelled, a
    connection dropped), the others waited on a condition nobody notified again, and the
    NOT_SERVING of a SIGTERM's drain, which tells balancers to stop sending, reached none of
    them (found by a probe: their streams just ended with the grace period, and meanwhile they
    sent calls the draining server refused). Here the watchers of each service are counted and
    the condition goes with the last of them."""

    def __init__(self) -> None:
        super().__init__()
        self._watching: collections.Counter[str] = collections.Counter()

    async def Watch(self, request: Any, context: Any) -> None:
        watchers = getattr(self, "_server_watchers", None)
        if not isinstance(watchers, dict):  # a grpc_health that keeps its watchers otherwise: its own Watch
            await super().Watch(request, context)
            return
        service = request.service
        condition = watchers[service]  # the one upstream's Watch waits on (created if new)
        self._watching[service] += 1
        try:
            await super().Watch(request, context)
        finally:  # right after upstream's, which deleted the condition: no other task ran in between
            self._watching[service] -= 1
            if self._watching[service]:
                watchers[service] = condition  # the others still wait on it
            else:
                del self._watching[service]


def add_health(servicer: Any, server: grpc.aio.Server) -> None:
    """The gRPC health service (a :class:`HealthServicer`) on ``server``, its requests
    ``parsed`` here."""
    from grpc_health.v1 import health_pb2

    parse = parsed(health_pb2.HealthCheckRequest, "grpc.health.v1.HealthCheckRequest")

    async def check(body: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await servicer.Check(await parse(body, context), context)

    async def watch(body: bytes, context: grpc.aio.ServicerContext) -> None:
        await servicer.Watch(await parse(body, context), context)

    out = health_pb2.HealthCheckResponse.SerializeToString
    handlers = {"Check": grpc.unary_unary_rpc_method_handler(check, response_serializer=out),
                "Watch": grpc.unary_stream_rpc_method_handler(watch, response_serializer=out)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("grpc.health.v1.Health", handlers),))
    server.add_registered_method_handlers("grpc.health.v1.Health", handlers)


@contextlib.contextmanager
def unless_client_gone(what: str, log: logging.Logger) -> Iterator[None]:
    """Around a send to a gRPC client (an answer, an error status): a client that already left (it
    cancelled, or its deadline passed, while the daemon was answering) cannot be told anything.
    gRPC's failed send (``ExecuteBatchError``) would otherwise reach grpc, which logs an ERROR with
    a traceback (``ExecuteBatchError raised in core by servicer method [...]``) when it has not yet
    seen the client leave, although nothing is wrong and nobody can act on it; here it is a DEBUG
    line on ``log`` (the daemon's) and the call ends as cancelled. The gateway's answers and the
    worker's error answers both go through it."""
    try:
        yield
    except grpc.aio.InternalError as exc:
        log.debug("the client left before %s could be sent (%s)", what, exc)
        raise asyncio.CancelledError from exc
