"""Which spooled escalations a replay round steps over (``Escalating.replay_once``): a pure core.

A replay round sends the spool oldest first and stops at the first entry it cannot deliver, so
during an outage the rest waits in order and a round costs one send and one attempt written
(``Spool.nack``). But an entry the cloud can never answer in time (a whole 8K frame on a CPU
pool), or one spooled over a transport that stays down beside one that works, would then hold
every later entry, of every stream, until it expires (``spool.max_age_s``, 24 h by default).

The rule, in one place:

- An entry the cloud failed ``ATTEMPTS`` times in a row is *stuck* (counted here, in memory:
  a restart starts the count again). A failure counts when the replay timed out or its
  transport could not carry it; a refusal as busy (RESOURCE_EXHAUSTED: the cloud keeps its
  room for live requests) is the cloud's load, not the entry's, and does not.
- A stuck entry is stepped over only while **the cloud is known to answer**: the last outcome
  of a request (a live escalation, or the replay of an entry that is not stuck) was an answer,
  less than ``EVIDENCE_S`` ago; and only once it failed at least one try while the cloud was
  known to answer (failures during an outage say nothing about the entry: after one, the head is
  sent first as usual). Its failure then does not stop the round, and between its tries it is
  not sent at all: it rests from the replay interval, doubling with each failure past
  ``ATTEMPTS`` that came while the cloud answered, up to ``MAX_REST_S``. The round's other
  entries are sent as usual. The failure of an entry not known to be stuck for a reason of its
  own (failed fewer than ``ATTEMPTS`` times, or never while the cloud answered) says the cloud
  does not answer: after an outage whose probes failed the entries behind the head, a cloud
  gone again right after one answer would otherwise have every such entry stepped over, sent
  and its attempt written, at every round for ``EVIDENCE_S``.
- When the cloud is not known to answer (no live traffic, only the stuck entry tried), a round
  that stopped at a stuck entry sends one *probe*: the entry behind it that the cloud failed
  least often. An answer to it is the evidence; a failure is counted here and written nowhere.

So during an outage nothing is stepped over: a round sends the head and at most one probe, and
writes one attempt as before. (An earlier rule, "step over a head failed 3 times", counted on
disk and stepped over during outages too: every round then wrote up to ``spool.replay_batch``
attempts, which grew the spool's WAL into a full disk's reserve.)
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Iterable, NamedTuple, Optional, Sequence

#: failures in a row that make an entry stuck
ATTEMPTS = 3
#: how long one answer of the cloud counts as "the cloud answers", seconds
EVIDENCE_S = 60.0
#: the longest rest of a stuck entry between two tries, seconds
MAX_REST_S = 300.0


class _Failures(NamedTuple):
    """One entry's failures in a row: all of them, those while the cloud answered, next try."""

    all: int
    answered: int
    next_try: float


class StuckEntries:
    """Failures per spooled entry and whether the cloud answers; decides what a round skips."""

    def __init__(self, rest_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rest_s = rest_s  # the first rest of a stuck entry (the replay interval)
        self._clock = clock
        self._failures: Dict[int, _Failures] = {}
        self._answered_at: Optional[float] = None  # None: the last outcome was a failure

    def answered(self) -> None:
        """The cloud answered a request (an answer or a refusal for good, live or replayed)."""
        self._answered_at = self._clock()

    def unanswered(self) -> None:
        """A request the cloud should answer was not (unreachable, timed out, saturated)."""
        self._answered_at = None

    def answering(self) -> bool:
        """Whether the cloud is known to answer now."""
        return self._answered_at is not None and self._clock() - self._answered_at <= EVIDENCE_S

    # -- what happened to one entry
    def failed(self, entry: int) -> bool:
        """The cloud failed ``entry`` once more; True when that leaves it stuck. The failure of an
        entry not known to be stuck for a reason of its own (failed fewer than ``ATTEMPTS`` times,
        or never while the cloud answered: the probes of an outage fail every entry they try)
        says the cloud does not answer."""
        was = self._failures.get(entry, _Failures(0, 0, 0.0))
        answered = was.answered + (1 if self.answering() else 0)
        rest = min(self.rest_s * 2.0 ** max(0, answered - ATTEMPTS), MAX_REST_S)
        self._failures[entry] = _Failures(was.all + 1, answered, self._clock() + rest)
        if was.all < ATTEMPTS or was.answered == 0:
            self.unanswered()
        return was.all + 1 >= ATTEMPTS

    def settled(self, entry: int) -> None:
        """``entry`` left the round settled (answered, refused for good, unreadable)."""
        self._failures.pop(entry, None)

    def keep(self, entries: Iterable[int]) -> None:
        """Forget the entries not among ``entries`` (those that left the spool, or lie past a round)."""
        alive = set(entries)
        self._failures = {k: v for k, v in self._failures.items() if k in alive}

    # -- decisions
    def failures(self, entry: int) -> int:
        return self._failures.get(entry, _Failures(0, 0, 0.0)).all

    def stuck(self, entry: int) -> bool:
        return self.failures(entry) >= ATTEMPTS

    def steps_over(self, entry: int) -> bool:
        """Whether the failure of ``entry`` lets the round go on past it."""
        return self.stuck(entry) and self._failures[entry].answered > 0 and self.answering()

    def resting(self, entry: int) -> bool:
        """Whether a round skips ``entry`` without sending it: stepped over, not due yet."""
        return self.steps_over(entry) and self._clock() < self._failures[entry].next_try

    def resting_count(self) -> int:
        """How many entries a round skips now (it reads that many more from the spool)."""
        return sum(1 for entry in self._failures if self.resting(entry))

    def needs_probe(self, entry: int) -> bool:
        """Whether a round stopped by ``entry`` sends a probe behind it."""
        return self.stuck(entry) and not self.answering()

    def probe(self, candidates: Sequence[int]) -> Optional[int]:
        """The entry to probe among ``candidates`` (oldest first): the one failed least often."""
        if not candidates:
            return None
        return min(candidates, key=lambda entry: (self.failures(entry), entry))
