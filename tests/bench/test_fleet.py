"""bench/fleet.py: a tiny day on the real cores, checked for invariants that a wrong simulation breaks.

The scenario is small (two cells, forty minutes, a few thousand requests) but overloaded
and failure-prone on purpose, so retries, ejections, shedding and the autoscaler's upper
bound all happen and are counted.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import List

import numpy as np
import pytest

from bench import _fleet_model as M
from bench import _fleet_report as R
from bench import fleet
from bench._fleet_sim import ENDS, CellResult, CellSim, Policy
from cloud.autoscaler.scaling import DEFAULT_TARGET_LOAD

TINY = M.Scenario(cameras=400, cells=2, sim_cells=2, start_hour=17.6, hours=0.6, warmup_hours=0.1,
                  window_s=0.5, peak_per_camera=0.6, failures_per_worker_hour=4.0, max_replicas=3,
                  extra_bursts=((17.8, 0.1),), seed=3)
POLICIES = [Policy("ours", "wlc", "load", DEFAULT_TARGET_LOAD), Policy("inflight", "wlc", "utilization", 0.03),
            Policy("cpu-hpa", "rr", "busy", 0.5), Policy("keda", "lc", "queue", 1.0)]


@pytest.fixture(scope="module")
def results() -> dict:
    return {p.name: [CellSim(TINY, p, cell).run() for cell in range(TINY.sim_cells)] for p in POLICIES}


def _all(results: dict) -> List[CellResult]:
    return [c for cells in results.values() for c in cells]


def test_every_request_ends_exactly_once(results: dict) -> None:
    for name, cells in results.items():
        for c in cells:
            assert c.arrivals > 500, name
            assert set(c.ends) == set(ENDS)
            assert c.total == c.arrivals, (name, c.ends, c.arrivals)
            assert len(c.latency_ms) == c.ends["answered"] == len(c.latency_tick)
    # the same arrivals (common random numbers) for every policy, cell by cell
    for cell in range(TINY.sim_cells):
        assert len({results[p.name][cell].arrivals for p in POLICIES}) == 1


def test_the_scenario_exercises_failures_retries_and_shedding(results: dict) -> None:
    cells = _all(results)
    assert sum(c.crashes for c in cells) >= 3
    assert sum(c.retries for c in cells) > 0 and sum(c.ejections for c in cells) > 0
    assert sum(c.ends["failed"] for c in cells) > 0  # retried and failed again, or out of budget
    assert sum(v for c in cells for k, v in c.ends.items() if k.startswith("shed_")) > 0


def test_autoscaler_stays_within_its_bounds(results: dict) -> None:
    reached_max = False
    for cells in results.values():
        for c in cells:
            assert len(c.desired) == len(c.live) == len(c.pods) == TINY.ticks
            assert min(c.desired) >= TINY.min_replicas and max(c.desired) <= TINY.max_replicas
            assert min(c.live) >= TINY.min_replicas and max(c.live) <= TINY.max_replicas
            reached_max = reached_max or max(c.desired) == TINY.max_replicas
    assert reached_max  # the load is high enough that the bound matters


def test_latency_is_never_below_service_time(results: dict) -> None:
    # physical floor: network floor (exp(-6 sigma) of the median) + gateway + a batch of one on
    # the fastest GPU with its smallest plausible jitter
    floor_ms = (TINY.rtt_median_ms * math.exp(-6 * M.rtt_sigma(TINY)) + TINY.gateway_ms
                + 1000 * M.batch_seconds(1, TINY.a10_speed, TINY) * math.exp(-6 * TINY.jitter))
    for c in _all(results):
        lat = np.frombuffer(c.latency_ms, dtype=np.float64)
        assert lat.min() >= floor_ms
        assert c.min_slack_ms >= -1e-9  # no request left its batch before the batch started


def test_summary_counts_unanswered_requests_against_the_slo(results: dict) -> None:
    row = R.summarize(POLICIES[0], results["ours"], TINY)
    ends = row["ends"]
    lat = np.concatenate([np.frombuffer(c.latency_ms, dtype=np.float64) for c in results["ours"]])
    unanswered = sum(v for k, v in ends.items() if k != "answered")
    assert row["requests"] == sum(ends.values())
    assert row["over_slo"] == pytest.approx((int((lat > TINY.slo_ms).sum()) + unanswered) / row["requests"])
    assert row["slo_held"] == (row["over_slo"] <= 0.01)
    hours = sum(c.pod_seconds for c in results["ours"]) / 3600
    assert row["worker_hours"] == pytest.approx(hours * TINY.cells / TINY.sim_cells)


def _table(argv: List[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert fleet.main(argv) == 0
    text = buf.getvalue()
    return text[text.index("| policy |"):text.index("SLO: cloud latency")]


def test_same_seed_same_table_and_the_plot_is_written(tmp_path: Path) -> None:
    base = ["--cameras", "400", "--cells", "2", "--sim-cells", "1", "--start-hour", "17.8", "--hours", "0.25",
            "--window-s", "0.5", "--failures-per-worker-hour", "2"]
    one = _table(base + ["--jobs", "1", "--out", str(tmp_path / "a")])
    two = _table(base + ["--jobs", "2", "--out", str(tmp_path / "b")])
    other = _table(base + ["--jobs", "1", "--seeds", "2", "--out", str(tmp_path / "c")])
    assert one == two
    assert one != other
    assert sum(line.startswith("| ") for line in one.splitlines()) == 4  # header + three policies
    png = (tmp_path / "a" / "fleet.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    doc = json.loads((tmp_path / "a" / "fleet.json").read_text())
    assert [r["policy"] for r in doc["rows"]] == ["ours", "cpu-hpa", "keda"]


def test_rows_across_seeds_are_medians_with_per_seed_ratios() -> None:
    def row(name: str, hours: float, p99: float, held: bool = True) -> dict:
        return {"policy": name, "mode": "wlc", "signal": "utilization", "target": 0.1, "p50_ms": 30.0,
                "p99_ms": p99, "over_slo": 0.0, "shed": 0.0, "failed": 0.0, "worker_hours": hours,
                "peak_workers": 10, "mean_workers": 5.0, "slo_held": held, "requests": 100, "min_slack_ms": 0.0}

    seeds = [[row("ours", 80, 50), row("cpu-hpa", 100, 60)],
             [row("ours", 120, 70, held=False), row("cpu-hpa", 100, 40)],
             [row("ours", 90, 55), row("cpu-hpa", 60, 45)]]
    ours, cpu = R.across_seeds(seeds)
    assert ours["worker_hours"] == 90 and ours["p99_ms"] == 55 and ours["held"] == 2 and ours["seeds"] == 3
    assert ours["ratios"] == pytest.approx([0.8, 1.2, 1.5]) and cpu["ratios"] == [1.0, 1.0, 1.0]
    text = R.table([ours, cpu])
    assert "| 2/3 |" in text and "1.20x (0.80-1.50)" in text and "median of 3 seeds" in text


def test_tune_picks_the_cheapest_target_that_held_on_every_seed() -> None:
    def row(t: float, held: bool, hours: float) -> dict:
        return {"target": t, "slo_held": held, "worker_hours": hours, "over_slo": 0.0 if held else 0.05,
                "p99_ms": 50.0}

    rows = [row(0.01, True, 900), row(0.01, True, 950),      # holds, expensive
            row(0.02, True, 600), row(0.02, True, 640),      # holds, cheapest
            row(0.04, True, 700), row(0.04, True, 720),      # looser but dearer (overshoot)
            row(0.08, True, 400), row(0.08, False, 420)]     # misses the SLO on one seed
    best, lines = R.tune(rows)
    assert best == 0.02
    assert [x["target"] for x in lines] == [0.01, 0.02, 0.04, 0.08]
    assert lines[1]["worker_hours"] == 620 and lines[3]["held"] is False and lines[3]["seeds"] == 2
    assert R.tune([row(0.1, False, 10)])[0] is None
    # held, but one day used more than half the budget (0.7% > 0.5% over the SLO): not chosen
    edge = [row(0.02, True, 600), {**row(0.03, True, 500), "over_slo": 0.007}]
    best, lines = R.tune(edge)
    assert best == 0.02 and lines[1]["held"] and not lines[1]["eligible"]
    assert fleet.grid(0.1, 10.0, 3) == [0.1, 1.0, 10.0]


def test_ours_scales_on_the_autoscalers_own_arrival_rate_and_peak_capacity() -> None:
    """The sample ours decides on is built as edgewise cloud autoscaler builds it: the gateway's
    requests_total through ArrivalRate, the workers' peak capacity through aggregate."""
    sim = CellSim(TINY, POLICIES[0], 0)
    seen: list = []
    sample = sim._sample
    sim._sample = lambda current: seen.append(sample(current)) or seen[-1]  # type: ignore[method-assign]
    sim.run()
    rated = [x for x in seen if x.arrivals_per_s is not None]
    assert seen[0].arrivals_per_s is None and len(rated) == len(seen) - 1  # the first poll has no rate yet
    offered = M.cell_rate(17.7 * 3600, TINY, M.bursts(TINY, f"{(TINY.seed, 0)}-burst"))
    mid = rated[len(rated) // 3].arrivals_per_s
    assert 0.5 * offered < mid < 2.0 * offered  # a counter over 15 s of (sampled) requests
    # the peak is the best batch size's rate (per-size averages, so within jitter of the mixed
    # average at worst), well above it while light load forms batches of one
    assert all(x.peak_capacity >= 0.9 * x.capacity for x in rated if x.capacity > 0)
    assert any(x.peak_capacity > 1.2 * x.capacity for x in rated)


def test_model_figures() -> None:
    s = M.Scenario()
    # the batch curve reproduces the published ratio: 4.8 ms/image at 32 against 12.1 ms at 1
    assert M.batch_seconds(32, 1.0, s) / 32 / M.batch_seconds(1, 1.0, s) == pytest.approx(4.8 / 12.1)
    assert M.batch_seconds(1, 1.0, s) == pytest.approx(s.t1_ms / 1000)
    assert M.diurnal(s.peak_hour, s) == pytest.approx(s.peak_per_camera)
    assert M.diurnal((s.peak_hour + 12) % 24, s) == pytest.approx(s.trough_ratio * s.peak_per_camera)
    b = M.bursts(s, "k")
    assert M.cell_rate(18.05 * 3600, s, b) == pytest.approx(
        s.cameras_per_cell * M.diurnal(18.05, s) * s.burst_factor)
    # a shorter span sees the same seeded bursts the whole day has in it
    late = s.with_(start_hour=12.0, hours=12.0)
    assert [x for x in b if x[0] >= 12 * 3600] == [(x + 12 * 3600, y + 12 * 3600) for x, y in M.bursts(late, "k")
                                                  if x >= 0]
    with pytest.raises(ValueError, match="scenario.window_s"):
        s.with_(window_s=20.0).validate()


def test_bursts_can_be_switched_off_from_the_command_line() -> None:
    calm = fleet.parse_args(["--bursts-per-day", "0", "--burst", "none"]).scenario
    assert calm.bursts_per_day == 0 and M.bursts(calm, "cell0") == []
    default = fleet.parse_args([]).scenario
    assert len(M.bursts(default, "cell0")) == default.bursts_per_day * 2 + 1  # warm-up day, the day, 18:00
    with pytest.raises(SystemExit):
        fleet.parse_args(["--bursts-per-day", "-1"])
