"""Discrete-event simulation of one fleet cell on the project's real decision cores.

One cell = one gateway (a real ``cloud.gateway.balancing.Balancer`` with its retry
budget and ``should_retry``), a pool of simulated GPU workers (each with a real
``cloud.worker.batching.Batcher``) and an autoscaler (a real
``cloud.autoscaler.scaling.Scaler``). What is simulated is only what those cores
drive: arrivals, batch compute times, the network, pod lifecycles. The glue mirrors
the thin shells: the gateway's forward loop (``cloud/gateway/pool.py``), the worker's
scheduler loop (``cloud/worker/server.py``) and the autoscaler's aggregation
(``cloud.autoscaler.loop.aggregate``, used as is).

Two clocks (docs/design/autoscaling.md#the-fleet-simulation):

* the **request clock** runs every request-level event (arrivals, batches, deadlines,
  retry budget). Every autoscaler tick of ``tick_s`` contributes ``window_s`` of it
  (time sampling); with ``window_s == tick_s`` every request of the day is simulated.
* the **day clock** is what the balancer's slow start and ejection, the autoscaler and
  pod lifecycles see: inside a window it runs with the request clock, between windows
  it jumps to the next tick. Queues, in-flight requests and batches carry over a jump
  unchanged, so each window starts from the state the previous one left.

Every request ends exactly once, as ``answered`` (with a latency), ``shed`` (admission,
deadline, overload: the edge keeps its own result) or ``failed`` (worker failures the
one retry did not cover).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from array import array
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from bench import _fleet_model as M
from bench._fleet_model import Scenario
from cloud.autoscaler.loop import ArrivalRate, GatewayPool, WorkerView, aggregate
from cloud.autoscaler.scaling import PoolSample, Scaler, ScalerConfig
from cloud.gateway.balancing import (
    Balancer,
    BalancerConfig,
    NoPick,
    Outcome,
    RetryBudget,
    Ticket,
    outcome_of,
    should_retry,
)
from cloud.worker.batching import EXPIRED_MARK, Batcher, BatchPolicy, decide_batching
from cloud.worker.settings import BatchingSettings
from edgewise import status
from edgewise.errors import DeadlineExceededError, OverloadedError

MIN_ATTEMPT_S = 0.005  # gateway retry.min_attempt_ms default
ENDS = ("answered", "shed_saturated", "shed_no_worker", "shed_deadline", "shed_overloaded", "failed")
SIGNALS = ("load", "utilization", "busy", "queue")

# pod states
STARTING, READY, CRASHED, DRAINING, GONE = range(5)
# event kinds
_DONE, _WAKE, _CRASH, _POLL = range(4)


@dataclass(frozen=True)
class Policy:
    """A routing mode plus an autoscaling signal and its target.

    ``signal``: ``load`` = requests/s offered to the gateways / the ready workers' peak
    capacity (ours, the shipped default); ``utilization`` = the gateways' in-flight / measured
    capacity (ours before);
    ``busy`` = mean busy-time fraction of the ready pods over ``busy_window_s`` (the HPA
    on CPU/GPU utilisation, metrics-server's 60 s resolution); ``queue`` = requests waiting
    in the workers' queues per replica, an External AverageValue metric (KEDA's
    ScaledObject with a Prometheus trigger on the queue-depth gauge).
    """

    name: str
    mode: str
    signal: str
    target: float
    busy_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"policy {self.name}: signal must be one of {SIGNALS}, got {self.signal!r}")
        if not self.target > 0:
            raise ValueError(f"policy {self.name}: target must be > 0, got {self.target}")


class _Req:
    __slots__ = ("t", "rtt", "deadline", "attempts", "tried", "ticket", "tick")

    def __init__(self, t: float, rtt: float, deadline: float, tick: int) -> None:
        self.tick = tick            # tick it arrived in; < 0 = warm-up, not counted
        self.t = t                  # reached the gateway (request clock)
        self.rtt = rtt              # camera <-> cloud round trip + gateway overhead, s
        self.deadline = deadline    # absolute, request clock
        self.attempts = 0
        self.tried: List[str] = []
        self.ticket: Optional[Ticket] = None


class _Pod:
    __slots__ = ("addr", "speed", "state", "batcher", "busy", "token", "wake_token", "batch", "secs",
                 "ready_tick", "busy_s", "busy_hist", "ready_since")

    def __init__(self, addr: str, speed: float, ready_tick: int) -> None:
        self.addr = addr
        self.speed = speed
        self.state = STARTING
        self.batcher: Batcher[_Req] = Batcher()
        self.busy = False
        self.token = 0              # bumps on a crash: pending batch/wake events are void
        self.wake_token = 0
        self.batch: Tuple[_Req, ...] = ()
        self.secs = 0.0             # compute time of the running batch
        self.ready_tick = ready_tick
        self.busy_s = 0.0           # compute seconds started in the current window
        self.busy_hist: List[float] = []
        self.ready_since = 0


@dataclass
class CellResult:
    """What one cell's day produced (request counts are of simulated requests)."""

    ends: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENDS, 0))
    latency_ms: array = field(default_factory=lambda: array("d"))
    latency_tick: array = field(default_factory=lambda: array("i"))
    retries: int = 0
    ejections: int = 0
    crashes: int = 0
    pods: List[int] = field(default_factory=list)        # per tick, pods that exist (any state)
    desired: List[int] = field(default_factory=list)
    offered: List[float] = field(default_factory=list)   # offered req/s per tick
    arrivals: int = 0
    pod_seconds: float = 0.0
    live: List[int] = field(default_factory=list)        # per tick, pods the Deployment counts
    #: smallest (latency - network - own batch compute) of any answered request: >= 0
    min_slack_ms: float = math.inf

    @property
    def total(self) -> int:
        return sum(self.ends.values())


