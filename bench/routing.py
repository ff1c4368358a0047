"""Routing benchmark (docs/design/balancing.md#benchmark-plan): balancing algorithms on one heterogeneous pool.

One run, one pool: three real ``cloud.worker`` servers (real ONNX inference on
the YOLOv5n model, batch 1, one inference thread each) whose service times are
padded to 1x, 2x and 4x a base time, so their service rates are 4:2:1
whatever else runs on the machine (the pad is a sleep in the inference thread,
so it costs no CPU; inference itself runs inside it). In front of the same
workers, in turn: our gateway in each pick mode (round robin, random, weighted
RR, unweighted least-connections, P2C, weighted least-connections) and nginx
``least_conn`` + ``grpc_pass`` (Debian nginx, generated config, free port).

Load is open-loop Poisson at 50/80/95% of the pool's measured capacity. Scenario
"transient slow worker" (docs/design/balancing.md#transient-slow-worker): one worker
turns 25x slower for the middle third of a run (SIGUSR1 toggles it), with a 1 s
deadline: success within the deadline and p99.
Overhead: p50 of sequential calls through the gateway minus direct to a worker.

Capacity (``--capacity``, run alone; docs/design/balancing.md#a-lean-hop): the cost of the
hop itself. One echo worker (answers at once, parses nothing) behind our gateway (unary
``Detect``, and ``DetectStream`` with every request on one stream), behind the grpc.aio floor
(a proxy that forwards the bytes and reads nothing: what any grpc.aio gateway pays; once with a
unary call per request on each side, once relayed on long-lived streams both ways) and
behind nginx, each pinned to one core (``taskset``; the client and the echo worker stay on the
other cores), and called directly. Per payload size (real JPEGs of 2, 20, 60 and 100 KB): 8
requests in flight back to back for 2 s, in 3 rounds interleaved over the paths (the median
round reported: the machine's load drifts), the proxy's CPU time over exactly that span
from ``/proc/<pid>/stat`` (utime + stime, nginx's worker included) divided by the requests
answered, so CPU per request and its inverse, the requests/s one core could serve; and the
p50 of sequential calls, whose difference to direct calls is the hop's latency.

    .venv/bin/python bench/routing.py            # full (about 10 minutes)
    .venv/bin/python bench/routing.py --quick    # smoke run (about 2 minutes)
    .venv/bin/python bench/routing.py --capacity # the hop's CPU per request (about 2 minutes)
    .venv/bin/python bench/routing.py --versus 8 # shipped defaults vs nginx, paired rounds (about 9 minutes)
    .venv/bin/python bench/routing.py --versus 6 --duration 15 --mix regions  # the same, on region payloads

Requests (``--mix``): by default one small JPEG over and over, so every request costs the same;
``--mix regions`` sends the region payloads a camera fleet escalates (``bench/payload_mix.py``),
and each worker's pad grows with the image's pixels (mean 1x/2x/4x the base) and the worker
reports its pixels/s, as a worker with a native-input model does
(docs/design/balancing.md#work-not-requests).

Paired (``--versus``): p99 differences between routers of a few percent are smaller than
what a shared machine's drifting load does to one 20 s run, so this mode serves the same
seeded arrival sequence through the shipped defaults and through nginx back to back, in
alternating order, round after round, and reports the pooled p99s and the per-round ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgewise_tools.cpu import tree_cpu_s  # noqa: E402

NGINX = "/usr/sbin/nginx"
MODES = [("rr", "round robin"), ("random", "random"), ("wrr", "weighted RR"), ("lc", "least-conn (unweighted)"),
         ("p2c", "P2C (A48, unweighted)"),
         ("default", "**gateway as shipped (defaults), weights 4:2:1**"),
         ("wlc-cap", "**weighted least-conn (ours), weights 1:1:1, learned capacity**"),
         ("wlc", "weighted least-conn, configured weights 4:2:1 only"),
         ("wlc-noidle", "weighted least-conn without idle-first, 4:2:1"),
         ("wlc-active", "weighted least-conn, key active/weight (nginx's), ties to the fastest"),
         ("wlc-requests", "weighted least-conn, every request counts 1 (cost: requests)"),
         ("nginx", "nginx least_conn 4:2:1")]
#: each row's departures from the shipped defaults (BalancerConfig()); "default" has none
MODE_SETTINGS: dict[str, list[str]] = {
    "default": [],
    "wlc-cap": [],  # the defaults, with every configured weight 1: capacity comes from Worker.Load
    "wlc": ["balancer.use_reported_capacity=false"],
    "wlc-noidle": ["balancer.idle_first=false"],
    "wlc-active": ["balancer.key=active"],
    "wlc-requests": ["balancer.cost=requests"],
}


def versus(addrs: list[str], weights: list[float], capacity: float, loads: list[float], rounds: int,
           duration: float, d: Path, contenders: list[str], mix: list[bytes] | None = None) -> None:
    """Gateway configurations (``contenders``, MODES names) against nginx ``least_conn``,
    paired so machine noise cancels.

    Every proxy stays up in front of the same workers. Each round serves one seeded Poisson
    arrival sequence through each of them back to back (the order rotates between rounds), so
    all see the same requests at nearly the same time; drift in the machine's load hits all.
    Reported per load: the p99 of all rounds pooled, and the median and range of the per-round
    p99 ratios to nginx.
    """
    labels = dict(MODES)
    procs: list[Proc] = []
    ports: dict[str, int] = {}
    try:
        for mode in contenders:
            gw, ports[mode], _ = start_gateway(mode, addrs, weights, d)
            procs.append(gw)
        ng, ports["nginx"] = start_nginx(addrs, weights, d)
        procs.append(ng)
        names = [*contenders, "nginx"]
        pooled = {ld: {m: RunStats() for m in names} for ld in loads}
        ratios: dict[float, dict[str, list[float]]] = {ld: {m: [] for m in contenders} for ld in loads}
        for r in range(rounds):
            for ld in loads:
                order = names[r % len(names):] + names[:r % len(names)]
                p99: dict[str, float] = {}
                for mode in order:
                    st = asyncio.run(open_loop(f"127.0.0.1:{ports[mode]}", ld * capacity, duration, 30.0,
                                               seed=1000 + 17 * r + int(100 * ld), worker_api=mode == "nginx",
                                               mix=mix))
                    agg = pooled[ld][mode]
                    agg.ok_lat += st.ok_lat
                    for k, v in st.errors.items():
                        agg.errors[k] = agg.errors.get(k, 0) + v
                    p99[mode] = st.pct(.99)
                for m in contenders:
                    ratios[ld][m].append(p99[m] / p99["nginx"])
                print(f"  round {r + 1}/{rounds} load {ld:.0%}: p99 " + ", ".join(f"{m} {p99[m]:.1f} ms" for m in names),
                      flush=True)
    finally:
        for p in procs:
            p.stop()
    print()
    print(f"Against nginx least_conn 4:2:1, {rounds} paired rounds of {duration:g} s per load "
          f"(capacity {capacity:.0f} req/s; load average {os.getloadavg()[0]:.1f}):")
    print()
    print("| gateway | load | answered (gateway / nginx) | p99 gateway ms | p99 nginx ms | pooled ratio | per-round ratio "
          "median (min-max) | errors (gateway / nginx) | target <= 1.00x |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in contenders:
        for ld in loads:
            ours, ngx = pooled[ld][m], pooled[ld]["nginx"]
            rs = sorted(ratios[ld][m])
            pooled_ratio = ours.pct(.99) / ngx.pct(.99)
            print(f"| {labels[m]} | {ld:.0%} | {len(ours.ok_lat)} / {len(ngx.ok_lat)} | {ours.pct(.99):.1f} | "
                  f"{ngx.pct(.99):.1f} | {pooled_ratio:.2f}x | {rs[len(rs) // 2]:.2f}x ({rs[0]:.2f}-{rs[-1]:.2f}) | "
                  f"{sum(ours.errors.values())} / {sum(ngx.errors.values())} | "
                  f"{'met' if pooled_ratio <= 1.0 else 'NOT met'} |")


async def serve_until_sigterm(service: str, methods: dict, address: str, banner: str,
                             streams: dict | None = None) -> int:
    """Serve unary ``methods`` and stream-stream ``streams`` of ``service`` on ``address`` (raw
    bytes in and out), print ``banner`` with the bound port (what :class:`Proc` waits for),
    stop on SIGTERM."""
    import grpc

    handlers = {name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in methods.items()}
    handlers.update({name: grpc.stream_stream_rpc_method_handler(fn) for name, fn in (streams or {}).items()})
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    port = server.add_insecure_port(address)
    await server.start()
    print(banner.format(port=port), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(0)
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# bench worker: the real worker server with a padded model runner
# ---------------------------------------------------------------------------------------------
def worker_main(args: argparse.Namespace) -> int:
    from cloud.worker.runner import ModelRunner
    from cloud.worker.server import SERVING_TAG, create_server
    from cloud.worker.settings import load_settings

    settings = load_settings(None, env={}, overrides={
        "model": args.model, "host": "127.0.0.1", "port": args.port, "metrics_port": -1,
        "worker_id": args.name, "threads": 1, "decode_threads": 1, "grace_s": 2.0, "warmup_rounds": 3,
        "batching.max_batch_size": 1, "batching.max_queue_delay_ms": 0.0, "batching.max_queue_size": 256})
    slow = {"on": False}

    class PaddedRunner(ModelRunner):
        def run(self, items, whole=False):  # type: ignore[no-untyped-def]
            out, secs = super().run(items, whole)
            mult = args.slow_factor if slow["on"] else 1.0
            # --pixel-unit: a native-input worker, whose time grows with each image's pixels
            units = (sum(it.meta.src_shape[0] * it.meta.src_shape[1] for it in items) / args.pixel_unit
                     if args.pixel_unit > 0 else len(items))
            target = args.service_ms / 1000.0 * mult * units
            if secs < target:
                time.sleep(target - secs)
            return out, max(secs, target)

    runner = PaddedRunner.from_settings(settings)
    runner.pixel_cost = args.pixel_unit > 0  # reported in Load, as a native-input worker reports it

    async def main() -> int:
        server, port = create_server(settings, runner)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, lambda: slow.__setitem__("on", not slow["on"]))
        await server.bind()
        await server.service.start()
        print(f"{SERVING_TAG} port={port}", flush=True)
        await stop.wait()
        await server.stop(2.0)
        return 0

    return asyncio.run(main())


def echo_main(args: argparse.Namespace) -> int:
    """A Worker that answers at once with a fixed response, without parsing the request:
    isolates the cost of the extra hop (and keeps the echo itself cheap in the capacity runs)."""
    import grpc

    from edgewise.v1 import detect_pb2

    infer_reply = detect_pb2.DetectResponse(status=detect_pb2.OK, worker_id="echo").SerializeToString()
    load_reply = detect_pb2.WorkerLoad(worker_id="echo", capacity=1000.0, serving=True).SerializeToString()

    async def infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return infer_reply

    async def load(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return load_reply

    async def infer_stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for _ in requests:  # bench only (the stream floor's upstream): answers in order
            yield infer_reply

    return asyncio.run(serve_until_sigterm("edgewise.v1.Worker", {"Infer": infer, "Load": load},
                                           f"127.0.0.1:{args.port}", "EDGEWISE_WORKER_SERVING port={port}",
                                           {STREAM_FLOOR_METHOD: infer_stream}))


async def interleaved(targets: dict[str, tuple[str, bool]], n: int) -> dict[str, list[float]]:
    """Sequential calls, round-robin over the targets so drift hits all alike."""
    import grpc

    from edgewise.v1 import service_pb2_grpc

    payload = jpeg_payload()
    chans = {k: grpc.aio.insecure_channel(a) for k, (a, _) in targets.items()}
    calls = {k: (service_pb2_grpc.WorkerStub(chans[k]).Infer if worker_api
                 else service_pb2_grpc.EscalationStub(chans[k]).Detect)
             for k, (_, worker_api) in targets.items()}
    out: dict[str, list[float]] = {k: [] for k in targets}
    for i in range(n + 10):
        for k, call in calls.items():
            t0 = time.perf_counter()
            await call(make_request(i, payload), timeout=10)
            if i >= 10:
                out[k].append(time.perf_counter() - t0)
    for ch in chans.values():
        await ch.close()
    return out


# ---------------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------------
class Proc:
    def __init__(self, argv: list[str], log: Path, ready: str | None, timeout: float = 90) -> None:
        self.log = log
        self.f = open(log, "wb")
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", EDGEWISE_LOG_LEVEL="WARNING")
        self.p = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env,
                                  start_new_session=True)
        self.match: re.Match[str] | None = None
        if ready:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                m = re.search(ready, log.read_text(errors="replace"))
                if m:
                    self.match = m
                    break
                if self.p.poll() is not None:
                    raise RuntimeError(f"{argv[:4]} exited: {log.read_text()[-2000:]}")
                time.sleep(0.05)
            else:
                raise RuntimeError(f"{argv[:4]} not ready in {timeout}s: {log.read_text()[-2000:]}")

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.f.close()


def start_workers(model: str, service_ms: list[float], slow_factor: float, d: Path,
                  pixel_unit: float = 0.0) -> list[tuple[Proc, int]]:
    out = []
    for i, ms in enumerate(service_ms):
        port = free_port()
        argv = [sys.executable, str(Path(__file__).resolve()), "--_worker", "--model", model, "--port", str(port),
                "--name", f"w{i}", "--service-ms", str(ms), "--slow-factor", str(slow_factor),
                "--pixel-unit", str(pixel_unit)]
        out.append((Proc(argv, d / f"worker{i}.log", r"EDGEWISE_WORKER_SERVING port=(\d+)"), port))
    return out


def pinned(argv: list[str], cpu: int | None) -> list[str]:
    """``argv`` run on CPU ``cpu`` only (``taskset`` execs it: same pid), or as is."""
    return argv if cpu is None else ["taskset", "-c", str(cpu), *argv]


def start_gateway(mode: str, workers: list[str], weights: list[float], d: Path,
                  cpu: int | None = None) -> tuple[Proc, int, int]:
    from cloud.local import cli_command

    if mode == "wlc-cap":
        weights = [1.0] * len(workers)
    # Only what the harness needs (loopback, free ports, long deadlines for the overloaded
    # baselines); every balancer knob is the shipped default unless MODE_SETTINGS says otherwise.
    argv = cli_command("--log-level", "WARNING", "cloud", "gateway", "--listen", "127.0.0.1:0", "--metrics-port", "0",
                       "--set", "metrics_host=127.0.0.1", "--set", "limits.max_deadline_s=120")
    if mode not in MODE_SETTINGS:
        argv += ["--mode", mode]
    for item in MODE_SETTINGS.get(mode, []):
        argv += ["--set", item]
    for a, w in zip(workers, weights):
        argv += ["--worker", f"{a}={w:g}"]
    p = Proc(pinned(argv, cpu), d / f"gateway-{mode}.log",
             r"EDGEWISE_GATEWAY_LISTENING port=(\d+) metrics_port=(\d+)")
    assert p.match is not None
    return p, int(p.match.group(1)), int(p.match.group(2))


def start_nginx(workers: list[str], weights: list[float], d: Path, cpu: int | None = None) -> tuple[Proc, int]:
    port = free_port()
    nd = d / "nginx"
    nd.mkdir(exist_ok=True)
    servers = "\n".join(f"    server {a} weight={int(w)} max_fails=0;" for a, w in zip(workers, weights))
    temps = "\n".join(f"  {k}_temp_path {nd}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = f"""worker_processes 1;
