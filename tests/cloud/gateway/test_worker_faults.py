"""Workers that fail, through a real gateway: an answer for another frame, an answer that says
nothing, and failing workers that the ejection cap keeps in the pool
(docs/design/balancing.md#outlier-ejection).

Before the gateway checked them, an answer naming another frame went to the client as OK (a
wrong frame's detections as this frame's result) and counted as a success; the worker answered
at once, so least-connections sent it more than its share (40% of the traffic in a pool of four)
and it was never ejected. An empty answer reached the client as UNKNOWN with no message.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc

from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.cloud.gateway.test_gateway import _detect, http_get, run, started
from tests.cloud.gateway.workers import TestWorker, request


class WrongFrameWorker(TestWorker):
    """Answers OK at once, with another frame's frame_seq (a worker that mixed up its queue)."""

    __test__ = False

    async def Infer(self, request, context):
        self.calls += 1
        return detect_pb2.DetectResponse(status=detect_pb2.OK, device_id=request.device_id,
                                         stream_id=request.stream_id, frame_seq=request.frame_seq + 1000,
                                         worker_id=self.name)


class EmptyAnswerWorker(TestWorker):
    """Answers an empty message (no status, no error)."""

    __test__ = False

    async def Infer(self, request, context):
        self.calls += 1
        return detect_pb2.DetectResponse()


def test_an_answer_for_another_frame_never_reaches_the_client_and_ejects_the_worker():
    async def main():
        bad = WrongFrameWorker("bad")
        goods = [TestWorker(f"good{i}", 0.002, concurrency=4) for i in range(3)]
        gw = await started([(bad, 1)] + [(g, 1) for g in goods])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                results = [await _detect(stub, request(seq=i)) for i in range(40)]
            for i, (code, got) in enumerate(results):
                if code == "OK":
                    assert got.frame_seq == i and got.worker_id != "bad"
                else:
                    assert code == "INTERNAL", (code, got)
                    assert got == (f"worker {bad.address}: its answer is for another frame: "
                                   f"frame_seq {i + 1000}, not {i}")
            assert bad.calls == 5 and sum(r[0] != "OK" for r in results) == 5  # ejected after 5
            states = {w["name"]: w["state"] for w in gw.pool.snapshot()["workers"]}
            assert states[bad.address] == "ejected"
            text = (await http_get(f"http://127.0.0.1:{gw.metrics_port}/metrics")).decode()
            assert f'edgewise_gateway_worker_errors_total{{status="INTERNAL",worker="{bad.address}"}} 5.0' in text
        finally:
            await gw.stop(0)
            for w in [bad, *goods]:
                await w.stop()
    run(main())


def test_an_empty_answer_is_named_for_its_worker():
    async def main():
        bad = EmptyAnswerWorker("bad")
        gw = await started([(bad, 1)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                code, details = await _detect(service_pb2_grpc.EscalationStub(ch), request(seq=3))
            assert (code, details) == ("UNKNOWN", f"worker {bad.address}: answered STATUS_UNSPECIFIED "
                                                  "without a message")
        finally:
            await gw.stop(0)
            await bad.stop()
    run(main())


def test_a_failing_worker_the_ejection_cap_keeps_gets_no_more_traffic_than_its_failures():
    """Two of four workers fail every request at once; the 10% cap ejects one. The other had
    nothing in flight, so least-connections sent it most of the traffic: 64% of the requests
    failed (150/s, two healthy workers with room to spare). Now each fails its five and then
    gets no request while its healthy peers have fewer than five in flight each."""
    async def main():
        bads = [TestWorker(f"bad{i}", fail=grpc.StatusCode.INTERNAL) for i in range(2)]
        goods = [TestWorker(f"good{i}", 0.005, concurrency=4) for i in range(2)]
        gw = await started([(w, 1) for w in bads + goods])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                sem = asyncio.Semaphore(4)

                async def one(i: int) -> tuple:
                    async with sem:
                        return await _detect(stub, request(seq=i))
                results = await asyncio.gather(*(one(i) for i in range(200)))
            codes = Counter(r[0] for r in results)
            assert set(codes) == {"OK", "INTERNAL"} and codes["INTERNAL"] == sum(w.calls for w in bads)
            # five each, and a few more where requests were picked while the fifth was in flight
            assert all(5 <= w.calls <= 8 for w in bads), [w.calls for w in bads]
            states = sorted(w["state"] for w in gw.pool.snapshot()["workers"])
            assert states == ["ejected", "ready", "ready", "ready"]  # the cap held for one of them
        finally:
            await gw.stop(0)
            for w in bads + goods:
                await w.stop()
    run(main())
