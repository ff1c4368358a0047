"""``edgewise edge health``: ask a running edge daemon how it is, from its own settings.

The daemon answers ``/healthz`` on its metrics port (``edge.metrics``): 200 while it runs (its
``status`` ``ok`` or ``degraded``, with what is degraded), 503 while it starts, stops or is
stalled. This command reads the same settings as ``edge run`` (``--config``, the environment,
``--set``) to find that port, asks, prints the answer and exits as a container's
``HEALTHCHECK`` expects: 0 healthy, 1 unhealthy or not answering. Docker keeps the output of
the last checks (``docker inspect``), so an operator sees why. A daemon bound to every address
(``0.0.0.0``, ``::``) is asked on the loopback; ``metrics.port`` 0 (a free port picked at
start) or -1 (none) leaves nothing to ask, which is a settings error (exit 2).
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Tuple

from edge.settings import EdgeSettings
from edgewise.addresses import format_address
from edgewise.errors import ConfigError

#: what a daemon bound to every address is asked on
LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
#: exit statuses (Docker's HEALTHCHECK: 0 healthy, 1 unhealthy; 2 is reserved: a settings error)
HEALTHY, UNHEALTHY = 0, 1


def health_address(s: EdgeSettings) -> Tuple[str, int]:
    """Where the daemon of settings ``s`` answers ``/healthz``; ConfigError when nowhere known."""
    port = s.metrics.port
    if port < 0:
        raise ConfigError("metrics.port is -1: the daemon serves no /healthz to ask; set metrics.port "
                          "(9108 by default)")
    if port == 0:
        raise ConfigError("metrics.port is 0: the daemon picks a free port at each start (its log line "
                          "'metrics and health on ...' names it); give it a fixed port to check it")
    return LOOPBACK.get(s.metrics.host, s.metrics.host), port


def ask(host: str, port: int, timeout_s: float) -> Tuple[int, Any]:
    """The daemon's answer: (HTTP status, its JSON document). OSError or HTTPException when it
    does not answer; ValueError when what answers is not the daemon's JSON."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        body = resp.read(1 << 20)
        return resp.status, json.loads(body.decode("utf-8"))
    finally:
        conn.close()


def check(s: EdgeSettings, timeout_s: float, out: Any, err: Any) -> int:
    """Ask, print the answer to ``out`` (or why there is none to ``err``), return the exit status."""
    host, port = health_address(s)
    where = f"http://{format_address(host, port)}/healthz"
    try:
        code, doc = ask(host, port, timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        print(f"unhealthy: no answer from {where} ({exc}): the daemon is not running, still loading its "
              "model, or bound elsewhere (metrics.host, metrics.port)", file=err)
        return UNHEALTHY
    except ValueError:
        print(f"unhealthy: {where} answered, but not with the edge daemon's JSON (another process on "
              "metrics.port?)", file=err)
        return UNHEALTHY
    print(json.dumps(doc, sort_keys=True), file=out)
    return HEALTHY if code == 200 else UNHEALTHY


__all__ = ["HEALTHY", "UNHEALTHY", "ask", "check", "health_address"]
