"""Why a network camera did not open, asked of the network after the open failed.

``why_unopened`` connects once (the host does not resolve, nothing listens, nothing answers,
or the connection is taken) and then asks the camera itself with ``stream_answer``.

FFmpeg tells an HTTP or RTSP error (401, 404, 503...) to stderr only, so through OpenCV a
wrong path, wrong credentials and a camera out of sessions all read ``cannot open``.
``stream_answer`` asks the camera once, as FFmpeg's open would (``GET`` for ``http://``,
``DESCRIBE`` for ``rtsp://``), reads the head of the answer only, and says what its status
means. Credentials in the URL (read as FFmpeg reads them: the user info ends at the last
``@``) are sent only as FFmpeg sends them, after the camera's 401 asks for Basic
authentication; a camera that asks for Digest is not judged (FFmpeg speaks Digest, this check
does not, and a password sent as Basic would cross the network readable). Used by
``edge.sources.opencv`` after a failed open, and for an ``http`` URL that gave at most one
frame (a snapshot). The pure rules of a live source stay in ``edge.sources.live``.
"""

from __future__ import annotations

import base64
import http.client
import socket
import urllib.parse
from typing import NamedTuple, Optional

from edge.sources.live import OPEN_LIMIT_SHARE, REACH_TIMEOUT_S, host_port, redact_uri
from edgewise.addresses import format_address

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


def why_unopened(uri: str, timeout_s: float = REACH_TIMEOUT_S, waited_s: float = 0.0,
                 limit_s: float = 0.0) -> str:
    """Why a network camera at ``uri`` may not have opened, from one TCP connect to it: its
    host does not resolve, nothing listens, nothing answers, or it accepts the connection.
    Then, when the failed open took about its whole time limit (``waited_s`` of ``limit_s``,
    the smaller of ``open_timeout_s`` and ``io_timeout_s``), the camera did not answer (hung);
    else it answered and refused, so the path or the credentials are the likely cause.
    FFmpeg says none of this through OpenCV, so a dead camera, a wrong port and a wrong
    password all read ``cannot open``. Empty when the URL names no host."""
    where = host_port(uri)
    if where is None:
        return ""
    host, port = where
    shown = format_address(host, port)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except socket.gaierror:
        return f"its host {host} does not resolve (DNS); check the address"
    except ConnectionRefusedError:
        return f"nothing listens at {shown} (connection refused); is the camera on, and the port right?"
    except socket.timeout:
        return f"no answer from {shown} within {timeout_s:g} s; is the camera on the network (or a firewall)?"
    except OSError as exc:
        return f"{shown}: {exc.strerror or exc}"
    if limit_s > 0 and waited_s >= OPEN_LIMIT_SHARE * limit_s:
        return (f"{shown} accepts connections, but the stream did not answer within {waited_s:.1f} s "
                "(open_timeout_s / io_timeout_s): the camera may be hung; restart it, or raise the "
                "timeouts for a slow one")
    answer = stream_answer(uri, timeout_s)
    if answer:
        return f"{shown} {answer}"
    return (f"{shown} answers, but the stream did not open: check the path and the credentials "
            "(`ffprobe` on the URL prints FFmpeg's reason)")
