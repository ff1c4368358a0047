"""The worker's decode budget: a limit on the pixels being decoded at once.

A decoder allocates the size an image's header declares, whatever the file's
size: a 631-byte JPEG declaring 7600x4300 costs a worker about 200 MB while it
decodes, and concurrent ones add up. ``PixelBudget`` is a weighted semaphore
over declared pixels: a decode starts only while the decodes in progress plus it
stay within the budget (one image larger than the whole budget runs alone);
the others wait in arrival order until their deadline and are then refused
(``OverloadedError``, RESOURCE_EXHAUSTED), as is any decode arriving while
``max_waiting`` already wait.
"""

from __future__ import annotations

import asyncio
import collections

from cloud.worker.batching import BUSY_MARK
from edgewise.errors import OverloadedError


class PixelBudget:
    """FIFO weighted semaphore over pixels; use from one event loop."""

    def __init__(self, limit: int, max_waiting: int) -> None:
        if limit < 1 or max_waiting < 0:
            raise ValueError("pixel budget: need limit >= 1 and max_waiting >= 0")
        self.limit = limit
        self.max_waiting = max_waiting
        self.in_use = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, pixels: int, timeout: float | None) -> int:
        """Take ``pixels`` (clamped to the limit) within ``timeout`` seconds; returns what was taken."""
        pixels = max(0, min(pixels, self.limit))
        if not self._waiters and self.in_use + pixels <= self.limit:
            self.in_use += pixels
            return pixels
        if len(self._waiters) >= self.max_waiting:
            raise OverloadedError(self._busy(pixels, f"{len(self._waiters)} decodes already waiting"))
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (pixels, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(fut, timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if fut.done() and not fut.cancelled():  # granted just as we gave up: hand it back
                self.release(pixels)
            elif entry in self._waiters:
                self._waiters.remove(entry)
                self._grant()  # the head may have left: the next one may fit now
            if isinstance(exc, asyncio.TimeoutError):
                raise OverloadedError(self._busy(pixels, "the deadline passed while waiting")) from None
            raise
        return pixels

    def release(self, pixels: int) -> None:
        self.in_use -= pixels
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            pixels, fut = self._waiters[0]
            if fut.done():  # cancelled waiter
                self._waiters.popleft()
                continue
            if self.in_use + pixels > self.limit:
                return
            self._waiters.popleft()
            self.in_use += pixels
            fut.set_result(None)

    def _busy(self, pixels: int, why: str) -> str:
        return (f"decode budget full: {self.in_use} of {self.limit} pixels being decoded, this image needs "
                f"{pixels} ({why}); {BUSY_MARK}")
