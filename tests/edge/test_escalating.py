"""Escalation: the crop around uncertain boxes and the DetectRequest (pure), and the
spool seen from the event loop: a real spool, the real gateway and worker
(``real_cloud``) going away and coming back, a closed port for a cloud that is not there."""

from __future__ import annotations

import asyncio
import logging
import re
import threading

import cv2
import numpy as np
import pytest
import yaml

from edge.escalating import Escalating
from edge.metrics import EdgeMetrics
from edge.payloads import Spooled, build_request, detections_json, note_payload, seen_regions
from edge.records import idempotency_key
from edge.sources.base import Frame
from edge.spool import RESERVE_BYTES, Spool
from edge.stuckentries import ATTEMPTS
from edge.transports import TransportError
from edge.transports.grpc import GrpcTransport
from edgewise.detections import Detections
from edgewise.policy.deciding import Decision
from edgewise.policy.loading import parse_policy
from edgewise.regions import crop_region
from edgewise.v1 import detect_pb2
from edgewise.wire import decode_image, tiles_from_proto
from tests.conftest import free_port
from tests.edge.helpers import frame_record, policy_yaml
from tests.waiting import async_wait_until


def dets(boxes, scores):
    n = len(scores)
    return Detections(boxes=np.asarray(boxes, np.float32).reshape(-1, 4), scores=np.asarray(scores, np.float32),
                      class_ids=np.zeros(n, np.int32), names=("a",), source="edge")


def test_crop_region_pads_uncertain_boxes_and_clips():
    d = dets([[10, 10, 30, 30], [50, 50, 60, 60], [0, 0, 5, 5]], [0.4, 0.5, 0.95])
    # boxes 0 and 1 uncertain (band 0.25..0.6); 20% padding of each box's size
    assert crop_region(d, (100, 80), (0.25, 0.6), 0.2) == (6, 6, 62, 62)
    assert crop_region(d, (55, 55), (0.25, 0.6), 0.2) == (6, 6, 55, 55)
    assert crop_region(dets([[0, 0, 5, 5]], [0.95]), (100, 80), (0.25, 0.6), 0.2) is None  # nothing uncertain
    assert crop_region(dets([], []), (100, 80), (0.25, 0.6), 0.2) is None  # empty frame: full frame


def test_build_request_crop_carries_offset_and_source_size():
    img = np.zeros((80, 100, 3), np.uint8)
    img[20:40, 20:40] = 255
    frame = Frame("cam", 7, img, 123, 0.0)
    d = dets([[10, 10, 30, 30]], [0.4])
    policy = parse_policy(policy_yaml("p", mode="crops"))
    v = Decision(True, "hard", 0.8, {"entropy": 0.5}, priority=90)
    req, plan = build_request("dev", frame, d, v, policy)
    assert plan.regions.tolist() == [[6, 6, 34, 34]] and not plan.tiles
    assert (req.device_id, req.stream_id, req.frame_seq) == ("dev", "cam", 7)
    assert (req.image.offset_x, req.image.offset_y) == (6, 6)
    assert (req.image.source_width, req.image.source_height) == (100, 80)
    crop = cv2.imdecode(np.frombuffer(req.image.data, np.uint8), cv2.IMREAD_COLOR)
    assert crop.shape == (28, 28, 3)
    assert len(req.edge_detections) == 1 and req.reason == "hard" and req.priority == 90
    assert abs(req.hardness.score - 0.8) < 1e-6 and abs(req.hardness.signals["entropy"] - 0.5) < 1e-6
    record = frame_record("cam", 7)
    note_payload(record, req, plan, "crops")
    assert record.crop == [6, 6, 34, 34] and record.regions is None and record.payload == "crops"
    assert record.payload_bytes == len(req.image.data) and seen_regions(record).tolist() == [[6, 6, 34, 34]]
    full, plan = build_request("dev", frame, d, v, parse_policy(policy_yaml("p", mode="full")))
    assert plan.regions is None and (full.image.offset_x, full.image.source_width) == (0, 100)
    assert cv2.imdecode(np.frombuffer(full.image.data, np.uint8), cv2.IMREAD_COLOR).shape == (80, 100, 3)


def test_build_request_regions_pack_uncertain_boxes_and_motion_at_full_resolution():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    frame = Frame("cam", 9, img, 123, 0.0)
    d = dets([[100, 100, 140, 150], [600, 300, 700, 420]], [0.4, 0.95])  # one uncertain box
    blobs = np.array([[1000, 250, 1016, 270]], np.float32)  # motion no detection explains
    v = Decision(True, "hard", 0.8, {"motion_blobs": 0.5})
    req, plan = build_request("dev", frame, d, v, parse_policy(policy_yaml("p", mode="regions")), blobs)
    tiles = tiles_from_proto(req.image)
    assert len(tiles) == 2 and all(t.scale == 1.0 for t in tiles) and plan.regions.shape == (2, 4)
    packed = decode_image(req.image)
    assert packed.shape[0] * packed.shape[1] < 0.2 * 1280 * 720  # a fraction of the frame's pixels
    assert (req.image.source_width, req.image.source_height) == (1280, 720)
    record = frame_record("cam", 9)
    note_payload(record, req, plan, "regions")
    assert record.crop is None and len(record.regions) == 2 and record.payload == "regions"
    assert record.to_dict()["regions"] == record.regions and "regions" not in frame_record("cam", 1).to_dict()
    # nothing uncertain and no motion: the whole frame goes, and the merge knows it saw everything
    req, plan = build_request("dev", frame, dets([[0, 0, 5, 5]], [0.95]), v,
                              parse_policy(policy_yaml("p", mode="regions")))
    assert plan.regions is None and not req.image.tiles and decode_image(req.image).shape == (720, 1280, 3)
    # low+regions without regions is the downscaled frame, one tile at scale 2
    req, plan = build_request("dev", frame, dets([], []), v, parse_policy(policy_yaml("p", mode="low+regions")))
    (t,) = tiles_from_proto(req.image)
    assert (t.width, t.height, t.scale) == (640, 360, 2.0) and plan.regions is None


def test_record_boxes_name_their_model_and_key_format():
    d = Detections(boxes=np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32), scores=np.array([0.9, 0.5], np.float32),
                   class_ids=np.array([0, 1], np.int32), names=("x", "y"), source="edge", sources=("edge", "cloud"))
    out = detections_json(d)
    assert [(o["class_name"], o["source"]) for o in out] == [("x", "edge"), ("y", "cloud")]
    assert idempotency_key("d", "s", 5) == "d/s/5"


