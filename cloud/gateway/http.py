"""The cloud daemons' small HTTP side port: ``/metrics`` (Prometheus), and on the gateway
``/pool`` (JSON) and ``/healthz``; the worker and the autoscaler serve their metrics with it too.

A few lines of asyncio instead of a web framework: GET only, one response per
connection; the request head must arrive within ``READ_TIMEOUT_S`` and within the
reader's 64 KiB line limit and ``MAX_HEADERS`` lines (else 431), a request line that is
not HTTP gets 400, and failures are logged a few times a minute at most. (prometheus_client's
own ``start_http_server`` holds a thread and a descriptor per connection, with no timeout:
300 idle connections held 300 threads of a worker.)
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from edgewise.observability import LogThrottle

log = logging.getLogger("edgewise.gateway.http")

#: the request line and headers must arrive within this (a slow client holds no connection longer)
READ_TIMEOUT_S = 5.0
#: header lines read past the request line
MAX_HEADERS = 100


def _dual_stack(port: int) -> socket.socket | None:
    """A socket bound to ``[::]:port`` that takes IPv4 connections too, as gRPC's wildcard does
    (asyncio binds ``::`` IPv6-only); None where this host has no IPv6 (``::`` is then
    ``0.0.0.0``). A port in use is an OSError, as for any host."""
    if not socket.has_ipv6:
        return None
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as exc:
        if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            return None
        raise
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's own sockets
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", port))
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):  # IPv6 disabled on this host
            return None
        raise
    return sock


class SidePort:
    """Serves metrics, the pool document and liveness on one TCP port."""

    def __init__(self, registry: CollectorRegistry, pool_doc: Callable[[], dict[str, Any]] | None = None,
                 healthy: Callable[[], bool] | None = None) -> None:
        self.registry = registry
        self.pool_doc = pool_doc
        self.healthy = healthy
        self._server: asyncio.base_events.Server | None = None
        self.port = 0
        self._error_log = LogThrottle(60.0, burst=3)

    async def start(self, host: str, port: int) -> int:
        sock = _dual_stack(port) if host == "::" else None
        if sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=sock)
        else:
            self._server = await asyncio.start_server(self._handle, "0.0.0.0" if host == "::" else host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:  # the whole request head within one deadline, however slowly it trickles in
                status, ctype, body = await asyncio.wait_for(self._answer(reader), READ_TIMEOUT_S)
            except (asyncio.LimitOverrunError, ValueError):  # a line over the reader's 64 KiB limit
                status, ctype, body = "431 Request Header Fields Too Large", "text/plain", b"request head too large\n"
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n").encode()
            writer.write(head + body)
            await writer.drain()
        except (TimeoutError, asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # never let a scrape kill the gateway, nor a flood of bad ones flood the log
            held = self._error_log.allow()
            if held is not None:
                log.warning("side port request failed%s", f" ({held} more not logged)" if held else "",
                            exc_info=True)
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
        line = await reader.readline()
        for n in range(MAX_HEADERS + 1):  # skip the headers
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            if n == MAX_HEADERS:
                return "431 Request Header Fields Too Large", "text/plain", b"too many header lines\n"
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[0].isalpha():
            return "400 Bad Request", "text/plain", b"not an HTTP/1.x request line\n"
        method, path = parts[0], parts[1].split("?")[0]
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/pool" and self.pool_doc is not None:
            return "200 OK", "application/json", json.dumps(self.pool_doc()).encode()
        if path in ("/healthz", "/readyz") and self.healthy is not None:
            ok = self.healthy()
            return ("200 OK" if ok else "503 Service Unavailable"), "text/plain", b"ok\n" if ok else b"not serving\n"
        paths = ["/metrics"] + (["/pool"] if self.pool_doc else []) + (["/healthz"] if self.healthy else [])
        return "404 Not Found", "text/plain", f"try {', '.join(paths)}\n".encode()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
