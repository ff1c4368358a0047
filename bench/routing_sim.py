"""Routing without machine noise: the gateway's real Balancer core against nginx ``least_conn``
on a virtual clock.

``bench/routing.py`` measures real processes, and on a shared 2-core machine one run's p99
moves by more than the routers differ. This bench removes the noise: the same 3-worker pool
(FIFO, one request at a time, service 40/80/160 ms: 4:2:1, as in ``bench/routing.py``) is fed
one seeded Poisson arrival sequence per seed, and each request is routed either by
``cloud.gateway.balancing.Balancer`` (the shipped ``BalancerConfig()``, capacities reported as
the workers' real rates; not a copy of its logic) or by nginx's ``least_conn`` as its
documentation and source describe it (fewest active connections divided by weight, ties by
smooth weighted round robin: http://nginx.org/en/docs/http/ngx_http_upstream_module.html#least_conn).
Service times are fixed (as in the real bench: padded inference), exponential with the same
means, or in proportion to each request's pixels (``regions``: the images a camera fleet
escalates, ``bench/payload_mix.py``, drawn at random with their pixels' mean as the unit; the
workers report their pixels/s (``pixel_rate``) as a native-input worker does, and the gateway sees each
request's pixels as it reads them from the image header; nginx sees only connections).
Latency = queueing + service; the hop's own cost is not modelled.

    .venv/bin/python bench/routing_sim.py              # about 3 minutes
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloud.gateway.balancing import Balancer, BalancerConfig, Outcome, Ticket

SERVICE_S = {"w0": 0.040, "w1": 0.080, "w2": 0.160}
WEIGHTS = {"w0": 4.0, "w1": 2.0, "w2": 1.0}


class NginxLeastConn:
    """nginx ``least_conn`` with weights: min active/weight, ties by smooth WRR."""

    def __init__(self) -> None:
        self.active = {k: 0 for k in WEIGHTS}
        self.cw = {k: 0.0 for k in WEIGHTS}

    def pick(self) -> str:
        best = min(self.active[k] / WEIGHTS[k] for k in WEIGHTS)
        tied = [k for k in WEIGHTS if self.active[k] / WEIGHTS[k] <= best + 1e-12]
        for k in tied:
            self.cw[k] += WEIGHTS[k]
        k = max(tied, key=lambda x: self.cw[x])
        self.cw[k] -= sum(WEIGHTS[t] for t in tied)
        self.active[k] += 1
        return k

    def done(self, k: str) -> None:
        self.active[k] -= 1


def simulate(router: str, config: Optional[BalancerConfig], load: float, n: int, seed: int,
             exponential: bool, pixels: Optional[List[int]] = None) -> Tuple[float, float]:
    """(p50, p99) in ms of ``n`` Poisson arrivals at ``load`` x the pool's capacity; with
    ``pixels``, each request's service time is its worker's mean times its pixels over their mean."""
    arrivals, service = random.Random(seed), random.Random(seed + 7919)
    sizes = random.Random(seed + 31).choices(pixels, k=n) if pixels else []
    mean_px = sum(sizes) / len(sizes) if sizes else 1.0
    now = [0.0]
    balancer: Optional[Balancer] = None
    nginx: Optional[NginxLeastConn] = None
    if router == "nginx":
        nginx = NginxLeastConn()
    else:
        balancer = Balancer(config, clock=lambda: now[0], rng=random.Random(seed))
        balancer.set_endpoints([(k, WEIGHTS[k], k, False) for k in WEIGHTS])
        for k, s in SERVICE_S.items():
            balancer.report_load(k, 1.0 / s, pixel_rate=mean_px / s if pixels else None)
    free_at = {k: 0.0 for k in SERVICE_S}
    pending: List[Tuple[float, int, str, Optional[Ticket]]] = []
    rate = load * sum(1.0 / s for s in SERVICE_S.values())
    lat: List[float] = []
    t = 0.0
    for i in range(n):
        t += arrivals.expovariate(rate)
        while pending and pending[0][0] <= t:
            now[0], _, k, ticket = heapq.heappop(pending)
            if ticket is not None:
                ticket.release(Outcome.OK)
            elif nginx is not None:
                nginx.done(k)
        now[0] = t
        ticket = None
        if balancer is not None:
            picked = balancer.pick(pixels=sizes[i] if sizes else 0)
            assert isinstance(picked, Ticket), picked
            ticket, k = picked, picked.address
        else:
            assert nginx is not None
            k = nginx.pick()
        s = service.expovariate(1.0 / SERVICE_S[k]) if exponential else SERVICE_S[k]
        if sizes:
            s *= sizes[i] / mean_px
        free_at[k] = max(t, free_at[k]) + s
        heapq.heappush(pending, (free_at[k], i, k, ticket))
        lat.append(free_at[k] - t)
    lat.sort()
    return 1000 * lat[len(lat) // 2], 1000 * lat[int(0.99 * len(lat))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000, help="arrivals per run")
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated arrival seeds")
    ap.add_argument("--loads", default="0.5,0.8,0.95", help="fractions of the pool's capacity")
    ap.add_argument("--no-regions", dest="regions", action="store_false",
                    help="skip the region-payload mix (it builds the mix first: about 10 s)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    routers: Dict[str, Tuple[str, Callable[[], Optional[BalancerConfig]]]] = {
        "gateway as shipped (defaults)": ("gateway", BalancerConfig),
        "gateway, idle_first: false": ("gateway", lambda: BalancerConfig(idle_first=False)),
        "gateway, key: active": ("gateway", lambda: BalancerConfig(key="active")),
        "gateway, cost: requests": ("gateway", lambda: BalancerConfig(cost="requests")),
        "nginx least_conn 4:2:1": ("nginx", lambda: None),
    }
    mix: Optional[List[int]] = None
    if args.regions:
        from payload_mix import describe, region_payloads
        payloads = region_payloads()
        mix = [p.pixels for p in payloads]
        print(f"regions: {describe(payloads)}\n")
    print("| service times | load | router | p50 ms | p99 ms (mean of seeds) | p99 / nginx |")
    print("|---|---|---|---|---|---|")
    kinds = [("fixed", False, None), ("exponential", True, None)] + ([("regions (∝ pixels)", False, mix)] if mix else [])
    for kind, exponential, pixels in kinds:
        for load in (float(x) for x in args.loads.split(",")):
            rows = {}
            for name, (router, make) in routers.items():
                runs = [simulate(router, make(), load, args.requests, s, exponential, pixels) for s in seeds]
                rows[name] = (sum(r[0] for r in runs) / len(runs), sum(r[1] for r in runs) / len(runs))
            ref = rows["nginx least_conn 4:2:1"][1]
            for name, (p50, p99) in rows.items():
                print(f"| {kind} | {load:.0%} | {name} | {p50:.1f} | {p99:.1f} | {p99 / ref:.3f} |", flush=True)
    print(f"\n{args.requests} arrivals per run, seeds {args.seeds}; pool 40/80/160 ms FIFO workers.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
