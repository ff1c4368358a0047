"""How live streams are opened (``edge.sources.live``) and stamped (``edge.sources.clock``).

Pure functions, plus the Jetson pipeline's shape run for real: the same
``rtspsrc ! depay ! parse ! decoder ! convert ! appsink`` string with software
elements in place of ``nvv4l2decoder``/``nvvidconv``, under Debian's GStreamer,
against the RTSP test camera with credentials (the PyPI OpenCV has no GStreamer,
so the pipeline cannot be opened through ``cv2`` here).
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edge.settings import load_settings
from edge.sources import CaptureSource
from edge.sources.clock import READ, STREAM, SourceClock
from edge.sources.live import (
    choose_backend,
    ffmpeg_options,
    latest_appsink,
    opencv_video_io,
    redact_uri,
    rtsp_pipeline,
    stall_timeout,
)
from edgewise.errors import ConfigError
from tests.rtsp import SYSTEM_PYTHON, RtspCamera, missing

MS = 1_000_000  # ns


# --------------------------------------------------------------------------- clock
def test_steady_stream_is_stamped_with_its_own_timestamps():
    clock = SourceClock()
    t0 = 1_700_000_000_000 * MS
    jitter = [3, 0, 7, 2, 5, 1, 9, 0, 4]  # ms of network/decode delay per frame
    out = [clock.stamp(1000.0 + 40.0 * i, t0 + (40 * i + d) * MS) for i, d in enumerate(jitter)]
    assert out[0] == (t0 + 3 * MS, READ)  # the first frame anchors the mapping
    assert all(c == STREAM for _, c in out[1:])
    # Offset = least-delayed frame (delay 0): every frame's age is its own delay (less
    # the drift allowance, 1 ms per second of stream).
    ages = [(t0 + (40 * i + d) * MS - s) / MS for i, ((s, _), d) in enumerate(zip(out, jitter))]
    assert ages[1:] == pytest.approx(jitter[1:], abs=0.4)


def test_a_reader_that_falls_behind_shows_a_growing_age():
    clock = SourceClock()
    t0 = 5_000 * MS
    ages = []
    for i in range(50):  # frames 40 ms apart on the camera, read 200 ms apart (the bug)
        read = t0 + 200 * i * MS
        s, _ = clock.stamp(40.0 * (i + 1), read)
        ages.append((read - s) / 1e9)
    assert ages[10] == pytest.approx(1.6, abs=0.01) and ages[-1] == pytest.approx(7.84, abs=0.01)


def test_camera_clock_drift_is_followed_not_reported_as_delay():
    for ppm in (-500, 500):  # camera clock faster / slower than ours
        clock = SourceClock()
        worst = 0.0
        for i in range(1, 3600 * 5):  # one hour at 5 frames/s
            read = 10**12 + i * 200 * MS
            s, _ = clock.stamp(i * 200.0 * (1 + ppm * 1e-6), read)
            worst = max(worst, (read - s) / 1e9)
        assert worst < 0.01, (ppm, worst)


def test_a_wall_clock_step_moves_the_stamps_not_the_ages():
    """NTP steps the wall clock by +26 s, then -5 s, mid-stream (the monotonic clock runs
    on): each frame's age stays its own delay, and its wall time follows the clock as it
    now reads. Mapped on the wall clock, the +26 s would read as 26 s of age per frame
    until the next reconnect (the offset only rises by the drift allowance)."""
    clock = SourceClock()
    mono0, wall0 = 3_000 * MS, 1_700_000_000_000 * MS
    for i in range(300):  # 25 fps camera read every 5th frame: 200 ms apart, 2-6 ms delay
        delay = 2 + i % 5
        mono = mono0 + (200 * i + delay) * MS
        step = 26_000 * MS if 100 <= i < 200 else (21_000 * MS if i >= 200 else 0)
        wall = wall0 + (mono - mono0) + step
        stamped, how = clock.stamp(200.0 * i + 40.0, wall, mono)
        if i == 0:
            assert (stamped, how) == (wall, READ)
            continue
        assert how == STREAM
        # The age is the delay beyond the least-delayed frame (2 ms), less the drift allowance
        # (0.2 ms per frame since that frame), on whichever wall clock.
        assert (wall - stamped) / MS == pytest.approx(delay - 2, abs=1.0), i
        assert (stamped - (wall0 + step)) / MS == pytest.approx(200 * i + 2, abs=1.0), i


def test_unusable_timestamps_fall_back_to_the_read_time():
    clock = SourceClock()
    assert clock.stamp(None, 10 * MS) == (10 * MS, READ)
    assert clock.stamp(0.0, 20 * MS) == (20 * MS, READ)  # OpenCV's "unknown"
    assert clock.stamp(float("nan"), 30 * MS) == (30 * MS, READ)
    assert clock.stamp(float("inf"), 35 * MS) == (35 * MS, READ)  # a corrupt stream's PTS
    clock.stamp(500.0, 40 * MS)
    assert clock.stamp(540.0, 80 * MS) == (80 * MS, STREAM)
    assert clock.stamp(580.0, 125 * MS) == (120 * MS + 45_000, STREAM)  # 5 ms late; 1e-3 x 45 ms drift allowance
    assert clock.stamp(100.0, 120 * MS) == (120 * MS, READ)  # went backwards: a new anchor
    assert clock.stamp(140.0, 160 * MS) == (160 * MS, STREAM)


# --------------------------------------------------------------------------- opening
def test_redact_uri():
    assert redact_uri("rtsp://admin:pa:ss@10.0.0.5:554/Streaming/101") == "rtsp://admin:***@10.0.0.5:554/Streaming/101"
    assert redact_uri("rtsp://10.0.0.5/cam") == "rtsp://10.0.0.5/cam"
    assert redact_uri("rtsp://admin@10.0.0.5/cam") == "rtsp://admin@10.0.0.5/cam"
    assert redact_uri("http://cam/video.cgi?user=a&password=b0b&x=1") == "http://cam/video.cgi?user=a&password=***&x=1"
    assert redact_uri(rtsp_pipeline("rtsp://u:secret@h/s")).count("secret") == 0
    assert redact_uri("rtspsrc location=rtsp://u:p@h/s user-pw=secret ! fakesink").count("secret") == 0


@pytest.mark.parametrize("uri, shown", [
    # FFmpeg takes the user info up to the LAST '@' before the path: 'p@ss' is the password
    ("rtsp://admin:p@ssw0rd@10.0.0.5/cam", "rtsp://admin:***@10.0.0.5/cam"),
    ("rtsp://me@example.com:secret@10.0.0.5/cam", "rtsp://me@example.com:***@10.0.0.5/cam"),
    # '/', '?' or '#' written unescaped in a password: hidden too, not logged in clear
    ("rtsp://admin:pa/ss@10.0.0.5/cam", "rtsp://admin:***@10.0.0.5/cam"),
    ("rtsp://admin:pa?ss@10.0.0.5/cam", "rtsp://admin:***@10.0.0.5/cam"),
    ("rtsp://admin:pass#1@10.0.0.5/cam", "rtsp://admin:***@10.0.0.5/cam"),
    ("rtsp://cam/live?user=a&passwd=hunter2&ch=1", "rtsp://cam/live?user=a&passwd=***&ch=1"),
    ("http://cam/mjpg?token=abc123", "http://cam/mjpg?token=***"),
    # an '@' after the path is not user info; a host:port is not a password
    ("rtsp://10.0.0.5:554/cam?a=b@c", "rtsp://10.0.0.5:554/cam?a=b@c"),
    ("rtsp://admin:secret@10.0.0.5:554/cam?a=b@c", "rtsp://admin:***@10.0.0.5:554/cam?a=b@c"),
    ("rtsp://[fd00::5]:554/cam@x", "rtsp://[fd00::5]:554/cam@x"),
    ("cannot open rtsp source rtsp://u:s@cr@t@h/s; retrying", "cannot open rtsp source rtsp://u:***@h/s; retrying"),
    # a blank written unescaped in a password: FFmpeg logs in with 'my secret' (a probe's HTTP
    # camera got 'Authorization: Basic admin:pw 2'), and the whole of it was logged in clear
    ("rtsp://admin:my secret@10.0.0.5/cam", "rtsp://admin:***@10.0.0.5/cam"),
    ("cannot open http source http://admin:pw 2@10.0.0.5:80/x.mjpg: nothing listens at 10.0.0.5:80",
     "cannot open http source http://admin:***@10.0.0.5:80/x.mjpg: nothing listens at 10.0.0.5:80"),
    ("rtsp://admin:a b@c@10.0.0.5/cam", "rtsp://admin:***@10.0.0.5/cam"),
    ("rtsp://admin:tab\there@10.0.0.5:554", "rtsp://admin:***@10.0.0.5:554"),
    # a blank in the user name: FFmpeg logs in as 'my user' with the password 'pw' (the user
    # info runs to the last '@' before the host), which was logged in clear
    ("rtsp://my user:pw@10.0.0.5/cam", "rtsp://my user:***@10.0.0.5/cam"),
    ("cannot open rtsp source rtsp://site admin:pw 2@10.0.0.5:554/cam; retrying",
     "cannot open rtsp source rtsp://site admin:***@10.0.0.5:554/cam; retrying"),
    ("rtsp://my user@10.0.0.5/cam", "rtsp://my user@10.0.0.5/cam"),  # no password: nothing hidden
    # blanks after a host:port are not a password
    ("stream a: rtsp rtsp://10.0.0.5:554/cam via ffmpeg, latest-frame capture",
     "stream a: rtsp rtsp://10.0.0.5:554/cam via ffmpeg, latest-frame capture"),
])
def test_redact_uri_hides_passwords_ffmpeg_accepts(uri, shown):
    assert redact_uri(uri) == shown


def test_ffmpeg_options_follow_the_ffmpeg_version():
    assert ffmpeg_options("rtsp", "tcp", 5.0, 62) == "rtsp_transport;tcp|timeout;5000000"
    assert ffmpeg_options("rtsp", "udp", 2.5, 58) == "rtsp_transport;udp|stimeout;2500000"  # FFmpeg 4
    assert ffmpeg_options("http", "tcp", 5.0, 58) == "timeout;5000000"


@pytest.mark.parametrize("kind,setting,gst,hw,expected", [
    ("rtsp", "auto", True, True, "gstreamer"),
    ("rtsp", "auto", True, False, "ffmpeg"),
    ("rtsp", "auto", False, True, "ffmpeg"),
    ("rtsp", "ffmpeg", True, True, "ffmpeg"),
    ("rtsp", "gstreamer", True, False, "gstreamer"),
    ("http", "gstreamer", True, True, "ffmpeg"),
    ("camera", "auto", True, True, "v4l2"),
    ("gstreamer", "auto", True, True, "gstreamer"),
])
def test_backend_choice(kind, setting, gst, hw, expected):
    backend, why = choose_backend(kind, setting, gst, hw)
    assert backend == expected and why


def test_forcing_gstreamer_without_it_is_a_settings_error():
    with pytest.raises(ValueError, match="built without GStreamer"):
        choose_backend("rtsp", "gstreamer", False, True)
    if opencv_video_io()[0]:
        pytest.skip("this OpenCV has GStreamer")
    with pytest.raises(ConfigError, match=r"streams\[0\]\.backend.*built without GStreamer"):
        load_settings(overrides={"streams": [{"id": "a", "kind": "rtsp", "uri": "rtsp://h/s",
                                              "backend": "gstreamer"}]}, env={})


def test_jetson_pipeline_shape():
    p = rtsp_pipeline("rtsp://cam/s", "tcp", "h264", 5.0)
    assert ('rtspsrc location="rtsp://cam/s" protocols=tcp latency=0 tcp-timeout=5000000 timeout=5000000 '
            "! rtph264depay ! h264parse ! nvv4l2decoder ! nvvidconv ! video/x-raw,format=BGRx ! videoconvert ! "
            "video/x-raw,format=BGR ! appsink drop=true max-buffers=1 sync=false") == p
    assert "rtph265depay ! h265parse" in rtsp_pipeline("rtsp://cam/s", codec="h265")


def test_latest_appsink():
    p, added = latest_appsink("v4l2src ! videoconvert ! appsink")
    assert p == "v4l2src ! videoconvert ! appsink drop=true max-buffers=1" and added == "drop=true max-buffers=1"
    p, added = latest_appsink("nvarguscamerasrc ! nvvidconv ! appsink max-buffers=2 sync=false")
    assert p.endswith("appsink max-buffers=2 sync=false drop=true") and added == "drop=true"
    same = "videotestsrc ! appsink drop=1 max-buffers=1"
    assert latest_appsink(same) == (same, None)
    src = CaptureSource("gstreamer", "videotestsrc ! videoconvert ! appsink")
    assert src.pipeline.endswith("appsink drop=true max-buffers=1")
    assert src.describe().endswith("via gstreamer (kind gstreamer; appsink drop=true max-buffers=1 added)")
    with pytest.raises(ValueError, match="must end in"):
        latest_appsink("videotestsrc ! appsink ! fakesink")
    with pytest.raises(ConfigError, match=r"streams\[0\]\.uri.*appsink"):
        load_settings(overrides={"streams": [{"id": "a", "kind": "gstreamer", "uri": "v4l2src ! fakesink"}]},
                      env={})


def test_stall_timeout_defaults_to_a_few_frame_periods():
    assert stall_timeout(3.0, 25.0) == 3.0
    assert stall_timeout(0.0, 25.0) == 1.0
    assert stall_timeout(0.0, 2.0) == 2.5
    assert stall_timeout(0.0, 0.0) == 2.0
    assert stall_timeout(0.0, 90000.0) == 2.0  # a nonsense rate reported by a backend


def test_a_slow_camera_gets_five_of_its_frame_periods():
    """A camera sending one frame every 5 s (FFmpeg reports 0.2 fps) was given the 2 s of an
    unknown rate, so it was declared down before each of its frames and never streamed."""
    assert stall_timeout(0.0, 0.2) == 25.0
    assert stall_timeout(0.0, 0.5) == 10.0
    assert stall_timeout(0.0, 0.01) == 60.0  # at most a minute, however slow the stated rate
    assert stall_timeout(0.0, -1.0) == 2.0


PULL = """
import json, sys
import gi
gi.require_version("Gst", "1.0")
from gi.repository import Gst
Gst.init(None)
pipe = Gst.parse_launch(sys.argv[1])
_, sink = pipe.iterate_sinks().next()
pipe.set_state(Gst.State.PLAYING)
sample = sink.emit("try-pull-sample", 20 * Gst.SECOND)
caps = sample.get_caps().get_structure(0) if sample else None
pipe.set_state(Gst.State.NULL)
print(json.dumps({"sample": sample is not None, "format": caps and caps.get_value("format"),
                  "width": caps and caps.get_value("width"), "drop": sink.get_property("drop"),
                  "max_buffers": sink.get_property("max-buffers")}))
