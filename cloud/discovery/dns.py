"""DNS discovery: the A/AAAA records of a headless Kubernetes Service, polled.

A headless Service (``clusterIP: None``) resolves to one record per *ready*
pod, so polling the name is the simplest way to see the pool without API
access (docs/design/balancing.md#discovery). gRPC's own DNS resolver re-resolves only
when a connection breaks and at most every 30 s; we poll on our own interval
instead, so a scale-up is seen within one interval.

Lifecycle of an address (pure, in :class:`DnsTracker`):

* a new record → READY endpoint (weight ``weight``, default 1; DNS carries no
  per-pod weight);
* a record that disappears → DRAINING for ``drain_s`` seconds (the gateway stops
  new picks and lets in-flight work finish), then removed;
* a record that comes back while draining → READY again.

Failures: "no such name" (``EAI_NONAME``/``EAI_NODATA``: a headless Service with
no ready pods) means an empty set; any other resolver error (timeouts,
``EAI_AGAIN``) keeps the last known set, is logged and counted, so a DNS blip
never empties the pool. A lookup still unanswered after one interval (a resolver
that does not answer: glibc gives up only after its own timeouts and attempts
per server) counts as such an error too; it is awaited again at the next poll,
not started a second time, and draining addresses still leave on time meanwhile.
That rule is :class:`OneLookup`, which the autoscaler's gateway poll uses too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cloud.discovery.base import Endpoint, EndpointState, number_option
from cloud.discovery.static import format_address
from edgewise.errors import ConfigError
from edgewise.fieldrules import show

log = logging.getLogger(__name__)

#: ``resolver(host, port) -> addresses``; raises :class:`LookupError` for "no such
#: name" and :class:`OSError` for transient failures.
Resolver = Callable[[str, int], Awaitable[list[str]]]

T = TypeVar("T")

_NO_SUCH_NAME = {
    getattr(socket, n) for n in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, n)
}


async def getaddrinfo_resolver(host: str, port: int, family: int = socket.AF_UNSPEC) -> list[str]:
    """Resolve with the event loop's ``getaddrinfo`` (A and AAAA records), de-duplicated."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_NAME:
            raise LookupError(f"{host}: no such name ({exc.strerror})") from exc
        raise
    out: list[str] = []
    for fam, _type, _proto, _canon, sockaddr in infos:
        if fam in (socket.AF_INET, socket.AF_INET6):
            ip = str(sockaddr[0])
            if ip not in out:
                out.append(ip)
    return out


class LookupUnanswered(TimeoutError):
    """A lookup gave no answer within the caller's timeout (it goes on), or was cancelled."""


class OneLookup(Generic[T]):
    """At most one lookup at a time: one still unanswered after a caller's ``timeout`` goes on,
    and the next call awaits it instead of starting another.

    ``getaddrinfo`` has no timeout of its own and runs in an executor thread that cannot be
    stopped: a poll that gave up on it (``wait_for``) and started a new lookup at every interval
    left one more thread hung in the resolver each time, until they filled the default executor
    that the poll's other calls need too. An answer that comes after a caller gave up is what
    the next call returns."""

    def __init__(self, start: Callable[[], Awaitable[T]]) -> None:
        self._start = start
        self._pending: asyncio.Future[T] | None = None

    async def result(self, timeout: float) -> T:
        """The lookup's answer, or what it raised; :class:`LookupUnanswered` when it has not
        answered within ``timeout`` seconds (it is kept for the next call) or was cancelled."""
        loop = asyncio.get_running_loop()
        lookup = self._pending
        if lookup is None or lookup.get_loop() is not loop:  # another loop's cannot be awaited here
            lookup = self._pending = asyncio.ensure_future(self._start())
        if not lookup.done():
            await asyncio.wait({lookup}, timeout=timeout)
            if not lookup.done():
                raise LookupUnanswered(f"no answer for {timeout:g} s or more")
        if self._pending is lookup:  # a caller woken before this one may have started the next one
            self._pending = None
        if lookup.cancelled():
            raise LookupUnanswered("cancelled")
        return lookup.result()

    def cancel(self) -> None:
        """Stop waiting for the lookup in progress (the thread of a ``getaddrinfo`` runs on)."""
        if self._pending is not None:
            self._pending.cancel()


