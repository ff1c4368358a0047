"""Two gateway replicas sharing the MQTT subscription, one of them hung (a real ``edgewise cloud
gateway`` process stopped with SIGSTOP: a frozen node, a stuck process): how long the broker
keeps handing it its share of the requests. Real Mosquitto, a real gateway process, the other
replica's bridge in-process, a real grpc.aio worker."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import yaml

from cloud.local import ROOT, cli_command
from tests.cloud.gateway.test_mqtt_bridge import Edge, bridged_gateway
from tests.cloud.gateway.workers import TestWorker, request
from tests.waiting import wait_until

#: the broker must hand every request to the live replica within this many seconds of the stop
DROPPED_WITHIN_S = 20.0


def test_the_broker_stops_handing_requests_to_a_hung_replica_within_seconds(mosquitto, tmp_path: Path) -> None:
    """The broker learns that a replica hangs only from its keepalive: it drops a client that
    sent nothing for 1.5 times the keepalive it asked for, and until then hands it its share of
    the group's requests, which nobody answers. With the bridge's keepalive of 30 s, measured with
    two real gateway processes and escalations every 50 ms with 2 s deadlines: 464 of 1300 failed
    DEADLINE_EXCEEDED, from 2 s to 49 s after one gateway got SIGSTOP. The bridge asks for 10 s
    now: the broker drops a hung replica within 15 s."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coro, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    worker = TestWorker("w", 0.01, concurrency=4)
    address = on_loop(worker.start())
    live = on_loop(bridged_gateway(mosquitto, worker))
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "listen": "127.0.0.1:0", "metrics_host": "127.0.0.1", "metrics_port": 0,
        "discovery": {"kind": "static", "static": [f"{address}=1"]},
        "mqtt": {"enabled": True, "host": mosquitto.host, "port": mosquitto.port}}))
    log = tmp_path / "gateway.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(cli_command("cloud", "gateway", "--config", str(config)), stdout=subprocess.PIPE,
                                stderr=err, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True)
    edge = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.search(r"EDGEWISE_GATEWAY_LISTENING", line), (line, log.read_text())
        wait_until(lambda: "MQTT bridge connected" in log.read_text(), 30, "the process's bridge subscribed")
        wait_until(live.bridge.connected.is_set, 30, "the in-process bridge subscribed")
        edge = Edge(mosquitto.host, mosquitto.port)
        proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        answered_in_a_row, seq = 0, 0
        while answered_in_a_row < 6:  # the group's round robin would give the hung one every other
            took = time.monotonic() - t0
            assert took < DROPPED_WITHIN_S, (
                f"{took:.0f} s after the stop, the broker still hands requests to the hung replica")
            seq += 1
            corr = f"r{seq}".encode()
            edge.send(request(seq=seq).SerializeToString(), corr)
            deadline = time.monotonic() + 1.0
            while corr not in edge.responses and time.monotonic() < deadline:
                time.sleep(0.01)
            answered_in_a_row = answered_in_a_row + 1 if corr in edge.responses else 0
    finally:
        if edge is not None:
            edge.close()
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        on_loop(live.stop(1))
        on_loop(worker.stop(0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
