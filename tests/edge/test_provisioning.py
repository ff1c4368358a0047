"""``edgewise edge provision``: one device's files in a root, with their modes, validated first."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from edge import provisioning as PV
from edge.settings import load_settings
from edgewise.cli import main
from edgewise.ids import bearer_token_problem
from tests.cloud.gateway.pki import Pki

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """A root as the bundle's overlay leaves it: the shipped edge.yaml, an /etc/group."""
    root = tmp_path / "rootfs"
    (root / "etc/edgewise").mkdir(parents=True)
    (root / "etc/edgewise/edge.yaml").write_text((ROOT / "deploy/jetson/edge.yaml").read_text())
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    return root


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_writes_config_token_and_certificates_with_their_modes(rootfs: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "token").write_text("tok-17.abc_DEF\n")
    Pki(tmp_path).issue("dev", "cam-17")
    assert main(["edge", "provision", "--root", str(rootfs), "--device-id", "cam-17",
                 "--endpoint", "gw.plant.lan:50051", "--endpoint", "gw2.plant.lan:50051",
                 "--token-file", str(tmp_path / "token"), "--ca", str(tmp_path / "ca.pem"),
                 "--cert", str(tmp_path / "dev.pem"), "--key", str(tmp_path / "dev.key"),
                 "--set", "streams.0.fps=10", "--set", "metrics.tegrastats=off"]) == 0
    out, err = capsys.readouterr()
    assert "--env-file" not in err  # unquoted, so docker run --env-file reads it too
    cfg = rootfs / "etc/edgewise/edge.yaml"
    env = rootfs / "etc/default/edgewise-edge"
    assert _mode(cfg) == 0o640 and _mode(env) == 0o600
    assert _mode(rootfs / "etc/edgewise/tls/client.key") == 0o640
    assert _mode(rootfs / "etc/edgewise/tls/ca.pem") == 0o644 == _mode(rootfs / "etc/edgewise/tls/client.pem")
    assert "root's until first boot" in out  # no edgewise group in this rootfs yet
    assert env.read_text().splitlines()[-1] == "EDGEWISE_EDGE__CLOUD__TOKEN=tok-17.abc_DEF"
    assert "tok-17" not in cfg.read_text()  # the secret is only in the root-only file
    s = load_settings(str(cfg), env={"EDGEWISE_EDGE__CLOUD__TOKEN": "tok-17.abc_DEF"})
    assert s.device_id == "cam-17" and s.cloud.endpoints == ["gw.plant.lan:50051", "gw2.plant.lan:50051"]
    assert (s.cloud.tls_ca, s.cloud.tls_cert, s.cloud.tls_key) == (
        "/etc/edgewise/tls/ca.pem", "/etc/edgewise/tls/client.pem", "/etc/edgewise/tls/client.key")
    assert s.streams[0].fps == 10 and s.model.backend == "tensorrt"  # the rest of the template stays
    # the file holds each --set value as the loader read it: "off" stays a string (YAML's false is refused)
    assert s.metrics.tegrastats == "off"


def test_each_file_reaches_the_disk_before_its_name_and_the_folders_after(rootfs: Path, tmp_path: Path,
                                                                            monkeypatch) -> None:
    """The files were renamed into place unsynced: a device provisioned in place whose power was
    cut within ext4's writeback delay could find edge.yaml, the token or the key empty under its
    name. At the os-call boundary: every file's bytes synced before the first rename, each folder
    written into synced after the last."""
    (tmp_path / "token").write_text("tok-17.abc_DEF\n")
    Pki(tmp_path).issue("dev", "cam-17")
    done = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        done.append(("dir", os.readlink(f"/proc/self/fd/{fd}")) if stat.S_ISDIR(st.st_mode) else ("file", st.st_size))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (done.append(("replace", str(b))), real_replace(a, b)))
    assert main(["edge", "provision", "--root", str(rootfs), "--device-id", "cam-17",
                 "--endpoint", "gw.plant.lan:50051", "--token-file", str(tmp_path / "token"),
                 "--ca", str(tmp_path / "ca.pem"), "--cert", str(tmp_path / "dev.pem"),
                 "--key", str(tmp_path / "dev.key")]) == 0
    kinds = [k for k, _ in done]
    renamed = sorted(v for k, v in done if k == "replace")
    assert renamed == sorted(str(rootfs / p) for p in ("etc/edgewise/edge.yaml", "etc/default/edgewise-edge",
                                                       "etc/edgewise/tls/ca.pem", "etc/edgewise/tls/client.pem",
                                                       "etc/edgewise/tls/client.key"))
    assert kinds == ["file"] * 5 + ["replace"] * 5 + ["dir"] * 3, done
    assert all(size > 0 for k, size in done if k == "file")
    assert {v for k, v in done if k == "dir"} == {str(rootfs / "etc/edgewise"), str(rootfs / "etc/default"),
                                                   str(rootfs / "etc/edgewise/tls")}


