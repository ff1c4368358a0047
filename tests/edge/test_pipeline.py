"""The daemon in-process with the tiny real model: several streams batched, every
frame recorded once with per-stage latency and its decision explained; hot reload
while frames flow; gRPC escalation end to end through the real gateway and worker
(``real_cloud``) with merge; the cloud down or slow; metrics and health endpoints."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import urllib.request
from pathlib import Path

import pytest
import yaml

from edge.daemon import EdgeDaemon
from edge.settings import load_settings
from edgewise.errors import ConfigError
from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml
from tests.waiting import async_wait_until


async def started(d: EdgeDaemon, frames: int = 1) -> asyncio.Future[int]:
    """Run the daemon in the background until it processed ``frames`` frames."""
    task = asyncio.ensure_future(d.run())

    def progressed() -> bool:
        if task.done():
            raise AssertionError(f"daemon ended early: {task.exception() or task.result()}")
        return d.pipeline is not None and d.pipeline.frames_done >= frames
    await async_wait_until(progressed, 60, f"{frames} frames")
    return task


def base_settings(tmp_path: Path, model: Path, streams, **extra):
    tree = dict(
        device_id="dev",
        streams=streams,
        model={"path": str(model), "max_batch": 4, "conf_thres": 0.05},
        sinks={"jsonl": str(tmp_path / "out.jsonl")},
        spool={"path": str(tmp_path / "spool.db"), "replay_interval_s": 0.2},
        metrics={"port": 0},
    )
    tree.update(extra)
    return load_settings(str(settings_yaml(tmp_path / "edge.yaml", **tree)), env={})


def test_streams_batched_every_frame_recorded(tmp_path, tiny_model):
    s = base_settings(tmp_path, tiny_model, [
        {"id": "a", "kind": "synthetic", "uri": "320x240", "max_frames": 24},
        {"id": "b", "kind": "synthetic", "uri": "160x120", "max_frames": 24},
        {"id": "c", "kind": "synthetic", "max_frames": 24},
    ])
    d = EdgeDaemon(s)
    scraped = {}

    async def run():
        task = await started(d, 10)
        port = d.metrics_server.port
        loop = asyncio.get_running_loop()
        scraped["metrics"] = await loop.run_in_executor(
            None, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
        scraped["health"] = await loop.run_in_executor(
            None, lambda: json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()))
        assert await asyncio.wait_for(task, 60) == 0

    asyncio.run(run())
    recs = read_jsonl(tmp_path / "out.jsonl")
    for sid in "abc":
        assert sorted(r["frame_seq"] for r in recs if r["stream"] == sid) == list(range(24))
    r = recs[0]
    assert set(r["latency_ms"]) >= {"read", "queue", "preprocess", "infer", "postprocess", "hardness_policy", "total"}
    assert r["escalated"] is False and r["outcome"] == "edge" and r["late"] is False
    assert r["reason"] == "no policy" and r["detail"] == "no policy file: nothing is escalated"
    assert {"missed_object", "entropy", "tracker_disagreement"} <= set(r["signals"])
    for rec in recs:
        for det in rec["detections"]:
            assert det["source"] == "edge"
            x1, y1, x2, y2 = det["box"]
            assert 0 <= x1 <= x2 <= rec["width"] and 0 <= y1 <= y2 <= rec["height"]
    m = scraped["metrics"]
    assert 'edgewise_edge_frames_total{stream="a"}' in m
    assert 'edgewise_edge_source_state{state="streaming",stream="a"} 1.0' in m
    assert "edgewise_edge_stage_seconds_bucket" in m
    # Three streams ready at once: at least one inference call took more than one frame.
    batch_counts = [line for line in m.splitlines() if line.startswith("edgewise_edge_batch_size_bucket")]
    le1 = next(float(x.split()[-1]) for x in batch_counts if 'le="1.0"' in x)
    total = next(float(x.split()[-1]) for x in m.splitlines() if x.startswith("edgewise_edge_batch_size_count"))
    assert total < 72 and le1 < total
    assert scraped["health"]["status"] == "ok" and scraped["health"]["device"] == "dev"
    assert scraped["health"]["spool"] == {"state": "off"}  # no cloud configured: nothing to spool


def test_the_pipeline_holds_nothing_per_frame(tmp_path, tiny_model):
    """A long run's memory is flat: what the edge's code allocates and still holds does not grow
    with the frames processed. (The pipeline kept every frame's hardness/policy cost in a list
    nothing read, trimmed only at 100,000 entries: a daemon's memory rose for hours before it
    levelled off, about 9 h at 3 fps, read as a leak by a long run's RSS slope.)"""
    import tracemalloc

    s = base_settings(tmp_path, tiny_model, [{"id": "a", "kind": "synthetic", "uri": "64x48", "max_frames": 100000}])
    d = EdgeDaemon(s)
    ours = [tracemalloc.Filter(True, str(Path(__file__).resolve().parents[2] / pkg / "*"))
            for pkg in ("edge", "edgewise")]

    def held() -> int:
        """Blocks allocated by edge/ and edgewise/ code and still alive, less the frame times in
        the fps gauges' windows (``FrameRate``: the last 5 s, held by design, a count that follows
        the frame rate, not the frames done)."""
        gc.collect()
        assert d.pipeline is not None
        rated = sum(len(r.times) for r in d.pipeline.rates.values())
        return sum(st.count for st in tracemalloc.take_snapshot().filter_traces(ours).statistics("filename")) - rated

    async def run() -> tuple[int, int]:
        task = await started(d, 100)  # warm: the first frames make the trackers, caches and metrics series
        assert d.pipeline is not None
        f0, h0 = d.pipeline.frames_done, held()
        await async_wait_until(lambda: d.pipeline is not None and d.pipeline.frames_done >= f0 + 1000, 180,
                               "1000 more frames")
        f1, h1 = d.pipeline.frames_done, held()
        d.request_stop()
        await asyncio.wait_for(task, 60)
        return f1 - f0, h1 - h0

    tracemalloc.start()
    try:
        frames, grown = asyncio.run(run())
    finally:
        tracemalloc.stop()
    # one block per frame was the list's float; a bound far below that, well above the noise (the
    # frames and batches in flight when a snapshot is taken: up to about 100 blocks)
    assert grown < frames // 4, f"{grown} more blocks held by the edge's code after {frames} more frames"


def test_records_of_a_folder_name_their_image(tmp_path, tiny_model):
    """The path a user of a folder source takes to find the image a record is about:
    `source_file` in the JSONL record; live and generated streams leave it out."""
    import cv2
    import numpy as np

    folder = tmp_path / "shots"
    folder.mkdir()
    for name in ("b.png", "a.png"):
        assert cv2.imwrite(str(folder / name), np.full((120, 160, 3), 99, np.uint8))
    s = base_settings(tmp_path, tiny_model, [{"id": "f", "kind": "folder", "uri": str(folder)},
                                             {"id": "g", "kind": "synthetic", "max_frames": 1}])
    assert asyncio.run(asyncio.wait_for(EdgeDaemon(s).run(), 60)) == 0
    recs = read_jsonl(tmp_path / "out.jsonl")
    assert sorted((r["stream"], r["frame_seq"], r.get("source_file")) for r in recs) == [
        ("f", 0, str(folder / "a.png")), ("f", 1, str(folder / "b.png")), ("g", 0, None)]
    assert all("source_index" not in r for r in recs)


def test_hot_reload_while_frames_flow(tmp_path, tiny_model, real_cloud):
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("never", {"s": "never"}))
    s = base_settings(
        tmp_path, tiny_model,
        [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 60, "fps": 30}],
        policy_file=str(policy), policy_poll_s=0.05, cloud={"endpoints": [real_cloud.address]},
    )
    d = EdgeDaemon(s)
    answered = real_cloud.gateway.metrics.requests.labels(transport="grpc", status="OK")
    before = answered._value.get()

    async def run():
        task = await started(d, 15)
        # An invalid file is refused; the old policy stays.
        policy.write_text("apiVersion: edgewise/v1\nkind: EscalationPolicy\nspec: {threshold: 7}\n")
        await async_wait_until(lambda: d.metrics.reloads.labels("refused")._value.get() == 1, 10, "the refusal")
        assert d.holder.policy.metadata.name == "never"
        policy.write_text(policy_yaml("always", {"s": "always"}))
        assert await asyncio.wait_for(task, 60) == 0
    asyncio.run(run())
    recs = sorted(read_jsonl(tmp_path / "out.jsonl"), key=lambda r: r["frame_seq"])
    assert [r["frame_seq"] for r in recs] == list(range(60))  # no frame lost, none twice
    gens = [r["policy_generation"] for r in recs]
    assert gens == sorted(gens) and gens[0] == 1 and gens[-1] == 2
    switch = gens.index(2)
    assert 15 <= switch < 60
    assert not any(r["escalated"] for r in recs[:switch])
    assert all(r["escalated"] and r["reason"] == "always" for r in recs[switch:])
    assert all(r["outcome"] == "cloud" and r["cloud_model"] == "yolov5n-160-10" for r in recs[switch:])
    assert answered._value.get() - before == 60 - switch  # the gateway answered each escalation once
    for r in recs[switch:]:
        assert r["cloud_rtt_ms"] > 0
        assert all(det["source"] in ("edge", "cloud") for det in r["detections"])
    assert d.metrics.reloads.labels("refused")._value.get() == 1
    assert d.metrics.reloads.labels("ok")._value.get() == 1


