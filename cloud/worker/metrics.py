"""Prometheus metrics of one worker, on a per-process registry.

Histograms, not summaries, so p95/p99 can be aggregated across pods
(``docs/design/batching.md#metrics`` - Triton only offers counters and summaries for
queue and compute time). Gauges give the router and the autoscaler the pending
count, in-flight count and measured capacity. Each ``WorkerMetrics`` owns its
``CollectorRegistry`` so tests can run several workers in one process.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cloud.gateway.http import SidePort
from edgewise.observability import process_registry

# Seconds: from well under a millisecond (tiny models) to seconds (YOLOv5x on CPU).
TIME_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0,
)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)


class WorkerMetrics:
    """All metrics of one worker process (names prefixed ``edgewise_worker_``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else process_registry("worker")
        r = self.registry
        self.queue_wait = Histogram(
            "edgewise_worker_queue_wait_seconds",
            "Time a request waited in the batcher before its batch started.",
            buckets=TIME_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "edgewise_worker_batch_size",
            "Requests per model call (with input_size native, a batch of images of different sizes "
            "runs as one call per size, each counted here).",
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.compute = Histogram(
            "edgewise_worker_compute_seconds",
            "Model time of one batch (stacking, inference, decode + NMS).",
            buckets=TIME_BUCKETS, registry=r,
        )
        self.latency = Histogram(
            "edgewise_worker_request_seconds",
            "Time from receiving an Infer call to answering it (decode, queue, compute).",
            buckets=TIME_BUCKETS, registry=r,
        )
        self.requests = Counter(
            "edgewise_worker_requests", "Infer calls answered, by gRPC status.",
            ["status"], registry=r,
        )
        self.in_flight = Gauge(
            "edgewise_worker_in_flight", "Infer calls accepted and not yet answered.", registry=r
        )
        self.queue_depth = Gauge(
            "edgewise_worker_queue_depth", "Requests waiting in the batcher.", registry=r
        )
        self.capacity = Gauge(
            "edgewise_worker_capacity_images_per_second",
            "Measured model throughput (EWMA), images/s.", registry=r,
        )
        self.batching = Gauge(
            "edgewise_worker_batching",
            "1 when the worker forms batches, 0 when it serves batch 1 without queue delay "
            "(batching.mode, decided at warm-up).", registry=r,
        )
        self.batching_gain = Gauge(
            "edgewise_worker_batching_gain",
            "Measured at warm-up: images/s at the best batch size over images/s at batch 1 (0 = not measured).",
            registry=r,
        )
        self.serving = Gauge(
            "edgewise_worker_serving", "1 when the health service reports SERVING.", registry=r
        )
        self.decode_pixels = Gauge(
            "edgewise_worker_decode_pixels",
            "Pixels (declared width x height) of the images being decoded now.", registry=r,
        )
        self.decode_refused = Counter(
            "edgewise_worker_decode_budget_refused",
            "Requests refused (RESOURCE_EXHAUSTED) because the decode pixel budget stayed full.",
            registry=r,
        )
        for status in ("OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
                       "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL"):
            self.requests.labels(status)  # export zeros so rates exist from the start
        self._side: SidePort | None = None

    async def serve_http(self, host: str, port: int) -> int:
        """Expose ``/metrics`` on ``host:port`` (0 = any free port); returns the bound port."""
        self._side = SidePort(self.registry)
        return await self._side.start(host, port)

    async def close(self) -> None:
        """Stop the HTTP server, if one runs."""
        side, self._side = self._side, None
        if side is not None:
            await side.stop()
