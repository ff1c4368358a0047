"""The autoscaler's I/O shell: poll the gateways' ``/pool``, decide, apply, export metrics.

Each tick (every ``interval_s``, like HPA's 15 s sync period):

1. ``GET /pool`` from every gateway replica, in parallel, each with a timeout.
   A gateway URL whose host resolves to several addresses (a headless Service)
   is polled at every address, so all replicas are counted. A lookup the resolver has not
   answered within the timeout fails that URL's poll and is awaited again at the next tick,
   never started a second time (``cloud.discovery.dns.OneLookup``, as the gateway's discovery).
2. Aggregate (pure, :func:`aggregate`): in-flight is *summed* over gateways
   (each gateway's requests are separate load); capacity is summed over
   *distinct* ready workers (every gateway sees the same workers, so summing the
   gateways' totals would double-count), and so is their peak capacity (images/s
   at their best batch size, the load target's denominator); the p90 queue wait is the *max* over
   gateways (percentiles cannot be added); the arrival rate is each gateway's
   ``requests_total`` counter differenced since its previous poll
   (:class:`ArrivalRate`), summed. A gateway answering at several addresses (the ``instance``
   its ``/pool`` names) counts once (:func:`one_per_gateway`). A gateway that did not answer makes
   the sample partial (no scale-down); none answering means no sample (hold).
3. Read the Deployment's scale, :meth:`Scaler.decide`, patch if it changed.

Nothing here crashes the daemon: a failed poll, read or patch is logged,
counted and retried on the next tick; one the API server shed with a
``Retry-After`` (``ThrottledError``) at the next tick that comes after it
(:func:`next_tick_in`). Every part of a tick is bounded, so a loop that has not finished one for
:func:`stall_after_s` is wedged: ``/healthz`` then answers 503 (:meth:`AutoscalerLoop.alive`), and
the chart's liveness probe restarts a process that would otherwise never scale again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import ipaddress
import json
import logging
import math
import socket
import ssl
import threading
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Counter, Gauge

from cloud.autoscaler.kube import RETRY_AFTER_MAX_S, ScaleConflictError, ScaleTarget, ThrottledError
from cloud.autoscaler.scaling import Decision, PoolSample, Scaler
from cloud.discovery.dns import OneLookup, Resolver, getaddrinfo_resolver
from edgewise.errors import EdgewiseError, InvalidInputError
from edgewise.observability import process_registry

log = logging.getLogger(__name__)

MAX_POOL_BYTES = 4 << 20
#: Why a gateway's ``/pool`` poll failed (``edgewise_autoscaler_gateway_poll_errors_total{reason}``).
POLL_ERRORS = ("resolve", "timeout", "connect", "invalid")
#: The scale subresource calls that can fail (``edgewise_autoscaler_scale_errors_total{op}``).
SCALE_OPS = ("read", "patch")


@dataclass(frozen=True)
class WorkerView:
    address: str
    state: str
    in_flight: float
    capacity: float
    ejected: bool
    peak_capacity: float = 0.0  # images/s at the worker's best batch size; 0 = not reported


@dataclass(frozen=True)
class GatewayPool:
    """One gateway's ``/pool`` document, validated."""

    source: str
    in_flight: float
    capacity: float
    queue_wait_ms_p90: float | None
    workers: tuple[WorkerView, ...]
    requests_total: float | None = None  # requests the gateway was offered since it started
    instance: str | None = None  # the gateway process that answered (None: a gateway that does not say)


#: no pool value is this large (requests in flight, images/s, ms, a request counter): beyond it
#: a document is garbage, and the HPA formula would size the pool from it
POOL_VALUE_MAX = 1e12


def _num(doc: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> float | None:
    v = doc.get(key)
    if v is None and optional:
        return None
    try:  # float(): an integer past float range (a JSON 1e400 written out) is not a number we can use
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) or v < 0
                or v > POOL_VALUE_MAX):
            raise OverflowError
    except OverflowError:
        raise InvalidInputError(f"{where}: {key} must be a number in [0, {POOL_VALUE_MAX:g}], "
                                f"got {repr(v)[:40]}") from None
    return float(v)


