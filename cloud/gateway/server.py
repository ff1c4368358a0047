"""The gateway process: the edge-facing ``Escalation`` gRPC service and its lifecycle.

``Gateway`` ties together the worker pool (balancer + channels), admission
(validation, bearer tokens, per-device rate limits), the gRPC server (TLS/mTLS,
message-size limits, standard health service), the HTTP side port (/metrics,
/pool, /healthz), discovery and the optional MQTT bridge. ``read`` then ``handle`` is
the one request path both transports use, each with the ``Caller`` it extracted (token,
client-certificate names, MQTT topic device). The gRPC methods take and return
serialized messages (``request_deserializer=None``): the request is read in place
(``cloud.gateway.envelope``) and its bytes go to the worker as they came, the worker's
answer back likewise (docs/design/balancing.md#a-lean-hop). SIGTERM (``Gateway.shut_down``):
health goes NOT_SERVING, calls and connections are still taken for ``shutdown_delay_s`` (a
second SIGTERM or SIGINT cuts it short), then new calls are refused and in-flight calls on
both transports finish within ``shutdown_grace_s``.

What clients can hold open is bounded: ``limits.max_concurrent_rpcs`` calls in all (gRPC
refuses one more with RESOURCE_EXHAUSTED before reading it), with authentication on
``limits.max_calls_per_device`` per device of a token (``cloud.gateway.callslots``), ``limits.max_streams_per_connection``
per connection (HTTP/2: the client's further calls wait, or in a burst are refused UNAVAILABLE), ``limits.max_streams_per_device``
DetectStreams per device (RESOURCE_EXHAUSTED), and a DetectStream that sends no frame for
``limits.stream_idle_timeout_s`` is ended with UNAVAILABLE.

The device tokens are re-read on SIGHUP and, without a signal, when ``auth.tokens_file``
changes (looked at every ``auth.tokens_poll_s``: a Kubernetes Secret updated by kubelet;
``edgewise.filewatch``, the TLS files' rule); both read in a thread, one at a time
(``Gateway.tokens_lock``: a fleet's file takes seconds, requests are served meanwhile), and go
through ``Gateway.reload_tokens``. The TLS files
(``tls.cert_file``, ``tls.key_file``, ``tls.client_ca_file``) are looked at on new connections
(at most once a second) and a renewed certificate or client CA is served to new connections
without a signal or a restart (``cloud.gateway.tlsreload``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from prometheus_client import Gauge

from cloud.binding import (
    HealthServicer,
    add_health,
    grpc_port,
    server_options,
    socket_port_async,
    unless_client_gone,
)
from cloud.discovery.base import Discovery, Endpoint, EndpointState
from cloud.gateway.admission import (
    Caller,
    RateLimiter,
    Rejection,
    TokenAuth,
    oversize,
    validate_request,
)
from cloud.gateway.callslots import CallSlots
from cloud.gateway.envelope import Reply, RequestHead, error_reply, read_request
from cloud.gateway.http import SidePort
from cloud.gateway.mqtt_bridge import MqttBridge
from cloud.gateway.pool import WorkerPool
from cloud.gateway.settings import GatewaySettings, quote_id
from cloud.gateway.tlsreload import ServedTlsFiles
from edgewise import hangup, status
from edgewise.addresses import format_address
from edgewise.errors import ConfigError, InvalidInputError
from edgewise.filereads import FileIdentity, file_identity
from edgewise.filewatch import ReloadDecision, identities_of
from edgewise.observability import LogThrottle
from edgewise.settings.fields import changed_keys
from edgewise.v1 import service_pb2

log = logging.getLogger("edgewise.gateway")
SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["Escalation"].full_name
LISTENING_LINE = "EDGEWISE_GATEWAY_LISTENING"
#: gRPC's own details of the RESOURCE_EXHAUSTED it answers a call over ``limits.max_concurrent_rpcs``
#: with (quoted in docs/troubleshooting.md)
CONCURRENT_RPC_LIMIT_MESSAGE = "Concurrent RPC limit exceeded"
#: Descriptors the gateway needs beside one per edge connection (``limits.max_connections``):
#: its worker channels, the MQTT bridge, metrics scrapes, the tokens and TLS files, gRPC's own
#: (20 at rest with one worker, measured).
FD_RESERVE = 256


class ReloadableStaticDiscovery:
    """Static discovery whose list can be replaced at run time (SIGHUP reload, local mode)."""

    def __init__(self, specs: Iterable[str]) -> None:
        from cloud.discovery.static import parse_endpoints

        self._parse = parse_endpoints
        self._current = parse_endpoints(list(specs), where="discovery.static")
        self._changed = asyncio.Event()
        self._closed = False

    def replace(self, specs: Iterable[str]) -> None:
        new = self._parse(list(specs), where="discovery.static")
        new_addrs = {e.address for e in new}
        # workers dropped from the list drain (finish in flight, then close); they are
        # announced once as DRAINING, then forgotten at the next change
        drained = {Endpoint(e.address, e.weight, EndpointState.DRAINING, e.name)
                   for e in self._current if e.address not in new_addrs and e.state is EndpointState.READY}
        self._current = frozenset(new | drained)
        self._changed.set()

    async def watch(self) -> AsyncIterator[frozenset[Endpoint]]:
        while not self._closed:
            self._changed.clear()
            yield self._current
            await self._changed.wait()

    async def close(self) -> None:
        self._closed = True
        self._changed.set()


def make_discovery(settings: GatewaySettings) -> Discovery:
    """Build the configured discovery source (dns/kubernetes imported lazily).

    ``discovery.dns`` / ``discovery.kubernetes`` are the keyword arguments of
    ``cloud.discovery.dns.DnsDiscovery`` (name, port, interval_s, …) and
    ``cloud.discovery.kubernetes.KubernetesDiscovery`` (service, namespace,
    port_name, weight_annotation, …).
    """
    d = settings.discovery
    if d.kind == "static":
        return ReloadableStaticDiscovery(d.static)
    factory: Callable[..., Any]
    if d.kind == "dns":
        from cloud.discovery.dns import DnsDiscovery

        factory, opts = DnsDiscovery, d.dns
    else:
        from cloud.discovery.kubernetes import KubernetesDiscovery

        factory, opts = KubernetesDiscovery, d.kubernetes
    try:
        return factory(**opts)  # type: ignore[no-any-return]
    except TypeError as exc:
        raise ConfigError(f"discovery.{d.kind}: {exc} (see the options of {factory.__name__})") from None


class _StreamWindow:
    """The frames one ``DetectStream`` holds: read from its client and not yet answered back to
    it (at a worker, or answered and waiting to be written). At most ``limit``
    (``limits.max_stream_in_flight``): the stream stops reading while it holds that many, so a
    client that does not read its answers is held back by gRPC flow control instead of the
    gateway keeping its answers in memory. ``gauge`` counts what every stream holds."""

    def __init__(self, limit: int, gauge: Gauge) -> None:
        self._room = asyncio.Semaphore(limit)
        self._gauge = gauge
        self.held = 0
        self._closed = False

    async def take(self) -> None:
        await self._room.acquire()
        self.held += 1
        self._gauge.inc()

    def give_back(self) -> None:
        """One frame's answer was written (or none will be)."""
        if self._closed:
            return
        self.held -= 1
        self._gauge.dec()
        self._room.release()

    def close(self) -> None:
        """The stream ended: what it still held is no longer pending."""
        if not self._closed:
            self._closed = True
            self._gauge.dec(self.held)
            self.held = 0