"""


@pytest.mark.skipif(bool(missing()), reason=missing() or "")
def test_jetson_pipeline_runs_with_software_elements():
    """The hardware pipeline's string, with avdec_h264/videoconvert standing in for
    nvv4l2decoder/nvvidconv, pulls BGR frames from a camera that needs credentials."""
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import gi; gi.require_version('Gst', '1.0'); "
                            "from gi.repository import Gst; Gst.init(None); "
                            "import sys; sys.exit(0 if Gst.ElementFactory.find('avdec_h264') else 3)"])
    if probe.returncode:
        pytest.skip("avdec_h264 is missing (gstreamer1.0-libav; make test installs it)")
    cam = RtspCamera(fps=25, user="viewer", password="pw").start()
    try:
        p = rtsp_pipeline(cam.url, "tcp", "h264", 5.0, decoder="avdec_h264", convert="videoconvert")
        out = subprocess.run([SYSTEM_PYTHON, "-c", PULL, p], capture_output=True, text=True, timeout=60)
    finally:
        cam.stop()
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got == {"sample": True, "format": "BGR", "width": 320, "drop": True, "max_buffers": 1}


@pytest.mark.parametrize("uri, want", [
    ("rtsp://cam.local/stream", ("cam.local", 554)),
    ("rtsp://admin:p@ss@10.0.0.5:8554/live?x=1", ("10.0.0.5", 8554)),
    ("rtsps://[fd00::5]/s", ("fd00::5", 322)),
    ("http://[fd00::5]:8080/mjpg", ("fd00::5", 8080)),
    ("https://cam/x", ("cam", 443)),
    ("rtsp://cam:99999/x", None),
    ("rtsp:///x", None),
    ("0", None),
    ("videotestsrc ! appsink", None),
])
def test_host_port_of_a_camera_url(uri, want) -> None:
    from edge.sources.live import host_port

    assert host_port(uri) == want


def test_a_failed_open_says_whether_anything_answers() -> None:
    """`cannot open rtsp source` read the same for a dead camera, a wrong port and a wrong
    path; one TCP connect now tells them apart (real sockets: a closed port, a listener)."""
    from edge.sources.answers import why_unopened
    from edge.sources.base import SourceError
    from tests.conftest import free_port
    from tests.listener import Listener

    closed = free_port()
    assert why_unopened(f"rtsp://127.0.0.1:{closed}/cam") == (
        f"nothing listens at 127.0.0.1:{closed} (connection refused); is the camera on, and the port right?")
    srv = Listener()  # answers TCP, speaks no RTSP: as a wrong path or password reads
    try:
        assert why_unopened(f"rtsp://u:secret@127.0.0.1:{srv.port}/wrong").startswith(
            f"127.0.0.1:{srv.port} answers, but the stream did not open: check the path and the credentials")
    finally:
        srv.close()
    src = CaptureSource("rtsp", f"rtsp://u:secret@127.0.0.1:{closed}/cam", io_timeout_s=1.0)
    with pytest.raises(SourceError) as err:
        src.open()
    said = str(err.value)
    assert said.startswith("cannot open rtsp source rtsp://u:***@127.0.0.1") and "connection refused" in said
    assert "secret" not in said


def test_a_hung_camera_is_not_blamed_on_the_path_or_the_credentials() -> None:
    """A camera that worked and then hung (TCP accepts, nothing answers) read "answers, but
    the stream did not open: check the path and the credentials". An open that took its whole
    time limit now says the camera did not answer within it."""
    from edge.sources.answers import why_unopened
    from edge.sources.base import SourceError
    from tests.listener import Listener

    class Hung(Listener):
        def __init__(self) -> None:
            self.held: list = []
            super().__init__()

        def on_connection(self, conn) -> None:
            self.held.append(conn)  # accepted, never answered

    srv = Hung()
    try:
        src = CaptureSource("rtsp", f"rtsp://127.0.0.1:{srv.port}/cam", open_timeout_s=1.0, io_timeout_s=1.0)
        with pytest.raises(SourceError) as err:
            src.open()
        said = str(err.value)
        assert "did not answer within" in said and "check the path" not in said, said
        # an open refused at once (a wrong path, a 401) still points at the path and the credentials
        assert "check the path" in why_unopened(f"rtsp://127.0.0.1:{srv.port}/cam", 1.0, 0.05, 1.0)
    finally:
        srv.close()  # first: no connection is accepted after the ones closed here
        time.sleep(0.1)  # (one accepted as it closed is handed over meanwhile)
        for conn in srv.held:
            conn.close()


class _Camera(BaseHTTPRequestHandler):
    """An HTTP camera that answers each path with what its name says (``/404``, ``/302``,
    ``/page``); only ``admin:p@ss`` (HTTP Basic) may see ``/auth``."""

    protocol_version = "HTTP/1.0"

    def log_message(self, *args: object) -> None:
        pass

    #: (path, the Authorization header or None) of every request, in order
    seen: list = []

    def do_GET(self) -> None:
        path = self.path.strip("/")
        _Camera.seen.append((path, self.headers.get("Authorization")))
        if path == "digest":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Digest realm="cam", nonce="abc", qop="auth"')
            self.end_headers()
            return
        if path == "auth":
            good = "Basic " + base64.b64encode(b"admin:p@ss").decode()
            status = 200 if self.headers.get("Authorization") == good else 401
        else:
            status = int(path) if path.isdigit() else 200
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="cam"')
        if status == 302:
            self.send_header("Location", "http://u:secret@127.0.0.1:1/elsewhere")
        self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=f" if path == "auth" and status == 200
                         else "text/html")
        self.end_headers()
        self.wfile.write(b"<html>login</html>")


@pytest.mark.parametrize("path, said", [
    ("404", "has no stream at that path (HTTP 404 Not Found): check the path"),
    ("500", "failed to serve the stream (HTTP 500 Internal Server Error): restart the camera"),
    ("403", "refuses access (HTTP 403 Forbidden): check the user's rights on the camera"),
    ("302", "redirects (HTTP 302 Found) to http://u:***@127.0.0.1:1/elsewhere, where the stream did not open"),
    ("page", "answers with a web page (text/html), not a video stream: give the camera's MJPEG stream URL"),
    ("auth", "asks for credentials (HTTP 401 Unauthorized): give them in the URL"),
])
def test_a_failed_http_open_says_what_the_camera_answered(path: str, said: str) -> None:
    """An HTTP camera that answered 401, 403, 404, 500, a redirect or a web page all read
    `answers, but the stream did not open: check the path and the credentials` (FFmpeg tells
    its HTTP error to stderr only); the answer's status now names the cause (a real server)."""
    from edge.sources.base import SourceError

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SourceError) as err:
            CaptureSource("http", f"http://127.0.0.1:{httpd.server_address[1]}/{path}", io_timeout_s=2.0).open()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert said in str(err.value) and "secret" not in str(err.value), err.value


