"""Finite sources on odd real media: bad files at the start of a folder, hidden and
AppleDouble files, natural order, a folder that changes while it loops, a video with one
undecodable frame in the middle, an empty video, log lines that must not flood or be forged,
and ``check-config``'s probe of a source."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from pathlib import Path
from typing import List

import cv2
import numpy as np
import pytest

from edge.sources import ImageFolderSource, VideoFileSource
from edge.sources.base import SourceState
from edge.sources.capturing import Capturer, FrameQueue
from edge.sources.opencv import local_source_problem
from tests.edge.sources.test_sources import bomb_jpeg, make_video, read_all
from tests.waiting import async_wait_until, wait_until


def _png(path: Path, value: int, size=(30, 20)) -> Path:
    assert cv2.imwrite(str(path), np.full((size[1], size[0], 3), value, np.uint8))
    return path


def _capture(src, **kw):
    """Run a Capturer on ``src`` to its end (5 s at most); its queue, states and itself."""

    async def run():
        q = FrameQueue(1000, "wait", asyncio.Event())
        states: List[SourceState] = []
        cap = Capturer("s", src, q, on_state=lambda _s, st: states.append(st), **kw)
        await asyncio.wait_for(cap.run(asyncio.Event()), 5)
        return cap, q, states

    return asyncio.run(run())


def midcorrupt_video(path: Path, n: int = 30, bad: int = 10, run: int = 1) -> Path:
    """An MJPG AVI of ``n`` frames whose frames ``bad`` .. ``bad + run - 1`` have their JPEG
    bytes zeroed (sizes kept)."""
    data = bytearray(make_video(path.with_suffix(".src.avi"), n).read_bytes())
    chunks, i = [], 0
    while True:
        j = data.find(b"00dc", i)
        if j < 0:
            break
        chunks.append(j)
        i = j + 4
    for k in range(bad, bad + run):
        j = chunks[k + 1]  # the stream header's tag, then one chunk per frame, then the index
        size = int.from_bytes(data[j + 4:j + 8], "little")
        data[j + 8:j + 8 + size] = bytes(size)
    path.write_bytes(bytes(data))
    return path


def test_bad_files_at_the_start_of_a_folder_do_not_hold_it_up(tmp_path):
    """20 zero-byte placeholders before the first real image backed off 0.5 s doubling to
    30 s (minutes here, hours for a bigger run); AppleDouble twins are skipped, not counted."""
    for i in range(20):
        (tmp_path / f"IMG_{i:04d}.jpg").write_bytes(b"")
        (tmp_path / f"._IMG_{i:04d}.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    _png(tmp_path / "IMG_0100.png", 9)
    cap, q, states = _capture(ImageFolderSource(str(tmp_path)))
    assert len(q) == 1 and cap.corrupt == 20
    assert SourceState.BACKOFF not in states


def test_a_folder_of_only_bad_files_ends_with_a_clear_error(tmp_path, caplog):
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(b"")
    with caplog.at_level("ERROR", logger="edge.sources.capturing"):
        cap, q, states = _capture(ImageFolderSource(str(tmp_path)))
    assert len(q) == 0 and cap.corrupt == 3 and SourceState.BACKOFF not in states
    assert any("ended without one good frame (3 corrupt" in r.getMessage() for r in caplog.records)


def test_folder_order_is_natural_and_hidden_files_are_skipped(tmp_path):
    for i in (1, 2, 10, 11, 3):
        _png(tmp_path / f"frame{i}.png", i)
    _png(tmp_path / ".hidden.png", 200)
    frames = read_all(ImageFolderSource(str(tmp_path)))
    assert [int(f[0, 0, 0]) for f in frames] == [1, 2, 3, 10, 11]


def test_a_looping_folder_is_listed_again_at_each_pass(tmp_path):
    _png(tmp_path / "a.png", 1)
    _png(tmp_path / "b.png", 2)
    src = ImageFolderSource(str(tmp_path), loop=True)
    src.open()
    assert [int(src.read()[0, 0, 0]) for _ in range(2)] == [1, 2]
    (tmp_path / "a.png").unlink()
    _png(tmp_path / "c.png", 3)
    assert [int(src.read()[0, 0, 0]) for _ in range(4)] == [2, 3, 2, 3]  # no error for a.png


def test_one_bad_frame_in_the_middle_does_not_end_the_video(tmp_path):
    video = midcorrupt_video(tmp_path / "mid.avi", 30, 10)
    src = VideoFileSource(str(video))
    frames = read_all(src)
    assert len(frames) == 29 and src.corrupt == 1 and src.truncated == 0
    looped = VideoFileSource(str(video), loop=True)
    frames = read_all(looped, limit=58)
    assert len(frames) == 58 and looped.corrupt == 2 and looped.truncated == 0
    cap, q, _ = _capture(VideoFileSource(str(video)))
    assert len(q) == 29 and cap.corrupt == 1


def test_a_truncated_tail_is_said_once_per_source_while_looping(tmp_path, caplog):
    data = make_video(tmp_path / "v.avi", 30).read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])
    src = VideoFileSource(str(cut), loop=True)
    n = len(read_all(VideoFileSource(str(cut))))
    caplog.clear()
    with caplog.at_level("WARNING", logger="edge.sources.opencv"):
        frames = read_all(src, limit=3 * n + 1)
    assert len(frames) == 3 * n + 1 and src.truncated == 3
    lines = [r.getMessage() for r in caplog.records if "truncated or corrupt tail" in r.getMessage()]
    assert len(lines) == 1 and f"after {n} of 30 frames" in lines[0]


def test_an_empty_video_is_named_with_its_cause(tmp_path, caplog):
    path = tmp_path / "zero.avi"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (96, 64))
    w.release()
    with caplog.at_level("ERROR", logger="edge.sources.capturing"):
        _capture(VideoFileSource(str(path)))
    assert any(f"video {path} yielded no frames (empty, or not decodable)" in r.getMessage()
               for r in caplog.records)


def test_resolution_changes_are_not_logged_per_file(tmp_path, caplog):
    for i in range(8):
        _png(tmp_path / f"{i}.png", i, (30, 20) if i % 2 else (20, 30))
    with caplog.at_level("WARNING", logger="edge.sources.capturing"):
        _capture(ImageFolderSource(str(tmp_path)))
    assert len([r for r in caplog.records if "resolution changed" in r.getMessage()]) == 1


def test_a_newline_in_a_file_name_cannot_forge_a_log_line(tmp_path, caplog):
    (tmp_path / "bad\n2026-12-04 00:00:00,000 ERROR edge.daemon: FORGED\n.jpg").write_bytes(b"\xff\xd8junk")
    _png(tmp_path / "good.png", 1)
    with caplog.at_level("WARNING"):
        cap, q, _ = _capture(ImageFolderSource(str(tmp_path)))
    assert len(q) == 1 and cap.corrupt == 1
    [line] = [r.getMessage() for r in caplog.records if "corrupt frame skipped" in r.getMessage()]
    assert "\n" not in line and "bad\\n2026" in line


def test_a_file_over_the_pixel_limit_is_refused_not_corrupt(tmp_path, caplog):
    (tmp_path / "a-bomb.jpg").write_bytes(bomb_jpeg())
    _png(tmp_path / "b.png", 1)
    with caplog.at_level("WARNING", logger="edge.sources.capturing"):
        cap, q, _ = _capture(ImageFolderSource(str(tmp_path)))
    assert len(q) == 1
    [line] = [r.getMessage() for r in caplog.records if "a-bomb.jpg" in r.getMessage()]
    assert "refused by a limit" in line and "corrupt frame" not in line
    assert "shrink or crop the image file" in line and "send a smaller frame" not in line  # the gateway's words


def test_check_config_opens_what_the_daemon_would_open(tmp_path):
    bad_video = tmp_path / "clip.mp4"
    bad_video.write_bytes(b"\x00" * 1000)
    assert local_source_problem("file", str(bad_video)) is not None
    assert local_source_problem("file", str(make_video(tmp_path / "ok.avi", 3))) is None
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"")
    (folder / "b.png").write_bytes(b"not a png")
    (folder / "c.jpg").write_bytes(bomb_jpeg())
    problem = local_source_problem("folder", str(folder))
    assert problem is not None and problem.startswith(f"no readable image in {folder}")
    assert local_source_problem("folder", str(folder), probe=False) is None  # the source's own open
    _png(folder / "d.png", 1)
    assert local_source_problem("folder", str(folder)) is None
    hidden_only = tmp_path / "hidden"
    hidden_only.mkdir()
    _png(hidden_only / "._x.png", 1)
    assert "has no images" in (local_source_problem("folder", str(hidden_only)) or "")


@pytest.mark.parametrize("probe", [True, False])
def test_a_dataset_folder_given_as_a_folder_stream_points_at_its_images(tmp_path, probe):
    # `edgewise synth --out data` keeps the frames in data/images; uri: data was only "has no images"
    (tmp_path / "images").mkdir()
    _png(tmp_path / "images" / "s000_f000000.png", 1)
    problem = local_source_problem("folder", str(tmp_path), probe=probe) or ""
    assert problem.endswith(f"has no images (.jpg, .jpeg, .png, .bmp, .webp, .tif, .tiff, .pgm, .ppm; hidden files "
                            f"are skipped); it looks like a dataset folder: its images are in {tmp_path / 'images'}")


def test_a_looping_folder_of_bad_files_backs_off_once_per_pass(tmp_path, caplog):
    for i in range(4):
        (tmp_path / f"{i}.jpg").write_bytes(b"")

    async def run():
        q = FrameQueue(4, "wait", asyncio.Event())
        stop = asyncio.Event()
        states: List[SourceState] = []
        cap = Capturer("bad", ImageFolderSource(str(tmp_path), loop=True), q,
                       reconnect_min_s=0.01, reconnect_max_s=0.02, on_state=lambda s, st: states.append(st))
        task = asyncio.ensure_future(cap.run(stop))
        while states.count(SourceState.BACKOFF) < 3:
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.wait_for(task, 5)
        return cap, states

    with caplog.at_level(logging.ERROR):
        cap, states = asyncio.run(run())
    assert 12 <= cap.corrupt <= 16  # three whole passes of 4 files before the third back-off


def _queued(q) -> list:
    out = []
    while (f := q.get_nowait()) is not None:
        out.append(f)
    return out


def test_frames_name_the_file_and_video_frame_they_came_from(tmp_path):
    """A record must lead back to its image: a folder's frames carry their file (a bad file
    in between shifts nothing), a video's frames their index in it (the undecodable frame 10
    is skipped, so frame 11 is still 11, not 10)."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    _png(folder / "a1.png", 1)
    (folder / "a2.jpg").write_bytes(b"")  # corrupt
    _png(folder / "a3.png", 3)
    _, q, _ = _capture(ImageFolderSource(str(folder)))
    frames = _queued(q)
    assert [(f.seq, f.source_file, f.source_index) for f in frames] == [
        (0, str(folder / "a1.png"), None), (1, str(folder / "a3.png"), None)]
    video = midcorrupt_video(tmp_path / "mid.avi", 30, 10)
    _, q, _ = _capture(VideoFileSource(str(video)))
    frames = _queued(q)
    assert {f.source_file for f in frames} == {str(video)}
    assert [f.source_index for f in frames] == [i for i in range(30) if i != 10]