@pytest.mark.parametrize("action, outcome", [("edge_only", "edge_only"), ("drop", None)])
def test_cloud_down_edge_only_and_drop(tmp_path, tiny_model, real_cloud, action, outcome):
    """The real gateway with its worker stopped answers UNAVAILABLE; the policy decides."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "always"}, on_unavailable=action, deadline_ms=1000))
    s = base_settings(
        tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 8}],
        policy_file=str(policy), cloud={"endpoints": [real_cloud.address]},
    )
    real_cloud.stop_worker(0)
    assert asyncio.run(EdgeDaemon(s).run()) == 0
    recs = read_jsonl(tmp_path / "out.jsonl")
    if outcome is None:
        assert recs == []
    else:
        assert sorted(r["frame_seq"] for r in recs) == list(range(8))
        assert all(r["outcome"] == outcome and "UNAVAILABLE" in r["error"] and "no worker" in r["error"]
                   for r in recs)


def test_stop_spools_in_flight_escalations(tmp_path, tiny_model, real_cloud):
    """A stop (what SIGTERM does) while the cloud is slow (the real worker's inference
    thread busy): in-flight escalations get the grace period, then go to the spool;
    nothing hangs."""
    import time

    from edge.spool import Spool

    real_cloud.block_worker(0)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("slow", {"s": "always"}, deadline_ms=10000))
    s = base_settings(
        tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 20}],
        policy_file=str(policy), cloud={"endpoints": [real_cloud.address]}, shutdown_grace_s=0.3,
    )
    d = EdgeDaemon(s)

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: d.escalating is not None and d.escalating.in_flight() >= 3, 60,
                               "3 escalations waiting for the slow cloud")
        ok, detail = d.health()
        assert ok and detail["status"] == "ok" and detail["spool"] == {"state": "ok"}, detail
        t0 = time.monotonic()
        d.request_stop()
        ok, detail = d.health()
        assert not ok and detail["status"] == "stopping"
        assert await asyncio.wait_for(task, 10) == 0
        return time.monotonic() - t0
    took = asyncio.run(run())
    assert took < 3.0
    recs = read_jsonl(tmp_path / "out.jsonl")
    seqs = [r["frame_seq"] for r in recs]
    assert sorted(seqs) == list(range(len(seqs)))  # every processed frame has its record
    spooled = {r["frame_seq"] for r in recs if r["outcome"] == "spooled"}
    cut_off = [r for r in recs if r["outcome"] == "spooled" and "shutting down" in r["error"]]
    assert len(cut_off) >= 3, [r.get("error") for r in recs]
    # The others met a saturated pool before the stop (a real gateway's RESOURCE_EXHAUSTED).
    assert all(r["error"].split(":")[0] in ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED")
               for r in recs if r["outcome"] == "spooled"), [r.get("error") for r in recs]
    sp = Spool(str(tmp_path / "spool.db"), max_bytes=1 << 30, max_age_s=3600)
    assert {int(i.key.rsplit("/", 1)[1]) for i in sp.peek(1000)} == spooled
    sp.close()


class _Slowed:
    """The real detector, a fixed time slower per batch: a heavy model on a small device."""

    def __init__(self, detector, seconds: float) -> None:
        self.detector, self.seconds = detector, seconds

    def __getattr__(self, name):
        return getattr(self.detector, name)

    def infer(self, batch):
        import time
        time.sleep(self.seconds)
        return self.detector.infer(batch)


def test_stop_drops_frames_still_queued_when_the_grace_runs_out(tmp_path, tiny_model):
    """Four streams with full queues (16 frames each) in front of a model taking 0.25 s a
    frame: finishing them would take 16 s, past what systemd waits. The stop ends about
    shutdown_grace_s after it was asked; the frames still queued then are dropped,
    counted per stream and said once, every frame that was inferred has its record, and
    every frame read is one or the other (the one each full queue held back included)."""
    import time

    s = base_settings(tmp_path, tiny_model, [
        {"id": f"s{i}", "kind": "synthetic", "uri": "160x120", "queue_size": 16} for i in range(4)
    ], shutdown_grace_s=1.0)
    s.model.max_batch = 1
    d = EdgeDaemon(s)

    async def run():
        task = await started(d, 1)
        assert d.pipeline is not None
        d.pipeline.detector = _Slowed(d.pipeline.detector, 0.25)
        await async_wait_until(lambda: all(len(q) == 16 for q in d.pipeline.queues.values()), 30, "full queues")
        done_at_stop = d.pipeline.frames_done
        t0 = time.monotonic()
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        return time.monotonic() - t0, d.pipeline.frames_done - done_at_stop

    took, after_stop = asyncio.run(run())
    assert took < 1.0 + 1.0, took
    assert 1 <= after_stop <= 1.0 / 0.25 + 3, after_stop
    dropped = {sid: d.metrics.drops.labels(sid, "shutdown")._value.get() for sid in ("s0", "s1", "s2", "s3")}
    assert all(n > 0 for n in dropped.values()), dropped
    # every frame read is inferred or counted: the one a full queue held back at the stop too
    assert sum(c.frames for c in d.capturers) == d.pipeline.frames_done + sum(dropped.values())
    recs = read_jsonl(tmp_path / "out.jsonl")
    assert len(recs) == d.pipeline.frames_done


def _file_like_run(tmp_path, tiny_model, real_cloud, **spool):
    """Six frames of a source that ends by itself, every one escalated while the worker is down."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("p", {"s": "always"}, deadline_ms=2000))
    s = base_settings(
        tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 6}],
        policy_file=str(policy), cloud={"endpoints": [real_cloud.address]},
        spool={"path": str(tmp_path / "spool.db"), "replay_interval_s": 0.2, **spool},
    )
    real_cloud.stop_worker(0)
    return EdgeDaemon(s)