def test_the_edgewise_group_of_a_running_device_and_a_second_run_keeps_other_env_lines(rootfs: Path,
                                                                                       tmp_path: Path) -> None:
    (rootfs / "etc/group").write_text("root:x:0:\nedgewise:x:998:\n")
    assert PV.group_id(rootfs) == 998
    env = rootfs / "etc/default/edgewise-edge"
    env.parent.mkdir(parents=True)
    env.write_text("EDGEWISE_LOG_LEVEL=DEBUG\nEDGEWISE_EDGE__CLOUD__TOKEN=old\n")
    (tmp_path / "t").write_text("new-token")
    argv = ["edge", "provision", "--root", str(rootfs), "--endpoint", "10.0.0.2:50051", "--token-file",
            str(tmp_path / "t")]
    assert main(argv) == 0
    assert env.read_text() == "EDGEWISE_LOG_LEVEL=DEBUG\nEDGEWISE_EDGE__CLOUD__TOKEN=new-token\n"
    tree = yaml.safe_load((rootfs / "etc/edgewise/edge.yaml").read_text())
    assert "device_id" not in tree  # left empty: the Jetson's serial number
    assert main(argv + ["--group", "10001"]) == 0  # the L4T container's uid/gid


@pytest.mark.parametrize("source", ["/dev/zero", "-"])  # a file, or stdin that never ends
def test_an_endless_token_file_is_refused_at_its_size_cap(rootfs: Path, source: str) -> None:
    """--token-file /dev/zero read without a cap until the kernel killed the command (24 GB resident
    measured). The command runs under a 2 GiB address-space limit here, so the old read fails fast."""
    import sys

    limited = [sys.executable, "-c", "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, "
               "(2 << 30, 2 << 30)); os.execvp(sys.argv[1], sys.argv[1:])"]
    with open("/dev/zero", "rb") as zeros:
        out = subprocess.run([*limited, sys.executable, "-m", "edgewise.cli", "edge", "provision", "--root",
                              str(rootfs), "--endpoint", "gw:1", "--token-file", source], stdin=zeros,
                             capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == f"edgewise: error: --token-file {source}: holds more than 1048576 bytes; is this the right file?\n"
    assert not (rootfs / "etc/default").exists() and not (rootfs / "etc/edgewise/tls").exists()


def test_target_files_that_are_not_utf8_are_kept_as_they_are(rootfs: Path, tmp_path: Path, capsys) -> None:
    """A Latin-1 line in the root's /etc/group or in the daemon's environment file was a
    UnicodeDecodeError traceback; the other lines of the environment file stay byte for byte."""
    (rootfs / "etc/group").write_bytes(b"root:x:0:\nop\xe9rateurs:x:1001:\nedgewise:x:998:\n")
    env = rootfs / "etc/default/edgewise-edge"
    env.parent.mkdir(parents=True)
    env.write_bytes(b"# r\xe9glages du site\nEDGEWISE_EDGE__CLOUD__TOKEN=old\n")
    (tmp_path / "t").write_text("new-token")
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "10.0.0.2:50051", "--keep-identity",
                 "--token-file", str(tmp_path / "t")]) == 0
    assert env.read_bytes() == b"# r\xe9glages du site\nEDGEWISE_EDGE__CLOUD__TOKEN=new-token\n"
    assert "(mode 0640, group 998)" in capsys.readouterr().out  # the edgewise group of the Latin-1 /etc/group


