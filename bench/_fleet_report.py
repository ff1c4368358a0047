"""Summaries, the Markdown table, the tuning search and the plot of ``bench/fleet.py``.

Pure over :class:`bench._fleet_sim.CellResult` lists except :func:`plot` (writes a PNG).
A request that was shed or failed counts as over the SLO, so a policy cannot hold the
SLO by shedding: "SLO held" means at most 1% of all requests were not answered within it,
which is the same as a p99 over every request (unanswered ones counted as infinite) within it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bench._fleet_model import Scenario
from bench._fleet_sim import CellResult, Policy

SHED = ("shed_saturated", "shed_no_worker", "shed_deadline", "shed_overloaded")
SIGNAL_LABEL = {
    "load": "requests/s / peak capacity (HPA algorithm)",
    "utilization": "in-flight / capacity (HPA algorithm)",
    "busy": "busy-time fraction, 60 s (HPA on CPU/GPU utilisation)",
    "queue": "queue length per replica (KEDA, External AverageValue)",
}
#: the SLO holds when at most this share of requests is over it (late, shed or failed)
SLO_BUDGET = 0.01
#: ``tune`` keeps only targets whose worst tuning seed used at most this share of the budget
TUNE_HEADROOM = 0.5
MODE_LABEL = {"wlc": "weighted least-conn", "rr": "round robin", "lc": "least-conn"}


def summarize(p: Policy, cells: Sequence[CellResult], s: Scenario) -> Dict[str, Any]:
    """One row: latency, SLO, shedding and worker-hours of a policy over the simulated cells."""
    lat = np.concatenate([np.frombuffer(c.latency_ms, dtype=np.float64) for c in cells]) \
        if cells else np.zeros(0)
    ends = {k: sum(c.ends[k] for c in cells) for k in cells[0].ends} if cells else {}
    total = sum(ends.values())
    late = int(np.count_nonzero(lat > s.slo_ms))
    shed = sum(ends.get(k, 0) for k in SHED)
    failed = ends.get("failed", 0)
    over = (late + shed + failed) / total if total else 0.0
    scale = s.cells / s.sim_cells
    pod_h = sum(c.pod_seconds for c in cells) / 3600.0
    fleet_pods = np.sum([c.pods for c in cells], axis=0) * scale if cells else np.zeros(0)
    return {
        "policy": p.name, "mode": p.mode, "signal": p.signal, "target": p.target,
        "requests": total, "arrivals": sum(c.arrivals for c in cells), "ends": ends,
        "p50_ms": _q(lat, 50), "p99_ms": _q(lat, 99),
        "over_slo": over, "shed": shed / total if total else 0.0, "failed": failed / total if total else 0.0,
        "slo_held": over <= SLO_BUDGET,
        "worker_hours": pod_h * scale, "peak_workers": int(fleet_pods.max()) if fleet_pods.size else 0,
        "mean_workers": float(fleet_pods.mean()) if fleet_pods.size else 0.0,
        "retries": sum(c.retries for c in cells), "crashes": sum(c.crashes for c in cells),
        "ejections": sum(c.ejections for c in cells),
        "min_slack_ms": min((c.min_slack_ms for c in cells), default=math.inf),
    }


def _q(x: np.ndarray, q: float) -> Optional[float]:
    return float(np.percentile(x, q)) if x.size else None


def _ms(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.1f}"


FIGURES = ("p50_ms", "p99_ms", "over_slo", "shed", "failed", "worker_hours", "peak_workers", "mean_workers")


def across_seeds(by_seed: Sequence[Sequence[Dict[str, Any]]], base: str = "cpu-hpa") -> List[Dict[str, Any]]:
    """One row per policy from per-seed rows (same policies, same order, in every seed).

    Each figure is the median over seeds; ``held`` counts the seeds on which the SLO held;
    ``ratios`` are the policy's worker-hours over ``base``'s on the same seed.
    """
    out = []
    for i, first in enumerate(by_seed[0]):
        rs = [rows[i] for rows in by_seed]
        row = {k: first[k] for k in ("policy", "mode", "signal", "target")}
        for k in FIGURES:
            vals = [r[k] for r in rs if r[k] is not None]
            row[k] = float(np.median(vals)) if vals else None
        refs = [next((b for b in rows if b["policy"] == base), None) for rows in by_seed]
        row["ratios"] = [r["worker_hours"] / b["worker_hours"] for r, b in zip(rs, refs) if b and b["worker_hours"]]
        row["held"] = sum(bool(r["slo_held"]) for r in rs)
        row["seeds"] = len(rs)
        row["requests"] = sum(r["requests"] for r in rs)
        row["min_slack_ms"] = min(r["min_slack_ms"] for r in rs)
        out.append(row)
    return out


def table(rows: Sequence[Dict[str, Any]]) -> str:
    """The comparison as Markdown (rows from :func:`across_seeds`)."""
    n = rows[0]["seeds"] if rows else 1
    med = "" if n == 1 else f" (median of {n} seeds)"
    head = (f"| policy | routing | autoscaling signal | target | p50 ms | p99 ms | over SLO | shed to edge "
            f"| failed | worker-hours{med} | vs CPU-HPA{'' if n == 1 else ' (median, range)'} "
            f"| peak / mean workers | SLO held{'' if n == 1 else ' (seeds)'} |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    out = []
    for r in rows:
        rt = r["ratios"]
        ratio = "–" if not rt else f"{np.median(rt):.2f}x" + (f" ({min(rt):.2f}-{max(rt):.2f})" if n > 1 else "")
        held = ("yes" if r["held"] else "no") if n == 1 else f"{r['held']}/{n}"
        out.append(
            f"| {r['policy']} | {MODE_LABEL.get(r['mode'], r['mode'])} | {SIGNAL_LABEL[r['signal']]} "
            f"| {r['target']:g} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} | {100 * r['over_slo']:.2f}% "
            f"| {100 * r['shed']:.2f}% | {100 * r['failed']:.3f}% | {r['worker_hours']:.0f} | {ratio} "
            f"| {r['peak_workers']:.0f} / {r['mean_workers']:.0f} | {held} |")
    return head + "\n".join(out) + "\n"


def tune(rows: Sequence[Dict[str, Any]]) -> Tuple[Optional[float], List[Dict[str, Any]]]:
    """The cheapest target that kept every seed it ran with within half the SLO's budget.

    ``rows`` are :func:`summarize` rows of one policy at several targets and seeds. Half
    the budget (``TUNE_HEADROOM``), not all of it: the cheapest target that only just holds
    on the tuning seeds sits at a cliff and fails on other days (it did, for every policy,
    when targets were chosen that way). Cheapest, not loosest: near the knee the signals
    spike, the autoscaler overshoots and the 300 s scale-down window holds the overshoot, so
    a looser target can cost more. Returns the chosen target (None if none qualified) and
    one line per target.
    """
    by: Dict[float, List[Dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["target"], []).append(r)
    lines = []
    for t in sorted(by):
        rs = by[t]
        lines.append({"target": t, "seeds": len(rs), "held": all(r["slo_held"] for r in rs),
                      "worker_hours": float(np.mean([r["worker_hours"] for r in rs])),
                      "over_slo": max(r["over_slo"] for r in rs),
                      "p99_ms": float(np.mean([r["p99_ms"] for r in rs if r["p99_ms"] is not None] or [np.nan]))})
        lines[-1]["eligible"] = lines[-1]["held"] and lines[-1]["over_slo"] <= TUNE_HEADROOM * SLO_BUDGET
    ok = [x for x in lines if x["eligible"]]
    best = min(ok, key=lambda x: (x["worker_hours"], -x["target"]))["target"] if ok else None
    return best, lines


def tuning_table(tried: Dict[str, List[Dict[str, Any]]], chosen: Dict[str, Optional[float]]) -> str:
    head = ("| policy | target | seeds | mean p99 ms | worst over SLO | mean worker-hours | SLO held on all "
            f"| worst within {100 * TUNE_HEADROOM * SLO_BUDGET:g}% |\n"
            "|---|---|---|---|---|---|---|---|\n")
    lines = []
    for name, rows in tried.items():
        for r in rows:
            mark = " **(chosen)**" if chosen.get(name) == r["target"] else ""
            lines.append(f"| {name} | {r['target']:.4g}{mark} | {r['seeds']} | {r['p99_ms']:.1f} "
                         f"| {100 * r['over_slo']:.2f}% | {r['worker_hours']:.0f} | {'yes' if r['held'] else 'no'} "
                         f"| {'yes' if r.get('eligible', r['held']) else 'no'} |")
    return head + "\n".join(lines) + "\n"


def series(p: Policy, cells: Sequence[CellResult], s: Scenario, bin_ticks: int) -> Dict[str, np.ndarray]:
    """Per-bin p99 latency (answered), fleet workers and offered fleet load, for the plot."""
    scale = s.cells / s.sim_cells
    n = len(cells[0].pods)
    bins = max(1, math.ceil(n / bin_ticks))
    lat = np.concatenate([np.frombuffer(c.latency_ms, dtype=np.float64) for c in cells])
    tick = np.concatenate([np.frombuffer(c.latency_tick, dtype=np.int32) for c in cells])
    p99 = np.full(bins, np.nan)
    idx = tick // bin_ticks
    order = np.argsort(idx, kind="stable")
    idx, lat = idx[order], lat[order]
    bounds = np.searchsorted(idx, np.arange(bins + 1))
    for b in range(bins):
        chunk = lat[bounds[b]:bounds[b + 1]]
        if chunk.size:
            p99[b] = np.percentile(chunk, 99)
    pods = np.sum([c.pods for c in cells], axis=0) * scale
    offered = np.sum([c.offered for c in cells], axis=0) * scale
    hours = s.start_hour + np.arange(n) * s.tick_s / 3600.0
    return {"hours": hours, "bin_hours": s.start_hour + (np.arange(bins) + 0.5) * bin_ticks * s.tick_s / 3600.0,
            "p99": p99, "workers": pods, "offered": offered}


def plot(curves: Dict[str, Dict[str, np.ndarray]], s: Scenario, path: Path) -> None:
    """Latency p99 (15-min bins) and fleet workers over the day per policy, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, c in curves.items():
        ax1.plot(c["bin_hours"], c["p99"], label=name, drawstyle="steps-mid")
        ax2.plot(c["hours"], c["workers"], label=name, linewidth=1.0)
    ax1.axhline(s.slo_ms, color="k", linestyle="--", linewidth=0.8, label=f"SLO {s.slo_ms:g} ms")
    ax1.set_ylabel("cloud latency p99, ms (answered)")
    ax1.set_yscale("log")
    ax1.legend(loc="upper left", fontsize=8)
    ax1.set_title(f"{s.cameras:,} cameras in {s.cells} cells ({s.sim_cells} simulated per request), "
                  f"seed {s.seed}")
    first = next(iter(curves.values()))
    ax3 = ax2.twinx()
    ax3.fill_between(first["hours"], first["offered"], color="0.85", step="mid", zorder=0)
    ax3.set_ylabel("offered escalations/s (grey)")
    ax2.set_zorder(ax3.get_zorder() + 1)
    ax2.patch.set_visible(False)
    ax2.set_ylabel("workers (pods) in the fleet")
    ax2.set_xlabel("hour of day")
    ax2.legend(loc="upper left", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
