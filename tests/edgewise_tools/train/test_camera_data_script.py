"""scripts/camera_data.sh: a split already in the run folder is reused only when it is the one asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "camera_data.sh"


def _data(run: Path, scale: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, "SCALE": str(scale)}
    return subprocess.run(["bash", str(SCRIPT), str(run), "cam-val"], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_smoke_tests_split_is_not_taken_for_a_full_runs(tmp_path: Path) -> None:
    """A smoke test (SCALE=40) and then a larger run in the same RUN_DIR: the split's dataset.json
    existed, so the larger run kept the smoke test's single stream (and the stages trained on it)
    without a word. It is refused with what to do; the same SCALE again reuses it."""
    run = tmp_path / "run"
    first = _data(run, 40)
    assert first.returncode == 0, first.stderr
    meta = run / "data" / "cam-val" / "dataset.json"
    assert json.loads(meta.read_text())["streams"] == 1
    mtime = meta.stat().st_mtime_ns
    bigger = _data(run, 10)
    assert bigger.returncode == 2
    assert f"{run}/data/cam-val holds 1 streams, but SCALE=10 asks for 2" in bigger.stderr
    assert "use another RUN_DIR" in bigger.stderr
    again = _data(run, 40)
    assert again.returncode == 0, again.stderr
    assert meta.stat().st_mtime_ns == mtime  # the same split: kept, not generated again
