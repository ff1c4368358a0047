"""Log records a test asserts on."""

from __future__ import annotations

import logging
from typing import Iterable, List


def errors(records: Iterable[logging.LogRecord]) -> List[str]:
    """``name: message`` of the records at ERROR or above, less the one a loaded machine adds
    without the code under test: grpc.aio's completion queue calling back into an event loop
    that ``asyncio.run`` has just closed (logged by asyncio as ``Event loop is closed``)."""
    return [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR
            and not (r.name == "asyncio" and "PollerCompletionQueue" in r.getMessage())]