def _spooled(tmp_path) -> int:
    return sum(r["outcome"] == "spooled" for r in read_jsonl(tmp_path / "out.jsonl"))


def test_a_source_that_ends_waits_for_the_spool_to_be_answered(tmp_path, tiny_model, real_cloud):
    """A recorded video the cloud could not answer in time: after its last frame the daemon
    keeps replaying (spool.replay_at_end_s) and exits once every escalation has its answer."""
    from edge.spool import Spool

    d = _file_like_run(tmp_path, tiny_model, real_cloud)

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: _spooled(tmp_path) == 6, 60, "six escalations spooled")
        await asyncio.sleep(0.5)
        assert not task.done()  # the source has ended; the daemon waits for the cloud
        await asyncio.get_running_loop().run_in_executor(None, real_cloud.start_worker, 0)
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(run()) == 0
    recs = read_jsonl(tmp_path / "out.jsonl")
    late = sorted(r["frame_seq"] for r in recs if r["outcome"] == "cloud" and r["late"])
    assert late == list(range(6)), [(r["frame_seq"], r["outcome"]) for r in recs]
    sp = Spool(str(tmp_path / "spool.db"), max_bytes=1 << 30, max_age_s=3600)
    assert len(sp) == 0
    sp.close()


def test_a_source_that_ends_keeps_what_the_cloud_did_not_answer_in_time(tmp_path, tiny_model, real_cloud, caplog):
    """Past spool.replay_at_end_s the daemon exits; the escalations stay spooled for the next start."""
    import time

    from edge.spool import Spool

    d = _file_like_run(tmp_path, tiny_model, real_cloud, replay_at_end_s=1.0)
    t0 = time.monotonic()
    assert asyncio.run(d.run()) == 0
    assert time.monotonic() - t0 < 30
    assert _spooled(tmp_path) == 6
    sp = Spool(str(tmp_path / "spool.db"), max_bytes=1 << 30, max_age_s=3600)
    assert len(sp) == 6
    sp.close()
    assert any("6 escalations still spooled after spool.replay_at_end_s" in r.getMessage() for r in caplog.records)