def test_http_credentials_are_checked_as_ffmpeg_reads_them() -> None:
    """The user info ends at the last '@' (FFmpeg's rule), percent-escapes are undone, and a
    wrong password is named as such; the right one is not blamed."""
    from edge.sources.answers import stream_answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    try:
        assert stream_answer(f"http://admin:p@ss@127.0.0.1:{port}/auth") is None
        assert stream_answer(f"http://admin:p%40ss@127.0.0.1:{port}/auth") is None
        assert stream_answer(f"http://admin:wrong@127.0.0.1:{port}/auth") == (
            "refuses the credentials (HTTP 401 Unauthorized): check the user and the password")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_password_is_sent_only_after_the_camera_asks_for_basic_authentication() -> None:
    """The check sent the URL's password as Basic authentication with its first request, so a
    camera that speaks Digest had it cross the network readable; it is now sent only after a
    401 asking for Basic, as FFmpeg does, and never to a camera asking for Digest."""
    from edge.sources.answers import stream_answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    _Camera.seen.clear()
    try:
        assert stream_answer(f"http://admin:p%40ss@127.0.0.1:{port}/digest") is None  # not judged
        assert _Camera.seen == [("digest", None)]
        _Camera.seen.clear()
        assert stream_answer(f"http://admin:p%40ss@127.0.0.1:{port}/404") is not None
        assert _Camera.seen == [("404", None)]
        _Camera.seen.clear()
        assert stream_answer(f"http://admin:p%40ss@127.0.0.1:{port}/auth") is None
        assert [a is None for _, a in _Camera.seen] == [True, False]  # asked, then sent
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_camera_that_does_not_open_says_why(tmp_path) -> None:
    """`cannot open camera source 0` read the same for a camera unplugged, a path that is no
    device and a device that refused (held by another process); each is named now. Real
    paths: a missing one, a regular file, /dev/null (a device, not a capture node)."""
    from edge.sources.base import SourceError

    not_a_device = tmp_path / "video0"
    not_a_device.write_bytes(b"")
    cases = [(str(tmp_path / "video7"), "video7 does not exist; is the camera plugged in?"),
             (str(not_a_device), "video0 is not a device; give a V4L2 device (/dev/videoN) or its index"),
             ("/dev/null", "/dev/null exists but did not open: another process may hold it, or it is not a capture")]
    for uri, said in cases:
        with pytest.raises(SourceError) as err:
            CaptureSource("camera", uri).open()
        assert said in str(err.value), err.value


@pytest.mark.skipif(bool(missing()), reason=missing() or "")
def test_a_failed_rtsp_open_says_what_the_camera_answered() -> None:
    """An RTSP camera asking for credentials, refusing them, or with no stream at the path
    read alike: `answers, but the stream did not open: check the path and the credentials`.
    Its answer to a DESCRIBE now names which (a real gst-rtsp-server with Basic auth)."""
    from edge.sources.base import SourceError

    cam = RtspCamera(user="admin", password="p@ss").start()
    try:
        cases = [("", "/cam", "asks for credentials (RTSP 401 Unauthorized): give them in the URL, rtsp://"),
                 ("admin:wrong@", "/cam", "refuses the credentials (RTSP 401 Unauthorized): check the user"),
                 ("admin:p@ss@", "/nope", "has no stream at that path (RTSP 404 Not Found): check the path")]
        for creds, path, said in cases:
            with pytest.raises(SourceError) as err:
                CaptureSource("rtsp", f"rtsp://{creds}127.0.0.1:{cam.port}{path}", io_timeout_s=2.0).open()
            assert said in str(err.value) and "wrong" not in str(err.value), err.value
    finally:
        cam.stop()
