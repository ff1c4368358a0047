"""The cloud's answers are untrusted input: what a hostile or broken cloud sends must end
as a clear per-frame reason (the frame keeps its edge result), never as a traceback, a
stuck spool, a huge record, boxes outside the frame or log spam. The fake clouds are real
servers: a grpc.aio server on port 0 answering raw bytes, and an MQTT v5 responder on a real
Mosquitto broker (``mosquitto``); the rest calls the real functions."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import Any, Callable, List, Optional, Tuple, Union, cast

import grpc
import numpy as np
import pytest

from edge.escalating import LOG_BURST, Escalating
from edge.metrics import EdgeMetrics
from edge.payloads import Spooled, build_request
from edge.sources.base import Frame
from edge.spool import Spool
from edge.transports import (
    MAX_ERROR_CHARS,
    MAX_MODEL_NAME_CHARS,
    TransportError,
    check_response,
    printable,
)
from edge.transports.grpc import GrpcTransport
from edgewise.detections import Detections
from edgewise.merging import merge
from edgewise.policy.deciding import Decision
from edgewise.policy.loading import parse_policy
from edgewise.v1 import detect_pb2
from edgewise.wire import MAX_ANSWER_DETECTIONS, answer_detections
from tests.edge.helpers import frame_record, policy_yaml
from tests.waiting import async_wait_until

NAMES = tuple(str(i) for i in range(10))
MALFORMED = b"\xff\xff\xff\xff\x0f\x08"  # no DetectResponse
Answer = Union[bytes, Tuple[grpc.StatusCode, str]]


def _ok(req: Any, **kw: Any) -> detect_pb2.DetectResponse:
    resp = detect_pb2.DetectResponse(status=detect_pb2.OK, device_id=req.device_id, stream_id=req.stream_id,
                                     frame_seq=req.frame_seq, model_name="hostile", **kw)
    return resp


def _det(x1=10.0, y1=10.0, x2=30.0, y2=30.0, score=0.9, class_id=0, class_name=""):
    return detect_pb2.Detection(x1=x1, y1=y1, x2=x2, y2=y2, score=score, class_id=class_id, class_name=class_name,
                                source="cloud")


def _non_utf8_name(req: Any) -> bytes:
    raw = _ok(req, detections=[_det(class_name="QQQQQQQQ")]).SerializeToString()
    return raw.replace(b"QQQQQQQQ", b"\xff\xfe\xc3(\x80\x81\xff\xff")


class FakeCloud:
    """A real grpc.aio server of ``edgewise.v1.Escalation/Detect`` on port 0 that answers
    each request with what ``answer(request)`` gives: raw bytes, or (code, details) to abort."""

    def __init__(self, answer: Callable[[Any], Answer]) -> None:
        self.answer = answer
        self.address = ""

    async def __aenter__(self) -> FakeCloud:
        async def detect(raw: bytes, ctx: Any) -> bytes:
            out = self.answer(detect_pb2.DetectRequest.FromString(raw))
            if isinstance(out, tuple):
                await ctx.abort(*out)
            return out  # type: ignore[return-value]

        self.server = grpc.aio.server()
        handler = {"Detect": grpc.unary_unary_rpc_method_handler(
            detect, request_deserializer=lambda b: b, response_serializer=lambda b: b)}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("edgewise.v1.Escalation",
                                                                                  handler),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        await self.server.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.server.stop(None)


def edge_dets() -> Detections:
    return Detections(boxes=np.array([[10, 10, 30, 30]], np.float32), scores=np.array([0.4], np.float32),
                      class_ids=np.zeros(1, np.int32), names=NAMES, source="edge")


def _request(seq: int, policy: Any) -> Any:
    req, _ = build_request("dev", Frame("cam", seq, np.full((48, 64, 3), 30 + seq, np.uint8), 0, 0.0), edge_dets(),
                           Decision(True, "hard", 0.8, {}), policy)
    return req


def _spool(tmp_path: Any, seqs: Any, policy: Any) -> Spool:
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    for seq in seqs:
        spool.put(f"dev/cam/{seq}", _request(seq, policy).SerializeToString(),
                  Spooled(frame_record("cam", seq), policy.spec.merge, 3000, "grpc").to_meta())
    return spool


async def _submit(esc: Escalating, policy: Any, seqs: Any, written: List[Any]) -> None:
    for seq in seqs:
        esc.submit(Frame("cam", seq, np.full((48, 64, 3), 90, np.uint8), 0, 0.0), edge_dets(),
                   Decision(True, "hard", 0.8, {}), policy, frame_record("cam", seq))
    await async_wait_until(lambda: len(written) == len(seqs), 20, "every record")


# ---------------------------------------------------------------- 1: undecodable answers
@pytest.mark.parametrize("answer", [lambda req: MALFORMED, _non_utf8_name], ids=["malformed", "non_utf8_name"])
def test_an_answer_that_is_no_detect_response_keeps_the_edge_result_without_a_traceback(answer, caplog):
    """grpc's own deserializer logged "Exception deserializing message!" and handed back
    None, and check_response's AttributeError became a traceback and an INTERNAL record."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    written: List[Any] = []

    async def run() -> None:
        async with FakeCloud(answer) as cloud:
            t = GrpcTransport([cloud.address])
            with pytest.raises(TransportError) as ei:
                await t.detect(_request(1, policy), 3.0)
            assert ei.value.status == detect_pb2.INTERNAL and not ei.value.spoolable
            assert "the cloud's answer is not a DetectResponse" in str(ei.value)
            esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), names=NAMES)
            await _submit(esc, policy, [2], written)
            await esc.close()
            await t.close()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(run())
    (rec,) = written
    assert rec.outcome == "edge_only"
    assert rec.error.startswith("INTERNAL: the cloud's answer is not a DetectResponse"), rec.error
    assert not [r for r in caplog.records if r.exc_info or "deserializing" in r.getMessage()]


