"""Fixtures of the fault suite: one real cloud (``cloud.local.LocalCloud``: a gateway
and two workers as processes, the gateway's MQTT bridge on a real Mosquitto) shared
by the cases, which kill and restart its parts and leave it whole again; and the
table of every case's frame accounting, printed at the end of the run and written
to ``.cache/faults-table.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, List

import pytest

from tests.conftest import Broker, running_mosquitto
from tests.faults.harness import ROOT, Row, render

ROWS: List[Row] = []
TABLE = ROOT / ".cache" / "faults-table.md"


@pytest.fixture(scope="session")
def fault_table() -> List[Row]:
    """Append one ``Row`` per case; printed in the terminal summary."""
    return ROWS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not ROWS:
        return
    text = render(ROWS)
    terminalreporter.write_sep("=", f"fault table (all cases so far in {TABLE.relative_to(ROOT)})")
    terminalreporter.write(text)
    # `make test` runs the cases in two pytest runs (faults_slow apart): the file keeps the
    # rows of earlier runs whose fault did not run this time.
    mine = {r.fault for r in ROWS}
    old = TABLE.read_text().splitlines() if TABLE.exists() else []
    kept = [line for line in old[4:] if line.startswith("| ") and line.split(" | ")[0][2:] not in mine]
    lines = text.splitlines()
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("# Fault suite: every escalated frame across all sinks\n\n"
                     + "\n".join(lines[:2] + kept + lines[2:]) + "\n")


@pytest.fixture(scope="session")
def fault_broker() -> Iterator[Broker]:
    """A real Mosquitto for the whole suite (persistent: sessions survive a restart)."""
    with running_mosquitto() as broker:
        yield broker


@pytest.fixture(scope="session")
def _cloud_processes(fault_broker: Broker, tiny_model: Path) -> Iterator[Any]:
    from cloud.local import LocalCloud

    cloud = LocalCloud(tiny_model, workers=2, gateway_settings={
        "mqtt.enabled": True, "mqtt.host": fault_broker.host, "mqtt.port": fault_broker.port,
        "mqtt.reconnect_min_s": 0.2, "mqtt.reconnect_max_s": 1.0, "load_poll_interval_s": 0.2,
        "balancer.slow_start_window_s": 0,
    })
    cloud.start()
    try:
        yield cloud
    finally:
        cloud.stop()


@pytest.fixture
def fault_cloud(_cloud_processes: Any, fault_broker: Broker) -> Iterator[Any]:
    """The shared cloud, whole at the start of a case and made whole again after it."""
    cloud = _cloud_processes
    yield cloud
    if fault_broker.proc.poll() is not None:
        fault_broker.start()
    for i, proc in enumerate(cloud.workers):
        if proc is None or proc.popen.poll() is not None:
            cloud.restart_worker(i)
    if cloud.gateway_exited():
        cloud.restart_gateway()
