"""``edgewise cloud worker`` as a real process, stopped with a real SIGTERM.

The worker is started with a long batching delay so requests are still queued
when SIGTERM arrives: every one of them must be answered OK (drain flushes the
queue at once), health must turn NOT_SERVING, new calls must get UNAVAILABLE,
and the process must exit with status 0 inside its grace period.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgewise import wire
from edgewise.v1 import detect_pb2, service_pb2_grpc
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
PHOTO = Path("/usr/share/doc/opencv-doc/examples/data/fruits.jpg")
GRACE_S = 6.0


def start_worker(model: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Start the CLI with ``--port 0``; wait for its LISTENING and SERVING lines."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("EDGEWISE_WORKER__PORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgewise.cli", "cloud", "worker", "--model", str(model),
         "--port", "0", "--host", "127.0.0.1", "--metrics-port", "-1", "--threads", "1",
         "--conf", "0.001", "--grace", str(GRACE_S), *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:  # closed at EOF, when the worker has exited
            for ln in proc.stdout:
                lines.put(ln)

    threading.Thread(target=pump, daemon=True).start()
    info: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while "serving" not in info:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            pytest.fail(f"worker did not become SERVING in 60 s; stderr:\n{proc.stderr.read()}")  # type: ignore[union-attr]
        if line.startswith("EDGEWISE_WORKER_LISTENING"):
            for kv in line.split()[1:]:
                key, _, value = kv.partition("=")
                info[key] = value
        elif line.startswith("EDGEWISE_WORKER_SERVING"):
            info["serving"] = "1"
    return proc, info


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_drains_in_flight_requests_and_exits_within_grace(tiny_model, sig):
    """SIGHUP too (an operator's ``kill -HUP`` meant as a reload, a closed terminal): its default
    ended the worker at once, its queued requests dropped (found by a probe); a worker reloads
    nothing, so it drains as on SIGTERM, and says so."""
    im = cv2.imread(str(PHOTO))
    if im is None:
        pytest.skip("opencv-doc photos missing")
    # 3 s delay: without the drain flushing the queue, SIGTERM would find them all waiting
    proc, info = start_worker(tiny_model, "--batching", "on", "--max-batch", "16", "--max-delay-ms", "3000",
                              "--worker-id", "proc-w")
    try:
        port = int(info["port"])
        assert info["worker_id"] == "proc-w" and info["metrics_port"] == "-1"
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = service_pb2_grpc.WorkerStub(ch)
        health = health_pb2_grpc.HealthStub(ch)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
        statuses: list[int] = []
        watch = health.Watch(health_pb2.HealthCheckRequest(service="edgewise.v1.Worker"), timeout=30)

        def follow() -> None:
            try:
                for r in watch:
                    statuses.append(r.status)
            except grpc.RpcError:
                pass  # the stream ends when the server stops

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        img = wire.encode_image(im, "jpeg")
        futures = [stub.Infer.future(detect_pb2.DetectRequest(frame_seq=i, image=img), timeout=20)
                   for i in range(8)]
        wait_until(lambda: stub.Load(detect_pb2.LoadRequest(), timeout=5).queue_depth >= 8, 10,
                   "the 8 requests in the queue")
        t_term = time.monotonic()
        proc.send_signal(sig)
        wait_until(lambda: health_pb2.HealthCheckResponse.NOT_SERVING in statuses, 10, "NOT_SERVING after SIGTERM")
        try:
            late = stub.Infer(detect_pb2.DetectRequest(image=img), timeout=5)
            late_code = grpc.StatusCode.OK if late else None
        except grpc.RpcError as e:
            late_code = e.code()
        results = [f.result(timeout=20) for f in futures]
        answered_s = time.monotonic() - t_term
        rc = proc.wait(timeout=GRACE_S + 5)
        exit_s = time.monotonic() - t_term
        watcher.join(5)
        ch.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        if proc.stderr is not None:
            proc.stderr.close()
    assert rc == 0, err
    assert ("SIGHUP: a worker reloads nothing" in err) == (sig == signal.SIGHUP), err
    assert sorted(r.frame_seq for r in results) == list(range(8))
    assert all(r.status == detect_pb2.OK and r.worker_id == "proc-w" and len(r.detections) > 0
               for r in results)
    assert answered_s < 2.5, f"queued requests waited for their delay during drain ({answered_s:.2f} s)"
    assert late_code == grpc.StatusCode.UNAVAILABLE
    assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
    assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses
    assert exit_s < GRACE_S, f"exited {exit_s:.2f} s after SIGTERM, grace is {GRACE_S} s"


def test_bad_flags_exit_with_a_clear_message(tiny_model, tmp_path):
    bad = tmp_path / "worker.yaml"
    bad.write_text("batching:\n  max_batch_sise: 4\n")
    p = subprocess.run(
        [sys.executable, "-m", "edgewise.cli", "cloud", "worker", "--model", str(tiny_model),
         "--config", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 2
    assert f"{bad}:2: batching.max_batch_sise: unknown key (did you mean 'max_batch_size'?)" in p.stderr


def test_a_thread_count_onnx_runtime_cannot_take_is_refused_at_start(tiny_model):
    """--threads 99999999999999 reached ONNX Runtime's SessionOptions, which takes an int32: the
    worker died with a TypeError traceback ("incompatible function arguments"). The worker's
    settings allow what the chart allows (worker.threads, at most 1024)."""
    p = subprocess.run(
        [sys.executable, "-m", "edgewise.cli", "cloud", "worker", "--model", str(tiny_model),
         "--port", "0", "--metrics-port", "-1", "--threads", "99999999999999"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "--threads: '99999999999999' is out of range; allowed: an integer in [0, 1024]" in p.stderr
