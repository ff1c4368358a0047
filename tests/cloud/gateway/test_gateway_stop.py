"""The real ``edgewise cloud gateway`` process stopped by a real SIGTERM while requests hang in
a worker on both of its transports (gRPC and the MQTT bridge): the drain takes at most
``shutdown_grace_s`` from the signal, as its setting and the chart's terminationGracePeriodSeconds
(``shutdown_delay_s`` + ``shutdown_grace_s`` + 15 s) count on, and new gRPC calls are refused
at once. With ``shutdown_delay_s`` the gateway first says NOT_SERVING and serves new connections
that long (Kubernetes' Service drops the pod meanwhile); a second signal cuts the wait short.

Real Mosquitto broker, real gateway process, real grpc.aio worker on a real socket (for the
drain, its Infer never answers: a wedged model thread; for the delay, it answers in 5 ms).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud.local import ROOT, cli_command
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.cloud.gateway.test_hop_faults import HungWorker
from tests.cloud.gateway.test_mqtt_bridge import Edge
from tests.cloud.gateway.workers import TestWorker, request
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


class _GatewayProcess:
    """A real ``edgewise cloud gateway`` process in front of one real small worker (a grpc.aio
    ``TestWorker`` on its own loop in a thread), without MQTT."""

    def __init__(self, tmp_path: Path, **settings: object) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.worker = TestWorker("w")
        address = asyncio.run_coroutine_threadsafe(self.worker.start(), self.loop).result(10)
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "listen": "127.0.0.1:0", "metrics_host": "127.0.0.1", "metrics_port": 0,
            "discovery": {"kind": "static", "static": [f"{address}=1"]}, **settings}))
        self.log = tmp_path / "gateway.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(cli_command("cloud", "gateway", "--config", str(config)),
                                         stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
                                         env=dict(os.environ, PYTHONPATH=str(ROOT)), text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"EDGEWISE_GATEWAY_LISTENING port=(\d+) metrics_port=(\d+)", line)
        assert m, (line, self.log.read_text())
        self.port, self.metrics_port = int(m.group(1)), int(m.group(2))
        wait_until(lambda: self.catches(signal.SIGTERM), 10, "the gateway's SIGTERM handler")

    def catches(self, sig: int) -> bool:
        return _catches(self.proc.pid, sig)

    def healthz(self) -> int:
        """The side port's ``/healthz`` status (0: no answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0

    def detect_on_a_new_connection(self, seq: int) -> str:
        """A Detect on a connection opened now: the answer's status (OK) or the call's error code."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            try:
                service_pb2_grpc.EscalationStub(ch).Detect(request(seq=seq), timeout=5)
            except grpc.RpcError as exc:
                return str(exc.code().name)
            return "OK"

    def health_on_a_new_connection(self) -> str:
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        asyncio.run_coroutine_threadsafe(self.worker.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


DELAY_S = 2.0


@pytest.mark.parametrize("delay", [DELAY_S, 0.0])
def test_after_a_sigterm_the_gateway_says_not_serving_and_serves_new_connections_for_shutdown_delay_s(
        mosquitto, tmp_path: Path, delay: float) -> None:
    """Kubernetes takes a stopping pod out of its Service seconds after the SIGTERM (EndpointSlice
    to every node's kube-proxy): an edge whose one endpoint is the Service and that connected
    meanwhile was refused and spooled its escalation (found by a probe: a call 1 s after the
    SIGTERM was UNAVAILABLE). With ``shutdown_delay_s`` the gateway says NOT_SERVING at once
    (``/healthz`` 503: readiness takes it out) and answers new connections' calls until the delay
    is over (the MQTT bridge too), then drains within ``shutdown_grace_s``; with 0 it drains at
    once, as before."""
    grace = 1.0
    mqtt = {"mqtt": {"enabled": True, "host": mosquitto.host, "port": mosquitto.port}} if delay else {}
    gw = _GatewayProcess(tmp_path, shutdown_delay_s=delay, shutdown_grace_s=grace, **mqtt)
    edge = None
    try:
        assert gw.healthz() == 200
        assert gw.detect_on_a_new_connection(1) == "OK"
        if delay:
            wait_until(lambda: "MQTT bridge connected" in gw.log.read_text(), 30, "the bridge subscribed")
            edge = Edge(mosquitto.host, mosquitto.port)
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        if delay:
            wait_until(lambda: gw.healthz() == 503, 1.0, "/healthz saying 503 at once")
            assert gw.health_on_a_new_connection() == "NOT_SERVING"
        time.sleep(max(0.0, t0 + 1.0 - time.monotonic()))
        late = gw.detect_on_a_new_connection(2)
        assert late == ("OK" if delay else "UNAVAILABLE"), (late, gw.log.read_text())
        if edge is not None:  # the MQTT bridge serves on too
            edge.send(request(seq=3).SerializeToString(), b"late")
            wait_until(lambda: b"late" in edge.responses, 5, "the MQTT answer")
            assert [r.status for r in edge.responses[b"late"]] == [detect_pb2.OK], edge.responses
        assert gw.proc.wait(delay + grace + 10) == 0, gw.log.read_text()
        took = time.monotonic() - t0
        assert took < delay + grace + 2.5, f"the stop took {took:.1f} s: {gw.log.read_text()}"
        if delay:
            assert took >= delay, f"the stop took {took:.1f} s, shutdown_delay_s is {delay} s"
            assert gw.worker.calls == 3
        assert "Traceback" not in gw.log.read_text()
    finally:
        if edge is not None:
            edge.close()
        gw.close()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_stop_signal_skips_the_rest_of_shutdown_delay_s(tmp_path: Path, second: int) -> None:
    """An operator's second Ctrl-C (or a second SIGTERM) during ``shutdown_delay_s`` drains at once."""
    gw = _GatewayProcess(tmp_path, shutdown_delay_s=60.0, shutdown_grace_s=1.0)
    try:
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: gw.healthz() == 503, 2, "/healthz saying 503")
        gw.proc.send_signal(second)
        assert gw.proc.wait(15) == 0, gw.log.read_text()
        took = time.monotonic() - t0
        assert took < 5, f"the stop took {took:.1f} s: {gw.log.read_text()}"
        assert "the rest of shutdown_delay_s skipped" in gw.log.read_text()
    finally:
        gw.close()
