"""`edgewise/` and `edge/` run on the Jetson's Python 3.8 (JetPack 5.1): checked mechanically.

Two independent checkers: ruff with target py38 (incl. the FA rules that catch
PEP 604/585 annotations without ``from __future__ import annotations``) and
vermin, which reports any construct or stdlib API that needs Python >= 3.9.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TARGETS = ["edgewise", "edge"]


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; `make test` installs it in .venv")
    return found


def test_ruff_py38_target() -> None:
    proc = subprocess.run(
        [_tool("ruff"), "check", "--target-version", "py38", "--select", "FA,E9,F", *TARGETS],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vermin_py38() -> None:
    proc = subprocess.run(
        [_tool("vermin"), "-q", "--no-tips", "--violations", "-t=3.8-",
         "--backport", "dataclasses", "--backport", "typing",
         "--exclude-regex", r"edgewise/v1/.*", *TARGETS],
        cwd=ROOT, capture_output=True, text=True,
    )
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 0 and not out, out


def test_generated_stubs_are_py38_syntax() -> None:
    # The stubs are excluded from vermin (generated), so check they at least compile
    # with 3.8 grammar via ruff's parser target.
    proc = subprocess.run(
        [_tool("ruff"), "check", "--no-respect-gitignore", "--isolated", "--target-version", "py38",
         "--select", "E9", "edgewise/v1"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
