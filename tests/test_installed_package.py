"""The package as a user gets it: the wheel, unpacked outside this checkout and run from elsewhere.

Users ``pip install`` the wheel and run ``edgewise`` from their own folders, where nothing of
the checkout (``models/``, ``examples/``, ``deploy/``) exists. The wheel is built from a copy of
the package sources (no network, no build isolation) and unpacked, which for a pure-Python wheel
is what pip installs; its code runs with this venv's dependencies, ahead of the editable install
on ``sys.path``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
_CLI = "import sys; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """site-packages holding only the unpacked wheel of this checkout's package sources."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist, site = base / "src", base / "dist", base / "site"
    for package in ("edgewise", "edgewise_tools", "edge", "cloud"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    dist.mkdir()
    built = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_wheel({str(dist)!r})"],
                           cwd=src, capture_output=True, text=True)
    assert built.returncode == 0, ("building the wheel needs pyproject's build backend in this venv (the dev extra "
                                   "has it: setuptools>=77)\n" + built.stderr[-2000:])
    (wheel,) = dist.glob("edgewise-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    yield site


def _edgewise(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEWISE_")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-c", _CLI, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_installed_package_runs_from_another_folder(installed: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(installed))
    where = subprocess.run([sys.executable, "-c", "import edgewise, edge, edgewise_tools; print(edgewise.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stdout  # not the checkout
    assert _edgewise(installed, tmp_path, "--version").returncode == 0
    policy = tmp_path / "policy.yaml"
    shutil.copy(ROOT / "examples" / "policy.yaml", policy)
    checked = _edgewise(installed, tmp_path, "edge", "check-policy", str(policy))
    assert checked.returncode == 0, checked.stderr


def _error(proc: subprocess.CompletedProcess[str]) -> str:
    lines: List[str] = [ln for ln in proc.stderr.splitlines() if ln.startswith("edgewise: error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    return lines[0]


def test_demo_from_the_installed_package_says_what_to_pass(installed: Path, tmp_path: Path) -> None:
    """The demo's defaults are the checkout's models and policy: from a wheel it said
    ``.../site-packages/models/camera/edge-int8.onnx not found (the reference models ship in
    models/...)``, and with both models given, the same of ``site-packages/examples/policy.yaml``."""
    error = _error(_edgewise(installed, tmp_path, "demo"))
    assert "installed package" in error and "source checkout" in error, error
    assert "--edge-model, --cloud-model and --policy" in error, error
    models = ("--edge-model", str(ROOT / "models/camera/edge-int8.onnx"),
              "--cloud-model", str(ROOT / "models/camera/cloud.onnx"))
    error = _error(_edgewise(installed, tmp_path, "demo", *models))
    assert error.startswith("edgewise: error: demo --policy: its default examples/policy.yaml"), error


def test_bundle_from_the_installed_package_says_it_needs_a_checkout(installed: Path, tmp_path: Path) -> None:
    """``edge bundle`` packs deploy/jetson/ of a checkout; from a wheel it first said ``--model
    .../site-packages/models/camera/edge-int8-trt.onnx: file not found``, then, with --model and
    --policy given, the same of --edge-config, before its own "run it from a source checkout"."""
    error = _error(_edgewise(installed, tmp_path, "edge", "bundle", "-o", str(tmp_path / "dist")))
    assert "deploy/jetson is missing" in error and "installed package" in error, error
    assert "checkout of the edgewise repository" in error, error


def test_one_version_for_the_package_the_cli_and_the_chart(installed: Path) -> None:
    """pyproject.toml keeps its own copy of the version (the image's dependency layer is built from
    it alone, without ``edgewise/``), and nothing held the copies equal: a release that bumped one
    would install a package whose ``edgewise --version``, Jetson bundle and image tag disagree
    with ``pip show edgewise`` and the chart."""
    import edgewise

    (meta,) = installed.glob("edgewise-*.dist-info/METADATA")
    version = next(ln.split(": ", 1)[1] for ln in meta.read_text().splitlines() if ln.startswith("Version: "))
    chart = (ROOT / "charts" / "edgewise" / "Chart.yaml").read_text()
    assert version == edgewise.__version__
    assert f'appVersion: "{version}"' in chart  # the image tag the chart deploys (edgewise_tools.images)