@dataclass
class DnsTracker:
    """Pure lifecycle of resolved addresses; ``now`` is injected."""

    port: int
    weight: float = 1.0
    drain_s: float = 10.0
    _ready: set[str] = field(default_factory=set)
    _draining: dict[str, float] = field(default_factory=dict)  # ip -> removal time

    def update(self, ips: list[str] | set[str] | None, now: float) -> frozenset[Endpoint]:
        """Apply one resolution result (``None`` = failed, keep state) and expire drains."""
        if ips is not None:
            current = set(ips)
            for ip in self._ready - current:
                self._draining[ip] = now + self.drain_s
            for ip in current:
                self._draining.pop(ip, None)
            self._ready = current
        for ip, until in list(self._draining.items()):
            if now >= until:
                del self._draining[ip]
        return self.endpoints()

    def endpoints(self) -> frozenset[Endpoint]:
        eps = [self._ep(ip, EndpointState.READY) for ip in self._ready]
        eps += [self._ep(ip, EndpointState.DRAINING) for ip in self._draining]
        return frozenset(eps)

    def _ep(self, ip: str, state: EndpointState) -> Endpoint:
        return Endpoint(address=format_address(ip, self.port), weight=self.weight, state=state, name=ip)


class DnsDiscovery:
    """A :class:`~cloud.discovery.base.Discovery` polling a DNS name every ``interval_s``."""

    def __init__(
        self,
        name: str,
        port: int,
        *,
        interval_s: float = 5.0,
        drain_s: float | None = None,
        weight: float = 1.0,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        where = "discovery.dns"
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise ConfigError(f"{where}.name: {show(name)} is not allowed (not text, empty or with spaces); allowed: the headless "
                              "Service's DNS name (workers.ns.svc.cluster.local)")
        try:  # what the resolver does first: a bad name failed there, at every poll, and ended the watch
            name.encode("idna")
        except UnicodeError as exc:
            raise ConfigError(f"{where}.name: {show(name)} is not a DNS name ({exc.__cause__ or exc}); allowed: "
                              "labels of 1 to 63 characters between dots (workers.ns.svc.cluster.local)") from None
        number_option(where, "port", port, lo=1, hi=65535, integer=True)
        number_option(where, "interval_s", interval_s, lo=0, lo_open=True, hi=3600)
        if drain_s is not None:
            number_option(where, "drain_s", drain_s, lo=0, hi=3600)
        number_option(where, "weight", weight, lo=0, lo_open=True)
        self.name = name
        self.port = port
        self.interval_s = interval_s
        self.tracker = DnsTracker(port=port, weight=weight, drain_s=interval_s if drain_s is None else drain_s)
        resolve: Resolver = resolver or getaddrinfo_resolver
        self._clock = clock
        self._closed = asyncio.Event()
        self.resolve_errors = 0  # transient failures (last set kept)
        self._lookup: OneLookup[list[str]] = OneLookup(lambda: resolve(self.name, self.port))

    async def _resolve_once(self) -> list[str] | None:
        try:
            return await self._lookup.result(self.interval_s)
        except LookupUnanswered:
            if self._closed.is_set():
                return None
            self.resolve_errors += 1
            log.warning("dns discovery: resolving %s has not answered for %g s or more; keeping the last %d "
                        "endpoints (check the resolver in /etc/resolv.conf)", self.name, self.interval_s,
                        len(self.tracker._ready))
            return None
        except LookupError as exc:
            log.info("dns discovery: %s; pool is empty", exc)
            return []
        except OSError as exc:
            self.resolve_errors += 1
            log.warning("dns discovery: resolving %s failed (%s); keeping the last %d endpoints",
                        self.name, exc, len(self.tracker._ready))
            return None

    async def watch(self) -> AsyncIterator[frozenset[Endpoint]]:
        """Yield the set after the first resolution and after every change."""
        last: frozenset[Endpoint] | None = None
        while not self._closed.is_set():
            ips = await self._resolve_once()
            current = self.tracker.update(ips, self._clock())
            if current != last:
                last = current
                yield current
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closed.wait(), self.interval_s)

    async def close(self) -> None:
        self._closed.set()
        self._lookup.cancel()
