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


def said(records: Iterable[logging.LogRecord], logger: str) -> List[str]:
    """The messages of ``logger`` (and its children) among ``records``. A test that counts the
    lines of the code under test must not count another logger's: a gateway or a broker client
    left running by an earlier test in the same process (a session fixture, a thread still
    closing) logs into every later test's ``caplog`` once a CLI test has set the root logger
    to INFO (a CI run failed on a balancer's "readmitted" line that way)."""
    return [r.getMessage() for r in records if r.name == logger or r.name.startswith(logger + ".")]