def test_a_looping_folder_emptied_for_a_moment_goes_on(tmp_path):
    """A sync job that replaces a looping folder's files leaves it empty for a moment: the
    stream backs off and lists it again instead of ending for good."""
    import threading

    _png(tmp_path / "a.png", 1)
    src = ImageFolderSource(str(tmp_path), loop=True)

    def refill():
        while src.pos == 0:  # the first image read: empty the folder for a moment
            threading.Event().wait(0.01)
        (tmp_path / "a.png").unlink()
        threading.Event().wait(1.5)
        _png(tmp_path / "b.png", 2)

    t = threading.Thread(target=refill)
    t.start()
    cap, q, states = _capture(src, fps=10, max_frames=3, reconnect_min_s=0.1, reconnect_max_s=0.4)
    t.join()
    values = [int(f.image[0, 0, 0]) for f in _queued(q)]
    assert values[0] == 1 and values[-1] == 2 and len(values) == 3, values
    assert SourceState.BACKOFF in states and cap.corrupt == 0  # away for a moment: no frame was corrupt


def test_a_looping_video_missing_when_a_pass_wraps_backs_off_and_goes_on(tmp_path):
    """A sync job re-copying a looping video removed it just as a pass ended: the reopen
    failed, the stream ended for good with /healthz still "ok" (and the daemon, with no other
    stream, exited). Now it backs off like a looping folder, is down meanwhile, and reads the
    file again once it is back."""
    video = make_video(tmp_path / "v.avi", 5)
    data = video.read_bytes()
    src = VideoFileSource(str(video), loop=True)

    async def run():
        q = FrameQueue(1000, "wait", asyncio.Event())
        states: List[SourceState] = []
        cap = Capturer("s", src, q, fps=20, max_frames=8, reconnect_min_s=0.05, reconnect_max_s=0.2,
                       on_state=lambda _s, st: states.append(st))
        task = asyncio.ensure_future(cap.run(asyncio.Event()))
        await async_wait_until(lambda: cap.frames >= 1, 10, "the first frame")
        video.unlink()  # the open capture reads the pass on; the reopen at its end fails
        await async_wait_until(lambda: cap.down or task.done(), 10, "the stream down while its file is away")
        assert not task.done() and SourceState.BACKOFF in states, states  # (then CONNECTING, between tries)
        video.write_bytes(data)
        await asyncio.wait_for(task, 10)
        return cap, states

    cap, states = asyncio.run(run())
    assert cap.frames == 8 and cap.corrupt == 0 and not cap.down
    assert SourceState.BACKOFF in states and states[-1] is SourceState.ENDED