@pytest.mark.parametrize("extra, needle", [
    ([], "cloud.endpoints[0]: 'edgewise-gateway.example.com:50051' is a placeholder"),
    (["--endpoint", "gw:1", "--device-id", "a/b"], "device_id: must be usable as an MQTT topic level"),
    (["--endpoint", "gw:1", "--cert", "/nonexistent.pem"], "--cert and --key go together"),
    (["--endpoint", "gw:1", "--token-file", "/nonexistent"], "--token-file /nonexistent: cannot be read"),
    (["--endpoint", "gw:1", "--ca", "__EMPTY__"], "cannot be used as a CA bundle"),
    (["--endpoint", "gw:1", "--cert", "__CERT__", "--key", "__OTHER_KEY__"], "is not the key of --cert"),
    (["--endpoint", "gw:1", "--token-file", "__SPACES__"], "the token holds a blank, control or non-ASCII"),
    # -1 was written as "group -1" (chown left root's group); a gid over 32 bits was an OverflowError traceback
    (["--endpoint", "gw:1", "--group", "-1"], "--group -1: not a group id; give the number 0..4294967294"),
    (["--endpoint", "gw:1", "--group", "99999999999"], "--group 99999999999: not a group id"),
])
def test_bad_input_is_one_line_and_writes_nothing(rootfs: Path, tmp_path: Path, capsys, extra, needle) -> None:
    (tmp_path / "empty").write_text("")
    (tmp_path / "spaces").write_text("a b")
    pki = Pki(tmp_path)
    pki.issue("a", "cam-a")
    pki.issue("b", "cam-b")
    files = {"__EMPTY__": "empty", "__SPACES__": "spaces", "__CERT__": "a.pem", "__OTHER_KEY__": "b.key"}
    extra = [str(tmp_path / files[a]) if a in files else a for a in extra]
    before = (rootfs / "etc/edgewise/edge.yaml").read_text()
    assert main(["edge", "provision", "--root", str(rootfs), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err
    assert (rootfs / "etc/edgewise/edge.yaml").read_text() == before
    assert not (rootfs / "etc/default").exists() and not (rootfs / "etc/edgewise/tls").exists()


def test_a_template_that_is_not_a_mapping_is_a_clear_error(rootfs: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1",
                 "--template", str(tmp_path / "list.yaml")]) == 2
    assert "must be a YAML mapping (key: value), not list" in capsys.readouterr().err


def test_a_template_that_is_not_text_is_a_clear_error(rootfs: Path, tmp_path: Path, capsys) -> None:
    """A binary --template was a UnicodeDecodeError traceback; now the settings files' own rule."""
    bad = tmp_path / "edge.yaml"
    bad.write_bytes(b"\x00\x01\xff\xfe garbage\n")
    before = (rootfs / "etc/edgewise/edge.yaml").read_text()
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--template", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edgewise: error: {bad}: not UTF-8 text (") and err.endswith(
        "save the edge settings file as UTF-8\n")
    assert (rootfs / "etc/edgewise/edge.yaml").read_text() == before


def test_a_root_without_the_bundle_says_what_to_do(tmp_path: Path, capsys) -> None:
    assert main(["edge", "provision", "--root", str(tmp_path), "--endpoint", "gw:1"]) == 2
    assert "unpack the bundle's overlay into --root first" in capsys.readouterr().err


@pytest.mark.parametrize("item, needle", [
    ("streams.3.fps=10", "--set streams.3.fps: streams has no item 3 (items 0 to 0)"),
    ("streams.x.fps=10", "--set streams.x.fps: streams has no item x"),
    ("model.path.x=1", "--set model.path.x: model.path is a single value; it has no key 'x'"),
    ("metrics.prt=1", "--set metrics.prt: unknown key (did you mean 'metrics.port'?)"),
    ("metrics.port", "--set 'metrics.port': expected KEY.PATH=VALUE"),
    ("streams.0.fps=abc", "--set streams.0.fps: 'abc' is not a number"),
])
def test_a_bad_set_path_is_one_line_naming_the_flag(rootfs: Path, capsys, item: str, needle: str) -> None:
    before = (rootfs / "etc/edgewise/edge.yaml").read_text()
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--set", item]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err, err
    assert (rootfs / "etc/edgewise/edge.yaml").read_text() == before


