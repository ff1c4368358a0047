"""Frame sources on real files: video (looped, truncated), image folder with a corrupt
image, a live stream that stops (reconnect with backoff), drop policies."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge.sources import CaptureSource, ImageFolderSource, SyntheticSource, VideoFileSource
from edge.sources.base import SourceState
from edge.sources.capturing import Capturer, FrameQueue
from tests.waiting import async_wait_until


def make_video(path: Path, n: int = 12, size=(96, 64)) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, size)
    assert w.isOpened()
    for i in range(n):
        img = np.full((size[1], size[0], 3), i * 10 % 255, np.uint8)
        cv2.putText(img, str(i), (10, 40), cv2.FONT_HERSHEY_SIMPLEX, 1, (255, 255, 255), 2)
        w.write(img)
    w.release()
    return path


def read_all(src, limit=1000):
    src.open()
    out = []
    while len(out) < limit:
        img = src.read()
        if img is None:
            break
        out.append(img)
    src.close()
    return out


def test_video_file_reads_every_frame(tmp_path):
    frames = read_all(VideoFileSource(str(make_video(tmp_path / "v.avi", 12))))
    assert len(frames) == 12
    assert frames[0].shape == (64, 96, 3) and frames[0].dtype == np.uint8


def test_video_file_loops(tmp_path):
    frames = read_all(VideoFileSource(str(make_video(tmp_path / "v.avi", 5)), loop=True), limit=13)
    assert len(frames) == 13


def test_truncated_video_ends_early_and_is_counted(tmp_path):
    p = make_video(tmp_path / "v.avi", 30)
    data = p.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])
    src = VideoFileSource(str(cut))
    frames = read_all(src)
    assert 0 < len(frames) < 30
    assert src.truncated == 1

    async def run():
        q = FrameQueue(100, "wait", asyncio.Event())
        counted = []
        cap = Capturer("v", VideoFileSource(str(cut)), q, on_truncated=counted.append)
        await cap.run(asyncio.Event())
        return q, counted

    q, counted = asyncio.run(run())
    assert counted == ["v"] and len(q) == len(frames)


def test_folder_skips_corrupt_image(tmp_path):
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i}.png"), np.full((20, 30, 3), i, np.uint8))
    (tmp_path / "1b.jpg").write_bytes(b"\xff\xd8not a jpeg at all")
    cv2.imwrite(str(tmp_path / "gray.png"), np.zeros((20, 30), np.uint8))

    async def run():
        ready = asyncio.Event()
        q = FrameQueue(100, "wait", ready)
        corrupt = []
        cap = Capturer("f", ImageFolderSource(str(tmp_path)), q, on_corrupt=corrupt.append)
        await cap.run(asyncio.Event())
        return cap, q, corrupt

    cap, q, corrupt = asyncio.run(run())
    assert len(q) == 4  # 0,1,2 and gray (converted to BGR)
    assert corrupt == ["f"] and cap.corrupt == 1
    assert cap.state is SourceState.ENDED
    assert [f.seq for f in q.items] == [0, 1, 2, 3]
    assert all(f.image.shape == (20, 30, 3) for f in q.items)


def bomb_jpeg(side: int = 30000) -> bytes:
    """A real 8x8 JPEG whose frame header is edited to declare ``side`` x ``side``."""
    data = bytearray(cv2.imencode(".jpg", np.full((8, 8, 3), 128, np.uint8))[1].tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = side.to_bytes(2, "big") * 2
    return bytes(data)


def bomb_png(side: int = 30000) -> bytes:
    """A real 8x8 PNG whose IHDR declares ``side`` x ``side`` (CRC fixed, so only the size is wrong)."""
    data = bytearray(cv2.imencode(".png", np.full((8, 8, 3), 128, np.uint8))[1].tobytes())
    data[16:24] = side.to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def photo_jpeg() -> bytes:
    im = cv2.imread("/usr/share/doc/opencv-doc/examples/data/baboon.jpg")
    assert im is not None, "opencv-doc is needed (make test installs it)"
    return cv2.imencode(".jpg", im[:240, :320])[1].tobytes()


def test_folder_refuses_bombs_and_damaged_files_by_name(tmp_path, caplog):
    good = photo_jpeg()
    (tmp_path / "a-good.jpg").write_bytes(good)
    cv2.imwrite(str(tmp_path / "b-good.png"), np.full((20, 30, 3), 7, np.uint8))
    (tmp_path / "c-bomb.jpg").write_bytes(bomb_jpeg())
    (tmp_path / "d-bomb.png").write_bytes(bomb_png())
    (tmp_path / "e-truncated.jpg").write_bytes(good[: len(good) * 2 // 3])
    stuffed = good.index(b"\xff\x00", good.index(b"\xff\xda"))
    (tmp_path / "f-flipped.jpg").write_bytes(good[:stuffed + 1] + b"\x04" + good[stuffed + 2:])  # 00 -> 04
    png = bytearray((tmp_path / "b-good.png").read_bytes())
    png[len(png) // 2] ^= 0x10
    (tmp_path / "g-flipped.png").write_bytes(bytes(png))

    async def run():
        q = FrameQueue(100, "wait", asyncio.Event())
        cap = Capturer("f", ImageFolderSource(str(tmp_path)), q)
        await cap.run(asyncio.Event())
        return cap, q

    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with caplog.at_level("WARNING", logger="edge.sources.capturing"):
        cap, q = asyncio.run(run())
    took = time.perf_counter() - t0
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0) / 1024
    assert [f.image.shape for f in q.items] == [(240, 320, 3), (20, 30, 3)]
    assert cap.corrupt == 5
    text = "\n".join(r.getMessage() for r in caplog.records)
    for name, why in [("c-bomb.jpg", "declares 30000x30000"), ("d-bomb.png", "declares 30000x30000"),
                      ("e-truncated.jpg", "truncated"), ("f-flipped.jpg", "corrupt JPEG"),
                      ("g-flipped.png", "corrupt PNG (CRC mismatch")]:
        assert any(name in line and why in line for line in text.splitlines()), (name, text)
    # decoding a 30000x30000 bomb costs ~2.7 GB and seconds; its header costs nothing
    assert took < 2.0 and peak_mb < 100, (took, peak_mb)


def test_folder_of_only_corrupt_files_backs_off(tmp_path, caplog):
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")

    async def run():
        q = FrameQueue(4, "wait", asyncio.Event())
        states = []
        stop = asyncio.Event()
        cap = Capturer("bad", ImageFolderSource(str(tmp_path), loop=True), q, fps=0,
                       reconnect_min_s=0.05, reconnect_max_s=0.2, on_state=lambda s, st: states.append(st))
        task = asyncio.ensure_future(cap.run(stop))
        t0 = time.process_time()
        # three back-offs (0.05 + 0.1 + 0.2 s): without them this loop reads files non-stop
        await async_wait_until(lambda: states.count(SourceState.BACKOFF) >= 3, 10, "three back-offs")
        cpu = time.process_time() - t0
        stop.set()
        await asyncio.wait_for(task, 5)
        return cap, states, cpu

    with caplog.at_level("WARNING", logger="edge.sources.capturing"):
        cap, states, cpu = asyncio.run(run())
    # without the back-off this loop read ~50,000 files in the same time, logging each one
    assert 3 <= cap.corrupt < 100, cap.corrupt
    assert SourceState.BACKOFF in states and states[-1] is SourceState.ENDED
    lines = [r.getMessage() for r in caplog.records if "corrupt frame skipped" in r.getMessage()]
    assert len(lines) == 5 and "0.jpg" in lines[0]  # one burst, then quiet for the interval
    # what the burst held back is said when the stream ends (it went unreported before)
    [tail] = [r.getMessage() for r in caplog.records if "not logged;" in r.getMessage()]
    assert tail.endswith(f"{cap.corrupt} corrupt in all") and f"{cap.corrupt - 5} more corrupt" in tail
    assert cpu < 0.75, cpu


def test_live_stream_that_stops_goes_down_discards_its_backlog_and_reconnects(tmp_path):
    # A live "http" source read through FFmpeg; it stops after its last frame, so
    # the capture shell must go to backoff, reconnect and stream again. Nobody takes
    # frames from the queue: what is queued when the stream goes down is discarded.
    video = make_video(tmp_path / "live.avi", 300)

    async def run():
        ready = asyncio.Event()
        q = FrameQueue(3, "drop_oldest", ready)
        states, drops, stale = [], [], []
        stop = asyncio.Event()
        cap = Capturer("cam", CaptureSource("http", str(video)), q, reconnect_min_s=0.05,
                       reconnect_max_s=0.2, on_state=lambda s, st: states.append(st),
                       on_drop=drops.append, on_stale=lambda sid, n: stale.append(n))
        task = asyncio.ensure_future(cap.run(stop))
        await async_wait_until(lambda: cap.reconnects >= 3, 10, "three reconnects")
        stop.set()
        await asyncio.wait_for(task, 5)
        return cap, q, states, drops, stale

    cap, q, states, drops, stale = asyncio.run(run())
    assert cap.reconnects >= 3
    assert states[:3] == [SourceState.CONNECTING, SourceState.STREAMING, SourceState.BACKOFF]
    assert states.count(SourceState.STREAMING) >= 2
    assert states[-1] is SourceState.ENDED
    # Every frame read was either pushed out of the bounded queue or discarded as
    # stale at the next outage; the queue holds none from before the last one.
    assert cap.frames > 0 and len(q) == 0 and cap.cut_seq == cap.seq
    assert sum(stale) + len(drops) == cap.frames and q.dropped == len(drops)
    # The reader drains the source at its own rate: most frames are skipped, not read.
    assert cap.skipped > cap.frames


def test_unreachable_stream_backs_off_exponentially():
    async def run():
        q = FrameQueue(2, "drop_oldest", asyncio.Event())
        stop = asyncio.Event()
        cap = Capturer("x", CaptureSource("rtsp", "rtsp://127.0.0.1:9/none"), q,
                       reconnect_min_s=0.01, reconnect_max_s=0.04)
        delays = []
        orig = cap._backoff

        async def spy(stop_, delay, why):
            delays.append(delay)
            return await orig(stop_, delay, why)

        cap._backoff = spy
        task = asyncio.ensure_future(cap.run(stop))
        await async_wait_until(lambda: len(delays) >= 4, 10, "four back-off delays")
        assert cap.down  # failed and no frame since: /healthz says degraded
        stop.set()
        await asyncio.wait_for(task, 10)
        return delays, cap

    delays, cap = asyncio.run(run())
    assert delays[:4] == [0.01, 0.02, 0.04, 0.04]
    assert cap.state is SourceState.ENDED and cap.frames == 0



def _hung_listener(stack: contextlib.ExitStack) -> int:
    """A port whose accept queue is full: a TCP connect to it hangs (a camera off the network)."""
    ls = stack.enter_context(socket.socket())
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    port = ls.getsockname()[1]
    for _ in range(3):
        c = stack.enter_context(socket.socket())
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
    return port


def test_a_stop_waits_for_one_hung_open_at_most(caplog):
    """Two cameras off the network, with other RTSP transports (so their opens take turns at
    the FFmpeg options gate), stopped while the first open hangs. The stop took 7.5 s with
    open_timeout_s 3: after the open the reachability check that explains it hung 2 s more,
    then the second camera's open, which had waited at the gate, started and hung too; and
    each said the stream backs off and retries. Now no open starts once the stop came, and
    none is explained: the stop waits for the open in progress only."""
    open_timeout_s = 2.0
    took = {}

    async def run(stack: contextlib.ExitStack) -> None:
        stop = asyncio.Event()
        caps = [Capturer(t, CaptureSource("rtsp", f"rtsp://127.0.0.1:{_hung_listener(stack)}/cam", transport=t,
                                          open_timeout_s=open_timeout_s, io_timeout_s=open_timeout_s),
                         FrameQueue(2, "drop_oldest", asyncio.Event())) for t in ("tcp", "udp")]
        tasks = [asyncio.ensure_future(c.run(stop)) for c in caps]
        await async_wait_until(lambda: all(c.state is SourceState.CONNECTING for c in caps), 10, "both connecting")
        await asyncio.sleep(0.3)  # the first open is under way, the second waits at the gate
        t0 = time.monotonic()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        took["stop"] = time.monotonic() - t0
        took["reconnects"] = sum(c.reconnects for c in caps)
        assert all(c.state is SourceState.ENDED for c in caps)

    with caplog.at_level("INFO"), contextlib.ExitStack() as stack:
        asyncio.run(run(stack))
    assert took["stop"] < open_timeout_s + 1.0 and took["reconnects"] == 0, took
    assert "retrying" not in caplog.text and "no answer from" not in caplog.text

def test_wait_policy_blocks_capture_without_loss():
    async def run():
        q = FrameQueue(2, "wait", asyncio.Event())
        stop = asyncio.Event()
        cap = Capturer("s", SyntheticSource("s", "64x48"), q, max_frames=6)
        task = asyncio.ensure_future(cap.run(stop))
        got = []
        while len(got) < 6:
            assert len(q) <= 2
            f = await async_wait_until(q.get_nowait, 10, "the next frame")
            got.append(f.seq)
        await asyncio.wait_for(task, 5)
        return got, q

    got, q = asyncio.run(run())
    assert got == list(range(6)) and q.dropped == 0


def test_synthetic_frames_move_and_are_deterministic():
    a = read_all(SyntheticSource("s1", "128x96"), limit=3)
    b = read_all(SyntheticSource("s1", "128x96"), limit=3)
    assert a[0].shape == (96, 128, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], a[2])
    with pytest.raises(ValueError):
        SyntheticSource("s", "big")
    with pytest.raises(ValueError, match="digits"):
        SyntheticSource("s", "digits:a:b:c")


def test_synthetic_digits_scene_from_edgewise_synth():
    """``digits:DIFFICULTY:WxH`` streams edgewise.synth camera scenes, deterministic per stream."""
    pytest.importorskip("edgewise.synth")
    src = SyntheticSource("cam", "digits:easy:160x120")
    a = read_all(src, limit=3)
    assert src.scene is not None  # the generator, not the fallback pattern
    b = read_all(SyntheticSource("cam", "digits:easy:160x120"), limit=3)
    pattern = read_all(SyntheticSource("cam", "160x120"), limit=3)
    assert [x.shape for x in a] == [(120, 160, 3)] * 3 and a[0].dtype == np.uint8
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], a[2]) and not np.array_equal(a[0], pattern[0])
    other = read_all(SyntheticSource("cam2", "digits:easy:160x120"), limit=1)
    assert not np.array_equal(a[0], other[0])


def test_synthetic_digits_falls_back_to_the_pattern_without_edgewise_synth(monkeypatch, caplog):
    import sys

    monkeypatch.setitem(sys.modules, "edgewise.synth", None)  # import fails, as on a device without it
    src = SyntheticSource("cam", "digits:hard:160x120")
    frames = read_all(src, limit=2)
    pattern = read_all(SyntheticSource("cam", "160x120"), limit=2)
    assert src.scene is None and all(np.array_equal(x, y) for x, y in zip(frames, pattern))
    assert "using the built-in pattern" in caplog.text


def test_a_source_whose_open_raises_something_else_ends_down_at_once(tmp_path, caplog):
    """A synthetic scene's difficulty file deleted after the settings read it: its open raises a
    ConfigError, not a SourceError. It ended the capture task, the stream "ended" as if done,
    not down (``/healthz`` ok), and nothing was said until the daemon stopped."""
    pytest.importorskip("edgewise.synth")
    knobs = tmp_path / "knobs.yaml"
    knobs.write_text("preset: easy\n")
    src = SyntheticSource("demo", f"digits:{knobs}:160x120")
    knobs.unlink()

    async def run():
        q = FrameQueue(2, "wait", asyncio.Event())
        cap = Capturer("demo", src, q)
        await asyncio.wait_for(cap.run(asyncio.Event()), 10)  # returns: the task does not crash
        return cap

    cap = asyncio.run(run())
    assert cap.down and cap.state is SourceState.ENDED
    assert "stream demo: open failed: ConfigError" in caplog.text and "Traceback" in caplog.text
    assert caplog.text.count("open failed") == 1


def test_the_ffmpeg_options_gate_lets_opens_in_in_arrival_order():
    """Two dead cameras retrying with one options value kept the gate held, and a healthy
    camera with other options waited for good (a UDP camera got no frame in 40 s): an open
    with the holders' value no longer passes one with another value waiting ahead of it."""
    import threading
    import time

    from edge.sources.opencv import _OptionsGate

    gate = _OptionsGate()
    entered = []
    release_a = threading.Event()

    def open_with(value, name, hold=None):
        with gate.holding(value):
            entered.append(name)
            if hold is not None:
                hold.wait(10)

    def started(fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        return t

    a1 = started(open_with, "tcp", "dead-1", release_a)
    while not entered:
        time.sleep(0.01)
    b = started(open_with, "udp", "healthy")
    while not gate.line:
        time.sleep(0.01)
    a2 = started(open_with, "tcp", "dead-2")  # same options as the holder: may not pass the waiter
    time.sleep(0.2)
    assert entered == ["dead-1"]
    release_a.set()
    for t in (a1, b, a2):
        t.join(5)
    assert entered == ["dead-1", "healthy", "dead-2"]
    with gate.holding("x"):  # one open at a time, as OpenCV opens them, whatever the value
        later = started(open_with, "x", "later")
        later.join(0.2)
        assert entered[-1] == "dead-2"
    later.join(5)
    assert entered[-1] == "later"


def test_a_stop_waits_for_one_hung_open_not_one_per_camera():
    """OpenCV opens one FFmpeg capture at a time per process. Cameras with the same options
    passed the options gate together and queued inside OpenCV instead, where a stop cannot
    refuse them: each ran its whole open timeout after the one before, and a daemon with three
    cameras on a hung host took three timeouts to stop. Now they wait at the gate, and the
    stop refuses those that had not started."""
    import socket
    import threading
    import time

    from edge.sources.base import SourceError
    from edge.sources.opencv import CaptureSource

    hung = socket.socket()  # accepts connections and never answers: a hung camera
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    url = f"rtsp://127.0.0.1:{hung.getsockname()[1]}/cam"
    sources = [CaptureSource("rtsp", url, backend="ffmpeg", open_timeout_s=1.0, io_timeout_s=1.0) for _ in range(3)]
    failed = []

    def open_(src):
        try:
            src.open()
        except SourceError as exc:
            failed.append(str(exc))

    t0 = time.monotonic()
    threads = [threading.Thread(target=open_, args=(src,), daemon=True) for src in sources]
    for t in threads:
        t.start()
    try:
        conn, _ = hung.accept()  # the first open is under way
        for src in sources:
            src.interrupt()
        for t in threads:
            t.join(10)
        took = time.monotonic() - t0
        conn.close()
    finally:
        hung.close()
    assert len(failed) == 3, failed
    assert took < 1.8, f"the stop waited {took:.1f} s for the opens"


def test_a_video_file_opens_at_the_options_gate_with_the_processs_own_options(tmp_path, monkeypatch):
    """A video file was opened outside the options gate: it waited inside OpenCV behind a
    camera's open (one FFmpeg open at a time per process) and could read that camera's
    OPENCV_FFMPEG_CAPTURE_OPTIONS, set around its open. It waits at the gate now and opens with
    the environment as the process has it."""
    import os
    import threading

    from edge.sources import opencv

    video = make_video(tmp_path / "v.avi")
    seen = []
    real = cv2.VideoCapture

    def spy(*args, **kw):
        seen.append(os.environ.get(opencv.FFMPEG_OPTIONS_ENV))
        return real(*args, **kw)

    monkeypatch.setattr(opencv.cv2, "VideoCapture", spy)
    monkeypatch.delenv(opencv.FFMPEG_OPTIONS_ENV, raising=False)
    release, entered = threading.Event(), threading.Event()

    def camera_open() -> None:  # a camera's open, under way with its options
        with opencv._OPTIONS_GATE.holding("rtsp_transport;tcp|stimeout;5000000"):
            entered.set()
            release.wait(10)

    cam = threading.Thread(target=camera_open, daemon=True)
    cam.start()
    assert entered.wait(5)
    src = VideoFileSource(str(video))
    opener = threading.Thread(target=src.open, daemon=True)
    opener.start()
    opener.join(0.3)
    assert opener.is_alive() and not seen, "the file opened beside the camera's open"
    release.set()
    opener.join(10)
    cam.join(10)
    src.close()
    assert seen == [None]
