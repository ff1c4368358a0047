"""The Jetson package's shell side, run for real against scratch roots (``DPKG_ROOT``):
``setup.sh`` (the venv, rebuilt when the pins change), the maintainer scripts, and the
``/usr/bin/edgewise-edge`` wrapper."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edge import bundle as B
from tests.processes import DEFAULT_HUP

pytestmark = pytest.mark.timeout(600)


def _wheel(dest: Path, version: str) -> Path:
    """A pure-Python wheel of ``demo-pin`` (module ``demo_pin`` with ``VERSION``)."""
    files = {
        "demo_pin.py": f"VERSION = {version!r}\n",
        f"demo_pin-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: demo-pin\nVersion: {version}\n",
        f"demo_pin-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n",
    }
    record = f"demo_pin-{version}.dist-info/RECORD"
    lines = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(text.encode())}")
    files[record] = "\n".join(lines + [f"{record},,"]) + "\n"
    path = dest / f"demo_pin-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


@pytest.fixture
def setup_root(tmp_path: Path):
    """A root with the package's setup.sh, pins naming one package (``demo-pin``) and a
    wheelhouse holding 1.0 and 2.0 of it; ``python3`` on PATH is this interpreter."""
    root = tmp_path / "root"
    lib = root / B.LIB
    wheels = root / B.SHARE / "wheels"
    lib.mkdir(parents=True)
    wheels.mkdir(parents=True)
    shutil.copy(B.JETSON / "setup.sh", lib / "setup.sh")
    (lib / "requirements.txt").write_text("demo-pin\n")
    (lib / "constraints-jetpack51.txt").write_text("demo-pin==1.0\n")
    for version in ("1.0", "2.0"):
        _wheel(wheels, version)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {"DPKG_ROOT": str(root), "PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(lib / "setup.sh"), *args], env=env, capture_output=True, text=True,
                              timeout=300)

    return root, lib, run


def _installed(lib: Path) -> str:
    out = subprocess.run([str(lib / "venv/bin/python3"), "-c", "import demo_pin; print(demo_pin.VERSION)"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_setup_rebuilds_the_venv_when_the_pins_change_and_keeps_it_when_a_build_fails(setup_root) -> None:
    root, lib, run = setup_root
    first = run()
    assert first.returncode == 0, first.stderr
    assert _installed(lib) == "1.0"
    marker = lib / "venv/.complete"
    stamp = marker.read_text()
    assert len(stamp.strip()) == 64  # sha256 of the pins and python3's version

    again = run()  # nothing changed (every boot, every configure): nothing done, nothing said
    assert again.returncode == 0 and again.stdout == "" and again.stderr == "", again.stdout + again.stderr
    assert marker.read_text() == stamp

    (lib / "constraints-jetpack51.txt").write_text("demo-pin==2.0\n")  # an upgrade with new pins
    upgrade = run()
    assert upgrade.returncode == 0, upgrade.stderr
    assert "built from other pins" in upgrade.stdout
    assert _installed(lib) == "2.0" and marker.read_text() != stamp
    assert not (lib / "venv.new").exists() and not (lib / "venv.old").exists()
    scripts = [p for p in (lib / "venv/bin").iterdir() if p.is_file() and not p.is_symlink()]
    assert scripts and not any("venv.new" in p.read_text(errors="replace") for p in scripts)

    (lib / "constraints-jetpack51.txt").write_text("demo-pin==3.0\n")  # no wheel of it: pip fails
    failed = run()
    assert failed.returncode == 1 and "the current environment is left as it was" in failed.stderr
    assert _installed(lib) == "2.0" and not (lib / "venv.new").exists()
    assert (lib / ".setup-failed").exists()  # the wrapper's `edge run` refuses the old pins from now on
    (lib / "constraints-jetpack51.txt").write_text("demo-pin==2.0\n")
    assert run().stdout == ""  # back to the pins the environment holds: current again
    assert not (lib / ".setup-failed").exists()


def test_a_failed_forced_rebuild_keeps_the_current_environment_usable(setup_root) -> None:
    """``setup.sh --force`` (what a model whose ONNX Runtime is missing says to run) that fails
    (no network, a wheel gone) left the failure note beside an environment holding exactly
    these pins, so the wrapper's ``edge run`` refused to start (exit 2, no restarts) at the
    daemon's next restart, until the next boot (found by a probe in a real chroot install)."""
    root, lib, run = setup_root
    assert run().returncode == 0 and _installed(lib) == "1.0"
    (root / B.SHARE / "wheels/demo_pin-1.0-py3-none-any.whl").unlink()
    failed = run("--force")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "which holds these pins, is left as it was" in failed.stderr, failed.stderr
    assert "the previous pins" not in failed.stderr
    assert not (lib / ".setup-failed").exists()  # edge run still starts on it
    assert _installed(lib) == "1.0" and not (lib / "venv.new").exists()
    assert run().stdout == "" and not (lib / ".setup-failed").exists()


