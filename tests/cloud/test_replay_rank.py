"""Replays from the edges' spools against live escalations, through the real gateway and a real
worker (``tests.realcloud.InProcessCloud``, the shipped cloud model): after an outage every
device of a fleet replays its backlog at once, and those replays must not crowd out the live
escalations (``edgewise.wire.queue_rank``, docs/design/batching.md#priority)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import cv2
import grpc
import numpy as np

from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.realcloud import InProcessCloud

ROOT = Path(__file__).resolve().parents[2]


def test_a_fleet_replaying_its_backlogs_leaves_the_live_escalations_answered():
    """30 devices each replay one escalation at a time (``spool.replay_concurrency`` 1, the 10 s
    replay deadline) with the hardness percentile they were first sent with (80); another device
    escalates live frames of percentile 50 with 500 ms to go. Before, the replays kept their 80
    and stood ahead of the live frames in the worker's queue and in the gateway's prediction:
    every live escalation was refused as saturated (0 of 49 in 10 s on the project's 2-core
    machine), so its edge spooled it too. Now a replay waits below every live request: the
    live ones are answered, and the replays still use what capacity is left."""
    ok, buf = cv2.imencode(".jpg", (np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.uint8))
    assert ok
    image = detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=buf.tobytes())

    def request(device: str, seq: int, priority: int, replay: bool) -> detect_pb2.DetectRequest:
        return detect_pb2.DetectRequest(device_id=device, stream_id="s", frame_seq=seq, image=image,
                                        priority=priority, replay=replay)

    async def main(address: str) -> dict[str, Counter[str]]:
        got: dict[str, Counter[str]] = {"replay": Counter(), "live": Counter()}
        async with grpc.aio.insecure_channel(address) as ch:
            stub = service_pb2_grpc.EscalationStub(ch)
            await stub.Detect(request("warm-up", 0, 0, False), timeout=60)
            stop = time.monotonic() + 8

            async def replaying(device: str) -> None:
                seq = 0
                while time.monotonic() < stop:
                    seq += 1
                    try:
                        await stub.Detect(request(device, seq, 80, True), timeout=10)
                        got["replay"]["OK"] += 1
                    except grpc.aio.AioRpcError as exc:
                        got["replay"][exc.code().name] += 1
                        await asyncio.sleep(0.2)

            async def live() -> None:
                await asyncio.sleep(2)  # the replays have filled the queue
                seq = 0
                while time.monotonic() < stop:
                    seq += 1
                    try:
                        await stub.Detect(request("live", seq, 50, False), timeout=0.5)
                        got["live"]["OK"] += 1
                    except grpc.aio.AioRpcError as exc:
                        got["live"][exc.code().name] += 1
                    await asyncio.sleep(0.2)

            await asyncio.gather(live(), *(replaying(f"jetson-{i:02d}") for i in range(30)))
        return got

    with InProcessCloud(ROOT / "models" / "cloud.onnx") as cloud:
        got = asyncio.run(main(cloud.address))
    sent = sum(got["live"].values())
    assert sent >= 10 and got["live"]["OK"] >= 0.8 * sent, got
    assert got["replay"]["OK"] >= 50, got  # the replays go on beside them


def test_more_devices_replaying_than_a_workers_limit_leave_the_live_escalations_room():
    """90 devices each replay one escalation at a time (10 s deadline) against one worker whose
    limit (max batch + max queue) is 68; another device escalates live frames with 500 ms to go.
    Ranked below, the replays no longer stood ahead of the live frames, but they still filled the
    worker's limit in the gateway's count: the live escalations were refused as saturated ("68
    requests in flight") whenever 68 replays were in flight. Now a replay is sent only while the
    worker holds less than half its limit, so the live ones find room."""
    ok, buf = cv2.imencode(".jpg", (np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.uint8))
    assert ok
    image = detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=buf.tobytes())

    async def main(address: str) -> dict[str, Counter[str]]:
        got: dict[str, Counter[str]] = {"replay": Counter(), "live": Counter()}
        async with grpc.aio.insecure_channel(address) as ch, grpc.aio.insecure_channel(address) as ch2:
            stub, stub2 = service_pb2_grpc.EscalationStub(ch), service_pb2_grpc.EscalationStub(ch2)
            await stub.Detect(detect_pb2.DetectRequest(device_id="warm-up", stream_id="s", image=image), timeout=60)
            stop = time.monotonic() + 8

            async def replaying(device: str, to: service_pb2_grpc.EscalationStub) -> None:
                seq = 0
                while time.monotonic() < stop:
                    seq += 1
                    req = detect_pb2.DetectRequest(device_id=device, stream_id="s", frame_seq=seq, image=image,
                                                   replay=True)
                    try:
                        await to.Detect(req, timeout=10)
                        got["replay"]["OK"] += 1
                    except grpc.aio.AioRpcError as exc:
                        got["replay"][exc.code().name] += 1
                        await asyncio.sleep(0.2)

            async def live() -> None:
                await asyncio.sleep(2)  # the replays have filled the queue
                seq = 0
                while time.monotonic() < stop:
                    seq += 1
                    req = detect_pb2.DetectRequest(device_id="live", stream_id="s", frame_seq=seq, image=image,
                                                   priority=50)
                    try:
                        await stub.Detect(req, timeout=0.5)
                        got["live"]["OK"] += 1
                    except grpc.aio.AioRpcError as exc:
                        got["live"][exc.code().name] += 1
                    await asyncio.sleep(0.2)

            await asyncio.gather(live(), *(replaying(f"jetson-{i:02d}", stub if i % 2 else stub2)
                                           for i in range(90)))
        return got

    with InProcessCloud(ROOT / "models" / "cloud.onnx") as cloud:
        got = asyncio.run(main(cloud.address))
    sent = sum(got["live"].values())
    assert sent >= 10 and got["live"]["OK"] >= 0.8 * sent, got
    assert got["replay"]["OK"] >= 50, got  # the replays go on beside them