def test_a_stream_backing_off_for_corrupt_frames_is_down_until_a_good_frame(tmp_path):
    """A looping folder of bad files sat in backoff delivering nothing while /healthz said "ok":
    a back-off for corrupt frames is down like one for a failed open or read (one rule)."""
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(b"")

    async def run():
        q = FrameQueue(4, "wait", asyncio.Event())
        cap = Capturer("bad", ImageFolderSource(str(tmp_path), loop=True), q, max_frames=1,
                       reconnect_min_s=0.01, reconnect_max_s=0.05)
        task = asyncio.ensure_future(cap.run(asyncio.Event()))
        await async_wait_until(lambda: cap.down, 10, "the stream down in its corrupt-frame back-off")
        _png(tmp_path / "9.png", 9)
        await asyncio.wait_for(task, 10)
        return cap

    cap = asyncio.run(run())
    assert cap.frames == 1 and not cap.down


def test_bad_files_in_a_paced_folder_do_not_use_up_the_frame_period(tmp_path):
    """With fps 2, one good and four bad files gave 0.4 good frames/s: each bad file waited a
    period. Skipped files are read at once, so two good frames take one period, not five."""
    _png(tmp_path / "a.png", 1)
    for name in "bcde":
        (tmp_path / f"{name}.jpg").write_bytes(b"junk")
    t0 = time.monotonic()
    cap, q, _ = _capture(ImageFolderSource(str(tmp_path), loop=True), fps=2, max_frames=2)
    elapsed = time.monotonic() - t0
    assert len(q) == 2 and cap.corrupt == 4
    assert elapsed < 2.0, f"{elapsed:.2f} s: the bad files were paced (5 periods = 2.5 s)"


