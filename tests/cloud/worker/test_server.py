"""The worker in-process: real model (YOLOv5n @160), real gRPC on port 0, real JPEGs.

Each test runs its own event loop (``asyncio.run``) with a fresh server. To make
queueing deterministic a test can occupy the single inference thread with a
blocker (the worker's real executor, no fake), so requests pile up in the batcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Tuple

import cv2
import grpc
import numpy as np
import pytest
from grpc._cython.cygrpc import ExecuteBatchError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud.worker.batching import BUSY_MARK, EXPIRED_MARK, TOO_SHORT_MARK
from cloud.worker.runner import ModelRunner
from cloud.worker.server import SERVICE_NAME, WorkerServer, create_server
from cloud.worker.settings import BatchingSettings, WorkerSettings
from edgewise import wire
from edgewise.errors import InvalidInputError
from edgewise.runtime.detector import Detector
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.logs import errors
from tests.waiting import async_wait_until

DATA = Path("/usr/share/doc/opencv-doc/examples/data")
CONF = 0.001  # random-weight test model: its scores are ~1e-3


def photo(name: str = "baboon.jpg") -> np.ndarray:
    im = cv2.imread(str(DATA / name))
    if im is None:
        pytest.skip(f"{DATA / name} missing (apt-get install opencv-doc)")
    return im


def jpeg_request(im: np.ndarray, seq: int = 0, **kw) -> detect_pb2.DetectRequest:
    return detect_pb2.DetectRequest(device_id="cam", stream_id="s", frame_seq=seq,
                                    image=wire.encode_image(im, "jpeg"), **kw)


def make_settings(model: Path, **batching) -> WorkerSettings:
    return WorkerSettings(
        model=str(model), host="127.0.0.1", port=0, metrics_port=0, metrics_host="127.0.0.1",
        worker_id="w-test", threads=1, conf_threshold=CONF, warmup_rounds=1, grace_s=5,
        batching=BatchingSettings(**{"max_batch_size": 4, "max_queue_delay_ms": 2.0, "mode": "on", **batching}),
    )


@contextlib.asynccontextmanager
async def running(settings: WorkerSettings, runner: ModelRunner | None = None):
    server, port = create_server(settings, runner)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield server, service_pb2_grpc.WorkerStub(channel), channel
    finally:
        await channel.close()
        await server.stop(2)


def block_inference(server: WorkerServer) -> threading.Event:
    """Occupy the worker's one inference thread until the returned event is set."""
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(60)

    server.service._infer_pool.submit(hold)
    assert started.wait(5)
    return release


async def call(stub, req, timeout=10.0):
    """(status code, response or details) of one Infer call."""
    try:
        return grpc.StatusCode.OK, await stub.Infer(req, timeout=timeout)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details()


def test_infer_returns_the_detectors_boxes_for_a_real_jpeg(tiny_model):
    im = photo()
    expected = Detector.from_file(tiny_model, conf_thres=CONF, threads=1).detect(
        [wire.decode_image(wire.encode_image(im, "jpeg"))])[0]
    assert len(expected) > 0

    async def main():
        async with running(make_settings(tiny_model)) as (_, stub, _ch):
            return await stub.Infer(jpeg_request(im, seq=7, trace_id="t1"), timeout=10)

    r = asyncio.run(main())
    assert r.status == detect_pb2.OK and r.frame_seq == 7 and r.trace_id == "t1"
    assert r.model_name == tiny_model.stem and r.model_version and r.worker_id == "w-test"
    assert r.timing.batch_size == 1 and r.timing.compute_ms > 0 and r.timing.queue_ms >= 0
    got = np.array([[d.x1, d.y1, d.x2, d.y2] for d in r.detections], np.float32)
    np.testing.assert_allclose(got, expected.boxes, atol=1e-3)
    assert {d.source for d in r.detections} == {tiny_model.stem}
    assert all(len(d.class_scores) == 10 and d.class_name == str(d.class_id) for d in r.detections)
    h, w = im.shape[:2]
    assert (got[:, [0, 2]] <= w).all() and (got[:, [1, 3]] <= h).all() and (got >= 0).all()


def test_crop_offsets_map_boxes_into_the_source_frame(tiny_model):
    im = photo()
    crop = np.ascontiguousarray(im[100:400, 50:350])
    local = Detector.from_file(tiny_model, conf_thres=CONF, threads=1).detect(
        [wire.decode_image(wire.encode_image(crop, "png"))])[0]
    assert len(local) > 0
    img = wire.encode_image(crop, "png")
    img.offset_x, img.offset_y, img.source_width, img.source_height = 50, 100, 512, 512

    async def main():
        async with running(make_settings(tiny_model)) as (_, stub, _ch):
            return await stub.Infer(detect_pb2.DetectRequest(image=img), timeout=10)

    r = asyncio.run(main())
    got = np.array([[d.x1, d.y1, d.x2, d.y2] for d in r.detections], np.float32)
    np.testing.assert_allclose(got, local.boxes + np.array([50, 100, 50, 100], np.float32), atol=1e-3)


