"""The Jetson lane of ``make test``: the edge bundle's Python set, checked on a CI machine.

A Jetson Xavier NX with JetPack 5.1 runs the daemon on CPython 3.8 (aarch64) in the venv
that ``deploy/jetson/setup.sh`` makes from ``requirements.txt`` + ``constraints-jetpack51.txt``.
No aarch64 machine is needed to check most of that:

1. **resolve** - ``pip download`` of those two files for JetPack 5.1's platform (CPython 3.8,
   manylinux2014/manylinux_2_17 aarch64), the resolution the .deb's postinst, the first-boot
   unit, the L4T build and the offline ``--wheels`` recipe run; the wheelhouse it fills must
   pass ``edgewise edge bundle --wheels``' own check;
2. **venv** - the real ``setup.sh``, run against a scratch root (``DPKG_ROOT``) with a real
   CPython 3.8 as ``python3`` and an x86_64 wheelhouse of the same pins, so its offline path
   (``--no-index``, as on a first boot without network) builds the venv; then the stand-in
   for JetPack's OpenCV 4.5.4 (``ci-lane-requirements.txt``). Test tools go to a separate
   ``--target`` folder, so the venv holds exactly what a device gets;
3. **device tests** - the ``edgewise/`` and ``edge/`` suites that apply to a device, run by
   that interpreter (``tests/deploy/test_jetson_lane.py`` adds the bundled tree's entry
   point and a short ``edge run`` against a real gateway).

Everything but the resolution is cached under ``.cache/jetson-lane/<digest>/``, keyed by the
pin files, ``setup.sh``, the test tools and the interpreter, so a rerun costs the resolution
(seconds) and the tests. ``python -m edgewise_tools.jetson_lane`` runs steps 1-3 and prints
their times. CPython 3.8 is looked up in ``$EDGEWISE_PYTHON38``, ``python3.8`` on ``PATH``
and ``$(pyenv root)/versions/3.8.*``; without one the lane fails saying how to get it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from edge.bundle import DOWNLOAD_ARGS, check_wheelhouse

ROOT = Path(__file__).resolve().parents[1]
JETSON = ROOT / "deploy" / "jetson"
CACHE = ROOT / ".cache" / "jetson-lane"
REQUIREMENTS = JETSON / "requirements.txt"
CONSTRAINTS = JETSON / "constraints-jetpack51.txt"
STANDINS = JETSON / "ci-lane-requirements.txt"
#: test tools for CPython 3.8 (the last releases that support it), outside the device venv;
#: onnx builds the tests' synthetic graphs (never imported by the device code)
TEST_TOOLS = ("pytest==8.3.5", "pytest-timeout==2.3.1", "hypothesis==6.113.0")
TEST_NODEPS = ("onnx==1.17.0",)
#: what of tests/edgewise and tests/edge does not apply to a device, and why
DEVICE_TESTS = ("tests/edgewise", "tests/edge")
NOT_DEVICE = (
    "tests/edgewise/synth",  # training data generator (edgewise_tools' side of edgewise.synth)
    "tests/edge/test_bundle.py",  # builds packages with dpkg/lintian on the build host
    "tests/edge/sources/test_rtsp.py",  # a GStreamer RTSP server for a minute; live sources' own suite
)
#: the device's pip download arguments (edge.bundle.DOWNLOAD_ARGS) for this x86-64 host
X86_ARGS = tuple(a.replace("aarch64", "x86_64") for a in DOWNLOAD_ARGS)


class LaneError(RuntimeError):
    """A step of the lane failed; the message says which and why."""


def _run(argv: Sequence[str], what: str, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
         timeout: float = 900) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    if proc.returncode != 0:
        raise LaneError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
    return proc.stdout


def _pyenv_root() -> Path:
    env = os.environ.get("PYENV_ROOT")
    if env:
        return Path(env)
    exe = shutil.which("pyenv")
    if exe:
        try:
            return Path(subprocess.run([exe, "root"], capture_output=True, text=True, timeout=30).stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return Path.home() / ".pyenv"


def find_python38() -> Path:
    """A CPython 3.8 interpreter, or ``LaneError`` saying how to get one."""
    cands: List[str] = []
    if os.environ.get("EDGEWISE_PYTHON38"):
        cands.append(os.environ["EDGEWISE_PYTHON38"])
    if shutil.which("python3.8"):
        cands.append(str(shutil.which("python3.8")))
    cands += sorted(glob.glob(str(_pyenv_root() / "versions" / "3.8.*" / "bin" / "python3.8")), reverse=True)
    for c in cands:
        try:
            out = subprocess.run([c, "-c", "import platform, sys; print(platform.python_implementation(), "
                                  "'%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.split() == ["CPython", "3.8"]:
            return Path(c)
    raise LaneError(
        "the Jetson lane needs a CPython 3.8 (JetPack 5.1's Python) and found none (looked at "
        "$EDGEWISE_PYTHON38, python3.8 on PATH, $(pyenv root)/versions/3.8.*): install one with "
        "`pyenv install 3.8.18` (CI machines have it), or set EDGEWISE_PYTHON38=/path/to/python3.8")


def digest(python: Path) -> str:
    """Key of the cached venv: everything that decides what it holds."""
    h = hashlib.sha256()
    for f in (REQUIREMENTS, CONSTRAINTS, STANDINS, JETSON / "setup.sh"):
        h.update(f.read_bytes())
    h.update(" ".join(TEST_TOOLS + TEST_NODEPS).encode())
    h.update(_run([str(python), "-c", "import sys; print(sys.version)"], "python3.8 --version").encode())
    return h.hexdigest()[:16]


def resolve_aarch64(dest: Path) -> List[str]:
    """``pip download`` the bundle's set for JetPack 5.1 into ``dest``; the wheel names."""
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", *DOWNLOAD_ARGS,
          "-r", str(REQUIREMENTS), "-c", str(CONSTRAINTS), "-d", str(dest)],
         "the aarch64/cp38 resolution of deploy/jetson/requirements.txt + constraints-jetpack51.txt")
    check_wheelhouse(dest)
    return sorted(p.name for p in dest.glob("*.whl"))


