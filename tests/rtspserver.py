"""A real RTSP camera for tests and benchmarks: GStreamer's gst-rtsp-server.

Runs under Debian's system ``/usr/bin/python3`` (PyGObject from ``python3-gi``;
``gir1.2-gst-rtsp-server-1.0``, ``gstreamer1.0-rtsp``, ``gstreamer1.0-plugins-good``
and ``-ugly`` for x264), not the project's venv:

    /usr/bin/python3 tests/rtspserver.py --port 0 --fps 25 --size 320x240 --codec h264

serves a live ``videotestsrc`` (a moving ball) at ``rtsp://127.0.0.1:PORT/cam``,
encoded as H.264 (x264, zero-latency tuning) or MJPEG (RTP/JPEG, RFC 2435). One
encoder is shared by every client (``set_shared``), so N connections cost the
server one encode, like N clients of one camera. ``--user``/``--password`` require
HTTP Basic authentication (``GstRtspServer.RTSPAuth``). When the socket listens it
prints ``READY <port>`` on stdout. Driven by ``tests/rtsp.py``.
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

ENCODERS = {
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bitrate=1000 "
            "! rtph264pay name=pay0 pt=96 config-interval=1",
    "mjpeg": "jpegenc quality=70 ! rtpjpegpay name=pay0 pt=26",
}


def launch_line(width: int, height: int, fps: int, codec: str) -> str:
    return (f"( videotestsrc is-live=true pattern=ball ! video/x-raw,width={width},height={height},"
            f"framerate={fps}/1 ! videoconvert ! video/x-raw,format=I420 ! "
            + ENCODERS[codec].format(fps=fps) + " )")


def main() -> int:
    ap = argparse.ArgumentParser(description="serve a live test pattern over RTSP")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--size", default="320x240", help="WxH")
    ap.add_argument("--codec", choices=sorted(ENCODERS), default="h264")
    ap.add_argument("--mount", default="/cam")
    ap.add_argument("--user", default="")
    ap.add_argument("--password", default="")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch_line(width, height, args.fps, args.codec))
    factory.set_shared(True)
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "camera-user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password), token)
        server.set_auth(auth)
        perms = GstRtspServer.RTSPPermissions()
        perms.add_role_from_structure(Gst.Structure.new_from_string(
            "camera-user, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"))
        factory.set_permissions(perms)
    server.get_mount_points().add_factory(args.mount, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_HIGH, sig, loop.quit)
    print(f"READY {server.get_bound_port()}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
