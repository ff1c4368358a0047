"""``edgewise edge health``: a real daemon process asked from its own settings, as a container's
HEALTHCHECK runs it (exit 0 healthy, 1 not; the answer printed for `docker inspect`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edge.metrics import EdgeMetrics, MetricsServer
from tests.conftest import free_port
from tests.edge.helpers import settings_yaml
from tests.processes import EdgeProcess
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _health(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgewise.cli", "edge", "health", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _config(tmp_path: Path, tiny_model: Path, host: str, port: int) -> Path:
    return settings_yaml(tmp_path / "edge.yaml", device_id="dev", model={"path": str(tiny_model)},
                         streams=[{"id": "s", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                         spool={"path": str(tmp_path / "spool.db")}, metrics={"host": host, "port": port})


def test_a_running_daemon_is_healthy_and_one_gone_is_not(tmp_path, tiny_model) -> None:
    """The L4T container had no HEALTHCHECK: nothing asked the daemon it ran how it was. The
    daemon binds every address (0.0.0.0, as the Jetson's edge.yaml): it is asked on the loopback."""
    config = _config(tmp_path, tiny_model, "0.0.0.0", free_port())
    edge = EdgeProcess(config, tmp_path / "edge.log")
    try:
        wait_until(lambda: edge.check() and _health(config).returncode == 0, 90, "the daemon healthy")
        out = _health(config)
        doc = json.loads(out.stdout)
        assert doc["status"] == "ok" and doc["device"] == "dev" and doc["streams"] == {"s": "streaming"}
    finally:
        edge.stop()
    gone = _health(config)
    assert gone.returncode == 1 and gone.stdout == ""
    assert "unhealthy: no answer from http://127.0.0.1:" in gone.stderr and "not running" in gone.stderr


def test_a_daemon_answering_503_is_unhealthy_and_its_reasons_are_printed(tmp_path, tiny_model) -> None:
    server = MetricsServer(EdgeMetrics(), lambda: (False, {"status": "stalled", "stalled": "the event loop ..."}),
                           "127.0.0.1", 0)
    server.start()
    try:
        out = _health(_config(tmp_path, tiny_model, "127.0.0.1", server.port))
    finally:
        server.stop()
    assert out.returncode == 1 and json.loads(out.stdout)["status"] == "stalled"


def test_settings_that_leave_nothing_to_ask_are_refused(tmp_path, tiny_model) -> None:
    for port, said in ((-1, "metrics.port is -1: the daemon serves no /healthz"),
                       (0, "metrics.port is 0: the daemon picks a free port at each start")):
        out = _health(_config(tmp_path, tiny_model, "127.0.0.1", port))
        assert out.returncode == 2 and said in out.stderr, out.stderr
    out = _health(_config(tmp_path, tiny_model, "127.0.0.1", 9108), "--timeout", "0")
    assert out.returncode == 2 and "--timeout 0: must be > 0" in out.stderr
