"""``edge.loading.Loading``'s rules, with a load that blocks until the test lets it end (pure
logic; the real daemon and a real slow load are in ``test_stop_during_load.py``)."""

from __future__ import annotations

import asyncio
import threading
from typing import List

import pytest

from edge.loading import Loading


def test_a_load_that_ends_first_gives_its_value_and_one_that_fails_raises_its_error() -> None:
    async def run() -> None:
        stop = asyncio.Event()
        assert await Loading(lambda: "model", lambda m: None).wait(stop) == "model"

        def fail() -> str:
            raise ValueError("no such model")

        with pytest.raises(ValueError, match="no such model"):
            await Loading(fail, lambda m: None).wait(stop)

    asyncio.run(run())


def test_a_stop_gives_the_load_up_at_once_and_what_it_loads_later_is_closed() -> None:
    go = threading.Event()
    closed: List[str] = []
    done = threading.Event()

    def load() -> str:
        go.wait(30)
        return "model"

    def close(m: str) -> None:
        closed.append(m)
        done.set()

    loading = Loading(load, close)

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        assert await asyncio.wait_for(loading.wait(stop), 10) is None

    asyncio.run(run())  # returns while the load still runs
    assert loading.running() and not closed
    go.set()
    assert done.wait(30) and closed == ["model"]