class RecordingSpool(Spool):
    """A real spool that notes which thread made each call, to show the event loop
    never makes one."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def _note(self, name, *args):
        self.calls.append((name, threading.current_thread().name) + args)

    def put(self, key, payload, meta=None):
        self._note("put", key)
        return super().put(key, payload, meta)

    def ack_many(self, item_ids):
        self._note("ack_many", tuple(item_ids))
        return super().ack_many(item_ids)

    def nack(self, item_id):
        self._note("nack", item_id)
        return super().nack(item_id)


def test_spool_calls_run_off_the_loop_in_order_and_a_replayed_batch_is_acked_once(tmp_path, real_cloud):
    """The real gateway without a worker answers UNAVAILABLE: escalations are spooled from
    the spool thread, in submit order; the worker back: one replay round delivers them late
    and acknowledges them with one ack_many after their records were written."""
    spool = RecordingSpool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    policy = parse_policy(policy_yaml("p", deadline_ms=2000))
    written = []
    metrics = EdgeMetrics()
    d = dets([[10, 10, 30, 30]], [0.4])
    decision = Decision(True, "hard", 0.8, {})
    real_cloud.stop_worker(0)

    async def run():
        grpc_t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": grpc_t}, written.append, metrics, spool=spool, replay_batch=16)
        loop_thread = threading.current_thread().name
        for seq in range(5):
            frame = Frame("cam", seq, np.full((48, 64, 3), 40 * seq, np.uint8), 0, 0.0)
            esc.submit(frame, d, decision, policy, frame_record("cam", seq))
        await async_wait_until(lambda: len(written) == 5, 30, "5 records")
        assert [r.outcome for r in written] == ["spooled"] * 5
        assert all(r.error.startswith("UNAVAILABLE: ") for r in written)  # the real gateway, no worker up
        assert await esc.replay_once() == 0  # still down: the head is nacked, nothing acked
        real_cloud.start_worker(0)
        # the gateway answers again first: a round made while it still took the worker back could
        # settle the first replay and stop at the next (1 of 5 in one CI run; the uplink window,
        # once suspected, refused none of them: replays go one at a time, onto an idle uplink)
        await asyncio.to_thread(real_cloud.wait_answering)
        assert await esc.replay_once() == 5
        await esc.drain(0.1)
        await esc.close()
        await grpc_t.close()
        return loop_thread

    loop_thread = asyncio.run(run())
    names = [c[0] for c in spool.calls]
    assert all(c[1].startswith("spool") and c[1] != loop_thread for c in spool.calls), spool.calls
    puts = [c[2] for c in spool.calls if c[0] == "put"]  # in the order the calls failed
    assert sorted(puts) == [f"dev/cam/{i}" for i in range(5)]
    assert names.count("nack") >= 1 and names.count("ack_many") == 1
    assert names[-1] == "ack_many" and len(spool.calls[-1][2]) == 5
    late = [r for r in written if r.late]
    assert [r.key for r in late] == puts  # replayed in spool order
    assert all(r.outcome == "cloud" and r.cloud_model == "yolov5n-160-10" for r in late)
    assert len(spool) == 0 and metrics.spool_depth._value.get() == 0
    spool.close()


def test_escalations_spooled_over_a_transport_no_longer_configured_replay_over_the_device_s(tmp_path, real_cloud):
    """A device moved from gRPC to MQTT (its settings now name only a broker): the escalations it
    spooled over gRPC were kept back for ever, each round stopping at its head, since the
    fallback was ``cloud.transport``, "grpc" by default and never checked. They now replay over
    the transport the device's settings configure (here the real gateway's gRPC client registered
    under the name ``mqtt``, the only one configured), and a policy that names no transport sends
    its live escalations over it too."""
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    written = []
    d, decision = dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {})
    real_cloud.stop_worker(0)

    async def run():
        before = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": before}, written.append, EdgeMetrics(), spool=spool)
        policy = parse_policy(policy_yaml("p", transport="grpc", deadline_ms=2000))
        for seq in range(3):
            frame = Frame("cam", seq, np.full((48, 64, 3), 40 * seq, np.uint8), 0, 0.0)
            esc.submit(frame, d, decision, policy, frame_record("cam", seq))
        await async_wait_until(lambda: len(written) == 3, 30, "3 spooled records")
        await esc.drain(0.1)
        await esc.close()
        await before.close()
        real_cloud.start_worker(0)
        await asyncio.to_thread(real_cloud.wait_answering)

        after = GrpcTransport([real_cloud.address])
        names = tuple(str(i) for i in range(10))  # the worker's model's 10 classes (an answer naming others is refused)
        esc = Escalating("dev", {"mqtt": after}, written.append, EdgeMetrics(), spool=spool,
                         default_transport="mqtt", names=names)
        unset = parse_policy(policy_yaml("p", transport=None, deadline_ms=5000))
        assert unset.spec.transport is None
        frame = Frame("cam", 3, np.full((48, 64, 3), 40, np.uint8), 0, 0.0)
        live = Detections(boxes=np.array([[10, 10, 30, 30]], np.float32), scores=np.array([0.4], np.float32),
                          class_ids=np.zeros(1, np.int32), names=names, source="edge")
        esc.submit(frame, live, decision, unset, frame_record("cam", 3))
        await async_wait_until(lambda: len(written) == 4, 30, "the live record")
        settled = await async_wait_until(esc.replay_once, 30, "a replay round that settles")
        assert settled == 3, [(r.key, r.outcome, r.late, r.error) for r in written]
        await esc.drain(0.1)
        await esc.close()
        await after.close()

    asyncio.run(run())
    assert [r.outcome for r in written[:3]] == ["spooled"] * 3
    assert written[3].outcome == "cloud" and not written[3].late, (written[3].error, written[3].reason)
    assert sorted((r.key, r.outcome, r.late) for r in written[4:]) == [(f"dev/cam/{i}", "cloud", True) for i in range(3)]
    assert len(spool) == 0
    spool.close()


def test_a_replay_gets_longer_than_the_live_deadline(tmp_path, real_cloud):
    """A cloud slower than the policy's deadline (a backlog, a heavy payload): the live
    escalation times out and is spooled; its replay waits up to spool.replay_deadline_s
    (shipped default) and is answered. Held to the live 300 ms, it would time out on every
    round while the worker computed it again each time."""
    import time

    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    written = []
    release = real_cloud.block_worker(0)

    async def run():
        grpc_t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": grpc_t}, written.append, EdgeMetrics(), spool=spool)
        frame = Frame("cam", 0, np.full((48, 64, 3), 40, np.uint8), 0, 0.0)
        esc.submit(frame, dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {}), policy,
                   frame_record("cam", 0))
        await async_wait_until(lambda: len(written) == 1, 30, "the spooled record")
        asyncio.get_running_loop().call_later(1.0, release.set)  # the worker answers a second later
        t0 = time.monotonic()
        settled = await esc.replay_once()
        waited = time.monotonic() - t0
        await esc.drain(0.1)
        await esc.close()
        await grpc_t.close()
        return settled, waited

    settled, waited = asyncio.run(run())
    assert written[0].outcome == "spooled", written[0]
    assert settled == 1 and waited > 0.3, waited
    assert written[-1].outcome == "cloud" and written[-1].late
    assert len(spool) == 0
    spool.close()


def test_an_entry_its_replay_is_answering_is_not_evicted_as_lost(tmp_path, real_cloud):
    """A full spool evicts its oldest entries for new escalations; the oldest is also the one a
    replay has just sent. Evicted while its answer was on the way, it came back as a late record
    all the same, counted as evicted (lost) and as replayed: the counters said 53 lost where the
    records showed 51 (found by a probe). The byte cap now evicts the entries not being sent first."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    sizer = Spool(tmp_path / "sizer.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(sizer, range(3), policy)
    one = sizer.stats().bytes // 3
    sizer.close()
    spool = Spool(tmp_path / "spool.db", max_bytes=int(one * 3.5), max_age_s=3600)
    _spool_requests(spool, range(3), policy)
    written = []
    release = real_cloud.block_worker(0)

    async def run():
        transport = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": transport}, written.append, EdgeMetrics(), spool=spool)
        replay = asyncio.ensure_future(esc.replay_once())
        await asyncio.sleep(0.5)  # frame 0 is at the blocked worker
        await asyncio.get_running_loop().run_in_executor(None, _spool_requests, spool, [10, 11], policy)  # evicts two
        release.set()
        settled = await replay
        await esc.close()
        await transport.close()
        return settled

    assert asyncio.run(run()) == 1
    assert [(r.frame_seq, r.outcome, r.late) for r in written] == [(0, "cloud", True)]
    assert [item.key for item in spool.peek()] == ["dev/cam/10", "dev/cam/11"]
    assert spool.stats().dropped_bytes_cap == 2  # frames 1 and 2: lost, and only they
    spool.close()

def test_entries_the_cloud_keeps_failing_do_not_hold_the_spool(tmp_path, real_cloud, caplog):
    """Escalations spooled over MQTT head the spool, its broker still down after the operator
    switched the policy to gRPC, whose cloud answers; no live traffic. Each round stopped at the
    first, so the gRPC ones behind waited until the MQTT ones expired (spool.max_age_s, 24 h by
    default); the same held for a whole 8K frame a CPU pool cannot answer in time (0 settled in
    8 rounds, found by a probe). Now an entry failed ATTEMPTS times in a row stops a round while
    the cloud is not known to answer, and that round probes one entry behind it: the cloud's
    answer lets the next rounds step over the stuck ones."""
    from edge.transports.mqtt import MqttConnection, MqttTransport

    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(2), policy, transport="mqtt")
    _spool_requests(spool, range(2, 5), policy)
    written = []

    async def run():
        conn = MqttConnection("127.0.0.1", free_port(), client_id="edge-stuck")  # nothing listens
        conn.start()
        mqtt = MqttTransport(conn, "dev")
        await mqtt.start()
        grpc_t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": grpc_t, "mqtt": mqtt}, written.append, EdgeMetrics(), spool=spool)
        settled = [await esc.replay_once() for _ in range(10)]
        await esc.close()
        await grpc_t.close()
        await mqtt.close()
        return settled

    with caplog.at_level(logging.WARNING, logger="edge.escalating"):
        settled = asyncio.run(run())
    assert sum(settled) == 3 and settled[:ATTEMPTS - 1] == [0] * (ATTEMPTS - 1), settled
    assert sorted((r.frame_seq, r.outcome, r.late) for r in written) == [(i, "cloud", True) for i in range(2, 5)]
    assert [item.key for item in spool.peek()] == ["dev/cam/0", "dev/cam/1"]  # kept, in order
    said = [r.getMessage() for r in caplog.records if "stepped over" in r.getMessage()]
    assert len(said) == 1 and "spooled dev/cam/0 failed" in said[0], said  # once per LOG_INTERVAL_S
    spool.close()


def test_live_answers_let_rounds_step_over_a_stuck_entry_without_sending_it_each_time(tmp_path, real_cloud):
    """A camera keeps escalating live over gRPC, answered by the real cloud, while an entry
    spooled over MQTT (its broker down) heads the spool: once stuck it is stepped over, and
    between its tries it rests (not sent at each of the rounds every live answer kicks)."""
    from edge.transports.mqtt import MqttConnection, MqttTransport

    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(1), policy, transport="mqtt")
    written = []
    d = dets([[10, 10, 30, 30]], [0.4])

    async def run():
        conn = MqttConnection("127.0.0.1", free_port(), client_id="edge-stuck-live")  # nothing listens
        conn.start()
        mqtt = _Counting(MqttTransport(conn, "dev"))
        await mqtt.inner.start()
        grpc_t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": grpc_t, "mqtt": mqtt}, written.append, EdgeMetrics(), spool=spool,
                         replay_interval_s=60.0)
        settled = 0
        for seq in range(1, 13):
            esc.submit(Frame("cam", seq, np.full((48, 64, 3), 40 + seq, np.uint8), 0, 0.0), d,
                       Decision(True, "hard", 0.8, {}), policy, frame_record("cam", seq))
            await async_wait_until(lambda: len(written) >= seq, 30, "the live record")
            if seq == 6:  # a gRPC escalation spooled behind the stuck one (the cloud answered it late)
                _spool_requests(spool, [100], policy)
            settled += await esc.replay_once()
        await esc.drain(0.1)
        await esc.close()
        await grpc_t.close()
        await mqtt.close()
        return settled, mqtt.asked

    settled, asked = asyncio.run(run())
    assert settled == 1 and any(r.frame_seq == 100 and r.late and r.outcome == "cloud" for r in written)
    assert asked == [0] * ATTEMPTS, asked  # stuck after ATTEMPTS, then resting 60 s: not sent again
    assert [item.key for item in spool.peek()] == ["dev/cam/0"]
    spool.close()


def test_entries_left_before_one_settled_out_of_order_are_sent_while_acks_fail(tmp_path, monkeypatch):
    """Pure (a scripted transport): the head fails until it is stuck, the probe behind it is
    answered, and its acknowledgement fails (a full disk). The next rounds must still send the
    head and the rest; they read past the unacknowledged entry rather than from it on (which
    hid the head until the disk had room again)."""
    from edge.spool import SpoolError

    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(5), policy)
    written = []

    def full(ids):
        raise SpoolError("its filesystem is full")

    monkeypatch.setattr(spool, "ack_many", full)

    async def run():
        t = _Counting(None, fail={0})
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool)
        for _ in range(ATTEMPTS):
            await esc.replay_once()
        t.fail.clear()  # the head can be answered now
        for _ in range(3):
            await esc.replay_once()
        await esc.close()

    asyncio.run(run())
    assert sorted(r.frame_seq for r in written if r.late) == [0, 1, 2, 3, 4]  # each once
    assert len(spool) == 5  # none acknowledged: they wait for room, not sent again
    spool.close()


def test_a_cloud_that_refuses_replays_as_busy_makes_no_entry_stuck(tmp_path):
    """Pure (a scripted transport): a cloud busy with live requests refuses replays
    (RESOURCE_EXHAUSTED: it keeps its room for live ones). That is the cloud's load, not the
    entries': none is stepped over, and once there is room they are answered in spool order."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(5), policy)
    written = []

    async def run():
        t = _Counting(None, fail=range(5), status=detect_pb2.RESOURCE_EXHAUSTED)
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool)
        for _ in range(3 * ATTEMPTS):
            esc._stuck.answered()  # live escalations are answered meanwhile
            assert await esc.replay_once() == 0
        t.fail.clear()
        esc._stuck.answered()
        assert await esc.replay_once() == 5
        await esc.close()

    asyncio.run(run())
    assert [r.frame_seq for r in written] == [0, 1, 2, 3, 4]
    spool.close()


def test_an_outage_costs_a_round_one_written_attempt_and_at_most_one_probe(tmp_path):
    """The other side: during an outage every entry fails and nothing is stepped over. A round
    sends its head (and, once the head is stuck, one probe) and writes one attempt, the head's:
    an earlier rule that stepped over a head failed 3 times sent and wrote up to
    spool.replay_batch entries a round, and grew the WAL into a full disk's reserve."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(20), policy)
    down = _Counting(None, fail=range(20))
    asked = down.asked
    rounds = 30

    async def run():
        esc = Escalating("dev", {"grpc": down}, lambda rec: True, EdgeMetrics(), spool=spool)
        sent = []
        for _ in range(rounds):
            before = len(asked)
            assert await esc.replay_once() == 0
            sent.append(len(asked) - before)
        await esc.close()
        return sent

    sent = asyncio.run(run())
    assert sent == [1] * (ATTEMPTS - 1) + [2] * (rounds - ATTEMPTS + 1), sent
    assert asked[::2][:ATTEMPTS] == [0] * ATTEMPTS  # the head, in every round
    attempts = {item.key: item.attempts for item in spool.peek(100)}
    assert attempts == {"dev/cam/0": rounds, **{f"dev/cam/{i}": 0 for i in range(1, 20)}}
    spool.close()


