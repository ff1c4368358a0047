"""Gateway memory under calls the edge cancels after they were forwarded: RSS growth per 10k.

An edge that gives up on an escalation (its deadline, a shutdown, a cancelled stream)
cancels a call the gateway has usually already forwarded to a worker. grpcio's aio layer
leaks native memory when a task awaiting one of its calls is cancelled, or when a batch
fails (grpc/grpc#43360: the batch's op array, about 80 bytes per op), so cancelling the
wrong way costs the gateway a few hundred bytes per call, forever.

This starts a real ``edgewise cloud gateway`` process in front of one small grpc.aio
worker process (it speaks ``edgewise.v1.Worker`` and sleeps ``--service-ms`` instead of
running a model, so the gateway is measured alone), then sends unary ``Detect`` calls one
after another and cancels each ``--cancel-after-ms`` after sending (the call is then in
flight at the worker). After ``--warmup`` calls it prints the gateway's resident memory
(``VmRSS``) after every round of ``--calls`` calls, the growth per 10k cancelled calls,
and what the gateway says afterwards: requests still in flight (``/pool``), retries sent,
and the ERROR lines in its log. To compare with an earlier version, extract it
(``git archive <commit> | tar -x -C ../before``) and pass ``--checkout ../before``.

Usage::

    python bench/gateway_cancel_leak.py                       # this checkout
    python bench/gateway_cancel_leak.py --checkout ../before  # another checkout's gateway
    python bench/gateway_cancel_leak.py --calls 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgewise.v1 import detect_pb2, service_pb2_grpc  # noqa: E402
from edgewise_tools.cpu import memory_mb  # noqa: E402

_CLI = "import sys; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"


class _SleepWorker(service_pb2_grpc.WorkerServicer):
    """``Worker.Infer`` answering after ``service_s`` (no model), ``Worker.Load`` serving."""

    def __init__(self, service_s: float) -> None:
        self.service_s = service_s

    async def Infer(self, request: detect_pb2.DetectRequest, context: grpc.aio.ServicerContext
                    ) -> detect_pb2.DetectResponse:
        await asyncio.sleep(self.service_s)
        return detect_pb2.DetectResponse(status=detect_pb2.OK, device_id=request.device_id,
                                         stream_id=request.stream_id, frame_seq=request.frame_seq,
                                         trace_id=request.trace_id, worker_id="sleep")

    async def Load(self, request: detect_pb2.LoadRequest, context: grpc.aio.ServicerContext
                   ) -> detect_pb2.WorkerLoad:
        return detect_pb2.WorkerLoad(worker_id="sleep", serving=True, max_batch_size=1)


async def _serve_worker(service_s: float) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_WorkerServicer_to_server(_SleepWorker(service_s), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"SLEEP_WORKER port={port}", flush=True)
    await server.wait_for_termination()


def _start(argv: list[str], log: Path, ready: str, env: dict[str, str],
           cwd: str) -> tuple[subprocess.Popen[bytes], re.Match[str]]:
    """Start a process logging to ``log``; wait for the line matching ``ready``."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(ready, log.read_text(errors="replace"))
        if m:
            return proc, m
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{argv[2:5]} did not start; its log ({log}):\n{log.read_text(errors='replace')[-3000:]}")


def _cancelled_calls(stub: service_pb2_grpc.EscalationStub, n: int, cancel_after_s: float, image: bytes) -> None:
    for i in range(n):
        now = time.time_ns()
        req = detect_pb2.DetectRequest(device_id="bench", stream_id="s", frame_seq=i, capture_time_unix_ns=now,
                                       deadline_unix_ns=now + int(5e9), trace_id=f"t{i}",
                                       image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=image))
        f = stub.Detect.future(req, timeout=5)
        time.sleep(cancel_after_s)
        f.cancel()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000, help="cancelled calls per round (default 10000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3000, help="cancelled calls before the first reading")
    ap.add_argument("--service-ms", type=float, default=50.0, help="the worker's time per request")
    ap.add_argument("--cancel-after-ms", type=float, default=1.0)
    ap.add_argument("--checkout", default=str(ROOT), help="run the gateway of this checkout (to compare)")
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        asyncio.run(_serve_worker(args.service_ms / 1000.0))
        return 0

    import cv2
    import numpy as np

    image = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))[1].tobytes()
    env = dict(os.environ, PYTHONPATH=args.checkout)
    with tempfile.TemporaryDirectory(prefix="cancel-leak-") as tmp:
        d = Path(tmp)
        worker, wm = _start([sys.executable, str(Path(__file__).resolve()), "--_worker", "--service-ms",
                             str(args.service_ms)], d / "worker.log", r"SLEEP_WORKER port=(\d+)", env, args.checkout)
        gw = None
        try:
            gw, gm = _start([sys.executable, "-c", _CLI, "cloud", "gateway", "--listen", "127.0.0.1:0",
                             "--metrics-port", "0", "--set", "metrics_host=127.0.0.1",
                             "--worker", f"127.0.0.1:{wm.group(1)}"], d / "gateway.log",
                            r"EDGEWISE_GATEWAY_LISTENING port=(\d+) metrics_port=(\d+)", env, args.checkout)
            side = f"http://127.0.0.1:{gm.group(2)}"
            with grpc.insecure_channel(f"127.0.0.1:{gm.group(1)}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                print(f"gateway of {args.checkout}; worker {args.service_ms:g} ms per request; each call "
                      f"cancelled {args.cancel_after_ms:g} ms after sending; grpcio {grpc.__version__}")
                t0 = time.perf_counter()
                _cancelled_calls(stub, args.warmup, args.cancel_after_ms / 1000.0, image)
                time.sleep(1.0)
                base = memory_mb(gw.pid)[0]
                print("| cancelled calls | gateway RSS (MB) | growth (MB) | KB per cancelled call | calls/s |")
                print("|---|---|---|---|---|")
                print(f"| {args.warmup} (warm-up) | {base:.1f} | | | "
                      f"{args.warmup / (time.perf_counter() - t0):.0f} |")
                for r in range(1, args.rounds + 1):
                    t0 = time.perf_counter()
                    _cancelled_calls(stub, args.calls, args.cancel_after_ms / 1000.0, image)
                    rate = args.calls / (time.perf_counter() - t0)
                    time.sleep(1.0)
                    rss = memory_mb(gw.pid)[0]
                    n = r * args.calls
                    print(f"| +{n} | {rss:.1f} | {rss - base:+.1f} | {(rss - base) * 1024 / n:.3f} | {rate:.0f} |")
                print(f"growth per 10k cancelled calls: {(rss - base) * 1e4 / n:.2f} MB")
            pool = json.loads(_get(f"{side}/pool"))
            metrics = _get(f"{side}/metrics")
            retries = sum(float(line.split()[-1]) for line in metrics.splitlines()
                          if line.startswith("edgewise_gateway_retries_total"))
            log = (d / "gateway.log").read_text(errors="replace")
            print(f"afterwards: in flight {pool['in_flight']}, retries {retries:g}, "
                  f"ERROR lines in the gateway log {sum(' ERROR ' in line for line in log.splitlines())}, "
                  f"tracebacks {log.count('Traceback')}")
        finally:
            for p in (gw, worker):
                if p is not None:
                    p.terminate()
                    p.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