def test_corrupt_jpeg_is_invalid_argument_and_its_neighbours_still_batch(tiny_model):
    good = jpeg_request(photo())
    data = good.image.data
    corrupt = detect_pb2.DetectRequest(image=detect_pb2.Image(
        encoding=detect_pb2.Image.JPEG, data=data[:600] + b"\x00" * 500 + data[-2:]))
    garbage = detect_pb2.DetectRequest(image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG,
                                                              data=b"not a jpeg at all"))

    async def main():
        async with running(make_settings(tiny_model, max_queue_delay_ms=300)) as (srv, stub, _ch):
            release = block_inference(srv)  # hold the model so all four meet in one batch
            tasks = [asyncio.create_task(call(stub, r)) for r in (good, corrupt, good, garbage, good)]
            await async_wait_until(lambda: tasks[1].done() and tasks[3].done() and srv.service.batcher.depth == 3,
                                   10, "the 3 good frames queued, the 2 bad ones answered", interval=0.005)
            release.set()
            return await asyncio.gather(*tasks)

    res = asyncio.run(main())
    codes = [c for c, _ in res]
    assert codes == [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK,
                     grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK]
    assert "JPEG" in res[1][1] and "image" in res[3][1]
    assert [r.timing.batch_size for c, r in res if c == grpc.StatusCode.OK] == [3, 3, 3]
    assert all(len(r.detections) > 0 for c, r in res if c == grpc.StatusCode.OK)


def test_bytes_that_are_no_request_are_invalid_argument_not_a_worker_fault(tiny_model):
    # gRPC's own deserializer would answer UNKNOWN, which the gateway counts against the worker
    async def main():
        async with running(make_settings(tiny_model)) as (srv, stub, ch):
            infer = ch.unary_unary("/edgewise.v1.Worker/Infer")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await infer(b"\x07\x07not a protobuf", timeout=10)
            ok = await stub.Infer(jpeg_request(photo(), seq=1), timeout=10)
            return err.value, ok, srv.service.metrics.requests.labels("INVALID_ARGUMENT")._value.get()

    err, ok, counted = asyncio.run(main())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("request is not a serialized DetectRequest")
    assert ok.status == detect_pb2.OK and counted == 1


def test_a_load_request_that_does_not_parse_is_invalid_argument_not_a_logged_traceback(tiny_model, caplog):
    """Load left its parsing to gRPC, which answered UNKNOWN and logged a traceback at ERROR per
    call; it now parses its request itself (``cloud.binding.parsed``), like Infer and Health."""
    import logging

    async def main():
        async with running(make_settings(tiny_model)) as (_srv, stub, ch):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary("/edgewise.v1.Worker/Load")(b"\xff", timeout=10)
            return err.value, await stub.Load(detect_pb2.LoadRequest(), timeout=10)

    with caplog.at_level(logging.INFO):
        err, load = asyncio.run(main())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("request is not a serialized edgewise.v1.LoadRequest: ")
    assert load.worker_id == "w-test"
    assert not errors(caplog.records), caplog.text


@pytest.mark.parametrize("mode", ["on", "auto", "off"])
def test_a_model_whose_batch_is_dynamic_in_name_only_is_not_served_in_batches(tmp_path, mode, caplog):
    """The warm-up retried a failed batch one image at a time, so a worker asked to batch
    (`on`) started and served one image per call, silently. Now `on` fails its start (and stops
    what it started: the port is closed), `auto` warns and serves batch 1, `off` never batches."""
    import logging
    import socket

    from edgewise.errors import ModelError
    from tests.edgewise.runtime.test_own_models import batch_of_one_only

    model = batch_of_one_only(tmp_path / "b1.onnx")
    settings = make_settings(model, mode=mode)

    async def serve_one():
        async with running(settings) as (srv, stub, _ch):
            return await stub.Infer(jpeg_request(photo()), timeout=10), srv.service.batching

    async def fail_start():
        server, port = create_server(settings)
        with pytest.raises(ModelError, match=r"b1\.onnx: one frame runs but a batch of 4 fails \(.*set "
                                             r"batching\.max_batch_size to 1$"):
            await server.start()
        with pytest.raises(OSError):  # stopped, not left listening
            socket.create_connection(("127.0.0.1", port), timeout=2).close()

    if mode == "on":
        asyncio.run(fail_start())
        return
    with caplog.at_level(logging.WARNING):
        answer, batching = asyncio.run(serve_one())
    assert answer.status == detect_pb2.OK and batching is not None and not batching.batch
    warned = [r.getMessage() for r in caplog.records if "serves one image per call" in r.getMessage()]
    assert len(warned) == (1 if mode == "auto" else 0), warned


class FailsOnBlackFrames(ModelRunner):
    """The real model, except that a batch containing an all-black frame raises
    (stands in for an input the model itself rejects)."""

    def _run_batch(self, items):
        if any(float(p.tensor.max()) == 0.0 for p in items):
            raise InvalidInputError("model rejected an all-black frame")
        return super()._run_batch(items)


