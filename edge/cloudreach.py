"""Whether the cloud answers this device's escalations, as ``/healthz`` shows it: a pure core.

During a cloud outage the daemon does what it was built to do (escalations spooled or kept at
their edge result, the policy's ``onCloudUnavailable``), so nothing in ``/healthz`` said so: an
operator saw it only in the metrics or the log. ``CloudReach`` keeps the outcome of each call the
escalation made to the cloud (live or a spool replay) and says:

- ``unknown``: no call has ended yet (nothing escalated since the start);
- ``answering``: the last call was answered (an answer, or a refusal for good of that
  request: the cloud answered), or fewer than ``FAILING_AFTER`` calls in a row failed since
  (one missed deadline in a busy minute is not an outage);
- ``failing``: ``FAILING_AFTER`` or more calls in a row failed as the policy's
  ``onCloudUnavailable`` is about (unreachable, timed out, busy, refused by the uplink window),
  or were refused for this device's token (UNAUTHENTICATED: tokens rotated without it, which
  no resend mends), with how many, since when, and the last failure's words.

``/healthz`` is then ``degraded`` (200: a restart would not bring the cloud back). Calls refused
before they reach the transport (``cloud.max_in_flight`` full) are not outcomes of the cloud and
are not counted. The clock is injected. The event loop records the outcomes; ``health`` is
called from the metrics server's threads (``edge.metrics``), so the state is one tuple, replaced
whole and read once: read field by field, an answer recorded between two reads made ``health``
raise (CPython 3.8 switches threads between any two attribute stores).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, NamedTuple, Optional

#: failed calls in a row that make the cloud ``failing``
FAILING_AFTER = 3


class _State(NamedTuple):
    answered_at: Optional[float]  # the last answer
    failures: int  # failed calls since the last answer
    failing_since: Optional[float]  # the first of them
    last_error: str


def _failing(s: _State) -> bool:
    return s.failures >= FAILING_AFTER


class CloudReach:
    """The outcomes of the escalation's calls to the cloud (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._state = _State(None, 0, None, "")  # replaced whole (the module docstring)

    def answered(self) -> None:
        """The cloud answered a call (an answer, or a refusal for good)."""
        self._state = _State(self._clock(), 0, None, "")

    def failed(self, error: str) -> None:
        """A call failed as ``onCloudUnavailable`` is about; ``error``: the transport's words."""
        was = self._state
        since = self._clock() if was.failing_since is None else was.failing_since
        self._state = _State(was.answered_at, was.failures + 1, since, error)

    def failing(self) -> bool:
        return _failing(self._state)

    def health(self) -> Dict[str, Any]:
        """The cloud's part of ``/healthz`` (from any thread)."""
        s = self._state
        now = self._clock()
        ago = None if s.answered_at is None else round(now - s.answered_at, 1)
        if _failing(s):
            assert s.failing_since is not None
            return {"state": "failing", "failed_in_a_row": s.failures,
                    "failing_for_s": round(now - s.failing_since, 1), "last_error": s.last_error,
                    "last_answer_s_ago": ago}
        if s.answered_at is None and not s.failures:
            return {"state": "unknown"}
        return {"state": "answering", "last_answer_s_ago": ago}
