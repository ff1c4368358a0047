"""``make images``' pure parts: the APT mirror, the pip settings and the cache key of the stand-in
base; the build itself is exercised by tests/deploy/test_cloud_image.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from edgewise_tools import images
from edgewise_tools.images import ROOT, WHEEL_SOURCES, source_digest

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_apt_mirror_from_deb822_and_one_line_sources() -> None:
    assert images.apt_mirror({"/etc/apt/sources.list.d/debian.sources": DEB822}) == "http://mirror.example/debian"
    one_line = "# comment\ndeb-src http://src.example/debian bookworm main\n" \
               "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian/ bookworm main\n"
    assert images.apt_mirror({"/etc/apt/sources.list": one_line}) == "http://one.example/debian"


def test_apt_mirror_skips_disabled_entries_and_other_files() -> None:
    disabled = "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n"
    sources = {"/etc/apt/sources.list.d/a.sources": disabled,
               "/etc/apt/sources.list.d/n.sources.disabled-by-farm": "Types: deb\nURIs: http://x\nSuites: bookworm\n",
               "/etc/apt/sources.list.d/z.sources": "Types: deb\nURIs: http://trixie.example/debian\nSuites: trixie\n"}
    # no entry serves bookworm: any Debian mirror serves every suite, so the first one is used
    assert images.apt_mirror(sources) == "http://trixie.example/debian"
    assert images.apt_mirror({}) == images.DEFAULT_MIRROR


def test_pip_settings_keep_what_works_inside_a_container() -> None:
    files = ["[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n",
             "[global]\nfind-links = /opt/wheels\n"
             "extra-index-url = file:///opt/pypi/simple https://extra.example/simple\n",
             "[install]\ntrusted-host = extra.example\n"]
    got = images.pip_settings(files, {"PIP_INDEX_URL": "https://proxy.example/simple", "PIP_FIND_LINKS": "/x"})
    assert got == {"index-url": "https://proxy.example/simple", "extra-index-url": "https://extra.example/simple",
                   "trusted-host": "extra.example", "cert": "/etc/ssl/certs/ca-certificates.crt"}
    conf = images.standin_pip_conf(got)
    assert conf.splitlines() == ["[global]", "index-url = https://proxy.example/simple",
                                 "extra-index-url = https://extra.example/simple", "trusted-host = extra.example",
                                 f"cert = {images.HOST_CA}"]
    assert images.pip_settings([], {}) == {}


def test_standin_key_changes_with_every_input() -> None:
    base = images.standin_key("http://m/debian", "[global]\n", b"CA")
    assert base == images.standin_key("http://m/debian", "[global]\n", b"CA")
    assert len({base, images.standin_key("http://n/debian", "[global]\n", b"CA"),
                images.standin_key("http://m/debian", "[global]\nx = 1\n", b"CA"),
                images.standin_key("http://m/debian", "[global]\n", b"CA2")}) == 4


def test_missing_podman_is_named(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "podman is not installed" in (images.podman_problem() or "")
    assert images.main([]) == 1
    assert "images: error: podman is not installed" in capsys.readouterr().err


# SOURCE_DIGEST: the install step's layer cache is keyed by the RUN's text, not by the wheels it
# mounts, so a rebuild after a source change kept the old code; the digest of the sources keys it.

def test_the_digest_follows_the_sources_and_nothing_else(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_file():
            shutil.copy(ROOT / name, ctx / name)
        else:
            (ctx / name / "pkg").mkdir(parents=True)
            (ctx / name / "pkg" / "mod.py").write_text(f"# {name}\n")
    first = source_digest(ctx)
    assert source_digest(ctx) == first
    (ctx / "cloud" / "pkg" / "__pycache__").mkdir()
    (ctx / "cloud" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (ctx / "models").mkdir()
    (ctx / "models" / "other.onnx").write_bytes(b"x")  # not a wheel source
    assert source_digest(ctx) == first
    (ctx / "cloud" / "pkg" / "mod.py").write_text("# cloud, changed\n")
    assert source_digest(ctx) != first


def test_both_dockerfiles_key_the_install_by_it() -> None:
    for name in ("Dockerfile", "Dockerfile.cuda"):
        text = (ROOT / "deploy" / "docker" / name).read_text()
        runtime = text[text.rindex("\nFROM "):]  # the runtime stage
        assert "ARG SOURCE_DIGEST" in runtime
        assert runtime.index("ARG SOURCE_DIGEST") < runtime.index("--mount=type=bind,from=build")