def test_an_outage_after_a_short_return_of_the_cloud_costs_no_more_than_an_outage(tmp_path):
    """Pure (a scripted transport), no live traffic: a long outage, in which the probes behind
    the head failed each entry they tried ATTEMPTS times or more; then the cloud answers the
    head and is gone again at once (a flapping uplink). Those entries failed during an outage
    only: their failure must say the cloud does not answer, as the head's did, so a round
    still sends at most one entry past what it sent before plus one probe. Each was stepped
    over instead, for the 60 s one answer counts as evidence: every round (each entry resting
    one replay interval) sent and wrote an attempt for every entry of replay_batch, what the
    reverted rule cost."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(8), policy)  # one replay_batch
    down = _Counting(None, fail=range(8))
    asked = down.asked

    async def run():
        esc = Escalating("dev", {"grpc": down}, lambda rec: True, EdgeMetrics(), spool=spool, replay_interval_s=0.05)
        for _ in range(40):  # the outage: the 7 entries behind the head probed 5 times or more each
            await esc.replay_once()
        down.fail.discard(0)  # the cloud answers the head, and is gone again at once
        sent, settled = [], 0
        for _ in range(8):
            before = len(asked)
            settled += await esc.replay_once()
            sent.append(len(asked) - before)
            down.fail.add(0)
            await asyncio.sleep(0.06)  # a replay interval: what rested is due again
        await esc.close()
        return sent, settled

    sent, settled = asyncio.run(run())
    assert settled == 1  # the head
    # the head, the entry behind it and a probe; then the new head and a probe, as in any outage
    assert sent[0] <= 3 and max(sent[1:]) <= 2, sent
    spool.close()


def test_a_cloud_saturated_for_replays_while_it_answers_live_ones_makes_no_entry_stuck(tmp_path):
    """Pure (a scripted transport): the cloud serves replays after every live request, so a
    cloud at capacity answers a camera's live escalations and refuses every replay as saturated
    (RESOURCE_EXHAUSTED: after an outage, a fleet replaying at once). That says nothing about
    an entry: the round stops at the head as before, one replay a round. Each refused entry was
    counted stuck instead, stepped over once a live answer came, and left resting (up to 5
    minutes) when the cloud had room again, the spool's order scrambled and more replays sent
    into a saturated cloud at each round."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(1, 13), policy)
    written, replays = [], []
    saturated = [True]
    d = dets([[10, 10, 30, 30]], [0.4])

    class Cloud:
        name = "grpc"

        async def detect(self, req, timeout_s):
            if req.replay:
                replays.append(req.frame_seq)
                if saturated[0]:
                    raise TransportError(detect_pb2.RESOURCE_EXHAUSTED, "all 2 workers are saturated")
            return detect_pb2.DetectResponse(model_name="big")

        async def close(self):
            pass

    async def run():
        esc = Escalating("dev", {"grpc": Cloud()}, written.append, EdgeMetrics(), spool=spool,
                         replay_interval_s=60.0)
        sent, delivered = [], 0
        for seq in range(100, 116):  # a live escalation answered before each round
            esc.submit(Frame("cam", seq, np.full((48, 64, 3), 40, np.uint8), 0, 0.0), d,
                       Decision(True, "hard", 0.8, {}), policy, frame_record("cam", seq))
            await async_wait_until(lambda: any(r.frame_seq == seq for r in written), 30, "the live record")
            before = len(replays)
            if seq == 112:
                saturated[0] = False  # the cloud has room again
            if saturated[0]:
                await esc.replay_once()
                sent.append(len(replays) - before)
            else:
                delivered += await esc.replay_once()
        await esc.drain(0.1)
        await esc.close()
        return sent, delivered

    sent, delivered = asyncio.run(run())
    assert sent == [1] * 12, sent  # the head, one replay a round
    assert delivered == 12 and len(spool) == 0  # nothing left resting once the cloud has room (4 rounds)
    assert [r.frame_seq for r in written if r.late] == list(range(1, 13))  # in spool order
    spool.close()


def test_a_stuck_head_is_probed_past_with_a_replay_batch_of_one(tmp_path):
    """Pure (a scripted transport), no live traffic: spool.replay_batch 1 (allowed: 1 to 10000).
    The probe was taken among the round's batch behind the stuck entry, which held nothing: the
    head the cloud cannot answer held every entry behind it until it expired (24 h), as before
    the stuck-entry rule. A round reads one entry past its batch for the probe."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(4), policy)
    written = []

    async def run():
        cloud = _Counting(None, fail={0})  # frame 0 is never answered in time, the others are
        esc = Escalating("dev", {"grpc": cloud}, written.append, EdgeMetrics(), spool=spool, replay_batch=1)
        settled = [await esc.replay_once() for _ in range(12)]
        await esc.close()
        return settled

    settled = asyncio.run(run())
    assert sum(settled) == 3, settled
    assert [r.frame_seq for r in written if r.late] == [1, 2, 3]
    assert [item.key for item in spool.peek()] == ["dev/cam/0"]
    spool.close()


async def _escalating_on_a_loop() -> Escalating:
    return Escalating("dev", {}, lambda rec: None, EdgeMetrics())


def test_a_cloud_answer_whose_boxes_do_not_validate_leaves_the_record_untouched():
    """Pure: the merge refuses an inverted box (ValueError) before it changes the record,
    so the caller writes the frame's edge result with the reason."""
    esc = asyncio.run(_escalating_on_a_loop())  # Python 3.8's asyncio.Event() outside a loop makes one
    record = frame_record("cam", 1)
    resp = detect_pb2.DetectResponse(model_name="big")
    resp.detections.add(x1=50, y1=5, x2=10, y2=40, score=0.9, class_id=0, source="cloud")
    policy = parse_policy(policy_yaml("p"))
    with pytest.raises(ValueError, match="inverted"):
        esc._write_merged(record, dets([[10, 10, 30, 30]], [0.4]), resp, policy.spec.merge, 0.1, late=False)
    assert record.outcome == "pending" and record.detections == [] and record.cloud_model is None
    esc.spool_io.shutdown()


def test_an_answer_for_another_frame_is_not_taken_as_this_frames():
    """A responder on the broker answered with the right correlation data but another
    device's, stream's or frame's answer: it was recorded as this frame's cloud result."""
    esc = asyncio.run(_escalating_on_a_loop())
    policy = parse_policy(policy_yaml("p"))
    for wrong in ({"device_id": "someone-else"}, {"stream_id": "other"}, {"frame_seq": 1001}):
        record = frame_record("cam", 1)
        fields = {"device_id": record.device, "stream_id": "cam", "frame_seq": 1, **wrong}
        resp = detect_pb2.DetectResponse(model_name="big", **fields)
        with pytest.raises(ValueError, match=r"the answer is for another frame: " + next(iter(wrong))):
            esc._write_merged(record, dets([[10, 10, 30, 30]], [0.4]), resp, policy.spec.merge, 0.1, late=False)
        assert record.outcome == "pending"
    record = frame_record("cam", 1)
    ok = detect_pb2.DetectResponse(model_name="big", device_id=record.device, stream_id="cam", frame_seq=1)
    esc._write_merged(record, dets([[10, 10, 30, 30]], [0.4]), ok, policy.spec.merge, 0.1, late=False)
    assert record.outcome == "cloud"
    esc.spool_io.shutdown()


