"""Small real grpc.aio Worker servers for routing tests (configurable latency, capacity, failures).

They speak the real ``edgewise.v1.Worker`` service on a real port; only the
model is replaced by a sleep, so routing behaviour is tested in isolation from
inference speed. End-to-end tests with real models use ``cloud.local.LocalCloud``.
"""

from __future__ import annotations

import asyncio
import io
import time

import grpc
import numpy as np

from cloud.worker.server import WARMING_UP
from edgewise.v1 import detect_pb2, service_pb2_grpc


class TestWorker(service_pb2_grpc.WorkerServicer):
    __test__ = False

    def __init__(self, name: str, service_s: float = 0.005, concurrency: int = 1,
                 capacity: float = 0.0, max_queue: int = 0, fail: grpc.StatusCode | None = None,
                 serving: bool = True, pixel_rate: float = 0.0) -> None:
        self.name = name
        self.pixel_rate = pixel_rate
        self.service_s = service_s
        self.concurrency = concurrency
        self.capacity = capacity
        self.max_queue = max_queue
        self.fail = fail
        self.serving = serving
        self.calls = 0
        self.in_flight = 0
        self.max_seen_in_flight = 0
        self.deadlines: list[int] = []  # unix ns: the earlier of the call's gRPC deadline and the request's
        self.bodies: list[bytes] = []  # each request as it arrived
        self._sem: asyncio.Semaphore | None = None
        self.server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> str:
        self._sem = asyncio.Semaphore(self.concurrency)
        self.server = grpc.aio.server()
        handlers = {  # service_pb2_grpc.add_WorkerServicer_to_server, keeping each request's bytes
            "Infer": grpc.unary_unary_rpc_method_handler(
                self.Infer, request_deserializer=self._parse,
                response_serializer=detect_pb2.DetectResponse.SerializeToString),
            "Load": grpc.unary_unary_rpc_method_handler(
                self.Load, request_deserializer=detect_pb2.LoadRequest.FromString,
                response_serializer=detect_pb2.WorkerLoad.SerializeToString)}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("edgewise.v1.Worker", handlers),))
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return self.address

    async def stop(self, grace: float | None = None) -> None:
        if self.server is not None:
            await self.server.stop(grace)

    def _parse(self, body: bytes) -> detect_pb2.DetectRequest:
        self.bodies.append(body)
        return detect_pb2.DetectRequest.FromString(body)

    async def Infer(self, request, context):
        self.calls += 1
        left = context.time_remaining()
        cands = [d for d in (request.deadline_unix_ns,
                             None if left is None else time.time_ns() + int(left * 1e9)) if d]
        self.deadlines.append(min(cands) if cands else 0)
        if self.fail is not None:
            await context.abort(self.fail, f"{self.name} configured to fail")
        if not self.serving:  # as a real worker warming up answers
            await context.abort(grpc.StatusCode.UNAVAILABLE, WARMING_UP)
        if self.max_queue and self.in_flight >= self.max_queue:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.name} queue full")
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        t0 = time.perf_counter()
        try:
            assert self._sem is not None
            async with self._sem:
                q = time.perf_counter() - t0
                await asyncio.sleep(self.service_s)
        finally:
            self.in_flight -= 1
        return detect_pb2.DetectResponse(
            status=detect_pb2.OK, device_id=request.device_id, stream_id=request.stream_id,
            frame_seq=request.frame_seq, trace_id=request.trace_id, worker_id=self.name,
            timing=detect_pb2.Timing(queue_ms=q * 1000, compute_ms=self.service_s * 1000, batch_size=1))

    async def Load(self, request, context):
        return detect_pb2.WorkerLoad(worker_id=self.name, in_flight=self.in_flight, capacity=self.capacity,
                                     queue_depth=max(0, self.in_flight - self.concurrency),
                                     max_batch_size=1, max_queue_size=self.max_queue, serving=self.serving,
                                     pixel_rate=self.pixel_rate)


def jpeg_bytes(w: int = 64, h: int = 48) -> bytes:
    import cv2

    img = (np.random.default_rng(0).random((h, w, 3)) * 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return io.BytesIO(buf.tobytes()).getvalue()


def request(device: str = "cam-1", seq: int = 0, data: bytes | None = None,
            encoding: int = detect_pb2.Image.JPEG) -> detect_pb2.DetectRequest:
    return detect_pb2.DetectRequest(
        device_id=device, stream_id="s0", frame_seq=seq, trace_id=f"t{seq}",
        image=detect_pb2.Image(encoding=encoding, data=jpeg_bytes() if data is None else data))


async def serving(settings, reload):  # type: ignore[no-untyped-def]
    """``cloud.gateway.server.serve`` (its signal handlers: SIGHUP reloads with ``reload``,
    SIGTERM stops) running on this loop: its task, and its gateway once it serves."""
    from cloud.gateway import server
    from tests.waiting import async_wait_until

    made = []
    real = server.Gateway

    def keep(s):  # type: ignore[no-untyped-def]
        made.append(real(s))
        return made[-1]

    server.Gateway = keep
    task = asyncio.ensure_future(server.serve(settings, reload=reload, announce=False))
    try:
        await async_wait_until(lambda: made and made[0].serving, 10, "the gateway serving")
    except BaseException:
        task.cancel()
        raise
    finally:
        server.Gateway = real
    return task, made[0]