def test_a_stop_while_the_spool_waits_at_the_end_is_not_blamed_on_replay_at_end_s(tmp_path, tiny_model, real_cloud,
                                                                                   caplog):
    """SIGTERM 1 s into spool.replay_at_end_s (60 s) said the escalations were "still spooled after
    spool.replay_at_end_s (60 s)": an operator raised a setting that had not run out."""
    d = _file_like_run(tmp_path, tiny_model, real_cloud, replay_at_end_s=60.0)

    async def run():
        task = asyncio.ensure_future(d.run())
        await async_wait_until(lambda: _spooled(tmp_path) == 6, 60, "six escalations spooled")
        await asyncio.sleep(0.5)
        assert not task.done()  # waiting for the cloud at the end of the source
        d.request_stop()
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(run()) == 0
    said = [r.getMessage() for r in caplog.records if "still spooled" in r.getMessage()]
    assert said == ["sources ended; stopped while waiting for the cloud to answer the spool, 6 escalations still "
                    "spooled: they are replayed at the next start"], said


def test_sighup_reloads_policy(tmp_path, tiny_model):
    """A real SIGHUP (file polling effectively off) puts the new policy in force."""
    import os
    import signal

    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("first", {"s": "never"}))
    s = base_settings(
        tmp_path, tiny_model, [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 40, "fps": 40}],
        policy_file=str(policy), policy_poll_s=3600,
    )
    d = EdgeDaemon(s)

    async def run():
        task = await started(d, 5)
        policy.write_text(policy_yaml("second", {"s": "never"}, threshold=0.9))
        os.kill(os.getpid(), signal.SIGHUP)
        assert await asyncio.wait_for(task, 60) == 0

    asyncio.run(run())
    recs = sorted(read_jsonl(tmp_path / "out.jsonl"), key=lambda r: r["frame_seq"])
    assert [r["frame_seq"] for r in recs] == list(range(40))
    names = [r["policy"] for r in recs]
    assert names[0] == "first" and names[-1] == "second"
    assert names == sorted(names, key=lambda n: n == "second")


