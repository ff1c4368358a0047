"""Prometheus metrics and the ``/healthz`` endpoint of the edge daemon.

One per-process ``CollectorRegistry`` (never the global default) so tests can run
several daemons in one process. Histograms, so p99 can be computed across
devices. The HTTP server is a small threaded ``http.server`` serving
``/metrics`` and ``/healthz`` on one port: a thread per connection, a listen
backlog for bursts of scrapers, a socket timeout so half-open connections cannot
hold threads, and client resets logged at debug level (no traceback). A port
that is already in use is a ``ConfigError`` naming it. Callers: ``edge.daemon``,
``edge.pipeline``, ``edge.escalating``.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional, Tuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edge.sources.base import SourceState
from edgewise.addresses import format_address
from edgewise.errors import ConfigError
from edgewise.observability import LogThrottle, process_registry
from edgewise.policy.deciding import ESCALATING_REASONS

log = logging.getLogger(__name__)

STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
RTT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
AGE_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
#: Label values of the counters that alerts read with ``increase()``, exported at 0 from the start:
#: a series that first appears at 1 has no increase in Prometheus, so the one refused reload of a
#: bad policy (``increase(edgewise_edge_policy_reloads_total{result="refused"}[15m]) > 0``) or the
#: first escalations a full spool evicted went unseen.
RELOAD_RESULTS = ("ok", "refused", "error")
#: ``outcome`` of ``edgewise_edge_escalations_total``, each with every reason of
#: ``ESCALATING_REASONS``: the first escalations a dead cloud spooled or dropped showed in no
#: ``rate()`` (docs/metrics.md's outcome queries, the spool alert's description).
ESCALATION_OUTCOMES = ("ok", "spooled", "late", "edge_only", "dropped", "error")
#: ``reason`` of ``edgewise_edge_dropped_total`` a stream can have from the start
#: (``inference_error:<type>`` is named by the failure): ``rate(...{reason="queue_full"}[5m]) > 0``
#: missed a stream's first drops.
DROP_REASONS = ("queue_full", "stale", "cloud_unavailable", "emit_error", "shutdown")
SPOOL_EVENTS = ("put", "refused", "disk_full", "write_failed", "ack_failed", "corrupt", "salvaged", "salvage_failed",
                "recreated", "replayed", "rejected", "expired", "evicted", "nack", "sink_failed")
#: Seconds a metrics connection may stay silent before it is closed.
HTTP_TIMEOUT_S = 5.0
#: Connections the kernel queues before ``accept`` (socketserver's default is 5).
HTTP_BACKLOG = 256
#: Connections served at once (a thread each); more are closed on arrival. Clients that send a
#: byte every few seconds held a thread each without bound (367 of them, 367 threads, in a
#: probe): about 500 would use up the unit's ``TasksMax=512``, and then no camera could start
#: its reader thread again.
HTTP_MAX_CONNECTIONS = 256
#: Seconds the server waits after ``accept`` failed for want of descriptors or memory (the
#: process at its open-file limit): the connection stays queued, so the socket is readable
#: again at once and the loop retried without a pause, a thread at 100% CPU beside the
#: pipeline's. asyncio's servers wait 1 s too (``ACCEPT_RETRY_DELAY``).
ACCEPT_RETRY_S = 1.0
#: ``accept`` errors that pass when the process or the system frees resources.
_SHORT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class EdgeMetrics:
    """All metrics of one daemon, registered in their own registry."""

    def __init__(self, registry: Optional[CollectorRegistry] = None) -> None:
        r = self.registry = registry or process_registry("edge")
        self.frames = Counter("edgewise_edge_frames", "Frames processed per stream", ["stream"], registry=r)
        self.fps = Gauge("edgewise_edge_fps", "Frames per second per stream (last 5 s window, as of the scrape)", ["stream"], registry=r)
        self.stage = Histogram(
            "edgewise_edge_stage_seconds", "Per-stage latency", ["stage"], buckets=STAGE_BUCKETS, registry=r
        )
        self.frame_latency = Histogram(
            "edgewise_edge_frame_latency_seconds", "Read to sink latency per frame",
            buckets=STAGE_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "edgewise_edge_batch_size", "Frames per inference call", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64), registry=r
        )
        self.escalations = Counter(
            "edgewise_edge_escalations", "Escalations by reason and outcome", ["reason", "outcome"], registry=r
        )
        self.cloud_rtt = Histogram(
            "edgewise_edge_cloud_rtt_seconds", "Cloud round trip per escalation", ["transport"],
            buckets=RTT_BUCKETS, registry=r,
        )
        self.spool_depth = Gauge("edgewise_edge_spool_depth", "Escalations waiting in the spool", registry=r)
        self.spool_bytes = Gauge("edgewise_edge_spool_bytes", "Bytes in the spool", registry=r)
        self.spool_oldest = Gauge("edgewise_edge_spool_oldest_age_seconds", "Age of the oldest spooled entry", registry=r)
        self.spool_events = Counter(
            "edgewise_edge_spool_events",
            f"Spool events ({', '.join(SPOOL_EVENTS)})", ["event"], registry=r,
        )
        self.reloads = Counter("edgewise_edge_policy_reloads", "Policy reloads by result", ["result"], registry=r)
        for event in SPOOL_EVENTS:
            self.spool_events.labels(event)
        for result in RELOAD_RESULTS:
            self.reloads.labels(result)
        for reason in ESCALATING_REASONS:
            for outcome in ESCALATION_OUTCOMES:
                self.escalations.labels(reason, outcome)
        self.drops = Counter("edgewise_edge_dropped", "Dropped frames by stream and reason", ["stream", "reason"], registry=r)
        self.truncated = Counter(
            "edgewise_edge_truncated_videos", "Video files that ended before their header's frame count",
            ["stream"], registry=r,
        )
        self.corrupt = Counter("edgewise_edge_corrupt_frames", "Frames that could not be decoded", ["stream"], registry=r)
        self.frame_age = Histogram(
            "edgewise_edge_frame_age_seconds", "Age of each frame when inference starts: now minus when the "
            "source took it (its own timestamp where it has one)", ["stream"], buckets=AGE_BUCKETS, registry=r,
        )
        self.skipped = Counter(
            "edgewise_edge_source_skipped_frames", "Live frames drained from the source and not used because a "
            "newer one was taken (latest-frame capture)", ["stream"], registry=r,
        )
        self.source_state = Gauge(
            "edgewise_edge_source_state", "1 for the current state of each stream", ["stream", "state"], registry=r
        )
        self.reconnects = Counter(
            "edgewise_edge_source_reconnects", "Reconnects of a live stream: connection attempts after the "
            "first (after a failure, a stall or a refused open)", ["stream"], registry=r,
        )
        self._last_state: Dict[str, SourceState] = {}
        self.hardness = Histogram(
            "edgewise_edge_hardness", "Combined hardness score per frame",
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r,
        )
        self.in_flight = Gauge("edgewise_edge_escalations_in_flight", "Escalations waiting for the cloud", registry=r)
        self.sink_errors = Counter("edgewise_edge_sink_errors", "Records a sink failed to write", ["sink"], registry=r)
        self.sink_backlog = Gauge(
            "edgewise_edge_sink_backlog", "Records a sink keeps until its destination acknowledged them",
            ["sink"], registry=r)
        self.sink_dropped = Counter(
            "edgewise_edge_sink_dropped", "Records a sink lost: beyond its backlog's bound, or held in memory at exit",
            ["sink"],
            registry=r)
        self.uplink_bytes = Counter(
            "edgewise_edge_uplink_bytes", "Escalation payload bytes sent to the cloud by transport (replays too)",
            ["transport"], registry=r,
        )

    def follow_stream(self, stream: str) -> None:
        """Export a configured stream's counters (and its frame age) at 0 from the start."""
        for counter in (self.frames, self.truncated, self.corrupt, self.skipped, self.reconnects):
            counter.labels(stream)
        for reason in DROP_REASONS:
            self.drops.labels(stream, reason)
        self.frame_age.labels(stream)

    def follow_transport(self, transport: str) -> None:
        """Export a configured transport's round trips (an alert's p99) and uplink bytes at 0."""
        self.cloud_rtt.labels(transport)
        self.uplink_bytes.labels(transport)

    def set_source_state(self, stream: str, state: SourceState) -> None:
        """Export a stream's state; a ``connecting`` after any earlier state is a reconnect."""
        if state is SourceState.CONNECTING and stream in self._last_state:
            self.reconnects.labels(stream).inc()
        self._last_state[stream] = state
        for s in SourceState:
            self.source_state.labels(stream, s.value).set(1.0 if s is state else 0.0)


