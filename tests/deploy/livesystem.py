"""The Jetson package's maintainer scripts run by the real ``dpkg`` as on a running device:
``DPKG_ROOT`` empty, ``/run/systemd/system`` present, every path the real one.

That is this machine's ``/`` seen copy-on-write (an overlay of it, in a private mount
namespace, chrooted into), with the files of an optional scratch tree put over it. Whatever a script
writes lands in ``<tmp_path>/upper`` and nothing of this machine changes, but for the
folders of :func:`_shared`, the same inside and out (``tmp_path``: the log the stand-ins
write, the .debs). systemd is
a recording stand-in (:func:`fake_systemd`): a unit it starts records the package version
installed at that moment, the code the daemon then runs.

Needs root and mount namespaces (``unshare -m``, overlayfs), as ``make test`` has; elsewhere
the tests that use it are skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

_CAN_OVERLAY: Optional[str] = None  # "" when an overlay of / mounts here, else why not


def _skip_unless_possible(tmp_path: Path) -> None:
    global _CAN_OVERLAY
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("chroot"):
        pytest.skip("needs root, unshare and chroot (make test runs as root)")
    if _CAN_OVERLAY is None:  # a container's root (itself an overlay, no CAP_SYS_ADMIN) may refuse it
        probe = tmp_path / "overlay-probe"
        dirs = [probe / d for d in ("upper", "work", "merged")]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir=/,upperdir={dirs[0]},workdir={dirs[1]}", str(dirs[2])],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        _CAN_OVERLAY = "" if r.returncode == 0 else (r.stderr.strip() or f"exit status {r.returncode}")
        shutil.rmtree(probe, ignore_errors=True)
    if _CAN_OVERLAY:
        pytest.skip(f"this machine cannot mount an overlay of / in a mount namespace: {_CAN_OVERLAY}")


def fake_systemd(tmp_path: Path) -> Path:
    """A folder of stand-ins for ``deb-systemd-invoke``, ``deb-systemd-helper`` and ``systemctl``. Each call is logged to ``tmp_path/calls.log``;
    a started unit is a file ``tmp_path/units/<unit>`` holding the version of the package
    installed when it started (dpkg's record), removed when it stops."""
    fake, log, units = tmp_path / "fakebin", tmp_path / "calls.log", tmp_path / "units"
    fake.mkdir(exist_ok=True)
    units.mkdir(exist_ok=True)
    started = "{ dpkg-query -W -f='${Version}' edgewise-edge 2>/dev/null || echo none; }"
    tools = {
        "deb-systemd-invoke": f'echo "deb-systemd-invoke $*" >> {log}\naction=$1; shift\nfor u; do case $action in\n'
                              f'  start) [ -e {units}/$u ] || {started} > {units}/$u ;;\n'
                              f'  restart) {started} > {units}/$u ;;\n'
                              f'  stop) rm -f {units}/$u ;;\nesac; done\n',
        "systemctl": f'echo "systemctl $*" >> {log}\n'
                     f'u=${{2%.service}}.service\ncase $1 in is-active) [ -e {units}/$u ] ;; start|stop) exec deb-systemd-invoke $1 $u ;; esac\n',
        "deb-systemd-helper": f'echo "deb-systemd-helper $*" >> {log}\n',
    }
    for name, body in tools.items():
        (fake / name).write_text("#!/bin/sh\n" + body)
        (fake / name).chmod(0o755)
    return fake


def _shared(tmp_path: Path) -> List[str]:
    """Folders the chroot sees as they are, also where they are not on ``/``'s filesystem (a
    tmpfs ``/tmp``): ``tmp_path``, this checkout (the tests' stand-ins run its code) and this
    interpreter's installation."""
    dirs = [str(tmp_path), str(Path(__file__).resolve().parents[2]), os.path.realpath(sys.prefix),
            os.path.realpath(getattr(sys, "base_prefix", sys.prefix))]
    return sorted(set(dirs))


def run_live(tmp_path: Path, script: str, *, top: Optional[Path] = None, fake: Optional[Path] = None,
             env: Optional[Dict[str, str]] = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``sh -c script`` chrooted into this machine's ``/`` as described above, with the
    files of ``top`` copied over it first. The overlay's upper layer persists across calls
    (one device's life)."""
    _skip_unless_possible(tmp_path)
    upper, work, merged = tmp_path / "upper", tmp_path / "work", tmp_path / "merged"
    for d in (upper, work, merged):
        d.mkdir(exist_ok=True)
    if top is not None:  # its files over the device's (as a layer of its own: overlapping layers, ELOOP)
        shutil.copytree(top, upper, symlinks=True, dirs_exist_ok=True)
    fake = fake or fake_systemd(tmp_path)
    path = f"{fake}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    inner = {"PATH": path, "HOME": "/root", "LC_ALL": "C.UTF-8", **(env or {})}
    setup = (
        f"set -e; mount -t overlay overlay -o lowerdir=/,upperdir={upper},workdir={work} {merged}\n"
        f"mount --rbind /dev {merged}/dev; mount -t proc proc {merged}/proc\n"
        f"mkdir -p {merged}/run/systemd/system\n"
        + "".join(f"mkdir -p {merged}{d}; mount --bind {d} {merged}{d}\n" for d in _shared(tmp_path)) +
        f'exec chroot {merged} env -i {" ".join(f"{k}={v}" for k, v in inner.items())} sh -c "$0"\n'
    )
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", setup, script],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