daemon off;
pid {nd}/nginx.pid;
error_log {nd}/error.log warn;
{"user root;" if os.geteuid() == 0 else ""}
events {{ worker_connections 4096; }}
http {{
  access_log off;
{temps}
  upstream workers {{
    least_conn;
{servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port} http2;
    location / {{
      grpc_pass grpc://workers;
      grpc_read_timeout 120s;
      grpc_send_timeout 120s;
    }}
  }}
}}
"""
    (nd / "nginx.conf").write_text(conf)
    p = Proc(pinned([NGINX, "-p", str(nd), "-c", str(nd / "nginx.conf"), "-e", str(nd / "error.log")], cpu),
             d / "nginx.log", None)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return p, port
        except OSError:
            if p.p.poll() is not None:
                raise RuntimeError(f"nginx exited: {(nd / 'error.log').read_text()}") from None
            time.sleep(0.05)
    raise RuntimeError("nginx did not listen")


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------
@dataclass
class RunStats:
    sent: int = 0
    ok_lat: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    late: int = 0
    per_worker: dict[str, int] = field(default_factory=dict)
    duration: float = 0.0

    def pct(self, q: float) -> float:
        if not self.ok_lat:
            return float("nan")
        v = sorted(self.ok_lat)
        return 1000.0 * v[min(len(v) - 1, int(q * len(v)))]

    @property
    def throughput(self) -> float:
        return len(self.ok_lat) / self.duration if self.duration else 0.0


def make_request(seq: int, payload: bytes):  # type: ignore[no-untyped-def]
    from edgewise.v1 import detect_pb2

    return detect_pb2.DetectRequest(device_id="bench", stream_id="s", frame_seq=seq,
                                    image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=payload))


def jpeg_payload() -> bytes:
    import cv2
    import numpy as np

    img = np.zeros((120, 160, 3), np.uint8)
    cv2.rectangle(img, (30, 30), (100, 90), (200, 200, 200), -1)
    return cv2.imencode(".jpg", img)[1].tobytes()


async def open_loop(target: str, rate: float, duration: float, deadline_s: float, seed: int,
                    on_tick: Callable[[float], None] | None = None, worker_api: bool = False,
                    mix: list[bytes] | None = None) -> RunStats:
    """Poisson arrivals at ``rate``/s for ``duration`` s; each call has ``deadline_s`` and sends
    one image of ``mix`` drawn at random (the same sequence for the same seed), else one small JPEG."""
    import grpc

    from edgewise.v1 import service_pb2_grpc

    rng = random.Random(seed)
    pick = random.Random(seed + 1)
    payload = jpeg_payload()
    stats = RunStats()
    async with grpc.aio.insecure_channel(target) as ch:
        # nginx proxies paths as they are: through it the client calls Worker.Infer
        call = service_pb2_grpc.WorkerStub(ch).Infer if worker_api else service_pb2_grpc.EscalationStub(ch).Detect
        await call(make_request(0, payload), timeout=10)  # connect + warm

        async def one(seq: int, image: bytes) -> None:
            t0 = time.perf_counter()
            try:
                resp = await call(make_request(seq, image), timeout=deadline_s)
                el = time.perf_counter() - t0
                stats.ok_lat.append(el)
                stats.per_worker[resp.worker_id] = stats.per_worker.get(resp.worker_id, 0) + 1
            except grpc.aio.AioRpcError as exc:
                name = exc.code().name
                stats.errors[name] = stats.errors.get(name, 0) + 1

        tasks = []
        start = time.perf_counter()
        next_t = start
        seq = 0
        while True:
            next_t += rng.expovariate(rate)
            if next_t - start >= duration:
                break
            delay = next_t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if on_tick is not None:
                on_tick(time.perf_counter() - start)
            seq += 1
            tasks.append(asyncio.ensure_future(one(seq, pick.choice(mix) if mix else payload)))
        await asyncio.gather(*tasks)
        stats.sent = seq
        stats.duration = duration
    return stats


async def direct_sequential(address: str, n: int, compute: list[float] | None = None,
                            mix: list[bytes] | None = None) -> list[float]:
    """``n`` sequential calls (after 5 warm-up ones), each with the next image of ``mix``
    (cycling) or the one small JPEG; per-call latency, and the worker's compute time into ``compute``."""
    import grpc

    from edgewise.v1 import service_pb2_grpc

    images = mix or [jpeg_payload()]
    out = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.WorkerStub(ch)
        for i in range(n + 5):
            t0 = time.perf_counter()
            resp = await stub.Infer(make_request(i, images[i % len(images)]), timeout=10)
            if i >= 5:
                out.append(time.perf_counter() - t0)
                if compute is not None:
                    compute.append(resp.timing.compute_ms / 1000.0)
    return out


