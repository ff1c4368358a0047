"""Whether the cloud answers this device's escalations, as ``/healthz`` shows it: a pure core.

During a cloud outage the daemon does what it was built to do (escalations spooled or kept at
their edge result, the policy's ``onCloudUnavailable``), so nothing in ``/healthz`` said so: an
operator saw it only in the metrics or the log. ``CloudReach`` keeps the outcome of each call the
escalation made to the cloud (live or a spool replay) and says:

- ``unknown``: no call has ended yet (nothing escalated since the start);
- ``answering``: the last call was answered (an answer, or a refusal for good: the cloud
  answered), or fewer than ``FAILING_AFTER`` calls in a row failed since (one missed deadline
  in a busy minute is not an outage);
- ``failing``: ``FAILING_AFTER`` or more calls in a row failed as the policy's
  ``onCloudUnavailable`` is about (unreachable, timed out, busy, refused by the uplink window),
  with how many, since when, and the last failure's words.

``/healthz`` is then ``degraded`` (200: a restart would not bring the cloud back). Calls refused
before they reach the transport (``cloud.max_in_flight`` full) are not outcomes of the cloud and
are not counted. The clock is injected; the caller calls it from the event loop.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

#: failed calls in a row that make the cloud ``failing``
FAILING_AFTER = 3


class CloudReach:
    """The outcomes of the escalation's calls to the cloud (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._answered_at: Optional[float] = None
        self._failures = 0  # failed calls since the last answer
        self._failing_since: Optional[float] = None  # the first of them
        self._last_error = ""

    def answered(self) -> None:
        """The cloud answered a call (an answer, or a refusal for good)."""
        self._answered_at = self._clock()
        self._failures, self._failing_since, self._last_error = 0, None, ""

    def failed(self, error: str) -> None:
        """A call failed as ``onCloudUnavailable`` is about; ``error``: the transport's words."""
        if self._failing_since is None:
            self._failing_since = self._clock()
        self._failures += 1
        self._last_error = error

    def failing(self) -> bool:
        return self._failures >= FAILING_AFTER

    def health(self) -> Dict[str, Any]:
        """The cloud's part of ``/healthz``."""
        now = self._clock()
        ago = None if self._answered_at is None else round(now - self._answered_at, 1)
        if self.failing():
            assert self._failing_since is not None
            return {"state": "failing", "failed_in_a_row": self._failures,
                    "failing_for_s": round(now - self._failing_since, 1), "last_error": self._last_error,
                    "last_answer_s_ago": ago}
        if self._answered_at is None and not self._failures:
            return {"state": "unknown"}
        return {"state": "answering", "last_answer_s_ago": ago}