def test_a_frame_failing_inside_the_batch_never_fails_its_neighbours(tiny_model):
    settings = make_settings(tiny_model, max_queue_delay_ms=300)
    runner = FailsOnBlackFrames(Detector.from_file(tiny_model, conf_thres=CONF, threads=1))
    black = jpeg_request(np.zeros((160, 160, 3), np.uint8))
    good = jpeg_request(photo())

    async def main():
        async with running(settings, runner) as (srv, stub, _ch):
            release = block_inference(srv)
            tasks = [asyncio.create_task(call(stub, r)) for r in (good, black, good)]
            await async_wait_until(lambda: srv.service.batcher.depth == 3, 10, "the 3 frames queued",
                                   interval=0.005)
            release.set()
            return await asyncio.gather(*tasks)

    res = asyncio.run(main())
    assert [c for c, _ in res] == [grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK]
    assert "all-black" in res[1][1]
    assert res[0][1].timing.batch_size == 3 and len(res[0][1].detections) > 0


def test_full_queue_answers_resource_exhausted_at_once(tiny_model):
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_size=2, max_queue_delay_ms=0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            release = block_inference(srv)
            req = jpeg_request(photo())
            # The calls' own deadline is far beyond the waits below, so that a slow host cannot
            # turn accepted calls into DEADLINE_EXCEEDED answers while the rejections are counted.
            tasks = [asyncio.create_task(call(stub, req, timeout=60)) for _ in range(6)]
            t0 = time.monotonic()
            done, _ = await asyncio.wait(tasks, timeout=3, return_when=asyncio.FIRST_COMPLETED)
            first_answer_s = time.monotonic() - t0

            def answered():
                return [t.result() for t in tasks if t.done()]
            try:
                await async_wait_until(lambda: len(answered()) >= 3, 30, "3 answers while the model is blocked")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; answers so far: {answered()}; {srv.service.load()}") from None
            await asyncio.sleep(0.2)  # room for a wrong extra answer to show up
            early = answered()
            load = await stub.Load(detect_pb2.LoadRequest(), timeout=5)
            release.set()
            return await asyncio.gather(*tasks), first_answer_s, load, early

    res, first_s, load, early = asyncio.run(main())
    # while the model was blocked, exactly the 3 requests beyond its batch and the queue were answered
    assert sorted(c.name for c, _ in early) == ["RESOURCE_EXHAUSTED"] * 3, early
    codes = [c for c, _ in res]
    # one batch taken by the (blocked) model + 2 queued = 3 accepted; the rest rejected
    assert codes.count(grpc.StatusCode.OK) == 3
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 3
    assert all("queue full" in d for c, d in res if c == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert first_s < 2.0  # rejections did not wait for the blocked model
    assert load.queue_depth == 2 and load.in_flight == 3


def test_load_reports_sane_numbers_and_metrics_are_exported(tiny_model):
    settings = make_settings(tiny_model, max_batch_size=4, preferred_batch_sizes=(2, 4))

    async def main():
        async with running(settings) as (srv, stub, _ch):
            before = await stub.Load(detect_pb2.LoadRequest(), timeout=5)
            await asyncio.gather(*(stub.Infer(jpeg_request(photo(), seq=i), timeout=10) for i in range(8)))
            after = await stub.Load(detect_pb2.LoadRequest(), timeout=5)
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5)
                .read().decode())
            return before, after, text

    before, after, text = asyncio.run(main())
    assert before.capacity > 0  # measured during warm-up
    assert after.serving and after.worker_id == "w-test" and after.max_batch_size == 4
    assert after.max_queue_size == 64 and after.in_flight == 0 and after.queue_depth == 0
    assert 1 < after.capacity < 100_000
    assert after.peak_capacity >= after.capacity * 0.5 and before.peak_capacity > 0  # warm-up measured sizes 1 and 4
    assert after.model_name == tiny_model.stem and after.model_version
    assert 'edgewise_worker_requests_total{status="OK"} 8.0' in text
    assert "edgewise_worker_queue_wait_seconds_bucket" in text
    assert "edgewise_worker_batch_size_count 8.0" not in text  # 8 requests went in fewer batches
    assert "edgewise_worker_compute_seconds_count" in text and "edgewise_worker_serving 1.0" in text
    assert "edgewise_worker_batching 1.0" in text  # batching.mode on


def test_queue_depth_gauge_drops_as_soon_as_queued_callers_cancel(tiny_model):
    """Callers that give up leave the batcher at once; the gauge must follow then, not at the
    scheduler's next timer (here the 10 s queue delay, the most the settings allow)."""
    settings = make_settings(tiny_model, max_batch_size=8, max_queue_delay_ms=10_000.0)

    def gauge(port: int) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        (line,) = [x for x in text.splitlines() if x.startswith("edgewise_worker_queue_depth ")]
        return float(line.split()[1])

    async def main():
        async with running(settings) as (srv, stub, _ch):
            calls = [stub.Infer(jpeg_request(photo(), seq=i), timeout=60) for i in range(3)]
            await async_wait_until(lambda: srv.service.batcher.depth == 3, 10, "3 requests queued")
            queued = await asyncio.to_thread(gauge, srv.metrics_port)
            for c in calls:
                c.cancel()
            await async_wait_until(lambda: srv.service.batcher.depth == 0, 10, "the cancelled requests gone")
            await asyncio.sleep(0.1)
            return queued, await asyncio.to_thread(gauge, srv.metrics_port)

    queued, after = asyncio.run(main())
    assert queued == 3.0 and after == 0.0


