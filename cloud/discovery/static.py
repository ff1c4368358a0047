"""Static discovery: a fixed list of workers from the command line or a config file.

Used for local runs (``edgewise cloud up``) and for pools outside Kubernetes.
Each entry is ``host:port`` or ``host:port=weight`` (:mod:`edgewise.addresses`); IPv6
hosts are written in brackets (``[::1]:50051``). The set is yielded once and never changes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterable

from cloud.discovery.base import Endpoint, EndpointState
from edgewise.addresses import format_address, parse_hostport
from edgewise.errors import ConfigError


def parse_weight(text: str, *, where: str = "weight") -> float:
    """A positive finite weight."""
    try:
        w = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: weight {text!r} is not a number; use a positive number like 1 or 2.5") from None
    if not math.isfinite(w) or w <= 0:
        raise ConfigError(f"{where}: weight {text!r} must be a positive finite number")
    return w


def parse_endpoint(spec: str, *, where: str = "endpoint") -> Endpoint:
    """Parse ``host:port`` or ``host:port=weight`` into a READY :class:`Endpoint`."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{where}: expected 'host:port' or 'host:port=weight', got {spec!r}")
    addr, sep, weight_s = spec.strip().partition("=")
    weight = parse_weight(weight_s, where=f"{where} {spec!r}") if sep else 1.0
    host, port = parse_hostport(addr, where=where)
    address = format_address(host, port)
    return Endpoint(address=address, weight=weight, state=EndpointState.READY, name=address)


def parse_endpoints(specs: Iterable[str | Endpoint], *, where: str = "endpoints") -> frozenset[Endpoint]:
    """Parse a list of specs; duplicate addresses are an error (which weight would win?)."""
    seen: dict[str, Endpoint] = {}
    for i, spec in enumerate(specs):
        ep = spec if isinstance(spec, Endpoint) else parse_endpoint(spec, where=f"{where}[{i}]")
        if ep.address in seen:
            raise ConfigError(f"{where}[{i}]: {ep.address} is listed twice; list each worker once")
        seen[ep.address] = ep
    return frozenset(seen.values())


class StaticDiscovery:
    """A :class:`~cloud.discovery.base.Discovery` over a fixed endpoint list."""

    def __init__(self, endpoints: Iterable[str | Endpoint]) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self._closed = asyncio.Event()

    async def watch(self) -> AsyncIterator[frozenset[Endpoint]]:
        """Yield the fixed set once, then wait until :meth:`close` (or cancellation)."""
        yield self.endpoints
        await self._closed.wait()

    async def close(self) -> None:
        self._closed.set()
