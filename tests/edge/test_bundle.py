"""The Jetson bundle: a real .deb, rootfs overlay and L4T context, checked with Debian's tools."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from edge import bundle as B
from edgewise.errors import ConfigError, InvalidInputError

ROOT = Path(__file__).resolve().parents[2]


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed; `make test` installs it with apt-get")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("dist")
    opts = B.BundleOptions(out_dir=out, model=tiny_model, power_mode=2, jetson_clocks=True)
    return B.bundle(opts)


def test_deb_info_and_contents(built) -> None:
    assert built.deb.name == "edgewise-edge_0.1.0_arm64.deb"
    info = subprocess.run([_need("dpkg-deb"), "--info", str(built.deb)], capture_output=True, text=True, check=True).stdout
    assert "Package: edgewise-edge" in info and "Architecture: arm64" in info
    assert "python3 (>= 3.8)" in info
    for script in ("preinst", "postinst", "prerm", "postrm", "conffiles", "md5sums"):
        assert script in info
    contents = subprocess.run([_need("dpkg-deb"), "--contents", str(built.deb)], capture_output=True, text=True, check=True).stdout
    for path in ("./lib/systemd/system/edgewise-edge.service", "./etc/edgewise/edge.yaml", "./etc/edgewise/policy.yaml",
                 "./usr/bin/edgewise-edge", "./usr/lib/edgewise-edge/python/edge/pipeline.py",
                 "./usr/lib/edgewise-edge/python/edgewise/runtime/detector.py",
                 "./usr/lib/edgewise-edge/constraints-jetpack51.txt", "./usr/share/edgewise-edge/models/edge.onnx",
                 "./usr/lib/sysusers.d/edgewise-edge.conf", "./etc/default/edgewise-edge-power"):
        assert path in contents, path
    assert "root/root" in contents and "/cloud/" not in contents and "/train/" not in contents and "edgewise_tools" not in contents
    conffiles = subprocess.run([_need("dpkg-deb"), "-f", str(built.deb), "Package"], capture_output=True, text=True).stdout
    assert conffiles.strip() == "edgewise-edge"
    ctl = subprocess.run([_need("dpkg-deb"), "--ctrl-tarfile", str(built.deb)], capture_output=True, check=True).stdout
    import io
    with tarfile.open(fileobj=io.BytesIO(ctl)) as t:
        names = {m.name.lstrip("./"): m for m in t.getmembers()}
        assert t.extractfile(names["conffiles"]).read().decode().split() == ["/etc/default/edgewise-edge-power", "/etc/edgewise/edge.yaml", "/etc/edgewise/policy.yaml"]
        postinst = t.extractfile(names["postinst"]).read().decode()
        assert names["postinst"].mode & 0o111
    assert "systemd-sysusers" in postinst and 'deb-systemd-helper enable "$unit"' in postinst


def test_lintian_has_no_errors(built) -> None:
    out = subprocess.run([_need("lintian"), "--allow-root", "--tag-display-limit", "0", str(built.deb)],
                         capture_output=True, text=True)
    errors = [line for line in out.stdout.splitlines() if line.startswith("E:")]
    assert out.returncode == 0 and not errors, out.stdout + out.stderr


def _extract_with_host_units(deb: Path, dest: Path) -> Path:
    """Unpack the .deb into a root that also has the host's systemd targets and the system
    tools the units run (kill, sh, systemd-sysusers, systemd-tmpfiles)."""
    subprocess.run([_need("dpkg-deb"), "-x", str(deb), str(dest)], check=True)
    units = dest / "lib/systemd/system"
    for host_unit in Path("/lib/systemd/system").glob("*.target"):
        shutil.copy(host_unit, units / host_unit.name)
    for extra in ("systemd-sysusers.service", "systemd-tmpfiles-setup.service"):
        if (Path("/lib/systemd/system") / extra).exists():
            shutil.copy(Path("/lib/systemd/system") / extra, units / extra)
    (dest / "bin").symlink_to("usr/bin")
    for tool in ("/usr/bin/kill", "/usr/bin/sh", "/usr/bin/systemd-sysusers", "/usr/bin/systemd-tmpfiles"):
        shutil.copy(Path(tool).resolve(), dest / "usr/bin" / Path(tool).name)
    return dest


@pytest.mark.parametrize("unit", B.UNITS)
def test_units_verify_cleanly(built, tmp_path, unit: str) -> None:
    root = _extract_with_host_units(built.deb, tmp_path / "root")
    out = subprocess.run([_need("systemd-analyze"), "verify", f"--root={root}", f"/lib/systemd/system/{unit}"],
                         capture_output=True, text=True)
    # verify prints warnings (unknown keys, bad values) without failing: both must be empty.
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def test_main_unit_settings() -> None:
    text = (ROOT / "deploy/jetson/edgewise-edge.service").read_text()
    for line in ("User=edgewise", "Restart=always", "WatchdogSec=30", "After=network-online.target",
                 "Wants=network-online.target", "Type=notify", "MemoryMax=", "LimitNOFILE="):
        assert line in text
    # the engine the daemon loads, built by a command the bundle ships (not edgewise_tools')
    # "-": a failing engine build must not restart-loop; `edge run` exits 2 on the same problem
    assert "ExecStartPre=-/usr/bin/edgewise-edge edge engine --config /etc/edgewise/edge.yaml" in text
    assert "RestartPreventExitStatus=2" in text and "EnvironmentFile=-/etc/default/edgewise-edge" in text


def test_the_stop_timeouts_are_the_one_the_grace_is_bounded_by() -> None:
    """``shutdown_grace_s`` is bounded so a stop ends within ``edge.settings.STOP_TIMEOUT_S``: the unit's
    TimeoutStopSec and the L4T container's ``docker run --stop-timeout`` (both documented commands) must
    be that number, or a stop with the longest grace is SIGKILLed mid-drain. The documented ``docker
    run`` had none: Docker's default 10 s cut short a stop with the default grace and slow sinks."""
    from edge.settings import STOP_TIMEOUT_S

    unit = (ROOT / "deploy/jetson/edgewise-edge.service").read_text()
    assert re.findall(r"^TimeoutStopSec=(\S+)$", unit, re.M) == [str(STOP_TIMEOUT_S)]
    for doc in ("deploy/jetson/README.md", "docs/install-edge.md"):
        runs = re.findall(r"docker run -d [^\n]*", (ROOT / doc).read_text())
        assert runs and all(f"--stop-timeout {STOP_TIMEOUT_S} " in r for r in runs), (doc, runs)


