"""The seam between discovery and the gateway: endpoint updates.

A discovery source yields the *full* current set of worker endpoints whenever it
changes (level-triggered, like an EndpointSlice watch), so the gateway only has
to diff sets: a new address is added (slow start begins), an address whose
state becomes DRAINING gets no new requests and its channel is closed once its
in-flight count reaches zero, and an address that disappears is treated as
DRAINING.

The dns and kubernetes sources take their options from the gateway's untyped
``discovery.dns`` / ``discovery.kubernetes`` mappings, so each checks its numbers with
:func:`number_option` at start.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from edgewise.errors import ConfigError
from edgewise.fieldrules import allowed_text, in_range, show


class EndpointState(enum.Enum):
    READY = "ready"        # serving: may receive new requests
    DRAINING = "draining"  # terminating or not ready: finish in-flight, no new picks


@dataclass(frozen=True)
class Endpoint:
    """One worker as discovery sees it."""

    address: str            # "host:port" for a gRPC channel
    weight: float = 1.0     # configured weight (pod annotation edgewise.io/weight)
    state: EndpointState = EndpointState.READY
    name: str = ""          # pod name or other stable id, for metrics and logs


class Discovery(Protocol):
    """A source of endpoint sets."""

    def watch(self) -> AsyncIterator[frozenset[Endpoint]]:
        """Yield the full endpoint set now and after every change, until cancelled."""
        ...

    async def close(self) -> None:
        """Stop watching and release resources."""
        ...


def number_option(where: str, name: str, value: Any, *, lo: float, lo_open: bool = False,
                  hi: float | None = None, integer: bool = False) -> Any:
    """``value`` of option ``name`` of ``where`` (``discovery.kubernetes``) when it is a number (an
    integer if ``integer``) within its range, else ConfigError naming the key, the value and what
    is allowed. The options come from an untyped YAML mapping: a quoted ``"0.5"`` or a ``0`` reached
    the sources unchecked, and killed the watch thread (a string) or re-listed in a loop as fast as
    the API server answered (a back-off of 0)."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not in_range(value, lo, hi, lo_open):
        allowed = allowed_text("int" if integer else "float", lo=lo, hi=hi, lo_open=lo_open)
        raise ConfigError(f"{where}.{name}: {show(value)} is not allowed; allowed: {allowed}")
    return value
