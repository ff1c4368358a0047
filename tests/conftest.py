"""Shared fixtures: real ONNX models built once per session, a real Mosquitto broker.

Models are architecture-exact YOLOv5 graphs with random weights built by
``edgewise_tools.models`` (the code ``edgewise model build`` runs), cached under
``.cache/test-models`` so repeated runs skip the torch export.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".cache" / "test-models"
DIGIT_NAMES = tuple(str(i) for i in range(10))


@pytest.fixture(autouse=True, scope="module")
def _garbage_of_a_module_collected_in_it() -> Iterator[None]:
    """An object a test module left unclosed (a socket, an event loop's transport) warns when the
    garbage collector meets it, and the warning fails whichever test is running then: a leak in
    ``test_mqtt_uplink.py``'s proxy failed a test of ``test_transports.py`` now and then, for two
    sessions. Collecting at the end of each module fails the module that leaked, every time."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """A test that runs a CLI gets ``edgewise.observability.setup_logging``'s root level (INFO)
    and its stderr handler (on that test's captured stream, closed after it); both are undone
    after the test. Left in place, every later test's ``caplog`` took INFO lines of whatever an
    earlier test left running (a CI run failed on a balancer's "readmitted" line in a spool
    test), and the handler wrote to a closed stream ("I/O operation on closed file")."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in list(root.handlers):
        if handler.get_name() == "edgewise":  # edgewise.observability's own (pytest's stay)
            root.removeHandler(handler)
    root.setLevel(level)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _built_model(arch: str, imgsz: int, nc: int, dynamic_hw: bool = False) -> Path:
    path = MODEL_CACHE / f"{arch}-{imgsz}-{nc}{'-dynhw' if dynamic_hw else ''}.onnx"
    if not path.exists():  # the Jetson lane's Python 3.8 has no torch: it uses the cached files
        from edgewise_tools.models import build_onnx

        MODEL_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        build_onnx(arch, imgsz=imgsz, nc=nc, path=tmp, names=DIGIT_NAMES[:nc] if nc <= 10 else None, seed=0,
                   dynamic_hw=dynamic_hw)
        if dynamic_hw:  # ask to run at native size, as the camera pair's cloud model does
            import onnx

            proto = onnx.load(str(tmp))
            prop = proto.metadata_props.add()
            prop.key, prop.value = "input_size", "native"
            onnx.save(proto, str(tmp))
        tmp.replace(path)
    return path


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """YOLOv5n at 160 px with 10 classes: the fast model for most tests."""
    return _built_model("yolov5n", 160, 10)


@pytest.fixture(scope="session")
def small_model() -> Path:
    """YOLOv5n at 320 px with 10 classes."""
    return _built_model("yolov5n", 320, 10)


@pytest.fixture(scope="session")
def native_model() -> Path:
    """YOLOv5n trained-size 160 with a symbolic height/width and ``input_size: native``."""
    return _built_model("yolov5n", 160, 10, dynamic_hw=True)


def mosquitto_binary() -> str:
    for cand in (shutil.which("mosquitto"), "/usr/sbin/mosquitto"):
        if cand and os.path.exists(cand):
            return cand
    pytest.skip("mosquitto is not installed (make test installs it with apt-get)")
    raise AssertionError  # unreachable


class Broker:
    """A running Mosquitto broker on 127.0.0.1:port (MQTT v5, anonymous)."""

    def __init__(self, port: int, proc: subprocess.Popen[bytes], conf: Path) -> None:
        self.host = "127.0.0.1"
        self.port = port
        self.proc = proc
        self.conf = conf

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def start(self) -> None:
        """(Re)start on the same port, e.g. after ``stop()`` in a broker-restart test."""
        self.proc = _spawn_mosquitto(self.conf, self.port)


def _spawn_mosquitto(conf: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [mosquitto_binary(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        wait_until(listening, 10, f"mosquitto listening on port {port}", interval=0.05)
    except AssertionError:
        proc.kill()
        proc.wait()
        raise
    return proc


@contextlib.contextmanager
def configured_mosquitto(extra: str = "", users: Optional[Dict[str, str]] = None, acl: Optional[str] = None,
                         port: int = 0, persistence: bool = False) -> Iterator[Broker]:
    """A real Mosquitto 2.x broker on a free port (or ``port``) with ``extra`` config lines,
    stopped at the end. With ``users`` (name -> password): no anonymous clients and a password
    file; with ``acl``: that ACL text (``broker.conf.parent / "acl"``: rewrite it and send SIGHUP
    to change it); with ``persistence``: sessions and queued messages survive ``stop()``/``start()``."""
    mosquitto_binary()
    port = port or free_port()
    d = Path(tempfile.mkdtemp(prefix="ew-mosq-"))
    # run as root, mosquitto drops to its own user: it reads its files, and writes its database, here
    d.chmod(0o777 if persistence else 0o755)
    lines = [f"listener {port} 127.0.0.1"]
    if users:
        passwd = d / "passwd"
        for i, (user, pw) in enumerate(users.items()):
            subprocess.run(["mosquitto_passwd", "-b", *(["-c"] if i == 0 else []), str(passwd), user, pw],
                           check=True, capture_output=True)
        passwd.chmod(0o644)
        lines += ["allow_anonymous false", f"password_file {passwd}"]
    else:
        lines.append("allow_anonymous true")
    if acl is not None:
        (d / "acl").write_text(acl)
        (d / "acl").chmod(0o644)
        lines.append(f"acl_file {d / 'acl'}")
    if persistence:
        lines += ["persistence true", f"persistence_location {d}/"]
    conf = d / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n" + extra + "\n")
    broker = Broker(port, _spawn_mosquitto(conf, port), conf)
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def dynsec_mosquitto() -> Iterator[Tuple[Broker, List[str]]]:
    """A real Mosquitto with the dynamic security plugin (its ACL is checked on SUBSCRIBE: a
    denied subscription's SUBACK says Not authorized, where ``acl_file`` grants it and delivers
    nothing; and changed while it runs); yields the broker and the ``mosquitto_ctrl`` command
    that changes it (as its admin)."""
    plugins = glob.glob("/usr/lib/*/mosquitto_dynamic_security.so") + glob.glob("/usr/lib/mosquitto_dynamic_security.so")
    if not plugins or shutil.which("mosquitto_ctrl") is None:
        pytest.skip("Mosquitto's dynamic security plugin or mosquitto_ctrl is not installed")
    d = tempfile.mkdtemp(prefix="ew-dynsec-")
    try:
        os.chmod(d, 0o777)  # mosquitto, dropped to its own user, saves its changes here
        path = os.path.join(d, "dynsec.json")
        subprocess.run(["mosquitto_ctrl", "dynsec", "init", path, "admin", "admin-pass"], check=True,
                       capture_output=True)
        os.chmod(path, 0o666)
        with configured_mosquitto(f"plugin {plugins[0]}\nplugin_opt_config_file {path}") as broker:
            yield broker, ["mosquitto_ctrl", "-h", broker.host, "-p", str(broker.port), "-u", "admin",
                           "-P", "admin-pass", "dynsec"]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def running_mosquitto() -> contextlib.AbstractContextManager[Broker]:
    """A real Mosquitto broker on a free port with persistence (sessions and queued messages
    survive ``stop()``/``start()``), stopped at the end."""
    return configured_mosquitto("max_inflight_messages 100", persistence=True)


@pytest.fixture
def mosquitto() -> Iterator[Broker]:
    """A real Mosquitto broker for one test (``running_mosquitto``)."""
    with running_mosquitto() as broker:
        yield broker


class SmallFilesystem:
    """A real tmpfs of a few hundred KiB mounted on a temporary folder (the disk-full tests)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0, name: str = "filler") -> Path:
        """Write a file that leaves ``leave`` bytes free (another process filling the disk)."""
        ballast = self.path / name
        with open(ballast, "ab", buffering=0) as f:  # unbuffered: nothing left to flush at close
            chunk = b"\0" * 4096
            try:
                while self.free() > leave:
                    f.write(chunk[: max(1, min(4096, self.free() - leave))])
            except OSError:
                pass  # ENOSPC: full (another writer may have taken the last blocks first)
        return ballast


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[[int], SmallFilesystem]]:
    """``small_fs(size_bytes)`` mounts a real tmpfs of that size (``mount -t tmpfs``, as
    root); the test is skipped, with the reason, where mounting is not possible."""
    mounted: List[Path] = []

    def mount(size: int) -> SmallFilesystem:
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounted.append(d)
        return SmallFilesystem(d, size)

    try:
        yield mount
    finally:
        for d in reversed(mounted):
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


class TopicRecorder:
    """Records every message on an MQTT topic filter, across broker restarts: a persistent
    MQTT v5 session (clean start off, one hour expiry, QoS 1), so the broker keeps what is
    published while the recorder reconnects. ``messages`` are (topic, payload) in arrival
    order. A QoS 1 delivery the broker repeats to this subscriber after a restart carries
    the DUP flag (MQTT v5 3.3.1.1; the flag of the publisher's packet is not passed on):
    such a repeat of a payload already received is counted in ``redelivered``, not
    recorded, so ``messages`` is what publishers put on the topic."""

    def __init__(self, broker: Broker, topic: str, client_id: str = "topic-recorder") -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.messages: List[Tuple[str, bytes]] = []
        self.redelivered = 0
        self._seen: Set[Tuple[str, bytes]] = set()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(min_delay=1, max_delay=2)
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.client.on_message = lambda c, u, msg: self._got(msg)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect(broker.host, broker.port, clean_start=False, properties=props)
        self.client.loop_start()
        if not self.subscribed.wait(10):
            raise RuntimeError(f"could not subscribe to {topic}")

    def _got(self, msg: Any) -> None:
        item = (msg.topic, bytes(msg.payload))
        if msg.dup and item in self._seen:
            self.redelivered += 1
            return
        self._seen.add(item)
        self.messages.append(item)

    def json(self) -> List[Dict[str, Any]]:
        return [json.loads(p) for _, p in list(self.messages)]

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()



def in_process_cloud_class() -> Any:
    """``tests.realcloud.InProcessCloud``; skips the test on a Python the cloud tier does not
    run on (the Jetson lane's 3.8, which escalates to a gateway process instead:
    tests/deploy/test_jetson_lane.py)."""
    if sys.version_info < (3, 10):
        pytest.skip("the in-process cloud tier needs Python >= 3.10 (the Jetson lane checks the device "
                    "against a gateway process instead)")
    from tests.realcloud import InProcessCloud

    return InProcessCloud


@pytest.fixture(scope="session")
def _in_process_cloud(tiny_model: Path) -> Iterator[Any]:
    InProcessCloud = in_process_cloud_class()

    with InProcessCloud(tiny_model) as cloud:
        yield cloud


@pytest.fixture
def real_cloud(_in_process_cloud: Any) -> Iterator[Any]:
    """The real gateway in front of one real worker (tiny model), in-process on port 0
    (``tests.realcloud.InProcessCloud``), shared by the tests of a session: whole at
    the start of each test, made whole again after it (a stopped worker or gateway is
    restarted, a blocked worker released)."""
    cloud = _in_process_cloud
    yield cloud
    cloud.restore()