def test_check_response_refuses_no_answer_as_internal():
    with pytest.raises(TransportError, match="not a DetectResponse") as ei:
        check_response(None)
    assert ei.value.status == detect_pb2.INTERNAL


def test_a_poison_answer_during_replay_settles_its_entry_instead_of_blocking_the_spool(tmp_path):
    """A cloud that answers the spool's head with bytes that are no DetectResponse: every
    replay round failed and the head was never settled. Now the entry ends edge_only with
    the reason and the entries behind it are delivered."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = _spool(tmp_path, range(3), policy)
    written: List[Any] = []

    def answer(req: Any) -> Answer:
        return MALFORMED if req.frame_seq == 0 else _ok(req, detections=[_det()]).SerializeToString()

    async def run() -> int:
        async with FakeCloud(answer) as cloud:
            t = GrpcTransport([cloud.address])
            esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool, names=NAMES)
            n = await esc.replay_once()
            await esc.close()
            await t.close()
            return n

    assert asyncio.run(run()) == 3
    assert [(r.frame_seq, r.outcome, r.late) for r in written] == [(0, "edge_only", True), (1, "cloud", True),
                                                                    (2, "cloud", True)]
    assert "not a DetectResponse" in written[0].error
    assert len(spool) == 0
    spool.close()


class _Broken:
    """Pure: a transport whose detect fails with something that is not a TransportError."""

    name = "grpc"

    def __init__(self) -> None:
        self.calls = 0

    async def detect(self, req: Any, timeout_s: float) -> Any:
        self.calls += 1
        raise RuntimeError(f"bug {req.frame_seq}")


def test_an_unexpected_failure_of_a_replay_settles_that_entry_and_is_logged_once_per_round(tmp_path, caplog):
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = _spool(tmp_path, range(4), policy)
    written: List[Any] = []

    async def run() -> int:
        esc = Escalating("dev", {"grpc": cast(Any, _Broken())}, written.append, EdgeMetrics(), spool=spool,
                         replay_concurrency=4)
        n = await esc.replay_once()
        await esc.close()
        return n

    with caplog.at_level(logging.ERROR, logger="edge.escalating"):
        assert asyncio.run(run()) == 4
    assert all(r.outcome == "edge_only" and "RuntimeError('bug" in r.error for r in written)
    assert len(spool) == 0
    assert len([r for r in caplog.records if "failed unexpectedly" in r.getMessage()]) == 1
    spool.close()


# ---------------------------------------------------------------- 2-4, 8, 9: what an answer says
async def _escalating() -> Escalating:
    return Escalating("dev", {}, lambda rec: None, EdgeMetrics(), names=NAMES)


def _write(resp: detect_pb2.DetectResponse, seq: int = 1, merge_strategy: Optional[str] = None) -> Any:
    esc = asyncio.run(_escalating())
    try:
        record = frame_record("cam", seq)  # a 64x48 frame
        policy = parse_policy(policy_yaml("p"))
        m = policy.spec.merge if merge_strategy is None else dataclasses.replace(policy.spec.merge,
                                                                                 strategy=merge_strategy)
        esc._write_merged(record, edge_dets(), resp, m, 0.1, late=False)
        return record
    finally:
        esc.spool_io.shutdown()


def _resp(*dets: detect_pb2.Detection, seq: int = 1) -> detect_pb2.DetectResponse:
    return _ok(detect_pb2.DetectRequest(device_id="dev", stream_id="cam", frame_seq=seq), detections=list(dets))


def test_an_answer_with_more_detections_than_the_bound_is_unusable():
    many = [_det(x1=i % 50, y1=1, x2=i % 50 + 5, y2=9, score=0.5) for i in range(MAX_ANSWER_DETECTIONS + 1)]
    with pytest.raises(ValueError, match=rf"{MAX_ANSWER_DETECTIONS + 1} detections, over the "
                                         rf"{MAX_ANSWER_DETECTIONS} one answer may have"):
        _write(_resp(*many))
    assert len(answer_detections(many[:MAX_ANSWER_DETECTIONS], NAMES, (64, 48))) == MAX_ANSWER_DETECTIONS


@pytest.mark.parametrize("score", [5.0, -0.7, 3e38, 1.01])
def test_a_score_outside_0_1_makes_the_answer_unusable(score):
    with pytest.raises(ValueError, match=r"detections\[0\]\.score .* is outside \[0, 1\]"):
        _write(_resp(_det(score=score)))


def test_a_score_a_rounding_past_1_is_clipped():
    d = answer_detections([_det(score=1.0004), _det(score=-0.0004)], NAMES, (64, 48))
    assert d.scores.tolist() == [1.0, 0.0]


def test_the_fuse_merge_never_extrapolates_from_a_negative_score():
    """wbf_negscore.py: a negative cloud score made the fused box an extrapolation (inverted,
    or outside both boxes). Whatever the inputs, weights are never negative."""
    edge = Detections(boxes=np.array([[100, 100, 200, 200]], np.float32), scores=np.array([0.9], np.float32),
                      class_ids=np.zeros(1, np.int32), names=NAMES, source="edge")
    for s in (-0.89, -0.8999, -5.0):
        cloud = Detections(boxes=np.array([[100, 100, 215, 215]], np.float32), scores=np.array([s], np.float32),
                           class_ids=np.zeros(1, np.int32), names=NAMES, source="cloud")
        out = merge(edge, cloud, "fuse", iou=0.55, edge_floor=0.5)
        (box,) = out.boxes.tolist()
        assert box[0] <= box[2] and box[1] <= box[3], (s, box)
        assert 100 <= box[0] and box[2] <= 215 and 100 <= box[1] and box[3] <= 215, (s, box)


def test_boxes_are_clipped_to_the_frame_and_those_outside_it_dropped():
    rec = _write(_resp(_det(-10, -5, 30, 30, score=0.8), _det(70, 50, 100, 60, score=0.7),
                       _det(60, 40, 90, 90, score=0.6)), merge_strategy="replace")
    assert [b["box"] for b in rec.detections] == [[0.0, 0.0, 30.0, 30.0], [60.0, 40.0, 64.0, 48.0]]


@pytest.mark.parametrize("box", [(0, 0, 3e38, 3e38), (-500, -500, -100, -100), (1000, 1000, 5000, 5000)])
def test_a_box_far_outside_the_frame_makes_the_answer_unusable(box):
    with pytest.raises(ValueError, match="lies far outside the 64x48 frame"):
        _write(_resp(_det(*box)))


def test_an_answer_naming_no_device_or_stream_but_another_frame_seq_is_refused():
    resp = detect_pb2.DetectResponse(status=detect_pb2.OK, frame_seq=778, detections=[_det()])
    with pytest.raises(ValueError, match="the answer is for another frame: frame_seq 778, not 1"):
        _write(resp)
    anonymous = detect_pb2.DetectResponse(status=detect_pb2.OK, detections=[_det()])  # an older cloud: taken
    assert _write(anonymous).outcome == "cloud"


def test_a_class_name_that_is_not_the_edges_name_of_its_id_makes_the_answer_unusable():
    with pytest.raises(ValueError, match=r"class_name 'definitely-not-3' is not the edge model's name of "
                                         r"class_id 3, '3'"):
        _write(_resp(_det(class_id=3, class_name="definitely-not-3")))
    assert _write(_resp(_det(class_id=3, class_name="3"))).outcome == "cloud"
    assert _write(_resp(_det(class_id=3))).outcome == "cloud"  # no name given: the id is read with ours


# ---------------------------------------------------------------- 5: the cloud's error text
def test_the_clouds_error_text_is_cut_and_made_printable_where_it_enters():
    """3 MB of error text with newlines and ANSI escapes went into every record and log line."""
    evil = "E\n\x1b[31mINJECT " + "x" * 3_000_000
    policy = parse_policy(policy_yaml("p", deadline_ms=5000))
    written: List[Any] = []

    def answer(req: Any) -> Answer:
        if req.frame_seq == 1:
            return (grpc.StatusCode.INTERNAL, "bad\x1b[31m details " + "y" * 5000)
        return detect_pb2.DetectResponse(status=detect_pb2.INTERNAL, error=evil).SerializeToString()

    async def run() -> Tuple[str, str]:
        async with FakeCloud(answer) as cloud:
            t = GrpcTransport([cloud.address])
            with pytest.raises(TransportError) as from_status:
                await t.detect(_request(0, policy), 5.0)
            with pytest.raises(TransportError) as from_details:
                await t.detect(_request(1, policy), 5.0)
            esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), names=NAMES)
            await _submit(esc, policy, [2], written)
            await esc.close()
            await t.close()
            return str(from_status.value), str(from_details.value)

    for text in (*asyncio.run(run()), written[0].error):
        assert len(text) < MAX_ERROR_CHARS + 100, len(text)
        assert "\n" not in text and "\x1b" not in text, text[:80]
    assert "E\\n\\x1b[31mINJECT xxx" in written[0].error and "3000014 characters in all" in written[0].error
    assert printable("a\tb\u202e") == "a\\tb\\u202e"


def test_the_per_class_scores_of_an_answer_are_not_read():
    """1000 detections of 8000 class scores each (30 MiB, under the receive limit) were all
    read into an array the edge never uses: 0.6 s of the event loop per answer."""
    wide = [_det() for _ in range(MAX_ANSWER_DETECTIONS)]
    for d in wide:
        d.class_scores.extend([0.1] * 8000)
    got = answer_detections(wide, NAMES, (64, 48))
    assert got.class_scores is None and len(got) == MAX_ANSWER_DETECTIONS


def test_the_clouds_model_name_is_cut_and_made_printable_before_it_reaches_the_record():
    """A cloud answering with a 4 MB model_name full of ANSI escapes and newlines: every
    escalated frame's record carried all of it (6 MB JSON lines; the daemon wrote 3 records in
    15 s instead of 43), unlike the error text, which was already cut."""
    resp = _resp(_det())
    resp.model_name = "\x1b[31mEVIL\n" * 400_000
    rec = _write(resp)
    assert rec.outcome == "cloud"
    assert len(rec.cloud_model) < MAX_MODEL_NAME_CHARS + 50, len(rec.cloud_model)
    assert "\n" not in rec.cloud_model and "\x1b" not in rec.cloud_model
    assert rec.cloud_model.startswith("\\x1b[31mEVIL\\n") and "4000000 characters in all" in rec.cloud_model
    plain = _resp(_det())
    plain.model_name = "yolov5x-coco"
    assert _write(plain).cloud_model == "yolov5x-coco"


# ---------------------------------------------------------------- 7: log spam
class _Answering:
    """Pure: answers every request with what ``answer`` makes of it."""

    name = "grpc"

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.answer = answer

    async def detect(self, req: Any, timeout_s: float) -> Any:
        return self.answer(req)


def test_unusable_answers_and_refused_replays_are_logged_a_few_times_not_per_frame(tmp_path, caplog):
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = _spool(tmp_path, range(10, 20), policy)
    written: List[Any] = []
    inverted = _Answering(lambda req: _ok(req, detections=[_det(30, 30, 10, 10)]))

    async def run() -> None:
        esc = Escalating("dev", {"grpc": cast(Any, inverted)}, written.append, EdgeMetrics(), spool=spool, names=NAMES,
                         replay_batch=10)
        await _submit(esc, policy, list(range(10)), written)
        assert await esc.replay_once() == 10
        await esc.close()

    with caplog.at_level(logging.WARNING, logger="edge.escalating"):
        asyncio.run(run())
    assert len(written) == 20 and all(r.outcome == "edge_only" and "inverted" in r.error for r in written)
    unusable = [r for r in caplog.records if "unusable" in r.getMessage() and r.levelno == logging.WARNING]
    refused = [r for r in caplog.records if r.levelno == logging.ERROR and "dropped from the spool" in r.getMessage()]
    assert len(unusable) == LOG_BURST and len(refused) == LOG_BURST
    spool.close()


# ---------------------------------------------------------------- 6, 7: MQTT
class _Responder:
    """An MQTT v5 client on the broker that answers each escalation with the messages
    ``answers(request, correlation data)`` gives: (payload, correlation data or None)."""

    def __init__(self, broker: Any, answers: Callable[[Any, bytes], List[Tuple[bytes, Optional[bytes]]]]) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.answers = answers
        self.subscribed = threading.Event()
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="hostile-responder",
                                  protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe("edgewise/+/escalate", qos=1)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.client.on_message = self._got
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        assert self.subscribed.wait(10)

    def _got(self, client: Any, userdata: Any, msg: Any) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        req = detect_pb2.DetectRequest.FromString(msg.payload)
        for payload, corr in self.answers(req, bytes(msg.properties.CorrelationData)):
            props = Properties(PacketTypes.PUBLISH)
            if corr is not None:
                props.CorrelationData = corr
            client.publish(msg.properties.ResponseTopic, payload, qos=1, properties=props)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_mqtt_refuses_an_answer_over_the_size_limit_and_counts_what_it_drops(mosquitto, monkeypatch, caplog):
    """An MQTT answer had no size limit (the gRPC transport refuses one over its receive
    limit); responses without or with unknown correlation data were a WARNING each, or
    dropped without a word."""
    import edge.transports.mqtt as mqtt_transport

    monkeypatch.setattr(mqtt_transport, "MAX_ANSWER_BYTES", 4096)
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))

    def answers(req: Any, corr: bytes) -> List[Tuple[bytes, Optional[bytes]]]:
        resp = _ok(req, detections=[_det()])
        strays: List[Tuple[bytes, Optional[bytes]]] = [(resp.SerializeToString(), None)] * 3 + [(resp.SerializeToString(), b"not-waited-for")] * 2
        if req.frame_seq == 1:
            resp.model_name = "L" * 10_000
            return strays + [(resp.SerializeToString(), corr)]
        if req.frame_seq == 2:
            return strays + [(MALFORMED, corr)]
        return strays + [(resp.SerializeToString(), corr)]

    responder = _Responder(mosquitto, answers)

    async def run() -> Any:
        conn = mqtt_transport.MqttConnection(mosquitto.host, mosquitto.port, client_id="edge-hostile")
        conn.start()
        t = mqtt_transport.MqttTransport(conn, "dev")
        await t.start()
        await async_wait_until(lambda: conn.connected.is_set(), 10, "the edge connected")
        await asyncio.sleep(0.3)  # the response subscription settles
        try:
            ok = await t.detect(_request(0, policy), 5.0)
            assert ok.frame_seq == 0
            with pytest.raises(TransportError) as big:
                await t.detect(_request(1, policy), 5.0)
            with pytest.raises(TransportError) as bad:
                await t.detect(_request(2, policy), 5.0)
            await async_wait_until(lambda: t.dropped["unknown_correlation"] >= 6, 10, "the strays")
            return big.value, bad.value, dict(t.dropped)
        finally:
            await t.close()
            conn.stop()

    try:
        with caplog.at_level(logging.WARNING, logger="edge.transports.mqtt"):
            big, bad, dropped = asyncio.run(run())
    finally:
        responder.stop()
    assert big.status == detect_pb2.INVALID_ARGUMENT and not big.spoolable
    assert "over the 4096 bytes an answer may have" in big.message and "message larger than max" in big.message
    assert bad.status == detect_pb2.INTERNAL and "not a DetectResponse" in bad.message
    assert dropped == {"no_correlation": 9, "unknown_correlation": 6}
    assert len([r for r in caplog.records if "MQTT response on" in r.getMessage()]) == 1