def test_a_swap_cut_short_is_finished_by_the_next_run(setup_root) -> None:
    """A power loss between the swap's two renames (the old venv moved to venv.old, the new not
    yet at venv) left no venv: the next run, the setup unit's at boot, saw no stamp, deleted
    the complete venv.new and rebuilt, which without network failed with "there is no
    environment yet" while both environments lay on disk, so the daemon never started again
    (found by a probe). setup.sh is killed (SIGKILL) there by a stand-in ``mv``; the next run
    puts the new environment in place, offline."""
    root, lib, run = setup_root
    assert run().returncode == 0 and _installed(lib) == "1.0"
    (lib / "constraints-jetpack51.txt").write_text("demo-pin==2.0\n")  # an upgrade with new pins
    fake_mv = root.parent / "bin" / "mv"  # on setup.sh's PATH, before /usr/bin
    fake_mv.write_text('#!/bin/sh\ncase "$1 $2" in *venv.new\\ *venv) kill -KILL $PPID; exit 1 ;; esac\n'
                       'exec /bin/mv "$@"\n')
    fake_mv.chmod(0o755)
    killed = run()
    assert killed.returncode == -9, killed
    assert not (lib / "venv").exists() and (lib / "venv.old").is_dir() and (lib / "venv.new/.complete").is_file()
    fake_mv.unlink()
    shutil.rmtree(root / B.SHARE / "wheels")  # no wheels, no network: nothing could be rebuilt
    again = run()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "(a swap cut short): put " in again.stdout and "building" not in again.stdout, again.stdout
    assert _installed(lib) == "2.0"
    assert not (lib / "venv.new").exists() and not (lib / "venv.old").exists()  # 190 MB on a device
    assert not (lib / ".setup-failed").exists()
    scripts = [p for p in (lib / "venv/bin").iterdir() if p.is_file() and not p.is_symlink()]
    assert scripts and not any("venv.new" in p.read_text(errors="replace") for p in scripts)
    assert run().stdout == ""  # current: nothing more to do


def test_setup_names_what_installs_a_missing_opencv(setup_root) -> None:
    """setup.sh's check of JetPack's modules in the new venv said ``cv2 not importable (No module
    named 'cv2')``, naming no package (found with a CPython 3.8 venv of the device's pins)."""
    base = getattr(sys, "_base_executable", sys.executable)  # what the venv's system site-packages are
    if subprocess.run([base, "-c", "import cv2"], capture_output=True).returncode == 0:
        pytest.skip(f"{base} has cv2: nothing is missing")
    root, lib, run = setup_root
    shutil.copytree(B.REPO / "edgewise", lib / "python/edgewise")
    out = run()
    assert out.returncode == 0, out.stderr  # the venv is right: the daemon then says the same and stops
    assert "edgewise-edge: OpenCV's Python module (cv2) is not installed: on a Jetson it comes with JetPack: " \
           "sudo apt-get install libopencv-python" in out.stdout, out.stdout
    assert "cv2 not importable" not in out.stdout


