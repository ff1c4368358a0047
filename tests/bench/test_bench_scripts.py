"""Every benchmark script starts as the README runs it (``python bench/<name>.py``), also with
the checkout on ``PYTHONPATH``, as the test runs and a developer's shell have it: Python puts
``bench/`` first on ``sys.path`` for a script, where ``bench/edge.py`` took the name of the
``edge`` package, and ``bench/edge.py``, ``outbox.py``, ``spool.py`` and ``runtime.py``'s last
table failed with "'edge' is not a package". ``--help`` imports what each needs at its top."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: scripts without options (they run at once): checked by their own tests
NO_HELP = {"payload_mix.py"}
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("[a-z]*.py") if p.name not in NO_HELP)


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("pythonpath", [True, False], ids=["PYTHONPATH", "plain"])
def test_each_bench_script_starts(script: str, pythonpath: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True,
                       env=env, cwd=str(ROOT), timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]
