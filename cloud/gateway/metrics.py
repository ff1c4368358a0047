"""Prometheus metrics of one gateway process (its own registry, never the global one).

Per-worker in-flight, picks and ejections are read from the balancer at scrape
time (a custom collector), so they can never drift from the decisions; errors,
request latency by outcome and gateway overhead are ordinary counters and
histograms (a worker's error series are removed when it leaves the pool). Histograms, not summaries, so p99 can be aggregated across replicas.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from edgewise import status
from edgewise.observability import process_registry

if TYPE_CHECKING:
    from cloud.gateway.balancing import Balancer

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                   0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01,
                    0.025, 0.05)
#: Label values of the counters exported at 0 from the start (docs/metrics.md lists each): a series
#: that first appears at 1 has no increase() or rate() in Prometheus, so the first refusal of a
#: gateway's life never showed in the rejection ratio, the error ratio or an MQTT refusal alert.
REJECT_REASONS = ("invalid_argument", "resource_exhausted", "deadline_exceeded", "unauthenticated", "saturated",
                  "over_share", "no_endpoints", "too_many_streams", "too_many_calls")
RETRY_RESULTS = ("sent", "denied")
MQTT_RESULTS = ("answered", "error_answered", "malformed", "overloaded", "no_response_topic",
                "foreign_response_topic", "bad_topic", "correlation_too_large", "too_many_properties", "retained",
                "answer_too_large", "publish_failed", "internal_error", "response_refused", "connect_failed")


class _PoolCollector(Collector):
    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer

    def collect(self) -> Iterator[Metric]:
        b = self.balancer
        now = b.clock()
        inflight = GaugeMetricFamily("edgewise_gateway_worker_in_flight",
                                     "Requests forwarded to the worker and not yet answered", labels=["worker"])
        weight = GaugeMetricFamily("edgewise_gateway_worker_effective_weight",
                                   "Effective weight (configured x capacity x slow start)", labels=["worker"])
        ejected = GaugeMetricFamily("edgewise_gateway_worker_ejected", "1 while ejected", labels=["worker"])
        paused = GaugeMetricFamily("edgewise_gateway_worker_paused",
                                   "1 while paused: the worker reports not serving, or its Load polls fail",
                                   labels=["worker"])
        picks = CounterMetricFamily("edgewise_gateway_worker_picks", "Requests sent to the worker",
                                    labels=["worker"])
        ejections = CounterMetricFamily("edgewise_gateway_worker_ejections",
                                        "Times the worker was ejected as an outlier", labels=["worker"])
        for ep in list(b.endpoints.values()):
            name = ep.name or ep.address
            inflight.add_metric([name], ep.in_flight)
            weight.add_metric([name], b.effective_weight(ep, now))
            ejected.add_metric([name], 1.0 if ep.ejected(now) else 0.0)
            paused.add_metric([name], 1.0 if ep.paused else 0.0)
            picks.add_metric([name], ep.picks)
            ejections.add_metric([name], ep.ejections)
        yield from (inflight, weight, ejected, paused, picks, ejections)


class GatewayMetrics:
    """All gateway metrics, on a registry of their own."""

    def __init__(self, balancer: Balancer, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or process_registry("gateway")
        self.registry.register(_PoolCollector(balancer))
        r = self.registry
        self.requests = Counter("edgewise_gateway_requests", "Requests answered, by transport and status",
                                ["transport", "status"], registry=r)
        self.unanswered = Counter("edgewise_gateway_unanswered",
                                  "Requests whose call ended before the gateway answered (the client cancelled, "
                                  "its deadline passed first, or the gateway stopped past its grace)",
                                  ["transport"], registry=r)
        self.worker_errors = Counter("edgewise_gateway_worker_errors",
                                     "Non-OK answers from workers, by gRPC status", ["worker", "status"],
                                     registry=r)
        self.retries = Counter("edgewise_gateway_retries", "Retries on another worker", ["result"], registry=r)
        self.rejected = Counter("edgewise_gateway_rejected", "Requests refused before forwarding, by reason",
                                ["reason"], registry=r)
        self.latency = Histogram("edgewise_gateway_request_seconds", "End-to-end time in the gateway by outcome",
                                 ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("edgewise_gateway_overhead_seconds",
                                  "Gateway time not spent waiting on the worker (pick, checks, copies)",
                                  buckets=OVERHEAD_BUCKETS, registry=r)
        self.mqtt = Counter("edgewise_gateway_mqtt_messages", "MQTT bridge messages by result", ["result"],
                            registry=r)
        self.mqtt_connected = Gauge("edgewise_gateway_mqtt_connected",
                                    "1 while the MQTT bridge is connected and subscribed, else 0", registry=r)
        self.stream_pending = Gauge("edgewise_gateway_stream_pending",
                                    "DetectStream frames taken and not yet answered back to their client "
                                    "(at most limits.max_stream_in_flight per stream)", registry=r)
        self._answered: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._worker_error_statuses: dict[str, set[str]] = {}  # the worker_errors series, by worker
        for reason in REJECT_REASONS:
            self.rejected.labels(reason=reason)
        for result in RETRY_RESULTS:
            self.retries.labels(result=result)
        self._answer_statuses("grpc", "grpc-stream")
        for transport in ("grpc", "grpc-stream"):  # the MQTT bridge's requests are never unanswered
            self.unanswered.labels(transport)
        # the series EdgewiseEscalatedP99OverSLO reads (its rate() missed a gateway's first answer)
        self.latency.labels(status.name(status.OK))

    def _answer_statuses(self, *transports: str) -> None:
        for transport in transports:
            for row in status.TABLE:
                self.requests.labels(transport, status.name(row.status))

    def follow_mqtt(self) -> None:
        """With the MQTT bridge: export its series at 0 too (a gateway without it shows none)."""
        self._answer_statuses("mqtt")
        self.rejected.labels(reason="mqtt_overloaded")
        for result in MQTT_RESULTS:
            self.mqtt.labels(result=result)

    def follow_certificate(self, not_after: Callable[[], dt.datetime]) -> None:
        """With TLS: export the end of validity of the certificate served to new connections,
        read at each scrape (``not_after``: ``ServedTlsFiles.not_after``, which a renewal moves at
        the first connection after it), so an alert can say that a renewal did not reach the
        gateway before the certificate expires (the chart's ``EdgewiseGatewayCertificateExpiresSoon``)."""
        Gauge("edgewise_gateway_tls_certificate_expiry_timestamp_seconds",
              "End of validity (Unix time) of the TLS certificate the gateway serves to new connections "
              "(absent without TLS)", registry=self.registry).set_function(lambda: not_after().timestamp())

    def answered(self, transport: str, status_name: str, seconds: float | None = None) -> None:
        """Count one answer by transport and status and, for a forwarded request, observe its
        time in the gateway (the labelled children are looked up once, not per request)."""
        key = (transport, status_name)
        pair = self._answered.get(key)
        if pair is None:
            pair = self._answered[key] = (self.requests.labels(transport, status_name),
                                          self.latency.labels(status_name))
        pair[0].inc()
        if seconds is not None:
            pair[1].observe(seconds)

    def worker_error(self, worker: str, status_name: str) -> None:
        """Count one non-OK answer from a worker (its series lives while the worker is in the pool)."""
        self.worker_errors.labels(worker=worker, status=status_name).inc()
        self._worker_error_statuses.setdefault(worker, set()).add(status_name)

    def forget_workers(self, present: Collection[str]) -> None:
        """Remove the error series of every worker not named in ``present`` (the pool's workers
        now), as the per-worker series of the balancer disappear with their worker: with
        Kubernetes discovery each rollout brings new pod names, and /metrics must not keep
        growing with the departed ones."""
        for worker in [w for w in self._worker_error_statuses if w not in present]:
            for status_name in self._worker_error_statuses.pop(worker):
                self.worker_errors.remove(worker, status_name)