def test_every_group_the_unit_names_is_made_by_sysusers() -> None:
    """systemd refuses to start a unit whose User=, Group= or SupplementaryGroups= names a
    group that does not exist (216/GROUP)."""
    unit = (ROOT / "deploy/jetson/edgewise-edge.service").read_text()
    named = set(re.search(r"^SupplementaryGroups=(.*)$", unit, re.M).group(1).split())
    named |= {re.search(r"^Group=(\S+)$", unit, re.M).group(1)}
    made = set()
    for line in (ROOT / "deploy/jetson/sysusers.conf").read_text().splitlines():
        fields = line.split()
        if fields and fields[0] in ("u", "g"):
            made.add(fields[1])
    assert named <= made, named - made


def test_main_unit_reaches_the_argus_socket_the_shipped_stream_needs() -> None:
    """The shipped edge.yaml's CSI camera (nvarguscamerasrc) talks to the host's nvargus-daemon
    through /tmp/argus_socket: a private /tmp would hide it (unless that socket is bound in)."""
    import configparser

    assert "nvarguscamerasrc" in (ROOT / "deploy/jetson/edge.yaml").read_text()
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "deploy/jetson/edgewise-edge.service")
    service = unit["Service"]
    private_tmp = service.get("PrivateTmp", "no").strip().lower() in ("yes", "true", "1", "on")
    bound = any(p.lstrip("-") == "/tmp/argus_socket" for key in ("BindPaths", "BindReadOnlyPaths")
                for p in service.get(key, "").split())
    assert not private_tmp or bound
    assert "nvargus-daemon.service" in unit["Unit"]["After"]
    for key in ("StateDirectoryMode", "CacheDirectoryMode", "LogsDirectoryMode"):  # as tmpfiles.conf makes them
        assert service[key] == "0750"
    assert "d /var/lib/edgewise 0750" in (ROOT / "deploy/jetson/tmpfiles.conf").read_text()


FAKES = ("systemd-sysusers", "adduser", "systemd-tmpfiles", "chown", "chmod", "deb-systemd-helper",
         "deb-systemd-invoke", "systemctl")


