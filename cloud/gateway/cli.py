"""``edgewise cloud gateway`` and ``edgewise cloud up`` (local pool) commands."""

from __future__ import annotations

import argparse
from typing import Any

from cloud.gateway.settings import SCHEMA
from edgewise.settings import add_settings_arguments, settings_from_args


def register(subparsers: Any) -> None:
    gw = subparsers.add_parser(
        "gateway", help="run the gateway (Escalation service, balancer, MQTT bridge)",
        description="Serve the edge-facing Escalation service and route requests to workers by "
                    "weighted least-connections. Settings, later wins: --config YAML < environment "
                    "EDGEWISE_GATEWAY__<KEY>__<SUBKEY> < --set KEY.PATH=VALUE < the named flags.")
    add_settings_arguments(gw, SCHEMA)
    gw.set_defaults(func=_gateway, reloads_on_sighup=True)

    up = subparsers.add_parser(
        "up", help="start N workers and a gateway on this machine",
        description="Local pool: N worker processes and one gateway process (static discovery). "
                    "Prints the gateway address; Ctrl-C, SIGTERM or SIGHUP (a closed terminal) stops everything cleanly, "
                    "also while it starts.")
    up.add_argument("--workers", type=int, default=2, help="number of worker processes (default 2)")
    up.add_argument("--model", required=True, help="YOLOv5 ONNX model for the workers")
    up.add_argument("--port", type=int, default=50051, help="gateway gRPC port (0 = any; default 50051)")
    up.add_argument("--metrics-port", type=int, default=0, help="gateway HTTP side port (0 = any)")
    up.add_argument("--worker-threads", type=int, default=1, help="intra-op threads per worker (default %(default)s)")
    up.add_argument("--weights", help="comma-separated worker weights, e.g. 4,2,1")
    up.add_argument("--gateway-config", help="extra gateway YAML (workers are filled in)")
    up.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="extra argument passed to every worker (repeatable)")
    up.set_defaults(func=_up, own_sigterm=True)  # stops its pool on SIGTERM itself (edgewise.cli)


def _gateway(args: argparse.Namespace) -> int:
    import asyncio

    from cloud.gateway.server import serve

    settings = settings_from_args(args, SCHEMA)
    asyncio.run(serve(settings, reload=lambda: settings_from_args(args, SCHEMA)))
    return 0


def _up(args: argparse.Namespace) -> int:
    import signal
    import threading

    from cloud.local import LocalCloud
    from edgewise.cli import Terminated
    from edgewise.errors import ConfigError

    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: the pool needs at least one worker")
    weights = None
    if args.weights:
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            raise ConfigError(f"--weights {args.weights!r}: expected numbers like 4,2,1") from None
    stop = threading.Event()
    started = threading.Event()

    def on_signal(sig: int, _frame: object) -> None:
        if not started.is_set():  # during the start (minutes of warm-up): stop what was started, now
            raise Terminated if sig == signal.SIGTERM else KeyboardInterrupt  # exit 143 or 130 (edgewise.cli)
        stop.set()

    # SIGHUP too: a closed terminal left the gateway and workers running (their own sessions)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with LocalCloud(args.model, workers=args.workers, port=args.port, metrics_port=args.metrics_port,
                        worker_threads=args.worker_threads, weights=weights,
                        gateway_config=args.gateway_config, worker_args=args.worker_arg, flags=True) as cloud:
            started.set()
            print(f"gateway: {cloud.address}  (metrics http://127.0.0.1:{cloud.metrics_port}/metrics, "
                  f"pool http://127.0.0.1:{cloud.metrics_port}/pool)", flush=True)
            for i, w in enumerate(cloud.worker_addresses):
                print(f"worker {i}: {w}", flush=True)
            while not stop.wait(0.5):
                if cloud.gateway_exited():
                    print("gateway exited; stopping", flush=True)
                    return 1
        return 0
    finally:  # the caller's handlers back (an in-process caller; the dispatcher's own SIGHUP hold)
        for sig, handler in previous.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)
