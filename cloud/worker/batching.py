"""Dynamic batcher core of a cloud worker: a pure, clock-injected state machine.

The async shell (``cloud.worker.server``) feeds it requests and asks it, each
time the model is free, whether a batch should run now. Nothing here touches a
clock, a thread or an event loop: every call takes ``now`` (seconds on any
monotonic clock) and returns a decision, so the tests drive it on fake time.

Semantics follow Triton's dynamic batcher with the changes described in
``docs/design/batching.md``:

Invariants / rules (read these before changing anything below):

1. A batch never holds more than ``max_batch_size`` requests.
2. Requests leave the queue highest priority first (``priority`` is an int,
   higher = sooner, as in ``DetectRequest.priority``); within one level the devices that sent
   them (``device``, ``DetectRequest.device_id``) take turns (start-time fair queueing,
   :class:`_Rank`), each device's own requests in arrival order: with one device (or none
   named) that is arrival order. A device keeping a backlog queued made another device's request
   of a 0.5 s deadline wait behind all of it (docs/design/batching.md#devices-take-turns).
3. When a batch is asked for (the model instance is free):
   a. if the oldest request has waited ``max_queue_delay_s``, everything (up to
      the max) goes out, even if larger than a preferred size (Triton PR #2125);
   b. otherwise, if ``max_batch_size`` requests wait, a full batch goes at once;
   c. otherwise, if a preferred size can be formed, the largest one that can
      goes at once (Triton: "executed immediately");
   d. otherwise, if holding any longer would miss a queued request's deadline (it is
      closer than the measured time of the batch that would go now plus a guard,
      ``DEADLINE_GUARD_*``), what waits goes at once (reason ``"deadline"``): an idle
      model never lets a request expire in the queue for the sake of a fuller batch;
   e. otherwise the requests are held until the oldest has waited the delay.
   f. Whatever (a)-(e) chose, the batch is cut to the size that answers in time the most of
      the requests that cannot wait for another batch, then computes the fewest for nothing
      (``_fitting``; the first k in the order of rule 2); the rest stay queued for the next
      batch. Requests admitted on the time of a batch of one and then run four at a time missed
      their deadlines together (bursts of 12 with 150 ms to go on a CPU: 97 of 120 expired in or
      after the model), and cutting to the largest batch every member makes shrank every batch
      where batching pays (docs/design/batching.md#batch-formation).
   With ``max_queue_delay_s == 0`` nothing is ever held (Triton's default).
   Rule (a) before (c) is deliberate: Triton's doc order lets a small preferred
   size starve throughput under backlog (the "batches come out small" reports in
   docs/design/batching.md#why-the-delay-comes-before-preferred-sizes); once the
   delay is spent, the fullest batch is the right answer.
4. The queue is bounded: ``submit`` on a full queue raises ``OverloadedError``
   (RESOURCE_EXHAUSTED) immediately; it never waits (Triton ``max_queue_size``). The
   shell first makes room for a request ranked above one queued (``displace``: the
   last to leave of the lowest rank, a replay for a live request, is refused instead).
5. A request whose deadline cannot be met - it has passed, or is closer than
   (or as close as) the measured time of the smallest batch it could run in, a
   batch of one - is rejected at ``submit`` or removed before any batch is formed;
   it never reaches the model. Using the batch-of-one time (measured per batch
   size, seeded by warm-up) and not an average over all batches matters: warm-up
   runs the largest batches too, and an average that big would reject every
   short-deadline request on a slow CPU, so no batch would ever run to bring the
   estimate down again. Removed requests are handed
   back by ``expired(now)`` so the shell answers them DEADLINE_EXCEEDED; it asks when they
   are due (``next_expiry``) while a batch runs too, unless that batch has stalled
   (``stalled``: far past its expected time, rule 8), so that they are answered before their
   hop runs out. A request that would make its deadline alone but not behind the requests
   queued ahead of it and the batch running (``wait_s``) is refused at ``submit`` too, as load
   (``OverloadedError``, :data:`BUSY_MARK`): another worker may still make it, where queued
   here it would only expire.
6. One result or error per request: ``run_isolated`` runs a batch and, if the
   batch call fails, retries each request alone so one bad input never fails
   its neighbours (``docs/design/conventions.md#one-result-per-request``).
7. Batching is used only where it pays (``decide_batching``,
   ``docs/design/batching.md#batching-where-it-pays``): from the batch times
   measured at warm-up, a batch must serve at least ``min_gain`` times the
   images/s of batch 1; otherwise the worker serves batch 1 without queue delay
   (``BatchPolicy.unbatched``).
8. One batch far slower than its size's estimate, or than its pixels' at the measured pixel
   rate when that is more on a native-input worker (``OUTLIER_FACTOR`` times: the process
   was stopped or paged out, a neighbour's burst) counts as that factor times the estimate:
   one 20 s stall put a 0.1 s estimate at 4 s, the worker refused every request of a 2 s
   deadline and the gateway weighed it at 1/50 of its peer, so it never ran the batches that
   would have brought the estimate down. Only one in a row is cut: the next slow batch of
   that size is taken as it is, so a real slowdown (a GPU lost to a CPU fallback) is followed
   one batch later than without the rule.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from edgewise.errors import DeadlineExceededError, OverloadedError

#: Ends the refusal of a deadline closer than one batch: the gateway reads it as the client's
#: deadline, not a fault of the worker (cloud.gateway.balancing.outcome_of), so keep it.
TOO_SHORT_MARK = "send a later deadline"

#: In a refusal while this worker is not serving (warming up, shutting down): the gateway pauses
#: it until a Load poll says it serves (cloud.gateway.balancing.refused_not_serving) and sends the
#: request on, not counting a failure: a worker added while it warmed up was ejected for 30 s
#: by its first refusals, so keep it.
NOT_SERVING_MARK = "not serving"

#: Ends the answer to a request this worker queued and then removed, its deadline no longer in
#: reach: the gateway tells it from a hop that ran out on a worker answering nothing and does
#: not hold it against the worker (cloud.gateway.balancing.outcome_of), so keep it.
EXPIRED_MARK = "removed from the queue before inference"

#: Ends a refusal for this worker's load alone (its queue full, its decode budget spent): the
#: gateway sends the request on to another worker with room (cloud.gateway.balancing.refused_busy),
#: so keep it; a RESOURCE_EXHAUSTED without it (a message over the size limit) is not retried.
BUSY_MARK = "retry on another worker or later"

T = TypeVar("T")
R = TypeVar("R")

#: A held batch goes this long before the time its earliest-deadline request would have to
#: start to finish: half the batch's measured time, at least 5 ms (timer and event-loop
#: lateness; docs/design/batching.md#deadlines). Without it the wake-up at the deadline found the
#: request already unmeetable and expired it while the model sat idle.
DEADLINE_GUARD_FRACTION = 0.5
DEADLINE_GUARD_MIN_S = 0.005


@dataclass(frozen=True)
class BatchPolicy:
    """Batching knobs (Triton names in brackets).

    Attributes:
        max_batch_size: most requests in one batch (``max_batch_size``), >= 1.
        max_queue_delay_s: longest a request is held waiting for a fuller batch,
            seconds (``max_queue_delay_microseconds``), >= 0.
        preferred_batch_sizes: sizes sent as soon as they can be formed
            (``preferred_batch_size``); each in [1, max_batch_size].
        max_queue_size: most requests waiting; more are rejected at once
            (``max_queue_size``; here it must be >= 1: unbounded queues are how
            Triton's tails grow without limit, docs/design/batching.md#bounded-queue).
        ewma_alpha: weight of the newest sample in the batch-time and
            throughput estimates, in (0, 1].
    """

    max_batch_size: int = 8
    max_queue_delay_s: float = 0.005
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = 64
    ewma_alpha: float = 0.2

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_delay_s < 0:
            raise ValueError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        for p in self.preferred_batch_sizes:
            if not 1 <= p <= self.max_batch_size:
                raise ValueError(
                    f"preferred batch size {p} must lie in [1, max_batch_size={self.max_batch_size}]"
                )
        if self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {self.max_queue_size}")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")

    def unbatched(self) -> BatchPolicy:
        """This policy serving batch 1 without holding anything (the queue bound kept)."""
        return replace(self, max_batch_size=1, max_queue_delay_s=0.0, preferred_batch_sizes=())


BATCHING_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class BatchingDecision:
    """Whether a worker batches, and the measurement behind it.

    Attributes:
        batch: form batches as the policy says (False: batch 1, no queue delay).
        gain: the best measured images/s at a batch size > 1 over images/s at batch 1
            (0 when not measured).
        size: the batch size of that gain (0 when not measured).
        reason: one line for the log, naming the setting that decided.
    """

    batch: bool
    gain: float
    size: int
    reason: str


def decide_batching(mode: str, batch_seconds: Mapping[int, float], min_gain: float,
                    max_batch_size: int) -> BatchingDecision:
    """Batch or not, from the compute seconds measured per batch size (warm-up).

    ``auto``: batch when some measured size k > 1 serves ``k * t(1) / t(k) >= min_gain``
    times the images/s of batch 1 (on CPU backends this stays near 1: ONNX Runtime already
    spreads one image over the cores; GPUs gain several times). Without both measurements
    the configured batching is kept. ``on`` / ``off`` force the answer;
    ``max_batch_size`` 1 leaves nothing to decide.
    """
    if mode not in BATCHING_MODES:
        raise ValueError(f"batching mode {mode!r}: use one of {', '.join(BATCHING_MODES)}")
    t1 = batch_seconds.get(1, 0.0)
    gains = {k: k * t1 / t for k, t in batch_seconds.items() if k > 1 and t > 0 and t1 > 0}
    size = max(gains, key=lambda k: (gains[k], -k)) if gains else 0
    gain = gains.get(size, 0.0)
    measured = (f"batch {size} serves {gain:.2f}x the images/s of batch 1 ({1e3 * t1:.1f} vs "
                f"{1e3 * batch_seconds[size] / size:.1f} ms per image)") if gains else ""
    if max_batch_size == 1:
        return BatchingDecision(False, gain, size, "batch 1: batching.max_batch_size is 1")
    if mode == "off":
        return BatchingDecision(False, gain, size, "batch 1, no queue delay: batching.mode is off")
    if mode == "on":
        return BatchingDecision(True, gain, size, "batching: batching.mode is on" + (f"; {measured}" if gains else ""))
    if not gains:
        return BatchingDecision(True, 0.0, 0, "batching as configured: batching.mode auto had no warm-up "
                                              "timings of batch 1 and a larger batch to compare")
    if gain >= min_gain:
        return BatchingDecision(True, gain, size, f"batching: {measured}, at least batching.min_gain {min_gain:g}")
    return BatchingDecision(False, gain, size, f"batch 1, no queue delay: at best {measured}, under "
                                               f"batching.min_gain {min_gain:g}")


@dataclass(eq=False)
class Pending(Generic[T]):
    """One queued request: the caller's item plus what the scheduler needs."""

    item: T
    enqueued: float
    priority: int
    deadline: float | None
    seq: int
    pixels: int = 0
    device: str = ""
    #: its start tag among the devices of its priority (:class:`_Rank`)
    start: int = 0


class _Rank(Generic[T]):
    """The requests of one priority, in the order they leave: start-time fair queueing among the
    devices that sent them (rule 2; Goyal, Vin and Cheng, SIGCOMM 1996, every request costing
    one). A request's start tag is the later of the rank's virtual time (the tag of the request
    taken last) and the tag after its device's newest request still queued; the queue is ordered
    by tag, then arrival. A device's requests keep their arrival order, one device's queue is
    plain FIFO, and a device with nothing queued starts at the virtual time: its request waits
    behind at most one request of each other device of its rank, not behind another's whole
    backlog (docs/design/batching.md#priority). A device's tag is forgotten when its last request
    leaves (served, expired, cancelled, displaced): what was not served is not charged, and the
    state is bounded by the queue."""

    __slots__ = ("queue", "vtime", "finish", "queued")

    def __init__(self) -> None:
        self.queue: deque[Pending[T]] = deque()
        self.vtime = 0
        self.finish: dict[str, int] = {}  # per device queued: its newest request's tag + 1
        self.queued: dict[str, int] = {}  # per device: its requests queued

    def tag(self, device: str) -> int:
        """The start tag a request of ``device`` arriving now gets."""
        return max(self.vtime, self.finish.get(device, 0))

    def add(self, p: Pending[T]) -> None:
        p.start = self.tag(p.device)
        self.finish[p.device] = p.start + 1
        self.queued[p.device] = self.queued.get(p.device, 0) + 1
        i = len(self.queue)
        while i and self.queue[i - 1].start > p.start:  # ties stay in arrival order
            i -= 1
        self.queue.insert(i, p)

    def ahead(self, device: str) -> list[Pending[T]]:
        """The requests queued that leave before one of ``device`` arriving now, in order."""
        tag = self.tag(device)
        return list(itertools.takewhile(lambda p: p.start <= tag, self.queue))

    def take(self) -> Pending[T]:
        """Remove and return the next to leave."""
        p = self.queue.popleft()
        self.vtime = max(self.vtime, p.start)
        self._gone(p)
        return p

    def take_last(self) -> Pending[T]:
        """Remove and return the last to leave."""
        p = self.queue.pop()
        self._gone(p)
        return p

    def remove(self, p: Pending[T]) -> None:
        self.queue.remove(p)
        self._gone(p)

    def remove_if(self, cond: Callable[[Pending[T]], bool]) -> list[Pending[T]]:
        """Remove and return those for which ``cond`` holds, in order."""
        out = [p for p in self.queue if cond(p)]
        if out:
            self.queue = deque(p for p in self.queue if not cond(p))
            for p in out:
                self._gone(p)
        return out

    def _gone(self, p: Pending[T]) -> None:
        n = self.queued[p.device] - 1
        if n:
            self.queued[p.device] = n
        else:
            del self.queued[p.device], self.finish[p.device]

    def __iter__(self) -> Iterator[Pending[T]]:
        return iter(self.queue)

    def __len__(self) -> int:
        return len(self.queue)


@dataclass(frozen=True)
class Batch(Generic[T]):
    """Requests to run together, in dispatch order, with their queue waits (s)."""

    items: tuple[T, ...]
    queue_waits: tuple[float, ...]
    formed_at: float
    reason: str  # "preferred" | "max" | "delay" | "deadline" | "flush"

    def __len__(self) -> int:
        return len(self.items)


#: A served batch counts as at most this many times its size's estimate (rule 8).
OUTLIER_FACTOR = 4.0


@dataclass
class _Ewma:
    alpha: float
    value: float | None = None

    def add(self, x: float) -> float:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
        return self.value


@dataclass
class Batcher(Generic[T]):
    """Dynamic batcher state machine (see the module docstring for its rules).

    Call pattern of the shell: ``submit`` per request; whenever the model is
    free and something changed, ``next_batch(now)``; answer ``expired(now)``;
    sleep until ``next_wakeup(now)`` or the next submit; after a batch ran,
    ``observe(batch_size, seconds)`` so deadlines and capacity use real times.
    """

    policy: BatchPolicy = field(default_factory=BatchPolicy)
    #: the model's time grows with each image's pixels (``input_size: native``): served
    #: throughput is then measured in pixels/s and divided by the pixels of a served request
    pixel_cost: bool = False
    _levels: dict[int, _Rank[T]] = field(default_factory=dict, init=False, repr=False)
    _order: list[int] = field(default_factory=list, init=False, repr=False)  # priorities, ascending
    _expired: list[T] = field(default_factory=list, init=False, repr=False)
    _size: int = field(default=0, init=False)
    _seq: itertools.count[int] = field(default_factory=itertools.count, init=False, repr=False)
    _batch_s: _Ewma = field(init=False, repr=False)
    _per_image_s: _Ewma = field(init=False, repr=False)
    _pixels: _Ewma = field(init=False, repr=False)
    _pixel_batch_s: _Ewma = field(init=False, repr=False)
    #: pixels and seconds of batches of one (served or warm-up): ``need_s``'s pixel rate
    _one_px: _Ewma = field(init=False, repr=False)
    _one_s: _Ewma = field(init=False, repr=False)
    _size_s: dict[int, _Ewma] = field(default_factory=dict, init=False, repr=False)
    #: batch sizes whose last served batch was cut to ``OUTLIER_FACTOR`` times its estimate (rule 8)
    _outlier: set[int] = field(default_factory=set, init=False, repr=False)
    #: peak capacity keeps warm-up (dummy images) and served batches apart, per batch size
    _warm_s: dict[int, _Ewma] = field(default_factory=dict, init=False, repr=False)
    _served_s: dict[int, _Ewma] = field(default_factory=dict, init=False, repr=False)
    _served_px: dict[int, _Ewma] = field(default_factory=dict, init=False, repr=False)
    _request_px: _Ewma = field(init=False, repr=False)
    #: the batch handed out by ``next_batch`` and not yet ``finished``: (formed at, expected seconds
    #: (rule 8, ``stalled``), least seconds (``wait_s``))
    _running: tuple[float, float, float] | None = field(default=None, init=False, repr=False)
    _preferred_desc: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        self._batch_s = _Ewma(self.policy.ewma_alpha)
        self._per_image_s = _Ewma(self.policy.ewma_alpha)
        self._pixels = _Ewma(self.policy.ewma_alpha)
        self._pixel_batch_s = _Ewma(self.policy.ewma_alpha)
        self._one_px = _Ewma(self.policy.ewma_alpha)
        self._one_s = _Ewma(self.policy.ewma_alpha)
        self._request_px = _Ewma(self.policy.ewma_alpha)
        self.set_policy(self.policy)

    def set_policy(self, policy: BatchPolicy) -> None:
        """Form batches by ``policy`` from now on (the queue and the measurements are kept)."""
        self.policy = policy
        self._preferred_desc = tuple(sorted(set(policy.preferred_batch_sizes), reverse=True))

    # -- intake ---------------------------------------------------------------
    def submit(
        self, item: T, now: float, *, priority: int = 0, deadline: float | None = None, pixels: int = 0,
        device: str = "",
    ) -> None:
        """Queue ``item`` (an image of ``pixels``, 0: not counted, sent by ``device``: its place
        among the devices of its priority, rule 2); raises instead of queueing what cannot be served.

        Raises:
            OverloadedError: the queue holds ``max_queue_size`` requests, or the requests
                ahead of it and the batch running would have it answered after ``deadline``
                (``wait_s``: this worker's load; another worker may make it, rule 5).
            DeadlineExceededError: ``deadline`` (same clock as ``now``) is
                already closer than one expected batch time (``need_s``).
        """
        if self._size >= self.policy.max_queue_size:
            raise OverloadedError(
                f"worker queue full ({self._size}/{self.policy.max_queue_size} requests waiting); {BUSY_MARK}"
            )
        need = self.need_s(pixels)
        if deadline is not None and deadline - need <= now:
            raise DeadlineExceededError(
                f"deadline is {1e3 * (deadline - now):.1f} ms away but a batch takes about "
                f"{1e3 * need:.1f} ms; {TOO_SHORT_MARK}"
            )
        if deadline is not None:
            wait = self.wait_s(now, priority, pixels, device)
            if deadline - wait <= now:
                ahead = self.ahead(priority, device)
                running = " and the rest of the batch running" if self._running is not None else ""
                raise OverloadedError(
                    f"{ahead} requests queued ahead of it{running} would have it answered in about "
                    f"{1e3 * wait:.1f} ms, its deadline is {1e3 * (deadline - now):.1f} ms away; {BUSY_MARK}"
                )
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = _Rank()
            bisect.insort(self._order, priority)
        level.add(Pending(item, now, priority, deadline, next(self._seq), pixels, device))
        self._size += 1

    def lowest_rank(self) -> int | None:
        """The lowest priority queued (None: nothing queued)."""
        return next((prio for prio in self._order if self._levels[prio]), None)

    def displace(self, priority: int) -> T | None:
        """Room in a full queue for a request of ``priority``: remove and return the last to leave
        of the lowest priority below it (the newest; among devices, of the one with most queued:
        rule 2) (a replay, for a live request:
        ``edgewise.wire.queue_rank``), or None when nothing queued ranks below it. A full queue
        refused whatever came next, so more devices replaying at once than its places refused
        the live requests it would have served before them (docs/design/batching.md#priority);
        the shell answers the one displaced as refused for load, as if it had found the queue
        full (its client sends it later)."""
        lowest = self.lowest_rank()
        if lowest is None or lowest >= priority:
            return None
        pending = self._levels[lowest].take_last()
        self._size -= 1
        self._prune()
        return pending.item

    def cancel(self, item: T) -> bool:
        """Remove a queued ``item`` (its caller gave up); False if not queued."""
        for level in self._levels.values():
            for p in level:
                if p.item is item:
                    level.remove(p)
                    self._size -= 1
                    self._prune()
                    return True
        return False

    # -- decisions ------------------------------------------------------------
    def next_batch(self, now: float, *, flush: bool = False) -> Batch[T] | None:
        """The batch to run now that the model is free, or None to keep waiting.

        Expired requests are removed first (collect them with ``expired``).
        ``flush=True`` (draining for shutdown) sends what waits without holding
        it for the delay.
        """
        self._purge(now)
        n = self._size
        if n == 0:
            return None
        size, reason = (min(n, self.policy.max_batch_size), "flush") if flush else self._decide(n, now)
        if size == 0:
            return None
        size = self._fitting(size, now)
        taken: list[Pending[T]] = []
        for prio in reversed(self._order):
            level = self._levels[prio]
            while level and len(taken) < size:
                taken.append(level.take())
            if len(taken) == size:
                break
        self._size -= len(taken)
        self._prune()
        self._running = (now, self._expected_s(len(taken), sum(p.pixels for p in taken)),
                         self._least_s([p.pixels for p in taken]))
        return Batch(
            items=tuple(p.item for p in taken),
            queue_waits=tuple(now - p.enqueued for p in taken),
            formed_at=now,
            reason=reason,
        )

    def finished(self) -> None:
        """The batch last handed out by ``next_batch`` ended (answered, failed or dropped)."""
        self._running = None

    def stalled(self, now: float) -> bool:
        """Whether the batch running has taken more than ``OUTLIER_FACTOR`` times its expected
        time (rule 8: a stopped process, a wedged model): the requests queued behind it are then
        not removed while it runs, so that their hops run out and count against this worker."""
        return self._running is not None and 0 < OUTLIER_FACTOR * self._running[1] < now - self._running[0]

    def ahead(self, priority: int, device: str = "") -> int:
        """Requests queued that leave before one of ``priority`` and ``device`` submitted now (rule 2)."""
        return len(self._queued_ahead(priority, device))

    def _queued_ahead(self, priority: int, device: str) -> list[Pending[T]]:
        """The requests queued that leave before one of ``priority`` and ``device`` submitted now,
        in the order they leave (rule 2)."""
        out: list[Pending[T]] = []
        for prio in reversed(self._order):
            if prio > priority:
                out.extend(self._levels[prio])
            elif prio == priority:
                out.extend(self._levels[prio].ahead(device))
        return out

    def wait_s(self, now: float, priority: int = 0, pixels: int = 0, device: str = "") -> float:
        """Predicted seconds from ``now`` until a request of ``priority``, ``pixels`` and ``device`` submitted
        now is answered (rule 5): the rest of the batch running, the batches of the requests
        queued ahead of it (rule 2), then its own; at least ``need_s(pixels)``. They go in batches
        of ``max_batch_size`` in the order of rule 2, each at its least time (``_least_s``: one
        alone at its own ``need_s``, a larger one at its measured time or its pixels'). It
        cannot know of higher priorities still to come, nor of a cut by rule 3f, so it errs short:
        what it accepts may still expire in the queue, what it refuses could not make it here."""
        left = 0.0 if self._running is None else max(0.0, self._running[0] + self._running[2] - now)
        size = self.policy.max_batch_size
        queue = [p.pixels for p in self._queued_ahead(priority, device)]
        queue.append(pixels)
        return left + max(self.need_s(pixels),
                          sum(self._least_s(queue[i:i + size]) for i in range(0, len(queue), size)))

    def _least_s(self, pixels: Sequence[int]) -> float:
        """The least time a batch of images of ``pixels`` (0: not counted) takes, for ``wait_s``:
        one alone takes its ``need_s``; a larger batch its size's measured time, or on a
        native-input worker (``pixel_cost``) its pixels at the rate of batches of one when that is
        less, as ``need_s`` judges one image. Without that, a worker that batches and had served
        1920x1080 frames refused an idle queue's 640x360 one for the large frames' time, the
        refusal ``need_s`` was made pixel-aware to end."""
        if len(pixels) == 1:
            return self.need_s(pixels[0])
        t = self._batch_time(len(pixels))
        px, s = self._one_px.value, self._one_s.value
        if self.pixel_cost and px and s and all(pixels):
            t = min(t, sum(pixels) * s / px)
        return t

    def _decide(self, n: int, now: float) -> tuple[int, str]:
        pol = self.policy
        if now >= self._oldest() + pol.max_queue_delay_s:  # same sum as next_wakeup
            return min(n, pol.max_batch_size), "delay"
        if n >= pol.max_batch_size:
            return pol.max_batch_size, "max"
        for p in self._preferred_desc:
            if p <= n:
                return p, "preferred"
        size = min(n, pol.max_batch_size)
        due = self._dispatch_by(size)
        if due is not None and now >= due:
            return size, "deadline"
        return 0, ""

    def _fitting(self, size: int, now: float) -> int:
        """The batch size k <= ``size`` that answers in time the most of those that cannot wait
        (rule 3f). Of the first k in dispatch order (rule 2), a batch of k is done at ``now``
        plus its measured time t(k); a request whose deadline is later than that but not later
        than a batch more (done + t(k)) needs this batch and makes it. The largest k with the
        most of those: requests that can wait ride along when they cost nobody their deadline,
        and a request that needs this batch is never let miss it for ones that could have waited
        (a replay's 10 s beside a live 500 ms). At least 1 (one that cannot make it even alone was
        purged already). Cutting instead to the largest batch that all its members make shrank
        every batch under load where batching pays (a GPU: a batch of 8 costs little more than
        one), and fewer were answered in time than with no cut at all."""
        deadlines: list[float] = []  # of the first k, sorted
        best, most, k = 1, (-1, 0), 0
        for prio in reversed(self._order):
            for p in itertools.islice(self._levels[prio], size - k):
                k += 1
                bisect.insort(deadlines, float("inf") if p.deadline is None else p.deadline)
                t = self._batch_time(k)
                late = bisect.bisect_right(deadlines, now + t)
                needing = bisect.bisect_right(deadlines, now + 2 * t) - late
                if (needing, -late) >= most:  # then the fewest computed for nothing
                    best, most = k, (needing, -late)
            if k == size:
                break
        return best

    def _dispatch_by(self, size: int) -> float | None:
        """The latest time a batch of ``size`` can start and still finish before the earliest
        queued deadline (less a guard), None when nothing queued has a deadline."""
        earliest = min((p.deadline for level in self._levels.values() for p in level if p.deadline is not None),
                       default=None)
        if earliest is None:
            return None
        t = self._batch_time(size)
        return earliest - t - max(DEADLINE_GUARD_MIN_S, DEADLINE_GUARD_FRACTION * t)

    def _batch_time(self, size: int) -> float:
        """Measured compute time of a batch of ``size``: its own estimate, else the line between
        the nearest sizes measured below and above it (warm-up measures 1 and the maximum; a
        batch's time is about a fixed cost plus a cost per image, for which the line is exact,
        and where the curve is concave the line errs short until the size is measured), else the
        next larger size measured, else the largest measured scaled up linearly; 0 before any."""
        measured = sorted(k for k, e in self._size_s.items() if e.value)
        if not measured:
            return 0.0
        t = {k: self._size_s[k].value or 0.0 for k in measured}
        larger = [k for k in measured if k >= size]
        smaller = [k for k in measured if k < size]
        if larger and larger[0] != size and smaller:
            lo, hi = smaller[-1], larger[0]
            return t[lo] + (t[hi] - t[lo]) * (size - lo) / (hi - lo)
        if larger:
            return t[larger[0]]
        top = measured[-1]
        return t[top] * size / top

    def next_wakeup(self, now: float) -> float | None:
        """When (same clock) the shell must call again with no new arrival.

        That is the earliest of: the oldest request's delay running out, the last moment a
        batch of what waits can start and meet the earliest deadline (rule 3d), and the
        earliest deadline becoming unmeetable. None when the queue is empty.
        """
        if self._size == 0:
            return None
        t = self._oldest() + self.policy.max_queue_delay_s
        due = self._dispatch_by(min(self._size, self.policy.max_batch_size))
        if due is not None:
            t = min(t, due)
        expiry = self.next_expiry()
        if expiry is not None:
            t = min(t, expiry)
        return max(t, now)

    def next_expiry(self) -> float | None:
        """When (same clock) the earliest queued deadline becomes unmeetable, so that ``expired``
        removes it: the shell asks this while a batch runs too (the request is answered then,
        not after the batch, when the hop had run out). None when nothing queued has a deadline."""
        return min((p.deadline - self.need_s(p.pixels) for level in self._levels.values() for p in level
                    if p.deadline is not None), default=None)

    def expired(self, now: float) -> list[T]:
        """Requests removed because their deadline cannot be met (drained)."""
        self._purge(now)
        out, self._expired = self._expired, []
        return out

    def _purge(self, now: float) -> None:
        def late(p: Pending[T]) -> bool:  # compared as in next_wakeup, so a wake-up always purges
            return p.deadline is not None and p.deadline - self.need_s(p.pixels) <= now

        for level in self._levels.values():
            for p in level.remove_if(late):
                self._expired.append(p.item)
                self._size -= 1
        self._prune()

    def _prune(self) -> None:
        # Empty levels go, so arbitrary client priorities cannot grow the state.
        if len(self._levels) > self._size:
            for prio in [q for q, level in self._levels.items() if not level]:
                del self._levels[prio]
                self._order.remove(prio)

    def _oldest(self) -> float:
        return min(p.enqueued for level in self._levels.values() for p in level)

    # -- measurements ---------------------------------------------------------
    def observe(self, batch_size: int, seconds: float, pixels: int = 0, *, warmup: bool = False) -> None:
        """Record that a batch of ``batch_size`` images, ``pixels`` in all (0: not counted),
        ran in ``seconds`` (compute only). ``warmup``: the images were the warm-up dummies,
        not served requests (see :attr:`peak_capacity`)."""
        if batch_size < 1 or seconds < 0 or pixels < 0:
            raise ValueError(f"bad batch observation: size={batch_size}, seconds={seconds}, pixels={pixels}")
        known = self._size_s.get(batch_size)
        if not warmup and known is not None and known.value:  # rule 8
            expected = self._expected_s(batch_size, pixels)
            if seconds > OUTLIER_FACTOR * expected and batch_size not in self._outlier:
                seconds = OUTLIER_FACTOR * expected
                self._outlier.add(batch_size)
            else:  # the one after an outlier is taken as it is: a stall is one batch, a slowdown goes on
                self._outlier.discard(batch_size)
        alpha = self.policy.ewma_alpha
        self._batch_s.add(seconds)
        self._per_image_s.add(seconds / batch_size)
        self._size_s.setdefault(batch_size, _Ewma(alpha)).add(seconds)
        if pixels:
            self._pixels.add(pixels)
            self._pixel_batch_s.add(seconds)
            if batch_size == 1:
                self._one_px.add(pixels)
                self._one_s.add(seconds)
        if warmup:
            self._warm_s.setdefault(batch_size, _Ewma(alpha)).add(seconds)
            return
        self._served_s.setdefault(batch_size, _Ewma(alpha)).add(seconds)
        if pixels:
            self._served_px.setdefault(batch_size, _Ewma(alpha)).add(pixels)
            self._request_px.add(pixels / batch_size)

    def _expected_s(self, batch_size: int, pixels: int = 0) -> float:
        """The expected compute time of a batch of ``batch_size`` images, ``pixels`` in all (rule 8):
        its size's estimate (``_batch_time``), or its pixels' at the measured pixel rate when that
        is more on a native-input worker."""
        expected = self._batch_time(batch_size)
        if self.pixel_cost and pixels and self._pixels.value and self._pixel_batch_s.value:
            expected = max(expected, pixels * self._pixel_batch_s.value / self._pixels.value)
        return expected

    @property
    def min_batch_s(self) -> float:
        """Measured compute time of the smallest batch size seen (normally 1), 0 before any."""
        if not self._size_s:
            return 0.0
        return self._size_s[min(self._size_s)].value or 0.0

    def need_s(self, pixels: int = 0) -> float:
        """The least time a request of ``pixels`` needs from now (a batch of one): the
        smallest batch's measured time, or, where the model's time grows with pixels
        (``pixel_cost``), the request's pixels at the pixel rate of batches of one when that
        is less. Large native-size frames raised the first for everyone: a worker that had
        served a few 1920x1080 frames refused 640x360 ones (100 ms each) with 448 ms to go.
        Never more than the first, so it refuses no request it refused no sooner before. Only
        batches of one give the rate (a larger batch's rate includes what batching saves);
        it still leaves out the model call's fixed cost, so an image smaller than those
        measured is judged a little quick."""
        least = self.min_batch_s
        px, s = self._one_px.value, self._one_s.value
        if not (self.pixel_cost and pixels > 0 and px and s):
            return least
        return min(least, pixels * s / px)

    @property
    def expected_batch_s(self) -> float:
        """EWMA of measured batch compute time, 0 before the first batch."""
        return self._batch_s.value or 0.0

    @property
    def capacity(self) -> float:
        """Measured throughput in images/s (EWMA of per-image batch time), 0 if unknown."""
        v = self._per_image_s.value
        return 1.0 / v if v else 0.0

    @property
    def pixel_rate(self) -> float:
        """Measured pixels/s (the mean pixels per batch over the mean batch time, so a mix of
        small and large images does not swing it as a per-image rate swings), 0 if unknown."""
        px, s = self._pixels.value, self._pixel_batch_s.value
        return px / s if px and s else 0.0

    @property
    def peak_capacity(self) -> float:
        """Requests/s at the best batch size within the policy's ``max_batch_size``, for the
        requests the worker actually serves; 0 if unknown.

        :attr:`capacity` follows the batches the load happens to form, so it is low when the
        worker is lightly loaded; this is what the worker can do when busy, the denominator
        the autoscaler's load target needs (cloud/autoscaler/scaling.py).

        Warm-up runs dummy images at every size the batcher may form, but under moderate load
        the larger sizes may never form with real requests, and a native-size model's dummy is
        far smaller than real frames. So warm-up timings only say how much a batch size gains
        over another; the level comes from served batches: a size seen in service counts at its
        served rate (with :attr:`pixel_cost`, its pixels/s over the mean pixels of a served
        request, so batches of small and of large images compare fairly), a size seen only at
        warm-up at the served rate of the nearest size seen in both, times their warm-up ratio.
        Before anything was served: the warm-up rates.
        """
        limit = self.policy.max_batch_size
        warm = {k: k / e.value for k, e in self._warm_s.items() if k <= limit and e.value}
        served = {k: self._served_rate(k) for k, e in self._served_s.items() if k <= limit and e.value}
        if not served:
            return max(warm.values(), default=0.0)
        best = max(served.values())
        both = [k for k in served if k in warm]
        for k, rate in warm.items():
            if k not in served and both:
                ref = min(both, key=lambda j: (abs(j - k), j))
                best = max(best, served[ref] * rate / warm[ref])
        return best

    def _served_rate(self, size: int) -> float:
        seconds = self._served_s[size].value or 0.0
        px, per_request = self._served_px.get(size), self._request_px.value
        if self.pixel_cost and px is not None and px.value and per_request:
            return px.value / seconds / per_request if seconds else 0.0
        return size / seconds if seconds else 0.0

    @property
    def depth(self) -> int:
        """Requests waiting now."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (
            f"<Batcher depth={self._size}/{self.policy.max_queue_size} "
            f"levels={self._order} batch_s={self.expected_batch_s:.4f}>"
        )


def run_isolated(
    inputs: Sequence[T], batch_fn: Callable[[Sequence[T]], Sequence[R]]
) -> list[R | Exception]:
    """Run ``batch_fn`` on ``inputs``; one result or exception per input, in order.

    If the batched call raises (or returns the wrong number of results), each
    input is retried alone, so only the inputs that fail on their own get an
    error. Exceptions are returned, not raised.
    """
    try:
        out = list(batch_fn(inputs))
        if len(out) != len(inputs):
            raise RuntimeError(f"batch function returned {len(out)} results for {len(inputs)} inputs")
        return list(out)
    except Exception as exc:
        if len(inputs) == 1:
            return [exc]
    results: list[R | Exception] = []
    for x in inputs:
        try:
            one = list(batch_fn([x]))
            if len(one) != 1:
                raise RuntimeError(f"batch function returned {len(one)} results for 1 input")
            results.append(one[0])
        except Exception as exc:
            results.append(exc)
    return results
