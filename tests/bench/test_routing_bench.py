"""bench/routing.py runs end to end, short: its real workers (the worker server with a padded
runner), the gateway as shipped, the load table and the transient-slow-worker scenario. (Its
padded runner had fallen behind ``ModelRunner.run``'s signature and every worker failed its
warm-up, unnoticed until the bench was run by hand.) The figures are the README's, measured by
the bench, not asserted here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_routing_bench_runs_the_shipped_gateway_and_the_slow_worker(tiny_model):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "routing.py"), "--quick", "--modes", "default",
                        "--loads", "0.5", "--duration", "2", "--model", str(tiny_model)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shipped = "**gateway as shipped (defaults), weights 4:2:1**"
    load = [line for line in r.stdout.splitlines() if line.startswith(f"| {shipped} | 50% |")]
    assert len(load) == 1, r.stdout
    cells = [c.strip() for c in load[0].strip("|").split("|")]
    assert float(cells[2]) > 0 and all(re.fullmatch(r"[\d.]+", c) for c in cells[3:6]), load
    slow = [line for line in r.stdout.splitlines() if line.startswith(f"| {shipped} | ") and "%" in line.split("|")[2]
            and "success" not in line and line.count("|") == 6]
    assert len(slow) == 1 and re.search(r"\| [\d.]+% \|", slow[0]), r.stdout
