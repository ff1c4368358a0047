"""``edgewise cloud worker``: run one YOLOv5 worker (gRPC ``Worker`` + health + metrics).

Settings, later wins: ``--config`` YAML < environment ``EDGEWISE_WORKER__<KEY>__<SUBKEY>``
< ``--set KEY.PATH=VALUE`` < the named flags (only those given). With ``--port 0`` the bound port is
printed as ``EDGEWISE_WORKER_LISTENING port=N metrics_port=M worker_id=ID`` so a
parent process (``edgewise cloud up``, tests) can find it; ``EDGEWISE_WORKER_SERVING``
follows once warm-up is done.
"""

import argparse
from typing import Any

from cloud.worker.settings import SCHEMA
from edgewise.settings import add_settings_arguments, settings_from_args


def register(subparsers: Any) -> None:
    """Add ``worker`` to the ``cloud`` group."""
    p = subparsers.add_parser(
        "worker",
        help="serve a YOLOv5 ONNX model with dynamic batching (gRPC Worker service)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_settings_arguments(p, SCHEMA)
    p.set_defaults(func=handle, own_sigterm=True)  # drains on SIGTERM (edgewise.cli)


def handle(args: argparse.Namespace) -> int:
    """Load settings, run the worker until SIGTERM, return the exit status."""
    import asyncio

    from cloud.worker.server import serve
    return asyncio.run(serve(settings_from_args(args, SCHEMA)))