def parse_pool(doc: Any, source: str) -> GatewayPool:
    """Validate a ``/pool`` document (the gateway's ``PoolManager.snapshot``)."""
    if not isinstance(doc, Mapping):
        raise InvalidInputError(f"{source}: /pool must be a JSON object")
    workers_raw = doc.get("workers", [])
    if not isinstance(workers_raw, list):
        raise InvalidInputError(f"{source}: workers must be a list")
    workers = []
    for i, w in enumerate(workers_raw):
        where = f"{source}: workers[{i}]"
        if not isinstance(w, Mapping) or not isinstance(w.get("address"), str):
            raise InvalidInputError(f"{where}: needs a string address")
        if not isinstance(w.get("ejected", False), bool):  # bool("false") is True: a worker wrongly counted out
            raise InvalidInputError(f"{where}: ejected must be true or false, got {repr(w.get('ejected'))[:40]}")
        workers.append(WorkerView(
            address=w["address"], state=str(w.get("state", "ready")),
            in_flight=_num(w, "in_flight", where) or 0.0, capacity=_num(w, "capacity", where) or 0.0,
            ejected=w.get("ejected", False),
            peak_capacity=_num(w, "peak_capacity", where, optional=True) or 0.0))
    instance = doc.get("instance")
    if instance is not None and not (isinstance(instance, str) and 0 < len(instance) <= 64):
        raise InvalidInputError(f"{source}: instance must be a string of 1 to 64 characters, got "
                                f"{repr(instance)[:40]}")
    return GatewayPool(
        source=source, in_flight=_num(doc, "in_flight", source) or 0.0,
        capacity=_num(doc, "capacity", source) or 0.0,
        queue_wait_ms_p90=_num(doc, "queue_wait_ms_p90", source, optional=True),
        workers=tuple(workers), requests_total=_num(doc, "requests_total", source, optional=True),
        instance=instance)


class ArrivalRate:
    """Requests per second offered to the pool, from the gateways' ``requests_total`` counters.

    Each gateway's counter is differenced against its value at the previous poll (a
    Prometheus ``rate()`` over one interval). The sum is known only when every gateway that
    answered has a previous value and its counter did not go back (a restarted gateway
    starts at 0): otherwise None for this poll, and the load metric waits for the next.

    A gateway is the ``instance`` its ``/pool`` names (its URL when it names none): a URL that
    reaches a different replica at each poll (a ClusterIP Service, an https URL,
    ``resolve_gateways`` off) differenced one gateway's counter against another's, and two
    gateways offered 10 requests/s each read as 543/s whenever the poll changed replica, which
    the load target scaled up on.
    """

    def __init__(self, forget_after_s: float = 600.0) -> None:
        self.forget_after_s = forget_after_s
        self._last: dict[str, tuple[float, float]] = {}  # gateway (instance, else URL) -> (counter, when)
        self._polled_at: float | None = None  # the previous observe

    def observe(self, pools: Sequence[GatewayPool], now: float) -> float | None:
        previous, self._polled_at = self._polled_at, now
        for source, (_, at) in list(self._last.items()):
            # A gateway gone this long starts afresh; one that answered the previous poll is kept
            # however long ago that was: with an interval_s over forget_after_s (it may be up to an
            # hour) every counter was forgotten before it could be differenced, the rate was never
            # known and the load target held the pool at its size for good.
            if at < now - self.forget_after_s and (previous is None or at < previous):
                del self._last[source]
        total: float | None = 0.0
        for p in pools:
            if p.requests_total is None:
                total = None
                continue
            key = p.source if p.instance is None else p.instance
            prev = self._last.get(key)
            self._last[key] = (p.requests_total, now)
            if prev is None or p.requests_total < prev[0] or now <= prev[1]:
                total = None
            elif total is not None:
                total += (p.requests_total - prev[0]) / (now - prev[1])
        return total if pools else None


def one_per_gateway(pools: Sequence[GatewayPool]) -> list[GatewayPool]:
    """``pools`` with each gateway once: a gateway polled at several addresses (a dual-stack headless
    Service lists every replica's IPv4 and IPv6 address; two URLs naming one gateway) answers with
    the same ``instance`` at each, and its in-flight and its requests were counted as many times."""
    seen: set[str] = set()
    out = []
    for p in pools:
        if p.instance is not None:
            if p.instance in seen:
                continue
            seen.add(p.instance)
        out.append(p)
    return out


