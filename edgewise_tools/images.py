"""Build the CPU cloud image from ``deploy/docker/Dockerfile`` with podman (``make images``).

The Dockerfile stays a plain one (``docker build`` works unchanged); this tool only picks
its ``BASE_IMAGE``:

* the public ``python:3.11-slim-bookworm`` when it is present or a registry serves it;
* otherwise a **stand-in** made here: Debian bookworm from the host's configured APT
  mirror (``debootstrap --variant=minbase``) with Debian's Python 3.11, pip and venv,
  arranged like the official image (``python``/``pip`` on PATH, pip allowed to install
  system-wide, APT caches off) and trusting the CA bundle the host's pip uses, so pip
  inside the build reaches the package index the way the host does. The root filesystem
  is cached as a tar under ``.cache/images/`` keyed by its recipe, so reruns skip
  debootstrap.

It says which base it used, then builds with ``--network host`` (pip and APT inside the
build) and prints the build time and the image size. Standard library only (and the
version from ``edgewise``): ``make images`` runs it with the system Python, before any
virtual environment exists. Podman itself is installed
and configured by the Makefile (``deploy/docker/containers.conf``).
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from edgewise import __version__

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
CACHE = ROOT / ".cache" / "images"
PUBLIC_BASE = "docker.io/library/python:3.11-slim-bookworm"
STANDIN_REPO = "localhost/edgewise-base"
IMAGE_REPO = "localhost/edgewise"
IMAGE = f"{IMAGE_REPO}:{__version__}"  # the chart's default tag is the same version (appVersion)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
STANDIN_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
# As the official Debian images ship it (debuerreotype's docker-clean): no .deb or package
# list caches left in layers.
APT_CLEAN = """\
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""
PIP_FILES = (Path("/etc/xdg/pip/pip.conf"), Path("/etc/pip.conf"),
             Path.home() / ".pip" / "pip.conf", Path.home() / ".config" / "pip" / "pip.conf")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
Log = Callable[[str], None]


class ImageError(RuntimeError):
    """A step of making the image failed; the message says which and why."""


@dataclass(frozen=True)
class Base:
    """The image the Dockerfile's ``BASE_IMAGE`` is set to, and how it was obtained."""

    name: str
    how: str


@dataclass(frozen=True)
class Built:
    """A finished build."""

    tag: str
    base: Base
    seconds: float
    size_bytes: int


def image_files(dockerfile: Path = DOCKERFILE) -> Dict[str, Path]:
    """Path in the image -> file of this repository, for every single-file ``COPY`` of the
    Dockerfile's runtime stage (the baked-in model and its card)."""
    out: Dict[str, Path] = {}
    for m in re.finditer(r"^COPY\s+(\S+)\s+(/\S+)\s*$", dockerfile.read_text(), re.M):
        src = ROOT / m.group(1)
        if src.is_file():
            out[m.group(2)] = src
    return out