async def gateway_seq(address: str, n: int) -> list[float]:
    import grpc

    from edgewise.v1 import service_pb2_grpc

    payload = jpeg_payload()
    out = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.EscalationStub(ch)
        for i in range(n + 5):
            t0 = time.perf_counter()
            await stub.Detect(make_request(i, payload), timeout=10)
            if i >= 5:
                out.append(time.perf_counter() - t0)
    return out


def p(vals: list[float], q: float) -> float:
    v = sorted(vals)
    return 1000.0 * v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def overhead_hist_p50(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    buckets = [(float(m.group(1)), float(m.group(2))) for m in re.finditer(
        r'edgewise_gateway_overhead_seconds_bucket\{le="([0-9.e+-]+)"\} ([0-9.e+]+)', text)]
    total = buckets[-1][1] if buckets else 0
    for le, c in buckets:
        if total and c >= total / 2:
            return le * 1000
    return float("nan")


# ---------------------------------------------------------------------------------------------
# capacity: CPU per request of the proxy hop, by payload size
# ---------------------------------------------------------------------------------------------
CAPACITY_SIZES = (2_000, 20_000, 60_000, 100_000)
INFER_PATH = "/edgewise.v1.Worker/Infer"
DETECT_PATH = "/edgewise.v1.Escalation/Detect"
DETECT_STREAM_PATH = "/edgewise.v1.Escalation/DetectStream"
#: The echo worker's stream method, for the stream floor only (the real Worker has no such method).
STREAM_FLOOR_METHOD = "BenchInferStream"


def jpeg_of_size(target: int) -> bytes:
    """A real JPEG (noise, quality 90) within a few per cent of ``target`` bytes."""
    import cv2
    import numpy as np

    noise = np.random.default_rng(0).integers(0, 256, (1024, 1024, 3), np.uint8)

    def enc(side: int) -> bytes:
        return bytes(cv2.imencode(".jpg", noise[:side, :side], [cv2.IMWRITE_JPEG_QUALITY, 90])[1])

    lo, hi = 8, 1024
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(enc(mid)) < target else (lo, mid)
    return min(enc(lo), enc(hi), key=lambda b: abs(len(b) - target))


def floor_main(args: argparse.Namespace) -> int:
    """The least a grpc.aio proxy can do: Escalation.Detect's bytes to ``--target``'s
    Worker.Infer and its answer back, nothing read, with the gateway's channel options.
    What the gateway costs beyond this is its own work. Its ``DetectStream`` is the least a
    proxy on streams both ways can do: every message relayed over one long-lived upstream
    stream to the echo worker (which answers in order, so a FIFO pairs the answers), no
    call opened per request on either side."""
    import grpc

    from cloud.gateway.pool import INFER_PATH as infer_path
    from cloud.gateway.pool import WorkerPool
    from cloud.gateway.settings import load_settings

    options = WorkerPool(load_settings(None, {"discovery.static": [args.target]}, env={}))._channel_options()

    async def main() -> int:
        channel = grpc.aio.insecure_channel(args.target, options=options)
        infer = channel.unary_unary(infer_path, _registered_method=True)

        async def detect(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return await infer(body, timeout=context.time_remaining())  # type: ignore[no-any-return]

        upstream = channel.stream_stream(f"/edgewise.v1.Worker/{STREAM_FLOOR_METHOD}")()
        waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()

        async def answers() -> None:
            async for reply in upstream:
                waiting.popleft().set_result(reply)

        pump = asyncio.ensure_future(answers())

        async def detect_stream(requests: AsyncIterator[bytes],
                                context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            order: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue()

            async def relay() -> None:
                async for body in requests:
                    fut = asyncio.get_running_loop().create_future()
                    waiting.append(fut)
                    await upstream.write(body)
                    order.put_nowait(fut)
                order.put_nowait(None)

            task = asyncio.ensure_future(relay())
            while (fut := await order.get()) is not None:
                yield await fut
            await task

        try:
            return await serve_until_sigterm("edgewise.v1.Escalation", {"Detect": detect}, "127.0.0.1:0",
                                             "EDGEWISE_GATEWAY_LISTENING port={port} metrics_port=0",
                                             {"DetectStream": detect_stream})
        finally:
            pump.cancel()

    return asyncio.run(main())


@dataclass
class CapacityCell:
    requests: int = 0
    wall_s: float = 0.0
    cpu_s: float | None = None  # the proxy's CPU over the loaded run; None for direct calls
    seq_p50_ms: float = float("nan")

    @property
    def cpu_ms(self) -> float | None:
        return None if self.cpu_s is None or not self.requests else 1000.0 * self.cpu_s / self.requests


@dataclass(frozen=True)
class CapacityPath:
    label: str
    address: str
    method: str
    pid: int | None  # the proxy process whose CPU is measured; None: direct
    stream: bool = False  # one DetectStream call carrying every request


async def closed_loop(path: CapacityPath, body: bytes, in_flight: int, seconds: float) -> CapacityCell:
    """``in_flight`` requests of ``body`` kept outstanding for ``seconds`` (after a warm-up);
    the proxy's CPU time over exactly that span. Serialized bytes in and out: the client
    costs no protobuf work."""
    import grpc

    async with grpc.aio.insecure_channel(path.address,
                                         options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.unary_unary(path.method)
        for _ in range(50):
            await call(body, timeout=10)
        stop_at = 0.0
        done = 0

        async def caller() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                await call(body, timeout=10)
                done += 1

        async def streamed() -> None:
            nonlocal done
            stream = ch.stream_stream(path.method)(timeout=seconds + 30)
            room = asyncio.Semaphore(in_flight)

            async def writer() -> None:
                while time.perf_counter() < stop_at:
                    await room.acquire()
                    await stream.write(body)
                await stream.done_writing()

            async def reader() -> None:
                nonlocal done
                async for _ in stream:
                    done += 1
                    room.release()

            await asyncio.gather(writer(), reader())

        cpu0 = tree_cpu_s(path.pid) if path.pid else 0.0
        t0 = time.perf_counter()
        stop_at = t0 + seconds
        if path.stream:
            await streamed()
        else:
            await asyncio.gather(*(caller() for _ in range(in_flight)))
        wall = time.perf_counter() - t0
        cpu = tree_cpu_s(path.pid) - cpu0 if path.pid else None
    return CapacityCell(done, wall, cpu)


async def sequential_p50(paths: list[CapacityPath], body: bytes, n: int) -> dict[str, float]:
    """p50 of one call at a time, round robin over the (unary) paths so drift hits all alike."""
    import grpc

    chans = {c.label: grpc.aio.insecure_channel(c.address, options=[("grpc.max_send_message_length", 64 << 20)])
             for c in paths}
    calls = {c.label: chans[c.label].unary_unary(c.method) for c in paths}
    lat: dict[str, list[float]] = {k: [] for k in calls}
    for i in range(n + 20):
        for k, call in calls.items():
            t0 = time.perf_counter()
            await call(body, timeout=10)
            if i >= 20:
                lat[k].append(time.perf_counter() - t0)
    for ch in chans.values():
        await ch.close()
    return {k: p(v, .5) for k, v in lat.items()}


def capacity_main(args: argparse.Namespace) -> int:
    """The hop in front of one echo worker: our gateway (unary Detect and DetectStream), the
    grpc.aio floor and nginx, each pinned to one core, and direct calls; CPU per request from
    /proc, by payload size."""
    from edgewise.v1 import detect_pb2

    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu, rest = cpus[0], set(cpus[1:]) or {cpus[0]}
    os.sched_setaffinity(0, rest)  # the client and the echo worker (inherited) stay off the proxy's core
    sizes = [int(float(x) * 1000) for x in args.capacity_sizes.split(",")] if args.capacity_sizes \
        else list(CAPACITY_SIZES)
    d = Path(tempfile.mkdtemp(prefix="ew-capacity-"))
    load_before = os.getloadavg()
    me = [sys.executable, str(Path(__file__).resolve())]
    eport = free_port()
    echo = Proc([*me, "--_echo", "--port", str(eport)], d / "echo.log", r"EDGEWISE_WORKER_SERVING port=(\d+)")
    ea = f"127.0.0.1:{eport}"
    procs = [echo]
    results: dict[tuple[int, str], CapacityCell] = {}
    try:
        gw, gport, _ = start_gateway("default", [ea], [1.0], d, cpu=proxy_cpu)
        fl = Proc(pinned([*me, "--_floor", "--target", ea], proxy_cpu), d / "floor.log",
                  r"EDGEWISE_GATEWAY_LISTENING port=(\d+)")
        procs += [gw, fl]
        assert fl.match is not None
        paths = [CapacityPath("direct", ea, INFER_PATH, None),
                 CapacityPath("gateway", f"127.0.0.1:{gport}", DETECT_PATH, gw.p.pid),
                 CapacityPath("gateway, DetectStream", f"127.0.0.1:{gport}", DETECT_STREAM_PATH, gw.p.pid, True),
                 CapacityPath("grpc.aio floor", f"127.0.0.1:{fl.match.group(1)}", DETECT_PATH, fl.p.pid),
                 CapacityPath("grpc.aio floor, streams both hops", f"127.0.0.1:{fl.match.group(1)}",
                              DETECT_STREAM_PATH, fl.p.pid, True)]
        if Path(NGINX).exists():
            ng, nport = start_nginx([ea], [1.0], d, cpu=proxy_cpu)
            procs.append(ng)
            paths.append(CapacityPath("nginx", f"127.0.0.1:{nport}", INFER_PATH, ng.p.pid))
        for size in sizes:
            req = detect_pb2.DetectRequest(
                device_id="bench", stream_id="s", frame_seq=1, trace_id="t1",
                image=detect_pb2.Image(encoding=detect_pb2.Image.JPEG, data=jpeg_of_size(size)))
            body = req.SerializeToString()
            p50 = asyncio.run(sequential_p50([c for c in paths if not c.stream], body, args.capacity_seq))
            rounds: dict[str, list[CapacityCell]] = {c.label: [] for c in paths}
            for _ in range(args.capacity_rounds):  # interleaved: the machine's load drifts, hits all alike
                for path in paths:
                    rounds[path.label].append(
                        asyncio.run(closed_loop(path, body, args.in_flight, args.capacity_seconds)))
            for path in paths:  # the round with the median CPU per request (or throughput, direct)
                runs = sorted(rounds[path.label], key=lambda c: c.cpu_ms or -c.requests / c.wall_s)
                cell = runs[len(runs) // 2]
                cell.seq_p50_ms = p50.get(path.label, float("nan"))
                results[(len(body), path.label)] = cell
                cpu = f"{cell.cpu_ms:.3f} ms CPU/req" if cell.cpu_ms is not None else "(no proxy)"
                print(f"  {len(body) / 1000:6.1f} KB {path.label:22s} {cell.requests / cell.wall_s:7.0f} req/s at "
                      f"{args.in_flight} in flight, {cpu} (rounds: "
                      f"{', '.join(f'{c.cpu_ms:.3f}' for c in runs if c.cpu_ms is not None) or '-'}), "
                      f"sequential p50 {cell.seq_p50_ms:.2f} ms", flush=True)
    finally:
        for pr in reversed(procs):
            pr.stop()
        shutil.rmtree(d, ignore_errors=True)
    load_after = os.getloadavg()

    print()
    print(f"Proxies pinned to CPU {proxy_cpu}; client and echo worker on CPU {sorted(rest)}; "
          f"{args.in_flight} requests in flight; per cell the median of {args.capacity_rounds} interleaved "
          f"rounds of {args.capacity_seconds:g} s; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs).")
    print()
    print("| request | path | proxy CPU ms/request | one-core ceiling req/s (1 / CPU) | req/s at "
          f"{args.in_flight} in flight | proxy core busy | sequential p50 ms | p50 overhead ms |")
    print("|---|---|---|---|---|---|---|---|")
    for (nbytes, name), c in results.items():
        direct = results[(nbytes, "direct")]
        if c.cpu_ms is None:
            cpu = ceiling = busy = "-"
        else:
            cpu, ceiling = f"{c.cpu_ms:.3f}", f"{1000.0 / c.cpu_ms:.0f}"
            busy = f"{100.0 * (c.cpu_s or 0.0) / c.wall_s:.0f}%"
        seq = "-" if c.seq_p50_ms != c.seq_p50_ms else f"{c.seq_p50_ms:.2f}"  # NaN: streamed, no sequential calls
        over = "-" if name == "direct" or seq == "-" else f"{c.seq_p50_ms - direct.seq_p50_ms:+.2f}"
        print(f"| {nbytes / 1000:.1f} KB | {name} | {cpu} | {ceiling} | {c.requests / c.wall_s:.0f} | {busy} | "
              f"{seq} | {over} |")
    gw_cells = {n: c for (n, k), c in results.items() if k == "gateway" and c.cpu_ms is not None}
    if gw_cells:
        print()
        near60 = min(gw_cells, key=lambda n: abs(n - 60_000))
        c60 = gw_cells[near60].cpu_ms or 0.0
        verdict = "met" if c60 <= 0.25 else "NOT met"
        print(f"- Gateway CPU per request at {near60 / 1000:.0f} KB: {c60:.3f} ms (target <= 0.25 ms: {verdict}; "
              f"stretch 0.15 ms: {'met' if c60 <= 0.15 else 'not met'}).")
        floor = results.get((near60, "grpc.aio floor"))
        if floor is not None and floor.cpu_ms:
            print(f"- The grpc.aio floor (bytes forwarded, nothing read) costs {floor.cpu_ms:.3f} ms there: the "
                  f"gateway's own work is {c60 - floor.cpu_ms:+.3f} ms.")
        streamed = results.get((near60, "grpc.aio floor, streams both hops"))
        if streamed is not None and streamed.cpu_ms:
            print(f"- Relayed on long-lived streams both ways (no call opened per request on either side) the "
                  f"floor is {streamed.cpu_ms:.3f} ms: the least a grpc.aio hop pays per request, "
                  f"{'within' if streamed.cpu_ms <= 0.25 else 'above'} the 0.25 ms target before any work of "
                  f"its own.")
        lo, hi = min(gw_cells), max(gw_cells)
        print(f"- Payload dependence: {hi / 1000:.0f} KB costs {(gw_cells[hi].cpu_ms or 0) / (gw_cells[lo].cpu_ms or 1):.2f}x "
              f"the CPU of {lo / 1000:.0f} KB.")
        worst = max((c.seq_p50_ms - results[(n, "direct")].seq_p50_ms) for n, c in gw_cells.items())
        print(f"- Worst p50 overhead over direct: {worst:+.2f} ms (target <= 0.5 ms: "
              f"{'met' if worst <= 0.5 else 'NOT met'}).")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "proxy_cpu": proxy_cpu, "load_before": load_before, "load_after": load_after,
            "cells": [{"bytes": n, "path": k, "requests": c.requests, "wall_s": c.wall_s, "cpu_s": c.cpu_s,
                       "seq_p50_ms": c.seq_p50_ms} for (n, k), c in results.items()]}, indent=1))
    return 0


# ---------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_echo", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_floor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", default="", help=argparse.SUPPRESS)
    ap.add_argument("--name", default="w", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=str(ROOT / ".cache" / "test-models" / "yolov5n-160-10.onnx"),
                    help="YOLOv5 ONNX for the workers (default: the test model yolov5n@160)")
    ap.add_argument("--service-ms", type=float, default=40.0,
                    help="fastest worker's service time; others are 2x and 4x (default 40)")
    ap.add_argument("--slow-factor", type=float, default=25.0, help="transient-slow-worker slowdown factor (default 25)")
    ap.add_argument("--mix", choices=("one", "regions"), default="one",
                    help="requests: one small JPEG over and over (every request costs the same), or regions: "
                         "the region payloads a camera fleet escalates (bench/payload_mix.py), each worker's "
                         "time in proportion to the image's pixels as on a native-input worker")
    ap.add_argument("--pixel-unit", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="short runs, 80%% load only")
    ap.add_argument("--duration", type=float, default=None, help="seconds per (algorithm, load) run")
    ap.add_argument("--loads", default=None, help="comma-separated fractions of capacity (default .5,.8,.95)")
    ap.add_argument("--modes", default=None, help="comma-separated subset of " + ",".join(m for m, _ in MODES))
    ap.add_argument("--json", default=None, help="write raw results here")
    ap.add_argument("--no-slow", action="store_true", help="skip the transient-slow-worker runs")
    ap.add_argument("--capacity", action="store_true",
                    help="only the capacity mode: proxy CPU per request by payload size (gateway, nginx, direct)")
    ap.add_argument("--capacity-sizes", default=None,
                    help="capacity: payload sizes in KB, comma-separated (default 2,20,60,100)")
    ap.add_argument("--capacity-seconds", type=float, default=2.0, help="capacity: seconds per loaded round")
    ap.add_argument("--capacity-rounds", type=int, default=3,
                    help="capacity: interleaved rounds per cell, the median reported")
    ap.add_argument("--capacity-seq", type=int, default=300, help="capacity: sequential calls per path and size")
    ap.add_argument("--in-flight", type=int, default=8, help="capacity: concurrent requests in the loaded runs")
    ap.add_argument("--versus", type=int, default=0, metavar="ROUNDS",
                    help="only the shipped defaults (or the gateway rows named by --modes) against nginx "
                         "least_conn: ROUNDS paired rounds per load, each serving the same arrival sequence "
                         "back to back in rotating order")
    args = ap.parse_args()
    if args._worker:
        return worker_main(args)
    if args._echo:
        return echo_main(args)
    if args._floor:
        return floor_main(args)
    if args.capacity:
        return capacity_main(args)
    if not Path(args.model).exists():
        from edgewise_tools.models import build_onnx

        Path(args.model).parent.mkdir(parents=True, exist_ok=True)
        build_onnx("yolov5n", imgsz=160, nc=10, path=Path(args.model), names=tuple(map(str, range(10))), seed=0)
    duration = args.duration or (6.0 if args.quick else 20.0)
    loads = [float(x) for x in (args.loads or ("0.8" if args.quick else "0.5,0.8,0.95")).split(",")]
    modes = [m for m in MODES if args.modes is None or m[0] in args.modes.split(",")]
    if args.quick and args.modes is None:
        modes = [m for m in MODES if m[0] in ("rr", "p2c", "default", "wlc-cap", "nginx")]
    have_nginx = Path(NGINX).exists()
    d = Path(tempfile.mkdtemp(prefix="ew-bench-"))
    service = [args.service_ms, args.service_ms * 2, args.service_ms * 4]
    weights = [4.0, 2.0, 1.0]
    results: dict[str, dict[str, RunStats]] = {}
    extra: dict[str, float] = {}
    mix: list[bytes] | None = None
    pixel_unit = 0.0
    if args.mix == "regions":
        from payload_mix import describe, region_payloads

        payloads = region_payloads()
        mix = [p.jpeg for p in payloads]
        pixel_unit = sum(p.pixels for p in payloads) / len(payloads)
        print(f"# requests: {describe(payloads)}", flush=True)
    workers = start_workers(args.model, service, args.slow_factor, d, pixel_unit)
    addrs = [f"127.0.0.1:{port}" for _, port in workers]
    try:
        # capacity: each worker's measured compute (service) time per image, called directly
        # (with the mix: its mean over one pass through the mix)
        rates = []
        for a in addrs:
            comp: list[float] = []
            asyncio.run(direct_sequential(a, len(mix) if mix else 30, comp, mix))
            rates.append(1.0 / (sum(comp) / len(comp) if mix else sorted(comp)[len(comp) // 2]))
        capacity = sum(rates)
        print(f"# pool: service {service} ms -> measured rates {[round(r, 1) for r in rates]} req/s, "
              f"capacity {capacity:.1f} req/s; {duration:.0f} s per run", flush=True)
        if args.versus:
            if not have_nginx:
                raise SystemExit(f"--versus needs nginx at {NGINX} (apt-get install nginx)")
            versus(addrs, weights, capacity, [ld for ld in loads if ld > 0.5] or loads, args.versus,
                   args.duration or 10.0, d, [m for m, _ in modes if m != "nginx"] if args.modes else ["default"],
                   mix)
            return 0
        for mode, label in modes:
            if mode == "nginx" and not have_nginx:
                continue
            if mode == "nginx":
                proc, port = start_nginx(addrs, weights, d)
                mport = 0
            else:
                proc, port, mport = start_gateway(mode, addrs, weights, d)
            try:
                results[mode] = {}
                for i, ld in enumerate(loads):
                    st = asyncio.run(open_loop(f"127.0.0.1:{port}", ld * capacity, duration, 30.0, seed=100 + i,
                                               worker_api=mode == "nginx", mix=mix))
                    results[mode][f"{ld:.2f}"] = st
                    print(f"  {label:34s} load {ld:.0%}: {st.throughput:6.1f}/s p50 {st.pct(.5):7.1f} "
                          f"p95 {st.pct(.95):7.1f} p99 {st.pct(.99):7.1f} ms err {st.errors} "
                          f"split {dict(sorted(st.per_worker.items()))}", flush=True)
                if mode == "default":
                    extra["overhead_hist_p50_ms"] = overhead_hist_p50(mport)
            finally:
                proc.stop()
        # transient slow worker: the mid worker 25x slower for the middle third, 1 s deadline, 50% load
        slow_results: dict[str, RunStats] = {}
        bdur = 12.0 if args.quick else 30.0
        for mode, label in ([] if args.no_slow else modes):
            if mode not in ("rr", "p2c", "lc", "default", "wlc-cap", "nginx") or (mode == "nginx" and not have_nginx):
                continue
            if mode == "nginx":
                proc, port = start_nginx(addrs, weights, d)
            else:
                proc, port, _ = start_gateway(mode, addrs, weights, d)
            state = {"slow": False, "done": False}
            wproc = workers[1][0]

            def tick(t: float, state=state, wproc=wproc, bdur=bdur) -> None:  # type: ignore[no-untyped-def]
                want = bdur / 3 <= t < 2 * bdur / 3
                if want != state["slow"]:
                    wproc.signal(signal.SIGUSR1)
                    state["slow"] = want

            try:
                st = asyncio.run(open_loop(f"127.0.0.1:{port}", 0.5 * capacity, bdur, 1.0, seed=7, on_tick=tick,
                                           worker_api=mode == "nginx", mix=mix))
                slow_results[mode] = st
                print(f"  (b) {label:30s} success {len(st.ok_lat) / max(1, st.sent):.2%} p99 {st.pct(.99):.0f} ms "
                      f"errors {st.errors}", flush=True)
            finally:
                if state["slow"]:
                    wproc.signal(signal.SIGUSR1)
                proc.stop()
                time.sleep(1.0)  # let the slow worker's queue drain
        # overhead of the extra hop, against an echo worker (no model): direct vs gateway vs nginx
        eport = free_port()
        echo = Proc([sys.executable, str(Path(__file__).resolve()), "--_echo", "--port", str(eport)],
                    d / "echo.log", r"EDGEWISE_WORKER_SERVING port=(\d+)")
        ea = f"127.0.0.1:{eport}"
        gproc, gport, _ = start_gateway("default", [ea], [1.0], d)
        targets = {"direct": (ea, True), "gateway": (f"127.0.0.1:{gport}", False)}
        nproc = None
        if have_nginx:
            nproc, nport = start_nginx([ea], [1.0], d)
            targets["nginx"] = (f"127.0.0.1:{nport}", True)
        try:
            lat = asyncio.run(interleaved(targets, 200 if args.quick else 600))
            for k, v in lat.items():
                extra[f"{k}_p50_ms"] = p(v, .5)
        finally:
            gproc.stop()
            echo.stop()
            if nproc is not None:
                nproc.stop()
    finally:
        for w, _ in workers:
            w.stop()
        shutil.rmtree(d, ignore_errors=True)

    # ---- report -----------------------------------------------------------------------------
    print()
    print(f"Pool: 3 workers, service rates {rates[0]:.0f}/{rates[1]:.0f}/{rates[2]:.0f} req/s (4:2:1, "
          f"yolov5n ONNX inference padded to {service[0]:g}/{service[1]:g}/{service[2]:g} ms, batch 1); "
          f"capacity {capacity:.0f} req/s; open-loop Poisson, {duration:g} s per cell.")
    print()
    print("| algorithm | load | throughput (req/s) | p50 ms | p95 ms | p99 ms | p99 / RR | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, label in modes:
        if mode not in results:
            continue
        for ld, st in results[mode].items():
            rr = results.get("rr", {}).get(ld)
            ratio = f"{st.pct(.99) / rr.pct(.99):.2f}" if rr and rr.ok_lat else "-"
            errs = sum(st.errors.values())
            print(f"| {label} | {float(ld):.0%} | {st.throughput:.1f} | {st.pct(.5):.1f} | {st.pct(.95):.1f} | "
                  f"{st.pct(.99):.1f} | {ratio} | {errs} |")
    if "default" in results and "nginx" in results:
        print()
        for ld in results["default"]:
            ours, ng = results["default"][ld], results["nginx"].get(ld)
            if ng is not None and ng.ok_lat and ours.ok_lat:
                r = ours.pct(.99) / ng.pct(.99)
                print(f"- shipped defaults vs nginx least_conn at {float(ld):.0%} load: p99 {ours.pct(.99):.1f} vs "
                      f"{ng.pct(.99):.1f} ms ({r:.2f}x; target <= 1.00x: {'met' if r <= 1.0 else 'NOT met'})")
    if slow_results:
        print()
        print(f"Transient slow worker: the 2x worker {args.slow_factor:g}x slower for the middle third of a "
              f"{bdur:g} s run at 50% load; 1 s deadline per request.")
        print()
        print("| algorithm | success within 1 s | p50 ms | p99 ms (answered) | errors |")
        print("|---|---|---|---|---|")
        for mode, label in modes:
            if mode in slow_results:
                st = slow_results[mode]
                print(f"| {label} | {len(st.ok_lat) / max(1, st.sent):.2%} | {st.pct(.5):.1f} | {st.pct(.99):.1f} | "
                      f"{st.errors} |")
    if extra:
        print()
        ng = (f", through nginx {extra['nginx_p50_ms']:.2f} ms (+{extra['nginx_p50_ms'] - extra['direct_p50_ms']:.2f})"
              if "nginx_p50_ms" in extra else "")
        print(f"Gateway overhead (sequential calls to an echo worker, p50): direct {extra['direct_p50_ms']:.2f} ms, "
              f"through the gateway {extra['gateway_p50_ms']:.2f} ms "
              f"(+{extra['gateway_p50_ms'] - extra['direct_p50_ms']:.2f}){ng}; the gateway's own time outside "
              f"the worker call (overhead histogram, under load) p50 <= {extra.get('overhead_hist_p50_ms', 0):.2f} ms.")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "capacity": capacity, "rates": rates, "extra": extra,
            "runs": {m: {ld: {"p50": s.pct(.5), "p95": s.pct(.95), "p99": s.pct(.99), "tput": s.throughput,
                              "errors": s.errors, "split": s.per_worker} for ld, s in r.items()}
                     for m, r in results.items()},
            "slow": {m: {"success": len(s.ok_lat) / max(1, s.sent), "p99": s.pct(.99), "errors": s.errors}
                     for m, s in slow_results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
