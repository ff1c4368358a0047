"""The worker's batch cut (rule 3f of ``cloud/worker/batching.py``) without machine noise: the
real ``Batcher`` on a virtual clock, against the two rules it replaced.

One seeded Poisson arrival sequence per seed feeds a worker that runs one batch at a time; a
batch of k takes the model profile's time for k plus up to 20% noise (uniform), and the
batcher learns it through ``observe`` as the worker's shell does (warm-up measures sizes 1 and
the largest, as ``cloud/worker/server.py`` does). Each request has the same deadline from its
arrival; priorities are all 0, or drawn from 0-100 as the edge sends its frames' hardness
percentiles. A request answered by then counts as in time; one answered later was computed for
nothing; one the batcher removed first expired in the queue. Rules compared:

* ``rule 3f``: the shipped ``Batcher`` (the batch that answers in time the most requests that
  cannot wait for another batch, then computes the fewest for nothing);
* ``all make it``: the batch cut to the largest size every member makes (the first version of
  rule 3f, replaced after this comparison);
* ``no cut``: the batch rules 3a-3e choose, run whole (before rule 3f).

Profiles: ``gpu`` (8 ms + 2 ms per image: a batch of 8 costs little more than one),
``concave`` (10 ms + 6 ms x sqrt(k)) and ``cpu`` (40 ms x k^1.05: batching gains nothing, as on
this machine's 2 cores). The table prints, per row, the median over seeds of the requests
answered in time, and each rule's ratio to ``no cut``.

    .venv/bin/python bench/batching_sim.py              # a few seconds
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloud.worker.batching import Batcher, BatchPolicy
from edgewise.errors import EdgewiseError

PROFILES: Dict[str, Callable[[int], float]] = {
    "gpu": lambda k: 0.008 + 0.002 * k,
    "concave": lambda k: 0.010 + 0.006 * k ** 0.5,
    "cpu": lambda k: 0.040 * k ** 1.05,
}
#: (profile, requests/s, deadline s): overloaded, near capacity, and one with room
ROWS: Tuple[Tuple[str, float, float], ...] = (
    ("gpu", 300.0, 0.050), ("gpu", 350.0, 0.100), ("gpu", 200.0, 0.050),
    ("concave", 300.0, 0.050), ("concave", 400.0, 0.050),
    ("cpu", 30.0, 0.150), ("cpu", 20.0, 0.150),
)
RULES = ("rule 3f", "all make it", "no cut")


class AllMakeIt(Batcher[float]):
    """The first rule 3f: the largest batch whose time ends before every member's deadline."""

    def _fitting(self, size: int, now: float) -> int:
        best, earliest, k = 1, float("inf"), 0
        for prio in reversed(self._order):
            for p in itertools.islice(self._levels[prio], size - k):
                k += 1
                if p.deadline is not None:
                    earliest = min(earliest, p.deadline)
                if now + self._batch_time(k) < earliest:
                    best = k
            if k == size:
                break
        return best


class NoCut(Batcher[float]):
    """Before rule 3f: the batch rules 3a-3e chose, whole."""

    def _fitting(self, size: int, now: float) -> int:
        return size


def simulate(rule: str, profile: str, rate: float, deadline: float, n: int, seed: int,
             priorities: bool) -> Dict[str, int]:
    """One run: counts of requests in time, late (computed for nothing), expired and refused."""
    rng = random.Random(seed)
    cls = {"rule 3f": Batcher, "all make it": AllMakeIt, "no cut": NoCut}[rule]
    b = cls(BatchPolicy(max_batch_size=8, max_queue_delay_s=0.005, max_queue_size=64))
    cost = PROFILES[profile]
    for k in (1, 8):
        b.observe(k, cost(k), warmup=True)
    t, arrivals = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    out = {"in_time": 0, "late": 0, "expired": 0, "refused": 0}
    now, free_at, i = 0.0, 0.0, 0
    while True:
        while i < n and arrivals[i] <= now:  # the item is the request's deadline
            try:
                b.submit(arrivals[i] + deadline, now, priority=rng.randrange(101) if priorities else 0,
                         deadline=arrivals[i] + deadline)
            except EdgewiseError:
                out["refused"] += 1
            i += 1
        wake = None
        if now >= free_at:
            b.finished()  # the batch before (if any) ended, as the worker's shell says
            batch = b.next_batch(now)
            out["expired"] += len(b.expired(now))
            if batch is not None:
                took = cost(len(batch)) * (1 + 0.2 * rng.random())
                free_at = now + took
                for due in batch.items:
                    out["in_time" if free_at <= due else "late"] += 1
                b.observe(len(batch), took)
            else:
                wake = b.next_wakeup(now)
        events = [e for e in (arrivals[i] if i < n else None, free_at if free_at > now else None) if e is not None]
        if wake is not None:
            events.append(max(wake, now + 1e-6))
        if not events:
            if not len(b):
                return out
            events.append(now + 1e-3)
        now = min(events)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per run (default %(default)s)")
    ap.add_argument("--seeds", type=int, default=3, help="seeded runs per cell, the median printed (default %(default)s)")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.seeds < 1:
        ap.error("--requests and --seeds must be at least 1")
    print(f"Requests answered in time, of {args.requests} (median of {args.seeds} seeds; ratio to 'no cut'); "
          "max batch 8, queue 64, delay 5 ms, model time + up to 20% noise")
    print("| model, load, deadline | priorities | " + " | ".join(RULES) + " |")
    print("|---|---|" + "---|" * len(RULES))
    for profile, rate, deadline in ROWS:
        for priorities in (False, True):
            med = {rule: statistics.median(simulate(rule, profile, rate, deadline, args.requests, seed, priorities)
                                           ["in_time"] for seed in range(args.seeds)) for rule in RULES}
            base = med["no cut"] or 1
            cells = " | ".join(f"{med[r]:.0f} ({med[r] / base:.2f}x)" for r in RULES)
            print(f"| {profile}, {rate:g}/s, {deadline * 1000:g} ms | {'0-100' if priorities else 'all 0'} | {cells} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