class CellSim:
    """One cell for one policy over the scenario's span."""

    def __init__(self, s: Scenario, p: Policy, cell: int = 0) -> None:
        s.validate()
        self.s, self.p, self.cell = s, p, cell
        seed = (s.seed, cell)
        self.arr_rng = np.random.default_rng([*seed, 1])       # arrivals + RTTs: same for every policy
        self.fail_rng = random.Random(f"{seed}-fail")
        self.svc_rng = random.Random(f"{seed}-svc")
        self.gpu_rng = random.Random(f"{seed}-gpu")
        self.bursts = M.bursts(s, f"{seed}-burst")
        self.now = 0.0              # request clock
        self.offset = 0.0           # day clock = request clock + offset
        self.balancer = Balancer(BalancerConfig(mode=p.mode), clock=self.day, rng=random.Random(f"{seed}-lb"))
        self.budget = RetryBudget(clock=lambda: self.now)
        self.scaler = Scaler(ScalerConfig(
            min_replicas=s.min_replicas, max_replicas=s.max_replicas,
            target_utilization=p.target if p.signal != "load" else None,
            target_load=p.target if p.signal == "load" else None, stale_after_s=3 * s.tick_s))
        self.arrivals = ArrivalRate()
        self.requests_total = 0.0  # the gateway's counter: every simulated arrival stands for tick_s / window_s
        self.policy = BatchPolicy(max_batch_size=s.max_batch, max_queue_delay_s=s.max_delay_ms / 1000.0,
                                  max_queue_size=s.max_queue)
        self.limit = s.max_batch + s.max_queue
        self.pods: List[_Pod] = []
        self.by_addr: Dict[str, _Pod] = {}
        self.heap: List[Tuple[float, int, int, Optional[_Pod], int]] = []
        self.seq = itertools.count()
        self.serial = itertools.count()
        self.res = CellResult()
        self.tick = 0
        self.busy_ticks = max(1, int(round(p.busy_window_s / s.tick_s)))
        self.rtt_sigma = M.rtt_sigma(s)
        self._ejections: Dict[str, int] = {}

    def day(self) -> float:
        return self.now + self.offset

    # ---- pods --------------------------------------------------------------------------
    def _new_pod(self, ready_tick: int) -> _Pod:
        speed = self.s.a10_speed if self.gpu_rng.random() < self.s.a10_share else 1.0
        pod = _Pod(f"c{self.cell}-w{next(self.serial)}", speed, ready_tick)
        self.pods.append(pod)
        self.by_addr[pod.addr] = pod
        return pod

    def _warm(self, pod: _Pod) -> None:
        """A fresh worker process: new batcher, warm-up seeds it (sizes 1 and max) and decides
        whether batching pays, as ``WorkerServer.warmup`` does (cloud/worker/server.py)."""
        pod.batcher = Batcher(self.policy)
        timings = {size: M.batch_seconds(size, pod.speed, self.s) for size in sorted({1, self.s.max_batch})}
        for size, secs in timings.items():
            pod.batcher.observe(size, secs)
        d = BatchingSettings()
        if not decide_batching(d.mode, timings, d.min_gain, self.s.max_batch).batch:
            pod.batcher.set_policy(self.policy.unbatched())
        pod.state = READY
        pod.ready_since = self.tick
        pod.busy_hist = []

    def _sync_endpoints(self) -> None:
        eps = [(p.addr, 1.0, p.addr, p.state == DRAINING) for p in self.pods
               if p.state in (READY, CRASHED, DRAINING)]
        self.balancer.set_endpoints(eps)

    def _poll(self) -> None:
        """The gateway's Worker.Load poll: capacity, queue, serving; unreachable if crashed."""
        b = self.balancer
        for p in self.pods:
            if p.addr not in b.endpoints:
                continue
            if p.state == CRASHED:
                b.mark_unreachable(p.addr)
            else:
                b.report_load(p.addr, p.batcher.capacity, p.batcher.depth, self.limit, p.state == READY,
                              p.batcher.peak_capacity)

    def _gone(self, pod: _Pod) -> None:
        pod.state = GONE
        self.pods.remove(pod)
        del self.by_addr[pod.addr]

    # ---- autoscaler ------------------------------------------------------------------------
    def _sample(self, current: int) -> PoolSample:
        day, p = self.day(), self.p
        ready = [q for q in self.pods if q.state == READY]
        if p.signal in ("utilization", "load"):
            b = self.balancer
            views = []
            for ep in b.endpoints.values():  # the /pool document's worker states (PoolManager.snapshot)
                state = "draining" if ep.draining else "ejected" if ep.ejected(day) else \
                    "not_serving" if ep.paused else "ready"
                views.append(WorkerView(ep.address, state, ep.in_flight, ep.capacity or 0.0, ep.ejected(day),
                                        ep.peak_capacity or 0.0))
            cap = sum(v.capacity for v in views if v.state == "ready")
            doc = GatewayPool("sim", float(b.total_in_flight()), cap, None, tuple(views), self.requests_total)
            sample = aggregate([doc], 1, day, self.arrivals.observe([doc], day))
            assert sample is not None
            return sample
        if p.signal == "busy":
            fr = [sum(q.busy_hist) / (len(q.busy_hist) * self.s.window_s) for q in ready if q.busy_hist]
            return PoolSample(at=day, in_flight=sum(fr), capacity=float(len(fr)), ready_workers=len(fr))
        waiting = sum(q.batcher.depth for q in ready)
        return PoolSample(at=day, in_flight=float(waiting), capacity=float(current), ready_workers=current)

    def _autoscale(self) -> None:
        live = [q for q in self.pods if q.state in (STARTING, READY, CRASHED)]
        current = len(live)
        decision = self.scaler.decide(self.day(), current, self._sample(current))
        want = decision.desired
        if want > current:
            for _ in range(want - current):
                self._new_pod(self.tick + max(1, math.ceil(self.s.cold_start_s / self.s.tick_s)))
        elif want < current:
            # ReplicaSet scale-down order: pods not ready first, then the most recently ready
            # (kubernetes pkg/controller/controller_utils.go, ActivePodsWithRanks).
            victims = sorted(live, key=lambda q: (q.state == READY, -q.ready_since))[: current - want]
            for q in victims:
                if q.state == READY:
                    q.state = DRAINING
                else:
                    q.state = GONE
            self._sync_endpoints()
            for q in victims:
                if q.state == GONE or (not q.busy and not q.batcher.depth):
                    self._gone(q)
        self.scaler.record_scale(self.day(), current, want)
        if self.tick >= 0:
            self.res.desired.append(want)

    # ---- request path ----------------------------------------------------------------------
    def _end(self, req: _Req, how: str) -> None:
        if req.tick >= 0:
            self.res.ends[how] += 1

    def _route(self, req: _Req) -> None:
        """The gateway's forward loop: pick, send, retry UNAVAILABLE once on another worker."""
        b = self.balancer
        while True:
            remaining = req.deadline - self.now
            if remaining <= 0:
                self._end(req, "shed_deadline")
                return
            pick = b.pick(exclude=req.tried, deadline_s=remaining)
            if not isinstance(pick, Ticket):
                if req.tried:
                    self._end(req, "failed")  # nothing to retry on: the first failure stands
                else:
                    self._end(req, "shed_saturated" if pick is NoPick.SATURATED else "shed_no_worker")
                return
            req.attempts += 1
            pod = self.by_addr[pick.address]
            if pod.state != READY and pod.state != DRAINING:  # crashed: connection refused
                pick.release(outcome_of(status.UNAVAILABLE))
                if self._retry(req, pod):
                    continue
                return
            try:
                pod.batcher.submit(req, self.now, deadline=req.deadline)
            except OverloadedError:
                pick.release(outcome_of(status.RESOURCE_EXHAUSTED))
                self._end(req, "shed_overloaded")
                return
            except DeadlineExceededError:
                pick.release(outcome_of(status.DEADLINE_EXCEEDED))
                self._end(req, "shed_deadline")
                return
            req.ticket = pick
            if not pod.busy:
                self._kick(pod)
            return

    def _kick(self, pod: _Pod) -> None:
        """The worker's scheduler when the model is free: run a batch, or sleep until the next wake-up."""
        now = self.now
        bt = pod.batcher
        batch = bt.next_batch(now)
        for req in bt.expired(now):  # the worker's answer carries the mark, as the shell's does
            self._settle(req, outcome_of(status.DEADLINE_EXCEEDED, EXPIRED_MARK))
            self._end(req, "shed_deadline")
        if batch is not None:
            n = len(batch)
            secs = M.batch_seconds(n, pod.speed, self.s) * math.exp(self.s.jitter * self.svc_rng.gauss(0.0, 1.0))
            pod.busy = True
            pod.batch = batch.items
            pod.busy_s += secs
            pod.secs = secs
            heapq.heappush(self.heap, (now + secs, next(self.seq), _DONE, pod, pod.token))
            return
        if pod.state == DRAINING and not bt.depth:
            self._gone(pod)
            return
        wake = bt.next_wakeup(now)
        if wake is not None:
            pod.wake_token += 1
            heapq.heappush(self.heap, (wake, next(self.seq), _WAKE, pod, pod.wake_token))

    def _retry(self, req: _Req, pod: _Pod) -> bool:
        """After UNAVAILABLE from ``pod``: True when the gateway retries ``req`` elsewhere (counted),
        else it ends as failed (``should_retry``: attempts, remaining time, the retry budget)."""
        req.tried.append(pod.addr)
        if should_retry(status.UNAVAILABLE, req.attempts, req.deadline - self.now, MIN_ATTEMPT_S, self.budget):
            self.res.retries += req.tick >= 0
            return True
        self._end(req, "failed")
        return False

    def _settle(self, req: _Req, outcome: Outcome) -> None:
        if req.ticket is not None:
            req.ticket.release(outcome)
            req.ticket = None

    def _done(self, pod: _Pod) -> None:
        now = self.now
        secs = pod.secs
        items = pod.batch
        pod.batch = ()
        pod.busy = False
        pod.batcher.observe(len(items), secs)
        pod.batcher.finished()
        res = self.res
        lat, tk = res.latency_ms, res.latency_tick
        start = now - secs
        for req in items:
            self._settle(req, Outcome.OK)
            if req.tick >= 0:
                lat.append((now - req.t + req.rtt) * 1000.0)
                tk.append(req.tick)
                res.ends["answered"] += 1
                if (start - req.t) * 1000.0 < res.min_slack_ms:
                    res.min_slack_ms = (start - req.t) * 1000.0
        self._kick(pod)

    def _crash(self, pod: _Pod) -> None:
        """The worker process dies: every request it holds fails (the gateway may retry each)."""
        if pod.state != READY:
            return
        self.res.crashes += self.tick >= 0
        pod.state = CRASHED
        pod.token += 1
        pod.ready_tick = self.tick + max(1, math.ceil(self.s.cold_start_s / self.s.tick_s))
        lost = list(pod.batch) + pod.batcher.expired(math.inf)
        pod.batch = ()
        pod.busy = False
        for req in lost:
            self._settle(req, outcome_of(status.UNAVAILABLE))
            if self._retry(req, pod):
                self._route(req)

    # ---- the day -----------------------------------------------------------------------------
    def run(self) -> CellResult:
        s = self.s
        for _ in range(s.min_replicas):
            self._warm(self._new_pod(0))
        self._sync_endpoints()
        w = s.window_s
        p_fail = 1.0 - math.exp(-s.failures_per_worker_hour * s.tick_s / 3600.0)
        ticks = range(-s.warmup_ticks, s.ticks)
        for k in ticks:
            self.tick = k
            r0 = (k - ticks[0]) * w
            self.now = r0
            self.offset = k * s.tick_s - r0
            # pods whose cold start (or restart) is over begin serving
            changed = False
            for pod in self.pods:
                if pod.state in (STARTING, CRASHED) and pod.ready_tick <= k:
                    self._warm(pod)
                    changed = True
            if changed:
                self._sync_endpoints()
            self._poll()
            self._autoscale()
            for pod in self.pods:
                if pod.state == READY and self.fail_rng.random() < p_fail:
                    heapq.heappush(self.heap, (r0 + w * self.fail_rng.random(), next(self.seq), _CRASH, pod,
                                               pod.token))
            for i in range(1, int(w // s.load_poll_s) + 1):
                if i * s.load_poll_s < w:
                    heapq.heappush(self.heap, (r0 + i * s.load_poll_s, next(self.seq), _POLL, None, 0))
            rate = M.cell_rate(k * s.tick_s, s, self.bursts)
            self._window(r0, r0 + w, rate)
            self._account(rate)
        self._run_until(math.inf, [], [])  # no more arrivals: let every request end
        return self.res

    def _window(self, r0: float, r1: float, rate: float) -> None:
        """Poisson arrivals at ``rate`` over [r0, r1) of the request clock, run to r1."""
        s, rng = self.s, self.arr_rng
        n = int(rng.poisson(rate * (r1 - r0)))
        times = np.sort(rng.uniform(r0, r1, n)).tolist()
        rtts = (np.exp(rng.normal(math.log(s.rtt_median_ms / 1000.0), self.rtt_sigma, n))
                + s.gateway_ms / 1000.0).tolist()
        self.requests_total += n * self.s.tick_s / self.s.window_s
        if self.tick >= 0:
            self.res.arrivals += n
        self._run_until(r1, times, rtts)

    def _run_until(self, end: float, times: List[float], rtts: List[float]) -> None:
        heap = self.heap
        deadline_s = self.s.deadline_ms / 1000.0
        i, n = 0, len(times)
        while True:
            t_arr = times[i] if i < n else end
            if heap and heap[0][0] <= t_arr and heap[0][0] < end:
                t, _, kind, pod, token = heapq.heappop(heap)
                self.now = t
                if pod is None:
                    self._poll()
                elif kind == _DONE:
                    if token == pod.token and pod.state != GONE:
                        self._done(pod)
                elif kind == _WAKE:
                    if token == pod.wake_token and not pod.busy and pod.state in (READY, DRAINING):
                        self._kick(pod)
                elif token == pod.token:  # _CRASH
                    self._crash(pod)
            elif i < n:
                self.now = t_arr
                rtt = rtts[i]
                # the request left the camera rtt/2 earlier; the deadline counts from then
                req = _Req(t_arr, rtt, t_arr - rtt / 2 + deadline_s, self.tick)
                self.budget.record_request()
                self._route(req)
                i += 1
            else:
                break

    def _account(self, rate: float) -> None:
        """End of a tick: busy-time history, and (outside warm-up) the pod and load series."""
        for pod in self.pods:
            if pod.state == READY:
                pod.busy_hist.append(pod.busy_s)
                if len(pod.busy_hist) > self.busy_ticks:
                    del pod.busy_hist[0]
            pod.busy_s = 0.0
        for ep in self.balancer.endpoints.values():
            if self.tick >= 0:
                self.res.ejections += ep.ejections - self._ejections.get(ep.address, 0)
            self._ejections[ep.address] = ep.ejections
        if self.tick < 0:
            return
        r = self.res
        alive = len(self.pods)
        r.pods.append(alive)
        r.live.append(sum(1 for q in self.pods if q.state in (STARTING, READY, CRASHED)))
        r.offered.append(rate)
        r.pod_seconds += alive * self.s.tick_s
