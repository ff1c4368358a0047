"""gRPC escalation transport (grpc.aio): keepalive, per-request deadline, retry on
UNAVAILABLE as channel service-config policy, TLS / mutual TLS and a bearer token.

The TLS files (``cloud.tls_ca``, ``cloud.tls_cert``, ``cloud.tls_key``) are followed without a
restart: a client certificate renewed on the device (short-lived certificates renewed by an agent
such as ``step ca renew --daemon``, or ``edgewise edge provision`` writing new files) or a rotated
CA bundle is used from the next call on. Before a call, at most once a second
(``edgewise.filewatch``), the files are looked at; when they changed they are read and checked
as at start (``edge.tlsfiles``: the CA bundle parses, the key belongs to the certificate), new
channels are opened to the endpoints for the calls from then on, and the old ones are closed in
the background once the calls still on them end (their deadlines bound the wait). Files that cannot be used
are one ERROR per change naming the setting and the problem; the channels in force stay. Before,
the files were read once at start: the gRPC channel reconnected with the old certificate until
the daemon restarted, and once it expired every escalation was refused and spooled.

Retries follow gRPC's ``examples/python/retry/retry_client.py`` (service config,
not a hand-written loop; docs/design/conventions.md#grpc-idioms). Several endpoints are tried in
order when one is UNAVAILABLE, each call from the one that last answered; ``FAILBACK_S`` after a
fail-over an earlier endpoint whose connection is up again is used again (``GrpcTransport._first``).
An endpoint that lets ``UNANSWERED_FAILOVER`` calls in a row run out their deadline without an
answer (a hung gateway, whose connection stays up) is failed over from too. Unlike Sedna's client (docs/design/escalation.md#sedna-baselines:
JSON pixels, no timeout), every call has a deadline. A call that the uplink cannot carry by
its deadline, at the rate the cloud's answers show, is refused at once, unsent
(``edge.transports.uplink``: over a slow link the calls otherwise shared it and all missed
their deadlines, one behind another). Callers:
``edge.escalating``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import grpc
from grpc import aio

from edge.tlsfiles import check_files
from edge.transports import (
    MAX_ANSWER_BYTES,
    RECONNECT_DELAY_S,
    TLS_SETTINGS,
    TransportError,
    check_response,
    not_a_response,
    printable,
)
from edge.transports.uplink import UplinkWindow
from edgewise import status
from edgewise.errors import ConfigError
from edgewise.filewatch import RECHECK_S, FollowedFiles
from edgewise.observability import LogThrottle

log = logging.getLogger(__name__)

MAX_MESSAGE = MAX_ANSWER_BYTES
#: Channels replaced by renewed TLS files are closed once the calls still on them end, at the
#: latest this many seconds after the last of their deadlines (each call has one): a renewal
#: cuts no call short, and a retired channel does not stay open for long.
RETIRE_SLACK_S = 1.0
#: "endpoint ... unavailable, trying the next one" at most this many times per
#: ``FAILOVER_LOG_INTERVAL_S``: with every endpoint down each escalation fails over again
FAILOVER_LOG_BURST = 3
FAILOVER_LOG_INTERVAL_S = 60.0
#: After a fail-over, the earlier endpoints are looked at again from this many seconds on: a call
#: then begins at the first of them whose connection is up (READY), as gRPC's priority policy
#: goes back to a higher priority once it is READY. Not at once: a gateway that is connected
#: but refuses (UNAVAILABLE: no worker up) costs one call's fail-over per interval, not each call's.
FAILBACK_S = 10.0
#: Calls in a row that an endpoint let run out their deadline without an answer (a gateway whose
#: process or node hangs: its connection stays up, so it is never UNAVAILABLE) after which calls
#: begin at the next endpoint. A gateway answers its own failures, a deadline it cannot meet
#: included, with a status and its own message (``unanswered``); no answer at all is its silence.
UNANSWERED_FAILOVER = 3
#: seconds a keepalive ping waits for its acknowledgement before the connection is given up
#: (a half-open link is noticed within ``cloud.keepalive_s`` and this)
KEEPALIVE_TIMEOUT_S = 10.0
#: the gRPC window counts no bytes against a cap: ``cloud.max_in_flight`` bounds the calls
UNBOUNDED_BYTES = 1 << 62
#: a ``timing.gateway_ms`` longer than this is not believed (the window then takes the answer's
#: arrival): no call's deadline is this long
WINDOW_MAX_GATEWAY_S = 600.0

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


class ChannelTls(NamedTuple):
    """The TLS files, read and checked: the channels' credentials, and what may be wrong with
    the certificate (expired, not yet valid: ``edge.tlsfiles.certificate_warnings``)."""

    credentials: Any  # grpc.ChannelCredentials
    warnings: List[str]


def load_channel_tls(ca: str, cert: str, key: str) -> ChannelTls:
    """The channel credentials of the TLS files, checked first as at start (``edge.tlsfiles``:
    the CA bundle parses, the key belongs to the certificate): a ``ConfigError`` naming the
    setting and the problem when they cannot be used."""
    warnings = check_files(ca, cert, key, "")
    data: List[Optional[bytes]] = []
    for path, setting in zip((ca, cert, key), TLS_SETTINGS):
        try:
            data.append(_read(path))
        except OSError as exc:  # gone since the check
            raise ConfigError(f"{setting} {path}: cannot be read ({exc.strerror or exc})") from None
    creds = grpc.ssl_channel_credentials(root_certificates=data[0], certificate_chain=data[1], private_key=data[2])
    return ChannelTls(creds, warnings)


def connected(channel: Any) -> bool:
    """Whether ``channel`` has a connection to its server now (READY; not looked for: no connection
    attempt is started). A failed call counts as sent (``TransportError.sent``) when its channel
    had one at any time from the call's start to its end (``came_up``, and this after the call): a
    request refused with "failed to connect" (nothing listening, a host unreachable) or still
    waiting for a connection at its deadline never left. Counted, 5 of 5 requests to an
    unreachable cloud were uplink bytes it never carried."""
    return bool(channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY)


#: seconds between two looks at a channel that was not READY when a call on it began (``came_up``)
READY_POLL_S = 0.02


async def came_up(channel: Any) -> bool:
    """Looks at ``channel`` every ``READY_POLL_S`` until it is READY (True), for as long as the
    call it was started for runs (the caller cancels it); False when the channel closed first.
    Looked at before and after a failed call only, a server that took the request on a fresh
    channel and then went away (a restart, a crash) looked unreached: IDLE before the call, TRANSIENT_FAILURE after its retries failed to
    connect, and the request it received was not counted as sent. (Polled, not gRPC's
    ``wait_for_state_change``: a connectivity watch left pending when the call ends completes
    later in gRPC's core, after the event loop may have closed.)"""
    while True:
        state = channel.get_state(try_to_connect=False)
        if state == grpc.ChannelConnectivity.READY:
            return True
        if state == grpc.ChannelConnectivity.SHUTDOWN:  # the transport's close, under the call
            return False
        await asyncio.sleep(READY_POLL_S)


#: the details gRPC's own client gives a call whose deadline ran out before any answer came
CLIENT_DEADLINE_DETAILS = "Deadline Exceeded"


def unanswered(exc: Any) -> bool:
    """Whether a failed call ran out its deadline without an answer (``UNANSWERED_FAILOVER``), not
    a gateway's DEADLINE_EXCEEDED answer. A gateway ends a unary Detect it cannot answer in time
    with that status and its own message (``cloud.gateway.server``: a hop that expired on a busy
    worker, a request whose deadline had passed on arrival, a worker refusing a too-short
    deadline): counted as silence, a gateway that was slow but answering, or an edge whose clock
    was behind the gateway's, was failed over from every 3 calls, from one gateway to the next,
    with a warning that it answered none of them."""
    return bool(exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and exc.details() in (None, "", CLIENT_DEADLINE_DETAILS))


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not endpoints:
            raise ValueError("gRPC transport needs at least one endpoint (cloud.endpoints)")
        self.endpoints = list(endpoints)
        self.tls = (tls_ca, tls_cert, tls_key)
        self.metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self.options = [
            ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
            # how long a ping waits for its acknowledgement: gRPC's own default is 60 s, and over a
            # link that stopped forwarding without closing (a NAT mapping lost, a radio link that
            # hangs) the keepalive_timeout alone did not close the connection: every escalation
            # waited its deadline on the dead one for a minute after a keepalive ping went out,
            # also when the link was back
            ("grpc.http2.ping_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.enable_retries", 1),
            ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            # gRPC's own backoff grows to 120 s: after a cloud outage of a few minutes the channel
            # tried again only every minute or two, and every escalation meanwhile was spooled.
            # (Not grpc.min_reconnect_backoff_ms: gRPC takes it as the least time a connection
            # attempt is given, 20 s, which a slow uplink's TLS handshake needs.)
            ("grpc.initial_reconnect_backoff_ms", int(RECONNECT_DELAY_S[0] * 1000)),
            ("grpc.max_reconnect_backoff_ms", int(RECONNECT_DELAY_S[1] * 1000)),
        ]
        #: the endpoint a call begins with: the last one that answered, or an earlier one whose
        #: connection is up again ``FAILBACK_S`` after the fail-over (``_first``)
        self.preferred = 0
        self._failed_over_at = 0.0  # (clock) when ``preferred`` last moved to a later endpoint
        #: per endpoint, the calls in a row that ran out their deadline there without an answer
        self._unanswered = [0] * len(self.endpoints)
        self._clock = clock
        #: failovers are said a few per interval, with the count held back (a cloud that is
        #: away fails every escalation over, a line each for the whole outage)
        self._failover_log = LogThrottle(FAILOVER_LOG_INTERVAL_S, burst=FAILOVER_LOG_BURST)
        self._in_force = _Channels([], [])
        #: the calls not answered yet, over all endpoints (one uplink): what is refused at once
        #: because it cannot be uploaded by its deadline (module docstring)
        self.window = UplinkWindow(UNBOUNDED_BYTES, acknowledger="the gRPC cloud",
                                   refuse_stalled=False, idle_bound=True)
        #: the TLS files, followed (None: plaintext); built by ``start``
        self.tls_files: Optional[FollowedFiles[ChannelTls]] = None
        #: old channels, closed by their task once the calls still on them end
        self._retiring: Dict[asyncio.Task[None], _Channels] = {}

    @property
    def channels(self) -> List[Any]:
        """The channels new calls go to, one per endpoint."""
        return self._in_force.channels

    @property
    def stubs(self) -> List[Any]:
        return self._in_force.stubs

    async def start(self) -> None:
        """Open the channels. With TLS, the files are read and checked first: a ``ConfigError``
        naming the setting when they cannot be used (``edgewise edge run`` checked them already)."""
        creds = None
        if self.tls[0] or self.tls[1]:
            if self.tls_files is None:
                self.tls_files = FollowedFiles(self.tls, TLS_SETTINGS, lambda: load_channel_tls(*self.tls),
                                               "the gRPC transport", log, self._clock, RECHECK_S)
            creds = self.tls_files.loaded.credentials
        self._in_force = self._open(creds)

    def _open(self, creds: Any) -> _Channels:
        """A channel and a Detect stub per endpoint (``creds`` None: plaintext)."""
        from edgewise.v1 import detect_pb2

        opened = _Channels([], [])
        for ep in self.endpoints:
            ch = aio.secure_channel(ep, creds, options=self.options) if creds else aio.insecure_channel(
                ep, options=self.options
            )
            opened.channels.append(ch)
            opened.stubs.append(ch.unary_unary(
                detect_method(), request_serializer=detect_pb2.DetectRequest.SerializeToString,
                response_deserializer=None))  # raw bytes: decoded by _decode
        return opened

    def _follow_tls(self) -> None:
        """Before a call: when the TLS files changed and can be used, new channels take the calls
        from now on, and the old ones close in the background once their calls end. Never raises
        (``FollowedFiles.look`` logs what goes wrong and keeps the files in force)."""
        if self.tls_files is None:
            return
        new = self.tls_files.look()
        if new is None:
            return
        for warning in new.warnings:
            log.warning("%s", warning)
        old, self._in_force = self._in_force, self._open(new.credentials)
        task = asyncio.ensure_future(self._retire(old))
        self._retiring[task] = old
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def _retire(self, old: _Channels) -> None:
        """Close ``old`` once the calls on it end (a grace: their deadlines, and ``RETIRE_SLACK_S``),
        or at once when the transport closes (this task cancelled): what is still in flight is
        cancelled then."""
        grace = max(0.0, old.until - asyncio.get_running_loop().time()) + RETIRE_SLACK_S
        try:
            await asyncio.wait_for(old.idle(), grace)
        except asyncio.TimeoutError:
            pass
        finally:
            for ch in old.channels:
                await ch.close()

    async def detect(self, request: Any, timeout_s: float) -> Any:
        if not self.stubs:
            await self.start()
        self._follow_tls()
        size = request.ByteSize()
        held = self.window.refusal(size, timeout_s)
        if held is not None:  # it would miss its deadline, and hold back the calls behind it
            raise TransportError(held.status, held.message, sent=False)
        key = object()
        self.window.sent(key, size)
        used = self._in_force  # this call's retries stay on it, and it stays open until they end
        used.calls += 1
        # each endpoint tried gets the whole timeout: the latest this call can end
        used.until = max(used.until, asyncio.get_running_loop().time() + len(used.stubs) * max(timeout_s, 0.001))
        try:
            return await self._detect(used, request, timeout_s, key)
        except TransportError as exc:
            if exc.status == status.DEADLINE_EXCEEDED and exc.sent:
                self.window.missed(key)  # behind others on the link, or a slow cloud: queueing for a while
            raise
        finally:
            self.window.forget(key)  # not answered: what it carried is not known
            used.calls -= 1
            if not used.calls and used.done is not None:
                used.done.set()

    def _first(self, used: _Channels) -> int:
        """The endpoint this call begins with: ``preferred``, or, ``FAILBACK_S`` after a fail-over,
        the first earlier endpoint whose connection is up again (the others are asked to connect,
        in the background: gRPC does not reconnect an idle channel by itself). That one call tries
        the way back: the interval starts again, so the calls made until it answers stay on
        ``preferred`` (all of them went back, and with the earlier gateway still hung each of them
        ran out its deadline there: about 100 lost per interval at 100 escalations a second)."""
        start = self.preferred
        now = self._clock()
        if start and now - self._failed_over_at >= FAILBACK_S:
            for j in range(start):
                state = used.channels[j].get_state(try_to_connect=True)
                if state == grpc.ChannelConnectivity.READY:
                    self._failed_over_at = now
                    return j
        return start

    def _answered(self, key: object, resp: Any) -> None:
        """The cloud answered the call ``key``: its request had reached the gateway when the
        gateway's own time (``timing.gateway_ms``) began, the moment the window takes as its
        acknowledgement (the cloud's time is not the uplink's)."""
        now = self.window.clock()
        inside = resp.timing.gateway_ms / 1000.0
        if not 0.0 <= inside <= WINDOW_MAX_GATEWAY_S:  # not a time (NaN, negative, absurd): the answer's arrival
            inside = 0.0
        self.window.acknowledged(key, now - inside, answered_at=now)

    async def _detect(self, used: _Channels, request: Any, timeout_s: float, key: object) -> Any:
        n = len(used.stubs)
        last: Optional[TransportError] = None
        reached = False  # whether an endpoint tried had a connection: the request may have left
        # read once: concurrent calls move ``preferred`` when they fail over, and a call that read
        # it again for its next try went back to the endpoint it had just failed on (15 of 200
        # escalations failed so when the first of two gateways got SIGTERM)
        start = self._first(used)
        for k in range(n):
            i = (start + k) % n
            # READY at any time during the call; the steady state (READY already) needs no watch
            up = None if connected(used.channels[i]) else asyncio.ensure_future(came_up(used.channels[i]))
            try:
                raw = await used.stubs[i](
                    request, timeout=max(timeout_s, 0.001), metadata=self.metadata or None
                )
            except aio.AioRpcError as exc:
                reached = reached or up is None or (up.done() and up.result()) or connected(used.channels[i])
                st = status.from_grpc(exc.code(), exc.details())
                details = printable(exc.details()) if exc.details() else status.name(st)
                last = TransportError(st, f"{self.endpoints[i]}: {details}", sent=reached)
                if unanswered(exc):
                    self._unheard(i, n)
                else:  # an answer, if a refusal: the endpoint is not silent
                    self._unanswered[i] = 0
                if status.is_retryable(st) and k + 1 < n:
                    held = self._failover_log.allow()
                    if held is not None:
                        log.info("endpoint %s unavailable, trying the next one%s", self.endpoints[i],
                                 f" ({held} more failovers since the last such line)" if held else "")
                    continue
                raise last from None
            finally:
                if up is not None:
                    up.cancel()
            if i != start:  # failed over (a way back tried and refused included): looked at again later
                self._failed_over_at = self._clock()
            self.preferred = i
            self._unanswered[i] = 0
            resp = _decode(raw)
            self._answered(key, resp)
            return check_response(resp)
        assert last is not None
        raise last

    def _unheard(self, i: int, n: int) -> None:
        """A call ran out its deadline on endpoint ``i`` without an answer. Measured with two real
        gateways, the first stopped (SIGSTOP: a hung process, as a frozen node or a stuck event
        loop), every escalation went to it and failed DEADLINE_EXCEEDED, 39 of 39 over 42 s: its
        connection stayed up, so it was never UNAVAILABLE and the second was never tried. After
        ``UNANSWERED_FAILOVER`` such calls in a row, the calls begin at the next endpoint (and
        the way back is looked at ``FAILBACK_S`` later: one call each time while it still hangs)."""
        self._unanswered[i] += 1
        if n < 2 or self._unanswered[i] < UNANSWERED_FAILOVER:
            return
        self._failed_over_at = self._clock()
        if self.preferred != i:
            return
        self.preferred = (i + 1) % n
        held = self._failover_log.allow()
        if held is not None:
            log.warning("endpoint %s answered none of the last %d escalations within their deadline; the next "
                        "ones go to %s first%s", self.endpoints[i], self._unanswered[i], self.endpoints[self.preferred],
                        f" ({held} more failovers since the last such line)" if held else "")

    async def close(self) -> None:
        """Close the channels, those being retired too (the calls still on them cancelled)."""
        tasks = list(self._retiring)
        sets = [self._in_force, *self._retiring.values()]
        self._in_force = _Channels([], [])
        for task in tasks:  # one not started yet never runs: its channels are closed here
            task.cancel()
        for opened in sets:
            for ch in opened.channels:
                await ch.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class _Channels:
    """One set of channels (one per endpoint) opened with one set of TLS files, and the calls on it."""

    def __init__(self, channels: List[Any], stubs: List[Any]) -> None:
        self.channels = channels
        self.stubs = stubs
        self.calls = 0
        self.until = 0.0  # the event loop's time by which every call on these channels has ended
        self.done: Optional[asyncio.Event] = None  # set when the last call ends, once retired

    async def idle(self) -> None:
        """Return when no call is on these channels."""
        if self.calls:
            self.done = asyncio.Event()
            await self.done.wait()
