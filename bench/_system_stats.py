"""Pure summaries for ``bench/system.py``: one load point from the daemons' sink
records, the knee of the cost curve, and the Markdown tables.

No I/O and no clocks here: everything is computed from the records, the
per-process CPU seconds and the JPEG sizes the caller measured, so the numbers
in the table and in the JSON come from the same run. Record fields follow
``edge.pipeline._emit`` / ``edge.escalating._write_merged``; the latest record
per frame wins (``edgewise_tools.demo.records.latest_per_frame``).

The knee compares latency percentiles through their distribution-free confidence
intervals (:func:`quantile_ci`): a p99 of a few dozen samples is nearly their
maximum, so a point-to-point comparison lets one slow sample place the knee. The
interval is the pair of order statistics whose ranks the binomial distribution
gives (Conover, "Practical Nonparametric Statistics", 3rd ed., 1999, section 3.2);
it assumes nothing about the latency distribution, and with fewer than
:func:`samples_for_bounded` samples its upper end is unbounded: no sample count
that small can say how high the percentile is. A point has degraded only when even
the low end of its interval is past ``growth`` x the high end of the smallest N's.
The knee uses the p99 when the smallest N has the 368 samples a bounded p99 needs,
else the p95 (72), else latency is not judged (:func:`knee_percentile`);
``bench/system.py`` runs the smallest N again and pools the runs to get there.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from edgewise_tools.demo import records as R

CI_LEVEL = 0.95

STAGES = ("read", "queue", "preprocess", "infer", "postprocess", "hardness_policy", "total")


def pct(xs: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (None for no data), rounded to 0.1 ms."""
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return round(float(s[k]), 1)


def samples_for_bounded(q: float, level: float = CI_LEVEL) -> int:
    """Fewest samples whose largest one is a ``level`` upper confidence limit of the ``q`` quantile.

    The largest of n samples lies below the true quantile with probability q**n; the
    two-sided interval leaves (1 - level) / 2 on that side: n >= log(0.025) / log(q), which
    is 368 for the p99 and 72 for the p95.
    """
    return math.ceil(math.log((1 - level) / 2) / math.log(q))


#: The knee judges latency growth on the first of these percentiles the smallest N has the
#: samples to bound (:func:`samples_for_bounded`), so a short baseline falls back to the p95.
KNEE_PERCENTILES = (99, 95)


def knee_percentile(base: Optional[Mapping[str, Any]]) -> Optional[int]:
    """The percentile the knee compares (None: too few samples at the smallest N even for a p95)."""
    if base is None:
        return None
    if "p99_ci" not in base["escalated_ms"]:
        return 99  # a summary written before intervals: its p99s are compared as they are
    n = int(base["escalated_ms"]["n"])
    return next((q for q in KNEE_PERCENTILES if n >= samples_for_bounded(q / 100.0)), None)


def quantile_ci(xs: Sequence[float], q: float, level: float = CI_LEVEL) -> Tuple[Optional[float], Optional[float]]:
    """Distribution-free ``level`` interval of the ``q`` quantile: (low, high) order statistics.

    B = the number of samples below the true quantile is Binomial(n, q). The low end is the
    l-th smallest sample with the largest l such that P(B <= l - 1) <= (1 - level) / 2, the
    high end the u-th with the smallest u such that P(B <= u - 1) >= (1 + level) / 2. An end
    that no rank reaches is None (unbounded): too few samples to bound it on that side.
    """
    n = len(xs)
    if n == 0:
        return None, None
    s = sorted(float(x) for x in xs)
    tail = (1 - level) / 2
    cdf, acc = [], 0.0
    for i in range(n + 1):  # P(B = i), in logs: n can be thousands
        acc += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * math.log(q) + (n - i) * math.log1p(-q))
        cdf.append(acc)
    low = [r for r in range(1, n + 1) if cdf[r - 1] <= tail]
    high = [r for r in range(1, n + 1) if cdf[r - 1] >= 1 - tail]
    return (round(s[low[-1] - 1], 1) if low else None), (round(s[high[0] - 1], 1) if high else None)


def escalated_summary(ms: Sequence[float]) -> Dict[str, Any]:
    """Percentiles, count, the knee's intervals and the samples themselves (so that runs of the
    same point can be pooled: :func:`pool_runs`) of answered escalations' latencies in ms."""
    return {"p50": pct(ms, 50), "p95": pct(ms, 95), "p99": pct(ms, 99), "n": len(ms),
            "p95_ci": list(quantile_ci(ms, 0.95)), "p99_ci": list(quantile_ci(ms, 0.99)),
            "samples": [round(float(x), 1) for x in ms]}


