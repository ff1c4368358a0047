"""The real ``edgewise cloud gateway`` process stopped by a real SIGTERM while requests hang in
a worker on both of its transports (gRPC and the MQTT bridge): the drain takes at most
``shutdown_grace_s`` from the signal, as its setting and the chart's terminationGracePeriodSeconds
(``shutdown_grace_s`` + 15 s) count on, and new gRPC calls are refused at once.

Real Mosquitto broker, real gateway process, real grpc.aio worker on a real socket (its Infer
never answers: a wedged model thread).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import yaml

from cloud.local import ROOT, cli_command
from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.test_hop_faults import HungWorker
from tests.cloud.gateway.test_mqtt_bridge import Edge
from tests.cloud.gateway.workers import request
from tests.conftest import free_port
from tests.processes import DEFAULT_HUP, stop_under_sighups
from tests.waiting import wait_until

GRACE_S = 4.0


def test_a_sigterm_drains_both_transports_within_one_shutdown_grace(mosquitto, tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    worker = HungWorker("hung")
    address = asyncio.run_coroutine_threadsafe(worker.start(), loop).result(10)
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "listen": "127.0.0.1:0", "metrics_host": "127.0.0.1", "metrics_port": 0,
        "discovery": {"kind": "static", "static": [f"{address}=1"]}, "shutdown_grace_s": GRACE_S,
        "limits": {"default_deadline_s": 30.0},
        "mqtt": {"enabled": True, "host": mosquitto.host, "port": mosquitto.port}}))
    log = tmp_path / "gateway.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(cli_command("cloud", "gateway", "--config", str(config)), stdout=subprocess.PIPE,
                                stderr=err, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True)
    edge = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"EDGEWISE_GATEWAY_LISTENING port=(\d+)", line)
        assert m, (line, log.read_text())
        wait_until(lambda: "MQTT bridge connected" in log.read_text(), 30, "the bridge subscribed")
        edge = Edge(mosquitto.host, mosquitto.port)
        edge.send(request(seq=1).SerializeToString(), b"mqtt-1")
        wait_until(lambda: worker.calls >= 1, 15, "the MQTT request in the worker")
        with grpc.insecure_channel(f"127.0.0.1:{m.group(1)}") as ch:
            stub = service_pb2_grpc.EscalationStub(ch)
            hanging = stub.Detect.future(request(seq=2), timeout=30)
            wait_until(lambda: worker.calls >= 2, 15, "the gRPC request in the worker")
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            try:  # a call that comes once the gateway stops is refused, not taken in and held
                stub.Detect(request(seq=3), timeout=GRACE_S + 10)
                refused = ""
            except grpc.RpcError as exc:
                refused = exc.code().name
            assert proc.wait(GRACE_S + 20) == 0, log.read_text()
            took = time.monotonic() - t0
            assert took < GRACE_S + 2.5, f"the stop took {took:.1f} s, the grace is {GRACE_S} s: {log.read_text()}"
            assert refused == "UNAVAILABLE", refused
            assert worker.calls == 2
            assert hanging.exception(10) is not None  # ended by the stop, not answered
        assert "Traceback" not in log.read_text()
    finally:
        if edge is not None:
            edge.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        asyncio.run_coroutine_threadsafe(worker.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()  # (left open, the next module's garbage check failed on its loop and sockets)


def test_sighups_while_the_gateway_stops_never_end_it_killed_by_the_signal(tmp_path: Path) -> None:
    """SIGTERM, then a SIGHUP every 2 ms (a config reloader as the pod stops) until the process
    is gone: it exits 0, not killed by SIGHUP (Kubernetes: exit 129, an error) once the loop's
    close gave SIGHUP back its default."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:0", "metrics_host": "127.0.0.1", "metrics_port": 0,
                                      "discovery": {"kind": "static", "static": [f"127.0.0.1:{free_port()}=1"]}}))
    log = tmp_path / "gateway.log"
    with open(log, "wb") as err:  # (started as a service manager starts it: SIGHUP at its default)
        proc = subprocess.Popen([*DEFAULT_HUP, *cli_command("cloud", "gateway", "--config", str(config))],
                                stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True)
    try:
        assert proc.stdout is not None
        assert "EDGEWISE_GATEWAY_LISTENING" in proc.stdout.readline(), log.read_text()
        wait_until(lambda: _catches(proc.pid, signal.SIGTERM), 10, "the gateway's SIGTERM handler")
        assert stop_under_sighups(proc) == 0, log.read_text()
        assert "Traceback" not in log.read_text()  # (nor one from a SIGHUP as the loop closed)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for ``sig`` (its SigCgt mask in Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (sig - 1)))
