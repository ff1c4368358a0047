"""The seam between discovery and the gateway: endpoint updates.

A discovery source yields the *full* current set of worker endpoints whenever it
changes (level-triggered, like an EndpointSlice watch), so the gateway only has
to diff sets: a new address is added (slow start begins), an address whose
state becomes DRAINING gets no new requests and its channel is closed once its
in-flight count reaches zero, and an address that disappears is treated as
DRAINING.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


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
