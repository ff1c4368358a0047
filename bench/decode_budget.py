"""Worker memory under "small file, huge image" JPEGs: RSS with and without the decode budget.

A real JPEG of one flat grey 7600x4300 frame (about 500 kB: a few bits per 8x8 block) passes
every size limit (under 7680x4320) and every check of its header and scans, yet makes the
decoder allocate the full frame (98 MB). (An 8x8 JPEG whose frame header was edited to declare
that size, which this sent before, is refused before decoding since the worker checks that the
scans hold at least a bit per declared block.) This starts a real ``edgewise cloud worker`` process, sends it one such image
and then ``--concurrency`` at once (``Worker.Infer``, straight to the worker), and
prints the worker's resident memory (``VmRSS``) and peak (``VmHWM``, reset between
phases through ``/proc/<pid>/clear_refs``) after each phase, plus how the requests
ended. ``--budget`` sets ``decode_pixel_budget`` (omit it to run a checkout whose
worker has no such setting).

Usage::

    python bench/decode_budget.py --model .cache/test-models/yolov5n-160-10.onnx
    python bench/decode_budget.py --model M --budget 500000000   # effectively no budget
    python bench/decode_budget.py --model M --checkout ../main    # another checkout's worker
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cv2
import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgewise.v1 import detect_pb2, service_pb2_grpc  # noqa: E402
from edgewise_tools.cpu import memory_mb  # noqa: E402

_CLI = "import sys; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"


def declared_jpeg(width: int, height: int) -> bytes:
    """A valid JPEG of a flat grey ``width`` x ``height`` frame: small for its pixels, and
    nothing in it the worker refuses before decoding."""
    return bytes(cv2.imencode(".jpg", np.full((height, width, 3), 128, np.uint8))[1].tobytes())


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)


async def phase(address: str, data: bytes, n: int) -> collections.Counter[str]:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.WorkerStub(ch)

        async def one(i: int) -> str:
            req = detect_pb2.DetectRequest(
                device_id="bench", stream_id="s", frame_seq=i,
                deadline_unix_ns=time.time_ns() + int(60e9),
                image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=data))
            try:
                await stub.Infer(req, timeout=60)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
        return collections.Counter(await asyncio.gather(*(one(i) for i in range(n))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget", type=int, default=None, help="decode_pixel_budget (default: the worker's)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--width", type=int, default=7600)
    ap.add_argument("--height", type=int, default=4300)
    ap.add_argument("--checkout", default=str(ROOT), help="run the worker of this checkout (to compare)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=args.checkout)
    if args.budget is not None:
        env["EDGEWISE_WORKER__DECODE_PIXEL_BUDGET"] = str(args.budget)
    proc = subprocess.Popen([sys.executable, "-c", _CLI, "cloud", "worker", "--model", args.model, "--port", "0",
                             "--metrics-port", "-1", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=args.checkout)
    try:
        port = 0
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"EDGEWISE_WORKER_SERVING port=(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if not port:
            print("worker did not start", file=sys.stderr)
            return 1
        address = f"127.0.0.1:{port}"
        data = declared_jpeg(args.width, args.height)
        print(f"JPEG of {len(data)} bytes declaring {args.width}x{args.height}; "
              f"budget {args.budget if args.budget is not None else 'worker default'}")
        print("| phase | requests | answers | RSS after (MB) | peak RSS (MB) | seconds |")
        print("|---|---|---|---|---|---|")
        rss, peak = memory_mb(proc.pid)
        print(f"| idle | 0 | | {rss:.0f} | {peak:.0f} | |")
        for name, n in (("one", 1), ("concurrent", args.concurrency)):
            reset_peak(proc.pid)
            t0 = time.perf_counter()
            answers = asyncio.run(phase(address, data, n))
            took = time.perf_counter() - t0
            rss, peak = memory_mb(proc.pid)
            summary = ", ".join(f"{k} {v}" for k, v in sorted(answers.items()))
            print(f"| {name} | {n} | {summary} | {rss:.0f} | {peak:.0f} | {took:.1f} |")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
