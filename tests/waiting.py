"""Waiting on conditions instead of sleeping: ``wait_until`` (threads, plain tests) and
``async_wait_until`` (inside an event loop). A test never sleeps a fixed time hoping
something happened; it polls the condition with a deadline and fails naming it."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "a condition",
               interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` s pass
    (AssertionError naming ``what``): the tests wait on conditions, never on fixed sleeps."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "a condition",
                           interval: float = 0.02) -> Any:
    """``wait_until`` for coroutines: awaits between polls, so the event loop keeps running.
    ``predicate`` may return an awaitable (e.g. one replay round); its result is the value."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
