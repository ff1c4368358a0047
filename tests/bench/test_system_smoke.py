"""bench/system.py: the quick run end to end (real daemons, real cloud processes, a real
SIGKILL), and the pure knee / summary logic on hand-built records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest

from bench import _system_stats as S
from bench._system_run import mqtt_bridge_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_quick_run_reports_curve_and_loses_nothing_when_a_worker_dies(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "sys.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "system.py"), "--quick", "--n", "1,2", "--seconds", "5",
         "--edge-model", str(tiny_model), "--cloud-model", str(tiny_model), "--json", str(out)],
        capture_output=True, text=True, timeout=140, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    curve = {p["n"]: p for p in doc["curve"]}
    assert sorted(curve) == [1, 2]
    for n, p in curve.items():
        assert p["processed_frames"] > 0
        assert p["offered_frames"] == n * 25
        assert p["sustained_fps"] > 0
        assert p["edge_ms"]["p50"] is not None and p["edge_ms"]["p50"] > 0
        assert set(p["cpu_s"]) >= {"edge", "workers", "gateway"} and p["cpu_s"]["edge"] > 0
        assert p["uplink"]["all_frames_bytes"] > p["uplink"]["escalated_bytes"]
    # The stand-in detects nothing, so the audit fraction drives escalations through the cloud.
    assert sum(p["accounting"]["answered"] for p in curve.values()) > 0
    kill = doc["failures"]["worker_kill"]
    assert [e["event"] for e in kill["events"]] == ["worker 0 SIGKILLed", "worker 0 restarted"]
    assert kill["accounting"]["escalated"] > 0
    assert kill["accounting"]["lost"] == 0
    assert kill["accounting"]["answered"] == kill["accounting"]["escalated"]
    if mqtt_bridge_available():
        broker = doc["failures"]["broker_restart"]
        assert [e["event"] for e in broker["events"]] == ["broker stopped", "broker restarted"]
        assert broker["transport"] == "mqtt"
        assert broker["accounting"]["escalated"] > 0 and broker["accounting"]["lost"] == 0
    else:
        assert "broker_restart" in doc["skipped"]
    # The Markdown table is printed with one row per N and the knee stated.
    assert "| N | daemons |" in proc.stdout
    assert "\n| 1 | 1 |" in proc.stdout and "\n| 2 | 1 |" in proc.stdout
    assert "Knee criterion" in proc.stdout and "| worker_kill |" in proc.stdout
    assert doc["knee"]["criterion"].startswith("every stream keeps >= 90%")
    assert doc["target"]["met"] in (True, False, None)
    # it says what produced it, as every report does: the code, the models, the policy
    assert doc["provenance"]["models"]["edge"]["sha256"] and doc["provenance"]["policy"]["sha256"]
    assert f"commit {doc['provenance']['commit']}" in proc.stdout and "Produced by edgewise" in proc.stdout
    # The report can be printed again from the JSON alone, identically.
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "system.py"), "--report-from", str(out)],
                           capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip() == doc["table"].strip()


def _rec(stream: str, c: int, t_s: float, total_ms: float, escalated: bool = False,
         outcome: str = "edge", e2e_ms: float = 0.0, late: bool = False) -> S.R.Record:
    cap = int(1e12 + t_s * 1e9)
    return {"stream": stream, "frame_seq": (3 << 32) | c, "capture_unix_ns": cap,
            "emit_unix_ns": cap + int((e2e_ms or total_ms) * 1e6), "escalated": escalated,
            "outcome": outcome, "late": late, "cloud_rtt_ms": e2e_ms / 2 if escalated else None,
            "latency_ms": {"read": 1.0, "infer": total_ms / 2, "total": total_ms}}


def test_summary_percentiles_rates_uplink_and_late_answers() -> None:
    recs = [_rec("cam0", c, c / 5.0, 10.0 + c) for c in range(20)]
    recs[12] = _rec("cam0", 12, 12 / 5.0, 30.0, True, "cloud", 120.0)
    recs[15] = _rec("cam0", 15, 15 / 5.0, 30.0, True, "spooled")
    recs.append(_rec("cam0", 15, 15 / 5.0, 30.0, True, "cloud", 4000.0, late=True))
    final = S.merge_finals([recs])
    p = S.summarize_point(final, n_streams=1, fps=5.0, offered_per_stream=25, warmup_s=1.0,
                          frame_bytes={"cam0": [100, 200]}, cpu_s={"edge": 2.0, "workers": 0.5},
                          wall_s=5.0, daemons=1)
    assert p["processed_frames"] == 20 and p["dropped_frames"] == 5
    assert p["sustained_fps"] == pytest.approx(5.0)
    assert p["escalated_ms"]["n"] == 1 and p["escalated_ms"]["p99"] == 120.0  # late answer not in latency
    assert p["accounting"]["answered"] == 2 and p["accounting"]["answered_late"] == 1
    assert p["accounting"]["lost"] == 0
    # frames 5..19 captured after the 1 s warm-up; edge-only = not escalated
    assert p["edge_ms"]["n"] == 13 and p["edge_ms"]["p50"] == 21.0
    assert p["uplink"]["all_frames_bytes"] == 13 * 100 + 12 * 200
    assert p["uplink"]["escalated_bytes"] == 100 + 200  # counters 12 (even) and 15 (odd)
    assert p["worker_cpu_ms_per_escalation"] == 250.0


def _point(n: int, p99: float, fps_min: float, other: float = 0.0, edge_cpu: float = 0.0) -> dict:
    return {"n": n, "fps_target": 5.0, "fps_per_stream_min": fps_min, "escalated_ms": {"p99": p99, "n": 30},
            "escalation_share": 0.15, "worker_cpu_ms_per_escalation": 100.0,
            "accounting": {"answered": 3}, "other_cores": other, "cpu_s": {"edge": edge_cpu},
            "window_s": 10.0}


def test_knee_is_the_first_degraded_n_from_the_data() -> None:
    # summaries without intervals (older JSON) compare the p99s themselves
    pts = [_point(4, 140.0, 5.0), _point(1, 90.0, 5.0), _point(2, 130.0, 4.9)]
    k = S.knee(pts, 0.9, 1.5)
    assert k["knee_n"] == 4 and k["last_ok_n"] == 2 and "140 ms (95% CI 140-140, n=30) > 1.5 x 90 ms" in k["why"][0]
    k = S.knee([_point(1, 90.0, 5.0), _point(2, 100.0, 4.0)], 0.9, 1.5)
    assert k["knee_n"] == 2 and k["last_ok_n"] == 1 and "4 fps < 4.5 fps" in k["why"][0]
    assert S.knee([_point(1, 900.0, 5.0), _point(2, 1000.0, 5.0)], 0.9, 1.5)["knee_n"] is None
    assert S.knee([_point(1, 90.0, 3.0)], 0.9, 1.5)["knee_n"] == 1
    assert S.meets_target(_point(1, 200.0, 5.0), 200.0) is True
    assert S.meets_target(_point(1, 200.1, 5.0), 200.0) is False


def _measured(n: int, xs: List[float]) -> dict:
    return {"n": n, "fps_target": 5.0, "fps_per_stream_min": 5.0,
            "escalated_ms": S.escalated_summary(xs)}


# sample counts of the README's earlier run: N=1, 2, 4, 8 answered 26, 51, 101, 117 escalations
COUNTS = ((1, 26), (2, 51), (4, 101), (8, 117))


def _lognormal(rng: np.random.Generator, n: int, scale: float = 1.0) -> List[float]:
    return list(scale * 130.0 * np.exp(rng.normal(0.0, 0.4, n)))


def test_noise_cannot_place_the_knee() -> None:
    rng = np.random.default_rng(0)
    fooled = 0
    for _ in range(60):
        # the same heavy-tailed latency distribution at every N: there is no knee
        pts = [_measured(n, _lognormal(rng, c)) for n, c in COUNTS]
        k = S.knee(pts, 0.9, 1.5)
        assert k["knee_n"] is None
        # 26 samples cannot bound a p99 (or a p95) from above, and the knee says it did not judge them
        assert k["percentile"] is None and "answered only 26" in k["note"] and "p99 >= 368 and p95 >= 72" in k["note"]
        # comparing the p99s themselves is fooled by the same data now and then
        base = pts[0]["escalated_ms"]["p99"]
        fooled += any(p["escalated_ms"]["p99"] > 1.5 * base for p in pts[1:])
    assert fooled > 0
    for base_n, q in ((400, 99), (150, 95)):
        for _ in range(20):
            # a baseline that bounds its p99 (or only its p95): still no knee from noise
            pts = [_measured(n, _lognormal(rng, base_n if n == 1 else c)) for n, c in COUNTS]
            k = S.knee(pts, 0.9, 1.5)
            assert k["knee_n"] is None and k["percentile"] == q and f"answered {base_n}" in k["note"], k


def test_a_real_step_places_the_knee_once_the_baseline_is_long_enough() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        # from N=4 on every latency is four times longer: the knee is at 4 (405 baseline
        # samples, what bench/system.py collects; the interval assumes nothing about the
        # distribution, so its high end is the largest sample and a 3x step is caught ~85% of
        # the time, a 4x step always)
        pts = [_measured(n, _lognormal(rng, 405 if n == 1 else c, 4.0 if n >= 4 else 1.0)) for n, c in COUNTS]
        k = S.knee(pts, 0.9, 1.5)
        assert k["knee_n"] == 4 and k["last_ok_n"] == 2, k
        assert "n=101" in k["why"][0] and "n=405" in k["why"][0]
    # with 150 baseline samples the p95 is compared, and finds the same step
    pts = [_measured(n, _lognormal(rng, 150 if n == 1 else c, 4.0 if n >= 4 else 1.0)) for n, c in COUNTS]
    k = S.knee(pts, 0.9, 1.5)
    assert k["knee_n"] == 4 and k["percentile"] == 95 and k["why"][0].startswith("escalated p95"), k
    # against a 26-sample baseline it is not judged (and not invented)
    pts = [_measured(n, _lognormal(rng, c, 4.0 if n >= 4 else 1.0)) for n, c in COUNTS]
    assert S.knee(pts, 0.9, 1.5)["knee_n"] is None


def test_p99_interval_is_distribution_free_order_statistics() -> None:
    assert S.samples_for_bounded(0.99) == 368 and S.samples_for_bounded(0.95) == 72
    xs = list(np.random.default_rng(1).exponential(50.0, 1000))
    lo, hi = S.quantile_ci(xs, 0.99)
    assert lo is not None and hi is not None and lo < S.pct(xs, 99) < hi
    assert lo in [round(x, 1) for x in xs] and hi in [round(x, 1) for x in xs]
    # 367 samples: the maximum is not yet a 97.5% upper limit; 368: it is
    assert S.quantile_ci(list(range(1, 368)), 0.99)[1] is None
    assert S.quantile_ci(list(range(1, 369)), 0.99)[1] == 368
    assert S.quantile_ci([5.0], 0.99) == (5.0, None) and S.quantile_ci([], 0.99) == (None, None)
    # the median of 10 samples: the 2nd and 9th order statistics (binomial table, 97.9% coverage)
    assert S.quantile_ci(list(range(1, 11)), 0.5) == (2, 9)
    # coverage: over 400 draws of 500 samples the interval holds the true p99 >= ~95% of the time
    rng = np.random.default_rng(2)
    true_p99 = 50.0 * np.log(100.0)
    held = sum(1 for _ in range(400)
               if (lambda c: c[0] is not None and c[1] is not None and c[0] <= true_p99 <= c[1])(
                   S.quantile_ci(list(rng.exponential(50.0, 500)), 0.99)))
    assert held >= 0.92 * 400


def test_pooled_baseline_reruns_the_smallest_n_until_it_can_bound_its_p99() -> None:
    from argparse import Namespace

    from bench.system import pooled_baseline

    def run_of(ms: List[float]) -> dict:
        return {"n": 1, "fps_per_stream_min": 5.0, "escalated_ms": S.escalated_summary(ms)}

    asked: List[int] = []

    def measure(k: int) -> dict:
        asked.append(k)
        return run_of([100.0 + k] * 100)

    a = Namespace(seconds=20.0, baseline_max_seconds=420.0)
    first = run_of([90.0] * 30)
    pooled = pooled_baseline(a, first, measure)
    assert asked == [1, 2, 3, 4] and pooled["runs"] == 5  # 30 + 4 x 100 >= 368
    assert pooled["escalated_ms"]["n"] == 430 and pooled["escalated_ms"]["p50"] == 102.0
    assert pooled["escalated_ms"]["p99_ci"][1] == 104.0 and pooled["fps_per_stream_min"] == 5.0
    enough = run_of([90.0] * 368)
    assert pooled_baseline(a, enough, measure) is enough
    asked.clear()
    assert pooled_baseline(Namespace(seconds=20.0, baseline_max_seconds=60.0), first, measure)["runs"] == 3
    assert asked == [1, 2]  # three runs of 20 s fill the 60 s
    assert pooled_baseline(Namespace(seconds=20.0, baseline_max_seconds=0.0), first, measure) is first


def test_sized_for_uses_measured_worker_cost_and_free_cores() -> None:
    # capacity = 2 cores / 0.1 s = 20 escalations/s; 70% = 14/s; offered 5 fps x 0.15 x n = 0.75 n/s
    s = S.sized_for([_point(1, 90.0, 5.0), _point(8, 300.0, 5.0)], workers=2, cores=2)
    assert s["capacity_per_s"] == 20.0 and s["n"] == 8
    # 1 core busy with others + 0.5 with the edge daemons leaves 0.5 core: 5/s, 70% = 3.5/s
    pts = [_point(1, 90.0, 5.0, other=1.0, edge_cpu=5.0), _point(4, 300.0, 5.0, other=1.0, edge_cpu=5.0),
           _point(8, 300.0, 5.0, other=1.0, edge_cpu=5.0)]
    s = S.sized_for(pts, workers=2, cores=2)
    assert s["usable_cores"] == 0.5 and s["capacity_per_s"] == 5.0 and s["n"] == 4
    pts = [_point(1, 90.0, 5.0), _point(16, 300.0, 5.0)]
    assert S.sized_for(pts, workers=1, cores=2)["n"] == 1  # 12/s > 7/s
