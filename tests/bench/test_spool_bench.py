"""bench/spool.py runs end to end on a small spool and prints its table (the figures
themselves are the README's, measured by the bench, not asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_spool_bench_prints_a_row_per_size(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "spool.py"), "--sizes", "1,2", "--repeat", "1",
                        "--calls", "3", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if re.match(r"\| \d+ MiB \(\d+ items", line)]
    assert [row.split()[1] for row in rows] == ["1", "2"], r.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 9 and all(re.match(r"[\d.]+", c) for c in cells[1:]), row
    assert list(tmp_path.iterdir()) == []  # its files are removed