def _postinst_root(tmp_path: Path) -> tuple:
    """A scratch root for postinst whose system tools only log their arguments; ``edgewise-edge``
    there is this checkout's CLI and ``runuser`` runs it as is. ``env`` installs into it as an
    image (DPKG_ROOT, dpkg --root); :func:`_on_device` runs postinst with it as the device's
    own root. Its ``run/systemd/system`` is there, as where an image's /run is bind-mounted."""
    root, fake, log = tmp_path / "root", tmp_path / "fakebin", tmp_path / "calls.log"
    for d in ("etc/edgewise", "usr/bin", "usr/lib/edgewise-edge", "run/systemd/system", "var/lib/edgewise"):
        (root / d).mkdir(parents=True)
    shutil.copy(ROOT / "deploy/jetson/edge.yaml", root / "etc/edgewise/edge.yaml")
    shutil.copy(B.DEFAULT_POLICY, root / "etc/edgewise/policy.yaml")
    fake.mkdir()
    for tool in FAKES:
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
    (fake / "runuser").write_text(f'#!/bin/sh\necho "runuser $*" >> {log}\nshift 3\nexec "$@"\n')
    (root / "usr/lib/edgewise-edge/setup.sh").write_text(f'#!/bin/sh\necho "setup.sh $*" >> {log}\n')
    (root / "usr/bin/edgewise-edge").write_text(
        f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m edgewise "$@"\n')
    for f in list(fake.iterdir()) + [root / "usr/lib/edgewise-edge/setup.sh", root / "usr/bin/edgewise-edge"]:
        f.chmod(0o755)
    env = {"DPKG_ROOT": str(root), "PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return root, env, log


def _on_device(tmp_path: Path, root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    """postinst ``args`` as dpkg runs it on a running device whose files are ``root``'s
    (tests/deploy/livesystem.py: DPKG_ROOT empty, /run/systemd/system there)."""
    from tests.deploy.livesystem import run_live

    return run_live(tmp_path, " ".join(["sh", str(ROOT / "deploy/jetson/debian/postinst"), *args]), top=root,
                    fake=Path(env["PATH"].split(":")[0]), timeout=120)


def test_postinst_installs_but_starts_only_a_configured_daemon(tmp_path, tiny_model) -> None:
    import yaml

    root, env, log = _postinst_root(tmp_path)
    first = _on_device(tmp_path, root, env, "configure")
    calls = log.read_text()
    assert first.returncode == 0, first.stderr
    for unit in B.UNITS:
        assert f"deb-systemd-helper enable {unit}" in calls
    assert "setup.sh" in calls and "runuser -u edgewise --" in calls
    assert "deb-systemd-invoke restart" not in calls  # the shipped file names a placeholder gateway
    conf = "/etc/edgewise/edge.yaml"
    assert re.search(rf"installed, not started: {re.escape(conf)}:\d+: cloud\.endpoints\[0\]: "
                     r"'edgewise-gateway\.example\.com:50051' is a placeholder", first.stderr), first.stderr
    assert "then: sudo systemctl start edgewise-edge" in first.stderr

    tree = yaml.safe_load((root / "etc/edgewise/edge.yaml").read_text())  # the operator's edit
    tree["cloud"]["endpoints"] = ["gw.plant.lan:50051"]
    tree["model"].update(path=str(tiny_model), backend="onnxruntime")
    (root / "etc/edgewise/edge.yaml").write_text(yaml.safe_dump(tree))
    again = _on_device(tmp_path, root, env, "configure")
    assert again.returncode == 0 and "not started" not in again.stderr, again.stderr
    assert "deb-systemd-invoke restart edgewise-edge.service" in log.read_text()


def test_postinst_checks_with_the_units_environment_file_and_needs_a_ready_venv(tmp_path) -> None:
    root, env, log = _postinst_root(tmp_path)
    (root / "etc/default").mkdir()
    (root / "etc/default/edgewise-edge").write_text("# token\nEDGEWISE_EDGE__CLOUD__TOKEN=tok-1\n")
    (root / "usr/bin/edgewise-edge").write_text(
        '#!/bin/sh\necho "edgewise: error: token=$EDGEWISE_EDGE__CLOUD__TOKEN" >&2\nexit 2\n')
    out = _on_device(tmp_path, root, env, "configure")
    assert out.returncode == 0 and "installed, not started: token=tok-1" in out.stderr, out.stderr

    # setup.sh could not give the environment this version's pins: no check, no (re)start
    (root / "usr/lib/edgewise-edge/setup.sh").write_text("#!/bin/sh\nexit 1\n")
    (root / "usr/bin/edgewise-edge").write_text("#!/bin/sh\nexit 0\n")
    out = _on_device(tmp_path, root, env, "configure")
    assert out.returncode == 0 and "installed, not started: its Python environment" in out.stderr, out.stderr
    assert "deb-systemd-invoke restart" not in log.read_text()


def test_postinst_leaves_a_deleted_conffile_deleted(tmp_path) -> None:
    """A conffile the operator deleted (the policy kept elsewhere) is not brought back by dpkg;
    postinst's chown of it failed every configure, so the package stayed half-configured and
    apt blocked (found by a probe of the package's lifecycle)."""
    root, env, log = _postinst_root(tmp_path)
    fake_chown = Path(env["PATH"].split(":")[0]) / "chown"
    fake_chown.write_text(f'#!/bin/sh\necho "chown $*" >> {log}\n'
                          'for a; do case $a in /*) [ -e "$a" ] || { echo "chown: $a: missing" >&2; exit 1; } ;; '
                          'esac; done\n')
    (root / "etc/edgewise/policy.yaml").unlink()
    out = _on_device(tmp_path, root, env, "configure")
    assert out.returncode == 0, out.stderr
    assert "chown root:edgewise /etc/edgewise/edge.yaml" in log.read_text()
    assert not (root / "etc/edgewise/policy.yaml").exists()


def test_postinst_into_an_image_root_leaves_this_machine_alone(tmp_path) -> None:
    """``dpkg --root=IMAGE --force-script-chrootless`` (no systemd runs there): the user went
    into this machine's /etc/passwd, the folders into its /var, the files were given its
    group's id, and the venv was built with its python3 and architecture (found by a probe).
    Only systemd-sysusers runs, on the image; the rest is its first boot's. Also where the
    image's /run holds systemd's folder (a bind-mounted /run, as mmdebstrap and chroot setups
    make): that took the running-system path, on this machine's systemd (found by a probe)."""
    root, env, log = _postinst_root(tmp_path)
    assert (root / "run/systemd/system").is_dir()
    out = subprocess.run(["sh", str(ROOT / "deploy/jetson/debian/postinst"), "configure"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    assert f"systemd-sysusers --root={root} edgewise-edge.conf" in calls
    for tool in ("adduser", "systemd-tmpfiles", "chown", "chmod", "setup.sh", "runuser", "deb-systemd-invoke",
                 "systemctl"):
        assert not any(c.startswith(tool + " ") for c in calls), (tool, calls)
    assert "built at its first boot" in out.stdout


def test_postinst_into_an_image_root_enables_the_units_without_a_dpkg_root_aware_helper(tmp_path) -> None:
    """deb-systemd-helper reads DPKG_ROOT from init-system-helpers 1.63 on; Ubuntu 20.04 (1.57)
    and 22.04 (1.62), the hosts L4T R35 images are built on, enable nothing in the image, and a
    device flashed from it never started the daemon (found by a probe with dpkg --root). The
    fake helper here logs only, as those do for the image; the links are the overlay's. An
    upgrade (configure with the old version) leaves a unit the image's maker disabled alone."""
    root, env, log = _postinst_root(tmp_path)
    postinst = str(ROOT / "deploy/jetson/debian/postinst")
    out = subprocess.run(["sh", postinst, "configure"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert sorted(p.name for p in wants.iterdir()) == sorted(B.UNITS)
    for unit in B.UNITS:
        assert os.readlink(wants / unit) == f"/lib/systemd/system/{unit}", unit
    (wants / "edgewise-edge-power.service").unlink()  # systemctl --root=IMAGE disable edgewise-edge-power
    out = subprocess.run(["sh", postinst, "configure", "0.1.0"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in wants.iterdir()) == sorted(set(B.UNITS) - {"edgewise-edge-power.service"})


def test_dpkg_root_with_systemds_folder_leaves_this_machine_alone(built, tmp_path) -> None:
    """``dpkg --root=IMAGE --force-script-chrootless`` where ``IMAGE/run/systemd/system`` exists
    (its /run bind-mounted from this machine, as chroot and image builders do): the scripts
    took that for a running device and ran this machine's systemctl daemon-reload,
    deb-systemd-invoke restart/stop, adduser, systemd-tmpfiles and runuser (found by a probe).
    DPKG_ROOT is decided on first: install, reinstall (an upgrade), remove and purge by the
    real dpkg call none of them; systemd-sysusers only with --root."""
    root, fake, log = tmp_path / "root", tmp_path / "fakebin", tmp_path / "calls.log"
    for d in ("var/lib/dpkg/updates", "var/lib/dpkg/info", "run/systemd/system"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text("")
    fake.mkdir()
    host_tools = ("systemctl", "deb-systemd-invoke", "runuser", "adduser", "systemd-tmpfiles", "chown", "python3")
    for tool in host_tools + ("systemd-sysusers", "deb-systemd-helper"):
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        (fake / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:/usr/sbin:/usr/bin:/sbin:/bin")
    dpkg = [_need("dpkg"), f"--root={root}", "--force-script-chrootless", "--force-architecture",
            "--force-depends", "--log=/dev/null"]
    for action in (["-i", str(built.deb)], ["-i", str(built.deb)], ["-r", "edgewise-edge"], ["-P", "edgewise-edge"]):
        out = subprocess.run(dpkg + action, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                             timeout=120)
        assert out.returncode == 0, (action, out.stderr)
    calls = log.read_text().splitlines()
    assert f"systemd-sysusers --root={root} edgewise-edge.conf" in calls
    touched = [c for c in calls if c.split()[0] in host_tools or c == "systemd-sysusers" or
               (c.startswith("systemd-sysusers ") and "--root=" not in c)]
    assert touched == [], touched


def test_overlay_paths_and_modes(built) -> None:
    with tarfile.open(built.overlay) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert all(m.uid == 0 and m.gid == 0 for m in members.values())
    wants = "etc/systemd/system/multi-user.target.wants/edgewise-edge.service"
    assert members[wants].issym() and members[wants].linkname == "/lib/systemd/system/edgewise-edge.service"
    assert stat.S_IMODE(members["usr/bin/edgewise-edge"].mode) == 0o755
    assert stat.S_IMODE(members["usr/lib/edgewise-edge/setup.sh"].mode) == 0o755
    assert stat.S_IMODE(members["lib/systemd/system/edgewise-edge.service"].mode) == 0o644
    assert stat.S_IMODE(members["etc/edgewise/edge.yaml"].mode) == 0o644
    assert "usr/lib/tmpfiles.d/edgewise-edge.conf" in members
    assert not any(n.startswith("/") or ".." in n.split("/") for n in members)


def test_overlay_carries_only_package_folders_with_fixed_modes_and_times(tmp_path, tiny_model, monkeypatch) -> None:
    """Built under a group-writable umask: the rootfs's own folders (/etc, /usr, /lib...) are
    not in the overlay (unpacking it must not change their modes or times: an /usr older than
    /etc/.updated skips systemd-sysusers at first boot); folders 0755, files 0644/0755, every
    time stamp SOURCE_DATE_EPOCH; the .deb's folders are 0755 too."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    old = os.umask(0o002)
    try:
        built = B.bundle(B.BundleOptions(out_dir=tmp_path / "dist", model=tiny_model, power_mode=2))
    finally:
        os.umask(old)
    with tarfile.open(built.overlay) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    dirs = {m.name for m in members if m.isdir()}
    for system in ("etc", "usr", "lib", "usr/bin", "usr/lib", "etc/default", "etc/systemd/system", "usr/share/doc",
                   "lib/systemd/system", "usr/lib/sysusers.d"):
        assert system not in dirs, system
    assert {"etc/edgewise", "usr/lib/edgewise-edge", "usr/lib/edgewise-edge/python/edge", "usr/share/edgewise-edge",
            "usr/share/doc/edgewise-edge"} <= dirs
    assert all(any(d == o or d.startswith(o + "/") for o in B.OWNED_DIRS) for d in dirs), dirs
    assert {stat.S_IMODE(m.mode) for m in members if m.isdir()} == {0o755}
    assert {stat.S_IMODE(m.mode) for m in members if m.isfile()} == {0o644, 0o755}
    assert {m.mtime for m in members} == {1767225600}
    with open(built.overlay, "rb") as raw:
        assert int.from_bytes(raw.read(8)[4:8], "little") == 1767225600  # the gzip header's time
    for path in ("usr/bin/edgewise-edge", "etc/default/edgewise-edge-power", "usr/lib/tmpfiles.d/edgewise-edge.conf"):
        assert path in names  # files under system folders are still there
    contents = subprocess.run([_need("dpkg-deb"), "--contents", str(built.deb)], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    modes = {line.split()[0] for line in contents}
    assert modes <= {"drwxr-xr-x", "-rw-r--r--", "-rwxr-xr-x"}, modes


def test_container_context(built) -> None:
    dockerfile = (built.container / "Dockerfile").read_text()
    assert "l4t-tensorrt:r8.5.2" in dockerfile and "--runtime nvidia" in dockerfile
    assert "USER edgewise" in dockerfile
    for copied in ("root/usr/lib/edgewise-edge/python", "root/usr/bin/edgewise-edge", "root/etc/edgewise"):
        assert copied in dockerfile and (built.container / copied).exists()
    # the venv layer depends on the pins and the wheels only: the model is copied after it, so a
    # bundle rebuilt with another model reuses it; every shared file is in one of the two
    copies = re.findall(r"^COPY (\S+)", dockerfile, flags=re.M)
    setup = dockerfile.index("RUN /usr/lib/edgewise-edge/setup.sh")
    wheels, models = "root/usr/share/edgewise-edge/wheels", "root/usr/share/edgewise-edge/models"
    assert dockerfile.index(f"COPY {wheels} ") < setup < dockerfile.index(f"COPY {models} ")
    assert (built.container / wheels).is_dir() and (built.container / models / "edge.onnx").is_file()
    shared = [p.relative_to(built.container).as_posix() for p in (built.container / "root/usr/share/edgewise-edge")
              .rglob("*") if p.is_file()]
    assert shared and all(any(f.startswith(c + "/") for c in copies) for f in shared), (shared, copies)


def test_container_entry_point_runs_the_daemon_or_the_command_given(built, tmp_path) -> None:
    """Arguments after the image name were silently ignored (they became the shell's $0...):
    ``docker run IMAGE edge check-config`` started the daemon (found by a probe)."""
    import json

    line = next(ln for ln in (built.container / "Dockerfile").read_text().splitlines() if ln.startswith("ENTRYPOINT"))
    entry = json.loads(line[len("ENTRYPOINT"):])
    log = tmp_path / "calls"
    fake = tmp_path / "edgewise-edge"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    entry = [part.replace("/usr/bin/edgewise-edge", str(fake)) for part in entry]
    subprocess.run(entry, check=True, timeout=30)
    assert log.read_text().splitlines() == ["edge engine --config /etc/edgewise/edge.yaml",
                                            "edge run --config /etc/edgewise/edge.yaml"]
    log.unlink()
    subprocess.run(entry + ["edge", "check-config", "--config", "/x y.yaml"], check=True, timeout=30)
    assert log.read_text().splitlines() == ["edge check-config --config /x y.yaml"]


def test_packaged_code_is_python38(built, tmp_path) -> None:
    root = tmp_path / "x"
    subprocess.run([_need("dpkg-deb"), "-x", str(built.deb), str(root)], check=True)
    py = root / "usr/lib/edgewise-edge/python"
    vermin = str(Path(sys.executable).parent / "vermin")
    out = subprocess.run([vermin, "-q", "--no-tips", "--violations", "-t=3.8-", "--backport", "dataclasses",
                          "--backport", "typing", "--exclude-regex", r".*/v1/.*", str(py)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout
    # The packaged tree is importable on its own (no cloud/ or torch needed).
    check = subprocess.run([sys.executable, "-c", "import edge.pipeline, edgewise.runtime, edgewise.policy"],
                           cwd=py, capture_output=True, text=True, env={"PYTHONPATH": str(py), "PATH": "/usr/bin"})
    assert check.returncode == 0, check.stderr


def test_shipped_configs_are_valid(built, tmp_path) -> None:
    from edge.settings import load_settings
    from edgewise.policy import load_policy
    from edgewise.runtime.metadata import load_model_info

    with pytest.raises(ConfigError, match=r"edge\.yaml:\d+: cloud\.endpoints\[0\]: .* is a placeholder"):
        load_settings(str(ROOT / "deploy/jetson/edge.yaml"), env={})
    settings = load_settings(str(ROOT / "deploy/jetson/edge.yaml"), overrides=["cloud.endpoints.0=gw.lan:50051"],
                             env={})
    assert settings.device_id == ""  # this Jetson's serial number, never one id for every device
    assert settings.model.backend == "tensorrt"
    assert settings.policy_file == "/etc/edgewise/policy.yaml"
    policy = load_policy(str(B.DEFAULT_POLICY))
    # check-config of a fresh install warned that the shipped policy's stream override (gate-cam)
    # is no stream of the shipped edge.yaml (csi0): a warning every operator learned to ignore
    names = load_model_info(str(B.DEFAULT_MODEL)).names
    assert policy.fit_warnings(names, str(B.DEFAULT_MODEL), [st.id for st in settings.streams]) == []


@pytest.mark.parametrize("kwargs,message", [
    ({"target": "nano"}, "--target 'nano' is not supported"),
    ({"jetpack": "4.6"}, "--jetpack '4.6' is not supported"),
    ({"model": Path("/nonexistent.onnx")}, "--model /nonexistent.onnx: file not found"),
    ({"power_mode": 12}, "--power-mode 12"),
    ({"version": "1:0.1.0"}, "--version '1:0.1.0': not a Debian version of a native package"),
    ({"version": "0.1.0-2"}, "--version '0.1.0-2': not a Debian version"),
    ({"version": "v2"}, "--version 'v2'"),
])
def test_bad_options(tmp_path, tiny_model, kwargs, message) -> None:
    opts = B.BundleOptions(out_dir=tmp_path, model=tiny_model)
    for k, v in kwargs.items():
        setattr(opts, k, v)
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(")):
        B.bundle(opts)


def test_a_policy_the_daemon_would_refuse_is_not_shipped(tmp_path, tiny_model) -> None:
    """``--policy`` shipped any file (a README, a policy of another kind) as the device's
    /etc/edgewise/policy.yaml, which its daemon then refused at the first start. A learnedModel
    is not read: it may exist on the device only."""
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(B.DEFAULT_POLICY.read_text().replace("kind: EscalationPolicy", "kind: Nope"))
    with pytest.raises(InvalidInputError, match=rf"{wrong}:\d+: kind: 'Nope' is not allowed"):
        B.check_options(B.BundleOptions(out_dir=tmp_path / "dist", model=tiny_model, policy=wrong))
    assert not (tmp_path / "dist").exists()
    on_device = tmp_path / "on-device.yaml"
    text = B.DEFAULT_POLICY.read_text()
    assert "  signals:\n" in text
    on_device.write_text(text.replace("  signals:\n", "  signals:\n    learnedModel: /var/lib/edgewise/gain.json\n", 1))
    B.check_options(B.BundleOptions(out_dir=tmp_path / "dist", model=tiny_model, policy=on_device))


def test_an_output_that_is_a_file_is_refused_before_anything_is_built(tmp_path, tiny_model, capsys) -> None:
    """-o naming a file was a FileExistsError traceback from mkdir (after the options were checked)."""
    from edgewise.cli import main

    out = tmp_path / "dist"
    out.write_text("not a folder")
    assert main(["edge", "bundle", "-o", str(out), "--model", str(tiny_model)]) == 2
    assert capsys.readouterr().err == f"edgewise: error: -o {out}: is a file; give a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist"] and out.read_text() == "not a folder"


def test_a_model_the_device_cannot_load_is_refused(tmp_path, tiny_model) -> None:
    import onnx

    model = onnx.load(str(tiny_model))
    model.opset_import.add(domain="ai.onnx.ml", version=5)  # what ONNX Runtime's newer quantizer writes
    onnx.save(model, str(tmp_path / "newer.onnx"))
    with pytest.raises(InvalidInputError, match=r"--model .*newer.onnx \(model.backend tensorrt in .*\): imports ai.onnx.ml opset 5, newer than "
                                                r"JetPack 5.1's .* drop the import \(`edgewise model quantize` drops"):
        B.bundle(B.BundleOptions(out_dir=tmp_path / "dist", model=tmp_path / "newer.onnx"))
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_the_shipped_models_load_on_the_device() -> None:
    """The bundle's default model builds on TensorRT; the INT8 models in ONNX Runtime's CPU layout
    (the demo's, the evaluations') load on the device's ONNX Runtime only."""
    from edgewise.runtime.metadata import load_model_info
    from edgewise.runtime.opsets import model_problems

    assert B.DEFAULT_MODEL.name == "edge-int8-trt.onnx"
    assert model_problems(load_model_info(B.DEFAULT_MODEL)) == []
    for path in (ROOT / "models" / "camera" / "edge-int8.onnx", ROOT / "models" / "edge-int8.onnx"):
        info = load_model_info(path)
        assert model_problems(info, tensorrt=False) == [], path
        assert model_problems(info) != [], path


def test_a_model_tensorrt_cannot_build_is_refused_unless_the_shipped_settings_run_onnx_runtime(tmp_path) -> None:
    """The bundle shipped `models/camera/edge-int8.onnx` (uint8 activations, int32 biases) with
    `model.backend: tensorrt`: the device's engine build failed (found by a probe). Such a model
    is refused, saying what to do, unless the edge.yaml shipped with it runs ONNX Runtime."""
    cpu_layout = ROOT / "models" / "camera" / "edge-int8.onnx"
    with pytest.raises(InvalidInputError, match=r"--model .*edge-int8.onnx \(model.backend tensorrt in .*edge.yaml\): "
                                                r"its QuantizeLinear/DequantizeLinear nodes use uint8 .*--target tensorrt"):
        B.check_options(B.BundleOptions(out_dir=tmp_path / "dist", model=cpu_layout))
    on_cpu = tmp_path / "edge.yaml"
    on_cpu.write_text((B.JETSON / "edge.yaml").read_text().replace("backend: tensorrt", "backend: onnxruntime"))
    assert B.shipped_backend(on_cpu) == "onnxruntime"
    B.check_options(B.BundleOptions(out_dir=tmp_path / "dist", model=cpu_layout, edge_config=on_cpu))
    on_cpu.write_text("model: {path: /m.onnx}\n")
    assert B.shipped_backend(on_cpu) == "auto"  # the default runs TensorRT where it can


def test_cli(tmp_path, tiny_model) -> None:
    from edgewise.cli import main

    assert main(["edge", "bundle", "--target", "xavier-nx", "--jetpack", "5.1", "-o", str(tmp_path),
                 "--model", str(tiny_model)]) == 0
    assert (tmp_path / "edgewise-edge_0.1.0_arm64.deb").exists()
    assert main(["edge", "bundle", "--jetpack", "6.0", "-o", str(tmp_path), "--model", str(tiny_model)]) == 2
    # a rebuild (another model, edge.yaml or policy) under a version dpkg installs over the release
    assert main(["edge", "bundle", "-o", str(tmp_path), "--model", str(tiny_model), "--version", "0.1.0+site1"]) == 0
    deb = tmp_path / "edgewise-edge_0.1.0+site1_arm64.deb"
    fields = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True)
    assert fields.stdout.strip() == "0.1.0+site1"
    newer = subprocess.run(["dpkg", "--compare-versions", "0.1.0+site1", "gt", "0.1.0"])
    assert newer.returncode == 0


@pytest.mark.parametrize("location", ["mine.onnx.data", "weights/mine.onnx.data"])
def test_cli_from_another_directory_with_relative_paths(tmp_path, tiny_model, monkeypatch, location) -> None:
    """Every path on the command line is the caller's (issue 22); a model whose weights are
    in an external ``.data`` file (torch's dynamo exporter) ships with that file, at the same
    place beside it (a file in a subfolder was flattened, and the model then did not load)."""
    import onnx

    from edgewise.cli import main

    (tmp_path / "cfg" / "weights").mkdir(parents=True)
    model = onnx.load(str(tiny_model))
    onnx.save_model(model, str(tmp_path / "cfg" / "mine.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=location, size_threshold=0)
    shutil.copy(ROOT / "deploy/jetson/edge.yaml", tmp_path / "cfg" / "edge.yaml")
    shutil.copy(ROOT / "examples/policy.yaml", tmp_path / "cfg" / "policy.yaml")
    monkeypatch.chdir(tmp_path)
    assert main(["edge", "bundle", "-o", "dist", "--model", "cfg/mine.onnx", "--edge-config", "cfg/edge.yaml",
                 "--policy", "cfg/policy.yaml"]) == 0
    deb = tmp_path / "dist" / "edgewise-edge_0.1.0_arm64.deb"
    contents = subprocess.run([_need("dpkg-deb"), "--contents", str(deb)], capture_output=True, text=True,
                              check=True).stdout
    assert "./usr/share/edgewise-edge/models/edge.onnx" in contents
    assert f"./usr/share/edgewise-edge/models/{location}" in contents


def test_a_models_sidecar_yaml_goes_with_it(tmp_path, tiny_model) -> None:
    """Class names kept in <model>.yaml (no names in the ONNX file) reached the device as
    classes 0..nc-1: the bundle renames the model to edge.onnx and left the sidecar behind."""
    import onnx

    from edgewise.runtime.metadata import load_model_info

    src = tmp_path / "mine"
    src.mkdir()
    m = onnx.load(str(tiny_model))
    nc = load_model_info(tiny_model).nc
    del m.metadata_props[:]  # names only in the sidecar
    onnx.save(m, str(src / "detector.onnx"))
    names = [f"part-{i}" for i in range(nc)]
    (src / "detector.yaml").write_text("names: [" + ", ".join(names) + "]\nstride: 32\n")
    root = tmp_path / "root"
    B.stage_tree(B.BundleOptions(out_dir=tmp_path / "dist", model=src / "detector.onnx"), root)
    shipped = root / B.SHARE / "models/edge.onnx"
    assert (root / B.SHARE / "models/edge.yaml").read_text() == (src / "detector.yaml").read_text()
    info = load_model_info(shipped)
    assert list(info.names) == names and info.names_source != "default"


def test_a_rebuild_without_power_settings_takes_them_off_the_device(tmp_path, tiny_model) -> None:
    """A bundle built with --power-mode/--jetson-clocks, then one without: the power file was
    shipped by the first only, so dpkg kept it on the device as an obsolete conffile and
    edgewise-edge-power.service went on applying mode 2 and jetson_clocks at every boot (found
    by a probe upgrading a scratch root with dpkg). Every build ships it; without the options
    it sets nothing."""
    root, fake = tmp_path / "root", tmp_path / "fakebin"
    (root / "var/lib/dpkg/updates").mkdir(parents=True)
    (root / "var/lib/dpkg/info").mkdir()
    (root / "var/lib/dpkg/status").write_text("")
    fake.mkdir()
    for tool in ("systemd-sysusers", "deb-systemd-helper"):  # the image's user and units: not this test's
        (fake / tool).write_text("#!/bin/sh\nexit 0\n")
        (fake / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:/usr/sbin:/usr/bin:/sbin:/bin")
    power = root / "etc/default/edgewise-edge-power"
    for version, kwargs in (("0.1.0+p1", {"power_mode": 2, "jetson_clocks": True}), ("0.1.0+p2", {})):
        built = B.bundle(B.BundleOptions(out_dir=tmp_path / version, model=tiny_model, version=version, **kwargs))
        subprocess.run([_need("dpkg"), f"--root={root}", "--force-script-chrootless", "--force-architecture",
                        "--force-depends", "--log=/dev/null", "-i", str(built.deb)], env=env, check=True,
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
        if kwargs:
            assert "NVPMODEL_MODE=2" in power.read_text() and "JETSON_CLOCKS=1" in power.read_text()
    status = (root / "var/lib/dpkg/status").read_text()
    assert "edgewise-edge-power" in status and " obsolete" not in status, status
    values = subprocess.run(["sh", "-c", '. "$1"; echo "mode=$NVPMODEL_MODE clocks=$JETSON_CLOCKS"', "sh", str(power)],
                            capture_output=True, text=True, check=True).stdout
    assert values.strip() == "mode= clocks=0"  # the unit's ExecStart then runs neither nvpmodel nor jetson_clocks


def test_the_flash_guide_names_what_the_overlay_cannot_depend_on() -> None:
    """The rootfs overlay has no Depends: a device flashed from it without python3-venv or
    JetPack's TensorRT and OpenCV (apply_binaries.sh installs neither) never started the daemon,
    and the guide said only that the wheels needed network (found by a probe comparing the
    .deb's control file with the flash guide). Every such Depends of the .deb is named there."""
    text = (B.JETSON / "README.md").read_text()
    flash = text[text.index("## Flash devices that boot into the daemon"):]
    flash = flash[:flash.index("\n## ", 1)]
    control = B._control(B.BundleOptions(out_dir=Path("unused")), B.JETSON)
    for dep in B.DEVICE_DEPENDS:
        assert dep in control
        name = dep.split()[0]
        assert f"`{name}`" in flash, name


def test_an_interrupted_rebuild_leaves_the_last_whole_bundle_and_no_parts(tmp_path, tiny_model) -> None:
    """Ctrl-C (a real SIGINT, to dpkg-deb too, as a terminal sends it) while `edge bundle` packs
    the .deb left a truncated .deb under its final name (7 kB of 2 MB, replacing the whole one of
    the same version) beside the .root and .tree work folders. Now the whole bundle of the run
    before stays as it was, and no work folder or part is left."""
    import signal
    import time

    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "edgewise.cli", "edge", "bundle", "-o", str(out), "--model", str(tiny_model)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    deb = next(out.glob("*.deb"))
    whole = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not any(out.glob("*.root")):
            time.sleep(0.005)
        time.sleep(0.2)  # into the packing
        os.killpg(proc.pid, signal.SIGINT)  # the process group, as Ctrl-C in a terminal
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == whole
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["edgewise-edge-l4t"]
    assert deb.stat().st_size > 100_000