async def _abort(context: grpc.aio.ServicerContext, wire_status: int, message: str) -> None:
    """End a call with an error status (raises ``grpc.aio.AbortError``, or ``CancelledError``
    when the client already left)."""
    with unless_client_gone(f"its {status.name(wire_status)} answer", log):
        await context.abort(status.grpc_code(wire_status), message)


class _Screen(grpc.aio.ServerInterceptor):
    """With authentication on, refuses a call whose metadata has no device's token at once,
    before its request is read (``TokenAuth.screen``): Detect and the gRPC health service
    (Check and Watch). gRPC holds one of ``limits.max_concurrent_rpcs`` for a call from its
    headers on and calls a unary method only once its request arrived: without this, a client
    with no token that opened calls and never sent them (or held health Watch streams open)
    froze every edge out of the gateway. The refusal takes a stream of requests, which gRPC
    calls without waiting for a message. A DetectStream is refused at its start by its own
    handler, which also wants the device's name. The chart's readiness probe asks the side
    port's ``/healthz`` when tokens are set (the kubelet's gRPC probe sends none). A call with a
    device's token holds one of that device's ``limits.max_calls_per_device`` slots from its
    headers to its end (``cloud.gateway.callslots``): a device with a valid token held them all."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.detect = f"/{SERVICE_NAME}/Detect"
        self.stream = f"/{SERVICE_NAME}/DetectStream"
        self.slots = CallSlots(gateway.settings.limits.max_calls_per_device)
        self._slot_log = LogThrottle(10.0, burst=5)

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        auth = self.gateway.auth
        if not auth.enabled:
            return await continuation(details)
        metadata = {k.lower(): v for k, v in details.invocation_metadata or () if isinstance(v, str)}
        device = auth.holder(metadata)
        if device:  # a device's token: its call holds one of the device's slots (limits.max_calls_per_device)
            handler = await continuation(details)
            refuse = functools.partial(self._refuse_slot, device=device, request=details.method == self.detect)
            return self.slots.counted(handler, device, refuse) if handler is not None else None
        if details.method == self.stream:
            return await continuation(details)
        bad = auth.screen(metadata)
        if bad is None:
            return await continuation(details)
        if details.method == self.detect:
            return grpc.stream_unary_rpc_method_handler(functools.partial(self._refuse_request, bad=bad))
        handler = await continuation(details)
        refuse = functools.partial(self._refuse_call, bad=bad, method=details.method)
        if handler is not None and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.stream_unary_rpc_method_handler(refuse)

    async def _refuse_request(self, _requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                              bad: Rejection) -> bytes:
        """A Detect: counted like every refused request (``requests_total``, ``rejected_total``)."""
        reply = self.gateway._reject(None, "grpc", bad, self.gateway._caller(context))
        await _abort(context, reply.status, reply.error)
        return b""

    async def _refuse_slot(self, context: grpc.aio.ServicerContext, device: str, request: bool) -> None:
        """A call of a device that holds ``limits.max_calls_per_device`` calls already: a Detect
        (``request``) is counted as an answered request, any call in
        ``rejected_total{reason="too_many_calls"}``."""
        gw = self.gateway
        cap = gw.settings.limits.max_calls_per_device
        gw.metrics.rejected.labels(reason="too_many_calls").inc()
        if request:
            gw.metrics.answered("grpc", status.name(status.RESOURCE_EXHAUSTED))
        held = self._slot_log.allow()
        if held is not None:
            log.warning("refused a gRPC call from %s for device %s: it holds %d calls open, "
                        "limits.max_calls_per_device%s", context.peer() or "unknown peer", quote_id(device), cap,
                        f" ({held} more refusals not logged)" if held else "")
        await _abort(context, status.RESOURCE_EXHAUSTED,
                     f"device {quote_id(device)} already holds {cap} "
                     "gRPC calls open at the gateway, its limits.max_calls_per_device; wait for its calls to end before opening more (an edge "
                     "holds at most cloud.max_in_flight escalations and spool.replay_concurrency replays)")

    async def _refuse_call(self, _requests: AsyncIterator[Any], context: grpc.aio.ServicerContext,
                           bad: Rejection, method: str) -> None:
        """Another method (a health check): not a request, counted in ``rejected_total`` only."""
        self.gateway.metrics.rejected.labels(reason="unauthenticated").inc()
        self.gateway._log_refused(method, bad, self.gateway._caller(context), "")
        await _abort(context, bad.status, bad.message)


#: ``tls.client_identity`` -> the gRPC auth-context property holding those certificate names
_CERT_NAME_PROPERTY = {"cn": "x509_common_name", "san_dns": "peer_dns", "san_uri": "peer_uri"}


def passed_deadline(req: RequestHead, call_remaining: float | None, now_ns: int) -> str:
    """Why a request whose deadline had passed on arrival (``now_ns``, the gateway's wall clock) is
    refused: its ``deadline_unix_ns`` (wall time, read on the gateway's clock: a slow trip, or a
    client clock behind the gateway's, which makes every request late by the same amount; the
    gateway cannot tell which), else the call's own deadline (relative, so no clock is involved:
    the call took that long to begin)."""
    head = "the request's deadline had already passed at the gateway"
    late_s = (now_ns - req.deadline_unix_ns) / 1e9
    if req.deadline_unix_ns > 0 and late_s >= 0 and (call_remaining is None or call_remaining > 0):
        return (f"{head}: its deadline_unix_ns was {late_s:.3f} s before the gateway's clock when it arrived. "
                "deadline_unix_ns is wall time: either the request took longer to arrive than its deadline "
                "allowed (a slow link: give it a later deadline), or the client's clock is behind the gateway's, "
                "which makes every request late by as much: sync the client's clock (NTP), or send "
                "deadline_unix_ns 0 and give the call a timeout instead (relative: no clocks to agree)")
    return (f"{head}: the call's own deadline had passed before the gateway began it (a slow link or a "
            "busy gateway); give the call a longer timeout")


class Gateway:
    """One gateway: build with settings, ``await start()``, ``await stop()``."""

    def __init__(self, settings: GatewaySettings, discovery: Discovery | None = None) -> None:
        self.settings = settings
        self.pool = WorkerPool(settings)
        self.metrics = self.pool.metrics
        #: the settings whose auth.tokens / auth.tokens_file are in force (SIGHUP may bring others),
        #: and the tokens file as last read (looked at before it is read)
        self._tokens_from = settings
        self._tokens_watch: ReloadDecision[dict[str, str]] = ReloadDecision(
            identities_of((settings.auth.tokens_file,)), time.monotonic(), interval_s=0.0)
        self._tokens_poll_changed = asyncio.Event()  # SIGHUP brought another auth.tokens_poll_s
        #: held by each reload of the tokens (a SIGHUP's, the file watch's), one at a time: each reads
        #: in a thread (a fleet's file takes seconds), and the one that read last is put in force last
        self.tokens_lock = asyncio.Lock()
        self.auth = TokenAuth(settings.device_tokens())
        lim = settings.limits
        self.limiter = RateLimiter(lim.rate_per_device, lim.burst_per_device)
        self.discovery = discovery or make_discovery(settings)
        self.health = HealthServicer()
        self.side = SidePort(self.metrics.registry, self.pool.snapshot, lambda: self.serving)
        self.serving = False
        self.port = 0
        self.metrics_port = -1  # the side port's, once bound (-1: off, as settings.metrics_port says)
        self._server: grpc.aio.Server | None = None
        self.interceptor = _Screen(self)  # the interceptor: unknown tokens, the calls each device holds
        self._tasks: list[asyncio.Task[Any]] = []
        self.bridge: MqttBridge | None = None
        self.tls_files: ServedTlsFiles | None = None  # with TLS, once started
        # refused authentications are logged, a few per interval (a client can repeat them at will)
        self._auth_log = LogThrottle(10.0, burst=5)
        self._stream_log = LogThrottle(10.0, burst=5)
        self.streams_of: dict[str, int] = {}  # device (x-edgewise-device) -> its open DetectStreams

    # ---- the one request path ---------------------------------------------------------------
    def timeout_for(self, req: RequestHead, call_remaining: float | None) -> float:
        """min(call deadline, request deadline_unix_ns); default when neither; capped."""
        lim = self.settings.limits
        cands = [c for c in (call_remaining,) if c is not None]
        if req.deadline_unix_ns > 0:  # a negative one is refused by validate_request
            cands.append((req.deadline_unix_ns - time.time_ns()) / 1e9)
        t = min(cands) if cands else lim.default_deadline_s
        return min(t, lim.max_deadline_s)

    def read(self, body: bytes, transport: str) -> RequestHead | Reply:
        """The head of a serialized request, or the INVALID_ARGUMENT reply when the bytes are
        not a ``DetectRequest`` or larger than ``limits.max_message_bytes`` (``admission.oversize``;
        counted like every rejection). gRPC refuses a larger message itself, in the same words;
        MQTT brings any size to here, and the bytes would go on to a worker whose channel has the
        same limit."""
        too_large = oversize(len(body), self.settings.limits.max_message_bytes)
        if too_large is not None:
            return self._reject(None, transport, too_large)
        try:
            return read_request(body, self.settings.limits.max_edge_detections)
        except InvalidInputError as exc:
            return self._reject(None, transport, Rejection(status.INVALID_ARGUMENT, str(exc)))

    def screen(self, req: RequestHead | None, transport: str, caller: Caller) -> Reply | None:
        """The reply of a request whose caller ``handle`` would refuse (its authentication), else
        None. Without ``req`` (not read yet), what the caller alone shows: its token must be that of
        the device it claims (MQTT: the request topic's). The MQTT bridge asks before it reads a
        request or counts it against its device (as gRPC's interceptor screens a call's headers),
        and a transport too busy to take a request tells a refused caller so, not to retry."""
        bad = self.auth.authenticate(caller, req.device_id if req is not None else "")
        return self._reject(req, transport, bad, caller) if bad is not None else None

    async def handle(self, req: RequestHead, transport: str, caller: Caller,
                     call_remaining: float | None = None) -> Reply:
        """The one request path of both transports: authenticate ``caller`` (token, client
        certificate, MQTT topic), validate, rate-limit and forward; always returns a reply."""
        timeout_s = self.timeout_for(req, call_remaining)
        bad = self.auth.authenticate(caller, req.device_id)
        checked = bad or validate_request(req, self.settings.limits)
        if isinstance(checked, Rejection):
            return self._reject(req, transport, checked, caller)
        bad = self.limiter.allow(req.device_id)
        if bad is None and timeout_s <= 0:
            bad = Rejection(status.DEADLINE_EXCEEDED, passed_deadline(req, call_remaining, time.time_ns()))
        if bad is not None:
            return self._reject(req, transport, bad)
        return await self.pool.forward(req, timeout_s, transport, pixels=checked.pixels)

    def _reject(self, req: RequestHead | None, transport: str, bad: Rejection,
                caller: Caller | None = None) -> Reply:
        name = status.name(bad.status)
        self.metrics.rejected.labels(reason=name.lower()).inc()
        self.metrics.answered(transport, name)
        if bad.status == status.UNAUTHENTICATED:
            self._log_refused(transport, bad, caller, req.device_id if req is not None else "")
        return error_reply(req, bad.status, bad.message)

    def _log_refused(self, transport: str, bad: Rejection, caller: Caller | None, device_id: str) -> None:
        """A WARNING (a few per interval) for a refused authentication: the reason, with the
        detail the client is not told, the peer and the device id (cut short); never a token."""
        held = self._auth_log.allow()
        if held is None:
            return
        peer = (caller.peer if caller is not None else "") or "unknown peer"
        device = device_id or (caller.metadata.get("x-edgewise-device", "") if caller is not None else "")
        log.warning("refused unauthenticated %s request from %s for device %s: %s%s%s", transport, peer,
                    quote_id(device) if device else "(none)", bad.message,
                    f" [{bad.detail}]" if bad.detail else "",
                    f" ({held} more refusals not logged)" if held else "")

    # ---- gRPC methods (serialized messages in and out) --------------------------------------
    def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        """The caller of a gRPC call: its metadata and, with client certificates, their names."""
        md = context.invocation_metadata() or ()
        metadata = {k.lower(): v for k, v in md if isinstance(v, str)}
        prop = _CERT_NAME_PROPERTY.get(self.settings.tls.client_identity)
        if prop is None or not self.settings.tls.client_ca_file:
            return Caller(metadata, peer=context.peer())
        names = (context.auth_context() or {}).get(prop, ())
        return Caller(metadata, tuple(n.decode("utf-8", "replace") for n in names), peer=context.peer())

    async def _one(self, body: bytes, transport: str, caller: Caller, remaining: float | None) -> Reply:
        """One gRPC request, answered; a call that ends before its answer (the client gave up
        first) is counted as unanswered, so every request arriving is in one counter or the other."""
        try:
            head = self.read(body, transport)
            return head if isinstance(head, Reply) else await self.handle(head, transport, caller, remaining)
        except asyncio.CancelledError:
            self.metrics.unanswered.labels(transport).inc()
            raise

    async def Detect(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        reply = await self._one(body, "grpc", self._caller(context), context.time_remaining())
        if not status.is_ok(reply.status):
            await _abort(context, reply.status, reply.error)
        return reply.body

    async def DetectStream(self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        caller = self._caller(context)
        if self.auth.enabled:  # refuse a stream without a valid token at once (each frame is checked too)
            _, rej = self.auth.check(caller.metadata, "", stream=True)
            if rej is not None:
                self.metrics.rejected.labels(reason="unauthenticated").inc()
                self._log_refused("grpc-stream", rej, caller, "")
                await _abort(context, rej.status, rej.message)
        device = caller.metadata.get("x-edgewise-device", "")
        if caller.cert_names is not None:
            # the stream is counted under a name of its certificate: the label it claims must be
            # one (one device's certificate filled another's stream slots, tokens off; found by a
            # probe), and a stream without a label counts under the certificate's first name
            device = device or (caller.cert_names[0] if caller.cert_names else "")
            rej = self.auth.authenticate(caller, device) if device else None
            if rej is not None:
                self.metrics.rejected.labels(reason="unauthenticated").inc()
                self._log_refused("grpc-stream", rej, caller, device)
                await _abort(context, rej.status, rej.message)
        cap = self.settings.limits.max_streams_per_device
        if device and self.streams_of.get(device, 0) >= cap:
            self.metrics.rejected.labels(reason="too_many_streams").inc()
            held = self._stream_log.allow()
            if held is not None:
                log.warning("refused a DetectStream from %s for device %s: it has %d open, "
                            "limits.max_streams_per_device%s", caller.peer or "unknown peer", quote_id(device), cap,
                            f" ({held} more refusals not logged)" if held else "")
            await _abort(context, status.RESOURCE_EXHAUSTED,
                         f"device {quote_id(device)} already has {cap} "
                         "DetectStreams open, the gateway's limits.max_streams_per_device; "
                         "send on an open stream, or close one first")
        if device:
            self.streams_of[device] = self.streams_of.get(device, 0) + 1
        try:
            await self._stream(request_iterator, context, caller)
        finally:
            if device:
                left = self.streams_of[device] - 1
                if left:
                    self.streams_of[device] = left
                else:
                    del self.streams_of[device]

    async def _stream(self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                      caller: Caller) -> None:
        """One DetectStream once admitted: frames answered as they complete, at most
        ``limits.max_stream_in_flight`` held, ended with UNAVAILABLE once idle for
        ``limits.stream_idle_timeout_s``."""
        out: asyncio.Queue[bytes | None] = asyncio.Queue()
        window = _StreamWindow(self.settings.limits.max_stream_in_flight, self.metrics.stream_pending)
        running: set[asyncio.Task[None]] = set()
        idle_s = self.settings.limits.stream_idle_timeout_s
        last_frame = time.monotonic()

        async def one(body: bytes) -> None:
            try:
                answer = (await self._one(body, "grpc-stream", caller, context.time_remaining())).body
            except BaseException:  # nothing will be written for this frame
                window.give_back()
                raise
            out.put_nowait(answer)

        async def reader() -> None:
            nonlocal last_frame
            try:
                async for body in request_iterator:
                    last_frame = time.monotonic()
                    await window.take()  # backpressure: stop reading while the stream holds its limit
                    t = asyncio.ensure_future(one(body))
                    running.add(t)
                    t.add_done_callback(running.discard)
                if running:
                    await asyncio.gather(*list(running), return_exceptions=True)
            finally:
                out.put_nowait(None)

        idle = asyncio.Event()

        async def watchdog() -> None:
            """Sets ``idle`` once no frame came for ``idle_s`` and nothing is pending."""
            while not rtask.done():  # done: the client closed its side, the stream ends anyway
                quiet = time.monotonic() - last_frame
                if quiet >= idle_s and window.held == 0:
                    idle.set()
                    out.put_nowait(None)
                    return
                await asyncio.sleep(max(idle_s - quiet, 0.0) if window.held == 0 else idle_s)

        rtask = asyncio.ensure_future(reader())
        wtask = asyncio.ensure_future(watchdog())
        try:
            with unless_client_gone("a stream answer", log):
                while (item := await out.get()) is not None:
                    await context.write(item)
                    window.give_back()  # written: room for one more frame
            if idle.is_set():
                log.debug("DetectStream from %s ended: no frame for %g s", caller.peer, idle_s)
                await _abort(context, status.UNAVAILABLE,
                             f"DetectStream ended by the gateway: no frame for {idle_s:g} s "
                             "(limits.stream_idle_timeout_s); open a new stream to send again")
        finally:
            wtask.cancel()
            rtask.cancel()
            for t in list(running):
                t.cancel()
            window.close()

    # ---- lifecycle -------------------------------------------------------------------------
    def _credentials(self) -> grpc.ServerCredentials | None:
        """The TLS files checked (a ConfigError naming them otherwise), and credentials that
        follow them: a renewed certificate or client CA is served to new connections without a
        restart (``cloud.gateway.tlsreload``)."""
        tls = self.settings.tls
        if not tls.cert_file:
            return None
        files = self.tls_files = ServedTlsFiles(tls.cert_file, tls.key_file, tls.client_ca_file, tls.require_client_cert)
        self.metrics.follow_certificate(lambda: files.not_after)
        return files.credentials

    async def start(self) -> int:
        """Bind, start serving; returns the bound gRPC port."""
        s = self.settings
        open_file_room(s.limits.max_connections + FD_RESERVE)
        creds = self._credentials()  # bad TLS files fail here, before anything is bound
        m = s.limits.max_message_bytes
        self._server = grpc.aio.server(options=server_options(m, s.limits.max_streams_per_connection,
                                                              s.limits.max_connections,
                                                              s.limits.max_connection_age_s),
                                       maximum_concurrent_rpcs=s.limits.max_concurrent_rpcs,
                                       interceptors=(self.interceptor,))
        # no (de)serializers: the methods see the bytes on the wire (cloud.gateway.envelope)
        methods = {"Detect": grpc.unary_unary_rpc_method_handler(self.Detect),
                   "DetectStream": grpc.stream_stream_rpc_method_handler(self.DetectStream)}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, methods),))
        self._server.add_registered_method_handlers(SERVICE_NAME, methods)
        add_health(self.health, self._server)
        self.port = grpc_port(self._server, s.listen, "listen", creds)
        if s.metrics_port >= 0:
            self.metrics_port = await socket_port_async(
                lambda: self.side.start(s.metrics_host, s.metrics_port),
                format_address(s.metrics_host, s.metrics_port), "metrics_host/metrics_port")
        frozen = "the worker set is frozen until restart"
        loops: list[tuple[Awaitable[None], str, str]] = [
            (self.pool.follow(self.discovery.watch()), "discovery", frozen),
            (self.pool.poll_loads(), "load polling", frozen),
            (self.watch_tokens_file(), "the device tokens file watch", "the device tokens are re-read on SIGHUP only")]
        for coro, what, then in loops:
            task: asyncio.Task[Any] = asyncio.ensure_future(coro)
            task.add_done_callback(functools.partial(self._task_ended, what=what, then=then))
            self._tasks.append(task)
        await self._server.start()
        if s.mqtt.enabled:
            self.metrics.follow_mqtt()
            self.bridge = MqttBridge(s.mqtt, self, self.metrics.mqtt, up=self.metrics.mqtt_connected,
                                     max_message_bytes=s.limits.max_message_bytes)
            self.bridge.start()
        if not self.auth.enabled:
            log.warning("authentication is OFF (auth.tokens is empty): any client may call the gateway")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.pool.ready.wait(), 5.0)
        self.serving = True
        for svc in ("", SERVICE_NAME):
            await self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        log.info("gateway serving on port %d (metrics %d)", self.port, self.metrics_port)
        return self.port

    def _task_ended(self, task: asyncio.Task[Any], what: str, then: str) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # e.g. the pool keeps its last known workers; say loudly that updates stopped
            log.error("%s stopped: %r; %s", what, exc, then)

    async def withdraw(self) -> None:
        """Say NOT_SERVING (the side port's ``/healthz`` 503, the gRPC health service, Watch
        streams told) while both transports go on serving: readiness probes and balancers take
        the gateway out of rotation. Nothing can say SERVING again after it."""
        self.serving = False
        await self.health.enter_graceful_shutdown()

    async def shut_down(self, hurry: asyncio.Event | None = None) -> None:
        """A SIGTERM's stop: :meth:`withdraw`, go on serving for ``shutdown_delay_s`` (or until
        ``hurry`` is set: a second signal) while Kubernetes takes the pod out of its Service
        (the EndpointSlice reaches every node's kube-proxy seconds after the signal: an edge
        that connected meanwhile was refused and spooled), then :meth:`stop`."""
        await self.withdraw()
        delay = self.settings.shutdown_delay_s
        if delay > 0 and not (hurry is not None and hurry.is_set()):
            log.info("stopping: NOT_SERVING, still serving for %g s (shutdown_delay_s) while load balancers take "
                     "this gateway out, then draining for up to %g s; a second SIGTERM or SIGINT drains at once",
                     delay, self.settings.shutdown_grace_s)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for((hurry or asyncio.Event()).wait(), delay)
            if hurry is not None and hurry.is_set():
                log.info("second stop signal: the rest of shutdown_delay_s skipped")
        log.info("shutting down: draining for up to %.1f s", self.settings.shutdown_grace_s)
        await self.stop()

    async def stop(self, grace: float | None = None) -> None:
        """Drain at once: new calls refused, in-flight ones (both transports) given ``grace``
        (``shutdown_grace_s``), then everything closed."""
        grace = self.settings.shutdown_grace_s if grace is None else grace
        await self.withdraw()
        # together, one grace for both: one after the other took two (past the pod's
        # terminationGracePeriodSeconds for a grace over 15 s), and the gRPC server took new
        # calls while the bridge drained
        draining = [s.stop(grace) for s in (self.bridge, self._server) if s is not None]
        await asyncio.gather(*draining)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.discovery.close()
        await self.pool.close()
        await self.side.stop()

    def reload_workers(self, specs: list[str]) -> None:
        if isinstance(self.discovery, ReloadableStaticDiscovery):
            self.discovery.replace(specs)
            log.info("worker list reloaded: %d workers", len(specs))

    def reload_tokens(self, tokens: dict[str, str], source: GatewaySettings | None = None,
                      seen: FileIdentity | None = None) -> bool:
        """Put a new device -> token table in force (a rotated token, a device added or
        removed): the one path of SIGHUP and of a changed tokens file. ``tokens`` comes from
        ``source.device_tokens()`` (which refuses a malformed file, or one listing no device);
        ``seen`` is the identity of ``source``'s tokens file looked at before that read, the
        file watched from now on. An empty table while authentication is on is refused: an
        emptied or half-written tokens file must not switch authentication off. Returns whether
        the table is in force."""
        if self.auth.enabled and not tokens:
            log.error("token reload ignored: auth.tokens and auth.tokens_file now list no device, which would "
                      "turn authentication off; restart the gateway to run without authentication")
            return False
        if source is not None:
            if source.auth.tokens_poll_s != self._tokens_from.auth.tokens_poll_s:
                self._tokens_poll_changed.set()
            self._tokens_from = source
            self._tokens_watch.acted((seen,))
        added = sorted(tokens.keys() - self.auth.tokens.keys())
        removed = sorted(self.auth.tokens.keys() - tokens.keys())
        changed = sorted(d for d in tokens.keys() & self.auth.tokens.keys() if tokens[d] != self.auth.tokens[d])
        self.auth.tokens = dict(tokens)
        log.info("device tokens reloaded: %d devices (%d added, %d removed, %d changed)",
                 len(tokens), len(added), len(removed), len(changed))
        return True

    async def check_tokens_file(self) -> None:
        """One look at ``auth.tokens_file`` (every ``auth.tokens_poll_s``), decided as the TLS
        files are (``edgewise.filewatch.ReloadDecision``): when it changed, the tokens are read
        again as on SIGHUP (``GatewaySettings.device_tokens``, the same checks) and put in force
        by :meth:`reload_tokens`. A file that cannot be used (half-written, malformed, listing
        no device, gone) leaves the tokens in force and is logged once per change, not at every
        look (it is read again, unchanged, once a minute: a read error that passes does not hold
        a new device's token back); one that changed while it was read is not used, and read
        again at the next look. The file is read and checked in a thread: 20,000 devices take
        seconds, and on the event loop every request waited for them (7.3 s)."""
        async with self.tokens_lock:
            source = self._tokens_from
            path = source.auth.tokens_file
            if not path:
                return
            out = await asyncio.to_thread(self._tokens_watch.look, time.monotonic(), lambda: identities_of((path,)),
                                          source.device_tokens)
            if out.problem is not None:
                if file_identity(path) is None:
                    log.warning("device tokens file %s cannot be read (gone, or a link to nothing); the tokens in "
                                "force stay until it is back", path)
                else:
                    log.error("device tokens file %s changed: reload ignored, the tokens in force stay (%s): %s",
                              path, self._tokens_watch.when_again, out.problem)
                return
            if out.files is not None:
                log.info("device tokens file %s changed; reloading the device tokens", path)
                self.reload_tokens(out.files)

    async def watch_tokens_file(self) -> None:
        """:meth:`check_tokens_file` every ``auth.tokens_poll_s`` of the settings in force (a
        SIGHUP may bring another interval; 0 = no look) until cancelled; an unexpected error is
        logged with its traceback and the next look tried again."""
        while True:
            interval = self._tokens_from.auth.tokens_poll_s
            self._tokens_poll_changed.clear()
            try:
                await asyncio.wait_for(self._tokens_poll_changed.wait(), interval if interval > 0 else None)
            except asyncio.TimeoutError:
                pass
            else:
                log.info("device tokens file: looked at %s from now on", f"every {self._tokens_from.auth.tokens_poll_s:g} s"
                         if self._tokens_from.auth.tokens_poll_s > 0 else "on SIGHUP only (auth.tokens_poll_s: 0)")
                continue
            try:
                await self.check_tokens_file()
            except Exception:
                log.exception("looking at the device tokens file failed; trying again in %g s", interval)


#: the settings a SIGHUP puts in force; any other change waits for a restart (and is logged)
RELOADED_ON_SIGHUP = ("discovery.static", "auth.tokens", "auth.tokens_file", "auth.tokens_poll_s")


def open_file_room(needed: int) -> int:
    """Raise the soft open-file limit to ``needed`` descriptors where the hard limit allows (any
    process may), and say so where it does not; returns the soft limit now. systemd's default,
    containerd's since 2.0 and podman's are a soft 1024: at about 1,000 edges accept failed
    with EMFILE long before ``limits.max_connections`` (4096) was reached, and with it
    ``/healthz``, ``/metrics`` and every reconnect to a worker or the broker (found by a probe:
    1,024 descriptors, a 1,025th edge and the health check refused)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a sandbox that refuses it
            log.debug("cannot raise the open-file limit to %d: %s", target, exc)
    if soft < needed:
        log.warning("the open-file limit is %d (hard %s), below the %d that limits.max_connections %d needs with "
                    "%d for the rest: past about %d edges, new connections, /healthz, /metrics and reconnects to "
                    "workers and the broker fail with 'Too many open files'; raise it (LimitNOFILE=, the "
                    "container's nofile ulimit) or lower limits.max_connections", soft,
                    "unlimited" if hard == resource.RLIM_INFINITY else hard, needed, needed - FD_RESERVE,
                    FD_RESERVE, max(0, soft - FD_RESERVE))
    return soft


async def serve(settings: GatewaySettings, reload: Callable[[], GatewaySettings] | None = None,
                announce: bool = True) -> None:
    """Run a gateway until SIGTERM/SIGINT, then stop it (``Gateway.shut_down``: a second signal skips the rest of
    its ``shutdown_delay_s``); SIGHUP re-reads the static worker list and the
    device tokens (``auth.tokens``, ``auth.tokens_file``; the file is also re-read by itself
    when it changes, ``Gateway.check_tokens_file``)."""
    gw = Gateway(settings)
    port = await gw.start()
    if announce:
        print(f"{LISTENING_LINE} port={port} metrics_port={gw.metrics_port}", flush=True)
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()  # the first SIGTERM/SIGINT, a second one

    def on_stop() -> None:
        (hurry if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)

    waiting: list[asyncio.Task[None]] = []  # the SIGHUP reload that has not begun to read yet
    stopping = False

    def on_hup() -> None:
        # the reading is done in a thread (a fleet's tokens file takes seconds: on the event loop,
        # every request waited for it); SIGHUPs that come before it begins are one reload
        if reload is not None and not waiting and not stopping:
            waiting.append(loop.create_task(hup()))

    def read() -> tuple[GatewaySettings, FileIdentity | None, dict[str, str]]:
        assert reload is not None
        fresh = reload()
        seen = file_identity(fresh.auth.tokens_file)  # before the read, as the file watch does
        return fresh, seen, fresh.device_tokens()

    async def hup() -> None:
        async with gw.tokens_lock:  # after a reload (or file watch) still reading: it reads after it
            waiting.clear()
            try:
                fresh, seen, tokens = await asyncio.to_thread(read)
            except ConfigError as exc:
                log.error("reload ignored, the workers and tokens in force stay: %s", exc)
                return
            except Exception:  # a reader's bug must not end the reload without a word (nor the gateway)
                log.exception("reload ignored, the workers and tokens in force stay: reading the settings failed")
                return
            try:
                apply(fresh, seen, tokens)
            except Exception:  # (in a task: its exception would be logged only when it is collected)
                log.exception("SIGHUP: applying the reloaded settings failed")

    def apply(fresh: GatewaySettings, seen: FileIdentity | None, tokens: dict[str, str]) -> None:
        later = [k for k in changed_keys(settings, fresh) if k not in RELOADED_ON_SIGHUP]
        if later:
            log.warning("SIGHUP: %s changed, which a reload does not apply (it applies %s); the values the gateway "
                        "started with stay until a restart", ", ".join(later), ", ".join(RELOADED_ON_SIGHUP))
        if fresh.discovery.kind == settings.discovery.kind:
            gw.reload_workers(fresh.discovery.static)
        else:  # the static list of a settings file moved to dns or kubernetes is empty: it emptied the pool
            log.warning("SIGHUP: discovery.kind is now %s but stays %s until a restart, so the workers in force "
                        "stay too (discovery.static is not applied)", fresh.discovery.kind, settings.discovery.kind)
        gw.reload_tokens(tokens, fresh, seen)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    if hangup.take():  # one came while the gateway started (edgewise.hangup)
        log.info("SIGHUP during the start: reloading the workers and tokens")
        on_hup()
    await stop.wait()
    stopping = True
    for task in waiting:  # (one reading goes on to its end: put in force, nothing is lost by it)
        task.cancel()
    await gw.shut_down(hurry)
    hangup.ignore_from_now(loop)  # nothing left to reload (edgewise.hangup)
