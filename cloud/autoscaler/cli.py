"""``edgewise cloud autoscaler``: scale the worker Deployment on the gateways' pool load.

Example::

    edgewise cloud autoscaler --gateway-url http://edgewise-gateway:9100 \\
        --namespace prod --deployment edgewise-worker --target-utilization 0.7 \\
        --min 1 --max 20 --interval 15 --dry-run

Settings, later wins: ``--config`` YAML < environment ``EDGEWISE_AUTOSCALER__<KEY>__<SUBKEY>``
< ``--set KEY.PATH=VALUE`` < the named flags (``--describe-settings`` lists every key).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from cloud.autoscaler.settings import SCHEMA, with_token
from edgewise.settings import add_settings_arguments, settings_from_args

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "autoscaler", help="scale the worker Deployment with the HPA algorithm on pool load",
        description="Poll the gateways' /pool, compute desired worker replicas with the HPA algorithm "
                    "(tolerance, stabilization window, rate limits, min/max) and patch the worker "
                    "Deployment's scale subresource.")
    add_settings_arguments(p, SCHEMA)
    p.set_defaults(func=handler, own_sigterm=True)  # stops on SIGTERM itself (edgewise.cli)


def handler(args: argparse.Namespace) -> int:
    return asyncio.run(serve(with_token(settings_from_args(args, SCHEMA))))


async def serve(settings: Any) -> int:
    """Run the loop until SIGTERM/SIGINT. ``settings`` is an AutoscalerSettings."""
    from cloud.autoscaler.kube import DeploymentScale
    from cloud.autoscaler.loop import (
        AutoscalerLoop,
        AutoscalerMetrics,
        GatewayPoller,
        stall_after_s,
    )
    from cloud.autoscaler.scaling import Scaler
    from cloud.binding import socket_port_async
    from cloud.discovery.kubeclient import KubeAccess, build_api_client
    from cloud.gateway.http import SidePort
    from edgewise.addresses import format_address

    k = settings.kubernetes
    api = build_api_client(KubeAccess(api_server=k.api_server, token=k.token, token_file=k.token_file,
                                      ca_file=k.ca_file,
                                      verify_tls=k.verify_tls, kubeconfig=k.kubeconfig, context=k.context))
    metrics = AutoscalerMetrics()
    target = DeploymentScale(api, k.namespace, k.deployment, dry_run=settings.dry_run,
                             request_timeout_s=k.request_timeout_s)
    poller = GatewayPoller(settings.gateway_urls, timeout_s=settings.gateway_timeout_s,
                           resolve=settings.resolve_gateways, metrics=metrics)
    loop = AutoscalerLoop(Scaler(settings.scaler_config()), target, poller, metrics=metrics,
                          interval_s=settings.interval_s,
                          stall_after_s=stall_after_s(settings.interval_s, settings.gateway_timeout_s,
                                                      k.request_timeout_s))
    server = None
    listen = settings.metrics_listen_port()
    if listen is not None:
        server = SidePort(metrics.registry, healthy=loop.alive)  # /healthz: the chart's liveness probe
        port = await socket_port_async(lambda: server.start(settings.metrics_host, listen),
                                       format_address(settings.metrics_host, listen),
                                       "metrics_host/metrics_port")
        log.info("autoscaler: metrics and /healthz on %s", format_address(settings.metrics_host, port))
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
            await server.stop()
        api.close()
    return 0