@pytest.mark.parametrize("extra, needle", [
    (["--endpoint", "gw.plant.lan"], "cloud.endpoints[0]: the gateway address: 'gw.plant.lan' is not 'host:port'"),
    ([], "cloud.endpoints[0]: 'edgewise-gateway.example.com:50051' is a placeholder"),
])
def test_an_invalid_value_names_the_template_without_a_line_of_the_scratch_copy(rootfs: Path, capsys, extra,
                                                                                needle) -> None:
    # The values are checked in a re-dump of the template without its comments: a line number of
    # that copy ("edge.yaml (+ provision flags):16:") pointed at an unrelated line of the template.
    assert main(["edge", "provision", "--root", str(rootfs), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{rootfs / 'etc/edgewise/edge.yaml'} (+ provision flags): {needle}" in err, err


def test_set_values_are_written_as_the_loader_reads_them(rootfs: Path) -> None:
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--set", "metrics.port=9200",
                 "--set", "streams.0.fps=7.5", "--set", "metrics.tegrastats=off",
                 "--set", "cloud.endpoints=gw1:1,gw2:2"]) == 0
    tree = yaml.safe_load((rootfs / "etc/edgewise/edge.yaml").read_text())
    assert tree["metrics"]["port"] == 9200 and tree["streams"][0]["fps"] == 7.5
    assert tree["metrics"]["tegrastats"] == "off"  # a string setting stays a string, not YAML's false
    assert tree["cloud"]["endpoints"] == ["gw1:1", "gw2:2"]


def test_the_written_settings_read_as_the_template_read(rootfs: Path) -> None:
    """The template was read by YAML 1.1 rules and written back: stream ids '01' and '010'
    (which the daemon reads from the template as those texts) were written as 1 and 8, and the
    device's streams, records and policy overrides took other names. Numbers keep their text."""
    config = rootfs / "etc/edgewise/edge.yaml"
    template = config.read_text().replace("streams:\n", "streams:\n  - {id: 01, kind: file, uri: /data/a.mp4}\n"
                                          "  - {id: 010, kind: file, uri: /data/b.mp4}\n", 1)
    config.write_text(template)
    before = load_settings(str(config), ["cloud.endpoints=gw:1"], env={})  # (the template's is a placeholder)
    assert [s.id for s in before.streams][:2] == ["01", "010"]
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--keep-identity",
                 "--set", "streams.0.uri=/data/1_000.mp4"]) == 0
    after = load_settings(str(config), env={})
    assert [s.id for s in after.streams] == [s.id for s in before.streams]
    assert after.streams[0].uri == "/data/1_000.mp4"


@pytest.mark.parametrize("how", ["mkstemp", "in-the-way"])
def test_an_unwritable_target_is_one_line_and_changes_nothing(rootfs: Path, tmp_path: Path, capsys, monkeypatch,
                                                              how: str) -> None:
    (tmp_path / "t").write_text("tok")
    if how == "mkstemp":  # what an immutable (chattr +i) or read-only folder answers
        def refuse(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")
        monkeypatch.setattr(PV.tempfile, "mkstemp", refuse)
    else:  # the last file of the run cannot be made: the ones before it must not change either
        (rootfs / "etc/default").write_text("a file where the folder goes")
    before = (rootfs / "etc/edgewise/edge.yaml").read_text()
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--token-file",
                 str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"edgewise: error: --root {rootfs}: ") and "cannot be written" in err and "\n" not in err
    assert (rootfs / "etc/edgewise/edge.yaml").read_text() == before
    assert [p.name for p in (rootfs / "etc/edgewise").iterdir()] == ["edge.yaml"]  # no temporary file left


