"""Live capture against a real RTSP camera (gst-rtsp-server, ``tests/rtsp.py``).

One camera process per module (25 fps, 320x240, H.264), restarted by the tests
that kill it. About 70 s of wall time in all, 30 s of it the frame-age run the
issue asks for; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List

import cv2
import pytest

from edge.daemon import EdgeDaemon
from edge.settings import load_settings
from edge.sources import CaptureSource
from edge.sources.base import SourceError, SourceState
from edge.sources.capturing import Capturer, FrameQueue
from edge.sources.clock import SourceClock
from tests.edge.helpers import read_jsonl, settings_yaml
from tests.rtsp import RtspCamera, missing

CAMERA_FPS = 25
PERIOD_S = 1.0 / CAMERA_FPS

pytestmark = pytest.mark.skipif(bool(missing()), reason=missing() or "")


@pytest.fixture(scope="module")
def camera() -> Iterator[RtspCamera]:
    cam = RtspCamera(fps=CAMERA_FPS, size="320x240", codec="h264").start()
    yield cam
    cam.stop()


def ensure_running(cam: RtspCamera, **settings: object) -> None:
    """Leave the shared camera as the next test expects it."""
    if cam.proc is None or cam.proc.poll() is not None or settings:
        cam.kill()
        cam.start(**settings)


def daemon_settings(tmp_path: Path, model: Path, url: str, **stream: object):
    tree = dict(
        device_id="dev",
        streams=[dict({"id": "cam", "kind": "rtsp", "uri": url, "fps": 5}, **stream)],
        model={"path": str(model), "max_batch": 1, "threads": 1},
        sinks={"jsonl": str(tmp_path / "out.jsonl")},
        spool={"path": str(tmp_path / "spool.db")},
        metrics={"port": 0},
    )
    return load_settings(str(settings_yaml(tmp_path / "edge.yaml", **tree)), env={})


def p90(xs: List[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_paced_reads_fall_behind_and_latest_frame_capture_does_not(camera):
    """The issue's reproduction beside the fix, on the same camera and clock: reading
    every 0.2 s with ``cap.read()`` falls behind by about 0.8 s per second; the
    latest-frame source read at the same pace stays within a few camera periods."""
    ensure_running(camera)
    naive_ages: List[float] = []

    def naive() -> None:
        cap = cv2.VideoCapture(camera.url, cv2.CAP_FFMPEG)
        clock = SourceClock()
        try:
            t_end = time.monotonic() + 5.0
            while time.monotonic() < t_end:
                ok, _ = cap.read()
                assert ok
                stamped, _ = clock.stamp(cap.get(cv2.CAP_PROP_POS_MSEC), time.time_ns(), time.monotonic_ns())
                naive_ages.append((time.time_ns() - stamped) / 1e9)
                time.sleep(0.2)
        finally:
            cap.release()

    t = threading.Thread(target=naive)
    t.start()
    src = CaptureSource("rtsp", camera.url)
    src.open()
    clock = SourceClock()
    ages = []
    try:
        t_end = time.monotonic() + 5.0
        while time.monotonic() < t_end:
            src.read()
            stamped, _ = clock.stamp(src.last_source_ms, time.time_ns(), time.monotonic_ns())
            ages.append((time.time_ns() - stamped) / 1e9)
            time.sleep(0.2)
    finally:
        src.close()
        t.join(10)
    assert naive_ages[-1] > 2.0 and naive_ages[-1] > naive_ages[2] + 1.5, naive_ages
    # Ours: a few camera periods at most (bounds loose enough for a shared, loaded CPU; the
    # 90th percentile, so one read delayed by a host pause does not decide it).
    assert statistics.median(ages[2:]) < 3 * PERIOD_S and p90(ages[2:]) < 0.5, ages
    assert src.skipped > 3 * len(ages)


def test_frame_age_at_inference_stays_below_three_camera_periods(tmp_path, tiny_model, camera, caplog):
    """A 25 fps camera, the daemon at 5 fps, 30 s: the frame age at inference (now -
    the camera's own timestamp) stays below 3 camera periods and does not grow.

    Pacing is judged on the intervals between reads, not on the run's total span: a
    shared host that pauses the test's processes (or the camera) for seconds lengthens
    one interval and can make the stream reconnect. The frames right after such a
    pause restart the clock mapping by design, so the age checks leave out five
    frames after each; every pause and stream state change is in the failure message."""
    ensure_running(camera)
    s = daemon_settings(tmp_path, tiny_model, camera.url, max_frames=150)
    d = EdgeDaemon(s)
    scraped = {}

    async def run() -> None:
        task = asyncio.ensure_future(d.run())
        while d.pipeline is None or d.pipeline.frames_done < 140:
            await asyncio.sleep(0.1)
            assert not task.done(), task.exception() if task.done() else None
        assert d.metrics_server is not None
        scraped["m"] = await asyncio.get_running_loop().run_in_executor(None, scrape, d.metrics_server.port)
        assert await asyncio.wait_for(task, 30) == 0

    with caplog.at_level("INFO", logger="edge.sources"):
        asyncio.run(asyncio.wait_for(run(), 90))
    states = [r.getMessage() for r in caplog.records if r.name.startswith("edge.sources")]
    recs = read_jsonl(tmp_path / "out.jsonl")
    assert [r["frame_seq"] & 0xFFFFFFFF for r in recs] == list(range(150))
    reads = [r["read_unix_ns"] / 1e9 for r in recs]
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    pauses = [(i + 1, round(g, 2)) for i, g in enumerate(gaps) if g > 1.0]
    why = f"pauses (frame, s): {pauses}; stream log: {states}"
    assert 0.18 < statistics.median(gaps) < 0.25, why  # paced at 5 fps
    assert len(pauses) <= 2, why
    after_pause = {i + k for i, _ in pauses for k in range(5)}
    kept = [r for i, r in enumerate(recs) if i >= 5 and i not in after_pause]
    ages = [r["latency_ms"]["frame_age"] / 1000.0 for r in kept]
    assert statistics.median(ages) < PERIOD_S * 1.5, (ages, why)
    assert sorted(ages)[int(0.95 * len(ages))] < 3 * PERIOD_S, (ages, why)
    first, last = statistics.median(ages[:40]), statistics.median(ages[-40:])
    assert last < first + PERIOD_S, (first, last, why)  # no growth over 30 s
    assert all(r["capture_clock"] == "stream" for r in kept), why
    assert all(r["capture_unix_ns"] <= r["read_unix_ns"] for r in recs)
    m = scraped["m"]
    assert 'edgewise_edge_frame_age_seconds_bucket{le="0.16",stream="cam"}' in m
    skipped = float(next(x.split()[-1] for x in m.splitlines()
                         if x.startswith('edgewise_edge_source_skipped_frames_total{stream="cam"}')))
    assert skipped > 3 * 140  # 25 fps drained, 5 fps used
    assert 'edgewise_edge_dropped_total{reason="queue_full",stream="cam"} 0.0' in m  # exported at 0, none counted


def test_killed_camera_is_down_at_once_and_resumes_with_a_new_resolution(tmp_path, tiny_model, camera, caplog):
    """SIGKILL the camera mid-stream: the stream is down within stall_timeout_s + 1 s,
    nothing read before the kill is emitted after it is detected, the restarted camera
    (now 640x480) is picked up within the backoff and the frame sequence continues."""
    ensure_running(camera)
    s = daemon_settings(tmp_path, tiny_model, camera.url, stall_timeout_s=1.0, reconnect_min_s=0.5,
                        reconnect_max_s=1.0)
    d = EdgeDaemon(s)
    out = tmp_path / "out.jsonl"
    t: dict = {}

    async def until(cond, timeout: float, what: str) -> None:
        t_end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < t_end, f"timed out waiting for {what}"
            await asyncio.sleep(0.02)

    async def run() -> None:
        task = asyncio.ensure_future(d.run())
        await until(lambda: d.pipeline is not None and d.pipeline.frames_done >= 10, 30, "10 frames")
        cap = d.capturers[0]
        t["kill"] = time.time_ns()
        camera.kill()
        await until(lambda: cap.state is not SourceState.STREAMING, 1.0 + 1.0, "the stream to go down")
        t["down"] = time.time_ns()
        t["seq_down"] = cap.seq
        await asyncio.sleep(1.0)  # the camera stays away a moment: nothing may be emitted meanwhile
        t["restart"] = time.time_ns()
        await asyncio.get_running_loop().run_in_executor(None, lambda: camera.start(size="640x480"))
        await until(lambda: any(r["width"] == 640 for r in read_jsonl(out)), 1.0 + 10.0, "frames at 640x480")
        t["back"] = time.time_ns()
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0

    with caplog.at_level("INFO"):
        try:
            asyncio.run(asyncio.wait_for(run(), 90))
        finally:
            ensure_running(camera, size="320x240")
    recs = read_jsonl(out)
    before = [r for r in recs if r["width"] == 320]
    after = [r for r in recs if r["width"] == 640]
    assert len(before) >= 10 and after
    # Nothing read before the kill is emitted after the outage was detected, and no
    # backlog: the last frames before the kill were emitted right away.
    assert all(r["emit_unix_ns"] < t["down"] for r in before)
    assert all(r["read_unix_ns"] < t["kill"] + 0.2e9 for r in before)
    assert not [r for r in recs if t["down"] <= r["emit_unix_ns"] < t["restart"]]
    # The sequence continues across the reconnect: increasing, no number reused.
    seqs = [r["frame_seq"] for r in recs]
    assert seqs == sorted(set(seqs)) and after[0]["frame_seq"] >= t["seq_down"]
    # Back within the backoff (<= reconnect_max_s) plus the camera's start and RTSP set-up.
    assert (after[0]["read_unix_ns"] - t["restart"]) / 1e9 < 1.0 + 5.0
    assert "resolution changed from 320x240 to 640x480" in caplog.text


def test_frozen_camera_is_declared_down_after_stall_timeout(camera):
    """SIGSTOP: the connection stays open and nothing arrives (a hung camera or a
    network black hole). No FFmpeg timeout fires for seconds; stall_timeout_s does,
    the queued frames are discarded, and nothing more comes out of the stream. Over
    RTP/UDP, so the transport setting reaches FFmpeg too."""
    ensure_running(camera)

    async def run():
        q = FrameQueue(2, "drop_oldest", asyncio.Event())
        stop = asyncio.Event()
        stale: List[int] = []
        cap = Capturer("cam", CaptureSource("rtsp", camera.url, transport="udp", stall_timeout_s=0.5), q,
                       fps=5, reconnect_min_s=5.0, on_stale=lambda sid, n: stale.append(n))
        task = asyncio.ensure_future(cap.run(stop))
        t_end = time.monotonic() + 20
        while cap.frames < 5:
            assert time.monotonic() < t_end and not task.done()
            await asyncio.sleep(0.02)
        frozen = time.monotonic()
        camera.freeze()
        while cap.state is SourceState.STREAMING:
            assert time.monotonic() < frozen + 0.5 + 1.0, "stall not detected"
            await asyncio.sleep(0.01)
        detected = time.monotonic() - frozen
        frames_at_detection = cap.frames
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(task, 15)
        return cap, q, detected, frames_at_detection

    try:
        cap, q, detected, frames_at_detection = asyncio.run(run())
    finally:
        ensure_running(camera)
        camera.kill()
        camera.start()
    assert 0.4 < detected < 1.5
    assert cap.state is SourceState.ENDED and len(q) == 0
    assert cap.frames == frames_at_detection and cap.cut_seq == cap.seq


def test_a_frozen_camera_does_not_hold_the_stop(tmp_path, tiny_model, camera, caplog):
    """SIGSTOP the camera, then stop the daemon: the read waiting for its next frame is
    woken at once. Without that it waited for FFmpeg's read timeout (io_timeout_s, 5 s:
    the stop took 5.8 s) or stall_timeout_s, whichever ends first, per camera. The woken
    read is a stop, not an outage: nothing says the stream went down."""
    ensure_running(camera)
    s = daemon_settings(tmp_path, tiny_model, camera.url, stall_timeout_s=20.0)
    d = EdgeDaemon(s)
    took: dict = {}

    async def run() -> None:
        task = asyncio.ensure_future(d.run())
        t_end = time.monotonic() + 30
        while d.pipeline is None or d.pipeline.frames_done < 3:
            assert time.monotonic() < t_end and not task.done(), "no frames from the camera"
            await asyncio.sleep(0.02)
        camera.freeze()
        await asyncio.sleep(0.5)  # the capture thread now waits for a frame that does not come
        t0 = time.monotonic()
        d.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        took["stop"] = time.monotonic() - t0

    with caplog.at_level("INFO"):
        try:
            asyncio.run(asyncio.wait_for(run(), 60))
        finally:
            ensure_running(camera)
            camera.kill()
            camera.start()
    assert took["stop"] < 3.0, took
    assert d.capturers[0].state is SourceState.ENDED and not d.capturers[0].down
    assert "delivered no new frame" not in caplog.text and "is closed" not in caplog.text


def test_mjpeg_camera(tmp_path):
    """RTP/JPEG (RFC 2435) from the same server: read live, newest frame each time."""
    cam = RtspCamera(fps=CAMERA_FPS, size="320x240", codec="mjpeg").start()
    try:
        src = CaptureSource("rtsp", cam.url)
        src.open()
        clock = SourceClock()
        ages, shapes = [], set()
        try:
            for _ in range(10):
                img = src.read()
                stamped, _ = clock.stamp(src.last_source_ms, time.time_ns(), time.monotonic_ns())
                ages.append((time.time_ns() - stamped) / 1e9)
                shapes.add(img.shape)
                time.sleep(0.2)
        finally:
            src.close()
    finally:
        cam.stop()
    assert shapes == {(240, 320, 3)}
    assert statistics.median(ages[2:]) < 3 * PERIOD_S and p90(ages[2:]) < 0.5, ages
    assert src.skipped > 20


def test_credentials_never_appear_in_logs_metrics_or_records(tmp_path, tiny_model):
    """``rtsp://user:pass@...`` against a camera with Basic authentication: the real
    ``edgewise edge run`` (debug logging) streams from it; its output, /metrics and
    records never contain the password. A wrong password is an error naming the
    redacted URL."""
    password = "s3cr3t-Pa55"
    cam = RtspCamera(fps=CAMERA_FPS, user="viewer", password=password).start()
    try:
        with pytest.raises(SourceError) as ei:
            CaptureSource("rtsp", cam.url.replace(password, "wrong-Pa55"), open_timeout_s=5).open()
        assert "rtsp://viewer:***@127.0.0.1" in str(ei.value) and "wrong-Pa55" not in str(ei.value)

        jsonl = tmp_path / "out.jsonl"
        cfg = settings_yaml(tmp_path / "edge.yaml", device_id="dev", streams=[
            {"id": "door", "kind": "rtsp", "uri": cam.url, "fps": 5, "max_frames": 25}],
            model={"path": str(tiny_model), "threads": 1}, sinks={"jsonl": str(jsonl)},
            spool={"path": str(tmp_path / "spool.db")}, metrics={"port": 0})
        proc = subprocess.Popen([sys.executable, "-m", "edgewise.cli", "--log-level", "DEBUG", "edge", "run",
                                 "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: List[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        reader.start()
        metrics = ""
        try:
            t_end = time.monotonic() + 60
            while len(read_jsonl(jsonl)) < 5 and proc.poll() is None and time.monotonic() < t_end:
                time.sleep(0.05)
            port = next(int(m.group(1)) for m in map(re.compile(r"http://127\.0\.0\.1:(\d+)/metrics").search,
                                                      list(lines)) if m)
            metrics = scrape(port)
            proc.wait(60)
        finally:
            proc.kill()
            reader.join(10)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
    finally:
        cam.stop()
    output = "".join(lines)
    assert proc.returncode == 0, output
    assert len(read_jsonl(jsonl)) == 25 and 'edgewise_edge_frames_total{stream="door"}' in metrics
    assert "rtsp://viewer:***@127.0.0.1" in output  # the start-up line names the stream, redacted
    for text in (output, metrics, jsonl.read_text()):
        assert password not in text


def test_a_password_with_an_unescaped_at_sign_is_used_and_never_shown():
    """``rtsp://viewer:p@ss@host/`` is how users write such a password, and FFmpeg logs in
    with it (the user info ends at the last '@'); the start-up line and the errors used to
    show what followed the first '@' (``rtsp://viewer:***@ssw0rd-Xy@127.0.0.1``)."""
    password = "p@ssw0rd-Xy"
    cam = RtspCamera(fps=CAMERA_FPS, user="viewer", password=password).start()
    try:
        src = CaptureSource("rtsp", cam.url, open_timeout_s=10)
        src.open()
        try:
            assert src.read().shape == (240, 320, 3)  # logged in with the whole password
        finally:
            src.close()
        with pytest.raises(SourceError) as ei:
            src.read()
        shown = [src.describe(), str(ei.value)]
    finally:
        cam.stop()
    assert all(f"rtsp://viewer:***@127.0.0.1:{cam.port}/cam" in text for text in shown), shown
    assert not [text for text in shown if "ssw0rd" in text], shown