def _run(cmd: Sequence[str], *, timeout: float = 600,
         env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def _check(cmd: Sequence[str], what: str, *, timeout: float = 600,
           env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess[str]:
    out = _run(cmd, timeout=timeout, env=env)
    if out.returncode != 0:
        raise ImageError(f"{what} failed (exit {out.returncode}): {_last_line(out.stderr or out.stdout)}")
    return out


# ---- pure parts: which mirror, which pip settings ------------------------------------------

def apt_mirror(sources: Mapping[str, str]) -> str:
    """The first ``deb`` URI of the host's APT sources that serves ``bookworm`` (else the first
    ``deb`` URI, else deb.debian.org). ``sources``: file name -> text, one-line or deb822."""
    entries: List[tuple[str, List[str]]] = []
    for name, text in sorted(sources.items()):
        if name.endswith(".sources"):
            for stanza in text.split("\n\n"):
                fields: Dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.strip().startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                    entries += [(uri, fields.get("suites", "").split()) for uri in fields.get("uris", "").split()]
        elif name.endswith(".list"):
            for line in text.splitlines():
                parts = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()  # drop [options]
                if len(parts) >= 3 and parts[0] == "deb":
                    entries.append((parts[1], [parts[2]]))
    for uri, suites in entries:
        if SUITE in suites:
            return uri.rstrip("/")
    return entries[0][0].rstrip("/") if entries else DEFAULT_MIRROR


def host_apt_sources() -> Dict[str, str]:
    """The host's APT source files (names as APT reads them)."""
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    return {str(p): p.read_text(encoding="utf-8", errors="replace") for p in files if p.is_file()}


def pip_settings(config_texts: Iterable[str], env: Mapping[str, str]) -> Dict[str, str]:
    """The host pip's index settings that make sense inside a container: ``index-url`` and
    ``extra-index-url`` over http(s) (file:// indexes are host paths), ``trusted-host``, and
    ``cert`` (the CA bundle path). Later files and then ``PIP_*`` variables win, as in pip."""
    merged: Dict[str, str] = {}
    for text in config_texts:
        cp = configparser.ConfigParser()
        cp.read_string(text)
        for section in ("global", "install", "wheel", "download"):
            if cp.has_section(section):
                merged.update({k: v for k, v in cp.items(section)})
    for key in ("index-url", "extra-index-url", "trusted-host", "cert"):
        value = env.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            merged[key] = value
    out: Dict[str, str] = {}
    for key in ("index-url", "extra-index-url"):
        urls = [u for u in merged.get(key, "").split() if u.startswith(("http://", "https://"))]
        if urls:
            out[key] = " ".join(urls)
    for key in ("trusted-host", "cert"):
        if merged.get(key):
            out[key] = merged[key].strip()
    return out


def standin_pip_conf(settings: Mapping[str, str]) -> str:
    """pip.conf of the stand-in: the host's index settings, the bundle at the system path."""
    lines = ["[global]"]
    lines += [f"{k} = {settings[k]}" for k in ("index-url", "extra-index-url", "trusted-host") if k in settings]
    lines.append(f"cert = {HOST_CA}")
    return "\n".join(lines) + "\n"


def standin_key(mirror: str, pip_conf: str, ca_bundle: bytes) -> str:
    """Cache key of a stand-in root filesystem: everything that goes into it."""
    h = hashlib.sha256()
    for part in (SUITE, mirror, " ".join(STANDIN_PACKAGES), APT_CLEAN, pip_conf):
        h.update(part.encode() + b"\0")
    h.update(ca_bundle)
    return h.hexdigest()[:12]


# ---- podman ---------------------------------------------------------------------------------

def podman_problem() -> Optional[str]:
    """Why podman cannot be used here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (`make images` installs it with apt-get as root)"
    out = _run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], timeout=120)
    if out.returncode != 0:
        return f"`podman info` fails: {_last_line(out.stderr)}"
    return None


def image_exists(name: str) -> bool:
    return _run(["podman", "image", "exists", name], timeout=60).returncode == 0


def image_size(name: str) -> int:
    out = _check(["podman", "image", "inspect", "--format", "{{.Size}}", name], f"podman image inspect {name}")
    return int(out.stdout.strip())


def _host_ca(settings: Mapping[str, str]) -> Path:
    cert = Path(settings.get("cert", str(HOST_CA)))
    if not cert.is_file():
        raise ImageError(f"the CA bundle the host's pip uses, {cert}, is not a file")
    return cert


def make_standin_rootfs(dest_tar: Path, mirror: str, pip_conf: str, ca_bundle: Path, log: Log) -> None:
    """debootstrap + Python into a root filesystem, written as ``dest_tar`` (needs root)."""
    if os.geteuid() != 0:
        raise ImageError("making the stand-in base image needs root (debootstrap, chroot): run `make images` as root")
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (`make images` installs it with apt-get)")
    dest_tar.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="standin-", dir=dest_tar.parent))
    rootfs = work / "rootfs"
    try:
        t0 = time.monotonic()
        log(f"  debootstrap --variant=minbase {SUITE} from {mirror}")
        _check(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror], "debootstrap", timeout=1800)
        shutil.copyfile("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
        (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(APT_CLEAN)
        log(f"  apt-get install {' '.join(STANDIN_PACKAGES)}")
        script = ("apt-get update -qq && apt-get install -y -qq --no-install-recommends "
                  f"{' '.join(STANDIN_PACKAGES)} && apt-get clean && rm -rf /var/lib/apt/lists/*")
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
        _check(["chroot", str(rootfs), "/bin/sh", "-c", script], "apt-get inside the stand-in", timeout=1800, env=env)
        for marker in (rootfs / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
            marker.unlink()  # the official image installs with pip system-wide, so may the stand-in
        for name, target in (("python", "/usr/bin/python3"), ("pip", "/usr/bin/pip3")):
            link = rootfs / "usr/local/bin" / name
            link.unlink(missing_ok=True)
            link.symlink_to(target)
        shutil.copyfile(ca_bundle, rootfs / str(HOST_CA).lstrip("/"))
        (rootfs / "etc/pip.conf").write_text(pip_conf)
        (rootfs / "etc/resolv.conf").write_text("")  # podman provides its own
        tmp_tar = dest_tar.with_suffix(".partial")
        _check(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp_tar), "."], "tar of the stand-in")
        tmp_tar.replace(dest_tar)
        log(f"  stand-in root filesystem cached in {dest_tar} ({time.monotonic() - t0:.0f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_standin(log: Log, cache: Path = CACHE) -> Base:
    """The stand-in base image: from podman's store, else the cached tar, else made now."""
    settings = pip_settings(
        [p.read_text(encoding="utf-8", errors="replace") for p in PIP_FILES if p.is_file()], os.environ)
    ca = _host_ca(settings)
    pip_conf = standin_pip_conf(settings)
    mirror = apt_mirror(host_apt_sources())
    key = standin_key(mirror, pip_conf, ca.read_bytes())
    name = f"{STANDIN_REPO}:python3.11-{SUITE}-{key}"
    how = f"stand-in made here from {mirror} (Debian's Python 3.11; no container registry reachable)"
    if image_exists(name):
        return Base(name, how)
    tar = cache / f"python3.11-{SUITE}-{key}.tar"
    if not tar.is_file():
        log(f"making the stand-in base image {name} (cached afterwards)")
        make_standin_rootfs(tar, mirror, pip_conf, ca, log)
    changes = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "ENV LANG=C.UTF-8", 'CMD ["python3"]']
    cmd = ["podman", "import", "-q"] + [a for c in changes for a in ("--change", c)] + [str(tar), name]
    _check(cmd, f"podman import {tar}", timeout=900)
    return Base(name, how)


def choose_base(mode: str, log: Log, cache: Path = CACHE) -> Base:
    """``public``, ``stand-in``, or ``auto``: the public image when present or pullable."""
    if mode in ("auto", "public"):
        if image_exists(PUBLIC_BASE):
            return Base(PUBLIC_BASE, "public image, already in podman's store")
        pulled = _run(["podman", "pull", "-q", PUBLIC_BASE], timeout=900)
        if pulled.returncode == 0:
            return Base(PUBLIC_BASE, "public image, pulled now")
        why = _last_line(pulled.stderr)
        if mode == "public":
            raise ImageError(f"cannot pull {PUBLIC_BASE}: {why}")
        log(f"{PUBLIC_BASE} is not reachable ({why}); using a local stand-in")
    return ensure_standin(log, cache)


#: What the wheels installed in the image are built from (the Dockerfiles' COPY lines).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "edgewise", "edgewise_tools", "edge", "cloud")


def source_digest(context: Path = ROOT) -> str:
    """A digest of :data:`WHEEL_SOURCES` under ``context`` (names and contents, caches left
    out), the Dockerfiles' ``SOURCE_DIGEST``: the install step's layer cache is keyed by its
    text, not by the wheels it mounts, so without it a rebuild kept the old code."""
    h = hashlib.sha256()
    for name in WHEEL_SOURCES:
        top = context / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for p in files:
            if "__pycache__" in p.parts:
                continue
            h.update(str(p.relative_to(context)).encode() + b"\0")
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(base: Base, tag: str, *, dockerfile: Path = DOCKERFILE, context: Path = ROOT,
          stream: bool = False) -> Built:
    """``podman build`` of ``dockerfile`` on ``base``; ``stream`` shows podman's output live."""
    cmd = ["podman", "build", "--isolation", "chroot", "--network", "host", "--pull=never",
           "--build-arg", f"BASE_IMAGE={base.name}", "--build-arg", f"SOURCE_DIGEST={source_digest(context)}",
           "-f", str(dockerfile), "-t", tag, str(context)]
    t0 = time.monotonic()
    if stream:
        rc = subprocess.run(cmd, timeout=3600).returncode
        detail = "see podman's output above"
    else:
        out = _run(cmd, timeout=3600)
        rc, detail = out.returncode, "\n".join((out.stdout + out.stderr).strip().splitlines()[-25:])
    if rc != 0:
        raise ImageError(f"podman build -f {dockerfile} failed (exit {rc}):\n{detail}")
    return Built(tag, base, time.monotonic() - t0, image_size(tag))


def summary(b: Built) -> str:
    return (f"built {b.tag} on {b.base.name} in {b.seconds:.1f} s; "
            f"image size {b.size_bytes / 1e6:.0f} MB ({b.size_bytes:,} bytes)")


def build_cloud_image(mode: str = "auto", log: Log = print, stream: bool = False) -> Built:
    """What ``make images`` does: pick the base, say which, build, return the measurements."""
    problem = podman_problem()
    if problem:
        raise ImageError(problem)
    base = choose_base(mode, log)
    log(f"base image: {base.name} ({base.how})")
    return build(base, IMAGE, stream=stream)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgewise_tools.images", description=__doc__.split("\n")[0])
    p.add_argument("--base", choices=("auto", "public", "stand-in"), default="auto",
                   help="base image: the public python:3.11-slim-bookworm, the local stand-in, or auto (default)")
    args = p.parse_args(argv)
    try:
        built = build_cloud_image(args.base, stream=True)
    except (ImageError, subprocess.TimeoutExpired) as exc:
        print(f"images: error: {exc}", file=sys.stderr)
        return 1
    print(summary(built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