def test_idle_metrics_connections_hold_no_thread_and_are_closed(tiny_model, monkeypatch):
    """prometheus_client's server held a thread and a descriptor per connection with no
    timeout: 300 clients sending half a request line held 300 worker threads for good."""
    from cloud.gateway import http

    monkeypatch.setattr(http, "READ_TIMEOUT_S", 0.5)
    settings = make_settings(tiny_model)

    async def main():
        async with running(settings) as (srv, _stub, _ch):
            threads = threading.active_count()
            conns = [await asyncio.open_connection("127.0.0.1", srv.metrics_port) for _ in range(50)]
            for _, w in conns:
                w.write(b"GET /metr")
                await w.drain()
            await asyncio.sleep(0.2)
            held = threading.active_count() - threads
            closed = [await asyncio.wait_for(r.read(), 5) for r, _ in conns]  # b"": the worker hung up
            for _, w in conns:
                w.close()
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5)
                .read().decode())
            return held, closed, text

    held, closed, text = asyncio.run(main())
    assert held <= 2 and closed == [b""] * 50
    assert "edgewise_worker_serving 1.0" in text


def test_auto_batching_serves_batch_1_without_queue_delay_when_a_batch_does_not_pay(tiny_model, caplog):
    # Whether a batch pays on a CPU depends on the CPU and the model: the cloud model gains
    # nothing (docs/design/batching.md#batching-where-it-pays), but this tiny model's per-run
    # overhead lets batch 8 reach 1.5x on some CPUs. A gain threshold above the batch size
    # cannot be met by any measurement, so the warm-up decides "batch 1" on every machine and
    # the test checks what the worker then does: it must not hold requests.
    settings = make_settings(tiny_model, mode="auto", max_batch_size=8, max_queue_delay_ms=300, min_gain=9.0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            lone = await stub.Infer(jpeg_request(photo(), seq=1), timeout=10)
            together = await asyncio.gather(*(stub.Infer(jpeg_request(photo(), seq=i), timeout=10)
                                              for i in range(4)))
            load = await stub.Load(detect_pb2.LoadRequest(), timeout=5)
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5)
                .read().decode())
            return srv.service.batching, lone, together, load, text

    with caplog.at_level("INFO", logger="cloud.worker.server"):
        decision, lone, together, load, text = asyncio.run(main())
    assert decision is not None and not decision.batch and decision.size == 8 and 0 < decision.gain < 9.0
    assert lone.timing.queue_ms < 100 and lone.timing.batch_size == 1  # batching would hold it 300 ms
    assert [r.timing.batch_size for r in together] == [1, 1, 1, 1]
    assert load.max_batch_size == 1  # the gateway sees the batch it will get
    assert load.pixel_rate == 0.0  # letterboxed to the model's size: every image costs one run
    assert "edgewise_worker_batching 0.0" in text
    assert f"edgewise_worker_batching_gain {decision.gain}" in text
    assert any("batch 1, no queue delay: at best batch 8 serves" in r.getMessage() for r in caplog.records)


def test_health_not_serving_until_warm_then_serving_then_drain(tiny_model):
    settings = make_settings(tiny_model)
    settings.warmup_rounds = 2

    async def main():
        server, port = create_server(settings)
        await server.bind()
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        health = health_pb2_grpc.HealthStub(ch)
        stub = service_pb2_grpc.WorkerStub(ch)
        q = health_pb2.HealthCheckRequest
        cold = (await health.Check(q(service=""), timeout=5)).status
        cold_infer = await call(stub, jpeg_request(photo()))
        await server.service.start()
        warm = (await health.Check(q(service=SERVICE_NAME), timeout=5)).status
        ok = await call(stub, jpeg_request(photo()))
        await server.service.drain(1)
        drained = (await health.Check(q(service=""), timeout=5)).status
        refused = await call(stub, jpeg_request(photo()))
        await ch.close()
        await server.stop(1)
        return cold, cold_infer, warm, ok, drained, refused

    cold, cold_infer, warm, ok, drained, refused = asyncio.run(main())
    S = health_pb2.HealthCheckResponse
    assert cold == S.NOT_SERVING and cold_infer[0] == grpc.StatusCode.UNAVAILABLE
    assert warm == S.SERVING and ok[0] == grpc.StatusCode.OK
    assert drained == S.NOT_SERVING
    assert refused[0] == grpc.StatusCode.UNAVAILABLE and "shutting down" in refused[1]