def test_the_setup_unit_leaves_the_decision_to_setup_sh() -> None:
    unit = (B.JETSON / "edgewise-edge-setup.service").read_text()
    assert "ConditionPathExists" not in unit and "ExecStart=/usr/lib/edgewise-edge/setup.sh" in unit
    # its own user and folders: systemd-sysusers.service skips a rootfs booted before (ConditionNeedsUpdate)
    assert "ExecStartPre=-/bin/systemd-sysusers edgewise-edge.conf" in unit
    assert "ExecStartPre=-/bin/systemd-tmpfiles --create edgewise-edge.conf" in unit
    postinst = (B.JETSON / "debian/postinst").read_text()
    assert "if ! /usr/lib/edgewise-edge/setup.sh; then" in postinst  # every configure, upgrades included


FAKES = ("deb-systemd-helper", "deb-systemd-invoke", "systemctl")


def _scratch_root(tmp_path: Path) -> tuple:
    root, fake, log = tmp_path / "root", tmp_path / "fakebin", tmp_path / "calls.log"
    for d in ("usr/lib/edgewise-edge/venv/bin", "usr/lib/edgewise-edge/python/edge/__pycache__",
              "var/lib/edgewise", "var/cache/edgewise/engines", "var/log/edgewise"):
        (root / d).mkdir(parents=True)
    (root / "usr/lib/edgewise-edge/python/edge/__pycache__/x.cpython-38.pyc").write_bytes(b"\0")
    fake.mkdir()
    for tool in FAKES:
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        (fake / tool).chmod(0o755)
    env = {"DPKG_ROOT": str(root), "PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return root, env


def test_maintainer_scripts_touch_only_dpkg_root(tmp_path: Path) -> None:
    # every path the removal scripts touch is under $ROOT (checked first: a script that is not
    # would delete this machine's folders below)
    for script in ("prerm", "postrm"):
        text = (B.JETSON / "debian" / script).read_text()
        assert 'ROOT="${DPKG_ROOT:-}"' in text, script
        for line in text.splitlines():
            if line.strip().startswith(("rm ", "rmdir ", "find ")):
                assert "$ROOT/" in line or "$LIB" in line, f"{script}: {line}"
    root, env = _scratch_root(tmp_path)
    prerm = subprocess.run(["sh", str(B.JETSON / "debian/prerm"), "remove"], env=env, capture_output=True, text=True)
    assert prerm.returncode == 0, prerm.stderr
    assert not (root / "usr/lib/edgewise-edge/python/edge/__pycache__").exists()  # dpkg can remove the folders
    (root / "etc/edgewise/tls").mkdir(parents=True)  # what `edge provision` wrote
    (root / "etc/edgewise/tls/client.key").write_text("key")
    (root / "etc/default").mkdir()
    (root / "etc/default/edgewise-edge").write_text("EDGEWISE_EDGE__CLOUD__TOKEN=tok-1\n")
    purge = subprocess.run(["sh", str(B.JETSON / "debian/postrm"), "purge"], env=env, capture_output=True, text=True)
    assert purge.returncode == 0, purge.stderr
    for gone in ("usr/lib/edgewise-edge/venv", "var/lib/edgewise", "var/cache/edgewise", "var/log/edgewise",
                 "etc/default/edgewise-edge", "etc/edgewise"):  # the token and the client key too
        assert not (root / gone).exists(), gone


def _wrapper_tree(tmp_path: Path, python3: str) -> tuple[Path, Path]:
    """(root, venv bin) of the package's wrapper installed under ``tmp_path/root``, its
    interpreter a shell script ``python3``."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    venv_bin = root / "usr/lib/edgewise-edge/venv/bin"
    venv_bin.mkdir(parents=True)
    shutil.copy(B.JETSON / "edgewise-edge.sh", root / "usr/bin/edgewise-edge")
    (root / "usr/bin/edgewise-edge").chmod(0o755)
    (venv_bin / "python3").write_text(python3)
    (venv_bin / "python3").chmod(0o755)
    return root, venv_bin


def test_the_wrapper_runs_its_own_tree_and_writes_no_byte_code(tmp_path: Path) -> None:
    root, venv_bin = _wrapper_tree(tmp_path, '#!/bin/sh\necho "python=$0"\necho "path=$PYTHONPATH"\n'
                                             'echo "nobytecode=$PYTHONDONTWRITEBYTECODE"\necho "args=$*"\n'
                                             + _PRINT_HUP.split("\n", 1)[1])
    (tmp_path / "elsewhere").symlink_to(root / "usr/bin/edgewise-edge")  # found through a link too
    for argv0 in (str(root / "usr/bin/edgewise-edge"), str(tmp_path / "elsewhere")):
        out = subprocess.run([*DEFAULT_HUP, argv0, "edge", "check-config"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"}, check=True).stdout.splitlines()
        assert out == [f"python={venv_bin}/python3", f"path={root}/usr/lib/edgewise-edge/python",
                       "nobytecode=1", "args=-m edgewise edge check-config", "hup_ignored=0"], out


def test_the_wrapper_starts_only_the_daemon_with_sighup_ignored(tmp_path: Path) -> None:
    """A SIGHUP (a reload) before Python holds it (edgewise/hangup.py) must not end the daemon's
    start; every other command keeps the default, so a closed terminal still ends it."""
    root, _ = _wrapper_tree(tmp_path, _PRINT_HUP)
    for args, ignored in ((["edge", "run", "--config", "x"], "1"), (["--log-level", "debug", "edge", "run"], "1"),
                          (["edge", "check-config"], "0"), (["edge", "engine"], "0")):
        out = subprocess.run([*DEFAULT_HUP, str(root / "usr/bin/edgewise-edge"), *args], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"}, check=True).stdout
        assert out.strip() == f"hup_ignored={ignored}", (args, out)


def test_the_wrapper_does_not_start_the_daemon_on_pins_setup_could_not_install(tmp_path: Path) -> None:
    """An upgrade whose environment build failed left the daemon running; its next restart
    (a crash, the watchdog) ran the new sources on the old pins (found by a probe of the
    package's lifecycle). setup.sh's failure note stops ``edge run`` with exit status 2 (no
    restarts) and what to do; other commands still run."""
    root, _ = _wrapper_tree(tmp_path, '#!/bin/sh\necho ran\n')
    wrapper = str(root / "usr/bin/edgewise-edge")
    (root / "usr/lib/edgewise-edge/.setup-failed").write_text("")
    refused = subprocess.run([wrapper, "edge", "run", "--config", "x"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert "does not hold this version's pins" in refused.stderr and "sudo " in refused.stderr
    other = subprocess.run([wrapper, "edge", "check-config"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"})
    assert other.returncode == 0 and other.stdout == "ran\n"


def test_the_wrapper_says_the_environment_is_not_built(tmp_path: Path) -> None:
    """A fresh install whose setup.sh failed (no network, no bundled wheels) has no venv: the
    next steps the package prints (``edge provision``, ``edge check-config``) ended in the
    shell's ``exec: .../venv/bin/python3: not found``, exit 127 (found by a probe installing
    the .deb into a chroot without the wheels)."""
    root, venv_bin = _wrapper_tree(tmp_path, '#!/bin/sh\necho ran\n')
    (venv_bin / "python3").unlink()
    lib = root / "usr/lib/edgewise-edge"
    for args in (["edge", "provision", "--root", "/"], ["edge", "check-config"], ["edge", "run"]):
        out = subprocess.run([str(root / "usr/bin/edgewise-edge"), *args], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
        assert out.returncode == 2 and out.stdout == "", (args, out)
        assert f"{lib}/venv, the package's Python environment, is not built" in out.stderr, out.stderr
        assert f"run sudo {lib}/setup.sh" in out.stderr and "not found" not in out.stderr, out.stderr


# the HUP bit of the shell's ignored-signal mask (Linux /proc), as the exec'd interpreter inherits it
_PRINT_HUP = '#!/bin/sh\necho "hup_ignored=$(( 0x$(awk \'/^SigIgn/{print $2}\' /proc/$$/status) & 1 ))"\n'
