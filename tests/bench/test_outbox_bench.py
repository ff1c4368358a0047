"""bench/outbox.py runs end to end on a few records and prints its two rows (the figures
themselves are measured by the bench and quoted in docs/records.md, not asserted here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_outbox_bench_prints_both_sequences_and_leaves_nothing(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "outbox.py"), "--records", "50", "--repeat", "1",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\| (QoS [12][^|]*) \| ([\d.]+) \| ([\d.]+) \|$", r.stdout, re.M)
    assert [name.split(":")[0].split(" (")[0] for name, _, _ in rows] == ["QoS 1", "QoS 2"], r.stdout
    assert rows[0][2] == "1.00" and float(rows[1][1]) > 0, rows
    assert list(tmp_path.iterdir()) == []
