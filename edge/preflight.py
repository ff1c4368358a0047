"""What the edge daemon settles before it starts: who it is, where it writes, what it runs on.

* **Device id.** ``device_id`` when set; when empty, this Jetson's serial number
  (``/proc/device-tree/serial-number``, written by the bootloader from the module's
  EEPROM), else the host name. Devices flashed from one rootfs thus never share an id.
* **State folders.** The folders of ``spool.path`` and ``sinks.jsonl`` exist (created when
  missing) and this user can write them.
* **MQTT.** With ``cloud.mqtt.host`` set, paho-mqtt (the ``edge`` extra) is installed.
* **Backend.** The inference backend ``model.backend`` names is installed.

Each problem is one :class:`~edgewise.errors.EdgewiseError` line naming the setting or
file and what to do (the CLI prints it without a traceback). Callers: ``edge.daemon`` at
start, ``edgewise edge check-config``, ``edgewise edge provision``.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from typing import Iterable, List, Optional, Tuple, Union

from edge.settings import EdgeSettings, check_device_id, mqtt_outbox_path, transport_warning
from edge.spool import read_only
from edge.tlsfiles import check_files
from edgewise.errors import ConfigError, DeploymentError
from edgewise.settings import Invalid
from edgewise.systemdeps import require

log = logging.getLogger(__name__)

SERIAL_FILE = "/proc/device-tree/serial-number"
#: host names that name no device in particular
GENERIC_HOSTNAMES = frozenset({"", "localhost", "localhost.localdomain"})


def read_serial(path: str = SERIAL_FILE) -> str:
    """The Jetson serial number in ``path`` (NUL-terminated in the device tree)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(256)
    except FileNotFoundError:
        raise DeploymentError(f"{path} does not exist: not a Jetson, or /proc/device-tree is not "
                              "visible here (containers: bind-mount it read-only); set device_id") from None
    except OSError as exc:
        raise DeploymentError(f"{path}: cannot be read ({exc.strerror}); set device_id") from None
    serial = raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()
    if not serial:
        raise DeploymentError(f"{path} is empty; set device_id")
    return serial


def default_device_id(serial_path: str = SERIAL_FILE, hostname: Optional[str] = None) -> Tuple[str, str]:
    """``(id, where it came from)``: the serial number, else a host name that names a device."""
    try:
        return read_serial(serial_path), serial_path
    except DeploymentError as exc:
        why = str(exc)
    host = socket.gethostname() if hostname is None else hostname
    if host.split(".")[0] in GENERIC_HOSTNAMES:
        raise ConfigError(f"device_id: not set, and neither the serial number ({why}) nor the host name "
                          f"{host!r} identifies this device; set device_id in the daemon's settings")
    return host, "host name"


def resolve_device_id(s: EdgeSettings, serial_path: str = SERIAL_FILE, hostname: Optional[str] = None) -> str:
    """Fill an empty ``s.device_id`` (see the module docstring) and return it."""
    if s.device_id:
        return s.device_id
    dev, source = default_device_id(serial_path, hostname)
    try:
        check_device_id(dev)
    except Invalid as exc:
        raise ConfigError(f"device_id: the default from the {source} cannot be used ({exc.problem}); "
                          "set device_id") from None
    s.device_id = dev
    return dev


def identity_warning(dev: str, held: Iterable[str]) -> Optional[str]:
    """What to say when ``device_id`` is not set and the state the daemon found (``held``: the
    devices of the spool's escalations and of the records) is another device's: daemons before
    2026-12-01 defaulted to ``edge-0``, so an upgrade without ``device_id`` in edge.yaml renamed
    the device (its MQTT topics, idempotency keys and gateway token) without a word; None when
    nothing differs."""
    others = sorted(set(held) - {dev})
    if not others:
        return None
    names = ", ".join(repr(o) for o in others[:3]) + (" and more" if len(others) > 3 else "")
    return (f"device_id is not set, so this device is {dev!r} (its serial number, else its host name), but its "
            f"spool or records are of device {names} (an older daemon's default device_id was 'edge-0'): its "
            f"MQTT topics, frame keys and gateway token now follow {dev!r}; to keep the old identity set "
            f"device_id: {others[0]} in edge.yaml, or set device_id: {dev} to confirm the new one")


#: a file name to suggest when a state setting names a folder
DEFAULT_NAMES = {"spool.path": "spool.db", "sinks.jsonl": "detections.jsonl", "sinks.mqtt_outbox": "mqtt-outbox.db"}


def state_files(s: EdgeSettings) -> List[Tuple[str, str]]:
    """``(setting, path)`` of every file the daemon writes."""
    out = [("spool.path", s.spool.path)]
    if s.sinks.jsonl:
        out.append(("sinks.jsonl", s.sinks.jsonl))
    if s.sinks.mqtt:
        out.append(("sinks.mqtt_outbox", mqtt_outbox_path(s)))
    return out


