"""What a network camera's own answer says is wrong, asked after a failed open.

FFmpeg tells an HTTP or RTSP error (401, 404, 503...) to stderr only, so through OpenCV a
wrong path, wrong credentials and a camera out of sessions all read ``cannot open``.
``stream_answer`` asks the camera once, as FFmpeg's open would (``GET`` for ``http://``,
``DESCRIBE`` for ``rtsp://``), reads the head of the answer only, and says what its status
means. Credentials in the URL (read as FFmpeg reads them: the user info ends at the last
``@``) are sent only as FFmpeg sends them, after the camera's 401 asks for Basic
authentication; a camera that asks for Digest is not judged (FFmpeg speaks Digest, this check
does not, and a password sent as Basic would cross the network readable). Used by ``edge.sources.live.why_unopened`` and, for
an ``http`` URL that gave at most one frame (a snapshot), by ``edge.sources.opencv``.
"""

from __future__ import annotations

import base64
import http.client
import socket
import urllib.parse
from typing import NamedTuple, Optional

from edge.sources.live import REACH_TIMEOUT_S, host_port, redact_uri

#: The longest status line or header line read from an RTSP answer.
MAX_LINE = 4096


class _Answer(NamedTuple):
    """The head of a camera's answer."""

    proto: str  # HTTP or RTSP
    status: int
    reason: str
    headers: http.client.HTTPMessage

    @property
    def wants_basic(self) -> bool:
        """A 401 that asks for Basic authentication (or names no scheme)."""
        return self.status == 401 and self.headers.get("WWW-Authenticate", "Basic").lower().startswith("basic")


def _hint(answer: _Answer, scheme: str, sent_credentials: bool) -> Optional[str]:
    proto, status, reason, headers = answer
    said = f"{proto} {status} {reason}".rstrip()
    if status == 401:
        if not sent_credentials:
            return f"asks for credentials ({said}): give them in the URL, {scheme}://user:password@host/path"
        return f"refuses the credentials ({said}): check the user and the password"
    if status == 403:
        return f"refuses access ({said}): check the user's rights on the camera"
    if status == 404:
        return f"has no stream at that path ({said}): check the path"
    if 300 <= status < 400:
        where = redact_uri(headers.get("Location", "") or "?")[:120]
        return f"redirects ({said}) to {where}, where the stream did not open: check that URL"
    if status >= 500:
        return (f"failed to serve the stream ({said}): restart the camera or check its stream settings "
                "(a camera out of client sessions answers so too)")
    if status >= 400:
        return f"refused the request ({said}): check the URL"
    ctype = headers.get_content_type()
    if proto == "HTTP" and (ctype == "text/html" or headers.get_content_maintype() == "image"):
        what = "a web page" if ctype == "text/html" else "one image, a snapshot"
        return (f"answers with {what} ({ctype}), not a video stream: give the camera's MJPEG stream "
                "URL (multipart/x-mixed-replace)")
    return None


def _basic_auth(parts: urllib.parse.SplitResult) -> Optional[str]:
    if parts.password is None and not parts.username:
        return None
    user, _, password = parts.netloc[:parts.netloc.rfind("@")].partition(":")
    creds = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()
    return "Basic " + base64.b64encode(creds).decode()


def _ask_http(parts: urllib.parse.SplitResult, host: str, port: int, auth: Optional[str],
              timeout_s: float) -> Optional[_Answer]:
    headers = {"Connection": "close"}
    if auth:
        headers["Authorization"] = auth
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")), headers=headers)
        resp = conn.getresponse()
        return _Answer("HTTP", resp.status, resp.reason, resp.headers)
    finally:
        conn.close()


def _ask_rtsp(parts: urllib.parse.SplitResult, host: str, port: int, auth: Optional[str],
              timeout_s: float) -> Optional[_Answer]:
    netloc = parts.netloc[parts.netloc.rfind("@") + 1:]
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    request = f"DESCRIBE {url} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n"
    request += f"Authorization: {auth}\r\n\r\n" if auth else "\r\n"
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(request.encode())
        with sock.makefile("rb") as f:
            version, status, reason = (f.readline(MAX_LINE).decode("latin-1").split(None, 2) + ["", "", ""])[:3]
            if not version.startswith("RTSP/") or not status.isdigit():
                return None
            headers = http.client.parse_headers(f)
    return _Answer("RTSP", int(status), reason.strip(), headers)


def stream_answer(uri: str, timeout_s: float = REACH_TIMEOUT_S) -> Optional[str]:
    """What the camera at an ``http://`` or ``rtsp://`` ``uri`` answers that explains a failed
    open (``has no stream at that path (RTSP 404 Not Found): check the path``); None when its
    answer says nothing clear, for other schemes, or when it cannot be asked in ``timeout_s``."""
    parts = urllib.parse.urlsplit(uri)
    where = host_port(uri)
    ask = {"http": _ask_http, "rtsp": _ask_rtsp}.get(parts.scheme.lower())
    if ask is None or where is None:
        return None
    creds = _basic_auth(parts)
    try:
        answer = ask(parts, where[0], where[1], None, timeout_s)
        if answer is not None and answer.status == 401 and creds is not None:
            if not answer.wants_basic:
                return None  # Digest: not judged, and the password not sent readable
            answer = ask(parts, where[0], where[1], creds, timeout_s)
    except (OSError, ValueError, http.client.HTTPException):
        return None
    return None if answer is None else _hint(answer, parts.scheme.lower(), answer.status == 401 and creds is not None)