def test_an_unreadable_spool_entry_is_dropped_from_the_head_not_blocking_the_rest(tmp_path, real_cloud):
    """A spooled entry that cannot be read is dropped (counted) instead of blocking the
    replay of everything behind it, which reaches the real cloud."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    d = dets([[10, 10, 30, 30]], [0.4])
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    spool.put("dev/cam/0", b"\xff not a protobuf", {"record": {}, "merge": {}})  # unreadable head
    image = np.full((48, 64, 3), 90, np.uint8)
    good, _ = build_request("dev", Frame("cam", 2, image, 0, 0.0), d, Decision(True, "hard", 0.8, {}), policy)
    spool.put("dev/cam/2", good.SerializeToString(),
              Spooled(frame_record("cam", 2), policy.spec.merge, 3000, "grpc").to_meta())
    written = []
    metrics = EdgeMetrics()

    async def run():
        t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool)
        assert await esc.replay_once() == 2
        await esc.close()
        await t.close()

    asyncio.run(run())
    (late,) = written
    assert late.frame_seq == 2 and late.late is True and late.outcome == "cloud"
    assert metrics.spool_events.labels("rejected")._value.get() == 1
    assert len(spool) == 0
    spool.close()


def test_spool_evictions_and_expiry_are_counted_whichever_call_did_them(tmp_path):
    """Byte-cap evictions happen inside put and age expiry inside peek; both show up in
    edgewise_edge_spool_events (evicted / expired), counted once, not from the start."""
    now = [1000.0]
    spool = Spool(tmp_path / "spool.db", max_bytes=6000, max_age_s=60, clock=lambda: now[0])
    spool.put("old/run/1", b"x" * 100, {})  # a previous run's drop, already in the counters
    now[0] += 61
    spool.peek(1)
    assert spool.stats().dropped_age_cap == 1
    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    written = []
    metrics = EdgeMetrics()
    rng = np.random.default_rng(0)

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])  # nobody there: everything spools
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool)
        await esc.update_spool_metrics()  # what the daemon does at start: the baseline
        for seq in range(8):
            img = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)  # noise: ~2-3 KB of JPEG
            esc.submit(Frame("cam", seq, img, 0, 0.0), dets([[10, 10, 30, 30]], [0.4]),
                       Decision(True, "hard", 0.8, {}), policy, frame_record("cam", seq))
            await async_wait_until(lambda: len(written) == seq + 1, 10, f"record {seq}")
        kept = len(spool)
        now[0] += 61
        assert await esc.replay_once() == 0  # peek expires them all
        await esc.close()
        await t.close()
        return kept

    kept = asyncio.run(run())
    st = spool.stats()
    assert all(r.outcome == "spooled" for r in written) and 0 < kept < 8
    assert metrics.spool_events.labels("evicted")._value.get() == st.dropped_bytes_cap == 8 - kept
    assert metrics.spool_events.labels("expired")._value.get() == kept == st.dropped_age_cap - 1
    assert metrics.spool_depth._value.get() == 0
    spool.close()


def test_spool_backlog_is_bounded_and_what_overflows_keeps_its_edge_result(tmp_path):
    """More escalations than the spool can fsync: at most cloud.max_in_flight wait for
    the spool thread; the rest are settled at once with their edge result, counted."""
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    written = []
    metrics = EdgeMetrics()

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool, max_in_flight=2)
        for seq in range(8):  # one burst, as from one batch of frames
            esc.submit(Frame("cam", seq, np.zeros((48, 64, 3), np.uint8), 0, 0.0), dets([], []),
                       Decision(True, "always", 0.0, {}), policy, frame_record("cam", seq))
        assert len(esc.tasks) == 2 and len(esc.settling) == 2
        await async_wait_until(lambda: len(written) == 8, 30, "8 records")
        await esc.drain(0.1)
        await esc.close()
        await t.close()

    asyncio.run(run())
    outcomes = {r.frame_seq: r.outcome for r in written}
    assert sorted(outcomes) == list(range(8))
    assert [outcomes[s] for s in range(4)] == ["spooled"] * 4
    assert [outcomes[s] for s in range(4, 8)] == ["edge_only"] * 4
    assert all("waiting for the spool" in r.error for r in written if r.outcome == "edge_only")
    assert metrics.spool_events.labels("refused")._value.get() == 4 and len(spool) == 4
    spool.close()


def test_escalations_a_full_spool_refuses_are_logged_a_few_at_a_time(tmp_path, caplog):
    """Every escalation the spool refused was a WARNING of its own: about 20 lines a second on
    a full disk (found by a fault probe). A few per interval, then one with the count."""
    from edge.escalating import LOG_BURST

    caplog.set_level("WARNING", logger="edge.escalating")
    spool = Spool(tmp_path / "spool.db", max_bytes=1, max_age_s=3600)  # takes nothing
    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    written: list = []
    metrics = EdgeMetrics()

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool)
        for seq in range(10):
            esc.submit(Frame("cam", seq, np.zeros((48, 64, 3), np.uint8), 0, 0.0), dets([], []),
                       Decision(True, "always", 0.0, {}), policy, frame_record("cam", seq))
            await async_wait_until(lambda: len(written) == seq + 1, 30, f"the record of frame {seq}")
        await esc.close()
        await t.close()

    asyncio.run(run())
    assert [r.outcome for r in written] == ["edge_only"] * 10
    assert metrics.spool_events.labels("refused")._value.get() == 10
    said = [r for r in caplog.records if "not spooled" in r.getMessage()]
    assert len(said) == LOG_BURST, [r.getMessage() for r in said]
    spool.close()


def test_escalations_dropped_while_the_cloud_is_away_are_logged_once_per_interval(caplog):
    """A policy with onCloudUnavailable: drop logged an INFO line for every escalation it
    dropped while the cloud could not be reached: about 10 lines a second from one 10 fps
    stream for as long as the outage lasted (found by a log-flood probe), where a spooled one
    is said once per interval. Now dropped ones are said as spooled ones are, with the count."""
    caplog.set_level("INFO", logger="edge.escalating")
    policy = parse_policy(policy_yaml("p", on_unavailable="drop", deadline_ms=300))
    written: list = []
    metrics = EdgeMetrics()

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])
        esc = Escalating("dev", {"grpc": t}, written.append, metrics)
        for seq in range(10):
            esc.submit(Frame("cam", seq, np.zeros((48, 64, 3), np.uint8), 0, 0.0), dets([], []),
                       Decision(True, "always", 0.0, {}), policy, frame_record("cam", seq))
            await async_wait_until(lambda: not esc.tasks and not esc.settling, 30, f"frame {seq} settled")
        await esc.close()
        await t.close()

    asyncio.run(run())
    assert written == []  # dropped: no record
    assert metrics.drops.labels("cam", "cloud_unavailable")._value.get() == 10
    said = [r.getMessage() for r in caplog.records if "dropped (policy onCloudUnavailable=drop)" in r.getMessage()]
    assert len(said) == 1, said


def test_request_is_built_off_the_loop_and_a_refused_crop_keeps_its_region(tmp_path, monkeypatch):
    """The JPEG encode runs in a worker thread; an escalation refused at submit
    (max_in_flight) and spooled still records its crop, which the replay's merge needs."""
    import edge.escalating as escalating
    threads = []

    def traced(*args):
        threads.append(threading.current_thread().name)
        return build_request(*args)

    monkeypatch.setattr(escalating, "build_request", traced)
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    policy = parse_policy(policy_yaml("p", deadline_ms=300, mode="crops"))
    written = []

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool, max_in_flight=1)
        for seq in range(2):  # the second is refused at submit: one already in flight
            esc.submit(Frame("cam", seq, np.zeros((80, 100, 3), np.uint8), 0, 0.0),
                       dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {}), policy,
                       frame_record("cam", seq))
        await async_wait_until(lambda: len(written) == 2, 30, "2 records")
        await esc.close()
        await t.close()
        return threading.current_thread().name

    loop_thread = asyncio.run(run())
    assert len(threads) == 2 and loop_thread not in threads
    by_seq = {r.frame_seq: r for r in written}
    assert "in flight" in by_seq[1].error
    assert all(r.outcome == "spooled" and r.crop == [6, 6, 34, 34] for r in written)
    assert [i.meta["record"]["crop"] for i in spool.peek(10)] == [[6, 6, 34, 34]] * 2
    spool.close()



def noisy_frame(seq, rng):
    """A frame of noise: ~15 KB of JPEG, so a few dozen fill a small disk."""
    return Frame("cam", seq, rng.integers(0, 255, (120, 160, 3), dtype=np.uint8), 0, 0.0)


def test_full_spool_disk_keeps_every_record_and_replay_recovers_by_itself(tmp_path, real_cloud, small_fs):
    """The spool on a real 1.5 MiB tmpfs, the real cloud's only worker down: escalations
    are spooled until the disk is (nearly) full, then keep their edge record with the
    reason (counted as disk_full). The worker back: everything spooled arrives late,
    once, and the spool takes new escalations again. Then a reader pins the WAL and
    another process fills the disk: the replayed items cannot be acknowledged, are not
    sent again meanwhile, and a later round acknowledges them once space returns."""
    import sqlite3

    fs = small_fs(1536 * 1024)
    spool = Spool(fs.path / "spool.db", max_bytes=1 << 30, max_age_s=3600)
    policy = parse_policy(policy_yaml("p", deadline_ms=2000))
    written = []
    metrics = EdgeMetrics()
    events = metrics.spool_events
    rng = np.random.default_rng(0)
    late = lambda: [r.key for r in written if r.late]  # noqa: E731

    async def escalate(esc, seq):
        n = len(written)
        esc.submit(noisy_frame(seq, rng), dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {}),
                   policy, frame_record("cam", seq))
        await async_wait_until(lambda: len(written) == n + 1, 10, f"the record of frame {seq}")

    async def replay(esc, until, what):
        async def one_round():
            await esc.replay_once()
            return until()
        await async_wait_until(one_round, 60, what)

    real_cloud.stop_worker(0)

    async def run():
        t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool, replay_batch=8)
        seq = 0
        while events.labels("disk_full")._value.get() < 3:
            await escalate(esc, seq)
            seq += 1
        spooled = [r.key for r in written if r.outcome == "spooled"]
        refused = [r for r in written if r.outcome == "edge_only"]
        assert len(spooled) >= 20 and len(spool) == len(spooled) and len(refused) == 3
        assert all("not spooled" in r.error and "KiB free" in r.error for r in refused)
        health = esc.spool_health()  # /healthz said ok while nothing could be stored (a fault probe)
        assert health["state"] == "full" and "KiB free" in health["problem"]
        real_cloud.start_worker(0)
        await replay(esc, lambda: len(spool) == 0, "the spool is empty")
        assert sorted(late()) == sorted(spooled)
        # The freed space is the spool's again: the next outage spools.
        real_cloud.stop_worker(0)
        for _ in range(6):
            await escalate(esc, seq)
            seq += 1
        assert esc.spool_health() == {"state": "ok"}
        assert [r.outcome for r in written[-6:]] == ["spooled"] * 6
        # A reader pins the WAL and another process fills the disk; without the reserve
        # check, spooling goes on until SQLite itself finds the disk full.
        reader = sqlite3.connect(str(fs.path / "spool.db"))
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM items").fetchone()
        filler = fs.fill(leave=0)
        spool.reserve_bytes = -(1 << 40)
        while events.labels("disk_full")._value.get() < 4:
            await escalate(esc, seq)
            seq += 1
        assert "disk is full" in written[-1].error
        spool.reserve_bytes = RESERVE_BYTES
        second = [r.key for r in written[len(spooled) + 3:] if r.outcome == "spooled"]
        real_cloud.start_worker(0)
        await replay(esc, lambda: len(late()) == len(spooled) + len(second), "the second replay")
        assert events.labels("ack_failed")._value.get() >= 1
        sent = len(late())
        for _ in range(3):
            await esc.replay_once()
        assert len(late()) == sent  # nothing sent twice while the acks wait
        reader.close()
        filler.unlink()
        await replay(esc, lambda: len(spool) == 0, "the acks after space returned")
        await esc.close()
        await t.close()
        return spooled + second

    spooled = asyncio.run(run())
    keys = [r.key for r in written if not r.late]
    assert len(keys) == len(set(keys))  # one record per frame
    assert sorted(late()) == sorted(spooled)  # every spooled frame late, once
    spool.close()


class _Counting:
    """Wraps a real transport and counts the requests in flight through it at once."""

    def __init__(self, inner, answer_delay=None, fail=(), status=detect_pb2.UNAVAILABLE):
        self.inner, self.name = inner, getattr(inner, "name", "grpc")
        self.now = self.most = 0
        self.answer_delay = answer_delay or {}
        self.fail = set(fail)
        self.status = status
        self.asked = []  # the frame_seq of every request, in the order they came

    async def detect(self, req, timeout_s):
        self.asked.append(req.frame_seq)
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            if self.inner is None:  # pure: answer (or fail) after the frame's delay
                await asyncio.sleep(self.answer_delay.get(req.frame_seq, 0.0))
                if req.frame_seq in self.fail:
                    raise TransportError(self.status, "worker gone" if self.status == detect_pb2.UNAVAILABLE
                                         else "saturated: replays wait for spare room")
                return detect_pb2.DetectResponse(model_name="big")
            return await self.inner.detect(req, timeout_s)
        finally:
            self.now -= 1

    async def close(self):
        if self.inner is not None:
            await self.inner.close()


