"""The rule for the ids a request carries (device, stream, trace): one place for both ends.

The gateway refuses a request whose ids break it (INVALID_ARGUMENT); the edge checks its
own ``device_id`` and stream ids against the same rule when it loads its settings, so a
device never runs for hours sending requests the cloud refuses every time.
"""

from __future__ import annotations

import re
from typing import Optional

#: characters an id may hold
ID_CHARS = "A-Za-z0-9._:/@+-"
_ID_RE = re.compile(f"[{ID_CHARS}]+")
#: the gateway's default ``limits.max_id_length``
DEFAULT_MAX_ID_LENGTH = 128


def id_problem(value: str, name: str, limit: int = DEFAULT_MAX_ID_LENGTH) -> Optional[str]:
    """Why ``value`` cannot be sent as ``name`` (an empty value is the caller's concern), or None."""
    if len(value) > limit:
        return f"{name} is {len(value)} characters; the limit is {limit}"
    if value and not _ID_RE.fullmatch(value):  # (match: '$' let a last newline through)
        return f"{name} {value[:40]!r} has characters outside [{ID_CHARS}]"
    return None


def bearer_token_problem(token: str) -> Optional[str]:
    """Why ``token`` cannot be a device's bearer token, or None. It travels as gRPC metadata
    (``authorization: Bearer <token>``), whose values are printable ASCII: a control character
    (a carriage return from a file edited on Windows) made gRPC refuse every call the edge
    sent. The one rule of the edge's ``cloud.token`` and the gateway's device tokens."""
    if not token:
        return "is empty"
    if not all("\x21" <= c <= "\x7e" for c in token):
        return ("holds a blank, control or non-ASCII character; a bearer token is sent as gRPC metadata, so "
                "use printable ASCII without spaces (e.g. `openssl rand -hex 32`)")
    return None


def credential_problem(value: str) -> Optional[str]:
    """Why ``value`` cannot be an MQTT username or password, or None: a control character, most
    often the line break that ends a file (a Kubernetes Secret made with ``--from-file``, an
    environment file edited on Windows). The broker's password file is written without it (the
    chart's ``mosquitto_passwd`` takes ``$(cat file)``), so the login failed, quietly, for good.
    The one rule of the edge's and the gateway's ``mqtt.username`` and ``mqtt.password``."""
    if any(c < "\x20" or c == "\x7f" for c in value):
        return ("holds a line break or another control character (a file's last newline?); remove it: the "
                "broker compares it byte for byte")
    return None