def aggregate(pools: Sequence[GatewayPool], expected: int, now: float,
              arrivals_per_s: float | None = None) -> PoolSample | None:
    """Combine gateway reports into one :class:`PoolSample` (None when nobody answered)."""
    if not pools:
        return None
    caps: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for p in pools:
        for w in p.workers:
            if w.state == "ready" and not w.ejected and w.capacity > 0:
                caps[w.address] = max(caps.get(w.address, 0.0), w.capacity)
                peaks[w.address] = max(peaks.get(w.address, 0.0), w.peak_capacity or w.capacity)
    waits = [p.queue_wait_ms_p90 for p in pools if p.queue_wait_ms_p90 is not None]
    return PoolSample(
        at=now, in_flight=sum(p.in_flight for p in pools), capacity=sum(caps.values()),
        ready_workers=len(caps), queue_wait_ms_p90=max(waits) if waits else None,
        complete=len(pools) >= expected, arrivals_per_s=arrivals_per_s, peak_capacity=sum(peaks.values()))


def _http_get_json(url: str, host_header: str | None, timeout: float) -> Any:
    """``GET url`` as JSON, the whole exchange within ``timeout`` seconds.

    A socket timeout bounds each read, not the answer: a gateway (or a proxy) that trickles its
    headers or body a byte at a time kept the read going for as long as it trickled, in a thread
    the poll's ``wait_for`` had given up on but could not stop, and a few such threads filled the
    default executor that the scale read needs too, so the tick hung with them. A timer shuts the
    socket down at the deadline instead, which ends any read in progress."""
    parts = urlsplit(url)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        headers = {"Accept": "application/json", "Connection": "close"}
        if host_header:
            headers["Host"] = host_header
        conn.request("GET", urlunsplit(("", "", parts.path or "/", parts.query, "")), headers=headers)
        with conn.getresponse() as resp:  # the response owns the socket once the server says close
            if not 200 <= resp.status < 300:
                raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers, None)
            body = resp.read(MAX_POOL_BYTES + 1)
        if expired.is_set():  # the shut-down socket read as the end of a short body
            raise TimeoutError
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise TimeoutError(f"no complete answer within {timeout:g} s") from None
        if isinstance(exc, OSError):
            raise
        raise InvalidInputError(f"{url}: not an HTTP answer ({type(exc).__name__}: {str(exc)[:200]})") from None
    finally:
        timer.cancel()
        conn.close()
    if len(body) > MAX_POOL_BYTES:
        raise InvalidInputError(f"{url}: /pool document larger than {MAX_POOL_BYTES} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise InvalidInputError(f"{url}: /pool is not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


class AutoscalerMetrics:
    """The autoscaler's own Prometheus metrics, on a registry it owns."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or process_registry("autoscaler")
        r = self.registry
        self.desired = Gauge("edgewise_autoscaler_desired_replicas", "Replicas the last decision asked for", registry=r)
        self.current = Gauge("edgewise_autoscaler_current_replicas", "spec.replicas read from the scale subresource", registry=r)
        self.recommendation = Gauge("edgewise_autoscaler_recommended_replicas", "Raw metric recommendation before stabilization and limits", registry=r)
        self.decisions = Counter("edgewise_autoscaler_decisions_total", "Decisions by direction", ["direction"], registry=r)
        self.utilization = Gauge("edgewise_autoscaler_pool_utilization", "Σ in-flight / Σ capacity of the pool", registry=r)
        self.load = Gauge("edgewise_autoscaler_pool_load", "Requests/s offered to the gateways / Σ peak capacity of the pool", registry=r)
        self.queue_wait = Gauge("edgewise_autoscaler_pool_queue_wait_ms_p90", "Max over gateways of the p90 queue wait", registry=r)
        self.ready = Gauge("edgewise_autoscaler_ready_workers", "Distinct ready workers with capacity", registry=r)
        self.poll_errors = Counter("edgewise_autoscaler_gateway_poll_errors_total", "Failed /pool polls", ["reason"], registry=r)
        self.apply_errors = Counter("edgewise_autoscaler_scale_errors_total", "Failed reads/patches of the scale subresource", ["op"], registry=r)
        # every label value at 0 from the start: a series first seen at 1 has no increase() in Prometheus
        for d in ("up", "down", "none"):
            self.decisions.labels(d)
        for reason in POLL_ERRORS:
            self.poll_errors.labels(reason)
        for op in SCALE_OPS:
            self.apply_errors.labels(op)


class GatewayPoller:
    """Polls every gateway replica's ``/pool``."""

    def __init__(self, urls: Sequence[str], *, timeout_s: float = 2.0, resolve: bool = True,
                 metrics: AutoscalerMetrics | None = None, resolver: Resolver | None = None) -> None:
        self.urls = list(urls)
        self.timeout = timeout_s
        self.resolve = resolve
        self.metrics = metrics
        self.arrivals = ArrivalRate()
        self._resolver: Resolver = resolver or getaddrinfo_resolver
        self._lookups: dict[tuple[str, int], OneLookup[list[str]]] = {}  # (host, port) -> its lookup

    async def _targets(self, url: str) -> list[tuple[str, str | None]]:
        """(url to fetch, Host header) per address of the URL's host."""
        parts = urlsplit(url.rstrip("/"))
        pool_url = urlunsplit((parts.scheme, parts.netloc, parts.path + "/pool", "", ""))
        host = parts.hostname or ""
        try:
            ipaddress.ip_address(host)
            literal = True
        except ValueError:
            literal = False
        if not self.resolve or literal or parts.scheme == "https":
            return [(pool_url, None)]
        port = parts.port or 80
        # getaddrinfo has no timeout of its own: a resolver that does not answer held the whole tick,
        # and a lookup started anew at every tick left one more thread hung in it each time
        lookup = self._lookups.get((host, port))
        if lookup is None:
            lookup = self._lookups[(host, port)] = OneLookup(functools.partial(self._resolver, host, port))
        ips = sorted(await lookup.result(self.timeout))
        out: list[tuple[str, str | None]] = []
        for ip in ips:
            netloc = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            out.append((urlunsplit((parts.scheme, netloc, parts.path + "/pool", "", "")), parts.netloc))
        return out

    def _error(self, reason: str, url: str, exc: BaseException) -> None:
        log.warning("autoscaler: polling %s failed (%s): %s", url, reason, exc)
        if self.metrics:
            self.metrics.poll_errors.labels(reason).inc()

    async def poll(self, now: float) -> PoolSample | None:
        targets: list[tuple[str, str | None]] = []
        expected = 0
        for url in self.urls:
            try:
                ts = await self._targets(url)
            except (OSError, LookupError, ValueError) as exc:  # not resolvable (in time); a bad port
                self._error("resolve", url, exc)               # or host (UnicodeError is one)
                expected += 1
                continue
            expected += len(ts)
            targets.extend(ts)

        async def one(url: str, host: str | None) -> GatewayPool | None:
            try:
                doc = await asyncio.wait_for(
                    asyncio.to_thread(_http_get_json, url, host, self.timeout), self.timeout + 1)
                return parse_pool(doc, url)
            except (TimeoutError, asyncio.TimeoutError) as exc:
                self._error("timeout", url, exc)
            except urllib.error.HTTPError as exc:
                self._error(f"http_{exc.code}", url, exc)
            except (OSError, urllib.error.URLError) as exc:
                self._error("connect", url, exc)
            except InvalidInputError as exc:
                self._error("invalid", url, exc)
            except Exception as exc:  # one gateway's garbage (not HTTP, ...) must not stop the others
                self._error("invalid", url, exc)
            return None

        results = await asyncio.gather(*(one(u, h) for u, h in targets))
        answered = [p for p in results if p is not None]
        pools = one_per_gateway(answered)
        expected -= len(answered) - len(pools)  # a second address of a gateway that answered is no other gateway
        return aggregate(pools, expected, now, self.arrivals.observe(pools, now))


def next_tick_in(interval_s: float, elapsed_s: float, retry_after_s: float = 0.0) -> float:
    """Seconds from the end of a tick that took ``elapsed_s`` to the next one: the rest of the
    interval, or, when the API server shed a call of the tick, the wait it asked for
    (``ThrottledError.wait_s``, already bounded), whichever is longer."""
    return max(0.0, interval_s - elapsed_s, retry_after_s)


def stall_after_s(interval_s: float, gateway_timeout_s: float, request_timeout_s: float) -> float:
    """How long a loop may go without finishing a tick before it is wedged: twice the longest a
    tick and the wait after it can take (the poll, bounded by ``gateway_timeout_s`` + 1; the
    read and the patch of the scale, each ``request_timeout_s``; then the interval or the
    longest ``Retry-After`` honoured, ``RETRY_AFTER_MAX_S``)."""
    return 2.0 * (gateway_timeout_s + 1.0 + 2.0 * request_timeout_s + max(interval_s, RETRY_AFTER_MAX_S))


class AutoscalerLoop:
    """One decision per tick; ``tick`` is the unit tests drive."""

    def __init__(self, scaler: Scaler, target: ScaleTarget, poller: GatewayPoller, *,
                 metrics: AutoscalerMetrics | None = None, interval_s: float = 15.0,
                 stall_after_s: float = math.inf, clock: Callable[[], float] = time.monotonic) -> None:
        self.scaler = scaler
        self.target = target
        self.poller = poller
        self.metrics = metrics or poller.metrics or AutoscalerMetrics()
        poller.metrics = self.metrics
        self.interval_s = interval_s
        self.clock = clock
        self.decisions: list[Decision] = []  # last few, for tests and debugging
        #: what the API server asked the last tick to wait before the next call (its Retry-After)
        self.retry_after_s = 0.0
        #: see :meth:`alive`: the loop is wedged once no tick ended for this long
        self.stall_after_s = stall_after_s
        self._beat = clock()  # when the loop started, or its last tick ended
        self._stop = asyncio.Event()

    def alive(self) -> bool:
        """Whether the loop still turns (``/healthz``): a tick ended, or the loop started, less
        than ``stall_after_s`` ago. Every call a tick makes is bounded, so past that a tick is
        stuck where no timeout reaches (a blocked thread, a bug) and only a restart scales again."""
        return self.clock() - self._beat <= self.stall_after_s

    def _api_failed(self, op: str, exc: EdgewiseError) -> None:
        """Count and log a failed read or patch of the scale. A conflict (someone else scaled)
        and a call the API server shed are expected: warnings; a shed one's ``Retry-After``
        holds the next tick back."""
        self.metrics.apply_errors.labels(op).inc()
        if isinstance(exc, ThrottledError):
            self.retry_after_s = max(self.retry_after_s, exc.wait_s)
        if isinstance(exc, (ScaleConflictError, ThrottledError)):
            log.warning("autoscaler: %s", exc)
        else:
            log.error("autoscaler: %s", exc)

    async def tick(self) -> Decision | None:
        # The sample is stamped with the moment the gateways were asked (the oldest its numbers
        # can be) and the decision takes a fresh reading after the poll and the scale read, so
        # a slow poll or a hung API server ages the sample and stale_after_s holds the decision.
        self.retry_after_s = 0.0
        asked = self.clock()
        sample = await self.poller.poll(asked)
        try:
            state = await asyncio.to_thread(self.target.read)
        except EdgewiseError as exc:
            self._api_failed("read", exc)
            return None
        now = self.clock()
        d = self.scaler.decide(now, state.spec_replicas, sample)
        m = self.metrics
        m.current.set(d.current)
        m.desired.set(d.desired)
        # Pool gauges show this tick's sample or NaN (no gateway answered, value unknown): never
        # the last value seen, which would look like a live pool while the autoscaler is blind.
        nan = math.nan
        m.recommendation.set(nan if d.recommendation is None else d.recommendation)
        m.ready.set(nan if sample is None else sample.ready_workers)
        m.utilization.set(sample.in_flight / sample.capacity if sample is not None and sample.capacity > 0 else nan)
        load = None if sample is None or sample.capacity <= 0 else sample.load
        m.load.set(nan if load is None else load)
        m.queue_wait.set(nan if sample is None or sample.queue_wait_ms_p90 is None else sample.queue_wait_ms_p90)
        m.decisions.labels(d.direction).inc()
        log.info("autoscaler: %d -> %d (%s): %s", d.current, d.desired, d.direction, d.reason)
        self.decisions = (self.decisions + [d])[-100:]
        if d.desired != d.current:
            try:
                applied = await asyncio.to_thread(self.target.apply, d.desired, state, d.reason)
            except EdgewiseError as exc:  # a concurrent change (409) among them: retried next tick
                self._api_failed("patch", exc)
                return d
            if applied:
                self.scaler.record_scale(now, d.current, d.desired)
        return d

    async def run(self) -> None:
        """Tick every ``interval_s`` until :meth:`stop`."""
        while not self._stop.is_set():
            started = self.clock()
            try:
                await self.tick()
            except Exception:  # a bug in one tick must not stop scaling for good
                log.exception("autoscaler: tick failed")
            self._beat = self.clock()
            delay = next_tick_in(self.interval_s, self.clock() - started, self.retry_after_s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    def stop(self) -> None:
        self._stop.set()
