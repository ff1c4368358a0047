"""The escalation transports' window on the uplink: the escalation requests the broker (MQTT)
or the cloud (gRPC) has not acknowledged yet, in bytes, and whether one more can reach it before
its deadline.

An MQTT request, once
handed to paho, is paho's until the broker's PUBACK: over an uplink slower than the escalations
paho kept up to 100 of them in flight (about 49 MB of 1080p frames), and each new one waited
behind them all, so nearly every one reached the cloud after its deadline (7 of 120 answered in
time through a 1 MB/s link, ``tests/edge/transports/test_mqtt_uplink.py``); a hung broker was
handed requests until the keepalive noticed it. ``UplinkWindow`` decides, before a request is
handed to paho, whether it is refused at once instead (the caller raises the ``Refused`` status,
which the escalation takes as it takes a gRPC call's: the policy's ``onCloudUnavailable``):

* **bytes**: the requests not acknowledged, with this one, would pass ``max_bytes``
  (``cloud.mqtt.max_in_flight_bytes``): RESOURCE_EXHAUSTED, as ``cloud.max_in_flight`` refuses;
* **stall**: the oldest request not acknowledged was sent longer ago than this one's deadline
  (a hung broker, a link that stopped): DEADLINE_EXCEEDED, it would wait behind that one;
* **rate**: requests are queueing on the uplink, and the bytes not acknowledged, with this one,
  would take longer than ``UPLOAD_SHARE`` of its deadline (the rest is the cloud's, to answer)
  at the rate the broker has been acknowledging them: DEADLINE_EXCEEDED.

  The rate is the bytes acknowledged over the time the uplink was busy with them, over the last
  ``SAMPLES`` acknowledgements of requests sent while an earlier one was still unacknowledged
  (queued behind it, so the time between the two acknowledgements is the link's; a request sent
  to an idle uplink would count the round trip as transmission time), taken in the last
  ``RATE_MEMORY_S``: the acknowledgements that end a stall (a hung broker that resumes, what
  paho sends again after a reconnect) measure the stall, not the link.

  Queueing: the oldest request not acknowledged has waited more than ``QUEUE_FACTOR`` times the shortest time one of the last ``FLOOR_SAMPLES`` requests
  sent to an idle uplink took (the round trip and a request's own transmission, no queue).
  Without this, on a link the escalations do not fill, the rate was theirs, not the link's
  (acknowledgements come as the requests went), and was read as the link's: 20 escalations a
  second and 8 more at once each second over a fast link with a 300 ms round trip had 44 of 270
  refused, all answered in time without the window. Only requests sent to an idle uplink give
  that shortest time: on a link that stays busy, the shortest recent time is itself queued, and
  the queue read as none let a backlog in. Only the requests waiting now count: a single late
  acknowledgement (a jittery cellular link) also counted once, and refused the burst that followed
  it on a link the escalations do not fill.

An idle uplink (nothing unacknowledged) takes any one request, whatever its size or the rate:
that is also how a rate measured before a stall is measured again. Pure: the clock is injected,
the caller says when a request was sent and acknowledged, and calls it from one thread.
gRPC (``edge.transports.grpc``): a call is cancelled at its deadline and its request freed
with it, but HTTP/2 carries the calls side by side on one connection, so over an uplink slower
than the escalations every call shared the link with those before it and missed its deadline
too (a convoy: 4 of 20 40 kB escalations answered over a 256 kbit/s link, all in the first 4 s,
where about 16 fit; ``tests/edge/transports/test_grpc_uplink.py``). Its window acknowledges a
request when the cloud answers it, at the answer's arrival less the gateway's own time
(``timing.gateway_ms``: the cloud's time is not the link's), forgets a call that ended without
an answer, and has neither the **bytes** rule (``cloud.max_in_flight`` bounds its calls) nor the
**stall** rule (a call waiting in a busy cloud is not a stalled link, and no call outlives its
deadline). Nor does it wait for a rate measured behind another request (``idle_bound``): calls
that overlap share the link and miss their deadlines together, so none is answered to measure
one, and 140 kB whole frames over a 512 kbit/s link with a 3 s deadline stayed a convoy (1 of 20
answered, the link carries about 9); until one is measured, the rate of the requests sent to an
idle uplink stands for it (their round trip counted as transmission: the link's rate is at least
that) for as long again as a call that missed its deadline took, which also makes the uplink
count as queueing (``missed``). Only then: the time a call waits includes the cloud's, and on a
fast link with a long round trip the idle calls' rate is mostly that round trip, which would
refuse calls the link carries in time. For the same reason a call not answered yet is queueing
only when it has waited longer than the cloud's own time lately (the longest ``timing.gateway_ms``
of the last answers, ``acknowledged``' ``answered_at``) and ``QUEUE_FACTOR`` floors: a worker that
batches with a 300 ms max delay behind a 10 MB/s link with a 300 ms round trip made the calls in
flight look queued behind the round trip, and their own rate refused 31 of 100 40 kB calls (10 a
second, 0.9 s deadline) that were all answered in time without the window.

Callers: ``edge.transports.mqtt``, ``edge.transports.grpc``.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Dict, Hashable, NamedTuple, Optional, Tuple

from edgewise import status

#: acknowledgements the rate is measured over, at most, and the seconds they are kept
SAMPLES = 8
RATE_MEMORY_S = 10.0
#: how many times longer than the shortest of the ``FLOOR_SAMPLES`` a request must wait to be queueing
QUEUE_FACTOR = 1.5
#: the share of a deadline the upload may take by the rate: the rest is the cloud's, to answer
UPLOAD_SHARE = 0.75
#: requests sent to an idle uplink whose times give the time without a queue
FLOOR_SAMPLES = 4
#: a request that missed its deadline makes the uplink queueing (``UplinkWindow.missed``) when
#: its own transmission at the rate known takes at least this share of the time it waited
MISSED_SHARE = 0.5
#: ``cloud.mqtt.max_in_flight_bytes``' default: 16 1080p frames, 200 crops of 40 kB
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


class Refused(NamedTuple):
    """A request the window does not let through: its wire status and why."""

    status: int
    message: str


class UplinkWindow:
    """The escalation requests sent and not acknowledged (module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.monotonic,
                 acknowledger: str = "the MQTT broker", refuse_stalled: bool = True,
                 idle_bound: bool = False) -> None:
        self.max_bytes = int(max_bytes)
        self.clock = clock
        #: who acknowledges, as the refusals name it
        self.acknowledger = acknowledger
        #: whether the **stall** rule applies (not to gRPC: module docstring)
        self.refuse_stalled = refuse_stalled
        #: whether, after a miss (``missed``) and without a rate measured, the bytes a second of the
        #: requests sent to an idle uplink stand for it (gRPC: module docstring)
        self.idle_bound = idle_bound
        #: key -> (sent at, bytes, sent to an idle uplink), oldest first
        self._held: Dict[Hashable, Tuple[float, int, bool]] = {}
        self.held_bytes = 0
        self._last_ack: Optional[float] = None
        #: (acknowledged at, bytes, busy seconds)
        self._samples: Deque[Tuple[float, int, float]] = collections.deque(maxlen=SAMPLES)
        #: seconds from sent to acknowledged of the last requests sent to an idle uplink
        self._floor: Deque[float] = collections.deque(maxlen=FLOOR_SAMPLES)
        #: (acknowledged at, bytes a second) of the last requests sent to an idle uplink: each a
        #: rate the link had at least (the round trip counted as transmission time)
        self._idle_rates: Deque[Tuple[float, float]] = collections.deque(maxlen=FLOOR_SAMPLES)
        #: (acknowledged at, seconds the acknowledger itself took) of the last acknowledgements
        self._insides: Deque[Tuple[float, float]] = collections.deque(maxlen=SAMPLES)
        #: until when the uplink counts as queueing after a request missed its deadline (``missed``)
        self._missed_until = float("-inf")

    def __len__(self) -> int:
        return len(self._held)

    def rate(self) -> Optional[float]:
        """Bytes a second the broker acknowledged while the uplink was busy, lately; without such
        acknowledgements in the last ``RATE_MEMORY_S``, with ``idle_bound`` and while a missed
        request makes the uplink queueing (``missed``), the idle requests' rate
        (``_idle_rate``), else None."""
        measured = self._measured()
        if measured is not None:
            return measured
        if self.idle_bound and self.clock() < self._missed_until:
            return self._idle_rate()
        return None

    def _measured(self) -> Optional[float]:
        since = self.clock() - RATE_MEMORY_S
        recent = [(b, s) for at, b, s in self._samples if at >= since]
        seconds = sum(s for _, s in recent)
        return sum(b for b, _ in recent) / seconds if seconds > 0 else None

    def _idle_rate(self) -> Optional[float]:
        """The most bytes a second a request sent to an idle uplink was acknowledged at in the last
        ``RATE_MEMORY_S`` (the last such, when none was: a convoy answers none), or None."""
        since = self.clock() - RATE_MEMORY_S
        bounds = [r for at, r in self._idle_rates if at >= since]
        if not bounds and self._idle_rates:
            bounds = [self._idle_rates[-1][1]]
        return max(bounds) if bounds else None

    def queueing(self) -> bool:
        """Whether requests wait on the uplink now (the module docstring); True before a request
        sent to an idle uplink was acknowledged, to compare with."""
        if not self._floor:
            return True
        if not self._held:
            return False
        now = self.clock()
        if now < self._missed_until:
            return True
        waited = now - next(iter(self._held.values()))[0] - self._inside()
        return waited > QUEUE_FACTOR * min(self._floor)

    def _inside(self) -> float:
        """The longest time the acknowledger itself took (``acknowledged``' ``answered_at`` less
        ``at``) over the last ``SAMPLES`` acknowledgements in ``RATE_MEMORY_S``: 0 for a broker's
        PUBACK; for a gRPC answer, the cloud's time, which a call not answered yet may be spending
        now and not on the link (``queueing``)."""
        since = self.clock() - RATE_MEMORY_S
        return max((inside for at, inside in self._insides if at >= since), default=0.0)

    def refusal(self, size: int, timeout_s: float) -> Optional[Refused]:
        """Why a request of ``size`` bytes with ``timeout_s`` to its deadline is refused now, or None."""
        if not self._held:
            return None
        if self.held_bytes + size > self.max_bytes:
            return Refused(status.RESOURCE_EXHAUSTED, (
                f"{self.held_bytes} bytes of {len(self._held)} escalation requests are not acknowledged by the "
                f"MQTT broker yet; this one's {size} would pass cloud.mqtt.max_in_flight_bytes ({self.max_bytes}): "
                "the uplink is slower than the escalations, or the broker stopped answering"))
        waited = self.clock() - next(iter(self._held.values()))[0]
        if self.refuse_stalled and waited > timeout_s:
            return Refused(status.DEADLINE_EXCEEDED, (
                f"{self.acknowledger} has not acknowledged a request sent {waited:.1f} s ago, past this escalation's "
                f"{timeout_s:.2f} s deadline, which would wait behind it: the uplink or the broker is stalled"))
        rate = self.rate()
        if rate is not None and self.queueing():
            due = (self.held_bytes + size) / rate
            if due > UPLOAD_SHARE * timeout_s:
                return Refused(status.DEADLINE_EXCEEDED, (
                    f"the uplink would carry this {size}-byte request too late for its {timeout_s:.2f} s deadline: "
                    f"{self.held_bytes} bytes are ahead of it and {self.acknowledger} acknowledges "
                    f"{rate / 1000.0:.0f} kB/s ({due:.1f} s)"))
        return None

    def sent(self, key: Hashable, size: int, at: Optional[float] = None) -> None:
        """A request of ``size`` bytes was handed over (``key``: anything that names it) at ``at``
        (the clock's time, before it was handed over; now by default)."""
        if key in self._held:
            return
        self._held[key] = (self.clock() if at is None else at, int(size), not self._held)
        self.held_bytes += int(size)

    def acknowledged(self, key: Hashable, at: Optional[float] = None, answered_at: Optional[float] = None) -> None:
        """The broker acknowledged (or refused) ``key`` at ``at`` (the clock's time; now by default).
        ``answered_at``: when the acknowledgement came, where that is later than ``at`` by the
        acknowledger's own time (a gRPC answer: ``at`` is its arrival less the gateway's time);
        ``at`` by default."""
        at = self.clock() if at is None else at
        entry = self.forget(key)
        if entry is not None:
            self._insides.append((at, max(0.0, (at if answered_at is None else answered_at) - at)))
            took = max(0.0, at - entry[0])
            if entry[2]:
                self._floor.append(took)
                if took > 0:
                    self._idle_rates.append((at, entry[1] / took))
            if self._last_ack is not None and entry[0] < self._last_ack:  # queued behind the last one
                self._samples.append((at, entry[1], max(0.0, at - self._last_ack)))
        if self._last_ack is None or at > self._last_ack:
            self._last_ack = at

    def missed(self, key: Hashable) -> None:
        """``key`` was not acknowledged by its deadline (gRPC: DEADLINE_EXCEEDED): forgotten, and,
        when its own transmission takes ``MISSED_SHARE`` of that time or more at the rate known
        (or none is), for as long again the uplink counts as queueing. A request whose own transmission takes
        most of the shortest time one took sent to an idle uplink can wait behind another for
        less than ``QUEUE_FACTOR`` times that, and still miss its deadline: over HTTP/2, which
        carries the calls side by side, each such call slowed the next, and the convoy went on
        (7 of 7 whole frames at 512 kbit/s after 4 answered)."""
        entry = self.forget(key)
        if entry is not None:
            now = self.clock()
            took, rate = now - entry[0], self._measured() or (self._idle_rate() if self.idle_bound else None)
            # only a request whose own transmission takes much of its deadline: a small one that
            # missed it waited on a slow cloud (a replay served after the live calls), not the link
            if rate is None or entry[1] / rate >= MISSED_SHARE * took:
                self._missed_until = max(self._missed_until, now + took)

    def forget(self, key: Hashable) -> Optional[Tuple[float, int, bool]]:
        """Forget ``key`` (gone without an acknowledgement: a gRPC call that ended without an
        answer, what it carried not known); its entry, if it was held."""
        entry = self._held.pop(key, None)
        if entry is not None:
            self.held_bytes -= entry[1]
        return entry

    def keep_only(self, held: Callable[[Hashable], bool]) -> None:
        """Forget the requests ``held`` says are gone without an acknowledgement (withdrawn at
        their deadline, dropped at a reconnect past their expiry)."""
        for key in [k for k in self._held if not held(k)]:
            self.forget(key)
