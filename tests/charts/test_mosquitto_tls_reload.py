"""The chart broker follows its TLS files: Mosquitto reads them at start and on SIGHUP only, so
with ``tls.mqtt.enabled`` the broker pod runs a ``tls-reload`` container that signals it when
kubelet swaps in a renewed certificate or a rotated CA (files/mosquitto-tls-reload.sh).

The rendered pod is checked, and the script, as the rendered ConfigMap holds it, is run under
busybox's sh and applets (the broker image is Alpine; the host's sh and tools where busybox is
missing) against a real Mosquitto whose files are laid out and swapped as kubelet does it.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

from tests.charts.helm import CHART, MODES, named, render
from tests.cloud.gateway.pki import Pki
from tests.conftest import free_port, mosquitto_binary
from tests.secretvolume import SecretVolume
from tests.waiting import wait_until

SCRIPT = CHART / "files" / "mosquitto-tls-reload.sh"


def _broker(*sets: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    docs = render(*sets)
    return named(docs, "ConfigMap", "-mosquitto")["data"], named(docs, "Deployment", "-mosquitto")["spec"]["template"]["spec"]


def test_a_tls_broker_pod_signals_mosquitto_when_its_files_change() -> None:
    data, pod = _broker(*MODES["tls-on"])
    assert data["tls-reload.sh"] == SCRIPT.read_text()
    assert "pid_file /mosquitto/run/mosquitto.pid" in data["mosquitto.conf"].splitlines()[-1]
    assert pod["shareProcessNamespace"] is True  # the sidecar reaches mosquitto's pid
    mosquitto, reload = pod["containers"]
    assert reload["name"] == "tls-reload" and reload["image"] == mosquitto["image"]
    assert reload["command"] == ["sh", "/mosquitto/config/tls-reload.sh"]
    mounts = {m["mountPath"]: m for m in reload["volumeMounts"]}
    assert set(mounts) == {"/mosquitto/config", "/mosquitto/run", "/mosquitto/tls"}
    assert all(m["readOnly"] for m in mounts.values())
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert "subPath" not in mounts["/mosquitto/tls"] and tls["secret"]["secretName"] == "mqtt-tls"  # kubelet updates it

    data, pod = _broker(*MODES["broker-on"])  # no TLS: nothing to follow
    assert "tls-reload.sh" not in data and "pid_file" not in data["mosquitto.conf"]
    assert "shareProcessNamespace" not in pod and [c["name"] for c in pod["containers"]] == ["mosquitto"]


def _shell() -> Tuple[list, Dict[str, str]]:
    """busybox's sh with only its applets on PATH, as in the Alpine image; else the host's sh."""
    busybox = shutil.which("busybox")
    if busybox is None:
        return ["sh"], {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    applets = Path(tempfile.mkdtemp(prefix="ew-busybox-"))
    for name in ("sh", "readlink", "stat", "sleep", "cat"):
        (applets / name).symlink_to(busybox)
    return [str(applets / "sh")], {"PATH": str(applets)}


def _served_cn(port: int, ca: Path) -> str:
    """The common name of the certificate the broker serves a new connection now ("" while it
    does not answer: starting, or busy on a loaded machine)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s, \
                ctx.wrap_socket(s, server_hostname="localhost") as t:
            return str(dict(x[0] for x in t.getpeercert()["subject"])["commonName"])
    except (OSError, ssl.SSLError):
        return ""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the broker's own user can read and write (it drops root's rights)."""
    d = Path(tempfile.mkdtemp(prefix="ew-mosq-tls-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_renewed_certificate_is_served_once_the_sidecar_signals_the_broker(shared_dir, tmp_path) -> None:
    pki = Pki(tmp_path)
    for name in ("old", "new"):
        pki.issue(name, f"broker-{name}", "DNS:localhost,IP:127.0.0.1")

    def files(name: str) -> Dict[str, bytes]:
        return {"tls.crt": (tmp_path / f"{name}.pem").read_bytes(), "tls.key": (tmp_path / f"{name}.key").read_bytes(),
                "ca.crt": (tmp_path / "ca.pem").read_bytes()}

    def readable() -> None:
        subprocess.run(["chmod", "-R", "a+rX", str(shared_dir / "tls")], check=True)

    vol = SecretVolume(shared_dir / "tls", files("old"))
    readable()
    port = free_port()
    conf = shared_dir / "mosquitto.conf"
    conf.write_text(f"allow_anonymous true\nlistener {port} 127.0.0.1\ncertfile {vol.root}/tls.crt\n"
                    f"keyfile {vol.root}/tls.key\ncafile {vol.root}/ca.crt\npid_file {shared_dir}/mosquitto.pid\n")
    log = open(shared_dir / "broker.log", "wb")
    broker = subprocess.Popen([mosquitto_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    sh, env = _shell()
    script = shared_dir / "tls-reload.sh"
    script.write_text(_broker(*MODES["tls-on"])[0]["tls-reload.sh"])  # as the pod runs it
    said = shared_dir / "tls-reload.log"
    watch_log = open(said, "wb")
    watcher = subprocess.Popen([*sh, str(script)], env={**env, "TLS_DIR": str(vol.root), "INTERVAL": "1",
                                                         "PID_FILE": str(shared_dir / "mosquitto.pid")},
                               stdout=watch_log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _served_cn(port, tmp_path / "ca.pem") == "broker-old", 15, "the broker's certificate")
        # its first look signals too (it cannot know what the broker read at start)
        wait_until(lambda: "first look at the TLS files" in said.read_text(), 15, "the sidecar's first look")
        vol.update(files("new"))  # cert-manager renewed it; kubelet swaps ..data
        readable()
        wait_until(lambda: _served_cn(port, tmp_path / "ca.pem") == "broker-new", 15,
                   "the renewed certificate served without a restart")
        assert broker.poll() is None  # the same broker, reloaded
        wait_until(lambda: "TLS files changed in" in said.read_text(), 10, "the sidecar's line")  # said after the signal
    finally:
        watcher.terminate()
        watcher.wait(10)
        watch_log.close()
        broker.terminate()
        broker.wait(10)
        log.close()
    out = said.read_text()
    assert "TLS files changed in" in out and "sent SIGHUP to mosquitto" in out, out
    assert (shared_dir / "broker.log").read_text().count("Reloading config") == 2  # the first look, the renewal
