"""Binding the cloud daemons' listening sockets, with errors that name the setting.

grpcio raises a bare ``RuntimeError`` ("Failed to bind to address ...") for an address in
use or not on this host, older versions return port 0, and asyncio and ``http.server``
raise ``OSError`` or ``socket.gaierror``: each becomes a :class:`ConfigError` that says
which setting holds the address and what to do, so ``edgewise cloud gateway`` and
``edgewise cloud worker`` exit with one line instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from edgewise.errors import ConfigError

T = TypeVar("T")

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