def _spool_requests(spool, seqs, policy, transport="grpc"):
    d = dets([[10, 10, 30, 30]], [0.4])
    for seq in seqs:
        req, _ = build_request("dev", Frame("cam", seq, np.full((48, 64, 3), 30 + seq, np.uint8), 0, 0.0), d,
                               Decision(True, "hard", 0.8, {}), policy)
        spool.put(f"dev/cam/{seq}", req.SerializeToString(),
                  Spooled(frame_record("cam", seq), policy.spec.merge, 3000, transport).to_meta())




def test_a_spool_a_newer_release_wrote_replays_after_a_downgrade(tmp_path, real_cloud):
    """A device downgraded (a release rolled back) replays what the newer release spooled: its
    metadata names a merge setting and a record field this release does not know, as today's
    spool read by a release before merge.carryScope (83d405a) named carry_scope. Every such
    entry was 'unreadable', dropped from the spool without its answer (Merge(**meta) refused the
    unknown key); the unknown keys are now ignored, as a record's always were."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    d = dets([[10, 10, 30, 30]], [0.4])
    for seq in range(2):
        req, _ = build_request("dev", Frame("cam", seq, np.full((48, 64, 3), 30 + seq, np.uint8), 0, 0.0), d,
                               Decision(True, "hard", 0.8, {}), policy)
        meta = Spooled(frame_record("cam", seq), policy.spec.merge, 3000, "grpc").to_meta()
        meta["merge"]["carry_horizon"] = 7  # a merge setting of a newer release
        meta["record"]["gaze"] = [1, 2]  # a record field of a newer release
        spool.put(f"dev/cam/{seq}", req.SerializeToString(), meta)
    written = []
    metrics = EdgeMetrics()

    async def run():
        t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool)
        settled = await esc.replay_once()
        await esc.close()
        await t.close()
        return settled

    assert asyncio.run(run()) == 2
    assert [(r.frame_seq, r.late, r.outcome, r.error) for r in written] == [(0, True, "cloud", None),
                                                                         (1, True, "cloud", None)]
    assert metrics.spool_events.labels("rejected")._value.get() == 0
    assert len(spool) == 0
    spool.close()


def test_a_replay_round_cancelled_at_the_end_of_a_stop_writes_the_answers_already_in(tmp_path):
    """replay_concurrency 2: frame 1's answer is in, frame 0's (ahead of it in the spool) is
    not when the stop's grace ends and the daemon cancels the replay. Frame 1's late record is
    written and its entry acknowledged, frame 0 and the rest stay spooled, and nothing is sent
    after the stop. Frame 1's answer, waiting for frame 0's in spool order, used to be thrown
    away, and the cloud asked again at the next start."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(4), policy)
    written = []
    t = _Counting(None, answer_delay={0: 30.0})

    async def run():
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool, replay_concurrency=2)
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await async_wait_until(lambda: t.now == 1, 10, "frame 1 answered, frame 0 not yet")
        stop.set()  # SIGTERM
        await asyncio.sleep(0.2)
        loop.cancel()  # the grace is over
        await asyncio.gather(loop, return_exceptions=True)
        await esc.close()

    asyncio.run(run())
    assert [(r.frame_seq, r.late, r.outcome) for r in written] == [(1, True, "cloud")]
    assert [it.key for it in spool.peek(10)] == ["dev/cam/0", "dev/cam/2", "dev/cam/3"]
    assert t.most == 2
    spool.close()

def test_late_records_reach_the_disk_before_the_spool_lets_their_answers_go(tmp_path, monkeypatch, caplog):
    """The spool's delete of a replayed escalation is fsync'd, the late record written for it
    into the JSON Lines file was not (``sinks.fsync`` is off by default): a power cut soon after
    a replay lost the cloud's answer from both. The file is fsync'd before the spool's delete;
    where the disk refuses the fsync, the answers stay spooled (acknowledged later, not sent
    again)."""
    import os

    from edge.sinks import JsonlSink, Sinks

    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(3), policy)
    records = tmp_path / "records.jsonl"
    sinks = Sinks([JsonlSink(str(records))])
    done = []
    real_fsync, real_ack = os.fsync, spool.ack_many
    refuse = [True]

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name == str(records):
            if refuse[0]:
                raise OSError(5, "Input/output error")
            done.append(("fsync", len(records.read_bytes().splitlines())))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(spool, "ack_many", lambda ids: (done.append(("ack", len(ids))), real_ack(ids))[1])

    async def run():
        esc = Escalating("dev", {"grpc": _Counting(None)}, sinks.write, EdgeMetrics(), spool=spool,
                         durable=sinks.durable)
        assert await esc.replay_once() == 3
        assert len(spool) == 3 and done == [] and len(records.read_bytes().splitlines()) == 3
        refuse[0] = False
        assert await esc.replay_once() == 0  # the acknowledgement left over goes through now
        await esc.close()

    asyncio.run(run())
    assert done == [("fsync", 3), ("ack", 3)] and len(spool) == 0
    assert "3 replayed escalations delivered but not yet acknowledged (the sinks' records could not be synced " \
           "to disk first: Input/output error)" in caplog.text
    sinks.close()
    spool.close()


def _spool_with_a_damaged_index(path, policy):
    """An open spool of three escalations whose key index is then damaged on disk (the chaos
    probe's fault), found by the spool's next call that reads it."""
    from tests.edge.spooldamage import KEY_INDEX, damage_index, nudge

    spool = Spool(path, max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(3), policy)
    damage_index(path, KEY_INDEX)
    nudge(path)
    return spool


@pytest.mark.parametrize("concurrency", [1, 4])
def test_replays_go_replay_concurrency_at_a_time_and_are_written_in_spool_order(tmp_path, real_cloud, concurrency):
    """A slow cloud (the real worker held busy): a round has spool.replay_concurrency
    replays in flight at once (the shipped 1: one by one; or 4, so one slow answer does not
    hold every entry behind it); once the worker answers, every late record is written in spool order."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(6), policy)
    written = []
    release = real_cloud.block_worker(0)

    async def run():
        t = _Counting(GrpcTransport([real_cloud.address]))
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool,
                         replay_concurrency=concurrency)
        settled = asyncio.ensure_future(esc.replay_once())
        await async_wait_until(lambda: t.now == concurrency, 10, f"{concurrency} replays in flight")
        await asyncio.sleep(0.3)  # no more go while those wait
        in_flight = t.now
        release.set()
        n = await settled
        await esc.close()
        await t.close()
        return n, in_flight, t.most

    n, in_flight, most = asyncio.run(run())
    assert (n, in_flight, most) == (6, concurrency, concurrency)
    assert [r.frame_seq for r in written] == list(range(6))
    assert all(r.late and r.outcome == "cloud" for r in written)
    assert len(spool) == 0
    spool.close()


def test_a_replay_that_fails_beside_answered_ones_stays_spooled_and_theirs_are_written(tmp_path):
    """Pure (a scripted transport): of three replays in flight, the first answers last and
    the second cannot be delivered. The first and third are written, in spool order, and
    acknowledged; the second stays at the head of the spool and the round stops there."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(5), policy)
    written = []

    async def run():
        t = _Counting(None, answer_delay={0: 0.2}, fail={1})
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool, replay_concurrency=3)
        first = await esc.replay_once()
        t.fail.clear()
        second = await esc.replay_once()
        await esc.close()
        return first, second, t.most

    first, second, most = asyncio.run(run())
    assert (first, second, most) == (2, 3, 3)
    assert [r.frame_seq for r in written] == [0, 2, 1, 3, 4]
    assert len(spool) == 0
    spool.close()


def test_a_streams_escalation_sends_the_whole_frame_once_its_last_whole_one_is_a_period_old(tmp_path, real_cloud):
    """payload.wholeFrameEverySeconds 1 with regions, through the real gateway and worker: on
    the decision clock, the stream's first escalation goes whole, the next ones within a second
    send regions, the first one a second or more after the last whole frame goes whole again;
    streams keep their own clocks. The records say what went."""
    doc = yaml.safe_load(policy_yaml("p", mode="regions", deadline_ms=5000))
    doc["spec"]["payload"]["wholeFrameEverySeconds"] = 1.0
    policy = parse_policy(yaml.safe_dump(doc))
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (360, 640, 3), dtype=np.uint8)
    names = tuple(str(i) for i in range(10))  # the worker's model's 10 classes (an answer naming others is refused)
    small_uncertain = Detections(boxes=np.array([[300, 150, 320, 170]], np.float32), scores=np.array([0.4], np.float32),
                                 class_ids=np.zeros(1, np.int32), names=names, source="edge")  # a 96 px region
    written = []
    plan = [("a", 10.0), ("a", 10.5), ("b", 10.6), ("a", 11.0), ("a", 11.4), ("b", 11.5), ("a", 12.1)]

    async def run():
        t = GrpcTransport([real_cloud.address])
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), names=names)
        for seq, (stream, decided) in enumerate(plan):
            record = frame_record(stream, seq)
            record.width, record.height = 640, 360  # the frame's size: the answer's boxes are clipped to it
            record.decided_s = decided
            esc.submit(Frame(stream, seq, image, 0, 0.0), small_uncertain, Decision(True, "hard", 0.8, {}), policy,
                       record)
            await async_wait_until(lambda: len(written) == seq + 1, 30, f"record {seq}")
        await esc.drain(0.1)
        await esc.close()
        await t.close()

    asyncio.run(run())
    assert [(r.stream, r.payload) for r in written] == [
        ("a", "full"), ("a", "regions"), ("b", "full"), ("a", "full"), ("a", "regions"), ("b", "regions"),
        ("a", "full")]
    assert all(r.outcome == "cloud" for r in written), [(r.outcome, r.error) for r in written]
    whole, part = written[0].payload_bytes, written[1].payload_bytes
    assert part < whole / 4, (part, whole)  # the region is a small part of the frame's bytes


class _Refusing(_Counting):
    """Pure: refuses the frames in ``refuse`` for good (a rotated token), answers the rest."""

    def __init__(self, refuse):
        super().__init__(None)
        self.refuse = set(refuse)

    async def detect(self, req, timeout_s):
        if req.frame_seq in self.refuse:
            raise TransportError(detect_pb2.UNAUTHENTICATED, "bad token for device 'dev'")
        return await super().detect(req, timeout_s)