class _Server(ThreadingHTTPServer):
    """A thread per connection, a deep backlog, quiet about clients that go away."""

    daemon_threads = True
    request_queue_size = HTTP_BACKLOG

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(HTTP_MAX_CONNECTIONS)
        self.refused = 0  # connections closed on arrival, all slots taken
        self.accept_failures = 0  # accepts that failed for want of descriptors or memory
        self._short_log = LogThrottle(60.0)
        self._no_thread_log = LogThrottle(60.0)

    def get_request(self) -> Tuple[socket.socket, Any]:
        """``accept``; short of descriptors or memory, said (at most once a minute) and retried
        after ``ACCEPT_RETRY_S`` rather than at once."""
        try:
            return super().get_request()  # type: ignore[no-any-return]
        except OSError as exc:
            if exc.errno in _SHORT_OF_RESOURCES:
                self._short_of_resources(exc)
            raise  # socketserver drops this turn and polls again

    def _short_of_resources(self, exc: OSError) -> None:
        self.accept_failures += 1
        held = self._short_log.allow()
        if held is not None:
            log.warning("metrics http: cannot accept a connection (%s): the process is at its open-file limit "
                        "(LimitNOFILE, ulimit -n) or short of memory; /metrics and /healthz wait %g s between "
                        "tries%s", exc.strerror or exc, ACCEPT_RETRY_S,
                        f" ({held} more failed accepts since the last such line)" if held else "")
        time.sleep(ACCEPT_RETRY_S)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the thread
        except RuntimeError as exc:  # "can't start new thread": TasksMax, pids.max, memory for its stack
            self._slots.release()
            self._no_thread(request, exc)
        except BaseException:
            self._slots.release()
            raise

    def _no_thread(self, request: Any, exc: RuntimeError) -> None:
        """A connection no thread could be started for: closed, counted in ``refused`` and said
        (at most once a minute). It was logged as a failed request with its traceback, one per
        scrape while the daemon was at its thread limit."""
        self.refused += 1
        self.shutdown_request(request)
        held = self._no_thread_log.allow()
        if held is not None:
            log.warning("metrics http: connection closed, no thread could be started for it (%s): the process "
                        "is at its thread limit (TasksMax, pids.max) or short of memory%s", exc,
                        f" ({held} more since the last such line)" if held else "")

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, socket.timeout)):
            log.debug("metrics http: client %s went away: %r", client_address, exc)
        else:
            log.exception("metrics http: request from %s failed", client_address)