def opens_spool(s: EdgeSettings) -> bool:
    """Whether the daemon opens ``spool.path``: only with a policy (without one it escalates
    nothing). Its folder is used either way: the instance lock and the start count live there."""
    return bool(s.policy_file)


def check_writable(setting: str, path: str, create: bool = True) -> None:
    """Fail unless this user can write ``path`` (creating its folder when missing; with
    ``create=False`` only check that the nearest existing folder above it would allow it)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"{setting} {path} is a folder; set {setting} to a file in it, "
                          f"e.g. {os.path.join(path, os.path.basename(DEFAULT_NAMES.get(setting, 'edgewise.db')))}")
    err = "permission denied"
    try:
        if create:
            os.makedirs(folder, exist_ok=True)
        probe = folder
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            ok, err = False, f"{probe} is not a folder"
        else:
            ok = os.access(probe, os.W_OK | os.X_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))
            if not ok and read_only(probe):
                err = "its filesystem is mounted read-only"
    except OSError as exc:
        ok, err = False, exc.strerror or str(exc)
    if not ok:
        raise DeploymentError(
            f"{setting} {path}: the folder {folder} cannot be written by uid {os.getuid()} ({err}); give "
            "the daemon's user that folder (Jetson: systemd-tmpfiles makes /var/lib/edgewise edgewise's; "
            "L4T container: chown the bind-mounted folder to uid 10001) or set " + setting)
    if os.path.isdir(folder):
        check_folder_owner(setting, path, folder)


def check_folder_owner(setting: str, path: str, folder: str) -> None:
    """Fail when another user could replace the daemon's files in ``folder`` with links: a
    folder of another user (not root), or one every user may write without the sticky bit.
    (A folder made in advance by someone else, ``/tmp/edgewise-dev``, had the daemon write its
    lock, start count and records through planted links, found by a probe.)"""
    st = os.stat(folder)
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        why = f"belongs to uid {st.st_uid}, not to the daemon's user (uid {me}) or root"
    elif st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        why = f"may be written by every user (mode {stat.S_IMODE(st.st_mode):04o}, no sticky bit)"
    else:
        return
    raise DeploymentError(
        f"{setting} {path}: the folder {folder} {why}: "
        "another user could replace the daemon's files there with links to other files; "
        "give the daemon a folder of its own (Jetson: /var/lib/edgewise) or set " + setting)


#: taken away from every file and folder the daemon makes (``edge run`` sets its umask with it):
#: the spool holds camera frames, the records what they show; nothing of it is for other users
#: (a umask of 000, say a container's or a shell's, made them world-readable). A stricter umask
#: stays as it is.
STATE_UMASK = 0o027


def tighten_state_files(s: EdgeSettings) -> List[str]:
    """Take ``STATE_UMASK`` away from the modes of the state files this user owns (the spool and
    the outbox with their ``-wal``/``-shm``, the start count, the lock, the records and their
    rotated files), as a file the daemon makes now gets. Daemons before 2026-12-05 did not: an
    upgraded device went on spooling camera frames into a 0644 spool. The lines to log."""
    from edge.instancelock import lock_path
    from edge.rotation import rotated_files

    paths = [s.spool.path + ".epoch", lock_path(s.spool.path)]
    for setting, path in state_files(s):
        if setting == "sinks.jsonl":
            paths += [path, lock_path(path, hidden=True)] + rotated_files(path)
        else:
            paths += [path, path + "-wal", path + "-shm"]
            if setting == "sinks.mqtt_outbox":
                paths.append(lock_path(path))
    done, failed = [], []
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or not mode & STATE_UMASK:
            continue
        try:
            os.chmod(path, mode & ~STATE_UMASK)
            done.append(f"{path} {mode:04o}")
        except OSError as exc:
            failed.append(f"{path} ({exc.strerror or exc})")
    lines = []
    if done:
        lines.append(f"state files other users could read or write, made by an older edgewise or under a looser umask, "
                     f"lose those rights now (at most 0640, as new ones): {', '.join(done)}")
    if failed:
        lines.append(f"state files other users can read or write, and their mode cannot be changed: "
                     f"{', '.join(failed)}; run chmod o-rwx,g-w on them")
    return lines


def check_state_dirs(s: EdgeSettings, create: bool = True) -> None:
    for setting, path in state_files(s):
        check_writable(setting, path, create)


def check_backend(s: EdgeSettings) -> str:
    """Which backend ``model.backend`` will run here; fails when it is not installed."""
    from edgewise.runtime.backends.onnxruntime import import_onnxruntime
    from edgewise.runtime.detector import tensorrt_unusable_reason

    backend, why_not = s.model.backend, ""
    if backend in ("tensorrt", "auto"):
        why_not = tensorrt_unusable_reason()
        if not why_not:
            return "tensorrt"
        if backend == "tensorrt":
            from edgewise.runtime.backends.tensorrt import import_tensorrt

            import_tensorrt()  # raises the install hint when the module is missing
            raise DeploymentError(f"model.backend tensorrt: {why_not}")
    try:
        import_onnxruntime()
    except DeploymentError as exc:
        if backend == "auto":
            raise DeploymentError(f"model.backend auto: TensorRT is not usable here ({why_not}) and {exc}") from None
        raise
    return "onnxruntime"


def check_sources(s: EdgeSettings) -> None:
    """Local sources (``file``, ``folder``) that cannot open: ``edgewise edge check-config``
    says so before the daemon starts (the daemon itself logs each and runs the others)."""
    from edge.sources.opencv import local_source_problem

    for i, st in enumerate(s.streams):
        problem = local_source_problem(st.kind, st.uri)
        if problem:
            raise ConfigError(f"streams[{i}] ({st.id}).uri: {problem}")


def check_state_files(s: EdgeSettings) -> None:
    """(``check-config``) What the daemon refuses at its start (exit 2) in the files it keeps,
    found without changing them: a ``sinks.jsonl`` it cannot open to append, a spool or MQTT
    outbox file that is not an SQLite database, or one that is another program's database.
    A spool or outbox that is ours but damaged (cut short too) is not refused: the daemon
    salvages it (``edge.spool_salvage.open_spool``, ``edge.outbox_salvage.open_outbox``);
    without a policy the daemon never opens the spool, so its file is not read either."""
    from edge.outbox_salvage import is_outbox_file
    from edge.sinks import open_appending
    from edge.spool_salvage import is_spool_file

    for setting, path in state_files(s):
        if setting == "sinks.jsonl":
            if os.path.exists(path):  # (open_appending refuses a FIFO or a device before opening it)
                open_appending(path).close()
            continue
        if setting == "spool.path" and not opens_spool(s):
            continue
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            continue
        if is_spool_file(path) if setting == "spool.path" else is_outbox_file(path):
            continue  # ours: opened, or salvaged when damaged (a file cut short too)
        tables = _sqlite_tables(path)
        if isinstance(tables, str):
            raise ConfigError(f"{setting} {path} is not a database ({tables}); the daemon refuses it: move it "
                              f"aside (a new one is made at the start) or set {setting}")
        if tables:
            what = "a spool" if setting == "spool.path" else "an MQTT sink outbox"
            raise ConfigError(f"{setting} {path} is another program's database (tables {', '.join(tables[:5])}), "
                              f"not {what}; set {setting} to a file of its own, or move this one aside")


def _sqlite_tables(path: str) -> Union[List[str], str]:
    """The tables of the SQLite file at ``path``, opened read-only, or why it cannot be read."""
    import sqlite3
    from urllib.parse import quote

    try:
        db = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        try:
            return [str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        finally:
            db.close()
    except sqlite3.Error as exc:
        return str(exc)


def check_metrics_host(s: EdgeSettings) -> None:
    """(``check-config``) The metrics endpoint's host must be an address of this machine (or a
    name for an IPv4 one): the daemon's HTTP server binds it at its start, IPv6 for an IPv6
    address. Bound here the same way at port 0 and released, so a daemon already running on
    the configured port does not fail the check."""
    if s.metrics.port < 0:
        return
    from edge.metrics import (
        metrics_family,  # (prometheus_client: only where check-config runs this)
    )

    try:
        with socket.socket(metrics_family(s.metrics.host), socket.SOCK_STREAM) as sock:
            sock.bind((s.metrics.host, 0))
    except OSError as exc:
        raise ConfigError(f"metrics.host {s.metrics.host!r} cannot be bound on this machine ({exc.strerror or exc}); "
                          "give one of its addresses, 0.0.0.0 for all, or 127.0.0.1") from None


def preflight(s: EdgeSettings, create: bool = True) -> List[str]:
    """Device id, TLS files, paho-mqtt when MQTT is configured, state folders (in that order);
    the lines to log about them (a TLS file that is usable but likely wrong is logged as a
    warning here)."""
    had_id = bool(s.device_id)
    dev = resolve_device_id(s)
    for warning in check_files(s.cloud.tls_ca, s.cloud.tls_cert, s.cloud.tls_key, dev):
        log.warning("%s", warning)
    unused = transport_warning(s)
    if unused:
        log.warning("%s", unused)
    if s.cloud.mqtt.host:  # the MQTT transport and sink: paho-mqtt, of the edge extra
        require("paho.mqtt.client")
    check_state_dirs(s, create)
    return [f"device id {dev}" + ("" if had_id else " (default: serial number, else host name)")]