def test_a_replayed_answer_no_durable_sink_took_stays_spooled_until_one_does(tmp_path, caplog):
    """A durable sink that cannot take frame 1's late record (its disk full): frame 0's is
    written and acknowledged, frame 1 stays at the head of the spool (counted sink_failed)
    and the round stops there, in order; once the sink takes records again, the next round
    writes the rest. Nothing answered is acknowledged without its record."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(3), policy)
    written, refuse = [], {1}
    metrics = EdgeMetrics()

    def write(rec):
        if rec.frame_seq in refuse:
            return False
        written.append(rec)
        return True

    cloud = _Counting(None)
    asked = cloud.asked

    async def run():
        esc = Escalating("dev", {"grpc": cloud}, write, metrics, spool=spool)
        first = await esc.replay_once()
        for _ in range(5):  # more rounds while the disk is still full (every live answer kicks one)
            assert await esc.replay_once() == 0
        depth = len(spool)
        refuse.clear()
        second = await esc.replay_once()
        await esc.close()
        return first, depth, second

    with caplog.at_level(logging.WARNING, logger="edge.escalating"):
        first, depth, second = asyncio.run(run())
    assert (first, depth, second) == (1, 2, 2)
    assert [(r.frame_seq, r.outcome, r.late) for r in written] == [(0, "cloud", True), (1, "cloud", True),
                                                                    (2, "cloud", True)]
    # frame 1's answer was held: the cloud was asked once per frame, not once per round
    assert sorted(asked) == [0, 1, 2], asked
    assert metrics.spool_events.labels("sink_failed")._value.get() == 6
    said = [r.getMessage() for r in caplog.records if "could not be written to every durable sink" in r.getMessage()]
    assert len(said) == 1, said  # a few times a minute, not per round (364 lines in 73 s, found by a probe)
    assert metrics.spool_events.labels("replayed")._value.get() == 3
    assert len(spool) == 0
    spool.close()


def test_held_answers_of_entries_that_left_the_spool_otherwise_are_forgotten(tmp_path):
    """An entry whose answer is held (no sink took its record) may leave the spool by its age or
    the byte cap instead: its answer was kept for the process's life, and 256 of them stopped any
    new one being held (found by the review)."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    now = [1000.0]
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=60, clock=lambda: now[0])
    _spool_requests(spool, range(2), policy)

    async def run():
        esc = Escalating("dev", {"grpc": _Counting(None)}, lambda rec: False, EdgeMetrics(), spool=spool)
        assert await esc.replay_once() == 0
        assert sorted(esc._held) == ["dev/cam/0"]  # the round stops at the first unwritten one
        now[0] += 61  # both expire
        _spool_requests(spool, [5], policy)
        assert await esc.replay_once() == 0
        assert sorted(esc._held) == ["dev/cam/5"]  # the expired entry's answer is gone
        now[0] += 61
        assert await esc.replay_once() == 0 and esc._held == {}  # an empty spool holds nothing
        await esc.close()

    asyncio.run(run())
    spool.close()