def test_deadlines_expired_requests_never_reach_the_model(tiny_model):
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            past = jpeg_request(photo(), deadline_unix_ns=time.time_ns() - 1_000_000)
            at_once = await call(stub, past)
            release = block_inference(srv)
            first = asyncio.create_task(call(stub, jpeg_request(photo())))  # taken by the model
            await async_wait_until(lambda: srv.service.load().in_flight == 1 and srv.service.batcher.depth == 0,
                                   10, "the first request taken by the (held) model")
            soon = jpeg_request(photo(), deadline_unix_ns=time.time_ns() + 200_000_000)
            late = asyncio.create_task(call(stub, soon))
            # its deadline passes while the model is held
            await async_wait_until(lambda: srv.service.batcher.depth == 1 and time.time_ns() > soon.deadline_unix_ns,
                                   10, "the queued request's deadline to pass")
            release.set()
            return at_once, await first, await late, srv.service.metrics

    at_once, first, late, metrics = asyncio.run(main())
    assert at_once[0] == grpc.StatusCode.DEADLINE_EXCEEDED and "deadline" in at_once[1]
    assert first[0] == grpc.StatusCode.OK
    assert late[0] == grpc.StatusCode.DEADLINE_EXCEEDED and "before inference" in late[1]
    # only the one request that could make it was computed after warm-up
    assert metrics.batch_size._sum.get() == 1


def test_a_deadline_spent_waiting_to_decode_is_this_workers_load_not_the_callers(tiny_model):
    """A request that came with time enough but spent it waiting for this worker's decoding (its
    decode pool busy with a backlog) was refused with "deadline is -… ms away but a batch takes
    about … ms; send a later deadline": the gateway read that as the client's too-urgent deadline
    (no load counted) and the client was told to send later deadlines. It is this worker's load:
    RESOURCE_EXHAUSTED, "retry on another worker or later", like a decode budget that stays full."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            release, started = threading.Event(), threading.Event()

            def hold() -> None:  # the decode pool busy, as with a backlog of large images
                started.set()
                release.wait(60)

            for _ in range(srv.service._decode_pool._max_workers):
                srv.service._decode_pool.submit(hold)
            assert started.wait(5)
            req = jpeg_request(photo(), deadline_unix_ns=time.time_ns() + 300_000_000)  # ample for one batch
            answer = asyncio.create_task(call(stub, req))
            await async_wait_until(lambda: time.time_ns() > req.deadline_unix_ns, 10, "the deadline to pass")
            release.set()
            return await answer

    code, details = asyncio.run(main())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "retry on another worker or later" in details and "later deadline" not in details
    assert "decod" in details


def test_a_deadline_too_close_for_the_images_own_decoding_is_the_callers_not_load(tiny_model):
    """An idle worker whose decoding of this one image took longer than the deadline left: no
    backlog, nothing for another worker to do better. It was refused RESOURCE_EXHAUSTED "this
    worker took 400 ms to decode the image (its decode backlog)", which the gateway counts as
    this worker's load and retries elsewhere; it is the client's deadline, "send a later deadline"."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            prepare = srv.service.runner.prepare

            def slow(*args, **kw):  # a large image's decode, on a decode pool with nothing else to do
                time.sleep(0.4)
                return prepare(*args, **kw)

            srv.service.runner.prepare = slow
            req = jpeg_request(photo(), deadline_unix_ns=time.time_ns() + 300_000_000)  # ample for one batch
            return await call(stub, req)

    code, details = asyncio.run(main())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (code, details)
    assert "send a later deadline" in details and "decoding the image took" in details
    assert "backlog" not in details


def test_a_request_deadline_behind_this_workers_clock_names_the_clocks(tiny_model):
    """The gateway forwards ``deadline_unix_ns`` as the client sent it and gives the hop a relative
    timeout within it. A worker whose clock is 60 s ahead read every such request as already late
    and answered "deadline is -58109.0 ms away but a batch takes about 3.8 ms; send a later
    deadline" (measured), sending the client after a deadline that was right. What this worker
    sees: the request's deadline 60 s past on its clock, the call with seconds left."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            skewed = jpeg_request(photo(), deadline_unix_ns=time.time_ns() - 60 * 10**9)
            return await call(stub, skewed, timeout=5.0), srv.service.metrics

    (code, msg), metrics = asyncio.run(main())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    late = float(msg.split("deadline_unix_ns is ")[1].split(" s before")[0])
    assert 59.0 < late < 62.0, msg
    assert "this worker's clock" in msg and "NTP" in msg
    assert TOO_SHORT_MARK in msg  # the gateway's mark: not the worker's fault, another worker may serve it
    assert metrics.batch_size._sum.get() == 0  # never reached the model


class PacedRunner(ModelRunner):
    """The real model, each batch taking at least ``pace`` seconds (warm-up too, so the worker's
    estimates say so); while ``gate`` is set to an unset event, batches wait for it too."""

    def __init__(self, model: Path, pace: float) -> None:
        super().__init__(Detector.from_file(model, conf_thres=CONF, threads=1))
        self.pace = pace
        self.gate: threading.Event | None = None

    def _run_batch(self, items):
        time.sleep(self.pace)
        if self.gate is not None:
            self.gate.wait(30)
        return super()._run_batch(items)


def test_a_request_that_cannot_make_its_deadline_behind_the_queue_is_refused_at_once_as_load(tiny_model):
    """A batch takes 0.2 s: a 0.5 s deadline makes it alone but not behind the batch running and
    two queued (0.6 s at least). It was queued, expired there, and the gateway counted its hop's
    timeout against this worker (a healthy worker ejected in a burst); it is refused at once as
    this worker's load, which the gateway sends on to another worker with room."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)
    runner = PacedRunner(tiny_model, 0.2)

    async def main():
        async with running(settings, runner) as (srv, stub, _ch):
            runner.gate = threading.Event()
            queued = [asyncio.create_task(call(stub, jpeg_request(photo(), seq=i), timeout=30)) for i in range(3)]
            await async_wait_until(lambda: srv.service.batcher.depth == 2 and srv.service.load().in_flight == 3,
                                   10, "one request in the model, two queued")
            t0 = time.monotonic()
            refused = await call(stub, jpeg_request(photo(), seq=9), timeout=0.5)
            took = time.monotonic() - t0
            runner.gate.set()
            return refused, took, await asyncio.gather(*queued)

    (code, details), took, queued = asyncio.run(main())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert BUSY_MARK in details and "2 requests queued ahead" in details
    assert took < 0.4  # at once, not at its deadline
    assert [c for c, _ in queued] == [grpc.StatusCode.OK] * 3