class _Server6(_Server):
    """:class:`_Server` on an IPv6 address (``"::"``: every address, IPv4 ones too)."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        # "::" answers IPv4 too only where IPV6_V6ONLY is off: the kernel's default for it is
        # net.ipv6.bindv6only, 1 on some hosts (as cloud/gateway/http.py _dual_stack)
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def metrics_family(host: str) -> int:
    """The socket family the metrics server binds ``host`` with (``check-config`` binds the same)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


class MetricsServer:
    """``/metrics`` (Prometheus text) and ``/healthz`` (JSON from ``health()``) over HTTP."""

    def __init__(
        self,
        metrics: EdgeMetrics,
        health: Callable[[], Tuple[bool, Dict[str, Any]]],
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            timeout = HTTP_TIMEOUT_S  # socket timeout: a silent client is dropped

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body = generate_latest(registry)
                    self._send(200, CONTENT_TYPE_LATEST, body)
                elif path in ("/healthz", "/health"):
                    ok, detail = health()
                    self._send(200 if ok else 503, "application/json", json.dumps(detail).encode())
                else:
                    self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics http: " + format, *args)

        try:
            self.httpd = (_Server6 if metrics_family(host) == socket.AF_INET6 else _Server)((host, port), Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"metrics.port {port} on {host} is already in use; stop the other process, "
                    "choose another metrics.port, 0 for any free port or -1 for none") from None
            raise ConfigError(f"metrics.host/port {host}:{port}: cannot listen ({exc.strerror or exc})") from None
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-http", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("metrics and health on http://%s/metrics /healthz",
                 format_address(str(self.httpd.server_address[0]), self.port))

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
