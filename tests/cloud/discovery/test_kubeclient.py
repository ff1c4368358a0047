"""The shared ``kubernetes`` client builder: a call's ``_request_timeout`` is its whole budget.

The client's default urllib3 retries (3) made one read of a hung API server take four times
the timeout (and a SIGTERM of the autoscaler wait for all of them). A real listening socket
that accepts and never answers plays the hung API server; the real client talks to it.
"""

from __future__ import annotations

import builtins
import errno
import logging
import os
import socket
import time
from pathlib import Path

import pytest

from cloud.autoscaler.kube import DeploymentScale, ScaleState
from cloud.discovery import kubeclient
from cloud.discovery.kubeclient import KubeAccess, build_api_client
from edgewise import filereads
from edgewise.errors import ConfigError, UnavailableError
from tests.listener import Listener


class HungAPI(Listener):
    """Accepts connections, reads the request, never answers; counts the connections."""

    def __init__(self) -> None:
        self.accepted = 0
        self.held: list[socket.socket] = []
        super().__init__()

    def on_connection(self, conn: socket.socket) -> None:
        self.accepted += 1
        self.held.append(conn)  # kept open, never answered

    def close(self) -> None:
        super().close()
        for c in self.held:
            c.close()


@pytest.fixture
def hung():
    api = HungAPI()
    yield api
    api.close()


def test_a_hung_api_server_costs_one_timeout_per_call(hung):
    target = DeploymentScale(build_api_client(KubeAccess(api_server=hung.url, token="t")), "ns", "w",
                             request_timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match=r"reading deployment ns/w scale: no answer within kubernetes.request_timeout_s \(0.5 s\)"):
        target.read()
    read_s = time.monotonic() - t0
    t0 = time.monotonic()
    with pytest.raises(UnavailableError, match=r"patching deployment ns/w scale: no answer within kubernetes.request_timeout_s"):
        target.apply(3, ScaleState(2, 2, "1"), "test")
    patch_s = time.monotonic() - t0
    assert hung.accepted == 2, "one attempt per call, no retries"
    assert read_s < 1.2 and patch_s < 1.2, (read_s, patch_s)


def test_every_way_of_building_the_client_makes_one_attempt(tmp_path, monkeypatch):
    from kubernetes.config import incluster_config

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    for access in (KubeAccess(api_server="http://127.0.0.1:9"), KubeAccess(kubeconfig=str(kubeconfig))):
        assert build_api_client(access).configuration.retries == 0, access
    # in-cluster: the service account files, at paths the loader reads them from
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("not checked until TLS is used")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "9")
    cfg = build_api_client(KubeAccess()).configuration
    assert cfg.retries == 0 and cfg.host == "https://127.0.0.1:9"


def _project_token(directory: Path, token: str, n: int) -> None:
    """Write ``token`` the way kubelet updates a projected volume: a new timestamped directory,
    then the ``..data`` symlink swapped to it atomically (``token`` links to ``..data/token``)."""
    (directory / f"..{n}").mkdir()
    (directory / f"..{n}" / "token").write_text(token + "\n")
    (directory / "..data_tmp").symlink_to(f"..{n}")
    (directory / "..data_tmp").replace(directory / "..data")
    if not (directory / "token").is_symlink():
        (directory / "token").symlink_to("..data/token")


def test_a_rotated_token_file_is_used_from_the_next_call(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The token was read from ``token_file`` once at start: when kubelet rotated the projected
    token, every call got 401 until a restart (and the autoscaler said the Role was missing)."""
    from tests.cloud.autoscaler.servers import ScaleAPI

    caplog.set_level(logging.INFO, logger="cloud.discovery.kubeclient")
    api = ScaleAPI(namespace="ns", name="w", token="first")
    try:
        _project_token(tmp_path, "first", 1)
        path = str(tmp_path / "token")
        target = DeploymentScale(build_api_client(KubeAccess(api_server=api.url, token="first", token_file=path)),
                                 "ns", "w")
        assert target.read().spec_replicas == 2
        api.token = "second"  # the API server accepts only the new token
        _project_token(tmp_path, "second", 2)
        assert target.read().spec_replicas == 2
        assert "changed: using the new token" in caplog.text
        (tmp_path / "..2" / "token").unlink()  # mid-swap or gone: the token in use is kept
        assert target.read().spec_replicas == 2
        assert "cannot read it" in caplog.text
        assert target.read().spec_replicas == 2
        assert caplog.text.count("cannot read it") == 1  # once per change, not at every call
        auths = [r[2]["authorization"] for r in api.requests]
        assert auths == ["Bearer first", "Bearer second", "Bearer second", "Bearer second"]
        # rotated while the file cannot be read for a moment (EIO, EMFILE): the same, unchanged
        # file is read again a second later, and the new token used (it was held until the next
        # rotation, about 48 min, while the old token expires at 60)
        api.token = "fourth"
        failing = [2]
        real_open = builtins.open

        def flaky_open(file, *args, **kwargs):
            if failing[0] and os.path.realpath(file) == os.path.realpath(path):
                failing[0] -= 1
                raise OSError(errno.EIO, os.strerror(errno.EIO), file)
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(filereads, "open", flaky_open, raising=False)
        _project_token(tmp_path, "fourth", 3)
        with pytest.raises(ConfigError, match=r"unauthorized \(401\)"):
            target.read()  # the read failed: the token in use is sent, and refused
        time.sleep(kubeclient.TOKEN_RETRY_S + 0.1)
        with pytest.raises(ConfigError, match=r"unauthorized \(401\)"):
            target.read()  # failed again, the same problem: not logged again
        time.sleep(kubeclient.TOKEN_RETRY_S + 0.1)
        assert target.read().spec_replicas == 2 and failing[0] == 0
        assert caplog.text.count("Input/output error") == 1
        assert [r[2]["authorization"] for r in api.requests][-1] == "Bearer fourth"
        # a token that is refused names the token, not the Role
        api.token = "third"
        with pytest.raises(ConfigError, match=r"unauthorized \(401\): the API server rejected the token"):
            target.read()
    finally:
        api.close()


@pytest.mark.parametrize("content", [
    b"\xff\xfe\x00 binary\n",  # was a UnicodeDecodeError traceback
    b"clusters: [\n",  # was a yaml ScannerError traceback
    b"- a\n- b\n",  # was a TypeError traceback (list indices must be integers)
])
def test_a_kubeconfig_that_is_not_one_is_one_line(tmp_path: Path, monkeypatch, capsys, content: bytes) -> None:
    from edgewise.cli import main

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"not in a cluster and kubeconfig {path} failed"):
        build_api_client(KubeAccess(kubeconfig=str(path)))
    assert main(["cloud", "autoscaler", "--gateway-url", "http://127.0.0.1:1", "--kubeconfig", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgewise: error: no Kubernetes access: ") and err.count("\n") == 1, err
