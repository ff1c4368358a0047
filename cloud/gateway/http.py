"""The gateway's small HTTP side port: ``/metrics`` (Prometheus), ``/pool`` (JSON), ``/healthz``.

A few lines of asyncio instead of a web framework: GET only, one response per
connection, bounded request-line and header reads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("edgewise.gateway.http")


class SidePort:
    """Serves metrics, the pool document and liveness on one TCP port."""

    def __init__(self, registry: CollectorRegistry, pool_doc: Callable[[], dict[str, Any]],
                 healthy: Callable[[], bool]) -> None:
        self.registry = registry
        self.pool_doc = pool_doc
        self.healthy = healthy
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5.0)
            for _ in range(100):  # skip headers
                h = await asyncio.wait_for(reader.readline(), 5.0)
                if h in (b"\r\n", b"\n", b""):
                    break
            parts = line.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
            if method != "GET":
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
            elif path == "/pool":
                status, ctype = "200 OK", "application/json"
                body = json.dumps(self.pool_doc()).encode()
            elif path in ("/healthz", "/readyz"):
                ok = self.healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", b"ok\n" if ok else b"not serving\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"try /metrics, /pool or /healthz\n"
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: close\r\n\r\n").encode()
            writer.write(head + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # never let a scrape kill the gateway
            log.exception("side port request failed")
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
