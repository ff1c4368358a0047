"""How a live stream is opened: backend choice, FFmpeg options, GStreamer pipelines, redaction.

Pure functions (docs/design/edge-runtime.md#live-sources), used by
``edge.sources.opencv.CaptureSource`` and ``--describe-settings``:

* ``choose_backend``: ``kind: rtsp`` decodes through a GStreamer pipeline with
  the Jetson hardware decoder (``nvv4l2decoder``) when OpenCV was built with
  GStreamer and the decoder plugin is installed, else through FFmpeg.
* ``ffmpeg_options``: the per-stream ``OPENCV_FFMPEG_CAPTURE_OPTIONS`` string
  (``key;value|key;value``, read by OpenCV's FFmpeg backend at every open):
  ``rtsp_transport`` and the socket I/O timeout, whose option name changed in
  FFmpeg 5 (``stimeout`` became ``timeout``; in FFmpeg 4 ``timeout`` puts the RTSP
  demuxer in listen mode).
* ``rtsp_pipeline`` / ``latest_appsink``: GStreamer pipelines whose ``appsink``
  keeps only the newest buffer (``drop=true max-buffers=1``).
* ``redact_uri``: ``rtsp://user:***@host/...``, the only form a URL is logged in.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from typing import Optional, Tuple

from edge.sources.clock import frame_period
from edgewise.addresses import parse_hostport
from edgewise.errors import ConfigError

BACKENDS = ("auto", "ffmpeg", "gstreamer")
RTSP_TRANSPORTS = ("tcp", "udp")
CODECS = ("h264", "h265")
#: The Jetson's V4L2 hardware decoder plugin (L4T's nvidia-l4t-gstreamer package).
JETSON_DECODER_PLUGIN = "/usr/lib/aarch64-linux-gnu/gstreamer-1.0/libgstnvvideo4linux2.so"
#: The longest default ``stall_timeout`` (a source reporting a very low rate).
SLOW_STALL_MAX_S = 60.0
_APPSINK = re.compile(r"(?:^|!)\s*appsink\b([^!]*)$")


_SECRET_PARAM = re.compile(
    r"(?i)((?:pass(?:word|wd)?|pwd?|user-pw|(?:access_|auth_?)?token|api_?key|secret)=)([^&\s\"']+)")
_URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s\"']+)")
#: user info with a blank (or tab) written unescaped, in the password or in the user name:
#: ``_URL`` stops at the blank, FFmpeg does not (it logs in with ``my secret`` from
#: ``rtsp://admin:my secret@cam/``, and as ``my user`` with ``pw`` from ``rtsp://my user:pw@cam/``).
#: The password runs from the user's ``:`` to the last ``@`` before the host (no ``/`` or line
#: break in between).
_SPACED_PASSWORD = re.compile(
    r"([a-zA-Z][a-zA-Z0-9+.-]*://(?=[^\"'/@\r\n]*[ \t])[^\"'/?#@:\r\n]*:)"
    r"([^\"'/\r\n]*?)(@[^\s\"'@/]*)(?=[/\s\"']|$)")


def _redact_userinfo(m: re.Match[str]) -> str:
    scheme, rest = m.group(1), m.group(2)
    end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0] or [len(rest)])
    # FFmpeg's rule (av_url_split): the user info ends at the LAST '@' before the path, so
    # rtsp://admin:p@ss@cam/ logs in with the password 'p@ss'.
    at = rest.rfind("@", 0, end)
    if at < 0:
        # No '@' before the first '/', '?' or '#': a password with one of them written
        # unescaped (admin:pa/ss@cam), unless what precedes it is a host or host:port.
        authority = rest[:end]
        colon = authority.find(":")
        if colon < 0 or authority.startswith("[") or authority[colon + 1:].isdigit():
            return m.group(0)
        at = rest.find("@", end)
        if at < 0:
            return m.group(0)
    colon = rest.find(":", 0, at)
    if colon < 0:  # a user name without a password
        return m.group(0)
    return f"{scheme}{rest[:colon]}:***{rest[at:]}"


def redact_uri(uri: str) -> str:
    """``uri`` with the password (and any ``password=``/``passwd=``/``pw=``/``token=``...
    query value) replaced by ``***``. The user info ends at the last ``@`` before the path,
    as FFmpeg reads it, so an unescaped ``@`` (or ``/``, ``?``, ``#``) in a password is
    hidden with the rest of it, and so is a blank."""
    return _URL.sub(_redact_userinfo, _SPACED_PASSWORD.sub(r"\1***\3", _SECRET_PARAM.sub(r"\1***", uri)))


@functools.lru_cache(maxsize=1)
def opencv_video_io() -> Tuple[bool, int]:
    """``(OpenCV has GStreamer, libavformat major version or 0)`` from ``cv2.getBuildInformation()``."""
    import cv2

    info = cv2.getBuildInformation()
    gst = re.search(r"^\s*GStreamer:\s*(\S+)", info, re.M)
    avf = re.search(r"^\s*avformat:\s*YES\s*\((\d+)\.", info, re.M)
    return bool(gst and gst.group(1).upper().startswith("YES")), int(avf.group(1)) if avf else 0


def hardware_decoder() -> bool:
    """Whether the Jetson's ``nvv4l2decoder`` GStreamer plugin is installed here."""
    return os.path.exists(JETSON_DECODER_PLUGIN)


def choose_backend(kind: str, setting: str, has_gstreamer: bool, hw_decoder: bool) -> Tuple[str, str]:
    """``(ffmpeg | gstreamer | v4l2 | ..., why)`` for a live stream of ``kind``.

    Only ``rtsp`` has a choice; ``auto`` takes GStreamer's hardware decode when
    OpenCV has GStreamer and the Jetson decoder is installed, FFmpeg otherwise.
    Raises ValueError when ``gstreamer`` is forced but OpenCV lacks it."""
    if kind != "rtsp":
        return {"gstreamer": "gstreamer", "camera": "v4l2"}.get(kind, "ffmpeg"), f"kind {kind}"
    if setting == "ffmpeg":
        return "ffmpeg", "backend: ffmpeg"
    if setting == "gstreamer":
        if not has_gstreamer:
            raise ValueError("backend: gstreamer, but this OpenCV was built without GStreamer "
                             "(cv2.getBuildInformation(): 'GStreamer: NO'); use the system OpenCV of JetPack")
        return "gstreamer", "backend: gstreamer" + ("" if hw_decoder else " (nvv4l2decoder not found: it will fail "
                                                                          "to open off a Jetson)")
    if has_gstreamer and hw_decoder:
        return "gstreamer", "auto: OpenCV has GStreamer and the Jetson hardware decoder is installed"
    why = "OpenCV has no GStreamer" if not has_gstreamer else f"no hardware decoder ({JETSON_DECODER_PLUGIN})"
    return "ffmpeg", f"auto: {why}"


def ffmpeg_options(kind: str, transport: str, io_timeout_s: float, avformat_major: int) -> str:
    """``OPENCV_FFMPEG_CAPTURE_OPTIONS`` for one stream."""
    us = str(int(io_timeout_s * 1e6))
    if kind == "rtsp":
        # FFmpeg >= 5 (libavformat 59): "timeout" is the socket I/O timeout in microseconds;
        # before, that was "stimeout" and "timeout" meant listen mode.
        timeout_key = "timeout" if avformat_major >= 59 or avformat_major == 0 else "stimeout"
        return f"rtsp_transport;{transport}|{timeout_key};{us}"
    return f"timeout;{us}"  # http/tcp: socket I/O timeout in microseconds in every FFmpeg


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rtsp_pipeline(uri: str, transport: str = "tcp", codec: str = "h264", io_timeout_s: float = 5.0,
                  decoder: str = "nvv4l2decoder", convert: str = "nvvidconv") -> str:
    """The GStreamer pipeline that decodes an RTSP camera in hardware on a Jetson
    (``decoder``/``convert`` are parameters so the same shape can be run with software
    elements where there is no Jetson)."""
    depay = {"h264": "rtph264depay ! h264parse", "h265": "rtph265depay ! h265parse"}[codec]
    us = int(io_timeout_s * 1e6)
    return (f"rtspsrc location={_quote(uri)} protocols={transport} latency=0 tcp-timeout={us} timeout={us} "
            f"! {depay} ! {decoder} ! {convert} ! video/x-raw,format=BGRx ! videoconvert ! "
            "video/x-raw,format=BGR ! appsink drop=true max-buffers=1 sync=false")


def latest_appsink(pipeline: str) -> Tuple[str, Optional[str]]:
    """``pipeline`` with ``drop=true max-buffers=1`` added to its final ``appsink`` where
    missing, and a note of what was added (None when nothing was). ValueError when it
    does not end in an ``appsink``."""
    m = _APPSINK.search(pipeline.strip())
    if m is None:
        raise ValueError("a gstreamer pipeline must end in '! appsink' (OpenCV reads frames from it)")
    props = m.group(1)
    added = [p for p, name in (("drop=true", "drop"), ("max-buffers=1", "max-buffers"))
             if not re.search(rf"\b{name}\s*=", props)]
    if not added:
        return pipeline, None
    return pipeline.rstrip() + " " + " ".join(added), " ".join(added)


def stall_timeout(setting: float, nominal_fps: float) -> float:
    """Seconds without a new frame after which a live stream is down: ``setting``, or
    when 0 five frame periods of the source's nominal rate, at least 1 s and at most
    ``SLOW_STALL_MAX_S`` (2 s when the rate is unknown, invented (pass 0: FFmpeg's 25 fps
    for MJPEG over HTTP), or 1000 fps and above: a backend's time base, not a rate). A slow camera (one frame every 5 s) gets its five periods:
    with 2 s it would be declared down before each of its frames."""
    if setting > 0:
        return setting
    period = frame_period(nominal_fps)
    if period is not None:
        return min(max(1.0, 5.0 * period), SLOW_STALL_MAX_S)
    return 2.0


def describe_backend() -> str:
    """One line for ``--describe-settings``: what ``backend: auto`` resolves to on this machine."""
    try:
        has_gst, avf = opencv_video_io()
    except Exception as exc:  # pragma: no cover - cv2 missing or broken
        return f"streams[].backend auto: unknown (OpenCV not usable: {exc})"
    backend, why = choose_backend("rtsp", "auto", has_gst, hardware_decoder())
    ffmpeg = f"FFmpeg libavformat {avf}" if avf else "no FFmpeg"
    return f"streams[].backend auto: {backend} for kind rtsp ({why.split(': ', 1)[-1]}; OpenCV has {ffmpeg})"


#: Ports a camera URL means when it names none.
DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443}
#: The URL schemes each network kind is opened with.
URL_SCHEMES = {"rtsp": ("rtsp", "rtsps"), "http": ("http", "https")}


