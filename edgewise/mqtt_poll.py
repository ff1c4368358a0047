"""paho-mqtt's network loop waiting with ``poll(2)``, not ``select(2)``.

paho's loop (``Client._loop``, paho-mqtt 2.1 and 2.2) waits for its socket with
``select.select``, which refuses a file descriptor of 1024 or more (``FD_SETSIZE``; Python
raises ValueError). paho takes that ValueError for a lost connection: a process whose MQTT socket
was opened past descriptor 1023 (the gateway raises its open-file limit for a fleet's gRPC
connections, ``cloud.gateway.server``; an edge with many streams; a reconnect while they are
open) had every connection attempt end at once as lost, quietly, for as long as the descriptors
stayed taken: the MQTT bridge or the edge's transport never connected again (found by a probe).

``install`` gives paho's client module a ``select`` whose ``select`` function keeps
``select.select``'s contract for what paho passes it (objects with ``fileno()``, or descriptors;
a timeout in seconds or None) over ``select.poll``, which takes any descriptor. A hang-up or an
error on a descriptor reports it readable and writable, as ``select`` does, so paho's next read
or write meets the error. A negative descriptor (a socket closed under the loop) raises
ValueError and an object without ``fileno`` TypeError, as ``select.select`` does: paho handles
both as before. Idempotent; Linux and every POSIX system have ``poll`` (the edge and the cloud
run on Linux).
"""

from __future__ import annotations

import math
import select
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT
#: what ``select`` reports as both readable and writable (the next read or write fails)
_TROUBLE = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _fd(obj: Any) -> int:
    fd = obj if isinstance(obj, int) else obj.fileno()  # AttributeError is select's TypeError
    if fd < 0:
        raise ValueError(f"file descriptor cannot be a negative integer ({fd})")
    return int(fd)


def poll_select(rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
                timeout: Optional[float] = None) -> Tuple[List[Any], List[Any], List[Any]]:
    """``select.select(rlist, wlist, xlist, timeout)`` over ``poll`` (the module docstring);
    ``xlist`` (exceptional conditions, which paho does not ask for) is reported empty."""
    try:
        reads = [(obj, _fd(obj)) for obj in rlist]
        writes = [(obj, _fd(obj)) for obj in wlist]
        for obj in xlist:
            _fd(obj)
    except AttributeError as exc:
        raise TypeError(f"arguments 1-3 must be sequences of file descriptors or objects with fileno(): {exc}") \
            from None
    masks: Dict[int, int] = {}
    for _, fd in reads:
        masks[fd] = masks.get(fd, 0) | _READ
    for _, fd in writes:
        masks[fd] = masks.get(fd, 0) | _WRITE
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    events = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000.0)))
    readable = [obj for obj, fd in reads if events.get(fd, 0) & (_READ | _TROUBLE)]
    writable = [obj for obj, fd in writes if events.get(fd, 0) & (_WRITE | _TROUBLE)]
    return readable, writable, []


def install() -> None:
    """Make paho's client module wait with ``poll_select`` (idempotent)."""
    import paho.mqtt.client as paho_client

    if getattr(paho_client.select, "select", None) is poll_select:
        return
    shim = types.ModuleType("select", "select.select over poll(2), for paho-mqtt (edgewise.mqtt_poll)")
    shim.__dict__.update({k: v for k, v in vars(select).items() if not k.startswith("__")})
    shim.select = poll_select  # type: ignore[attr-defined]
    paho_client.select = shim  # type: ignore[attr-defined]
