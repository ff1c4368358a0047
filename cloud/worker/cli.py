"""``edgewise cloud worker``: run one YOLOv5 worker (gRPC ``Worker`` + health + metrics).

Flags override the YAML file (``--config``) and the environment
(``EDGEWISE_WORKER_*``) only when given. With ``--port 0`` the bound port is
printed as ``EDGEWISE_WORKER_LISTENING port=N metrics_port=M worker_id=ID`` so a
parent process (``edgewise cloud up``, tests) can find it; ``EDGEWISE_WORKER_SERVING``
follows once warm-up is done.
"""

import argparse
from typing import Any


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 4,8, got {text!r}") from None


#: flag dest -> settings key path
_FLAG_KEYS = {
    "model": "model",
    "host": "host",
    "port": "port",
    "metrics_port": "metrics_port",
    "worker_id": "worker_id",
    "threads": "threads",
    "grace": "grace_s",
    "max_message_bytes": "max_message_bytes",
    "conf": "conf_threshold",
    "iou": "iou_threshold",
    "max_batch": "batching.max_batch_size",
    "max_delay_ms": "batching.max_queue_delay_ms",
    "preferred_batch": "batching.preferred_batch_sizes",
    "queue_size": "batching.max_queue_size",
}


def register(subparsers: Any) -> None:
    """Add ``worker`` to the ``cloud`` group."""
    p = subparsers.add_parser(
        "worker",
        help="serve a YOLOv5 ONNX model with dynamic batching (gRPC Worker service)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = argparse.SUPPRESS  # absent flags do not override the file / environment
    p.add_argument("--config", default=None, help="worker YAML settings file")
    p.add_argument("--model", default=d, help="YOLOv5 ONNX model (dynamic batch axis)")
    p.add_argument("--host", default=d, help="bind address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=d, help="gRPC port, 0 = any free port (default 50061)")
    p.add_argument("--metrics-port", type=int, default=d, help="Prometheus port, 0 = any, -1 = off (default 9101)")
    p.add_argument("--worker-id", default=d, help="name in responses and load reports (default host-pid)")
    p.add_argument("--threads", type=int, default=d, help="ONNX Runtime intra-op threads (0 = its default)")
    p.add_argument("--grace", type=float, default=d, help="seconds to drain on SIGTERM (default 10)")
    p.add_argument("--max-message-bytes", type=int, default=d, help="largest request (default 8 MiB)")
    p.add_argument("--conf", type=float, default=d, help="score threshold (default 0.25)")
    p.add_argument("--iou", type=float, default=d, help="NMS IoU threshold (default 0.45)")
    p.add_argument("--max-batch", type=int, default=d, help="most images per model call (default 8)")
    p.add_argument("--max-delay-ms", type=float, default=d, help="longest wait for a fuller batch (default 5)")
    p.add_argument("--preferred-batch", type=_sizes, default=d, help="sizes sent at once, e.g. 4,8")
    p.add_argument("--queue-size", type=int, default=d, help="most waiting requests before rejecting (default 64)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    """Load settings, run the worker until SIGTERM, return the exit status."""
    import asyncio

    from cloud.worker.server import serve
    from cloud.worker.settings import load_settings

    overrides = {key: getattr(args, dest) for dest, key in _FLAG_KEYS.items() if hasattr(args, dest)}
    settings = load_settings(args.config, overrides=overrides)
    return asyncio.run(serve(settings))