def url_problem(kind: str, uri: str) -> Optional[str]:
    """What keeps ``uri`` from being a URL a ``kind`` stream (``rtsp``, ``http``) can open: no
    scheme (``192.168.1.20:554/stream1``), a local path, another scheme, a port that is no port
    (``:554x``, ``:99999``, non-ASCII digits) or no host; None when nothing
    does, or for other kinds. FFmpeg refuses such a URL at every open without a
    reason, so the stream backed off forever."""
    schemes = URL_SCHEMES.get(kind)
    if schemes is None:
        return None
    m = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://", uri)
    forms = " or ".join(f"{s}://" for s in schemes)
    example = f"{schemes[0]}://host[:port]/path"
    if m is None or m.group(1).lower() not in schemes:
        return f"{redact_uri(uri)[:80]!r} is not an {kind.upper()} URL: give {example} ({forms})"
    try:
        _authority(uri, where="host:port")
    except ConfigError as exc:  # a port typo (554x, 99999, non-ASCII digits) or no host
        return f"{redact_uri(uri)[:80]!r}: {exc}"
    return None
#: Longest wait of the reachability check that explains a failed open.
REACH_TIMEOUT_S = 2.0


def host_port(uri: str) -> Optional[Tuple[str, int]]:
    """The host and port a network camera URL names (its default port when it names none;
    user info ends at the last ``@`` before the path, as FFmpeg reads it); None when the URL
    names no usable host and port (``edgewise.addresses.parse_hostport`` judges them)."""
    try:
        return _authority(uri)
    except ConfigError:
        return None


