"""Pure balancer core of the gateway: weighted least-connections and its rivals.

Implements the design in ``docs/design/balancing.md`` with no I/O and an
injected clock, so tests drive it instantly:

* per-endpoint state (docs/design/balancing.md#per-endpoint-state): in-flight count, configured weight, reported
  capacity, slow-start start time, ejection state and count, consecutive
  failures, smooth-WRR current weight;
* effective weight (docs/design/balancing.md#effective-weight) = base weight × Envoy's slow-start factor
  ``max(min_pct, (elapsed/window)^(1/aggression))``. The base weight has one
  meaning, the worker's relative capacity: the configured weight is the
  operator's estimate of it, used until the worker reports a measured capacity
  (``Worker.Load``), which then *replaces* it (never multiplies it: that counted
  the same speed twice, 4:2:1 weights became 16:4:1). Workers that have not
  reported yet are put on the measured scale by the mean capacity per weight
  unit of those that have. ``use_reported_capacity: false`` routes by the
  configured weights alone;
* slow start applies to workers that join a pool already serving (a scale-up,
  a return from ejection, a worker back from NOT_SERVING); the workers a gateway
  starts with skip it, since ramping every endpoint at once ramps none (Envoy's
  slow-start documentation makes the same point for new deployments;
  docs/design/balancing.md#slow-start);
* pick (docs/design/balancing.md#pick-weighted-least-connections): full scan for the minimum HAProxy "load after assignment" key
  ``(work + cost) / w_eff`` (optionally HAProxy idle-first: key 0 when idle),
  ties broken by nginx's smooth weighted round robin (never "first in list");
  ``work`` is the in-flight count, or, on workers whose time grows with the image
  (native input size), the in-flight requests' pixels over the mean request's,
  and their weight their measured pixels/s over the same mean
  (docs/design/balancing.md#work-not-requests): a whole frame counts as the
  several small region payloads it costs;
* outlier ejection (docs/design/balancing.md#outlier-ejection, Envoy defaults): consecutive worker failures eject for
  ``base × ejection_count`` capped at ``max``, never more than
  ``max(1, max_ejection_percent)`` of the pool, count decays each healthy
  interval, slow start restarts on return; panic rule (docs/design/balancing.md#panic-threshold) below 50% healthy;
* admission (docs/design/balancing.md#admission-control, #priority): a worker whose predicted
  queue wait for the request, the work in flight it serves first (the request's priority or
  higher, of its own priority only its device's place on a worker that serves devices in turn,
  and at most one lower request) over its measured rate, exceeds the time left is
  full; a queued request the worker itself expired is not held against it (only a hop that
  runs out is);
* fair share across devices (docs/design/balancing.md#fair-share-across-devices): the live
  requests each device holds in flight are counted; while the pool is contended (a device under
  its share was refused as saturated or had one expire in a worker's queue, or one over it was
  refused, within ``FAIR_WINDOW_S``) a device over its share (the pool's room over the active
  devices, or the room left free if that is more) is refused (``NoPick.OVER_SHARE``), so the
  others find room; with one device active it never
  applies. A replay is sent only while a worker holds
  less than half its cap (docs/design/balancing.md#replays-take-spare-room);
* RESOURCE_EXHAUSTED counts as load (docs/design/balancing.md#overload-is-load-not-failure): the endpoint is
  capped at its current in-flight for ``overload_hold_s``; it is neither a
  success nor an ejection failure;
* draining endpoints (docs/design/balancing.md#draining) are never picked; ``release`` says when the last
  request of a draining endpoint finished so the shell closes its channel;
* alternative modes for the benchmark (docs/design/balancing.md#alternative-pick-modes,
  docs/design/balancing.md#benchmark-plan): round robin, random, static
  smooth WRR, unweighted least-connections, P2C (Envoy/A48 with replacement, or
  distinct, optionally weighted).

A pick returns a ``Ticket`` whose ``release(outcome)`` decrements the in-flight
count exactly once (gRFC A48 counters), whatever the outcome.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cloud.worker.batching import (  # a worker's refusals of its own
    BUSY_MARK,
    EXPIRED_MARK,
    NOT_SERVING_MARK,
    TOO_SHORT_MARK,
)
from edgewise import status
from edgewise.settings import Invalid, check, setting
from edgewise.v1 import detect_pb2

log = logging.getLogger("edgewise.gateway.balancer")

Clock = Callable[[], float]

#: The hop to a worker expires this much before the client's deadline: 10% of the time left,
#: at least 3 ms and at most 50 ms (docs/design/balancing.md#the-hop-expires-first). With the
#: hop sharing the client's deadline, gRPC cancelled the gateway's handler at the same instant
#: the hop expired, so the gateway saw CANCELLED: a hung worker was never counted against and
#: the request was in no metric. The margin is the gateway's time to see the hop's
#: DEADLINE_EXCEEDED, count it and answer the client itself.
HOP_MARGIN_FRACTION = 0.1
HOP_MARGIN_MIN_S = 0.003
HOP_MARGIN_MAX_S = 0.05

#: Load polls in a row that time out before a worker is paused (no picks until a poll answers):
#: a worker that is alive answers a poll within its 1 s timeout even when busy, one that is hung
#: (SIGSTOP, a wedged event loop) never does (docs/design/balancing.md#active-health-checks).
LOAD_TIMEOUTS_TO_PAUSE = 3

#: Workers discovered within this many seconds of the balancer's first endpoint set are the
#: ones "the gateway starts with" (a few load polls at the default 1 s): until they first report
#: serving they skip slow start (docs/design/balancing.md#slow-start).
STARTUP_S = 3.0



def hop_timeout(remaining_s: float) -> float:
    """The timeout of the call to the worker for a request with ``remaining_s`` left: a little
    less, so the hop expires first and the gateway answers (and counts) the timeout itself."""
    margin = min(HOP_MARGIN_MAX_S, max(HOP_MARGIN_MIN_S, HOP_MARGIN_FRACTION * remaining_s))
    return max(0.0, remaining_s - margin)

MODES = ("wlc", "rr", "random", "wrr", "lc", "p2c", "wp2c")
_REL_EPS = 1e-9


class Outcome(enum.Enum):
    """How one forwarded request ended, as the balancer needs to know it."""

    OK = "ok"                # answered (including per-request errors such as INVALID_ARGUMENT)
    OVERLOADED = "overloaded"  # RESOURCE_EXHAUSTED from the worker: load, not success nor failure
    FAILURE = "failure"      # the worker looks bad: UNAVAILABLE, INTERNAL, reset
    TIMED_OUT = "timed_out"  # the hop's deadline passed: a failure, unless the deadline was too short
    #                          for the worker to answer (see Balancer._release)
    #: the worker answered that it queued the request and removed it, its deadline out of reach
    #: (:data:`EXPIRED_MARK`): the worker is alive and answering, the request was overtaken (a
    #: burst, a higher priority sent after it) or mispredicted; load, not failure: nothing counted
    #: (a worker whose model stalls does not answer so, its hops run out: ``TIMED_OUT``)
    EXPIRED = "expired"
    CANCELLED = "cancelled"  # the client gave up: says nothing about the worker
    NOT_SERVING = "not_serving"  # the worker refused for it does not serve (yet): paused, not a failure


def outcome_of(wire_status: int, message: str = "") -> Outcome:
    """How the balancer counts a worker's answer with this wire status (docs/design/balancing.md#outlier-ejection and #overload-is-load-not-failure).

    RESOURCE_EXHAUSTED is load; UNAVAILABLE, INTERNAL and an answer that does not say
    (UNKNOWN on gRPC) make the worker look bad, and so does a hop deadline that gave the
    worker time enough (``TIMED_OUT``); per-request errors (INVALID_ARGUMENT,
    UNAUTHENTICATED) and OK say it works. A worker refusing up front a deadline closer than
    its batch-of-one time (``message`` carries :data:`TOO_SHORT_MARK`) answered correctly for
    the client's deadline: ``CANCELLED``, nothing against the worker. One refusing because it
    does not serve (:data:`NOT_SERVING_MARK`) is ``NOT_SERVING``: paused, not failed. One that
    queued the request and expired it (:data:`EXPIRED_MARK`) is ``EXPIRED``, nothing against the
    worker, told from a hop that ran out on a worker answering nothing (``TIMED_OUT``).
    """
    if refused_too_short(wire_status, message):
        return Outcome.CANCELLED
    if status.row(wire_status).status == status.DEADLINE_EXCEEDED and EXPIRED_MARK in message:
        return Outcome.EXPIRED
    if refused_not_serving(wire_status, message):
        return Outcome.NOT_SERVING
    return _OUTCOMES.get(status.row(wire_status).status, Outcome.OK)


def refused_not_serving(wire_status: int, message: str) -> bool:
    """Whether a worker's answer is its refusal while it does not serve (UNAVAILABLE whose message
    carries :data:`NOT_SERVING_MARK`: warming up, shutting down). What a Load poll reporting
    ``serving=False`` says, learnt sooner: a worker added to the pool is picked before its
    first poll, and one still warming up was ejected for 30 s by its first refusals, though it
    served a second later. It is paused instead (:meth:`Balancer.report_load` readmits it)."""
    return status.row(wire_status).status == status.UNAVAILABLE and NOT_SERVING_MARK in message


def refused_too_short(wire_status: int, message: str) -> bool:
    """Whether a worker's answer is its up-front refusal of a deadline closer than its own batch
    of one (``cloud.worker.batching.Batcher.submit``: DEADLINE_EXCEEDED whose message carries
    :data:`TOO_SHORT_MARK`). It says the request is too urgent for *that* worker, nothing of
    the worker's health (:func:`outcome_of`) and nothing of the others: a faster or less busy
    worker may still make it (:func:`should_retry`)."""
    return status.row(wire_status).status == status.DEADLINE_EXCEEDED and TOO_SHORT_MARK in message


def refused_busy(wire_status: int, message: str) -> bool:
    """Whether a worker's answer is its refusal for its own load (its queue full, its decode
    budget spent: RESOURCE_EXHAUSTED whose message carries :data:`BUSY_MARK`). With several
    gateways, each sees only its own share of a worker's load, so a worker may be full while
    another has room: the request may go there (:func:`should_retry`). A RESOURCE_EXHAUSTED
    without the mark (gRPC's own, for a message over the size limit) would fail anywhere."""
    return status.row(wire_status).status == status.RESOURCE_EXHAUSTED and BUSY_MARK in message


def refused_here(wire_status: int, message: str) -> bool:
    """A worker's refusal that is about that worker (:func:`refused_too_short`,
    :func:`refused_busy`): another may answer, if one may in the time left."""
    return refused_too_short(wire_status, message) or refused_busy(wire_status, message)


_OUTCOMES: dict[int, Outcome] = {
    status.RESOURCE_EXHAUSTED: Outcome.OVERLOADED,
    status.UNAVAILABLE: Outcome.FAILURE,
    status.INTERNAL: Outcome.FAILURE,
    status.DEADLINE_EXCEEDED: Outcome.TIMED_OUT,
    detect_pb2.STATUS_UNSPECIFIED: Outcome.FAILURE,
}


class NoPick(enum.Enum):
    """Why a pick found no endpoint; ``status`` is the wire status the shell answers with."""

    NO_ENDPOINTS = "no_endpoints"  # nothing ready (none known, all draining): UNAVAILABLE
    SATURATED = "saturated"        # every pickable endpoint is at its limit: RESOURCE_EXHAUSTED
    #: the request's device holds more than its fair share of the pool while another device wants
    #: room (docs/design/balancing.md#fair-share-across-devices): RESOURCE_EXHAUSTED
    OVER_SHARE = "over_share"

    @property
    def status(self) -> int:
        return status.UNAVAILABLE if self is NoPick.NO_ENDPOINTS else status.RESOURCE_EXHAUSTED


#: docs/design/balancing.md#fair-share-across-devices: a device is active while it has a live
#: request in flight or asked within this many seconds (the gateway's default deadline: a device
#: waiting out a refusal, or one whose requests come a few seconds apart, still counts), and the
#: pool is contended for this long after a device under its share was refused as saturated or had
#: a request expire in a worker's queue, or one over its share was refused.
FAIR_WINDOW_S = 5.0


@dataclass(frozen=True)
class Share:
    """A device's standing in the pool for one request (:meth:`Balancer.share`): the live
    requests it holds in flight, its fair share of the pool's room for the request (``room``
    over the ``active`` devices, or the room no request holds now if that is more; at least 1)."""

    held: int
    share: float
    active: int
    room: float


@dataclass
class BalancerConfig:
    """Balancer knobs (the gateway's ``balancer`` settings); defaults mirror Envoy's where the
    spec names them. Ranges live in the field metadata (:func:`edgewise.settings.check`)."""

    mode: str = setting("Balancing algorithm: wlc = weighted least-connections (the default), rr = round "
                        "robin, random, wrr = smooth weighted round robin, lc = least-connections, p2c / "
                        "wp2c = power of two choices (unweighted / weighted).", "wlc", choices=MODES)
    #: HAProxy idle-first (docs/design/balancing.md#idle-first): on by default because
    #: bench/routing.py measured a lower p99 at 80-95% load with it than with the plain
    #: (in_flight+1)/w key, which keeps the fastest worker busier than its share.
    idle_first: bool = setting("An endpoint with nothing in flight has key 0, so idle endpoints are shared "
                               "by weighted round robin before any gets a second request.", True)
    #: docs/design/balancing.md#pick-weighted-least-connections: both keys measured side by side by
    #: bench/routing_sim.py (virtual clock) and bench/routing.py --versus (real processes).
    key: str = setting("wlc key: load_after = HAProxy's (in-flight work + this request's cost) / weight (with "
                       "idle_first), active = nginx least_conn's in-flight work / weight, ties going to the "
                       "fastest endpoint; work counts requests, or their pixels (see cost).",
                       "load_after", choices=("load_after", "active"))
    p2c_distinct: bool = setting("p2c: sample two distinct endpoints (gRPC PR #11006) instead of with "
                                 "replacement (gRFC A48).", False)
    slow_start_window_s: float = setting("Slow start: the weight of a worker joining a pool that already "
                                         "serves (scale-up, return from ejection) ramps up over this many "
                                         "seconds; the workers a gateway starts with skip it (0 = off).",
                                         30.0, lo=0)
    slow_start_min_pct: float = setting("Slow start: the weight fraction an endpoint starts at.", 0.10,
                                        lo=0, hi=1, lo_open=True)
    slow_start_aggression: float = setting("Slow start: ramp exponent, (elapsed/window)^(1/aggression) "
                                           "(Envoy's aggression).", 1.0, lo=0, lo_open=True)
    use_reported_capacity: bool = setting("A worker's reported capacity (images/s) replaces its configured "
                                          "weight once reported; false = route by the configured weights "
                                          "alone.", True)
    consecutive_failures: int = setting("Outlier ejection: consecutive worker failures that eject it.", 5, lo=1)
    base_ejection_s: float = setting("Outlier ejection: first ejection time, seconds; multiplied by the "
                                     "ejection count.", 30.0, lo=0, lo_open=True)
    max_ejection_s: float = setting("Outlier ejection: longest ejection, seconds (>= base_ejection_s).", 300.0,
                                    lo=0, lo_open=True)
    max_ejection_percent: float = setting("Outlier ejection: most of the pool ejected at once, percent "
                                          "(at least one endpoint).", 10.0, lo=0, hi=100)
    ejection_decay_interval_s: float = setting("Outlier ejection: a healthy endpoint's ejection count "
                                               "decays by one per this many seconds.", 10.0, lo=0, lo_open=True)
    panic_threshold_percent: float = setting("Panic: below this percent of healthy endpoints, pick among "
                                             "all (Envoy's panic threshold; 0 = never).", 50.0, lo=0, hi=100)
    overload_hold_s: float = setting("After RESOURCE_EXHAUSTED, cap the endpoint at its in-flight count for "
                                     "this many seconds.", 1.0, lo=0)
    max_in_flight: int = setting("Hard per-endpoint cap on requests in flight (nginx max_conns / HAProxy "
                                 "maxconn); 0 = none.", 0, lo=0)
    #: docs/design/balancing.md#work-not-requests: measured by bench/routing_sim.py (its region-mix
    #: rows) and bench/routing.py --mix regions against nginx, which sees only connections.
    cost: str = setting("What one request in flight counts as in the wlc key and the admission check: auto = its "
                        "image's pixels over the mean of recent requests on workers whose time grows with the "
                        "image (they report pixel_rate: native input size; their weight is then that pixels/s "
                        "over the mean request's pixels), 1 on the others; requests = always 1 (nginx / HAProxy).",
                        "auto", choices=("auto", "requests"))
    cost_window: int = setting("cost auto: the mean pixels per request is an exponentially weighted mean over "
                               "about this many requests.", 200, lo=1)

    def validate(self) -> None:
        """Raise ConfigError (a ValueError) naming the bad knob."""
        check(self, "balancer")
        if self.max_ejection_s < self.base_ejection_s:
            raise Invalid("balancer.max_ejection_s", "must be >= base_ejection_s")


def _rate_or_none(v: float | None) -> float | None:
    """A reported images/s: None when absent, <= 0 or not finite (unknown)."""
    return v if v is not None and v > 0 and math.isfinite(v) else None


@dataclass
class _Level:
    """The requests of one priority in flight on one endpoint, and of each device among them
    (the worker serves the devices of one priority in turn: :meth:`Balancer._ahead`)."""

    requests: int = 0
    work: float = 0.0
    #: per device: its requests and their work ("" for a pick that names no device)
    devices: dict[str, list[float]] = field(default_factory=dict)

    def add(self, device: str, cost: float) -> None:
        self.requests += 1
        self.work += cost
        mine = self.devices.setdefault(device, [0.0, 0.0])
        mine[0] += 1
        mine[1] += cost

    def remove(self, device: str, cost: float) -> None:
        self.requests -= 1
        self.work = max(0.0, self.work - cost)
        mine = self.devices.get(device)
        if mine is not None:
            mine[0] -= 1
            mine[1] = max(0.0, mine[1] - cost)
            if mine[0] <= 0:
                del self.devices[device]

    def served_before(self, device: str) -> float:
        """The work of this level the worker serves before one more request of ``device``: in
        turn among the devices (``cloud.worker.batching._Rank``), each other device's first as
        many as ``device`` will then hold, and all of ``device``'s own."""
        mine = self.devices.get(device, [0.0, 0.0])
        turns = mine[0] + 1
        return mine[1] + sum(work * min(1.0, turns / n) for d, (n, work) in self.devices.items()
                             if d != device and n > 0)


@dataclass
class EndpointStats:
    """Mutable per-endpoint state (docs/design/balancing.md#per-endpoint-state). Owned by the Balancer; read it, don't write it."""

    address: str
    weight: float = 1.0
    name: str = ""
    in_flight: int = 0
    work: float = 0.0                  # sum of the in-flight requests' costs (== in_flight with unit costs)
    pixel_rate: float | None = None    # reported pixels/s, only by a worker whose time grows with the pixels
    capacity: float | None = None      # reported images/s; None until the first report
    peak_capacity: float | None = None  # reported images/s at the worker's best batch size (autoscaling only)
    queue_depth: int = 0               # reported
    limit: int = 0                     # reported admission limit (max batch + max queue); 0 = unknown
    devices_in_turn: bool = False      # reported: serves the devices of one priority in turn (_ahead)
    slow_start_t0: float = 0.0
    draining: bool = False
    paused: bool = False               # the worker itself reports not serving (warm-up, SIGTERM)
    ejected_until: float | None = None
    ejection_count: int = 0
    last_decay: float = 0.0
    consecutive_failures: int = 0
    current_weight: float = 0.0        # smooth WRR state
    overload_cap: int | None = None
    overload_until: float = 0.0
    picks: int = 0
    ejections: int = 0
    load_timeouts: int = 0             # Load polls in a row that timed out
    #: EWMA of the round trip of requests picked while the endpoint was idle: its batch-of-one
    #: latency as the gateway sees it (hop, decode, compute); None before the first
    idle_answer_s: float | None = None
    starting: bool = False             # one the gateway started with that has not served yet
    #: the work in flight by request priority; a level with nothing in flight is dropped
    #: (docs/design/balancing.md#priority)
    levels: dict[int, _Level] = field(default_factory=dict)

    def ejected(self, now: float) -> bool:
        return self.ejected_until is not None and now < self.ejected_until


@dataclass
class Ticket:
    """A granted pick. ``release`` must be called exactly once (extra calls are no-ops)."""

    address: str
    _balancer: Balancer = field(repr=False)
    cost: float = 1.0  # what the request counts as in the endpoint's work in flight
    #: the request's remaining time at the pick, and how long the endpoint was expected to
    #: take to answer it then (its work in flight, this request included, over its measured
    #: rate); None when unknown
    deadline_s: float | None = None
    expected_s: float | None = None
    #: when it was picked (the balancer's clock) and whether the endpoint was idle then: the
    #: round trip of an idle pick answered OK is the endpoint's batch-of-one latency
    picked_at: float = 0.0
    idle: bool = False
    priority: int = 0  # the request's (higher = sooner)
    #: the device whose live request it is, counted in its fair share until released
    #: (docs/design/balancing.md#fair-share-across-devices); None: not counted (a replay, or a
    #: pick that names no device)
    device: str | None = None
    #: the device it was picked for, replays too, in its endpoint's per-priority count ("": none)
    sender: str = ""
    _released: bool = field(default=False, repr=False)

    def release(self, outcome: Outcome) -> bool:
        """End the request; True when the endpoint is drained and its channel can close."""
        if self._released:
            return False
        self._released = True
        if outcome is Outcome.TIMED_OUT and self.hopeless():
            outcome = Outcome.CANCELLED  # the client asked for less time than any answer takes
        return self._balancer._release(self.address, outcome, self.cost, self)

    def hopeless(self) -> bool:
        """The deadline was shorter than the endpoint's expected answer time at the pick: its
        expiry says nothing about the worker (a client sending 5 ms deadlines must not get a
        healthy worker ejected)."""
        return self.deadline_s is not None and self.expected_s is not None and self.deadline_s < self.expected_s


class Balancer:
    """The pool's decision core: membership, picks, outcomes, ejection."""

    def __init__(
        self,
        config: BalancerConfig | None = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config or BalancerConfig()
        self.config.validate()
        self.clock = clock
        self.rng = rng or random.Random()
        self.endpoints: dict[str, EndpointStats] = {}
        self._rr = 0
        self._per_weight: float | None = None  # mean reported capacity per configured weight unit
        self._mean_pixels: float | None = None  # EWMA of the pixels per request (cost auto)
        self._first_set_at: float | None = None  # when the first endpoint set came (STARTUP_S)
        # docs/design/balancing.md#fair-share-across-devices
        self._held: dict[str, int] = {}  # device -> its live requests in flight (absent: none)
        self._seen: OrderedDict[str, float] = OrderedDict()  # active device -> when it last asked or ended one
        self._contended_until = -math.inf

    # ---- membership ------------------------------------------------------------------
    def set_endpoints(self, endpoints: Iterable[tuple[str, float, str, bool]]) -> list[str]:
        """Apply a full endpoint set of (address, weight, name, draining).

        New ready addresses start slow start; addresses that vanish or turn
        draining stop receiving picks. Returns addresses whose channels can be
        closed now (draining with nothing in flight); those are forgotten.
        """
        now = self.clock()
        if self._first_set_at is None:
            self._first_set_at = now
        starting = now - self._first_set_at <= STARTUP_S
        start = now - self.config.slow_start_window_s if starting else self._slow_start_t0(now)
        seen = set()
        for address, weight, name, draining in endpoints:
            if not weight > 0 or not math.isfinite(weight):
                raise ValueError(f"endpoint {address}: weight must be a finite number > 0, got {weight}")
            seen.add(address)
            ep = self.endpoints.get(address)
            if ep is None:
                ep = EndpointStats(address=address, weight=weight, name=name or address,
                                   slow_start_t0=start, last_decay=now, draining=draining,
                                   starting=starting)
                self.endpoints[address] = ep
                continue
            ep.weight = weight
            ep.name = name or ep.name
            if ep.draining and not draining:  # back to ready: warm up again
                ep.slow_start_t0 = self._slow_start_t0(now, ep)
            ep.draining = draining
        for address, ep in self.endpoints.items():
            if address not in seen:
                ep.draining = True
        closable = [a for a, ep in self.endpoints.items() if ep.draining and ep.in_flight == 0]
        for a in closable:
            del self.endpoints[a]
        self._update_scale()
        return closable

    def _update_scale(self) -> None:
        reporting = [e for e in self.endpoints.values() if e.capacity is not None and not e.draining]
        self._per_weight = (sum(e.capacity for e in reporting if e.capacity is not None)
                            / sum(e.weight for e in reporting)) if reporting else None

    def report_load(self, address: str, capacity: float | None, queue_depth: int = 0,
                    limit: int = 0, serving: bool = True, peak_capacity: float | None = None,
                    pixel_rate: float | None = None, devices_in_turn: bool = False) -> None:
        """Record a worker's Load report (capacities in images/s; <=0 means unknown).

        A worker reporting ``serving=False`` gets no picks until it serves again
        (slow start restarts then). ``pixel_rate``: pixels/s, reported only by a worker whose
        time per image grows with the image's pixels (docs/design/balancing.md#work-not-requests).
        ``devices_in_turn``: the worker serves the devices of one priority in turn, so a
        request's predicted wait counts its device's place (:meth:`_ahead`); older workers
        serve them in arrival order and do not say it.
        """
        ep = self.endpoints.get(address)
        if ep is None:
            return
        now = self.clock()
        ep.load_timeouts = 0
        if ep.paused and serving:
            # one the gateway started with, serving for the first time, skips the ramp
            ep.slow_start_t0 = (now - self.config.slow_start_window_s if ep.starting
                                else self._slow_start_t0(now, ep))
            if ep.ejected_until is not None and now < ep.ejected_until:  # its ejection runs on
                log.info("worker %s reports serving again; still ejected for %.0f s", ep.name,
                         ep.ejected_until - now)
            else:
                log.info("worker %s readmitted: it reports serving again%s", ep.name,
                         "" if self.slow_start_factor(ep, now) >= 1.0 else " (slow start restarts)")
        elif not ep.paused and not serving:
            log.warning("worker %s paused: it reports not serving (warming up or shutting down)", ep.name)
        if serving:
            ep.starting = False
        ep.paused = not serving
        ep.pixel_rate = _rate_or_none(pixel_rate)
        ep.devices_in_turn = devices_in_turn
        ep.capacity = _rate_or_none(capacity)
        ep.peak_capacity = _rate_or_none(peak_capacity)
        ep.queue_depth = max(0, int(queue_depth))
        ep.limit = max(0, int(limit))
        self._update_scale()

    def mark_unreachable(self, address: str) -> None:
        """A Load poll could not reach the worker: no picks until a poll reports it serving."""
        ep = self.endpoints.get(address)
        if ep is not None:
            if not ep.paused:
                log.warning("worker %s paused: its Load poll could not reach it (UNAVAILABLE); no picks "
                            "until a poll does", ep.name)
            ep.paused = True

    def load_timed_out(self, address: str) -> None:
        """A Load poll timed out. One is load; :data:`LOAD_TIMEOUTS_TO_PAUSE` in a row say the
        worker is hung (it accepts connections but answers nothing): paused, no picks until a
        poll answers (docs/design/balancing.md#active-health-checks)."""
        ep = self.endpoints.get(address)
        if ep is None:
            return
        ep.load_timeouts += 1
        if ep.load_timeouts >= LOAD_TIMEOUTS_TO_PAUSE and not ep.paused:
            log.warning("worker %s paused: %d Load polls in a row timed out (hung?); no picks until a "
                        "poll answers", ep.name, ep.load_timeouts)
            ep.paused = True

    def _slow_start_t0(self, now: float, joining: EndpointStats | None = None) -> float:
        """Slow-start origin of a worker (re)joining now: now when another worker already
        serves at full weight, else the past (a pool whose every member is new ramps none)."""
        established = any(ep is not joining and not ep.draining and not ep.paused and not ep.ejected(now)
                          and self.slow_start_factor(ep, now) >= 1.0 for ep in self.endpoints.values())
        return now if established else now - self.config.slow_start_window_s

    # ---- weights -------------------------------------------------------------------------
    def slow_start_factor(self, ep: EndpointStats, now: float) -> float:
        """Envoy slow start (docs/design/balancing.md#slow-start): max(min_pct, (elapsed/window)^(1/aggression))."""
        c = self.config
        t0 = ep.slow_start_t0
        if ep.ejected_until is not None and now >= ep.ejected_until:
            t0 = max(t0, ep.ejected_until)  # back from ejection, not yet refreshed: ramping already
        elapsed = now - t0
        if c.slow_start_window_s <= 0 or elapsed >= c.slow_start_window_s:
            return 1.0
        frac = max(elapsed, 0.0) / c.slow_start_window_s
        return max(c.slow_start_min_pct, frac ** (1.0 / c.slow_start_aggression))

    def base_weight(self, ep: EndpointStats) -> float:
        """The worker's relative capacity: its measured rate once reported (mean-sized requests
        per second: its pixels/s over the mean request's pixels where requests cost their
        pixels, else its images/s), else its configured weight (scaled by the reporting
        workers' images/s per weight unit)."""
        if not self.config.use_reported_capacity:
            return ep.weight
        per_pixel = self._pixel_weight(ep)
        if per_pixel is not None:
            return per_pixel
        if not self._per_weight:
            return ep.weight
        if ep.capacity is not None:
            return ep.capacity
        return ep.weight * self._per_weight

    def _pixel_weight(self, ep: EndpointStats) -> float | None:
        """Mean-sized requests per second of a worker whose requests cost their pixels."""
        if self.config.cost != "auto" or ep.pixel_rate is None or not self._mean_pixels:
            return None
        return ep.pixel_rate / self._mean_pixels

    def effective_weight(self, ep: EndpointStats, now: float | None = None) -> float:
        now = self.clock() if now is None else now
        return self.base_weight(ep) * self.slow_start_factor(ep, now)

    def key(self, ep: EndpointStats, now: float, cost: float = 1.0, idle_peer: bool | None = None) -> float:
        """The wlc key of ``ep`` for a request of ``cost`` (docs/design/balancing.md#pick-weighted-least-connections):
        ``load_after``, HAProxy's load after assignment ``(work + cost) / w_eff``, 0 for an
        idle endpoint out of slow start with ``idle_first``; ``active``, nginx least_conn's
        ``work / w_eff`` (``idle_first`` does not apply: an idle endpoint keys 0 anyway).
        ``work`` is the sum of the costs in flight: the in-flight count when every request
        costs 1 (docs/design/balancing.md#work-not-requests), plus ``_failure_load`` for an
        endpoint picked although ejected or due for ejection (never idle-first then). ``idle_peer``: whether a
        candidate is idle at full weight (None: any pickable endpoint)."""
        # Idle-first skips endpoints still in slow start, or an idle new worker would get
        # every request it can take and the ramp would mean nothing.
        failing = self._failure_load(ep, now)
        work = ep.work + failing
        if self.config.key == "active":  # an idle endpoint in slow start takes one at a time
            return work / self.effective_weight(ep, now)
        # Idle-first is for requests of one cost; where they cost their pixels the key is already
        # the time to finish, and an idle slow worker is no place for a whole frame.
        if self.config.idle_first and ep.in_flight == 0 and not failing and self._pixel_weight(ep) is None:
            # An idle endpoint in slow start ties with idle peers at full weight (light load), so
            # smooth WRR gives it a share that follows its ramped weight; alone idle (the others
            # busy) it keeps its key, or it would take every request it can and the ramp would
            # mean nothing (docs/design/balancing.md#idle-first).
            if self.slow_start_factor(ep, now) >= 1.0:
                return 0.0
            if idle_peer is None:
                idle_peer = self._idle_peer(self._pickable(now), now)
            if idle_peer:
                return 0.0
        return (work + cost) / self.effective_weight(ep, now)

    def _failure_load(self, ep: EndpointStats, now: float) -> float:
        """What the wlc key adds to the work of a worker that is ejected, or would be but for the
        ``max_ejection_percent`` cap: ``consecutive_failures`` requests (0 for any other). Such a
        worker is a candidate only because the cap held (two failing workers of four: one may be
        ejected) or in panic (which readmits the ejected); failing at once, it has nothing in
        flight, so least-connections took it for the least loaded and sent it most of the
        traffic (two failing of four, with the defaults: the one the cap kept took 281 requests to 82 for
        each healthy one, and 64% failed while the healthy pair had room). As a RESOURCE_EXHAUSTED holds a
        worker at its load (Linkerd's load biaser), its failures are
        load: it takes a request when its peers have that many in flight, and one success (which
        ends the streak) brings it back at once. Below the threshold nothing changes: a worker
        fails its way to an ejection as before."""
        c = self.config
        if ep.ejected(now) or ep.consecutive_failures >= c.consecutive_failures:
            return float(c.consecutive_failures)
        return 0.0

    def _idle_peer(self, eps: Iterable[EndpointStats], now: float) -> bool:
        """Some endpoint of ``eps`` has idle-first key 0 at full weight."""
        return any(ep.in_flight == 0 and self._pixel_weight(ep) is None and not self._failure_load(ep, now)
                   and self.slow_start_factor(ep, now) >= 1.0 for ep in eps)

    def _pickable(self, now: float) -> list[EndpointStats]:
        return [ep for ep in self.endpoints.values() if not ep.draining and not ep.paused and not ep.ejected(now)]

    def cost(self, ep: EndpointStats, pixels: int) -> float:
        """What a request of ``pixels`` counts as on ``ep`` (docs/design/balancing.md#work-not-requests):
        its pixels over the recent mean (clamped to [1/16, 16]) where the endpoint's time grows
        with the image (it reports ``pixel_rate``) and ``cost: auto``, else 1."""
        if pixels <= 0 or self._pixel_weight(ep) is None:
            return 1.0
        assert self._mean_pixels
        return min(16.0, max(1.0 / 16.0, pixels / self._mean_pixels))

    # ---- health bookkeeping ----------------------------------------------------------------
    def refresh(self) -> None:
        """Bring ejections, decay and overload holds up to the clock. Picks do it; views
        (``/pool``) and the poll loop call it too, so a return from ejection shows (and is
        logged) when it happens, not at the next pick."""
        self._refresh(self.clock())

    def _refresh(self, now: float) -> None:
        c = self.config
        for ep in self.endpoints.values():
            if ep.ejected_until is not None and now >= ep.ejected_until:
                # back: slow start restarts from the moment the ejection ended, whenever this
                # runs (docs/design/balancing.md#outlier-ejection)
                back = ep.ejected_until
                ep.ejected_until = None
                ep.slow_start_t0 = max(ep.slow_start_t0, back)
                ep.last_decay = back
                ep.consecutive_failures = 0
                log.info("worker %s readmitted: its ejection ended (ejected %d times; slow start restarts)",
                         ep.name, ep.ejection_count)
            if ep.ejected_until is None and ep.ejection_count > 0:
                steps = int((now - ep.last_decay) // c.ejection_decay_interval_s)
                if steps > 0:
                    ep.ejection_count = max(0, ep.ejection_count - steps)
                    ep.last_decay += steps * c.ejection_decay_interval_s
            if ep.overload_cap is not None and now >= ep.overload_until:
                ep.overload_cap = None

    def _cap(self, ep: EndpointStats) -> int | None:
        caps = [c for c in (self.config.max_in_flight or None, ep.limit or None, ep.overload_cap) if c]
        return min(caps) if caps else None

    def _full(self, ep: EndpointStats, now: float, deadline_s: float | None, priority: int = 0,
              replay: bool = False, device: str | None = None) -> bool:
        cap = self._cap(ep)
        if cap is not None and ep.in_flight >= cap:
            return True
        # A replay takes only room live requests leave: it is sent while the worker holds less
        # than half its limit, so replays never hold more than half of it
        # (docs/design/balancing.md#replays-take-spare-room); an idle one always takes one (a
        # cap of 1, as balancer.max_in_flight: 1 or an overload hold make it, would never drain
        # a spool otherwise).
        if replay and cap is not None and ep.in_flight >= max(1, cap // 2):
            return True
        # Admission: predicted queue wait (work ahead of this priority / measured rate) past the deadline.
        rate = self._pixel_weight(ep) or ep.capacity
        if deadline_s is not None and rate:
            if self._ahead(ep, priority, device) / rate > deadline_s:
                return True
        return False

    @staticmethod
    def _ahead(ep: EndpointStats, priority: int, device: str | None = None) -> float:
        """The work in flight on ``ep`` that the worker serves before a request of ``priority``
        from ``device`` (docs/design/balancing.md#priority): that of a higher priority (its queue
        is served highest first), of the same priority what the worker serves before it (the
        devices in turn, ``_Level.served_before``, on a worker that reports doing so; all of it
        when ``device`` is None or the worker serves in arrival order), and of the
        lower ones at most one request's (one may be running: a batch is not interrupted)."""
        lower = sum(level.work for p, level in ep.levels.items() if p < priority)
        ahead = ep.work if not lower else max(0.0, ep.work - lower) + min(lower, 1.0)
        same = ep.levels.get(priority)
        if device is not None and same is not None and ep.devices_in_turn:
            ahead -= max(0.0, same.work - same.served_before(device))
        return max(0.0, ahead)

    def in_panic(self, now: float | None = None) -> bool:
        """Envoy panic (docs/design/balancing.md#panic-threshold): fewer than panic_threshold% of the live endpoints are healthy."""
        now = self.clock() if now is None else now
        live = [ep for ep in self.endpoints.values() if not ep.draining]
        if not live or self.config.panic_threshold_percent <= 0:
            return False
        # a paused endpoint (reports not serving, or its load poll fails) is not healthy: with
        # one worker ejected and the other paused, nothing was pickable and every request failed
        healthy = sum(1 for ep in live if not ep.ejected(now) and not ep.paused)
        return 100.0 * healthy / len(live) < self.config.panic_threshold_percent

    # ---- pick ------------------------------------------------------------------------------
    def candidates(self, now: float, exclude: Sequence[str] = (), deadline_s: float | None = None,
                   pixels: int = 0, in_time: bool = False, priority: int = 0,
                   replay: bool = False, device: str | None = None) -> tuple[list[EndpointStats], NoPick | None]:
        """Pickable endpoints now, or why there are none, for a request of ``pixels``, ``priority``
        and ``device`` (a ``replay``: only where it leaves live requests their room). ``in_time``
        (with ``deadline_s``): only those that may answer it within ``deadline_s``
        (:meth:`_may_answer`)."""
        live = [ep for ep in self.endpoints.values()
                if not ep.draining and not ep.paused and ep.address not in exclude]
        if not live:
            return [], NoPick.NO_ENDPOINTS
        panic = self.in_panic(now)
        healthy = live if panic else [ep for ep in live if not ep.ejected(now)]
        if not healthy:
            return [], NoPick.NO_ENDPOINTS
        cands = [ep for ep in healthy if not self._full(ep, now, deadline_s, priority, replay, device)]
        if in_time and deadline_s is not None:
            cands = [ep for ep in cands if self._may_answer(ep, deadline_s, pixels, priority, device)]
        if not cands:
            return [], NoPick.SATURATED
        return cands, None

    def _may_answer(self, ep: EndpointStats, within_s: float, pixels: int, priority: int = 0,
                    device: str | None = None) -> bool:
        """Whether ``ep`` may answer a request of ``pixels``, ``priority`` and ``device`` within
        ``within_s``: the time it is expected to take with the request added (:meth:`_expected_s`)
        is shorter, or not known yet (nothing measured: it may)."""
        expected = self._expected_s(ep, self.cost(ep, pixels), priority, device)
        return expected is None or expected < within_s

    def may_answer_within(self, within_s: float, exclude: Sequence[str] = (), pixels: int = 0,
                          in_time: bool = True, priority: int = 0, device: str | None = None) -> bool:
        """Whether a pick now, away from ``exclude``, would find an endpoint that may answer a
        request of ``pixels`` within ``within_s`` (:meth:`_may_answer`): what a retry after a
        worker's refusal of a too-short deadline needs (:func:`should_retry`,
        docs/design/balancing.md#retries-and-the-retry-budget). A worker no faster and no less
        busy than the one that refused would refuse too: not worth the retry budget. With
        ``in_time=False``, whether a pick with ``within_s`` left would find an endpoint at all
        (what a retry after UNAVAILABLE needs: with no other worker there is no retry to send)."""
        now = self.clock()
        self._refresh(now)
        return self.candidates(now, exclude, within_s, pixels, in_time, priority, device=device)[1] is None

    def pick(self, exclude: Sequence[str] = (), deadline_s: float | None = None, pixels: int = 0,
             in_time: bool = False, priority: int = 0, device: str | None = None,
             replay: bool = False) -> Ticket | NoPick:
        """Choose an endpoint and count the request in flight at once (docs/design/balancing.md#per-endpoint-state).

        ``exclude``: addresses already tried (retry on another host, docs/design/balancing.md#retries-and-the-retry-budget).
        ``deadline_s``: remaining time; endpoints whose predicted queue wait exceeds
        it are treated as saturated (admission control).
        ``pixels``: the request image's declared pixels (0 = unknown), its cost on workers
        whose time grows with the image (docs/design/balancing.md#work-not-requests).
        ``in_time``: only among endpoints that may answer within ``deadline_s``
        (:meth:`may_answer_within`; the retry after a worker refused the deadline as too short).
        ``priority``: the request's (higher = sooner); the predicted wait counts only the work
        the worker serves before it (docs/design/balancing.md#priority).
        ``device``: whose live request it is, for its fair share of a contended pool (None: not
        counted; docs/design/balancing.md#fair-share-across-devices). ``replay``: a replay from
        an edge's spool, sent only where it leaves live requests their room
        (docs/design/balancing.md#replays-take-spare-room), never counted in a share.
        """
        now = self.clock()
        self._refresh(now)
        fair = device is not None and not replay
        if fair:
            assert device is not None
            self._touch(device, now)
            if self._over_share(device, now, deadline_s):
                self._contended_until = now + FAIR_WINDOW_S
                return NoPick.OVER_SHARE
        cands, why = self.candidates(now, exclude, deadline_s, pixels, in_time, priority, replay, device)
        if why is not None:
            if fair and why is NoPick.SATURATED and not exclude and len(self._seen) >= 2:
                assert device is not None
                standing = self.share(device, deadline_s, now)
                if standing is not None and standing.held + 1 <= standing.share:
                    self._contended_until = now + FAIR_WINDOW_S  # a device under its share got no room
            return why
        costs = {ep.address: self.cost(ep, pixels) for ep in cands}
        chosen = self._choose(cands, now, costs)
        cost = costs[chosen.address]
        idle = chosen.in_flight == 0
        expected = self._expected_s(chosen, cost, priority, device)  # its place among what is in flight
        chosen.in_flight += 1
        chosen.work += cost
        chosen.picks += 1
        chosen.levels.setdefault(priority, _Level()).add(device or "", cost)
        if pixels > 0 and not exclude:  # once per request, not again for its retry
            alpha = 1.0 / self.config.cost_window
            self._mean_pixels = (float(pixels) if self._mean_pixels is None
                                 else self._mean_pixels + alpha * (pixels - self._mean_pixels))
        if fair:
            assert device is not None
            self._held[device] = self._held.get(device, 0) + 1
        return Ticket(chosen.address, self, cost, deadline_s, expected, now, idle, priority,
                      device if fair else None, device or "")

    # ---- fair share across devices (docs/design/balancing.md#fair-share-across-devices) ----
    def _touch(self, device: str, now: float) -> None:
        """``device`` asked, or ended a request, now: it is active for :data:`FAIR_WINDOW_S`. The
        devices that were last active longer ago are forgotten, but for those with a live request
        in flight (active still). Amortised O(1): the least recent come first."""
        self._seen[device] = now
        self._seen.move_to_end(device)
        self._prune(now)

    def _prune(self, now: float) -> None:
        horizon = now - FAIR_WINDOW_S
        while self._seen:
            first, when = next(iter(self._seen.items()))
            if when >= horizon:
                break
            if self._held.get(first):
                self._seen[first] = now
                self._seen.move_to_end(first)
            else:
                del self._seen[first]

    def _room(self, now: float, deadline_s: float | None) -> tuple[float, int]:
        """The live requests the pool may hold for a request with ``deadline_s`` to go: over the
        endpoints a pick may find, each one's cap (``max_in_flight``, its reported limit, an
        overload hold) and its measured rate times the time left, the smaller; inf when an
        endpoint has neither (nothing to share out). With it, the requests those endpoints hold
        in flight now (whoever's: a replay takes room too)."""
        live = [ep for ep in self.endpoints.values() if not ep.draining and not ep.paused]
        if not self.in_panic(now):
            live = [ep for ep in live if not ep.ejected(now)]
        room = 0.0
        used = 0
        for ep in live:
            cap = self._cap(ep)
            rate = self._pixel_weight(ep) or ep.capacity
            by_time = rate * deadline_s if rate and deadline_s is not None else math.inf
            room += min(math.inf if cap is None else float(cap), by_time)
            used += ep.in_flight
        return room, used

    def share(self, device: str, deadline_s: float | None = None, now: float | None = None) -> Share | None:
        """``device``'s standing for a request with ``deadline_s`` to go (:class:`Share`): None
        when the pool's room is not known (an endpoint with neither a cap nor a measured rate)
        or there is none (no endpoint a pick may find: that is answered as such, not as a share)."""
        now = self.clock() if now is None else now
        self._prune(now)
        room, used = self._room(now, deadline_s)
        if not math.isfinite(room) or room <= 0:
            return None
        active = max(1, len(self._seen))
        # the equal split, or the room still free, whichever is more (Choudhury and Hahne's
        # dynamic threshold: a device may hold as much as is left free, so it takes at most half
        # of what the others leave and the other half stays for them): an active device is one
        # that asked in the last FAIR_WINDOW_S, most of which hold nothing most of that time, so
        # with hundreds of light devices the equal split alone was 1 request and a heavy device was
        # held to it while the pool stood mostly empty (docs/design/balancing.md#fair-share-across-devices)
        return Share(self._held.get(device, 0), max(1.0, room / active, room - used), active, room)

    def _over_share(self, device: str, now: float, deadline_s: float | None) -> bool:
        """Whether a live request of ``device`` is refused for its share: the pool is contended (a
        device under its share was refused as saturated or had a request expire in a worker's
        queue, or one over its share was refused, within :data:`FAIR_WINDOW_S`), another device
        is active, and one more request would put ``device`` over its fair share of the pool's
        room. With one device it never is."""
        if len(self._seen) < 2 or now >= self._contended_until:
            return False
        standing = self.share(device, deadline_s, now)
        return standing is not None and standing.held + 1 > standing.share

    def _expected_s(self, ep: EndpointStats, adding: float = 0.0, priority: int = 0,
                    device: str | None = None) -> float | None:
        """How long ``ep`` should take to answer a request of ``priority`` (and ``device``) just picked
        (or, with ``adding``, one of that cost if it were picked now): the work in flight it serves first
        (:meth:`_ahead`) over its measured rate, and never less than its measured batch-of-one
        round trip (a rate says nothing of the hop, the decode or a batching worker's
        batch-of-one time); None when neither is known."""
        rate = self._pixel_weight(ep) or ep.capacity
        cands = [v for v in ((self._ahead(ep, priority, device) + adding) / rate if rate else None, ep.idle_answer_s)
                 if v is not None]
        return max(cands) if cands else None

    def _choose(self, cands: list[EndpointStats], now: float, costs: dict[str, float]) -> EndpointStats:
        mode = self.config.mode
        if len(cands) == 1:
            return cands[0]
        if mode == "wlc":
            peer = self._idle_peer(cands, now)
            keys = [self.key(ep, now, costs[ep.address], peer) for ep in cands]
            best = min(keys)
            tied = [ep for ep, k in zip(cands, keys) if k <= best * (1 + _REL_EPS) + 1e-15]
            if self.config.key == "active" and len(tied) > 1:  # the fastest of the tied; equals by smooth WRR
                ws = [self.effective_weight(ep, now) for ep in tied]
                top = max(ws)
                tied = [ep for ep, w in zip(tied, ws) if w >= top * (1 - _REL_EPS)]
            return self._smooth_wrr(tied, now)
        if mode == "rr":
            self._rr += 1
            ordered = sorted(cands, key=lambda e: e.address)
            return ordered[self._rr % len(ordered)]
        if mode == "random":
            return self.rng.choice(cands)
        if mode == "wrr":
            return self._smooth_wrr(cands, now)
        if mode == "lc":
            least = min(ep.in_flight for ep in cands)
            return self.rng.choice([ep for ep in cands if ep.in_flight == least])
        if mode == "p2c":  # Envoy / gRFC A48: unweighted, strictly-fewer wins, first sample on tie
            if self.config.p2c_distinct:
                a, b = self.rng.sample(cands, 2)
            else:
                a, b = self.rng.choice(cands), self.rng.choice(cands)
            return b if b.in_flight < a.in_flight else a
        # wp2c: two distinct samples by weight (HAProxy random(2)), keep the lower key
        weights = [self.effective_weight(ep, now) for ep in cands]
        i = self.rng.choices(range(len(cands)), weights=weights)[0]
        rest = [j for j in range(len(cands)) if j != i]
        j = self.rng.choices(rest, weights=[weights[k] for k in rest])[0]
        ka = (cands[i].in_flight + 1) / weights[i]
        kb = (cands[j].in_flight + 1) / weights[j]
        return cands[j] if kb < ka else cands[i]

    def _smooth_wrr(self, tied: list[EndpointStats], now: float) -> EndpointStats:
        """nginx smooth WRR: cw += w for each, pick max cw, subtract the total from it."""
        total = 0.0
        best: EndpointStats | None = None
        for ep in tied:
            w = self.effective_weight(ep, now)
            ep.current_weight += w
            total += w
            if best is None or ep.current_weight > best.current_weight:
                best = ep
        assert best is not None
        best.current_weight -= total
        return best

    # ---- outcomes --------------------------------------------------------------------------
    def _release(self, address: str, outcome: Outcome, cost: float = 1.0, ticket: Ticket | None = None) -> bool:
        if ticket is not None and ticket.device is not None:  # first: its endpoint may be gone
            held = self._held.get(ticket.device, 0) - 1
            if held > 0:
                self._held[ticket.device] = held
            else:
                self._held.pop(ticket.device, None)
            self._touch(ticket.device, self.clock())
            if outcome is Outcome.EXPIRED and len(self._seen) >= 2:
                # admitted, but the worker's queue ran it out of time: as good as refused
                standing = self.share(ticket.device, ticket.deadline_s)
                if standing is not None and standing.held + 1 <= standing.share:
                    self._contended_until = self.clock() + FAIR_WINDOW_S
        ep = self.endpoints.get(address)
        if ep is None:
            return False
        now = self.clock()
        if outcome is Outcome.OK and ticket is not None and ticket.idle:
            took = max(0.0, now - ticket.picked_at)
            ep.idle_answer_s = took if ep.idle_answer_s is None else ep.idle_answer_s + 0.2 * (took - ep.idle_answer_s)
        level = ep.levels.get(ticket.priority) if ticket is not None else None
        if level is not None and ticket is not None:
            level.remove(ticket.sender, cost)
            if level.requests <= 0:
                del ep.levels[ticket.priority]
        in_flight_before = ep.in_flight
        ep.in_flight = max(0, ep.in_flight - 1)
        ep.work = max(0.0, ep.work - cost) if ep.in_flight else 0.0  # no float drift past idle
        if not ep.in_flight:
            ep.levels.clear()
        c = self.config
        if outcome is Outcome.OK:
            ep.consecutive_failures = 0
            ep.starting = False
        elif outcome is Outcome.OVERLOADED:
            # At capacity: hold it at what it could take (docs/design/balancing.md#overload-is-load-not-failure).
            ep.overload_cap = max(1, in_flight_before - 1)
            ep.overload_until = now + c.overload_hold_s
        elif outcome is Outcome.NOT_SERVING:
            if not ep.paused:
                log.warning("worker %s paused: it answered that it is not serving (warming up or shutting down)",
                            ep.name)
            ep.paused = True
        elif outcome in (Outcome.FAILURE, Outcome.TIMED_OUT):
            ep.consecutive_failures += 1
            if ep.consecutive_failures >= c.consecutive_failures and not ep.ejected(now):
                self._maybe_eject(ep, now)
        if ep.draining and ep.in_flight == 0:
            del self.endpoints[address]
            self._update_scale()
            return True
        return False

    def _maybe_eject(self, ep: EndpointStats, now: float) -> None:
        c = self.config
        live = [e for e in self.endpoints.values() if not e.draining]
        ejected = sum(1 for e in live if e.ejected(now))
        allowed = max(1, math.floor(len(live) * c.max_ejection_percent / 100.0))
        if ejected >= allowed:
            return  # cap holds; the failure streak stays counted
        ep.ejection_count += 1
        ep.ejections += 1
        ep.ejected_until = now + min(c.base_ejection_s * ep.ejection_count, c.max_ejection_s)
        ep.consecutive_failures = 0
        ep.current_weight = 0.0
        log.warning("worker %s ejected for %.0f s: %d failures in a row (timeouts, UNAVAILABLE, INTERNAL); "
                    "ejected %d times", ep.name, ep.ejected_until - now, c.consecutive_failures, ep.ejection_count)

    # ---- views -----------------------------------------------------------------------------
    def total_in_flight(self) -> int:
        return sum(ep.in_flight for ep in self.endpoints.values())


class RetryBudget:
    """Retries ≤ ``ratio`` of requests over a sliding window, with a floor of
    ``min_per_s`` retries per second (Envoy retry budget / gRFC A6 throttling,
    docs/design/balancing.md#retries-and-the-retry-budget).
    """

    def __init__(self, ratio: float = 0.2, min_per_s: float = 3.0, window_s: float = 10.0,
                 clock: Clock = time.monotonic, buckets: int = 10) -> None:
        if not 0 <= ratio <= 1 or min_per_s < 0 or window_s <= 0 or buckets < 1:
            raise ValueError("retry budget: need 0<=ratio<=1, min_per_s>=0, window_s>0")
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self.clock = clock
        self._width = window_s / buckets
        self._n = buckets
        self._requests = [0] * buckets
        self._retries = [0] * buckets
        self._epoch = [-1] * buckets

    def _slot(self, now: float) -> int:
        epoch = int(now // self._width)
        i = epoch % self._n
        if self._epoch[i] != epoch:
            self._epoch[i] = epoch
            self._requests[i] = 0
            self._retries[i] = 0
        return i

    def _sums(self, now: float) -> tuple[int, int]:
        epoch = int(now // self._width)
        req = ret = 0
        for i in range(self._n):
            if epoch - self._epoch[i] < self._n:
                req += self._requests[i]
                ret += self._retries[i]
        return req, ret

    def record_request(self) -> None:
        now = self.clock()
        self._requests[self._slot(now)] += 1

    def try_acquire(self) -> bool:
        """Take one retry from the budget if it allows; True means retry."""
        now = self.clock()
        i = self._slot(now)
        req, ret = self._sums(now)
        allowed = max(self.min_per_s * self.window_s, self.ratio * req)
        if ret + 1 > allowed:
            return False
        self._retries[i] += 1
        return True


#: Whether some worker not tried yet may answer within the given seconds
#: (:meth:`Balancer.may_answer_within`, bound to the request's tried workers and pixels).
Elsewhere = Callable[[float], bool]


def wants_retry(wire_status: int, message: str = "", remaining_s: float | None = None,
                elsewhere: Elsewhere | None = None, anywhere: Elsewhere | None = None) -> bool:
    """Whether an answer is one to send again to another worker, before the attempts, the time
    left and the budget are counted (:func:`should_retry`,
    docs/design/balancing.md#retries-and-the-retry-budget):

    * a retryable status (``edgewise.status.RETRYABLE``: UNAVAILABLE) when ``anywhere`` says
      a pick away from the workers tried would find one in the time the retry would have (no
      ``anywhere``: assumed). With every other worker down, paused or full the retry could
      go nowhere: it was counted as sent (``retries_total{result="sent"}``) and took from the
      retry budget although no second worker was ever called;
    * a worker's refusal of a deadline closer than its own batch of one
      (:func:`refused_too_short`), or for its own load (:func:`refused_busy`), when
      ``elsewhere`` says another worker may answer in the time the retry would have
      (``hop_timeout(remaining_s)``): a faster one, or one with less in flight. Without a
      worker that may do better it is the client's answer: the next worker would only refuse
      too.
    """
    within_s = math.inf if remaining_s is None else hop_timeout(remaining_s)
    if status.is_retryable(wire_status):
        return anywhere is None or anywhere(within_s)
    if not refused_here(wire_status, message) or elsewhere is None:
        return False
    return elsewhere(within_s)


def should_retry(wire_status: int, attempts: int, remaining_s: float | None, min_attempt_s: float,
                 budget: RetryBudget, message: str = "", elsewhere: Elsewhere | None = None,
                 anywhere: Elsewhere | None = None) -> bool:
    """At most one retry, only for an answer :func:`wants_retry` (UNAVAILABLE when another
    worker may be picked, or a worker's refusal of a too-short deadline when another worker
    may answer in time), only with at least ``min_attempt_s`` left, only within the budget."""
    if attempts >= 2 or not wants_retry(wire_status, message, remaining_s, elsewhere, anywhere):
        return False
    if remaining_s is not None and remaining_s < min_attempt_s:
        return False
    return budget.try_acquire()
