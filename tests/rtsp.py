"""A real RTSP camera process for tests and benchmarks (``tests/rtspserver.py``).

``RtspCamera`` starts gst-rtsp-server under Debian's ``/usr/bin/python3`` (which
has PyGObject; the venv does not), waits for its ``READY <port>`` line, and can
kill it, freeze it (SIGSTOP: a camera whose connection stays open but sends
nothing) and start it again on the same port with other settings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

SCRIPT = Path(__file__).resolve().parent / "rtspserver.py"
SYSTEM_PYTHON = "/usr/bin/python3"


def missing() -> Optional[str]:
    """Why no RTSP camera can run here, or None."""
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} is missing"
    probe = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
             "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
             "import sys; sys.exit(0 if all(Gst.ElementFactory.find(e) for e in "
             "('x264enc', 'rtph264pay', 'jpegenc', 'rtpjpegpay', 'videotestsrc')) else 3)")
    res = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, timeout=60)
    if res.returncode != 0:
        return "gst-rtsp-server or its GStreamer plugins are missing (the Makefile's RTSP_PKGS; make test installs them)"
    return None


class RtspCamera:
    """One gst-rtsp-server process serving ``rtsp://127.0.0.1:<port>/cam``."""

    def __init__(self, fps: int = 25, size: str = "320x240", codec: str = "h264", user: str = "",
                 password: str = "", port: int = 0) -> None:
        self.fps = fps
        self.size = size
        self.codec = codec
        self.user = user
        self.password = password
        self.port = port
        self.proc: Optional[subprocess.Popen[str]] = None

    @property
    def url(self) -> str:
        creds = f"{self.user}:{self.password}@" if self.user else ""
        return f"rtsp://{creds}127.0.0.1:{self.port}/cam"

    def start(self, timeout: float = 30.0, **changes: object) -> RtspCamera:
        """Start (or start again, on the same port, with ``changes`` such as ``size``)."""
        for k, v in changes.items():
            setattr(self, k, v)
        cmd: List[str] = [SYSTEM_PYTHON, str(SCRIPT), "--port", str(self.port), "--fps", str(self.fps),
                          "--size", self.size, "--codec", self.codec]
        if self.user:
            cmd += ["--user", self.user, "--password", self.password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # READY <port>, or EOF when it failed
        if not line.startswith("READY ") or time.monotonic() > deadline:
            self.kill()
            raise RuntimeError(f"RTSP server did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def kill(self) -> None:
        """SIGKILL: the camera vanishes (its TCP connections are reset)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self._close_pipe()

    def freeze(self) -> None:
        """SIGSTOP: connections stay open and nothing more arrives."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