def test_a_file_gone_between_listing_and_reading_is_not_a_corrupt_frame(tmp_path, caplog):
    """A file deleted or renamed after the folder was listed was logged and counted as a
    corrupt frame (edgewise_edge_corrupt_frames_total); it is no frame at all."""
    for i in range(3):
        _png(tmp_path / f"{i}.png", i + 1)

    class Churned(ImageFolderSource):
        def open(self) -> None:
            super().open()
            (tmp_path / "1.png").unlink()  # a sync job, right after the listing

    with caplog.at_level("WARNING"):
        cap, q, _ = _capture(Churned(str(tmp_path)))
    assert [int(f.image[0, 0, 0]) for f in _queued(q)] == [1, 3] and cap.corrupt == 0
    assert not [r for r in caplog.records if "1.png" in r.getMessage()]


def test_a_corrupt_stretch_in_the_middle_of_a_video_is_read_past_and_counted(tmp_path, caplog):
    """Ten undecodable frames in a row (more than the old limit of 5 failed reads) ended the
    video there, logged as a "truncated or corrupt tail" although the frames after them decode;
    they were not counted as corrupt either. A true truncated tail still ends the video."""
    video = midcorrupt_video(tmp_path / "mid.avi", 30, 10, run=10)
    src = VideoFileSource(str(video))
    with caplog.at_level("WARNING", logger="edge.sources.opencv"):
        frames = read_all(src)
    assert len(frames) == 20 and src.corrupt == 10 and src.truncated == 0
    assert not [r for r in caplog.records if "corrupt tail" in r.getMessage()]
    cap, q, _ = _capture(VideoFileSource(str(video)))
    assert [f.source_index for f in _queued(q)] == [i for i in range(30) if not 10 <= i < 20]
    assert cap.corrupt == 10
    tail = midcorrupt_video(tmp_path / "tail.avi", 30, 20, run=10)  # the last ten frames undecodable
    src = VideoFileSource(str(tail))
    assert len(read_all(src)) == 20 and src.truncated == 1 and src.corrupt == 0


