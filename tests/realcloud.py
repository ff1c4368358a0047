"""The real cloud tier in-process, for edge and end-to-end tests.

``InProcessCloud`` runs the real gateway (``cloud.gateway.server.Gateway``) and
real workers (``cloud.worker.server``, a real ONNX model) on port 0, on their own
event loop in a background thread, so a test's edge side (its own
``asyncio.run``) talks to it over real sockets. The ways it can fail are the
real ones: a gateway whose workers are stopped answers UNAVAILABLE, a worker whose
inference thread is busy makes calls slow, the gateway's per-device rate limit
answers RESOURCE_EXHAUSTED, a stopped gateway is a closed port. Tests that need
a process to ``kill -9`` use ``cloud.local.LocalCloud`` instead.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Dict, List, Optional, TypeVar

import grpc

from cloud.gateway.server import Gateway
from cloud.gateway.settings import load_settings
from cloud.worker.server import WorkerServer, create_server
from cloud.worker.settings import BatchingSettings, WorkerSettings
from tests.waiting import wait_until

T = TypeVar("T")

#: The test models have random weights: their scores are ~1e-3, so the cloud keeps boxes above that.
CLOUD_CONF = 0.001


class InProcessCloud:
    """A real gateway in front of ``workers`` real workers; ``with InProcessCloud(model) as cloud``."""

    def __init__(self, model: Path, workers: int = 1, gateway: Optional[Dict[str, Any]] = None,
                 batching: Optional[BatchingSettings] = None) -> None:
        assert workers >= 1, "the gateway needs a worker list; stop_worker() makes a cloud with none up"
        self.model = str(model)
        self.n_workers = workers
        self.gateway_over = dict(gateway or {})
        #: the workers' batching (a short queue delay by default)
        self.batching = batching or BatchingSettings(max_batch_size=4, max_queue_delay_ms=2.0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="in-process-cloud", daemon=True)
        self.workers: List[Optional[WorkerServer]] = []
        self.worker_ports: List[int] = []
        self.gateway: Optional[Gateway] = None
        self.port = 0
        self._blocks: List[threading.Event] = []

    # ---- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> InProcessCloud:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        """Run ``coro`` on the cloud's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def start(self) -> None:
        self.thread.start()
        for _ in range(self.n_workers):
            self.workers.append(None)
            self.worker_ports.append(0)
            self.start_worker(len(self.workers) - 1)
        self.start_gateway()

    def stop(self) -> None:
        if self.gateway is not None:
            self.stop_gateway()
        for i in range(len(self.workers)):
            self.stop_worker(i)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---- workers ----------------------------------------------------------------------------
    def start_worker(self, i: int) -> None:
        """Start worker ``i`` (again on its old port when it ran before)."""
        settings = WorkerSettings(
            model=self.model, host="127.0.0.1", port=self.worker_ports[i], metrics_port=-1,
            worker_id=f"worker-{i}", threads=1, conf_threshold=CLOUD_CONF, grace_s=2.0,
            warmup_rounds=1, batching=self.batching,
        )

        async def up() -> WorkerServer:
            server, port = create_server(settings)
            await server.start()
            self.worker_ports[i] = port
            return server

        self.workers[i] = self.call(up())

    def stop_worker(self, i: int) -> None:
        server = self.workers[i]
        if server is not None:
            self.call(server.stop(0.5))
            self.workers[i] = None

    def block_worker(self, i: int) -> threading.Event:
        """Occupy worker ``i``'s inference thread (calls queue up: a slow cloud) until the
        returned event is set (or ``restore()``)."""
        server = self.workers[i]
        assert server is not None
        release, started = threading.Event(), threading.Event()

        def hold() -> None:
            started.set()
            release.wait(60)

        server.service._infer_pool.submit(hold)
        assert started.wait(5)
        self._blocks.append(release)
        return release

    def restore(self) -> None:
        """Release blocked workers, start stopped ones and the gateway, and wait until the
        gateway answers again."""
        changed = bool(self._blocks)
        for release in self._blocks:
            release.set()
        self._blocks.clear()
        for i, server in enumerate(self.workers):
            if server is None:
                self.start_worker(i)
                changed = True
        if self.gateway is None:
            self.start_gateway()
            changed = True
        if changed:
            self.wait_answering()

    def wait_answering(self, timeout: float = 30.0) -> None:
        """Send a real request through the gateway until it is answered OK (a restarted
        worker is back in the gateway's pool)."""
        import numpy as np

        from edgewise import wire
        from edgewise.v1 import detect_pb2, service_pb2_grpc

        req = detect_pb2.DetectRequest(device_id="probe", stream_id="probe", frame_seq=0,
                                       image=wire.encode_image(np.zeros((32, 32, 3), np.uint8), "jpeg"))

        async def answered() -> bool:
            async with grpc.aio.insecure_channel(self.address) as ch:
                try:
                    resp = await service_pb2_grpc.EscalationStub(ch).Detect(req, timeout=5)
                except grpc.aio.AioRpcError:
                    return False
                return bool(resp.status == detect_pb2.OK)

        wait_until(lambda: self.call(answered()), timeout, f"the gateway at {self.address} to answer", 0.05)

    # ---- gateway ----------------------------------------------------------------------------
    def start_gateway(self) -> None:
        """Start the gateway (again on its old port when it ran before)."""
        over: Dict[str, Any] = {
            "listen": f"127.0.0.1:{self.port}", "metrics_port": -1, "load_poll_interval_s": 0.2,
            "balancer.slow_start_window_s": 0,
            "discovery.static": [f"127.0.0.1:{p}" for p in self.worker_ports],
        }
        over.update(self.gateway_over)

        async def up() -> Gateway:
            gw = Gateway(load_settings(None, over, env={}))
            self.port = await gw.start()
            return gw

        self.gateway = self.call(up())

    def stop_gateway(self) -> None:
        if self.gateway is not None:
            self.call(self.gateway.stop(0.5))
            self.gateway = None