def test_a_replay_the_cloud_refuses_for_good_ends_its_frame_with_the_edge_result(tmp_path):
    """UNAUTHENTICATED on replay (the gateway's token was rotated): a resend would fail the
    same way, so the entry leaves the spool, but never silently: the frame's late record is
    its edge result with the reason (the frame's last word was `spooled`)."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(2), policy)
    written = []
    metrics = EdgeMetrics()

    async def run():
        esc = Escalating("dev", {"grpc": _Refusing({0})}, written.append, metrics, spool=spool)
        settled = await esc.replay_once()
        await esc.close()
        return settled

    assert asyncio.run(run()) == 2
    refused, answered = written
    assert (refused.frame_seq, refused.outcome, refused.late) == (0, "edge_only", True)
    assert "cloud refused the replay: " in refused.error and "bad token" in refused.error
    assert refused.detections == [] or all(b["source"] == "edge" for b in refused.detections)
    assert (answered.frame_seq, answered.outcome) == (1, "cloud")
    assert metrics.spool_events.labels("rejected")._value.get() == 1
    assert metrics.escalations.labels("hard", "edge_only")._value.get() == 1
    assert len(spool) == 0
    spool.close()


def test_a_spool_locked_elsewhere_at_shutdown_settles_within_a_bound_and_keeps_every_record(
        tmp_path, monkeypatch):
    """Another process holds the spool's write lock while the cloud is down and SIGTERM
    comes: the escalations waiting for the spool would each wait out SQLite's busy timeout
    in turn. Past the grace the queued ones refuse at once and their frames keep the edge
    result, so shutdown is bounded and every frame still gets a record."""
    import sqlite3
    import time

    import edge.escalating
    import edge.spool

    busy = 3.0  # six puts waiting it out in turn would take 18 s
    monkeypatch.setattr(edge.spool, "SPOOL_BUSY_TIMEOUT_S", busy)
    monkeypatch.setattr(edge.escalating, "SPOOL_BUSY_TIMEOUT_S", busy)
    path = tmp_path / "spool.db"
    spool = Spool(path, max_bytes=1 << 24, max_age_s=3600)
    policy = parse_policy(policy_yaml("p", deadline_ms=500))
    written = []
    lock = sqlite3.connect(str(path), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # held until the end of the test

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])  # nothing listens: UNAVAILABLE at once
        esc = Escalating("dev", {"grpc": t}, written.append, EdgeMetrics(), spool=spool)
        for seq in range(6):
            esc.submit(Frame("cam", seq, np.full((48, 64, 3), 30 + seq, np.uint8), 0, 0.0),
                       dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {}), policy,
                       frame_record("cam", seq))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await esc.drain(0.0)
        await esc.close()
        await t.close()
        return time.monotonic() - t0

    took = asyncio.run(run())
    lock.execute("ROLLBACK")
    lock.close()
    assert took < 5.0 + busy + 3.0, took  # the grace floor, the one put in SQLite's hands, a margin
    assert sorted(r.frame_seq for r in written) == list(range(6))
    assert all(r.outcome == "edge_only" and "not spooled" in r.error for r in written), \
        [(r.outcome, r.error) for r in written]
    spool.close()


async def _escalate_and_wait(esc, policy, written, seq: int) -> None:
    """Escalate frame ``seq`` of stream "cam" (the cloud unreachable) and wait for its record."""
    esc.submit(Frame("cam", seq, np.full((48, 64, 3), 30 + seq, np.uint8), 0, 0.0),
               dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {}), policy,
               frame_record("cam", seq))
    await async_wait_until(lambda: any(r.frame_seq == seq for r in written), 10, f"frame {seq}")


async def _stop_replay(esc, stop, loop, transport) -> None:
    """End the replay loop, drain and close the escalator and its transport."""
    stop.set()
    await loop
    await esc.drain(0.1)
    await esc.close()
    await transport.close()


def test_a_spool_that_could_not_open_at_start_is_opened_later_by_the_replay_loop(tmp_path):
    """The spool's filesystem was full at start: the daemon runs without it (a frame the
    cloud cannot take keeps its edge result, with the reason, counted as disk_full) and
    the replay loop opens it once it can; escalations are spooled from then on."""
    from edge.spool import SpoolFull

    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    written, attempts = [], []
    metrics = EdgeMetrics()
    full = "spool /x/spool.db: its filesystem is full (disk I/O error, 0 KiB free)"

    def reopen():
        attempts.append(1)
        if len(attempts) < 3:
            raise SpoolFull(full)
        return Spool(tmp_path / "spool.db", max_bytes=1 << 24, max_age_s=3600)

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])  # nothing listens: UNAVAILABLE
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, reopen=reopen, spool_problem=full,
                         replay_interval_s=0.05)

        def escalate(seq):
            return _escalate_and_wait(esc, policy, written, seq)

        await escalate(0)
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await async_wait_until(lambda: esc.spool is not None, 10, "the spool opened")
        await escalate(1)
        await _stop_replay(esc, stop, loop, t)
        return esc.spool

    spool = asyncio.run(run())
    first, second = written
    assert first.outcome == "edge_only" and first.error.endswith(f"; not spooled: {full}")
    assert second.outcome == "spooled" and len(spool) == 1
    assert metrics.spool_events.labels("disk_full")._value.get() == 1 and len(attempts) == 3
    spool.close()


def test_a_spool_damaged_under_the_replay_is_salvaged_and_spooling_and_replay_go_on(tmp_path, caplog):
    """The chaos probe's damaged key index, met after the spool opened: the replay delivers
    the backlog and its acknowledgement finds the file malformed. The spool thread moves the
    file aside and salvages it into a new one at its path, as a start would; the
    acknowledgement then goes through on the new file (nothing is sent twice), a frame the
    cloud cannot take is spooled again, /healthz says ok, and one ERROR says where the file
    went and how many escalations were salvaged (it used to take a restart)."""
    import logging


    caplog.set_level(logging.DEBUG, logger="edge")
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    path = tmp_path / "spool.db"
    spool = _spool_with_a_damaged_index(path, policy)
    written = []
    metrics = EdgeMetrics()

    async def run():
        t = _Counting(None, fail={7})  # answers replays; frame 7 (live) finds the cloud unavailable
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool, replay_interval_s=0.02)
        await esc.update_spool_metrics()  # the daemon's baseline at start
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await async_wait_until(lambda: len(written) == 3, 10, "the 3 replays written")
        await async_wait_until(lambda: len(spool) == 0, 10, "their acknowledgement, on the new file")
        assert esc.spool_health() == {"state": "ok"}
        esc.submit(Frame("cam", 7, np.full((48, 64, 3), 90, np.uint8), 0, 0.0), dets([[10, 10, 30, 30]], [0.4]),
                   Decision(True, "hard", 0.8, {}), policy, frame_record("cam", 7))
        await async_wait_until(lambda: len(written) == 4, 10, "frame 7's record")
        await asyncio.sleep(0.3)  # replay rounds: frame 7 still cannot be delivered
        assert esc.spool_health() == {"state": "ok"}
        stop.set()
        await loop
        await esc.drain(0.1)
        await esc.close()

    asyncio.run(run())
    assert [(r.frame_seq, r.late, r.outcome) for r in written] == [
        (0, True, "cloud"), (1, True, "cloud"), (2, True, "cloud"), (7, False, "spooled")]
    (moved,) = tmp_path.glob("spool.db.damaged-*Z")
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    errors = [m for level, m in messages if level == logging.ERROR]
    assert errors == [
        f"spool {path} was found damaged while the daemon ran (database disk image is malformed); moved it to "
        f"{moved} (kept for inspection) and started a new spool at {path}: 3 escalation(s) salvaged; spooling "
        "and replay go on"], messages
    assert not [m for _, m in messages if "not yet acknowledged" in m or "replay round failed" in m], messages
    events = metrics.spool_events
    assert {e: events.labels(e)._value.get() for e in ("corrupt", "salvaged", "salvage_failed", "ack_failed",
                                                      "replayed", "put")} == {
        "corrupt": 1, "salvaged": 1, "salvage_failed": 0, "ack_failed": 0, "replayed": 3, "put": 1}
    assert spool.damaged is None and spool.generation == 1
    assert [it.key for it in spool.peek(10)] == ["dev/cam/7"] and metrics.spool_depth._value.get() == 1
    spool.close()


def test_escalations_queued_behind_a_salvage_are_spooled_once_each(tmp_path):
    """A burst of escalations the cloud cannot take meets a spool whose file turned out
    damaged: the first put meets the damage and salvages the file on the spool thread, and
    every put queued behind it, or issued while it runs, is stored in the new spool and
    counted once; none is lost to the damage or stored twice, and the salvaged backlog stays
    ahead of them."""
    from tests.edge.spooldamage import KEY_INDEX, damage_index, nudge

    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    path = tmp_path / "spool.db"
    spool = Spool(path, max_bytes=1 << 28, max_age_s=3600)
    backlog = [f"dev/old/{i}" for i in range(300)]
    for key in backlog:  # ~6 MB to copy: the salvage takes a while
        assert spool.put(key, key.encode().ljust(20000, b"."), {"k": key})
    damage_index(path, KEY_INDEX)
    nudge(path)
    written = []
    metrics = EdgeMetrics()
    seqs = range(100, 112)

    async def run():
        esc = Escalating("dev", {"grpc": _Counting(None, fail=set(seqs))}, written.append, metrics, spool=spool)
        for seq in seqs:
            esc.submit(Frame("cam", seq, np.full((48, 64, 3), seq, np.uint8), 0, 0.0),
                       dets([[10, 10, 30, 30]], [0.4]), Decision(True, "hard", 0.8, {}), policy,
                       frame_record("cam", seq))
        await async_wait_until(lambda: len(written) == len(seqs), 20, "every escalation settled")
        assert esc.spool_health() == {"state": "ok"}
        await esc.close()

    asyncio.run(run())
    assert [r.outcome for r in written] == ["spooled"] * len(seqs), [(r.outcome, r.error) for r in written]
    events = metrics.spool_events
    assert (events.labels("put")._value.get(), events.labels("corrupt")._value.get(),
            events.labels("salvaged")._value.get()) == (len(seqs), 1, 1)
    assert metrics.escalations.labels("hard", "spooled")._value.get() == len(seqs)
    keys = [it.key for it in spool.peek(1000)]
    assert keys[:300] == backlog and sorted(keys[300:]) == sorted(f"dev/cam/{s}" for s in seqs)
    assert len(spool) == len(keys) == 300 + len(seqs)
    spool.close()


def test_a_stop_cuts_a_salvage_short_and_the_next_start_finishes_it(tmp_path, caplog, monkeypatch):
    """SIGTERM with shutdown_grace_s 0 while the spool thread salvages a big damaged file on a
    slow card: the copy stops after its current batch, so the escalation waiting behind it is
    spooled, and drain and close take a batch, not the whole copy (they used to wait for all of
    it: 6.9 s for 400 items of 50 kB). The ERROR says the copy stopped for the stop and where
    the rest is; the next start copies it, and the spool holds everything in its order."""
    import logging
    import time

    from edge.spool_salvage import open_spool
    from tests.edge.spooldamage import KEY_INDEX, damage_index, nudge

    caplog.set_level(logging.WARNING, logger="edge")
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    path = tmp_path / "spool.db"
    spool = Spool(path, max_bytes=1 << 28, max_age_s=3600)
    backlog = [f"dev/old/{i}" for i in range(200)]
    for key in backlog:  # 4 MB: about 30 batches to copy
        assert spool.put(key, key.encode().ljust(20000, b"."), {"k": key})
    damage_index(path, KEY_INDEX)
    nudge(path)
    real = Spool.adopt

    def slow_card(self, *args, **kwargs):
        time.sleep(0.1)  # a tenth of a second a batch: the whole copy takes 3 s
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Spool, "adopt", slow_card)
    written = []
    took = []

    async def run():
        esc = Escalating("dev", {"grpc": _Counting(None, fail={7})}, written.append, EdgeMetrics(), spool=spool)
        esc.submit(Frame("cam", 7, np.full((48, 64, 3), 7, np.uint8), 0, 0.0), dets([[10, 10, 30, 30]], [0.4]),
                   Decision(True, "hard", 0.8, {}), policy, frame_record("cam", 7))  # its put meets the damage
        await async_wait_until(lambda: list(tmp_path.glob("spool.db.damaged-*Z")), 10, "the salvage under way")
        t0 = time.monotonic()
        await esc.drain(0.0)
        await esc.close()
        took.append(time.monotonic() - t0)

    asyncio.run(run())
    assert took[0] < 1.0, took
    assert [(r.frame_seq, r.outcome) for r in written] == [(7, "spooled")], [(r.outcome, r.error) for r in written]
    (moved,) = tmp_path.glob("spool.db.damaged-*Z")
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    (error,) = [m for level, m in messages if level == logging.ERROR]
    assert error.endswith(f" escalation(s) salvaged; stopped early (the daemon is stopping), the rest is still in "
                          f"{moved} and is copied at the next start"), error
    assert 0 < len(spool) - 1 < 200
    spool.close()
    monkeypatch.undo()

    with open_spool(path, max_bytes=1 << 28, max_age_s=3600) as again:  # the next start
        assert [it.key for it in again.peek(1000)] == backlog + ["dev/cam/7"]
    assert not (tmp_path / "spool.db.salvaging").exists()


def test_a_salvage_a_full_disk_cut_short_goes_on_as_the_replay_frees_room(small_fs, caplog):
    """A spool found damaged in use on a nearly full card: the salvage's copy stops at the
    filesystem's reserve (the moved file still takes its room). The replay delivers what was
    copied, its acknowledgements free room, and the replay loop goes on with the copy after the
    back-off, from where it stopped, until the moved file is copied: every escalation is
    replayed once, none twice, and the salvage marker is gone at the end."""
    import logging

    from edge.spool_salvage import SalvagePacing
    from tests.edge.spooldamage import KEY_INDEX, damage_index, nudge

    caplog.set_level(logging.WARNING, logger="edge")
    fs = small_fs(3 << 20)
    path = fs.path / "spool.db"
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    spool = Spool(path, max_bytes=1 << 28, max_age_s=3600)
    rng = np.random.default_rng(1)
    d = dets([[10, 10, 30, 30]], [0.4])
    for seq in range(200):  # 1.8 MB of a 3 MiB filesystem: moved aside, it leaves no room for all of it
        req, _ = build_request("dev", Frame("cam", seq, np.full((48, 64, 3), 30, np.uint8), 0, 0.0), d,
                               Decision(True, "hard", 0.8, {}), policy)
        req.image.data = rng.bytes(9000)
        assert spool.put(f"dev/cam/{seq}", req.SerializeToString(),
                         Spooled(frame_record("cam", seq), policy.spec.merge, 3000, "grpc").to_meta())
    damage_index(path, KEY_INDEX)
    nudge(path)
    written = []
    metrics = EdgeMetrics()

    async def run():
        esc = Escalating("dev", {"grpc": _Counting(None)}, written.append, metrics, spool=spool,
                         replay_interval_s=0.02, replay_batch=32,
                         salvage_pacing=SalvagePacing(first_s=0.02, max_s=0.2))
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await async_wait_until(lambda: len(written) >= 200 and not (fs.path / "spool.db.salvaging").exists(), 30,
                               "every escalation replayed and the copy finished")
        await asyncio.sleep(0.2)
        stop.set()
        await loop
        await esc.drain(0.1)
        await esc.close()

    asyncio.run(run())
    assert sorted(r.frame_seq for r in written) == list(range(200)), sorted(r.frame_seq for r in written)
    assert all(r.outcome == "cloud" and r.late for r in written)
    assert len(spool) == 0 and spool.damaged is None
    # the spool's own warnings (a gateway another test left running logs under load too)
    messages = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith(("edge.spool", "edge.escalating"))]
    assert "; stopped early, the rest is still in " in messages[0] and "KiB stay free" in messages[0], messages
    assert any("went on with the salvage of the damaged file" in m for m in messages), messages
    assert metrics.spool_events.labels("salvaged")._value.get() == 1
    spool.close()


def test_a_salvage_that_fails_keeps_the_spool_degraded_and_is_retried_after_a_back_off(small_fs, caplog):
    """The spool's disk is full when its damage is found: the salvage cannot start a new file,
    so it says so (ERROR, `salvage_failed`), puts the damaged file back and leaves the spool
    as damaged spools were before: /healthz degraded with why, the replay stopped, a frame the
    cloud cannot take keeps its edge result. Neither that escalation nor the replay rounds
    set off another salvage before the back-off; after it, with room again, the salvage
    works and the backlog is replayed."""
    import logging

    from edge.spool_salvage import SalvagePacing
    from tests.edge.spooldamage import AGE_INDEX, damage_index, nudge

    caplog.set_level(logging.INFO, logger="edge")
    fs = small_fs(2 << 20)
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    path = fs.path / "spool.db"
    spool = Spool(path, max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(5), policy)
    damage_index(path, AGE_INDEX)  # met by the replay's first read
    nudge(path)
    filler = fs.fill()  # every block of the filesystem
    written = []
    metrics = EdgeMetrics()
    events = metrics.spool_events

    async def run():
        t = _Counting(None, fail={50})
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool, replay_interval_s=0.02,
                         salvage_pacing=SalvagePacing(first_s=1.5, max_s=10.0))
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await async_wait_until(lambda: events.labels("salvage_failed")._value.get() == 1, 10, "the failed salvage")
        health = esc.spool_health()
        assert health["state"] == "damaged", health
        assert health["problem"].startswith(f"spool {path} is damaged (database disk image is malformed) and could "
                                            f"not be salvaged: spool {path}: its filesystem is full"), health
        assert "free space there" in health["problem"] and "tried again in 2 s" in health["problem"], health
        await _escalate_and_wait(esc, policy, written, 50)
        await asyncio.sleep(0.3)  # some 15 replay rounds
        assert (events.labels("salvage_failed")._value.get(), events.labels("salvaged")._value.get()) == (1, 0)
        assert written[0].outcome == "edge_only" and len(written) == 1
        filler.unlink()
        await async_wait_until(lambda: len(written) == 6, 10, "the backlog replayed once salvaged")
        await async_wait_until(lambda: len(spool) == 0, 10, "and acknowledged")
        assert esc.spool_health() == {"state": "ok"}
        stop.set()
        await loop
        await esc.drain(0.1)
        await esc.close()

    asyncio.run(run())
    first = written[0]
    assert f"; not spooled: spool {path} is damaged (database disk image is malformed)" in first.error
    assert [(r.frame_seq, r.outcome) for r in written[1:]] == [(s, "cloud") for s in range(5)]
    assert {e: events.labels(e)._value.get() for e in ("corrupt", "salvage_failed", "salvaged", "replayed")} == {
        "corrupt": 2, "salvage_failed": 1, "salvaged": 1, "replayed": 5}  # found once, frame 50 not spooled
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2, errors
    assert "could not be salvaged" in errors[0] and "a restart salvages it too once the cause is fixed" in errors[0]
    assert "5 escalation(s) salvaged; spooling and replay go on" in errors[1]
    assert len(list(fs.path.glob("spool.db.damaged-*Z"))) == 1  # moved aside once, by the salvage that worked
    spool.close()


def test_damage_found_again_soon_after_a_salvage_waits_for_the_back_off(tmp_path, caplog):
    """A card that keeps failing: the new file is found damaged again right after a salvage.
    That is said (once) with when the next salvage comes, and the spool stays damaged until
    then rather than being salvaged again and again; then it is salvaged, and escalations are
    spooled again."""
    import logging

    from edge.spool_salvage import SalvagePacing
    from tests.edge.spooldamage import KEY_INDEX, damage_index, nudge

    caplog.set_level(logging.INFO, logger="edge")
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    path = tmp_path / "spool.db"
    spool = _spool_with_a_damaged_index(path, policy)
    written = []
    metrics = EdgeMetrics()
    events = metrics.spool_events

    async def run():
        t = _Counting(None, fail=set(range(100)))  # the cloud takes nothing: escalations spool
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool=spool, replay_interval_s=0.05,
                         salvage_pacing=SalvagePacing(first_s=1.5, max_s=10.0))
        await _escalate_and_wait(esc, policy, written, 10)  # meets the damage: salvaged, then spooled
        damage_index(path, KEY_INDEX)  # the new file too
        nudge(path)
        await _escalate_and_wait(esc, policy, written, 11)
        health = esc.spool_health()
        assert health["state"] == "damaged", health
        assert re.search(r"; salvaged in [01] s \(found damaged again soon after a salvage\)$", health["problem"]), health
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await asyncio.sleep(0.5)
        assert events.labels("salvaged")._value.get() == 1
        await async_wait_until(lambda: events.labels("salvaged")._value.get() == 2, 10, "the second salvage")
        assert esc.spool_health() == {"state": "ok"}
        await _escalate_and_wait(esc, policy, written, 12)
        await _stop_replay(esc, stop, loop, t)

    asyncio.run(run())
    assert [(r.frame_seq, r.outcome) for r in written] == [(10, "spooled"), (11, "edge_only"), (12, "spooled")]
    assert [it.key for it in spool.peek(10)] == ["dev/cam/0", "dev/cam/1", "dev/cam/2", "dev/cam/10", "dev/cam/12"]
    assert (events.labels("corrupt")._value.get(), events.labels("salvage_failed")._value.get()) == (3, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 3, errors
    assert "3 escalation(s) salvaged" in errors[0] and "4 escalation(s) salvaged" in errors[2]
    assert errors[1].startswith(f"spool {path} is damaged (database disk image is malformed)")
    assert re.search(r"\. It is salvaged in [01] s \(found damaged again soon after a salvage\); until then", errors[1])
    assert len(list(tmp_path.glob("spool.db.damaged-*Z"))) == 2 and spool.generation == 2
    spool.close()


def test_acks_that_keep_failing_are_said_once_per_interval_not_every_round(tmp_path, caplog, monkeypatch):
    """Another process holds the spool's write lock: the delivered replays cannot be
    acknowledged, round after round (each counted ack_failed), but the warning comes once
    per LOG_INTERVAL_S, not ~5 times a second; nothing is re-sent, and once the lock is
    released the next round acknowledges them."""
    import logging
    import sqlite3

    import edge.spool

    monkeypatch.setattr(edge.spool, "SPOOL_BUSY_TIMEOUT_S", 0.05)
    caplog.set_level(logging.INFO, logger="edge")
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    path = tmp_path / "spool.db"
    spool = Spool(path, max_bytes=1 << 24, max_age_s=3600)
    _spool_requests(spool, range(3), policy)
    written = []
    metrics = EdgeMetrics()
    lock = sqlite3.connect(str(path), isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")

    async def run():
        esc = Escalating("dev", {"grpc": _Counting(None)}, written.append, metrics, spool=spool)
        for _ in range(10):
            await esc.replay_once()
        lock.execute("ROLLBACK")
        await esc.replay_once()
        await esc.close()

    asyncio.run(run())
    lock.close()
    assert [r.frame_seq for r in written] == [0, 1, 2]  # delivered once
    assert metrics.spool_events.labels("ack_failed")._value.get() == 10
    warned = [r.getMessage() for r in caplog.records if "not yet acknowledged" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"spool {path}: write failed (database is locked); another process holds its lock" in warned[0]
    assert len(spool) == 0
    spool.close()


def test_a_spool_refused_as_damaged_when_reopened_is_said_once_and_opens_once_moved_aside(tmp_path, caplog):
    """The spool could not open at start (full disk) and, once there is room, its file is
    refused as damaged: that is one ERROR, frames keep their edge result with that reason
    (counted `corrupt`, not `disk_full`), and once the operator moves the file aside the
    replay loop opens a new spool and escalations are spooled again."""
    import logging

    from tests.edge.spooldamage import KEY_INDEX, damage_index

    caplog.set_level(logging.INFO, logger="edge")
    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    path = tmp_path / "spool.db"
    with Spool(path, max_bytes=1 << 24, max_age_s=3600) as old:
        _spool_requests(old, range(20), policy)
    damage_index(path, KEY_INDEX)
    written = []
    metrics = EdgeMetrics()
    full = f"spool {path}: its filesystem is full (disk I/O error, 0 KiB free)"

    async def run():
        t = GrpcTransport([f"127.0.0.1:{free_port()}"])  # nothing listens: UNAVAILABLE
        esc = Escalating("dev", {"grpc": t}, written.append, metrics, spool_problem=full, replay_interval_s=0.05,
                         reopen=lambda: Spool(path, max_bytes=1 << 24, max_age_s=3600))

        def escalate(seq):
            return _escalate_and_wait(esc, policy, written, seq)

        assert esc.spool_health() == {"state": "unavailable", "problem": full}
        stop = asyncio.Event()
        loop = asyncio.ensure_future(esc.replay_loop(stop))
        await async_wait_until(lambda: metrics.spool_events.labels("corrupt")._value.get() == 1, 10, "the refusal")
        await asyncio.sleep(0.3)  # more attempts to open it
        assert esc.spool_health()["state"] == "damaged"
        await escalate(100)
        path.rename(tmp_path / "spool.db.bad")
        await async_wait_until(lambda: esc.spool is not None, 10, "a new spool opened")
        assert esc.spool_health() == {"state": "ok"}
        await escalate(101)
        await _stop_replay(esc, stop, loop, t)
        return esc.spool

    spool = asyncio.run(run())
    first, second = written
    assert first.outcome == "edge_only" and f"not spooled: spool {path} is not a readable spool (damaged: " in first.error
    assert second.outcome == "spooled" and len(spool) == 1
    events = metrics.spool_events
    assert (events.labels("corrupt")._value.get(), events.labels("disk_full")._value.get()) == (2, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"spool {path} is not a readable spool"), errors
    spool.close()


def test_without_a_spool_health_says_off_not_degraded():
    """A device with a cloud but no policy file (nothing escalates) builds no spool: /healthz must
    not call it degraded."""
    async def run():  # built inside a running loop, as the daemon does (Python 3.8 needs one)
        esc = Escalating("dev", {}, lambda r: None, EdgeMetrics())
        unavailable = Escalating("dev", {}, lambda r: None, EdgeMetrics(), spool_problem="disk full",
                                 reopen=lambda: None)
        health = esc.spool_health(), unavailable.spool_health()
        await esc.close()
        await unavailable.close()
        return health

    assert asyncio.run(run()) == ({"state": "off"}, {"state": "unavailable", "problem": "disk full"})


def test_escalations_the_cloud_refuses_for_good_are_said_with_what_to_do(tmp_path, caplog):
    """A payload over the gateway's limits (an 8K frame sent whole: 'Received message larger
    than max') was refused, its frame kept its edge result, and nothing was logged: a camera
    whose every escalation failed showed only edge_only outcomes. Now a few WARNINGs per
    interval say it, with the payload's bytes and the settings that fix it."""
    from edge.escalating import LOG_BURST

    class TooLarge(_Counting):
        async def detect(self, req, timeout_s):
            raise TransportError(detect_pb2.INVALID_ARGUMENT, "127.0.0.1:1: SERVER: Received message larger than "
                                 "max (22959961 vs. 8388608)")

    caplog.set_level("WARNING", logger="edge.escalating")
    policy = parse_policy(policy_yaml("p", deadline_ms=300))
    written: list = []

    async def run():
        esc = Escalating("dev", {"grpc": TooLarge(None)}, written.append, EdgeMetrics())
        for seq in range(6):
            esc.submit(Frame("cam", seq, np.zeros((48, 64, 3), np.uint8), 0, 0.0), dets([], []),
                       Decision(True, "always", 0.0, {}), policy, frame_record("cam", seq))
            await async_wait_until(lambda: len(written) == seq + 1, 30, f"the record of frame {seq}")
        await esc.close()

    asyncio.run(run())
    assert [r.outcome for r in written] == ["edge_only"] * 6
    said = [r.getMessage() for r in caplog.records if "refused by the cloud" in r.getMessage()]
    assert len(said) == LOG_BURST, said
    assert "larger than max" in said[0] and f"its payload was {written[0].payload_bytes} bytes" in said[0]
    assert "spec.payload.jpegQuality" in said[0] and "limits.max_message_bytes" in said[0]


