"""The Jetson .deb installed, upgraded and removed by the real ``dpkg`` as on a running device
(``tests/deploy/livesystem.py``): which daemon runs on which files afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edge import bundle as B
from tests.deploy.livesystem import run_live

pytestmark = pytest.mark.timeout(600)

DPKG = "dpkg --force-architecture --force-depends --force-confdef --force-confold --log=/dev/null"
UNIT = "edgewise-edge.service"

# The Python environment setup.sh would build, as current: its stamp (the pins and python3's
# version, by setup.sh's own program, its ``python3 - ... <<'PY'``) and this interpreter, which has
# the daemon's packages.
PIN_STAMP = (B.JETSON / "setup.sh").read_text().split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
SEED_VENV = f"""set -e
LIB=/usr/lib/edgewise-edge
mkdir -p $LIB/venv/bin
printf '#!/bin/sh\nexec %s "$@"\n' {sys.executable} > $LIB/venv/bin/python3
chmod 0755 $LIB/venv/bin/python3
for d in $(python3 -c 'import os, sys; p = os.path.realpath(sys.argv[1])
while p != "/": p = os.path.dirname(p); print(p)' {sys.executable}); do chmod o+x "$d"; done  # runuser -u edgewise
python3 - {B.JETSON}/requirements.txt {B.JETSON}/constraints-jetpack51.txt > $LIB/venv/.complete <<'PY'
{PIN_STAMP}
PY
"""

# The operator's settings: a real gateway, ONNX Runtime (no TensorRT here); PLACEHOLDER puts
# back the shipped endpoint, which every version's check refuses.
CONFIGURE = """set -e
sed -i -e 's/edgewise-gateway.example.com/gw.plant.lan/' -e 's/backend: tensorrt/backend: onnxruntime/' \
  /etc/edgewise/edge.yaml
"""
PLACEHOLDER = "sed -i 's/gw.plant.lan/edgewise-gateway.example.com/' /etc/edgewise/edge.yaml\n"


@pytest.fixture(scope="module")
def debs(tmp_path_factory, tiny_model) -> dict:
    out = tmp_path_factory.mktemp("debs")
    return {v: B.bundle(B.BundleOptions(out_dir=out / v, model=tiny_model, version=v)).deb
            for v in ("0.1.0+u1", "0.1.0+u2", "0.1.0+u3")}


def _running(tmp_path: Path) -> str:
    unit = tmp_path / "units" / UNIT
    return unit.read_text().strip() if unit.exists() else "stopped"


def test_an_upgrade_whose_check_fails_leaves_no_old_daemon_on_the_new_files(tmp_path, debs) -> None:
    """The old daemon was left running through an upgrade (prerm stopped it on remove only, as
    dh_installsystemd's default does, relying on postinst's restart): when the new version's
    ``edge check-config`` refused the settings, postinst did not restart it, and the old
    version's process went on with the new version's files under it (its next lazy import,
    and the venv setup.sh swaps), with nothing said. Now the daemon is stopped before dpkg
    unpacks and started only on a passing check; otherwise it stays stopped, and the operator
    is told so and what to do."""
    v1, v2, v3 = (str(debs[v]) for v in ("0.1.0+u1", "0.1.0+u2", "0.1.0+u3"))
    first = run_live(tmp_path, SEED_VENV + f"{DPKG} -i {v1}\n" + CONFIGURE + "systemctl start edgewise-edge\n")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "installed, not started" in first.stderr  # the shipped placeholder
    assert _running(tmp_path) == "0.1.0+u1"

    # a passing check: the new version runs
    up = run_live(tmp_path, f"{DPKG} -i {v2}\n")
    assert up.returncode == 0 and "not started" not in up.stderr, up.stdout + up.stderr
    assert _running(tmp_path) == "0.1.0+u2"

    # settings the new version refuses (here the placeholder put back while the daemon ran)
    down = run_live(tmp_path, PLACEHOLDER + f"{DPKG} -i {v3}\n")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _running(tmp_path) == "stopped", down.stderr  # not 0.1.0+u2 on 0.1.0+u3's files
    assert "upgraded from 0.1.0+u2, not started (the daemon was stopped for the upgrade and stays stopped): " \
           "/etc/edgewise/edge.yaml:23: cloud.endpoints[0]: 'edgewise-gateway.example.com:50051' is a placeholder" \
        in down.stderr, down.stderr
    assert "then: sudo systemctl start edgewise-edge" in down.stderr
    calls = (tmp_path / "calls.log").read_text()
    assert calls.count(f"deb-systemd-invoke stop {UNIT}") == 2, calls  # before each unpack

    fixed = run_live(tmp_path, CONFIGURE + "systemctl start edgewise-edge\n")  # what the message says
    assert fixed.returncode == 0 and _running(tmp_path) == "0.1.0+u3"
    removed = run_live(tmp_path, f"{DPKG} -r edgewise-edge\n")
    assert removed.returncode == 0 and _running(tmp_path) == "stopped", removed.stderr
