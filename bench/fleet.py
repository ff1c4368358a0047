"""Fleet simulation: a day of 10,000 cameras on the real balancer, batcher and autoscaler cores.

Compares, at equal SLO (cloud p99 <= 80 ms, shed and failed requests counted as over it):

* **ours**: weighted least-connections + the HPA algorithm on the load target, requests/s over
  the ready workers' peak capacity (the shipped default of ``edgewise cloud autoscaler``);
* **inflight** (on request): the same on in-flight / measured capacity, ours before;
* **cpu-hpa**: round robin + the same HPA core on the pods' busy-time fraction (Kubernetes'
  default CPU-utilisation HPA, with GPU busy time as the utilisation);
* **keda**: least-connections + the same HPA core on queue length per replica (a KEDA
  ScaledObject's External metric with an AverageValue target).

Each policy's target is its cheapest one (fewest worker-hours) that kept every tuning seed
within half the SLO's budget on the default scenario (``--tune`` searches a grid of targets
again). The model, its sources and its limits:
docs/design/autoscaling.md#the-fleet-simulation.

    .venv/bin/python bench/fleet.py                       # the default day, about a minute
    .venv/bin/python bench/fleet.py --hours 2 --window-s 15   # every request of two hours
    .venv/bin/python bench/fleet.py --tune                # search each policy's target again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from bench import _fleet_report as R  # noqa: E402
from bench._fleet_model import Scenario  # noqa: E402
from bench._fleet_sim import CellResult, CellSim, Policy  # noqa: E402
from cloud.autoscaler.scaling import DEFAULT_TARGET_LOAD  # noqa: E402
from edgewise_tools.cpu import simd_summary  # noqa: E402

#: Cheapest targets within half the SLO budget on the default scenario on each of seeds 1-4 (``--tune``
#: with its defaults; the grid is in docs/design/autoscaling.md#the-policies-compared). Ours is the
#: autoscaler's shipped default, kept in one place: cloud/autoscaler/scaling.py.
TUNED = {"ours": DEFAULT_TARGET_LOAD, "inflight": 0.0387, "cpu-hpa": 0.908, "keda": 1.99}
#: (routing mode, signal, tuning grid range) per policy
KINDS: Dict[str, Tuple[str, str, Tuple[float, float]]] = {
    "ours": ("wlc", "load", (0.5, 1.1)),
    "inflight": ("wlc", "utilization", (0.02, 0.05)),
    "cpu-hpa": ("rr", "busy", (0.75, 0.95)),
    "keda": ("lc", "queue", (1.0, 3.0)),
}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    d = Scenario()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cameras", type=int, default=d.cameras)
    p.add_argument("--cells", type=int, default=d.cells, help="independent cells the fleet runs as")
    p.add_argument("--sim-cells", type=int, default=d.sim_cells,
                   help="cells simulated request by request (worker-hours scale by cells / sim-cells)")
    p.add_argument("--hours", type=float, default=d.hours)
    p.add_argument("--start-hour", type=float, default=d.start_hour)
    p.add_argument("--window-s", type=float, default=d.window_s,
                   help=f"request-level seconds simulated per {d.tick_s:g} s autoscaler tick "
                        f"({d.tick_s:g} = every request)")
    p.add_argument("--peak-per-camera", type=float, default=d.peak_per_camera,
                   help="escalations/s per camera at the busiest hour")
    p.add_argument("--failures-per-worker-hour", type=float, default=d.failures_per_worker_hour)
    p.add_argument("--cold-start-s", type=float, default=d.cold_start_s)
    p.add_argument("--a10-share", type=float, default=d.a10_share, help="share of pods on A10s (rest T4)")
    p.add_argument("--slo-ms", type=float, default=d.slo_ms)
    p.add_argument("--deadline-ms", type=float, default=d.deadline_ms)
    p.add_argument("--bursts-per-day", type=int, default=d.bursts_per_day,
                   help=f"bursts at seeded random hours per cell and day (x{d.burst_factor:g} for "
                        f"{d.burst_minutes:g} min each)")
    p.add_argument("--burst", action="append", default=None, metavar="HOUR:MINUTES",
                   help="a fixed burst at this hour of day (repeatable; replaces the default one at "
                        "18:00 for 10 min; 'none' for no fixed burst)")
    p.add_argument("--seeds", default=str(d.seed),
                   help="comma-separated; with several, each figure is the median over them")
    p.add_argument("--policies", default="ours,cpu-hpa,keda", help="comma-separated, from " + ",".join(KINDS))
    p.add_argument("--target", action="append", default=[], metavar="POLICY=VALUE",
                   help="override a policy's target (repeatable)")
    p.add_argument("--tune", action="store_true",
                   help="run each policy on a grid of targets and seeds, report with the cheapest "
                        "target that kept every seed within half the SLO budget")
    p.add_argument("--tune-points", type=int, default=5, help="targets per policy (geometric grid)")
    p.add_argument("--tune-refine", type=int, default=3,
                   help="bisection steps between the chosen target and the next looser one that failed")
    p.add_argument("--tune-seeds", default="1,2,3,4", help="seeds every target must hold the SLO on")
    p.add_argument("--jobs", type=int, default=0, help="processes (default: one per CPU core)")
    p.add_argument("--out", type=Path, default=ROOT / ".cache" / "fleet", help="folder for fleet.png and fleet.json")
    a = p.parse_args(argv)
    a.policies = [x.strip() for x in a.policies.split(",") if x.strip()]
    try:
        a.seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    except ValueError:
        p.error(f"--seeds {a.seeds!r}: use integers, e.g. 1,2,3")
    if not a.seeds:
        p.error("--seeds: give at least one")
    bad = [x for x in a.policies if x not in KINDS]
    if bad or not a.policies:
        p.error(f"--policies: unknown {bad}; choose from {', '.join(KINDS)}")
    a.targets = dict(TUNED)
    for item in a.target:
        name, _, val = item.partition("=")
        try:
            a.targets[name] = float(val)
        except ValueError:
            p.error(f"--target {item!r}: use POLICY=NUMBER, e.g. ours=0.03")
        if name not in KINDS:
            p.error(f"--target {item!r}: unknown policy {name!r}")
    extra = list(d.extra_bursts) if a.burst is None else []
    for b in a.burst or []:
        if b == "none":
            continue
        h, _, m = b.partition(":")
        try:
            extra.append((float(h), float(m or 10) / 60.0))
        except ValueError:
            p.error(f"--burst {b!r}: use HOUR:MINUTES, e.g. 18.5:10")
    a.scenario = d.with_(cameras=a.cameras, cells=a.cells, sim_cells=a.sim_cells, hours=a.hours,
                         start_hour=a.start_hour, window_s=a.window_s, peak_per_camera=a.peak_per_camera,
                         failures_per_worker_hour=a.failures_per_worker_hour, cold_start_s=a.cold_start_s,
                         a10_share=a.a10_share, slo_ms=a.slo_ms, deadline_ms=a.deadline_ms,
                         bursts_per_day=a.bursts_per_day, seed=a.seeds[0], extra_bursts=tuple(extra))
    try:
        a.scenario.validate()
    except ValueError as exc:
        p.error(str(exc))
    return a


def policy(name: str, target: float) -> Policy:
    mode, signal, _ = KINDS[name]
    return Policy(name, mode, signal, target)


Job = Tuple[Scenario, Policy, int]


def _cell(job: Job) -> Tuple[CellResult, float]:
    s, p, cell = job
    t0 = time.process_time()
    res = CellSim(s, p, cell).run()
    return res, time.process_time() - t0


def simulate(work: Sequence[Job], procs: int) -> Tuple[List[CellResult], float]:
    """Every (scenario, policy, cell) job, in order, on ``procs`` processes; and their CPU seconds."""
    if procs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=min(procs, len(work))) as ex:
            done = list(ex.map(_cell, work))
    else:
        done = [_cell(w) for w in work]
    return [r for r, _ in done], sum(cpu for _, cpu in done)


def rows_of(work: Sequence[Job], results: Sequence[CellResult]) -> Dict[Tuple[int, str, float], Dict[str, Any]]:
    """One summary row per (seed, policy, target), over its cells."""
    groups: Dict[Tuple[int, str, float], Tuple[Scenario, Policy, List[CellResult]]] = {}
    for (s, p, _), res in zip(work, results):
        groups.setdefault((s.seed, p.name, p.target), (s, p, []))[2].append(res)
    return {k: R.summarize(p, cells, s) for k, (s, p, cells) in groups.items()}


def grid(lo: float, hi: float, points: int) -> List[float]:
    """``points`` targets spaced geometrically from lo to hi, rounded to 3 significant digits."""
    if points <= 1:
        return [hi]
    return [float(f"{lo * (hi / lo) ** (i / (points - 1)):.3g}") for i in range(points)]


def cpu_line() -> str:
    """CPU model, core count and the SIMD flags that matter."""
    model = "unknown CPU"
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPUs, flags {simd_summary()}"


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    s: Scenario = a.scenario
    jobs = a.jobs or (os.cpu_count() or 1)
    t_wall = time.monotonic()
    load0 = os.getloadavg()
    tuning: Dict[str, List[Dict[str, Any]]] = {}
    chosen: Dict[str, Optional[float]] = {}
    cpu_total = 0.0
    if a.tune:
        seeds = [int(x) for x in a.tune_seeds.split(",") if x.strip()]
        grid_rows: Dict[Tuple[int, str, float], Dict[str, Any]] = {}

        def batch(targets: Dict[str, List[float]]) -> None:
            nonlocal cpu_total
            work = [(s.with_(seed=sd), policy(n, t), c) for n, ts in targets.items() for t in ts
                    for sd in seeds for c in range(s.sim_cells)]
            print(f"tuning: {len(work)} simulated cell-days on {jobs} process(es)", file=sys.stderr)
            results, cpu = simulate(work, jobs)
            cpu_total += cpu
            grid_rows.update(rows_of(work, results))

        def choose() -> None:
            for n in a.policies:
                chosen[n], tuning[n] = R.tune([r for (_, name, _), r in grid_rows.items() if name == n])

        batch({n: grid(*KINDS[n][2], a.tune_points) for n in a.policies})
        choose()
        for _ in range(a.tune_refine):
            # bisect (geometrically) towards the next looser target, if that one did not qualify
            nxt: Dict[str, List[float]] = {}
            for n in a.policies:
                looser = [x for x in tuning[n] if chosen[n] is not None and x["target"] > chosen[n]]
                if chosen[n] is not None and looser and not looser[0]["eligible"]:
                    nxt[n] = [float(f"{math.sqrt(chosen[n] * looser[0]['target']):.3g}")]
            if not nxt:
                break
            batch(nxt)
            choose()
        for n, best in chosen.items():
            if best is not None:
                a.targets[n] = best
    pols = [policy(n, a.targets[n]) for n in a.policies]
    work = [(s.with_(seed=sd), p, c) for sd in a.seeds for p in pols for c in range(s.sim_cells)]
    results, cpu = simulate(work, jobs)
    cpu_total += cpu
    by_key = rows_of(work, results)
    rows = R.across_seeds([[by_key[(sd, p.name, p.target)] for p in pols] for sd in a.seeds])
    raw = {p.name: [r for (q_s, q, _), r in zip(work, results) if q.name == p.name and q_s.seed == s.seed]
           for p in pols}
    wall = time.monotonic() - t_wall
    load1 = os.getloadavg()
    sim_req = sum(r["requests"] for r in rows)
    lines = [
        f"## Fleet simulation: {s.cameras:,} cameras, {s.hours:g} h from {s.start_hour:g}:00, "
        f"seed{'s' if len(a.seeds) > 1 else ''} {', '.join(map(str, a.seeds))}",
        "",
        f"{s.cells} cells of {s.cameras_per_cell:g} cameras ({s.sim_cells} simulated request by request, "
        f"worker-hours x {s.cells / s.sim_cells:g}); {s.peak_per_camera:g} escalations/s per camera at "
        f"{s.peak_hour:g}:00, {100 * s.trough_ratio:g}% of that at night, {s.bursts_per_day} bursts of "
        f"x{s.burst_factor:g} for {s.burst_minutes:g} min per cell; YOLOv5x on T4 ({s.t1_ms:g} ms at batch 1) "
        f"and A10 ({100 * s.a10_share:g}% of pods, x{s.a10_speed:.2f}); {s.cold_start_s:g} s cold starts, "
        f"{s.failures_per_worker_hour:g} failures per worker-hour; RTT median {s.rtt_median_ms:g} ms, p99 "
        f"{s.rtt_p99_ms:g} ms; deadline {s.deadline_ms:g} ms; {s.window_s:g} s of requests per "
        f"{s.tick_s:g} s tick.",
        "",
        R.table(rows),
        f"SLO: cloud latency (camera -> answer, network included) p99 <= {s.slo_ms:g} ms; 'over SLO' counts "
        f"answers later than that plus requests shed to the edge or failed; 'SLO held' = over SLO <= 1%. "
        f"Targets: each policy's cheapest that kept its tuning seeds within half the budget "
        f"({'searched in this run' if a.tune else 'TUNED in bench/fleet.py, from --tune'}).",
        "",
        f"Run: {sim_req:,} requests simulated, {cpu_total:.1f} CPU s, {wall:.1f} s wall with {jobs} process(es); "
        f"load average {load0[0]:.2f} at start, {load1[0]:.2f} at the end; {cpu_line()}.",
        "",
    ]
    for r in rows:
        if r["min_slack_ms"] < -1e-6:
            lines.append(f"WARNING: {r['policy']}: a request was answered before its batch could start "
                         f"({r['min_slack_ms']:.3f} ms)")
    if tuning:
        lines += [f"Tuning grid (seeds {a.tune_seeds}, then {a.tune_refine} bisection steps towards the next "
                  "looser target; chosen = fewest mean worker-hours among the targets that kept within half the SLO budget on "
                  "every seed):", "", R.tuning_table(tuning, chosen)]
    text = "\n".join(lines)
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    curves = {p.name: R.series(p, raw[p.name], s, bin_ticks=int(900 / s.tick_s)) for p in pols}
    R.plot(curves, s, a.out / "fleet.png")
    doc = {"scenario": {k: v for k, v in vars(s).items()}, "rows": rows, "targets": a.targets,
           "tuning": tuning, "wall_s": round(wall, 1), "cpu_s": round(cpu_total, 1),
           "loadavg": [load0[0], load1[0]], "table": text}
    (a.out / "fleet.json").write_text(json.dumps(doc, indent=1, default=float))
    print(f"plot: {a.out / 'fleet.png'}; summary: {a.out / 'fleet.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