def pool_runs(runs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Several runs of one load point as one: escalated latencies pooled over every run, the
    other columns from the first run (each run starts fresh daemons, so they measure the same
    thing), and ``runs`` = how many."""
    out = dict(runs[0])
    out["escalated_ms"] = escalated_summary([x for r in runs for x in r["escalated_ms"]["samples"]])
    out["runs"] = len(runs)
    return out


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def summarize_point(
    final: Mapping[Tuple[str, int], R.Record],
    *,
    n_streams: int,
    fps: float,
    offered_per_stream: int,
    warmup_s: float,
    frame_bytes: Mapping[str, Sequence[int]],
    cpu_s: Mapping[str, float],
    wall_s: float,
    daemons: int,
) -> Dict[str, Any]:
    """Everything the table shows for one N.

    Args:
        final: latest record per (stream, frame counter) of every daemon.
        offered_per_stream: frames each camera produced (``fps`` x duration).
        warmup_s: frames captured in the first ``warmup_s`` of each stream are left out
            of the latency and rate figures (model warm-up); they still count in the
            accounting.
        frame_bytes: stream id -> JPEG bytes (policy quality) of its looped frames, in
            the order the folder source reads them; frame counter c is image c % len.
        cpu_s: role (edge / workers / gateway / broker) -> CPU seconds over the window.
        wall_s: the measurement window the CPU seconds cover.
    """
    recs = list(final.values())
    t0: Dict[str, int] = {}
    for r in recs:
        s = str(r["stream"])
        t0[s] = min(t0.get(s, r["capture_unix_ns"]), r["capture_unix_ns"])
    cut = int(warmup_s * 1e9)
    steady = [r for r in recs if r["capture_unix_ns"] - t0[str(r["stream"])] >= cut]
    # Sustained rate per stream: frames that came out of the daemon over the capture span.
    rates = []
    for s in t0:
        caps = sorted(r["capture_unix_ns"] for r in steady if str(r["stream"]) == s)
        if len(caps) > 1 and caps[-1] > caps[0]:
            rates.append((len(caps) - 1) / ((caps[-1] - caps[0]) / 1e9))
        else:
            rates.append(0.0)
    missing = n_streams - len(rates)
    rates += [0.0] * max(0, missing)
    edge_lat = [r["latency_ms"]["total"] for r in steady if not r.get("escalated")]
    esc = [r for r in steady if r.get("escalated")]
    esc_ok = [(r["emit_unix_ns"] - r["capture_unix_ns"]) / 1e6 for r in esc
              if r.get("outcome") == "cloud" and not r.get("late")]
    rtt = [r["cloud_rtt_ms"] for r in esc if r.get("cloud_rtt_ms") and not r.get("late")]
    stage = {k: pct([r["latency_ms"][k] for r in steady if k in r.get("latency_ms", {})], 50) for k in STAGES}
    all_bytes = esc_bytes = 0
    for s, sizes in frame_bytes.items():
        if sizes:
            all_bytes += sum(sizes[c % len(sizes)] for c in range(offered_per_stream))
    for (s, c), r in final.items():
        sizes = frame_bytes.get(s) or []
        if r.get("escalated") and sizes:
            esc_bytes += sizes[c % len(sizes)]
    acct = R.accounting(dict(final))
    processed = len(recs)
    offered = n_streams * offered_per_stream
    edge_frames = max(1, processed)
    answered = acct["answered"]

    def per_esc(v: float) -> Optional[float]:
        return round(1000 * v / answered, 1) if answered else None

    return {
        "n": n_streams,
        "daemons": daemons,
        "fps_target": fps,
        "offered_frames": offered,
        "processed_frames": processed,
        "dropped_frames": max(0, offered - processed),
        "drop_share": round(max(0, offered - processed) / max(1, offered), 4),
        "sustained_fps": round(sum(rates), 2),
        "fps_per_stream_min": round(min(rates), 2) if rates else 0.0,
        "fps_per_stream_median": pct(rates, 50) or 0.0,
        "edge_ms": {"p50": pct(edge_lat, 50), "p95": pct(edge_lat, 95), "p99": pct(edge_lat, 99),
                    "n": len(edge_lat)},
        "escalated_ms": escalated_summary(esc_ok),
        "cloud_rtt_ms": {"p50": pct(rtt, 50), "p99": pct(rtt, 99)},
        "escalation_share": round(acct["escalated"] / max(1, processed), 4),
        "escalations_per_s": round(len(esc) / max(1e-9, wall_s), 2),
        "uplink": {"all_frames_bytes": all_bytes, "escalated_bytes": esc_bytes,
                   "ratio": round(esc_bytes / all_bytes, 4) if all_bytes else None,
                   "saved": round(1 - esc_bytes / all_bytes, 4) if all_bytes else None},
        "stage_median_ms": stage,
        "cpu_s": {k: round(v, 2) for k, v in cpu_s.items()},
        "cpu_cores_used": round(sum(cpu_s.values()) / max(1e-9, wall_s), 2),
        "edge_cpu_ms_per_frame": round(1000 * cpu_s.get("edge", 0.0) / edge_frames, 2),
        "cloud_cpu_ms_per_escalation": per_esc(cpu_s.get("workers", 0.0) + cpu_s.get("gateway", 0.0)),
        "worker_cpu_ms_per_escalation": per_esc(cpu_s.get("workers", 0.0)),
        "gateway_cpu_ms_per_escalation": per_esc(cpu_s.get("gateway", 0.0)),
        "window_s": round(wall_s, 1),
        # Serial CPU work on an escalated frame's path (edge CPU per frame + cloud CPU per
        # escalation): what its latency would approach with no queueing and no CPU contention.
        "cpu_path_ms": (round(1000 * cpu_s.get("edge", 0.0) / edge_frames
                              + 1000 * (cpu_s.get("workers", 0.0) + cpu_s.get("gateway", 0.0)) / answered, 1)
                        if answered else None),
        "accounting": acct,
    }


def _ci(p: Mapping[str, Any], q: int) -> Tuple[Optional[float], Optional[float]]:
    """A point's escalated p``q`` interval (None = unbounded on that side); the percentile itself
    for summaries written before intervals."""
    x = p["escalated_ms"]
    if f"p{q}_ci" not in x:
        return x[f"p{q}"], x[f"p{q}"]
    lo, hi = x[f"p{q}_ci"]
    return lo, hi


def point_ok(p: Mapping[str, Any], base: Optional[Mapping[str, Any]], fps_floor: float,
             growth: float) -> Tuple[bool, List[str]]:
    """Knee test of one load point: has it degraded past the criterion? Returns (ok, why not).

    Degraded = the slowest stream keeps less than ``fps_floor`` of its camera frame rate, or
    the low end of the escalated latency percentile's interval (:func:`knee_percentile`) is
    past ``growth`` x the high end of the interval at the smallest N (``base``, the point the
    ratios are against). An unbounded end (too few samples) never shows degradation.
    """
    why = []
    q = knee_percentile(base)
    if q is not None and base is not None:
        x = p["escalated_ms"]
        lo, hi = _ci(p, q)
        base_hi = _ci(base, q)[1]
        if lo is not None and base_hi is not None and lo > growth * base_hi:
            why.append(f"escalated p{q} {x[f'p{q}']:g} ms (95% CI {_interval(x['n'], lo, hi)}, n={x['n']}) > "
                       f"{growth:g} x {base_hi:g} ms (high end of the smallest N's CI, "
                       f"n={base['escalated_ms']['n']})")
    floor = fps_floor * float(p["fps_target"])
    if p["fps_per_stream_min"] < floor:
        why.append(f"slowest stream {p['fps_per_stream_min']:g} fps < {floor:g} fps "
                   f"({100 * fps_floor:.0f}% of {p['fps_target']:g})")
    return not why, why


def meets_target(p: Mapping[str, Any], target_ms: float) -> Optional[bool]:
    """Escalated p99 <= target (None when no escalation was answered in time)."""
    p99 = p["escalated_ms"]["p99"]
    return None if p99 is None else bool(p99 <= target_ms)


def _base(ordered: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    """The smallest N with an escalated p99: the baseline of the knee and the ratios."""
    return next((p for p in ordered if p["escalated_ms"]["p99"] is not None), None)


def knee(points: Sequence[Mapping[str, Any]], fps_floor: float, growth: float) -> Dict[str, Any]:
    """The first N (ascending) that degrades past the criterion, and the last N before it."""
    ordered = sorted(points, key=lambda p: p["n"])
    base = _base(ordered)
    crit = (f"every stream keeps >= {100 * fps_floor:.0f}% of its camera frame rate and the escalated "
            f"latency's p99 (p95 when the smallest N has too few samples to bound a p99) stays within "
            f"{growth:g} x its value at the smallest N, compared through distribution-free 95% intervals "
            f"(degraded only when the low end of a point's interval is past {growth:g} x the high end of "
            f"the smallest N's)")
    q = knee_percentile(base)
    if base is None:
        note = "latency growth not judged: no escalation was answered"
    else:
        n = base["escalated_ms"]["n"]
        need = {k: samples_for_bounded(k / 100.0) for k in KNEE_PERCENTILES}
        bounds = " and ".join(f"p{k} >= {v}" for k, v in need.items())
        note = (f"latency growth judged on the p{q}: N={base['n']} answered {n} escalations (a bounded 95% "
                f"upper limit needs {bounds})" if q is not None else
                f"latency growth NOT judged: N={base['n']} answered only {n} escalations and a bounded 95% "
                f"upper limit needs {bounds} (only the frame-rate criterion applies)")
    last_ok: Optional[int] = None
    for p in ordered:
        ok, why = point_ok(p, base, fps_floor, growth)
        if not ok:
            return {"knee_n": p["n"], "last_ok_n": last_ok, "why": why, "criterion": crit,
                    "percentile": q, "note": note}
        last_ok = p["n"]
    return {"knee_n": None, "last_ok_n": last_ok, "why": [], "criterion": crit, "percentile": q,
            "note": note}


def offered_escalations(p: Mapping[str, Any]) -> float:
    """Escalations/s the cameras of one point offer: N x frame rate x escalation share."""
    return float(p["n"]) * float(p["fps_target"]) * float(p["escalation_share"])


def sized_for(points: Sequence[Mapping[str, Any]], workers: int, cores: int,
              utilisation: float = 0.7) -> Dict[str, Any]:
    """The load the pool is sized for, from this run's data.

    Pool capacity (escalations/s) = usable cores / (worker CPU seconds per answered
    escalation at the lightest load), usable cores = min(workers, cores - cores the edge
    daemons and other processes kept busy, median over the points; at least 0.25). The pool
    is sized for the largest N whose escalation arrival rate stays <= ``utilisation`` x capacity.
    """
    ordered = sorted(points, key=lambda p: p["n"])
    base = next((p for p in ordered if p["accounting"]["answered"] > 0), None)
    if base is None:
        return {"n": None, "capacity_per_s": None, "note": "no escalation was answered"}
    per = (base["worker_cpu_ms_per_escalation"] or 0.0) / 1000.0
    if per <= 0:
        return {"n": None, "capacity_per_s": None, "note": "no worker CPU time measured"}
    busy = sorted(float(p.get("other_cores") or 0.0)
                  + float(p["cpu_s"].get("edge", 0.0)) / max(1e-9, float(p.get("window_s") or 1.0))
                  for p in ordered)
    taken = busy[len(busy) // 2] if busy else 0.0
    usable = max(0.25, min(float(workers), cores - taken))
    cap = usable / per
    # Offered escalation load: what N cameras would send if the edge kept up (frames the edge
    # dropped never reach the policy, so the measured arrival rate understates it).
    fit = [p["n"] for p in ordered if offered_escalations(p) <= utilisation * cap]
    return {"n": max(fit) if fit else None, "capacity_per_s": round(cap, 1),
            "usable_cores": round(usable, 2), "worker_ms_per_escalation": round(per * 1000, 1),
            "utilisation": utilisation,
            "note": f"usable cores min({workers} workers, {cores} cores - {taken:.2f} busy with edge "
                    f"daemons and other processes) = {usable:.2f}; / {per * 1000:.1f} ms worker CPU per "
                    f"escalation = {cap:.1f} escalations/s; sized-for N = largest N whose offered "
                    f"escalation load (N x fps x escalation share) <= {100 * utilisation:.0f}% of that"}


def _f(v: Any, fmt: str = "{:g}") -> str:
    return "–" if v is None else fmt.format(v)


def _interval(n: int, lo: Optional[float], hi: Optional[float]) -> str:
    """An interval cell: '–' without samples, an unbounded end as 0 or 'unbounded'."""
    if not n:
        return "–"
    return f"{_f(0 if lo is None else lo)}-{'unbounded' if hi is None else _f(hi)}"


def curve_table(points: Sequence[Mapping[str, Any]], target_ms: float, fps_floor: float,
                growth: float) -> str:
    """The cost curve as Markdown: one row per N, ratios against the smallest N."""
    ordered = sorted(points, key=lambda p: p["n"])
    base = _base(ordered)
    q = knee_percentile(base) or 99  # the interval the knee compares
    head = ("| N | daemons | offered fps | sustained fps (x ideal) | min fps/stream | dropped "
            f"| edge p50/p95/p99 ms | escalated p50/p95/p99 ms (n) | esc p{q} 95% CI | esc p99 x base | escalated "
            "| uplink vs all frames | edge CPU ms/frame | cloud CPU ms/esc | CPU path ms | cores used (+others) "
            f"| p99 <= {target_ms:g} ms | knee check |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for p in ordered:
        ok, why = point_ok(p, base, fps_floor, growth)
        lo, hi = _ci(p, q)
        met = meets_target(p, target_ms)
        e, x = p["edge_ms"], p["escalated_ms"]
        offered = p["n"] * p["fps_target"]
        up = p["uplink"]["ratio"]
        rows.append(
            f"| {p['n']} | {p['daemons']} | {offered:g} | {p['sustained_fps']:g} "
            f"({_f(_ratio(p['sustained_fps'], offered))}) | {p['fps_per_stream_min']:g} "
            f"| {100 * p['drop_share']:.1f}% | {_f(e['p50'])}/{_f(e['p95'])}/{_f(e['p99'])} "
            f"| {_f(x['p50'])}/{_f(x['p95'])}/{_f(x['p99'])} ({x['n']}) | {_interval(x['n'], lo, hi)} "
            f"| {_f(_ratio(x['p99'], base['escalated_ms']['p99'] if base else None))} "
            f"| {100 * p['escalation_share']:.1f}% | {_f(None if up is None else 100 * up, '{:.1f}%')} "
            f"| {p['edge_cpu_ms_per_frame']:g} | {_f(p['cloud_cpu_ms_per_escalation'])} "
            f"| {_f(p.get('cpu_path_ms'))} | {p['cpu_cores_used']:g} (+{_f(p.get('other_cores'))}) "
            f"| {'–' if met is None else 'yes' if met else 'no'} | {'ok' if ok else 'degraded: ' + '; '.join(why)} |")
    return head + "\n".join(rows) + "\n"


def stage_table(points: Sequence[Mapping[str, Any]]) -> str:
    """Median edge stage latencies (ms) and CPU seconds per process role, per N."""
    ordered = sorted(points, key=lambda p: p["n"])
    roles = sorted({k for p in ordered for k in p["cpu_s"]})
    head = ("| N | " + " | ".join(STAGES) + " | cloud rtt p50 | "
            + " | ".join(f"CPU s {r}" for r in roles) + " | window s |\n|"
            + "---|" * (len(STAGES) + len(roles) + 3) + "\n")
    rows = []
    for p in ordered:
        st = p["stage_median_ms"]
        rows.append(f"| {p['n']} | " + " | ".join(_f(st.get(k)) for k in STAGES)
                    + f" | {_f(p['cloud_rtt_ms']['p50'])} | "
                    + " | ".join(_f(p["cpu_s"].get(r)) for r in roles) + f" | {p['window_s']:g} |")
    return head + "\n".join(rows) + "\n"


def failure_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Escalation accounting of the failure runs."""
    head = ("| run | fault | frames | escalated | answered | of which late (spool) | still spooled "
            "| edge-only fallback | lost | gateway retries / worker errors |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for name, run in runs.items():
        a = run["accounting"]
        fault = "; ".join(f"{e['event']} at {e['t']:g} s" for e in run.get("events", [])) or "none"
        rows.append(f"| {name} | {fault} | {a['frames']} | {a['escalated']} | {a['answered']} "
                    f"| {a['answered_late']} | {a['still_spooled']} | {a['edge_only_fallback']} "
                    f"| {a['lost']} | {_counter(run, 'retries')} / {_counter(run, 'worker_errors')} |")
    return head + "\n".join(rows) + "\n"


def _counter(run: Mapping[str, Any], name: str) -> str:
    vals = [v for k, v in run.get("gateway_counters", {}).items() if k.startswith(name + "_total")]
    return f"{sum(vals):g}" if vals else "0"


def merge_finals(per_daemon: Iterable[List[R.Record]]) -> Dict[Tuple[str, int], R.Record]:
    """Latest record per frame over several daemons (stream ids are unique across them)."""
    out: Dict[Tuple[str, int], R.Record] = {}
    for recs in per_daemon:
        out.update(R.latest_per_frame(recs))
    return out