def test_one_rootfs_provisioned_per_device_in_turn_never_carries_the_last_ones_identity(rootfs: Path,
                                                                                       tmp_path: Path,
                                                                                       capsys) -> None:
    """The flash flow provisions one rootfs for each device in turn. Device 2, given only its
    token, got device 1's id and client key; device 3, given no token, got device 2's (found by
    a probe). A run that leaves another device's identity in place is refused, naming it;
    ``--new-device`` removes what is not given, ``--keep-identity`` keeps it."""
    pki = Pki(tmp_path)
    pki.issue("c17", "cam-17")
    for name in ("t17", "t18"):
        (tmp_path / name).write_text(f"tok-{name}")
    cfg, env, tls = rootfs / "etc/edgewise/edge.yaml", rootfs / "etc/default/edgewise-edge", rootfs / "etc/edgewise/tls"
    base = ["edge", "provision", "--root", str(rootfs), "--endpoint", "gw.plant.lan:50051"]
    assert main(base + ["--device-id", "cam-17", "--token-file", str(tmp_path / "t17"), "--ca",
                        str(tmp_path / "ca.pem"), "--cert", str(tmp_path / "c17.pem"), "--key",
                        str(tmp_path / "c17.key")]) == 0
    first = (cfg.read_text(), env.read_text())
    capsys.readouterr()

    assert main(base + ["--token-file", str(tmp_path / "t18")]) == 2  # device 2: its token only
    err = capsys.readouterr().err
    assert "already holds a device's identity that this run does not replace: device id 'cam-17'" in err
    assert "a client certificate and key (--cert/--key)" in err and "--new-device" in err and "\n" not in err.strip()
    assert (cfg.read_text(), env.read_text()) == first and (tls / "client.key").exists()  # nothing written

    assert main(base + ["--new-device", "--token-file", str(tmp_path / "t18")]) == 0
    s = load_settings(str(cfg), env={"EDGEWISE_EDGE__CLOUD__TOKEN": "x"})
    assert s.device_id == "" and (s.cloud.tls_cert, s.cloud.tls_key) == ("", "")  # the serial number, no mTLS
    assert s.cloud.tls_ca == "/etc/edgewise/tls/ca.pem" and (tls / "ca.pem").exists()  # the fleet's CA stays
    assert not (tls / "client.key").exists() and not (tls / "client.pem").exists()
    assert env.read_text().splitlines()[-1] == "EDGEWISE_EDGE__CLOUD__TOKEN=tok-t18"

    assert main(base + ["--device-id", "cam-19"]) == 2  # device 3 forgot its token
    assert "a token in" in capsys.readouterr().err
    assert main(base + ["--device-id", "cam-19", "--new-device"]) == 0
    assert "EDGEWISE_EDGE__CLOUD__TOKEN" not in env.read_text()
    assert _mode(env) == 0o600

    # the same device again, a new endpoint only: its identity stays
    assert main(base[:-1] + ["gw2.plant.lan:50051", "--keep-identity"]) == 0
    s = load_settings(str(cfg), env={})
    assert s.device_id == "cam-19" and s.cloud.endpoints == ["gw2.plant.lan:50051"]
    with pytest.raises(SystemExit):  # one or the other (argparse's usage error)
        main(base + ["--new-device", "--keep-identity"])



def _need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed; `make test` installs it with apt-get")
    return path


def systemd_reads(env_file: Path, tmp: Path) -> str:
    """The token as systemd reads ``env_file``. systemd reads an ``EnvironmentFile=`` and an
    os-release file with one parser (src/basic/env-file.c, ``parse_env_file_internal``), and no
    service manager runs here: so the file, its token line named ``ID``, is a root's os-release,
    and systemd-tmpfiles writes that ID (its ``%o`` specifier) into a file."""
    root = tmp / "systemd-root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text(env_file.read_text().replace(PV.TOKEN_VAR + "=", "ID=", 1))
    (tmp / "read.conf").write_text("f /token 0600 - - - %o\n")
    subprocess.run([_need("systemd-tmpfiles"), f"--root={root}", "--create", str(tmp / "read.conf")], check=True,
                   capture_output=True)
    return (root / "token").read_text()


def sh_reads(env_file: Path) -> str:
    """The token as the package's postinst reads ``env_file``: sourced by /bin/sh with ``set -a``."""
    proc = subprocess.run(["/bin/sh", "-c", f'set -a; . "$1"; set +a; printf %s "${PV.TOKEN_VAR}"', "sh",
                           str(env_file)], capture_output=True, text=True, env={"HOME": "/home-of-sh"}, check=True)
    return proc.stdout


ALL_PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F))