def _behind_a_held_batch(model: Any, batch_s: float, timeout: float) -> Tuple[Any, float, Any]:
    """A worker whose batches take ``batch_s`` (batch 1, no delay) holds its first request in the
    model; a second with ``timeout`` queues behind it. Its answer, the seconds it took, and the
    first's answer once the model is let go."""
    settings = make_settings(model, max_batch_size=1, max_queue_delay_ms=0)
    runner = PacedRunner(model, batch_s)

    async def main() -> Tuple[Any, float, Any]:
        async with running(settings, runner) as (srv, stub, _ch):
            runner.gate = threading.Event()
            first = asyncio.create_task(call(stub, jpeg_request(photo()), timeout=30))
            await async_wait_until(lambda: srv.service.load().in_flight == 1 and srv.service.batcher.depth == 0,
                                   10, "the first request taken by the (held) model")
            t0 = time.monotonic()
            behind = await call(stub, jpeg_request(photo(), seq=1), timeout=timeout)
            took = time.monotonic() - t0
            runner.gate.set()
            return behind, took, await first

    return asyncio.run(main())


def test_a_deadline_that_passes_while_a_batch_runs_is_answered_then_as_expired(tiny_model):
    """A batch takes 0.5 s (this one is held longer, but less than 4 times that); a request with
    1.5 s to go is queued behind it and its deadline goes out of reach while the batch still runs.
    It was answered only between batches, after its call's deadline: the caller got its own
    timeout, which the gateway counts against the worker. It is answered when it goes out of
    reach, as removed from the queue, which the gateway does not."""
    (code, details), took, first = _behind_a_held_batch(tiny_model, batch_s=0.5, timeout=1.5)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_MARK in details, (code, details)
    assert took < 1.4  # when out of reach (1.5 s less a batch), before the call's own deadline
    assert first[0] == grpc.StatusCode.OK


def test_a_stalled_batch_leaves_the_requests_behind_it_to_their_deadlines(tiny_model):
    """A batch held far past its expected time (4 times: a wedged model) is no load a gateway
    should forgive: the requests queued behind it are not answered as removed from the queue
    while it runs, so their hops run out and count against this worker (it gets ejected)."""
    (code, details), _took, first = _behind_a_held_batch(tiny_model, batch_s=0.05, timeout=0.6)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and EXPIRED_MARK not in details, (code, details)
    assert first[0] == grpc.StatusCode.OK


