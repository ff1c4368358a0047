"""`edgewise edge bundle`: the Jetson edge bundle (.deb, rootfs overlay, L4T container).

Builds, from a source checkout, everything an operator needs to put the edge daemon
on a Jetson Xavier NX with JetPack 5.1 (Python 3.8, TensorRT 8.5):

* ``edgewise-edge_<version>_arm64.deb``: the code for Python 3.8, a constraints file
  pinned to JetPack 5.1, the systemd units (daemon, first-boot setup, optional power
  mode), sysusers/tmpfiles snippets, ``/etc/edgewise/{edge,policy}.yaml`` as conffiles
  and maintainer scripts that create the user and state directories and enable the unit;
* ``edgewise-edge_<version>_rootfs-overlay.tar.gz``: the same tree plus the
  ``multi-user.target.wants`` links, to unpack into ``Linux_for_Tegra/rootfs`` before
  ``flash.sh`` so a freshly flashed device boots into the daemon (user and state
  directories come from systemd-sysusers/tmpfiles at first boot);
* ``edgewise-edge-l4t/``: an L4T container build context (``Dockerfile`` on an
  ``l4t-tensorrt`` r8.5.2 base, run with ``--runtime nvidia``).

The static files live in ``deploy/jetson/``; this module stages and packs them. Each is
built under a ``.part`` name and renamed into place once whole, and the work folders are
removed however the build ends: a build interrupted (Ctrl-C, a job's cancel) or failed leaves
no truncated .deb or tarball under the final name, where it would pass for a bundle (or
replace a whole one of the same version).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import yaml

from edge.settings import ModelSettings
from edgewise import __version__
from edgewise.errors import InvalidInputError, ModelError
from edgewise.outputs import check_output_folder
from edgewise.policy.loading import parse_policy, read_policy_bytes
from edgewise.runtime.metadata import ModelInfo, find_sidecar, load_model_info
from edgewise.runtime.opsets import model_problems

REPO = Path(__file__).resolve().parents[1]
JETSON = REPO / "deploy" / "jetson"
PKG = "edgewise-edge"
LIB = "usr/lib/edgewise-edge"
SHARE = "usr/share/edgewise-edge"
UNITS = ("edgewise-edge.service", "edgewise-edge-setup.service", "edgewise-edge-power.service")
#: The folders the package owns (with everything under them). The overlay carries entries for
#: these only: the rootfs's own folders (/etc, /usr, /usr/bin, /lib...) keep their modes and
#: times (an /usr older than /etc/.updated would skip systemd-sysusers at first boot).
OWNED_DIRS = ("etc/edgewise", LIB, SHARE, f"usr/share/doc/{PKG}")
#: Targets and the JetPack releases they are built for (all L4T R35: Python 3.8, TensorRT 8.5).
TARGETS = {"xavier-nx": ("5.1", "5.1.1", "5.1.2"), "agx-xavier": ("5.1", "5.1.1", "5.1.2")}
#: What the .deb depends on that a flashed L4T rootfs may lack (apply_binaries.sh installs the BSP,
#: not JetPack's SDK components): the rootfs overlay, which has no Depends, needs them there already.
DEVICE_DEPENDS = ("python3-venv", "python3-libnvinfer (>= 8.5)", "libopencv-python | python3-opencv")
DEFAULT_MODEL = REPO / "models" / "camera" / "edge-int8-trt.onnx"
DEFAULT_POLICY = REPO / "examples" / "policy.yaml"
#: ``pip download`` arguments for JetPack 5.1's Python (CPython 3.8 on aarch64, glibc 2.31): both
#: names of the manylinux2014 platform, since pip matches wheel tags literally for a foreign
#: platform and grpcio publishes its aarch64 wheels under the PEP 600 name only.
DOWNLOAD_ARGS = ("--only-binary=:all:", "--platform", "manylinux2014_aarch64", "--platform",
                 "manylinux_2_17_aarch64", "--python-version", "3.8", "--implementation", "cp")


@dataclass
class BundleOptions:
    """What to bundle; validated by :func:`check_options`."""

    out_dir: Path
    target: str = "xavier-nx"
    jetpack: str = "5.1"
    model: Path = DEFAULT_MODEL
    edge_config: Path = JETSON / "edge.yaml"
    policy: Path = DEFAULT_POLICY
    wheels: Optional[Path] = None
    power_mode: Optional[int] = None
    jetson_clocks: bool = False
    version: str = __version__
    maintainer: str = "edgewise maintainers <maintainers@edgewise.invalid>"


@dataclass
class BundleResult:
    deb: Path
    overlay: Path
    container: Path
    files: List[str] = field(default_factory=list)


def check_options(opts: BundleOptions) -> None:
    """Raise InvalidInputError (ConfigError for ``-o`` and a policy the daemon would refuse) naming
    the option that cannot work."""
    if not JETSON.is_dir():  # first: from a pip-installed package every default path below is missing too
        raise InvalidInputError(
            f"{JETSON} is missing: this edgewise is an installed package, and `edgewise edge bundle` packs a "
            "source checkout's files (deploy/jetson/, the default model and policy): run it from a checkout "
            "of the edgewise repository (its .venv/bin/edgewise)")
    if opts.target not in TARGETS:
        raise InvalidInputError(f"--target {opts.target!r} is not supported; use one of {sorted(TARGETS)}")
    if opts.jetpack not in TARGETS[opts.target]:
        raise InvalidInputError(
            f"--jetpack {opts.jetpack!r} is not supported for {opts.target}; use one of "
            f"{list(TARGETS[opts.target])} (L4T R35: Python 3.8, TensorRT 8.5)"
        )
    for flag, path in (("--model", opts.model), ("--edge-config", opts.edge_config), ("--policy", opts.policy)):
        if not Path(path).is_file():
            raise InvalidInputError(f"{flag} {path}: file not found")
    parse_policy(read_policy_bytes(opts.policy, regular_only=True), str(opts.policy), learned_model=False)
    backend = shipped_backend(Path(opts.edge_config))
    problems = model_problems(_model_info(Path(opts.model)), tensorrt=backend != "onnxruntime")
    if problems:
        raise InvalidInputError(f"--model {opts.model} (model.backend {backend} in {opts.edge_config}): "
                                + "; ".join(problems))
    if opts.wheels is not None:
        check_wheelhouse(Path(opts.wheels))
    if opts.power_mode is not None and not 0 <= opts.power_mode <= 8:
        raise InvalidInputError(f"--power-mode {opts.power_mode}: nvpmodel modes on Xavier NX are 0..8")
    if not _NATIVE_VERSION.fullmatch(opts.version):
        raise InvalidInputError(
            f"--version {opts.version!r}: not a Debian version of a native package (a digit, then letters, "
            "digits and . + ~; no epoch or '-' revision); for a rebuild of this release use "
            f"{__version__}+<suffix>, e.g. {__version__}+site1, which dpkg installs over {__version__}")
    build_time()  # a malformed SOURCE_DATE_EPOCH is refused before anything is built
    check_output_folder(opts.out_dir, "-o")


#: Debian policy 5.6.12: the upstream version of a native package (no revision, so no '-';
#: no epoch, which the file names would carry as ':'); at most 64 characters.
_NATIVE_VERSION = re.compile(r"[0-9][A-Za-z0-9.+~]{0,63}")


def _model_info(model: Path) -> ModelInfo:
    try:
        return load_model_info(model)
    except ModelError as exc:
        raise InvalidInputError(f"--model: {exc}") from None


def shipped_backend(edge_config: Path) -> str:
    """The ``model.backend`` the shipped settings name (``auto``, the default, runs TensorRT on the
    device), read without the rest of the settings (they name the device's paths, not this
    machine's); a file the device cannot read is the daemon's error, not the bundle's."""
    try:
        model = (yaml.safe_load(edge_config.read_text(encoding="utf-8")) or {}).get("model") or {}
        backend = model.get("backend", ModelSettings.backend) if isinstance(model, dict) else ModelSettings.backend
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return ModelSettings.backend
    return backend if isinstance(backend, str) else ModelSettings.backend


def device_pins() -> List[Tuple[str, str]]:
    """``(name, version)`` of every package setup.sh installs (constraints-jetpack51.txt
    without the lines marked as JetPack's own)."""
    out = []
    for line in (JETSON / "constraints-jetpack51.txt").read_text().splitlines():
        spec, _, comment = line.partition("#")
        if "==" in spec and "JetPack's" not in comment:
            name, _, version = spec.strip().partition("==")
            out.append((name.strip(), version.strip()))
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def check_wheelhouse(wheels: Path) -> None:
    """``--wheels`` must hold an aarch64/cp38 (or pure-Python) wheel of every pinned package,
    or the offline first boot it exists for would fail on the device."""
    if not wheels.is_dir():
        raise InvalidInputError(f"--wheels {wheels}: not a directory of .whl files")
    have = set()
    for whl in wheels.glob("*.whl"):
        parts = whl.name[:-4].split("-")
        if len(parts) >= 5 and ("aarch64" in parts[-1] or parts[-1] == "any") and \
                parts[-3].startswith(("cp38", "py3", "py2.py3")):
            have.add((_norm(parts[0]), parts[1]))
    missing = [f"{n}=={v}" for n, v in device_pins() if (_norm(n), v) not in have]
    if missing:
        raise InvalidInputError(
            f"--wheels {wheels}: no aarch64/cp38 wheel of {', '.join(missing)}; fill it with: pip download "
            f"{' '.join(DOWNLOAD_ARGS)} -r deploy/jetson/requirements.txt -c deploy/jetson/constraints-jetpack51.txt "
            f"-d {wheels}")


def _copy(src: Path, dest: Path, mode: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, mode)


def _copy_package(name: str, dest: Path) -> None:
    """Copy a Python package's .py sources (no caches). Only the runtime core and the
    edge package are copied; the offline tools live in ``edgewise_tools`` and stay out."""
    src = REPO / name
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if "__pycache__" in rel.parts:
            continue
        _copy(path, dest / name / rel, 0o644)
    if (src / "py.typed").exists():
        _copy(src / "py.typed", dest / name / "py.typed", 0o644)


def stage_tree(opts: BundleOptions, root: Path) -> None:
    """Lay out the installed file tree (shared by .deb, overlay and container)."""
    py = root / LIB / "python"
    _copy_package("edgewise", py)
    _copy_package("edge", py)
    _copy(JETSON / "setup.sh", root / LIB / "setup.sh", 0o755)
    _copy(JETSON / "requirements.txt", root / LIB / "requirements.txt", 0o644)
    _copy(JETSON / "constraints-jetpack51.txt", root / LIB / "constraints-jetpack51.txt", 0o644)
    _copy(JETSON / "edgewise-edge.sh", root / "usr/bin/edgewise-edge", 0o755)
    for unit in UNITS:
        _copy(JETSON / unit, root / "lib/systemd/system" / unit, 0o644)
    _copy(JETSON / "sysusers.conf", root / "usr/lib/sysusers.d/edgewise-edge.conf", 0o644)
    _copy(JETSON / "tmpfiles.conf", root / "usr/lib/tmpfiles.d/edgewise-edge.conf", 0o644)
    _copy(Path(opts.edge_config), root / "etc/edgewise/edge.yaml", 0o644)
    _copy(Path(opts.policy), root / "etc/edgewise/policy.yaml", 0o644)
    _copy(Path(opts.model), root / SHARE / "models/edge.onnx", 0o644)
    for data in load_model_info(opts.model).external_data:  # dynamo exports: weights in <model>.data
        _copy(data, root / SHARE / "models" / data.relative_to(Path(opts.model).parent), 0o644)
    sidecar = find_sidecar(Path(opts.model))  # names / stride / input size kept beside the model
    if sidecar is not None:  # found by the device as <model>.yaml, like here
        _copy(sidecar, root / SHARE / "models/edge.yaml", 0o644)
    # Shipped by every build, empty without --power-mode / --jetson-clocks: a conffile a later
    # build drops stays on the device (dpkg keeps it as obsolete) and the unit went on applying it.
    text = "# Read by edgewise-edge-power.service at boot (empty: the device's own power mode and clocks).\n"
    text += f"NVPMODEL_MODE={'' if opts.power_mode is None else opts.power_mode}\n"
    text += f"JETSON_CLOCKS={1 if opts.jetson_clocks else 0}\n"
    dest = root / "etc/default/edgewise-edge-power"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    os.chmod(dest, 0o644)
    if opts.wheels is not None:
        for whl in sorted(Path(opts.wheels).glob("*.whl")):
            _copy(whl, root / SHARE / "wheels" / whl.name, 0o644)
    doc = root / "usr/share/doc" / PKG
    _copy(JETSON / "copyright", doc / "copyright", 0o644)
    _copy(JETSON / "README.md", doc / "README.md", 0o644)
    changelog = (
        f"{PKG} ({opts.version}) stable; urgency=medium\n\n"
        f"  * Release {opts.version} for {opts.target}, JetPack {opts.jetpack}.\n\n"
        f" -- {opts.maintainer}  Mon, 30 Nov 2026 00:00:00 +0000\n"
    )
    # A native package (version without a Debian revision) names it changelog.gz.
    _write_gz(doc / "changelog.gz", changelog)
    _write_gz(root / "usr/share/man/man1/edgewise-edge.1.gz", _MANPAGE.format(version=opts.version))
    normalise_modes(root)


def normalise_modes(root: Path) -> None:
    """Folders 0755, files 0755 when executable else 0644, whatever the build host's umask
    (the .deb, the overlay and the container all take their modes from the staged tree)."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if path.is_dir():
            os.chmod(path, 0o755)
        else:
            os.chmod(path, 0o755 if path.stat().st_mode & 0o100 else 0o644)


def build_time() -> int:
    """Time stamp of what the bundle packs: ``SOURCE_DATE_EPOCH`` when set (reproducible
    builds; dpkg-deb clamps the .deb's times to it too), else now."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if epoch:
        if not epoch.isdigit():
            raise InvalidInputError(f"SOURCE_DATE_EPOCH={epoch!r}: must be seconds since 1970 (an integer)")
        return int(epoch)
    return int(time.time())


_MANPAGE = """.TH EDGEWISE-EDGE 1 "2026-11-30" "edgewise {version}" "User Commands"
.SH NAME
edgewise-edge \\- edgewise edge daemon and tools for Jetson
.SH SYNOPSIS
.B edgewise-edge edge run \\-\\-config /etc/edgewise/edge.yaml
.br
.B edgewise-edge edge check-config \\-\\-config /etc/edgewise/edge.yaml
.br
.B edgewise-edge edge check-policy
.I FILE
.br
.B edgewise-edge edge engine \\-\\-config /etc/edgewise/edge.yaml
.br
.B edgewise-edge edge model-info
.I MODEL
.br
.B edgewise-edge edge provision \\-\\-root /
.RI [ OPTIONS ]
.SH DESCRIPTION
Runs an INT8 YOLOv5 detector on camera, RTSP or file streams, scores the hardness of
every frame and escalates hard frames to the edgewise cloud tier (gRPC or MQTT v5),
spooling them to disk while the cloud is unreachable. Started by
.BR edgewise-edge.service ;
the escalation policy in /etc/edgewise/policy.yaml reloads live.
.B edge engine
builds (or reuses) the TensorRT engine the daemon loads;
.B edge check-config
checks the settings, device id, state folders and backend without starting;
.B edge provision
writes one device's settings, token and client certificate.
.SH FILES
/etc/edgewise/edge.yaml, /etc/edgewise/policy.yaml, /etc/default/edgewise-edge (token, mode 0600),
/etc/edgewise/tls, /var/lib/edgewise, /var/cache/edgewise/engines
.SH SEE ALSO
/usr/share/doc/edgewise-edge/README.md
"""


def _write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        # mtime=0 and no file name keep the package reproducible.
        with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0, compresslevel=9, filename="") as gz:
            gz.write(text.encode())
    os.chmod(path, 0o644)


def _installed_size_kib(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) // 1024 + 1


def _control(opts: BundleOptions, root: Path) -> str:
    return (
        f"Package: {PKG}\n"
        f"Version: {opts.version}\n"
        "Architecture: arm64\n"
        f"Maintainer: {opts.maintainer}\n"
        f"Installed-Size: {_installed_size_kib(root)}\n"
        f"Depends: python3 (>= 3.8), {', '.join(DEVICE_DEPENDS)}, adduser, systemd\n"
        "Recommends: nvidia-l4t-core\n"
        "Section: video\n"
        "Priority: optional\n"
        "Homepage: https://github.com/edgewise-ai/edgewise\n"
        f"Description: edgewise edge daemon for Jetson ({opts.target}, JetPack {opts.jetpack})\n"
        " Runs an INT8 YOLOv5 detector with TensorRT on camera, RTSP or file streams,\n"
        " scores how hard each frame is and escalates hard frames to the edgewise\n"
        " cloud tier over gRPC or MQTT v5, spooling to disk while the cloud is\n"
        " unreachable. Escalation policies reload live.\n"
    )


def _part(path: Path) -> Path:
    """Where ``path`` is built before it is whole (:func:`_into_place`)."""
    return path.with_name(path.name + ".part")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _into_place(part: Path, path: Path) -> Path:
    """Rename the whole ``part`` to ``path`` (a file atomically; a folder replaces the old one)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    os.replace(part, path)
    return path


def build_deb(opts: BundleOptions, tree: Path, out: Path) -> Path:
    """Pack ``tree`` into a .deb with dpkg-deb (root-owned files, xz)."""
    pkgroot = out.parent / (out.stem + ".root")
    try:
        return _build_deb(opts, tree, out, pkgroot)
    finally:
        _remove(pkgroot)
        _remove(_part(out))


def _build_deb(opts: BundleOptions, tree: Path, out: Path, pkgroot: Path) -> Path:
    _remove(pkgroot)
    shutil.copytree(tree, pkgroot, symlinks=True)
    debian = pkgroot / "DEBIAN"
    debian.mkdir()
    os.chmod(debian, 0o755)
    (debian / "control").write_text(_control(opts, tree))
    # Every file under /etc is the operator's to edit: all are conffiles.
    etc = sorted(p.relative_to(tree).as_posix() for p in (tree / "etc").rglob("*") if p.is_file())
    (debian / "conffiles").write_text("".join(f"/{c}\n" for c in etc))
    for script in ("preinst", "postinst", "prerm", "postrm"):
        _copy(JETSON / "debian" / script, debian / script, 0o755)
    sums = []
    for path in sorted(p for p in pkgroot.rglob("*") if p.is_file() and "DEBIAN" not in p.parts):
        rel = path.relative_to(pkgroot).as_posix()
        sums.append(f"{hashlib.md5(path.read_bytes()).hexdigest()}  {rel}\n")
    (debian / "md5sums").write_text("".join(sums))
    for p in debian.iterdir():
        if p.name in ("control", "conffiles", "md5sums"):
            os.chmod(p, 0o644)
    dpkg = shutil.which("dpkg-deb")
    if dpkg is None:
        raise InvalidInputError("dpkg-deb is needed to build the .deb (apt-get install dpkg)")
    subprocess.run(
        [dpkg, "--root-owner-group", "-Zxz", "--build", str(pkgroot), str(_part(out))],
        check=True, capture_output=True,
    )
    return _into_place(_part(out), out)


def _owned(rel: str) -> bool:
    return any(rel == d or rel.startswith(d + "/") for d in OWNED_DIRS)


def build_overlay(tree: Path, out: Path) -> Path:
    """A tarball to unpack into Linux_for_Tegra/rootfs (root-owned, units enabled).

    Files and links, plus the folders the package owns (:data:`OWNED_DIRS`); the rootfs's
    own folders are left out (tar makes a missing one). Folders 0755, files 0644 or 0755,
    every time stamp :func:`build_time`.
    """
    wants = "etc/systemd/system/multi-user.target.wants"
    mtime = build_time()

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = mtime
        if info.isdir():
            info.mode = 0o755
        elif info.isfile():
            info.mode = 0o755 if info.mode & 0o100 else 0o644
        return info

    try:
        with open(_part(out), "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime, filename="") as gz, \
                tarfile.open(fileobj=gz, mode="w") as tar:
            _pack(tree, tar, owned_by_root, wants)
        return _into_place(_part(out), out)
    finally:
        _remove(_part(out))


def _pack(tree: Path, tar: tarfile.TarFile, owned_by_root: Callable[[tarfile.TarInfo], tarfile.TarInfo],
          wants: str) -> None:
    """The overlay's members (:func:`build_overlay`)."""
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if path.is_dir() and not path.is_symlink() and not _owned(rel):
            continue
        tar.add(str(path), arcname=rel, recursive=False, filter=owned_by_root)
    for unit in UNITS:
        link = tarfile.TarInfo(f"{wants}/{unit}")
        link.type = tarfile.SYMTYPE
        link.linkname = f"/lib/systemd/system/{unit}"
        link.mode = 0o777
        tar.addfile(owned_by_root(link))


def build_container(tree: Path, out_dir: Path) -> Path:
    """An L4T container build context: Dockerfile + the staged tree under root/."""
    part = _part(out_dir)
    try:
        _remove(part)
        shutil.copytree(tree, part / "root", symlinks=True)
        # the Dockerfile copies the wheelhouse before the venv build, and the model after it (a new
        # model reuses the venv layer): a bundle without --wheels has an empty one
        (part / "root" / SHARE / "wheels").mkdir(parents=True, exist_ok=True)
        _copy(JETSON / "Dockerfile.l4t", part / "Dockerfile", 0o644)
        return _into_place(part, out_dir)
    finally:
        _remove(part)


def bundle(opts: BundleOptions) -> BundleResult:
    """Build the .deb, the rootfs overlay and the container context into ``opts.out_dir``."""
    check_options(opts)
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tree = out / f"{PKG}.tree"
    try:
        _remove(tree)
        stage_tree(opts, tree)
        files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
        deb = build_deb(opts, tree, out / f"{PKG}_{opts.version}_arm64.deb")
        overlay = build_overlay(tree, out / f"{PKG}_{opts.version}_rootfs-overlay.tar.gz")
        container = build_container(tree, out / f"{PKG}-l4t")
    finally:
        _remove(tree)
    return BundleResult(deb=deb, overlay=overlay, container=container, files=files)


def _handler(args: argparse.Namespace) -> int:
    opts = BundleOptions(
        out_dir=Path(args.out),
        target=args.target,
        jetpack=args.jetpack,
        model=Path(args.model),
        edge_config=Path(args.edge_config),
        policy=Path(args.policy),
        wheels=Path(args.wheels) if args.wheels else None,
        power_mode=args.power_mode,
        jetson_clocks=args.jetson_clocks,
        version=args.version,
    )
    result = bundle(opts)
    buf = io.StringIO()
    buf.write(f"Debian package:  {result.deb}\n")
    buf.write(f"rootfs overlay:  {result.overlay}\n")
    buf.write(f"L4T container:   {result.container}/Dockerfile\n")
    buf.write("Next: deploy/jetson/README.md (install the .deb, or unpack the overlay into "
              "Linux_for_Tegra/rootfs before flash.sh)\n")
    print(buf.getvalue(), end="")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``edge bundle`` to the ``edge`` command group."""
    p = subparsers.add_parser("bundle", help="build the Jetson .deb, rootfs overlay and L4T container")
    p.add_argument("--target", default="xavier-nx", help=f"device ({', '.join(sorted(TARGETS))}; default %(default)s)")
    p.add_argument("--jetpack", default="5.1", help="JetPack release (5.1, 5.1.1, 5.1.2; default %(default)s)")
    p.add_argument("-o", "--out", default="dist", help="output directory (default dist/)")
    p.add_argument("--model", default=str(DEFAULT_MODEL),
                   help="edge model ONNX to ship (INT8 in TensorRT's Q/DQ layout: `edgewise model quantize --target "
                        "tensorrt`, unless the shipped edge.yaml sets model.backend: onnxruntime; default %(default)s)")
    p.add_argument("--edge-config", default=str(JETSON / "edge.yaml"), help="edge.yaml to ship as /etc/edgewise/edge.yaml (default %(default)s)")
    p.add_argument("--policy", default=str(DEFAULT_POLICY), help="policy to ship as /etc/edgewise/policy.yaml (default %(default)s)")
    p.add_argument("--wheels", default=None, help="directory of aarch64 cp38 wheels to bundle for offline installs")
    p.add_argument("--power-mode", type=int, default=None, help="nvpmodel mode applied at boot (Xavier NX: 0..8)")
    p.add_argument("--jetson-clocks", action="store_true", help="run jetson_clocks at boot")
    p.add_argument("--version", default=__version__,
                   help=f"the package's version (default {__version__}); a rebuild with another model, "
                        f"edge.yaml or policy needs a higher one, e.g. {__version__}+site1, or apt "
                        "keeps the installed package")
    p.set_defaults(func=_handler)