@pytest.mark.parametrize("token", [
    "!", "~", ALL_PRINTABLE, ALL_PRINTABLE[::-1],  # the ends of the gateway's set, all of it
    '"', "'", "\\", "$", "`", "abc\\", "\\n", 'a"b\'c', "$HOME", "${HOME}", "$(id)", "`id`",  # quotes, escapes, expansions
    "~root", "a:~/b", "#not-a-comment", ";x", "%h%n%%",  # a tilde prefix, a comment, a separator, specifiers
])
def test_every_token_the_gateway_takes_is_provisioned_and_read_back_as_it_is(rootfs: Path, tmp_path: Path, capsys,
                                                                            token: str) -> None:
    """The gateway takes any printable ASCII token without blanks (``bearer_token_problem``);
    provisioning took letters, digits and ``._~+/=:-`` only, and wrote them unquoted, so a
    shell sourcing the file (the postinst) expanded ``~root`` and ``a:~/b``. A token with other
    characters is written in single quotes (a ``'`` between quoted runs, in double quotes):
    systemd (its own parser) and /bin/sh read back the very token, and the daemon's loader takes
    it. No backslash is written: in double quotes systemd 241-246 (JetPack 5.1 has 245) keeps
    the one before ``\\``, ``$`` and a backquote, where the shell and this systemd (252) drop it.
    Docker's ``--env-file`` would keep the quotes: provisioning says what to do instead."""
    assert bearer_token_problem(token) is None  # the gateway would take it
    (tmp_path / "token").write_text(token + "\n")
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--token-file",
                 str(tmp_path / "token")]) == 0
    env = rootfs / "etc/default/edgewise-edge"
    line = env.read_text().splitlines()[-1]
    assert re.fullmatch(PV.TOKEN_VAR + r"""=(?:'[^']*'|"'")+""", line), line  # single quotes, "'" between
    assert systemd_reads(env, tmp_path) == token
    assert sh_reads(env) == token
    s = load_settings(str(rootfs / "etc/edgewise/edge.yaml"), env={PV.TOKEN_VAR: sh_reads(env)})
    assert s.cloud.token == token
    err = capsys.readouterr().err
    assert "`docker run --env-file` would pass the quotes on" in err and f"-e {PV.TOKEN_VAR}" in err


@pytest.mark.parametrize("token", ["a b", "tab\there", "caf\u00e9", "del\x7f", "ctl\x01x", "cr\rlf"])
def test_a_token_the_gateway_refuses_is_refused_with_the_gateways_reason(rootfs: Path, tmp_path: Path, capsys,
                                                                        token: str) -> None:
    """Provisioning refuses what the gateway refuses (one rule, ``edgewise.ids``), and says why."""
    assert bearer_token_problem(token) is not None
    (tmp_path / "token").write_bytes(token.encode())
    assert main(["edge", "provision", "--root", str(rootfs), "--endpoint", "gw:1", "--token-file",
                 str(tmp_path / "token")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"edgewise: error: --token-file {tmp_path / 'token'}: the token {bearer_token_problem(token)}"
    assert not (rootfs / "etc/default").exists()


def test_a_running_device_is_told_to_restart_only_when_its_settings_or_token_changed(rootfs: Path, tmp_path: Path,
                                                                                       capsys, monkeypatch) -> None:
    """The daemon follows its TLS files (a renewed certificate is used from its next connection)
    but reads its settings and token at start: ``--root /`` said "restart" after every run."""
    said = []

    def spy(root: Path, restart: bool) -> str:
        said.append(restart)
        return real(root, restart)

    real = PV.next_step
    monkeypatch.setattr(PV, "next_step", spy)
    pki = Pki(tmp_path)
    pki.issue("c17", "cam-17")
    (tmp_path / "t17").write_text("tok-17")
    base = ["edge", "provision", "--root", str(rootfs), "--endpoint", "gw.plant.lan:50051", "--ca",
            str(tmp_path / "ca.pem"), "--keep-identity"]
    first = base + ["--device-id", "cam-17", "--token-file", str(tmp_path / "t17")]
    assert main(first + ["--cert", str(tmp_path / "c17.pem"), "--key", str(tmp_path / "c17.key")]) == 0
    assert said == [True]  # a fresh rootfs
    pki.issue("c17b", "cam-17")  # the certificate renewed
    assert main(first + ["--cert", str(tmp_path / "c17b.pem"), "--key", str(tmp_path / "c17b.key")]) == 0
    assert said == [True, False]
    assert (rootfs / "etc/edgewise/tls/client.pem").read_bytes() == (tmp_path / "c17b.pem").read_bytes()
    (tmp_path / "t17").write_text("tok-17-new")  # a new token
    assert main(first + ["--cert", str(tmp_path / "c17b.pem"), "--key", str(tmp_path / "c17b.key")]) == 0
    assert said == [True, False, True]
    assert main(base[:5] + ["gw2.plant.lan:50051"] + base[6:]) == 0  # a new endpoint
    assert said == [True, False, True, True]
    assert "systemctl restart" in real(Path("/"), True)
    assert real(Path("/"), False).startswith("next: nothing for this run: it changed only TLS files")
    assert "flash this rootfs" in real(rootfs, False)
