"""The edge detector's load, off the event loop, given up when the daemon is asked to stop.

A load cannot be interrupted from Python: it takes 0.5-3 s on CPU (more with a larger
``model.max_batch``: the daemon runs one batch that large as it starts) and minutes where a
TensorRT engine is built, past systemd's ``TimeoutStopSec=30``. It runs on a daemon thread of
its own, not on the loop's default executor (``asyncio.run`` and the interpreter's exit wait
for that one's threads), and :meth:`Loading.wait` returns as soon as the stop event is set:
the daemon then goes through its usual shutdown (nothing was accepted yet: no source runs
before the model is loaded) and ``edge.daemon.run_daemon`` ends the process without waiting
for the thread. A load that ends after it was given up closes what it loaded.
Callers: ``edge.daemon``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable, Generic, Optional, Tuple, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Loading(Generic[T]):
    """One run of ``load`` on its own thread; ``close`` is given what it loaded when nobody
    waits for it any more."""

    def __init__(self, load: Callable[[], T], close: Callable[[T], None], name: str = "model-load") -> None:
        self._load = load
        self._close = close
        self._lock = threading.Lock()
        self._given_up = False
        #: (what was loaded, or the error the load raised), once it ended and was not given up
        self._outcome: Optional[Tuple[Optional[T], Optional[BaseException]]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ended: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def running(self) -> bool:
        """Whether the load's thread still runs (a load given up at a stop goes on until it ends)."""
        return self._thread.is_alive()

    async def wait(self, stop: asyncio.Event) -> Optional[T]:
        """Start the load and wait for it to end or for ``stop``: what it loaded (its error
        raised here), or None when ``stop`` came first; the load is then given up."""
        self._loop = asyncio.get_running_loop()
        self._ended = asyncio.Event()
        self._thread.start()
        waits = [asyncio.ensure_future(self._ended.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            with self._lock:  # (also when the wait itself is cancelled)
                outcome = self._outcome
                self._given_up = outcome is None
        if outcome is None:
            return None
        value, error = outcome
        if error is not None:
            raise error
        return value

    def _run(self) -> None:
        value: Optional[T] = None
        error: Optional[BaseException] = None
        try:
            value = self._load()
        except BaseException as exc:  # handed to the waiter, which raises it
            error = exc
        with self._lock:
            given_up = self._given_up
            if not given_up:
                self._outcome = (value, error)
                assert self._loop is not None and self._ended is not None
                self._loop.call_soon_threadsafe(self._ended.set)
        if not given_up:
            return
        if error is not None:
            log.debug("the model load given up at the stop failed: %s", error)
        elif value is not None:
            try:
                self._close(value)
            except Exception:
                log.debug("closing the model loaded after the stop failed", exc_info=True)