def test_a_cloud_that_refuses_this_devices_token_is_failing_in_healthz():
    """The gateway's tokens were rotated without this device's: every escalation is refused
    UNAUTHENTICATED and keeps its edge result. /healthz's cloud part said ``answering`` (a
    refusal for good counted as an answer), status ok: the cloud was lost to the device as
    surely as in an outage, and nothing said so (found by review R). A bad request
    (INVALID_ARGUMENT) is still the cloud answering; an answer ends the failing state."""
    policy = parse_policy(policy_yaml("p", deadline_ms=3000))
    written: list = []

    async def run():
        cloud = _Refusing(range(3))
        esc = Escalating("dev", {"grpc": cloud}, written.append, EdgeMetrics())
        for seq in range(3):
            await _escalate_and_wait(esc, policy, written, seq)
        failing = esc.reach.health()
        await _escalate_and_wait(esc, policy, written, 3)  # answered
        back = esc.reach.health()
        esc._reached(TransportError(detect_pb2.INVALID_ARGUMENT, "image too large"))
        after_bad_request = esc.reach.health()
        await esc.close()
        return failing, back, after_bad_request

    failing, back, after_bad_request = asyncio.run(run())
    assert failing["state"] == "failing" and "bad token" in failing["last_error"], failing
    assert back["state"] == "answering" and after_bad_request["state"] == "answering", (back, after_bad_request)