def test_a_looping_video_goes_on_while_a_hung_camera_is_being_opened(tmp_path):
    """OpenCV's FFmpeg backend opens one capture at a time per process. A looping video was
    opened again at every pass, so each pass waited behind an RTSP camera being opened at a
    host that accepts the connection and never answers (a hung camera), for that open's whole
    timeout: beside such a camera a 15 fps loop fell to 5 fps. An unchanged file is rewound
    instead; a file changed since it was opened is still opened again."""
    video = make_video(tmp_path / "v.avi", 3)
    src = VideoFileSource(str(video), loop=True)
    src.open()
    first = [src.read() for _ in range(3)]
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(1)
    accepted = []
    threading.Thread(target=lambda: accepted.append(hung.accept()), daemon=True).start()
    url = f"rtsp://127.0.0.1:{hung.getsockname()[1]}/cam"
    opener = threading.Thread(target=lambda: cv2.VideoCapture(
        url, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 2000, cv2.CAP_PROP_READ_TIMEOUT_MSEC, 2000]))
    opener.start()
    try:
        wait_until(lambda: accepted, 5, "the camera's open to reach the hung host")
        t0 = time.monotonic()
        again = [src.read() for _ in range(3)]  # the next pass
        took = time.monotonic() - t0
        assert took < 1.0, f"the next pass waited {took:.1f} s for the camera's open"
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
    finally:
        opener.join(10)
        hung.close()
        for conn, _ in accepted:
            conn.close()
    make_video(video, 2)  # rewritten: the next pass reads the new file
    assert src.read() is not None and src.expected == 2
    src.close()


def test_a_looping_video_that_does_not_seek_back_is_opened_again_at_each_pass(tmp_path):
    """A format whose seek says yes and moves nothing reads no frame after a rewind: the pass
    is opened again at once (no back-off, not "away"), and later passes open it again too."""
    video = make_video(tmp_path / "v.avi", 3)
    src = VideoFileSource(str(video), loop=True)
    src.open()

    class NoSeek:
        def __init__(self, cap):
            self.cap = cap

        def set(self, *_):
            return True  # and stays where it is

        def __getattr__(self, name):
            return getattr(self.cap, name)

    src.cap = NoSeek(src.cap)
    frames = [src.read() for _ in range(7)]
    assert all(f is not None for f in frames) and not src.seekable
    values = [int(f[5, 5, 0]) for f in frames]
    assert values == values[:3] * 2 + values[:1] and len(set(values[:3])) == 3
    src.close()


