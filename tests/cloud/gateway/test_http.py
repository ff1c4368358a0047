"""The gateway's HTTP side port against malformed and slow clients (a real server, raw sockets)."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from cloud.gateway import http
from cloud.gateway.http import SidePort


async def _exchange(port: int, data: bytes, pause_s: float = 0.0, chunks: int = 1) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        step = max(1, len(data) // chunks)
        for i in range(0, len(data), step):
            writer.write(data[i:i + step])
            await writer.drain()
            if pause_s:
                await asyncio.sleep(pause_s)
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


def test_malformed_and_slow_requests(monkeypatch, caplog):
    monkeypatch.setattr(http, "READ_TIMEOUT_S", 0.5)

    async def main():
        side = SidePort(CollectorRegistry(), lambda: {"workers": []}, lambda: True)
        port = await side.start("127.0.0.1", 0)
        try:
            ok = await _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert ok.startswith(b"HTTP/1.1 200 OK") and ok.endswith(b"ok\n")
            assert (await _exchange(port, b"\x00\xff\xfe\r\n\r\n")).startswith(b"HTTP/1.1 400 Bad Request")
            assert (await _exchange(port, b"POST /pool HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
            long = b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"
            assert (await _exchange(port, long)).startswith(b"HTTP/1.1 431")
            many = b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 150 + b"\r\n"
            assert (await _exchange(port, many)).startswith(b"HTTP/1.1 431")
            # a header every 0.2 s stays under any per-line timeout; the whole head has 0.5 s
            t0 = time.monotonic()
            slow = b"GET /pool HTTP/1.1\r\n" + b"X: y\r\n" * 20 + b"\r\n"
            assert await _exchange(port, slow, pause_s=0.2, chunks=21) == b""
            assert time.monotonic() - t0 < 3.0
            # and the port still answers
            assert (await _exchange(port, b"GET /pool HTTP/1.1\r\n\r\n")).endswith(b'{"workers": []}')
        finally:
            await side.stop()
    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


def test_the_ipv6_wildcard_answers_on_both_families():
    """``"::"`` (the chart's side-port host) listens on every address of both families, as the gRPC
    port's wildcard does: asyncio binds an IPv6 socket IPv6-only, so a side port on ``0.0.0.0``
    was unreachable in an IPv6-only cluster (the kubelet's /healthz probe to the pod's IPv6 address
    was refused: the gateway never became ready) and one on ``::`` in an IPv4 one."""
    import socket

    import pytest

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")

    async def main():
        side = SidePort(CollectorRegistry(), lambda: {"workers": []}, lambda: True)
        port = await side.start("::", 0)
        try:
            for host in ("127.0.0.1", "::1"):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
                answer = await asyncio.wait_for(reader.read(), 10)
                writer.close()
                assert answer.startswith(b"HTTP/1.1 200 OK"), host
        finally:
            await side.stop()
    asyncio.run(main())
