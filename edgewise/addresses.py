"""``host:port`` addresses as settings and command lines write them: one parser for the
edge's ``cloud.endpoints`` and the cloud's worker lists.

A host is a DNS name (letters, digits, ``-`` and ``_`` in dot-separated labels of at most 63
characters; internationalised names in their ``xn--`` form), an IPv4 address, or an IPv6
address in brackets (``[::1]:50051``); the port is 1..65535, or 0..65535 for an address to
listen on (``any_port``: 0 asks for any free port), as the gateway's ``listen``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Tuple

from edgewise.errors import ConfigError
from edgewise.fieldrules import ASCII_DIGITS_HINT, ascii_digits

_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def host_problem(host: str) -> str:
    """Why ``host`` (unbracketed) is not a DNS name or an IP address; "" when it is one."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            if "://" in host:
                return "is a URL: give the host alone, without a scheme"
            head, _, tail = host.rpartition(":")
            if tail.isdigit() and ":" not in head:
                return "holds a port: give the host alone (the port has a setting of its own)"
            return "is not an IPv6 address"
        return ""
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253:
        return "is not a host name (1..253 characters)"
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):  # ($ let a last newline through)
        return ("is not a host name: letters, digits, '-' and '_' in dot-separated labels of at most 63 "
                "characters (an internationalised name in its xn-- form)")
    return ""


def parse_hostport(text: str, *, where: str = "endpoint", any_port: bool = False) -> Tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` into (host, port), validating both; ConfigError
    naming ``where`` otherwise. ``any_port``: port 0 (any free port) is allowed."""
    s = text.strip()
    if "://" in s:
        raise ConfigError(f"{where}: {text!r} is a URL: give host:port, without a scheme "
                          f"(e.g. {s.split('://', 1)[1].rstrip('/')!r})")
    if s.startswith("["):
        close = s.find("]")
        if close < 0 or not s[close + 1:].startswith(":"):
            raise ConfigError(f"{where}: {text!r} is not '[ipv6]:port' (example: [::1]:50051)")
        host, port_s = s[1:close], s[close + 2:]
        if ":" not in host:
            raise ConfigError(f"{where}: {text!r}: only IPv6 addresses go in brackets")
    else:
        host, sep, port_s = s.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"{where}: {text!r} is not 'host:port' (example: 10.0.0.5:50051)")
        if ":" in host:
            raise ConfigError(f"{where}: {text!r}: write IPv6 addresses in brackets, e.g. [{host}]:{port_s}")
    problem = host_problem(host)
    if problem:
        raise ConfigError(f"{where}: {text!r}: the host {host!r} {problem}")
    if not ascii_digits(port_s):
        hint = f" ({ASCII_DIGITS_HINT})" if port_s.isdigit() else ""
        raise ConfigError(f"{where}: {text!r}: port {port_s!r} is not an integer{hint}")
    port = int(port_s)
    low = 0 if any_port else 1
    if not low <= port <= 65535:
        raise ConfigError(f"{where}: {text!r}: port {port} is outside {low}..65535")
    return host, port


def format_address(host: str, port: int) -> str:
    """``host:port`` with IPv6 literals bracketed, as gRPC targets expect."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