def test_a_call_whose_deadline_passes_in_the_model_counts_as_deadline_exceeded_not_cancelled(tiny_model):
    """A call whose gRPC deadline passes after the model took it (the gateway's hop expiring
    while the batch ran, a worker frozen by SIGSTOP) ends DEADLINE_EXCEEDED for its caller,
    but edgewise_worker_requests_total counted it as CANCELLED, the status of a caller that
    gave up: a worker's deadline misses were invisible on its own dashboard."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)

    def sample(srv: WorkerServer, code: str) -> float:
        return srv.service.metrics.registry.get_sample_value("edgewise_worker_requests_total", {"status": code}) or 0.0

    async def main():
        async with running(settings) as (srv, stub, _ch):
            before = sample(srv, "DEADLINE_EXCEEDED"), sample(srv, "CANCELLED")  # the registry is the process's
            release = block_inference(srv)
            expiring = await call(stub, jpeg_request(photo()), timeout=0.5)  # taken by the held model
            await async_wait_until(lambda: srv.service.load().in_flight == 0, 10, "the expired call to end")
            given_up = stub.Infer(jpeg_request(photo()), timeout=60)
            await async_wait_until(lambda: srv.service.load().in_flight == 1, 10, "the second call taken")
            given_up.cancel()
            await async_wait_until(lambda: srv.service.load().in_flight == 0, 10, "the cancelled call to end")
            release.set()
            return expiring, sample(srv, "DEADLINE_EXCEEDED") - before[0], sample(srv, "CANCELLED") - before[1]

    expiring, deadline_exceeded, cancelled = asyncio.run(main())
    assert expiring[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (deadline_exceeded, cancelled) == (1.0, 1.0)


def test_a_call_whose_callers_deadline_passes_first_counts_as_deadline_exceeded(tiny_model):
    """The caller's copy of a call's deadline runs out before the worker's (which began when the
    headers arrived), and its cancellation can beat the worker's own timer: in a real burst 10 of
    38 calls whose 0.5 s deadline passed in the queue were counted CANCELLED, 0.2 to 3.7 ms early,
    although each caller got DEADLINE_EXCEEDED. Here the caller gives up 5 ms before the worker's deadline."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_delay_ms=0)

    def sample(srv: WorkerServer, code: str) -> float:
        return srv.service.metrics.registry.get_sample_value("edgewise_worker_requests_total", {"status": code}) or 0.0

    async def main():
        async with running(settings) as (srv, stub, _ch):
            before = sample(srv, "DEADLINE_EXCEEDED"), sample(srv, "CANCELLED")
            release = block_inference(srv)
            contexts = []
            infer = srv.service._infer

            async def spy(request, context):  # the worker's view of the call's deadline
                contexts.append(context)
                return await infer(request, context)

            srv.service._infer = spy
            late = stub.Infer(jpeg_request(photo()), timeout=1.0)
            await async_wait_until(lambda: srv.service.load().in_flight == 1, 10, "the call taken")
            while contexts[0].time_remaining() > 0.005:
                await asyncio.sleep(0.001)
            late.cancel()  # as the caller's deadline does, a moment before the worker's
            await async_wait_until(lambda: srv.service.load().in_flight == 0, 10, "the call to end")
            release.set()
            return sample(srv, "DEADLINE_EXCEEDED") - before[0], sample(srv, "CANCELLED") - before[1]

    assert asyncio.run(main()) == (1.0, 0.0)


def test_bad_settings_are_rejected_before_binding(tiny_model, tmp_path):
    from edgewise.errors import ConfigError

    s = make_settings(tiny_model, max_batch_size=2, preferred_batch_sizes=(4,))
    with pytest.raises(ConfigError, match="preferred batch size 4"):
        create_server(s)
    with pytest.raises(Exception, match="missing.onnx"):
        create_server(make_settings(tmp_path / "missing.onnx"))


def test_oversize_request_is_rejected_with_a_clear_status(tiny_model):
    settings = make_settings(tiny_model)
    settings.max_message_bytes = 4096

    async def main():
        async with running(settings) as (_, stub, _ch):
            big = await call(stub, jpeg_request(photo()))  # ~100 KB JPEG
            small = await call(stub, jpeg_request(np.full((32, 32, 3), 90, np.uint8)))
            return big, small

    big, small = asyncio.run(main())
    assert big[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "4096" in big[1]
    assert small[0] == grpc.StatusCode.OK


def test_the_not_serving_refusals_carry_the_mark_the_gateway_pauses_on():
    from cloud.gateway.balancing import Outcome, outcome_of
    from cloud.worker.server import SHUTTING_DOWN, WARMING_UP
    from edgewise import status

    assert {outcome_of(status.UNAVAILABLE, m) for m in (SHUTTING_DOWN, WARMING_UP)} == {Outcome.NOT_SERVING}


def test_a_worker_bound_to_an_ipv6_host_answers_there(tiny_model):
    """``host: "::1"`` (an IPv6-only pod or host) is bound as ``[::1]:port``: ``::1:0`` is no
    address gRPC can bind, and the worker refused to start."""
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    settings = make_settings(tiny_model)
    settings.host = "::1"

    async def go() -> None:
        server, port = create_server(settings)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"[::1]:{port}") as channel:
                code, resp = await call(service_pb2_grpc.WorkerStub(channel), jpeg_request(photo()))
                assert code == grpc.StatusCode.OK, resp
        finally:
            await server.stop(2)

    asyncio.run(go())


