"""The fleet simulation's world model: the scenario, the load over a day, GPU batch times, the network.

Pure functions and frozen data, no simulation state. Every number that is not a
knob of the project's own cores is an assumption or a public figure; each says which
(the full list with its sources is docs/design/autoscaling.md#the-fleet-simulation).

* **Load.** A cell's escalations are the superposition of its cameras' escalations,
  which for many independent cameras is close to a Poisson process (Palm-Khintchine
  theorem), so cameras are an arrival rate, not objects. The rate per camera follows a
  raised-cosine day (peak at ``peak_hour``, ``trough_ratio`` of the peak twelve hours
  later) with step bursts (``burst_factor`` for ``burst_minutes``, at seeded times).
* **GPU batch time.** YOLOv5x at 640 px: the shape of the batch curve, a fixed part and a
  per-image part, is fitted to Ultralytics' YOLOv5 v7.0 table (V100: 12.1 ms at batch 1,
  4.8 ms per image at batch 32, <https://github.com/ultralytics/yolov5/tree/v7.0#pretrained-checkpoints>),
  so ``t(b) = t1 x (0.623 + 0.377 b)``; its level is the T4 anchor of the design notes, about
  100 images/s at batch 1 (``t1`` = 10 ms). An A10 runs ``a10_speed`` times faster: the ratio of
  the two data sheets' dense FP16 tensor throughput, 125 against 65 TFLOPS
  (<https://www.nvidia.com/en-us/data-center/products/a10-gpu/>,
  <https://www.nvidia.com/en-us/data-center/tesla-t4/>).
* **Network.** Camera site to cloud round trip: log-normal with the given median and p99
  (an assumption), plus a fixed gateway overhead (README: +0.76 ms measured at p50).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import List, Sequence, Tuple

#: YOLOv5 v7.0 table, YOLOv5x: 12.1 ms at batch 1 and 4.8 ms/image at batch 32 (V100):
#: t(b) = a + c b with a + c = 12.1 and a + 32 c = 153.6, so a / t(1) = 0.623.
FIXED_SHARE = (12.1 - (32 * 4.8 - 12.1) / 31) / 12.1


@dataclass(frozen=True)
class Scenario:
    """Everything one simulated day depends on (except the policy under test)."""

    cameras: int = 10_000
    #: the fleet runs as this many independent cells (gateway + worker pool + autoscaler each)
    cells: int = 10
    #: cells simulated request by request; fleet worker-hours scale by cells / sim_cells
    sim_cells: int = 1
    peak_per_camera: float = 0.5       # escalations/s per camera at the busiest hour
    trough_ratio: float = 0.2          # rate at the quietest hour / peak
    peak_hour: float = 18.0
    bursts_per_day: int = 4            # per cell
    burst_factor: float = 1.6
    burst_minutes: float = 10.0
    start_hour: float = 0.0            # the span starts at this hour of the day
    hours: float = 24.0                # simulated span
    warmup_hours: float = 1.0          # simulated before the span, not counted
    tick_s: float = 15.0               # autoscaler period (HPA sync period)
    #: request-level seconds simulated per tick (time sampling); tick_s = every request
    window_s: float = 0.25
    load_poll_s: float = 1.0           # the gateway's Worker.Load poll
    cold_start_s: float = 60.0         # pod scheduled -> serving (node, image, engine, warm-up)
    failures_per_worker_hour: float = 0.02
    t1_ms: float = 10.0                # GPU batch-1 time of a T4 (the ~100 FPS anchor)
    a10_share: float = 0.25            # share of new pods that land on an A10
    a10_speed: float = 125.0 / 65.0
    jitter: float = 0.05               # log-normal sigma of a batch's time
    rtt_median_ms: float = 12.0
    rtt_p99_ms: float = 30.0
    gateway_ms: float = 1.0
    deadline_ms: float = 200.0         # the edge policy's deadline (end-to-end budget)
    slo_ms: float = 80.0               # cloud latency SLO, p99
    max_batch: int = 8                 # worker batching (the shipped defaults)
    max_delay_ms: float = 5.0
    max_queue: int = 64
    min_replicas: int = 1              # per cell
    max_replicas: int = 40             # per cell
    seed: int = 1
    #: (hour of day, duration h) of fixed bursts on top of the seeded ones: by default one
    #: at the daily peak, the worst time for one
    extra_bursts: Tuple[Tuple[float, float], ...] = ((18.0, 1.0 / 6.0),)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = [
            ("cameras", self.cameras >= 1), ("cells", 1 <= self.cells <= self.cameras),
            ("sim_cells", 1 <= self.sim_cells <= self.cells),
            ("peak_per_camera", self.peak_per_camera > 0), ("trough_ratio", 0 < self.trough_ratio <= 1),
            ("bursts_per_day", self.bursts_per_day >= 0), ("burst_factor", self.burst_factor >= 1),
            ("hours", 0 < self.hours <= 24 * 7), ("warmup_hours", 0 <= self.warmup_hours <= 24),
            ("start_hour", 0 <= self.start_hour < 24), ("tick_s", self.tick_s > 0),
            ("window_s", 0 < self.window_s <= self.tick_s), ("cold_start_s", self.cold_start_s >= 0),
            ("failures_per_worker_hour", self.failures_per_worker_hour >= 0),
            ("t1_ms", self.t1_ms > 0), ("a10_share", 0 <= self.a10_share <= 1),
            ("rtt_p99_ms", self.rtt_p99_ms >= self.rtt_median_ms > 0),
            ("deadline_ms", self.deadline_ms > self.slo_ms > 0),
            ("max_batch", self.max_batch >= 1), ("max_queue", self.max_queue >= 1),
            ("min_replicas", 1 <= self.min_replicas <= self.max_replicas),
        ]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"scenario.{name}: out of range ({getattr(self, name)!r})")

    @property
    def cameras_per_cell(self) -> float:
        return self.cameras / self.cells

    @property
    def ticks(self) -> int:
        return int(round(self.hours * 3600.0 / self.tick_s))

    @property
    def warmup_ticks(self) -> int:
        return int(round(self.warmup_hours * 3600.0 / self.tick_s))

    def with_(self, **changes: object) -> Scenario:
        return replace(self, **changes)  # type: ignore[arg-type]


def diurnal(hour: float, s: Scenario) -> float:
    """Escalations/s of one camera at ``hour`` (0-24) without bursts: a raised cosine."""
    phase = 2.0 * math.pi * (hour - s.peak_hour) / 24.0
    return s.peak_per_camera * (s.trough_ratio + (1.0 - s.trough_ratio) * 0.5 * (1.0 + math.cos(phase)))


def bursts(s: Scenario, key: str) -> List[Tuple[float, float]]:
    """(start, end) of a cell's bursts in seconds from the span's start.

    ``bursts_per_day`` start at random hours of each calendar day the span (and its
    warm-up) touches, drawn from a generator seeded by ``key`` and the day, so a shorter
    span sees the same bursts the full day has in it; the scenario's ``extra_bursts``
    (hour of day, duration in hours) come on top.
    """
    out = []
    first = math.floor((s.start_hour - s.warmup_hours) / 24.0)
    for day in range(first, math.ceil((s.start_hour + s.hours) / 24.0)):
        rng = random.Random(f"{key}-day{day}")
        for _ in range(s.bursts_per_day):
            at = (day * 24.0 + 24.0 * rng.random()) * 3600.0
            out.append((at, at + s.burst_minutes * 60.0))
    out += [(h * 3600.0, (h + d) * 3600.0) for h, d in s.extra_bursts]
    zero = s.start_hour * 3600.0
    return sorted((a - zero, b - zero) for a, b in out)


def cell_rate(t_s: float, s: Scenario, cell_bursts: Sequence[Tuple[float, float]]) -> float:
    """Escalations/s offered to one cell ``t_s`` seconds after the span's start (< 0: warm-up)."""
    rate = s.cameras_per_cell * diurnal((s.start_hour + t_s / 3600.0) % 24.0, s)
    if any(a <= t_s < b for a, b in cell_bursts):
        rate *= s.burst_factor
    return rate


def batch_seconds(size: int, speed: float, s: Scenario) -> float:
    """Mean compute time of a batch of ``size`` on a GPU ``speed`` times a T4."""
    return s.t1_ms / 1000.0 * (FIXED_SHARE + (1.0 - FIXED_SHARE) * size) / speed


def rtt_sigma(s: Scenario) -> float:
    """Log-normal sigma that puts the p99 at ``rtt_p99_ms`` (z(0.99) = 2.326)."""
    return math.log(s.rtt_p99_ms / s.rtt_median_ms) / 2.3263478740408408
