"""``edgewise cloud autoscaler``: scale the worker Deployment on the gateways' pool load.

Example::

    edgewise cloud autoscaler --gateway-url http://edgewise-gateway:9100 \\
        --namespace prod --deployment edgewise-worker --target-utilization 0.7 \\
        --min 1 --max 20 --interval 15 --dry-run

Flags override ``EDGEWISE_AUTOSCALER_*`` variables, which override ``--config``
YAML (see :mod:`cloud.autoscaler.settings` for every key).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "autoscaler", help="scale the worker Deployment with the HPA algorithm on pool load",
        description="Poll the gateways' /pool, compute desired worker replicas with the HPA algorithm "
                    "(tolerance, stabilization window, rate limits, min/max) and patch the worker "
                    "Deployment's scale subresource.")
    a = p.add_argument
    a("--config", help="YAML settings file (keys of cloud.autoscaler.settings.AutoscalerSettings)")
    a("--gateway-url", action="append", dest="gateway_urls", metavar="URL",
      help="gateway side-port base URL, e.g. http://gw:9100 (repeatable)")
    a("--namespace", help="namespace of the worker Deployment")
    a("--deployment", help="worker Deployment name (default edgewise-worker)")
    a("--target-utilization", type=float, help="target Σ in-flight / Σ capacity (default 0.7)")
    a("--queue-wait-slo-ms", type=float, help="target p90 queue wait in ms (with both, the max wins)")
    a("--min", type=int, dest="min_replicas", help="minimum replicas (>= 1)")
    a("--max", type=int, dest="max_replicas", help="maximum replicas")
    a("--interval", type=float, dest="interval_s", help="seconds between decisions (default 15)")
    a("--tolerance", type=float, help="no change within this ratio band (default 0.1)")
    a("--scale-down-stabilization", type=float, metavar="SECONDS",
      help="scale-down stabilization window (default 300)")
    a("--dry-run", action="store_true", default=None, help="print decisions, never patch")
    a("--metrics-port", type=int, help="Prometheus port (default 9102; 0 = any free port)")
    a("--metrics-host", help="Prometheus listen address (default 0.0.0.0)")
    a("--api-server", help="explicit Kubernetes API server URL (default: in-cluster or kubeconfig)")
    a("--token-file", help="bearer token file for --api-server")
    a("--kubeconfig", help="kubeconfig path")
    a("--context", help="kubeconfig context")
    p.set_defaults(func=handler)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line, as a nested settings mapping."""
    out: dict[str, Any] = {}
    for key in ("gateway_urls", "target_utilization", "queue_wait_slo_ms", "min_replicas", "max_replicas",
                "interval_s", "tolerance", "dry_run", "metrics_port", "metrics_host"):
        v = getattr(args, key, None)
        if v is not None:
            out[key] = v
    kube = {k: getattr(args, a) for k, a in (
        ("namespace", "namespace"), ("deployment", "deployment"), ("api_server", "api_server"),
        ("token_file", "token_file"), ("kubeconfig", "kubeconfig"), ("context", "context"))
        if getattr(args, a, None) is not None}
    if kube:
        out["kubernetes"] = kube
    if getattr(args, "scale_down_stabilization", None) is not None:
        out["scale_down"] = {"stabilization_window_s": args.scale_down_stabilization}
    return out


def handler(args: argparse.Namespace) -> int:
    from cloud.autoscaler.settings import load_settings

    settings = load_settings(args.config, flags_from_args(args))
    return asyncio.run(serve(settings))


async def serve(settings: Any) -> int:
    """Run the loop until SIGTERM/SIGINT. ``settings`` is an AutoscalerSettings."""
    from prometheus_client import start_http_server

    from cloud.autoscaler.kube import DeploymentScale
    from cloud.autoscaler.loop import AutoscalerLoop, AutoscalerMetrics, GatewayPoller
    from cloud.autoscaler.scaling import Scaler
    from cloud.discovery.kubeclient import KubeAccess, build_api_client

    k = settings.kubernetes
    api = build_api_client(KubeAccess(api_server=k.api_server, token=k.token, ca_file=k.ca_file,
                                      verify_tls=k.verify_tls, kubeconfig=k.kubeconfig, context=k.context))
    metrics = AutoscalerMetrics()
    server = None
    if settings.metrics_port is not None:
        server, _thread = start_http_server(settings.metrics_port, settings.metrics_host,
                                            registry=metrics.registry)
        log.info("autoscaler: metrics on %s:%d", settings.metrics_host, server.server_port)
    target = DeploymentScale(api, k.namespace, k.deployment, dry_run=settings.dry_run,
                             request_timeout_s=k.request_timeout_s)
    poller = GatewayPoller(settings.gateway_urls, timeout_s=settings.gateway_timeout_s,
                           resolve=settings.resolve_gateways, metrics=metrics)
    loop = AutoscalerLoop(Scaler(settings.scaler_config()), target, poller, metrics=metrics,
                          interval_s=settings.interval_s)
    ev = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        ev.add_signal_handler(sig, loop.stop)
    log.info("autoscaler: %s/%s, min %d max %d, every %.0f s%s", k.namespace, k.deployment,
             settings.min_replicas, settings.max_replicas, settings.interval_s,
             " (dry run)" if settings.dry_run else "")
    try:
        await loop.run()
    finally:
        if server is not None:
            server.shutdown()
        api.close()
    return 0
