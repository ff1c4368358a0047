"""End to end with real processes: LocalCloud (gateway + real ONNX workers), real signals.

A gateway and 3 ``edgewise cloud worker`` processes serving the tiny YOLOv5n
model; clients are real gRPC clients. Workers are killed with SIGKILL and
SIGTERM, a worker is added at run time, and every request must end with an
answer or a clear status inside its deadline.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import cv2
import grpc
import numpy as np
import pytest
import yaml

from cloud.local import LocalCloud, cli_command
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.waiting import wait_until

TOKENS = [{"device": "cam-1", "token": "tok-1"}]
MD = (("authorization", "Bearer tok-1"),)
FAST = {"load_poll_interval_s": 0.2, "auth.tokens": TOKENS, "limits.default_deadline_s": 5.0}


def frame(seq: int, device: str = "cam-1", data: bytes | None = None) -> detect_pb2.DetectRequest:
    if data is None:
        img = np.zeros((120, 160, 3), np.uint8)
        cv2.rectangle(img, (20 + seq % 50, 30), (90, 100), (255, 255, 255), -1)
        data = cv2.imencode(".jpg", img)[1].tobytes()
    return detect_pb2.DetectRequest(device_id=device, stream_id="s", frame_seq=seq, trace_id=f"t{seq}",
                                    image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=data))


class Load:
    """Closed-loop load from threads; records (status, elapsed, worker) per request."""

    def __init__(self, address: str, concurrency: int = 4, deadline_s: float = 3.0) -> None:
        self.ch = grpc.insecure_channel(address)
        self.stub = service_pb2_grpc.EscalationStub(self.ch)
        self.deadline_s = deadline_s
        self.results: list[tuple[str, float, str, float]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(concurrency)]
        self.seq = 0

    def _run(self, i: int) -> None:
        while not self.stop.is_set():
            with self.lock:
                self.seq += 1
                seq = self.seq
            t0 = time.monotonic()
            try:
                resp = self.stub.Detect(frame(seq), timeout=self.deadline_s, metadata=MD)
                out = ("OK", resp.worker_id)
            except grpc.RpcError as exc:
                out = (exc.code().name, exc.details() or "")
            with self.lock:
                self.results.append((out[0], time.monotonic() - t0, out[1], t0))

    def count(self, status: str) -> int:
        with self.lock:
            return sum(1 for r in self.results if r[0] == status)

    def since(self, t: float) -> list[tuple[str, float, str, float]]:
        """Results of the requests started after monotonic time ``t``."""
        with self.lock:
            return [r for r in self.results if r[3] > t]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(self.deadline_s + 5)
            assert not t.is_alive(), "a client call hung past its deadline"
        self.ch.close()


def test_pool_weights_bad_input_and_auth(tiny_model):
    settings = dict(FAST, **{"balancer.use_reported_capacity": False})  # configured weights alone
    with LocalCloud(tiny_model, workers=3, weights=[3, 2, 1], gateway_settings=settings) as cloud:
        with grpc.insecure_channel(cloud.address) as ch:
            stub = service_pb2_grpc.EscalationStub(ch)
            resp = stub.Detect(frame(0), timeout=10, metadata=MD)
            assert resp.status == detect_pb2.OK and resp.model_name and resp.timing.gateway_ms > 0
            # corrupt JPEG (valid markers, garbage inside): the worker's decoder says so
            bad = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4 + b"\xff\xd9"
            with pytest.raises(grpc.RpcError) as exc:
                stub.Detect(frame(1, data=bad), timeout=10, metadata=MD)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "image" in exc.value.details()
            with pytest.raises(grpc.RpcError) as exc:
                stub.Detect(frame(2, data=b"GIF89a..."), timeout=10, metadata=MD)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "JPEG" in exc.value.details()
            with pytest.raises(grpc.RpcError) as exc:
                stub.Detect(frame(3, device="cam-7"), timeout=10, metadata=MD)
            assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown device" in exc.value.details()
            big = b"\xff\xd8\xff" + bytes(9 * 1024 * 1024) + b"\xff\xd9"
            with pytest.raises(grpc.RpcError) as exc:
                stub.Detect(frame(4, data=big), timeout=10, metadata=MD)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in exc.value.details().lower()
        # Equal-speed workers complete at the same rate when busy, so the weights show in how
        # many requests each one is given to hold: in flight 3:2:1 when all 6 concurrent clients
        # wait on the pool; less steep when a loaded machine leaves fewer requests in flight, since
        # idle-first gives every idle worker one before the weights decide (hence >= 1.5x, not 3x).
        held: dict[str, list[int]] = {a: [] for a in cloud.worker_addresses}

        def sample() -> bool:  # 24 samples of the pool, one every 0.25 s
            for w in cloud.pool()["workers"]:
                held[w["address"]].append(w["in_flight"])
            return len(held[cloud.worker_addresses[0]]) >= 24

        with Load(cloud.address, concurrency=6) as load:
            wait_until(sample, 60, "24 samples of the pool", interval=0.25)
        assert all(s == "OK" for s, *_ in load.results), Counter(s for s, *_ in load.results)
        assert len(load.results) >= 20
        mean = [sum(v) / len(v) for v in held.values()]
        assert mean[0] > mean[1] > mean[2] and mean[0] >= 1.5 * mean[2], mean
        pool = cloud.pool()
        assert {w["state"] for w in pool["workers"]} == {"ready"} and pool["capacity"] > 0
    # SIGTERM: gateway and workers drain and exit cleanly
    assert cloud.exit_codes == {"gateway": 0, "worker 0": 0, "worker 1": 0, "worker 2": 0}


def test_kill_9_under_load_every_request_ends_in_time(tiny_model):
    settings = dict(FAST, **{"balancer.base_ejection_s": 3.0, "balancer.slow_start_window_s": 1.0})
    with LocalCloud(tiny_model, workers=3, gateway_settings=settings) as cloud:
        with Load(cloud.address, concurrency=6, deadline_s=3.0) as load:
            wait_until(lambda: load.count("OK") >= 10, 30, "10 answers before the kill")
            t_kill = time.monotonic()
            cloud.kill_worker(1, signal.SIGKILL)
            wait_until(lambda: len(load.since(t_kill + 0.5)) > 10 and load.since(t_kill + 3.0), 30,
                       "answers for 3 s after the kill")
        statuses = Counter(s for s, *_ in load.results)
        assert all(el <= 3.0 + 0.5 for _, el, _, _ in load.results)  # none outlived its deadline
        bad = [(s, w) for s, _, w, _ in load.results if s != "OK"]
        allowed = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"}
        assert all(s in allowed and w for s, w in bad), bad  # clear status + message
        after = [r for r in load.results if r[3] > t_kill + 0.5]
        assert len(after) > 10 and all(s == "OK" for s, *_ in after), Counter(s for s, *_ in after)
        assert statuses["OK"] >= 0.9 * len(load.results), statuses
        dead = cloud.worker_addresses[1]
        ejections = re.search(rf'edgewise_gateway_worker_ejections_total{{worker="{re.escape(dead)}"}} (\S+)',
                              cloud.metrics_text())
        # the dead worker is out of rotation: ejected by failed requests, or (when the gateway's
        # Load poll noticed first) marked not serving by the active health check
        state = {w["address"]: w["state"] for w in cloud.pool()["workers"]}[dead]
        assert ejections is not None and (float(ejections.group(1)) >= 1 or state in ("ejected", "not_serving")), \
            (ejections.group(1) if ejections else None, state)
        # restarted on the same address: back in the pool once its ejection ends (the
        # ejection time grows with each ejection, so wait for the gateway to say so
        # rather than guessing a sleep)
        cloud.restart_worker(1)

        def back_in_pool() -> bool:
            w = [w for w in cloud.pool()["workers"] if w["address"] == dead]
            return bool(w and not w[0]["ejected"] and w[0]["state"] == "ready")

        wait_until(back_in_pool, 30, "the restarted worker back in the pool", interval=0.2)
        restarted = f"worker-{cloud.worker_ports[1]}"
        with Load(cloud.address, concurrency=6, deadline_s=3.0) as again:
            wait_until(lambda: len(again.results) >= 30 and restarted in {r[2] for r in again.results}, 30,
                       "answers from the restarted worker too")
        assert all(s == "OK" for s, *_ in again.results)
        assert restarted in {w for _, _, w, _ in again.results}, (cloud.pool(), Counter(w for _, _, w, _ in again.results))


def test_sigterm_drain_loses_nothing(tiny_model):
    with LocalCloud(tiny_model, workers=3, gateway_settings=FAST) as cloud:
        with Load(cloud.address, concurrency=6, deadline_s=5.0) as load:
            wait_until(lambda: load.count("OK") >= 10, 30, "10 answers before the SIGTERM")
            rc = cloud.kill_worker(2, signal.SIGTERM, wait=True, timeout=20)
            t_done = time.monotonic()
            wait_until(lambda: len(load.since(t_done)) >= 10, 30, "10 answers after the drain")
        assert rc == 0
        statuses = Counter(s for s, *_ in load.results)
        assert set(statuses) == {"OK"} and statuses["OK"] > 20, [r for r in load.results if r[0] != "OK"]


def test_new_worker_ramps_under_slow_start(tiny_model):
    from cloud.gateway.balancing import STARTUP_S

    settings = dict(FAST, **{"balancer.slow_start_window_s": 8.0})
    with LocalCloud(tiny_model, workers=2, gateway_settings=settings) as cloud:
        started = time.monotonic()  # the gateway's first endpoint set came before this
        with Load(cloud.address, concurrency=6, deadline_s=5.0) as load:
            wait_until(lambda: load.count("OK") >= 10, 30, "10 answers before the new worker")
            # a worker found within STARTUP_S of the first set is one the gateway starts with (no ramp)
            time.sleep(max(0.0, STARTUP_S + 0.5 - (time.monotonic() - started)))
            i = cloud.add_worker()
            new = f"worker-{cloud.worker_ports[i]}"
            t_add = time.monotonic()
            # the slow-start window is 8 s: watch the shares until 10 s after the add
            wait_until(lambda: load.since(t_add + 10.0), 60, "requests 10 s after the add", interval=0.1)
        assert all(s == "OK" for s, *_ in load.results)
        after = sorted((t - t_add, w) for s, _, w, t in load.results if t > t_add)
        # share of the new worker in the first and last thirds of the window
        def share(lo: float, hi: float) -> float:
            sel = [w for t, w in after if lo <= t < hi]
            return sum(w == new for w in sel) / max(1, len(sel))
        early, late = share(0, 2.5), share(7.5, 10)
        # A fair share of three is 1/3, but on a busy machine the last third has measured 0.196
        # (likely because the gateway learns of the worker a moment after add_worker returns and
        # its first measured rate is low). A worker held at slow start's floor (10% weight) gets about
        # 5%; 0.15 tells a ramped worker from a stuck one without betting on the machine's load.
        assert late > 0.15, (early, late)
        assert early < late * 0.75, (early, late)


def test_cloud_up_cli_starts_and_stops_cleanly(tiny_model, tmp_path):
    """Run from another directory than the repository with relative paths everywhere: the
    model, the gateway config, the token file it names, and a worker config (issue 22)."""
    (tmp_path / "models").mkdir()
    shutil.copy(tiny_model, tmp_path / "models" / "m.onnx")
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(TOKENS))
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump({"auth": {"tokens_file": "tokens.yaml"}}))
    # a worker config that cannot be found stops the worker: serving proves it was read
    (tmp_path / "worker.yaml").write_text(yaml.safe_dump({"max_det": 50}))
    proc = subprocess.Popen(cli_command("cloud", "up", "--workers", "2", "--model", "models/m.onnx",
                                        "--port", "0", "--gateway-config", "gw.yaml",
                                        "--worker-arg=--config", "--worker-arg=worker.yaml"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=str(tmp_path))
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 90
        address = None
        assert proc.stdout is not None
        while time.monotonic() < deadline and address is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.match(r"gateway: (\S+)", line)
            if m:
                address = m.group(1)
        assert address, "".join(lines[-30:])
        with grpc.insecure_channel(address) as ch:
            stub = service_pb2_grpc.EscalationStub(ch)
            with pytest.raises(grpc.RpcError) as denied:  # the relative token file was read
                stub.Detect(frame(0), timeout=10)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            resp = stub.Detect(frame(0), timeout=10, metadata=MD)
            assert resp.status == detect_pb2.OK
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    # no worker or gateway left behind
    out = subprocess.run(["pgrep", "-f", "models/m.onnx"], capture_output=True, text=True)
    mine = [p for p in out.stdout.split() if p and int(p) != proc.pid]
    assert not [p for p in mine if _is_child_of_ours(p, proc.pid)]


def _is_child_of_ours(pid: str, parent: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().split()
    except OSError:
        return False
    return int(stat[3]) == parent


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_worker_added_at_run_time_reloads_the_workers_without_a_warning(tiny_model):
    """add_worker rewrote the gateway's config with the ports it had bound in place of the 0
    it was started with, so the SIGHUP that brought the new worker also logged "listen,
    metrics_port changed, which a reload does not apply" although nothing but the workers had
    changed."""
    with LocalCloud(tiny_model, workers=1, gateway_settings=FAST) as cloud:
        cloud.add_worker()
        log = cloud.dir / "gateway.log"
        wait_until(lambda: "worker list reloaded: 2 workers" in log.read_text(), 30, "the SIGHUP reload")
        assert {w["address"] for w in cloud.pool()["workers"]} == set(cloud.worker_addresses)
        assert "which a reload does not apply" not in log.read_text(), log.read_text()


def test_a_raised_gateway_image_limit_reaches_the_workers(tiny_model):
    """limits.max_image_pixels raised on the gateway: a frame past the built-in 7680x4320
    (33,177,600 pixels) is answered, not admitted by the gateway and refused by a worker."""
    big = cv2.imencode(".jpg", np.full((5600, 6000, 3), 90, np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 50])[1].tobytes()
    with LocalCloud(tiny_model, workers=1, worker_threads=1,
                    gateway_settings={**FAST, "limits.max_image_pixels": 40_000_000}) as cloud:
        with grpc.insecure_channel(cloud.address) as ch:
            stub = service_pb2_grpc.EscalationStub(ch)
            resp = stub.Detect(frame(1, data=big), timeout=30, metadata=MD)
            assert resp.model_name
    with LocalCloud(tiny_model, workers=1, worker_threads=1, gateway_settings=FAST) as cloud:
        with grpc.insecure_channel(cloud.address) as ch:
            with pytest.raises(grpc.RpcError) as err:
                service_pb2_grpc.EscalationStub(ch).Detect(frame(1, data=big), timeout=30, metadata=MD)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "33600000 pixels, over the limit of 33177600" in (err.value.details() or "")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.parametrize("sig, when, rc", [(signal.SIGHUP, "serving", 0), (signal.SIGTERM, "starting", 143)])
def test_cloud_up_stops_its_processes_on_a_closed_terminal_and_while_starting(tiny_model, sig, when, rc):
    """SIGHUP (the terminal closed) left the gateway and workers running under init, holding
    their ports (they run in their own sessions); a signal during the start waited for it to
    finish (minutes of warm-up for big models) before anything stopped. A SIGTERM then exits 143
    (128 + 15, as every other command), not Ctrl-C's 130."""
    proc = subprocess.Popen(cli_command("cloud", "up", "--workers", "1", "--model", str(tiny_model), "--port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: _children(proc.pid), 60, "the first process started")
        assert proc.stdout is not None
        if when == "serving":
            while not proc.stdout.readline().startswith("gateway: "):
                assert proc.poll() is None
        kids = _children(proc.pid)
        proc.send_signal(sig)
        assert proc.wait(30) == rc
        wait_until(lambda: all(_gone(k) for k in kids), 15, "its processes stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_cloud_up_killed_with_sigkill_leaves_no_process_behind(tiny_model):
    """`cloud up` killed with SIGKILL (the OOM killer, `kill -9`, a job's timeout) ran no clean-up,
    and its gateway and workers, in their own sessions, went on under init holding their ports.
    They now end by themselves when it is gone (edgewise.lifeline)."""
    proc = subprocess.Popen(cli_command("cloud", "up", "--workers", "1", "--model", str(tiny_model), "--port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        while not proc.stdout.readline().startswith("gateway: "):
            assert proc.poll() is None
        kids = _children(proc.pid)
        assert len(kids) == 2  # the worker and the gateway
        proc.kill()
        proc.wait(10)
        wait_until(lambda: all(_gone(k) for k in kids), 30, "its gateway and worker ended with it")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