def test_an_uncapped_video_places_its_frames_on_the_recording_timeline(tmp_path):
    """Read as fast as it can be (no ``fps``), a 10 fps video's frames lie 0.1 s apart on its
    own timeline, an undecodable frame's time included and on across the passes of a loop
    (the frame after the last of a pass one period later, rewound or reopened); the
    policy runs on it (``edge.pipeline``). Paced by ``fps``, a file is replayed as a camera
    and carries none: the daemon's clock is its time."""
    video = midcorrupt_video(tmp_path / "mid.avi", 12, 4)
    _, q, _ = _capture(VideoFileSource(str(video), loop=True), max_frames=25)
    times = [f.media_s for f in _queued(q)]
    expected = [p * 1.2 + i / 10 for p in range(3) for i in range(12) if i != 4][:25]
    assert times == pytest.approx(expected)
    _, q, _ = _capture(VideoFileSource(str(video)), fps=200, max_frames=3)
    assert [f.media_s for f in _queued(q)] == [None] * 3
    src = VideoFileSource(str(video), loop=True)
    src.seekable = False  # each pass opens the file again
    _, q, _ = _capture(src, max_frames=14)
    assert [f.media_s for f in _queued(q)][10:] == pytest.approx([1.1, 1.2, 1.3, 1.4])


def _recorder_webm(path: Path, frames: int = 12) -> Path:
    """A WebM as a browser's MediaRecorder writes one: no frame duration in its track, no
    duration in its header, frames at uneven times (OpenCV writes all three; they are turned
    into Void elements and the blocks' times moved by up to 35 ms). FFmpeg then states the
    container's time base, 1000 fps, as its rate, and no frame count."""
    import random

    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"VP80"), 10, (64, 48))
    assert w.isOpened()
    for i in range(frames):
        w.write(np.full((48, 64, 3), (i * 20) % 255, np.uint8))
    w.release()
    b = bytearray(path.read_bytes())
    rng = random.Random(1)

    def vint(i: int, marker: bool) -> tuple:
        n = 1
        while not b[i] & (0x80 >> (n - 1)):
            n += 1
        v = b[i] if marker else b[i] & (0xFF >> n)
        for k in range(1, n):
            v = (v << 8) | b[i + k]
        return v, n

    def walk(i: int, end: int) -> None:
        while i < end:
            eid, n1 = vint(i, True)
            size, n2 = vint(i + n1, False)
            data = i + n1 + n2
            if eid in (0x18538067, 0x1549A966, 0x1654AE6B, 0xAE, 0x1F43B675):  # Segment, Info, Tracks, TrackEntry, Cluster
                walk(data, min(end, data + size))
            elif eid in (0x23E383, 0x4489):  # DefaultDuration, Duration: a Void of the same length
                b[i:data + size] = bytes([0xEC, 0x80 | (data + size - i - 2)]) + bytes(data + size - i - 2)
            elif eid == 0xA3:  # SimpleBlock: track, then its time in the cluster (ms)
                at = data + vint(data, False)[1]
                t = int.from_bytes(b[at:at + 2], "big", signed=True)
                b[at:at + 2] = (max(0, t + rng.randint(-35, 35)) if t else 0).to_bytes(2, "big", signed=True)
            i = data + size

    walk(0, len(b))
    path.write_bytes(bytes(b))
    return path


def test_a_video_that_states_its_time_base_as_its_rate_is_on_the_daemons_clock(tmp_path):
    """A browser's WebM recording states no rate: FFmpeg gives its time base, 1000 fps, which
    ``frame_period`` took for a rate (it refused only rates above 1000). Read without ``fps``,
    the video's timeline then ran 1 ms a frame, 33 times slower than the recording: a policy's
    2 s cooldown held for 2,000 frames (over a minute of it) and maxPerSecond 2 let 2 frames of
    a thousand through. 1000 fps is the time base too: the rate is unknown, and the stream's
    policy runs on the daemon's clock, as for any video without a stated rate."""
    video = _recorder_webm(tmp_path / "recorded.webm")
    probe = cv2.VideoCapture(str(video))
    assert probe.get(cv2.CAP_PROP_FPS) == 1000.0  # what FFmpeg says of such a file
    probe.release()
    _, q, _ = _capture(VideoFileSource(str(video)), max_frames=12)
    frames = _queued(q)
    assert len(frames) == 12 and [f.media_s for f in frames] == [None] * 12
