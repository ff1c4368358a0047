"""``edgewise edge provision``: one device's identity and secrets, written into a root.

``--root`` is ``Linux_for_Tegra/rootfs`` (with the bundle's overlay unpacked) before
flashing one device, or ``/`` on a running device. Written there, each file atomically:

| file | mode | owner | holds |
|---|---|---|---|
| ``etc/edgewise/edge.yaml`` | 0640 | root:edgewise | settings: device id, endpoints, certificate paths (no secret) |
| ``etc/default/edgewise-edge`` | 0600 | root:root | ``EDGEWISE_EDGE__CLOUD__TOKEN=...``: systemd reads it as root (``EnvironmentFile=``) and hands it to the daemon only (``env_value`` writes it) |
| ``etc/edgewise/tls/ca.pem``, ``client.pem`` | 0644 | root:root | CA bundle, client certificate |
| ``etc/edgewise/tls/client.key`` | 0640 | root:edgewise | client key, readable by the daemon's group |

A rootfs has no ``edgewise`` group until first boot (systemd-sysusers makes it), so there
the group-owned files are root's and the bundle's tmpfiles snippet hands them to the group
at boot (``z`` lines); ``--group GID`` sets a numeric group instead (the L4T container's
10001). The settings are validated before anything is written: a placeholder endpoint left
in the template is refused, as the daemon would refuse it. Layout and reasons:
``deploy/jetson/README.md``, "Provision devices".
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from edge.settings import SCHEMA
from edge.tlsfiles import certificate_warnings, check_ca, check_pair
from edgewise import yamlnodes
from edgewise.errors import ConfigError, InvalidInputError
from edgewise.filereads import read_small
from edgewise.ids import bearer_token_problem
from edgewise.outputs import fsync_dir

CONFIG = "etc/edgewise/edge.yaml"
ENV_FILE = "etc/default/edgewise-edge"
TLS_DIR = "etc/edgewise/tls"
TOKEN_VAR = "EDGEWISE_EDGE__CLOUD__TOKEN"
GROUP = "edgewise"
#: A value of the environment file that means the same, unquoted, to each of its readers:
#: systemd (``EnvironmentFile=``, systemd.exec(5)), a POSIX shell that sources it (the package's
#: postinst) and ``docker run --env-file`` (the L4T container), which takes the line literally,
#: quotes and backslashes included. ``~`` is not one: a shell expands it at the start of a value
#: or after a ``:``.
_LITERAL_VALUE = re.compile(r"[A-Za-z0-9._+/=:-]+")


def register(subparsers: Any) -> None:
    """Add ``provision`` to the ``edge`` group."""
    p = subparsers.add_parser(
        "provision", help="write one device's config, token and client certificate into a root",
        description="Write one device's settings, bearer token and TLS client certificate into a rootfs "
                    "(Linux_for_Tegra/rootfs before flashing) or onto a running device (--root /).")
    p.add_argument("--root", required=True, help="target root: Linux_for_Tegra/rootfs, or / on the device")
    p.add_argument("--device-id", default=None,
                   help="device id (default: keep the template's; empty: the Jetson's serial number)")
    p.add_argument("--endpoint", action="append", default=[], metavar="HOST:PORT",
                   help="gateway address (repeatable; replaces the template's endpoints)")
    p.add_argument("--token-file", default=None, help="file holding the device's bearer token ('-': stdin)")
    p.add_argument("--ca", default=None, help="PEM CA bundle of the gateway (enables TLS)")
    p.add_argument("--cert", default=None, help="PEM client certificate (mutual TLS, with --key)")
    p.add_argument("--key", default=None, help="PEM client key (mutual TLS, with --cert)")
    p.add_argument("--template", default=None,
                   help=f"settings to start from (default: ROOT/{CONFIG}, as the bundle installed it)")
    p.add_argument("--set", dest="settings_set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="set any other setting (repeatable), e.g. streams.0.fps=10")
    p.add_argument("--group", type=int, default=None,
                   help="numeric group of the daemon's readable files (default: ROOT's edgewise group)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--new-device", action="store_true",
                       help="another device than the one ROOT holds: the identity not given is removed (device "
                            "id: the serial number; no client certificate; no token)")
    which.add_argument("--keep-identity", action="store_true",
                       help="the device ROOT holds: its device id, client certificate and token stay unless given")
    p.set_defaults(func=_handler)


def _read(path: str, what: str) -> bytes:
    try:
        return read_small(path, f"{what} {path}")  # capped: --token-file /dev/zero filled the memory
    except OSError as exc:
        raise InvalidInputError(f"{what} {path}: cannot be read ({exc.strerror})") from None


def read_token(path: str) -> str:
    """The token in ``path`` without surrounding blanks (a file's last newline), checked by the
    rule of the gateway's device tokens and the daemon's ``cloud.token``
    (``edgewise.ids.bearer_token_problem``): every token the gateway takes can be provisioned."""
    token = _read(path, "--token-file").decode("utf-8", "replace").strip()
    if not token:
        raise InvalidInputError(f"--token-file {path}: is empty")
    bad = bearer_token_problem(token)
    if bad:
        raise InvalidInputError(f"--token-file {path}: the token {bad}")
    return token


def env_value(value: str) -> str:
    """``value`` (one line) as the right side of a line of the environment file, read back as
    ``value`` by systemd (``EnvironmentFile=``) and by a POSIX shell that sources the file: as
    it is where it has only ``_LITERAL_VALUE`` characters (so ``docker run --env-file``, which
    takes it literally, reads it too), else in single quotes, each ``'`` in it written ``"'"``
    between two quoted runs (``'it'"'"'s'``). Within single quotes every character is itself to
    both, and both join quoted runs into one value. Double quotes alone would not do: systemd
    245 (JetPack 5.1) keeps the backslash of ``\\\\``, ``\\$`` and ``\\` `` in them, where a shell
    and systemd from 247 drop it."""
    if _LITERAL_VALUE.fullmatch(value):
        return value
    return "\"'\"".join(f"'{run}'" if run else "" for run in value.split("'"))


#: the largest group id (``chown`` reads 2**32 - 1 as "leave the group as it is")
MAX_GID = 2 ** 32 - 2


def _root_text(path: Path) -> str:
    """A text file of the target root as it is: bytes that are not UTF-8 (a Latin-1 comment,
    a group name) read as surrogates that :func:`_env_file` writes back unchanged, instead of a
    UnicodeDecodeError traceback."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def group_id(root: Path, name: str = GROUP) -> Optional[int]:
    """The gid of ``name`` in ``root``'s ``/etc/group``, or None."""
    try:
        for line in _root_text(root / "etc/group").splitlines():
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] == name and parts[2].isdigit():
                return int(parts[2])
    except OSError:
        pass
    return None


def _set(tree: Dict[str, Any], dotted: str, value: Any, flag: str = "") -> None:
    """Set ``a.b.0.c`` in a YAML tree (list items by index, as ``--set`` addresses them);
    missing mappings are made. A path the tree cannot hold is an error naming ``flag``."""
    node: Any = tree
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        key: Any = part
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise InvalidInputError(f"{flag or dotted}: {'.'.join(parts[:i])} has no item {part} (items 0 to "
                                        f"{len(node) - 1}); add it in the template")
            key = int(part)
        elif not isinstance(node, dict):
            raise InvalidInputError(f"{flag or dotted}: {'.'.join(parts[:i])} is a single value; it has no key "
                                    f"{part!r}")
        if i == len(parts) - 1:
            node[key] = value
            return
        child = node[key] if isinstance(node, list) else node.get(key)
        if child is None:
            child = node[key] = {}
        node = child


def _typed(settings: Any, dotted: str) -> Any:
    """The value at ``dotted`` in the loaded settings, as YAML writes it (a list for a tuple)."""
    node = settings
    for part in dotted.split("."):
        if dataclasses.is_dataclass(node):
            node = getattr(node, part)
        elif isinstance(node, (list, tuple)):
            node = node[int(part)]
        else:
            node = node[part]
    return _plain(node)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _check(tree: Dict[str, Any], template: Path, overrides: List[str], token: Optional[str]) -> Any:
    """``tree`` (and ``overrides``) through the daemon's own loader; its error names the
    template (or the ``--set`` flag) instead of the scratch file, without the scratch file's
    line: ``tree`` is re-dumped without the template's comments and with the flags' values,
    so that line is no line of the template (``--endpoint gw`` was blamed on a line 16 that
    held something else)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "edge.yaml"
        probe.write_text(yaml.dump(tree, Dumper=yamlnodes.Dumper, sort_keys=False))
        env = {TOKEN_VAR: token} if token else {}
        try:
            return SCHEMA.load(str(probe), overrides, env=env)
        except ConfigError as exc:
            where = f"{template} (+ provision flags)"
            raise ConfigError(re.sub(re.escape(str(probe)) + r"(:\d+)?", lambda _m: where, str(exc))) from None


def _token_line(root: Path) -> bool:
    try:
        return any(ln.startswith(TOKEN_VAR + "=") for ln in _root_text(root / ENV_FILE).splitlines())
    except OSError:
        return False


def _client_files(root: Path) -> List[Path]:
    return [p for p in (root / TLS_DIR / "client.pem", root / TLS_DIR / "client.key") if p.exists()]


def stale_identity(args: argparse.Namespace, root: Path, tree: Dict[str, Any]) -> List[str]:
    """What of a device's identity ``root`` (and the settings ``tree`` starts from) holds that
    this run does not replace. Provisioning one rootfs per device in turn carried the previous
    device's id, client key and token to the next (found by a probe)."""
    stale = []
    if args.device_id is None and tree.get("device_id"):
        stale.append(f"device id {tree['device_id']!r} (--device-id)")
    cloud: Dict[str, Any] = tree["cloud"] if isinstance(tree.get("cloud"), dict) else {}
    if not args.cert and (_client_files(root) or cloud.get("tls_cert") or cloud.get("tls_key")):
        stale.append("a client certificate and key (--cert/--key)")
    if not args.token_file and _token_line(root):
        stale.append(f"a token in {root / ENV_FILE} (--token-file)")
    return stale


def settings_tree(args: argparse.Namespace, root: Path, token: Optional[str]) -> Tuple[Dict[str, Any], Path]:
    """The device's settings as a YAML tree, checked with the daemon's own loader."""
    template = Path(args.template) if args.template else root / CONFIG
    if not template.is_file():
        raise InvalidInputError(f"{template}: no settings to start from; unpack the bundle's overlay into "
                                "--root first (or install the .deb), or pass --template")
    try:
        # the daemon's reader of settings files: UTF-8 checked, size capped (a binary template was a traceback)
        text = yamlnodes.decode(yamlnodes.read_bytes(template, "edge settings"), str(template), "edge settings")
        tree = yamlnodes.load_as_written(text) or {}  # numbers as written: read as the daemon reads them
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{template}: cannot be read as YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{template}: the settings must be a YAML mapping (key: value), not "
                          f"{type(tree).__name__}")
    stale = stale_identity(args, root, tree)
    if stale and not (args.new_device or args.keep_identity):
        raise InvalidInputError(
            f"--root {root} already holds a device's identity that this run does not replace: {'; '.join(stale)}. "
            "For another device add --new-device (what is not given is removed: the serial number as its id, "
            "no client certificate, no token); to provision the same device again add --keep-identity")
    if args.new_device:
        tree.pop("device_id", None)
        if not args.cert and isinstance(tree.get("cloud"), dict):
            tree["cloud"].pop("tls_cert", None)
            tree["cloud"].pop("tls_key", None)
    if args.device_id is not None:
        tree["device_id"] = args.device_id
    if args.endpoint:
        _set(tree, "cloud.endpoints", list(args.endpoint))
    if bool(args.cert) != bool(args.key):
        raise InvalidInputError("--cert and --key go together (mutual TLS)")
    for flag, name, key in (("ca", "ca.pem", "tls_ca"), ("cert", "client.pem", "tls_cert"),
                            ("key", "client.key", "tls_key")):
        if getattr(args, flag):
            _set(tree, f"cloud.{key}", f"/{TLS_DIR}/{name}")
    if args.settings_set:
        # The loader checks each --set (key path, value) as the daemon's --set; the file then
        # holds each value as the loader read it (metrics.port=9200 an integer, "off" a string).
        scratch = copy.deepcopy(tree)  # a path through a single value or past a list's end, named
        for item in args.settings_set:
            key, eq, value = item.partition("=")
            if eq:
                _set(scratch, key.strip(), value, f"--set {key.strip()}")
        loaded = _check(tree, template, list(args.settings_set), token)
        for item in args.settings_set:
            key = item.partition("=")[0].strip()
            _set(tree, key, _typed(loaded, key), f"--set {key}")
    _check(tree, template, [], token)  # the daemon's loader judges the file that is written
    return tree, template


def _write_all(root: Path, plan: List[Tuple[Path, bytes, int, int]], remove: List[Path]) -> None:
    """Write every file of ``plan`` beside its target first, then move them all in place and
    delete ``remove``: a target that cannot be written (not root, a read-only or immutable
    folder) stops the run before any file changes, with one line naming it. Each file is
    fsync'd before its rename and the folders after: a device provisioned in place (``--root /``)
    whose power was cut within ext4's writeback delay found its new edge.yaml, token or key
    empty under its name, and the daemon refused to start."""
    staged: List[Tuple[str, Path]] = []
    current = plan[0][0] if plan else root
    try:
        for path, data, mode, gid in plan:
            current = path
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=f".{path.name}.")
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # (renamed unsynced, a power cut could leave the file empty under its name)
            os.chmod(tmp, mode)
            if os.geteuid() == 0:
                os.chown(tmp, 0, gid)
        for tmp, path in staged:
            current = path
            os.replace(tmp, path)
        for path in remove:
            current = path
            path.unlink()
        for folder in sorted({str(path.parent) for path, _, _, _ in plan} | {str(path.parent) for path in remove}):
            fsync_dir(folder)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InvalidInputError(f"--root {root}: {current} cannot be written ({why}); run as root (sudo), and "
                                "check that the folder is not read-only (a mount) or immutable (lsattr)") from None
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _env_file(existing: Path, token: Optional[str]) -> bytes:
    """``existing``'s lines with the token line replaced (``None``: removed)."""
    lines: List[str] = []
    if existing.is_file():
        lines = [ln for ln in _root_text(existing).splitlines() if not ln.startswith(TOKEN_VAR + "=")]
    if not lines:
        lines = ["# Environment of edgewise-edge.service (root only: systemd reads it before dropping privileges)."]
    if token is not None:
        lines.append(f"{TOKEN_VAR}={env_value(token)}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _needs_restart(root: Path, plan: List[Tuple[Path, bytes, int, int]]) -> bool:
    """Whether writing ``plan`` changes what a running daemon reads only at start: its settings
    or its token. The files under ``TLS_DIR`` it follows while it runs (a renewed certificate or
    CA bundle is used from its next connection)."""
    for path, data, _, _ in plan:
        if path.parent == root / TLS_DIR:
            continue
        try:
            if path.read_bytes() != data:
                return True
        except OSError:
            return True
    return False


def provision(args: argparse.Namespace) -> Tuple[List[Tuple[Path, int, int]], bool]:
    """Write the files; returns ``(path, mode, gid)`` of each, and whether a running daemon must
    be restarted to read them (the settings or the token changed, not only TLS files)."""
    root = Path(args.root)
    if not root.is_dir():
        raise InvalidInputError(f"--root {root}: not a directory")
    if args.group is not None and not 0 <= args.group <= MAX_GID:
        # chown takes -1 (and 2**32 - 1) as "leave the group", and fails on what exceeds 32 bits
        raise InvalidInputError(f"--group {args.group}: not a group id; give the number 0..{MAX_GID} of the "
                                "daemon's group (leave it out for ROOT's edgewise group)")
    token = read_token(args.token_file) if args.token_file else None
    tree, template = settings_tree(args, root, token)
    gid = args.group if args.group is not None else (group_id(root) or 0)
    if args.ca:
        check_ca(args.ca, "--ca")
    if args.cert and args.key:
        check_pair(args.cert, args.key, "--cert", "--key")
        for warning in certificate_warnings(args.cert, str(tree.get("device_id") or "")):
            print(f"warning: {warning}", file=sys.stderr)
    plan: List[Tuple[Path, bytes, int, int]] = []
    for flag, name, mode in (("ca", "ca.pem", 0o644), ("cert", "client.pem", 0o644), ("key", "client.key", 0o640)):
        src = getattr(args, flag)
        if src:
            data = _read(src, f"--{flag}")
            if b"-----BEGIN " not in data:
                raise InvalidInputError(f"--{flag} {src}: not a PEM file (no -----BEGIN line)")
            plan.append((root / TLS_DIR / name, data, mode, gid if mode == 0o640 else 0))
    head = (f"# Written by `edgewise edge provision` from {template}.\n"
            "# Field reference: docs/settings/edge.md (`edgewise-edge edge run --describe-settings`).\n")
    plan.append((root / CONFIG, (head + yaml.dump(tree, Dumper=yamlnodes.Dumper, sort_keys=False)).encode(), 0o640,
                 gid))
    if token or (args.new_device and _token_line(root)):
        plan.append((root / ENV_FILE, _env_file(root / ENV_FILE, token), 0o600, 0))
        if token and env_value(token) != token:
            print(f"note: the token is written in quotes in {root / ENV_FILE}, as systemd and sh read it; "
                  "`docker run --env-file` would pass the quotes on as part of the token, so for the L4T "
                  f"container pass it with `-e {TOKEN_VAR}` from a shell that sourced the file "
                  "(deploy/jetson/README.md, \"L4T container\")", file=sys.stderr)
    remove = _client_files(root) if args.new_device and not args.cert else []
    restart = _needs_restart(root, plan)
    _write_all(root, plan, remove)
    return [(path, mode, owner_gid) for path, _, mode, owner_gid in plan], restart


def next_step(root: Path, restart: bool) -> str:
    """What the operator does after files were written into ``root``."""
    if root.resolve() != Path("/"):
        return ("next: flash this rootfs (deploy/jetson/README.md); provision the next device's files the same way, "
                "with --new-device")
    if restart:
        return "next: sudo systemctl restart edgewise-edge (it reads its settings and token at start)"
    return ("next: nothing for this run: it changed only TLS files, which a running daemon uses from its next "
            "connection (no restart); a settings or token change of an earlier run still needs "
            "`sudo systemctl restart edgewise-edge`")


def _handler(args: argparse.Namespace) -> int:
    written, restart = provision(args)
    for path, mode, gid in written:
        later = " (root's until first boot: systemd-tmpfiles gives it to edgewise)" if mode == 0o640 and not gid else ""
        print(f"wrote {path} (mode {mode:04o}, group {gid}){later}")
    if os.geteuid() != 0:
        print(f"note: not root: the files belong to uid {os.geteuid()}; run with sudo so they are root's")
    print(next_step(Path(args.root), restart))
    return 0