def test_digits_scene_stream_through_the_daemon(tmp_path, tiny_model):
    """A ``digits`` synthetic stream (edgewise.synth scenes) runs through the whole daemon."""
    pytest.importorskip("edgewise.synth")
    s = base_settings(tmp_path, tiny_model, [
        {"id": "d", "kind": "synthetic", "uri": "digits:easy:160x120", "max_frames": 6},
    ])
    d = EdgeDaemon(s)
    assert asyncio.run(d.run()) == 0
    recs = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(r["frame_seq"] for r in recs) == list(range(6))
    assert {(r["width"], r["height"]) for r in recs} == {(160, 120)}
    assert d.capturers[0].source.scene is not None


def _fails_on_bright_frames(path: Path) -> Path:
    """A YOLOv5-shaped model that ONNX Runtime runs on the daemon's black start-up frame but fails
    on any brighter one (a Gather whose index grows with the brightest pixel)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tests.edgewise.runtime.graphs import fake_yolo, names_meta

    fake_yolo(path, imgsz=32, nc=2, metadata=names_meta(["a", "b"]))
    model = onnx.load(str(path))
    g = model.graph
    for node in g.node:
        if "output0" in node.output:
            node.output[0] = "head"
    g.initializer.extend([numpy_helper.from_array(np.array([0.0], np.float32), "one_value"),
                          numpy_helper.from_array(np.array(10.0, np.float32), "ten")])
    g.node.extend([
        helper.make_node("ReduceMax", ["images"], ["brightest"], keepdims=0),
        helper.make_node("Mul", ["brightest", "ten"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["index"], to=TensorProto.INT64),
        helper.make_node("Gather", ["one_value", "index"], ["zero"]),  # out of bounds past 0
        helper.make_node("Add", ["head", "zero"], ["output0"]),
    ])
    onnx.save(model, str(path))
    return path


def test_a_model_failing_on_every_batch_logs_a_few_tracebacks_and_health_says_so(tmp_path, caplog):
    # every failed batch was a full traceback in the log, and /healthz said ok while the daemon
    # processed nothing
    import cv2
    import numpy as np

    model = _fails_on_bright_frames(tmp_path / "bright.onnx")
    folder = tmp_path / "shots"
    folder.mkdir()
    for i in range(12):
        assert cv2.imwrite(str(folder / f"{i:02d}.png"), np.full((32, 32, 3), 255, np.uint8))
    d = EdgeDaemon(base_settings(tmp_path, model, [{"id": "f", "kind": "folder", "uri": str(folder)}]))
    with caplog.at_level(logging.ERROR, logger="edge.pipeline"), pytest.raises(ConfigError, match="no frame was processed"):
        asyncio.run(asyncio.wait_for(d.run(), 60))
    failed = [r for r in caplog.records if r.getMessage().startswith("inference failed")]
    assert 1 <= len(failed) <= 3 and all(r.exc_info for r in failed), [r.getMessage() for r in failed]
    assert d.metrics.registry.get_sample_value(
        "edgewise_edge_dropped_total", {"stream": "f", "reason": "inference_error:InvalidArgument"}) == 12
    health = d.health()[1]
    assert health["inference_failing"] is True and d.pipeline is not None and d.pipeline.frames_done == 0


def test_an_uncapped_video_file_spends_its_budget_on_the_recording_timeline(tmp_path, tiny_model, real_cloud):
    """A recording read as fast as the edge can (no ``fps``): its cooldown and ``maxPerSecond``
    ran on processing time, so at 40 fps of processing a 10 fps recording's 2 per second let
    5% of its frames through. They run on the recording's timeline now, as ``edgewise eval``
    counts them: burst 1 plus 2 a second over 6 s of a looping 10 fps video is every fifth
    frame, however fast it was read, and the recorded decision times are the recording's."""
    from tests.edge.sources.test_sources import make_video

    video = make_video(tmp_path / "clip.avi", 40)
    doc = yaml.safe_load(policy_yaml("p", {"s": "always"}))
    doc["spec"]["budget"] = {"maxFraction": 1.0, "maxPerSecond": 2, "burst": 1, "priority": "fifo"}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc))
    s = base_settings(tmp_path, tiny_model, [{"id": "s", "kind": "file", "uri": str(video), "loop": True,
                                              "max_frames": 60}],
                      policy_file=str(policy), cloud={"endpoints": [real_cloud.address]})
    assert asyncio.run(asyncio.wait_for(EdgeDaemon(s).run(), 120)) == 0
    recs = sorted(read_jsonl(tmp_path / "out.jsonl"), key=lambda r: r["frame_seq"])
    assert [r["frame_seq"] for r in recs] == list(range(60))
    assert [r["frame_seq"] for r in recs if r["escalated"]] == list(range(0, 60, 5))
    assert {r["suppressed_by"] for r in recs if not r["escalated"]} == {"budget_rate"}
    assert all(r["outcome"] == "cloud" for r in recs if r["escalated"])
    steps = [b["decided_s"] - a["decided_s"] for a, b in zip(recs, recs[1:])]
    assert steps == pytest.approx([0.1] * 59, abs=1e-6)  # across the loop's wrap too