def test_a_full_queue_of_replays_gives_way_to_a_live_request(tiny_model):
    """A queue full of replays (more devices replaying at once than its places, through several
    gateways each keeping its own count) refused every live request, though a live request is
    served before any replay (``edgewise.wire.queue_rank``). Now the newest replay queued gives
    way, answered as refused for load (its edge replays it later); a live request never displaces
    another live one, nor a replay a replay."""
    settings = make_settings(tiny_model, max_batch_size=1, max_queue_size=2, max_queue_delay_ms=0)

    async def main():
        async with running(settings) as (srv, stub, _ch):
            release = block_inference(srv)
            im = photo()
            replays = [asyncio.create_task(call(stub, jpeg_request(im, seq=i, replay=True, priority=90), timeout=60))
                       for i in range(3)]  # one taken by the blocked model, two queued
            await async_wait_until(lambda: srv.service.batcher.depth == 2, 30, "two replays queued")
            refused_replay = await call(stub, jpeg_request(im, seq=9, replay=True), timeout=60)
            live = asyncio.create_task(call(stub, jpeg_request(im, seq=10), timeout=60))
            await async_wait_until(lambda: sum(t.done() for t in replays) == 1, 30, "the newest replay displaced")
            displaced = [t.result() for t in replays if t.done()]
            live2 = asyncio.create_task(call(stub, jpeg_request(im, seq=11), timeout=60))
            await async_wait_until(lambda: sum(t.done() for t in replays) == 2, 30, "the other replay displaced")
            refused_live = await call(stub, jpeg_request(im, seq=12), timeout=60)  # two live queued: full
            release.set()
            return refused_replay, displaced, await live, await live2, refused_live, await asyncio.gather(*replays)

    refused_replay, displaced, live, live2, refused_live, replays = asyncio.run(main())
    assert refused_replay[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue full" in refused_replay[1]
    assert displaced[0][0] == grpc.StatusCode.RESOURCE_EXHAUSTED, displaced
    assert "a replay gives way to live requests" in displaced[0][1] and BUSY_MARK in displaced[0][1]
    assert live[0] == grpc.StatusCode.OK and live2[0] == grpc.StatusCode.OK, (live, live2)
    assert refused_live[0] == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue full" in refused_live[1]
    # the one the blocked model took runs (the three calls arrive in any order)
    assert sorted(c.name for c, _ in replays) == ["OK", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"], replays


def test_an_error_answer_to_a_client_that_left_is_a_debug_line(tiny_model, caplog):
    """The race the worker cannot see coming: the client leaves (cancels, or its deadline passes)
    between the worker's error answer being decided and sent. gRPC's failed send
    (``ExecuteBatchError``) reached grpc, which logged ``ExecuteBatchError raised in core by servicer
    method [/edgewise.v1.Worker/Infer]`` at ERROR with a traceback, about once in 360 churned calls
    (found by a probe). The worker now takes it as the gateway does (``cloud.binding.unless_client_gone``):
    a DEBUG line, the call ends as cancelled. The send's failure is the one thing faked: it cannot be
    timed from outside gRPC Core (the churn test below never met it on this machine)."""
    class GoneContext:  # what gRPC Core reports when the client left as the status went out
        def time_remaining(self) -> None:
            return None

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise ExecuteBatchError('Failed "execute_batch": (SendStatusFromServerOperation,)')

    async def main():
        async with running(make_settings(tiny_model)) as (server, _stub, _ch):
            with pytest.raises(asyncio.CancelledError):
                await server.service.Infer(detect_pb2.DetectRequest(device_id="cam"), GoneContext())
            with pytest.raises(asyncio.CancelledError):
                await server.service.infer_bytes(b"\xff not a request", GoneContext())

    with caplog.at_level("DEBUG", logger="cloud.worker.server"):
        asyncio.run(main())
    assert [r.getMessage()[:56] for r in caplog.records if r.name == "cloud.worker.server" and
            "client left" in r.getMessage()] == ["the client left before its INVALID_ARGUMENT answer could"] * 2
    assert not errors(caplog.records)


def test_clients_that_cancel_as_the_worker_answers_with_errors_log_no_error(tiny_model, caplog):
    """Real worker, real clients over a socket: 2,000 calls the worker refuses (a bad image), each
    cancelled about when its answer goes out. No ERROR line (grpc's ``ExecuteBatchError raised in
    core`` traceback, or one of the worker's), and the worker answers the next call."""
    bad = detect_pb2.DetectRequest(device_id="cam", stream_id="s",
                                   image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=b"not a jpeg"))

    async def main():
        async with running(make_settings(tiny_model)) as (server, stub, _ch):
            t0 = time.monotonic()
            assert (await call(stub, bad))[0] == grpc.StatusCode.INVALID_ARGUMENT
            answer_s = time.monotonic() - t0  # the client leaves from 0 to twice this after it called
            rng = np.random.default_rng(3)

            async def one() -> None:
                c = stub.Infer(bad, timeout=10)
                await asyncio.sleep(float(rng.uniform(0, 2 * answer_s)))
                c.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await c

            for _ in range(100):
                await asyncio.gather(*(one() for _ in range(20)))
            await async_wait_until(lambda: server.service._in_flight == 0, 10, "every call ended")
            # the worker answers the next call; one fresh call right after the churn came back
            # CANCELLED once in a CI run (not seen in runs alone; its cause not found), so a
            # CANCELLED before the answer is let pass, never another status
            codes = []
            while len(codes) < 3 and grpc.StatusCode.INVALID_ARGUMENT not in codes:
                codes.append((await call(stub, bad))[0])
            assert codes[-1] == grpc.StatusCode.INVALID_ARGUMENT, codes
            assert set(codes[:-1]) <= {grpc.StatusCode.CANCELLED}, codes

    with caplog.at_level("DEBUG"):
        asyncio.run(main())
    assert not errors(caplog.records)
