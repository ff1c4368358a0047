"""``helm template`` of the chart, shared by the chart tests and the container smoke test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "edgewise"
RELEASE, NAMESPACE = "rel", "ml"


def helm() -> str:
    for cand in (ROOT / ".cache" / "tools" / "helm", shutil.which("helm")):
        if cand and os.path.exists(str(cand)):
            return str(cand)
    pytest.fail("helm is not installed: `make helm` puts it in .cache/tools")
    raise AssertionError


def render(*sets: str, values: Path | None = None) -> List[Dict[str, Any]]:
    """The manifests of release ``rel`` in namespace ``ml`` with ``--set`` values ``sets``."""
    cmd = [helm(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        cmd += ["--set", s]
    if values:
        cmd += ["-f", str(values)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]