def _authority(uri: str, where: str = "camera URL") -> Optional[Tuple[str, int]]:
    """:func:`host_port`, but ConfigError (from ``parse_hostport``, naming what is wrong) when
    the URL's authority is no usable host and port; None for a URL without a scheme."""
    m = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://([^/?#]*)", uri)
    if m is None:
        return None
    scheme, authority = m.group(1).lower(), m.group(2)
    authority = authority[authority.rfind("@") + 1:]
    has_port = "]:" in authority if authority.startswith("[") else ":" in authority
    if not has_port and scheme in DEFAULT_PORTS:
        authority = f"{authority}:{DEFAULT_PORTS[scheme]}"
    return parse_hostport(authority, where=where)


#: An open that took at least this share of its time limit ran into the limit: nothing answered.
OPEN_LIMIT_SHARE = 0.9


def why_camera_unopened(uri: str) -> str:
    """Why a V4L2 camera (``kind: camera``: an index ``N`` for ``/dev/videoN``, or a device path)
    may not have opened: the device is missing, not a device, or not ours to open; else it
    exists and refused (held by another process, or not a capture node). OpenCV says none of
    this: every case read ``cannot open camera source 0``."""
    path = f"/dev/video{int(uri)}" if uri.isdigit() else uri
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path} does not exist; is the camera plugged in? (`v4l2-ctl --list-devices` lists them)"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISCHR(mode):
        return f"{path} is not a device; give a V4L2 device (/dev/videoN) or its index"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"no permission to open {path}; add the daemon's user to the video group"
    return (f"{path} exists but did not open: another process may hold it, or it is not a capture "
            "node (`v4l2-ctl -d DEVICE --all`)")