class Lane:
    """The cached CPython 3.8 device venv (built on first use) and how to run in it."""

    def __init__(self, python: Optional[Path] = None, cache: Path = CACHE) -> None:
        self.python38 = python or find_python38()
        self.dir = cache / digest(self.python38)
        self.root = self.dir / "root"  # DPKG_ROOT of setup.sh
        self.venv = self.root / "usr/lib/edgewise-edge/venv"
        self.python = self.venv / "bin" / "python"
        self.testlibs = self.dir / "testlibs"
        self.built = False

    def ensure(self) -> Lane:
        if (self.dir / ".complete").is_file():
            return self
        if self.dir.exists():
            shutil.rmtree(self.dir)
        for old in self.dir.parent.glob("*"):  # earlier pin sets
            if old.is_dir() and old != self.dir:
                shutil.rmtree(old, ignore_errors=True)
        wheels = self.root / "usr/share/edgewise-edge/wheels"
        _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", *X86_ARGS,
              "-r", str(REQUIREMENTS), "-r", str(STANDINS), "-c", str(CONSTRAINTS), "-d", str(wheels)],
             "downloading the x86_64 cp38 wheels of the pinned set")
        lib = self.root / "usr/lib/edgewise-edge"
        lib.mkdir(parents=True, exist_ok=True)
        for f in (REQUIREMENTS, CONSTRAINTS, JETSON / "setup.sh"):
            shutil.copy(f, lib / f.name)
        bindir = self.dir / "bin"
        bindir.mkdir()
        (bindir / "python3").symlink_to(self.python38)
        env = dict(os.environ, DPKG_ROOT=str(self.root), PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        _run(["sh", str(lib / "setup.sh")], "deploy/jetson/setup.sh (offline, from the wheelhouse)", env=env)
        pip = [str(self.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", str(CONSTRAINTS)]
        _run(pip + ["--no-index", "--find-links", str(wheels), "-r", str(STANDINS)],
             "installing the stand-in for JetPack's OpenCV")
        _run(pip + ["--target", str(self.testlibs), *TEST_TOOLS], "installing the test tools")
        _run(pip + ["--target", str(self.testlibs), "--no-deps", *TEST_NODEPS], "installing onnx for the tests")
        (self.dir / ".complete").write_text(_run([str(self.python), "-m", "pip", "freeze"], "pip freeze"))
        self.built = True
        return self

    def env(self, *paths: Path) -> Dict[str, str]:
        """Environment for the device interpreter with ``paths`` first on its module path."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
        return env

    def freeze(self) -> str:
        return (self.dir / ".complete").read_text()

    def device_view(self) -> Path:
        """The checkout as a device sees it: ``edgewise`` and ``edge`` (plus the tests), no
        ``cloud`` or ``edgewise_tools`` on the module path."""
        view = self.dir / "view"
        view.mkdir(exist_ok=True)
        for name in ("edgewise", "edge", "tests", "pyproject.toml"):
            link = view / name
            if link.is_symlink() and os.readlink(link) != str(ROOT / name):
                link.unlink()  # a cache made by another checkout: point it at this one
            if not link.is_symlink():
                link.symlink_to(ROOT / name)
        return view

    def run_device_tests(self, extra: Sequence[str] = ()) -> subprocess.CompletedProcess:
        view = self.device_view()
        argv = [str(self.python), "-m", "pytest", "-q", *DEVICE_TESTS,
                *(f"--ignore={p}" for p in NOT_DEVICE), *extra]
        return subprocess.run(argv, cwd=view, env=self.env(view, self.testlibs), capture_output=True,
                              text=True, timeout=1800)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--resolve-only", action="store_true", help="only the aarch64 resolution (step 1)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        wheels = resolve_aarch64(CACHE / "wheels-aarch64")
        print(f"resolve: {len(wheels)} aarch64/cp38 wheels for JetPack 5.1 ({time.monotonic() - t0:.0f} s)")
        if args.resolve_only:
            return 0
        t1 = time.monotonic()
        lane = Lane().ensure()
        print(f"venv: {lane.venv} ({'built' if lane.built else 'cached'}, {time.monotonic() - t1:.0f} s)")
        t2 = time.monotonic()
        proc = lane.run_device_tests()
        print(proc.stdout[-3000:] + proc.stderr[-2000:])
        print(f"device tests under {lane.python38}: exit {proc.returncode} ({time.monotonic() - t2:.0f} s)")
        return proc.returncode
    except LaneError as exc:
        print(f"jetson lane: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
