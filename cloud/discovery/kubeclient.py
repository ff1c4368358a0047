"""Building a ``kubernetes`` API client: explicit URL + token, in-cluster, or kubeconfig.

Shared by the EndpointSlice discovery and the autoscaler. Order of precedence:
an explicit ``api_server`` URL (out-of-cluster runs and local test servers),
else the in-cluster service-account config when ``KUBERNETES_SERVICE_HOST`` is
set, else the kubeconfig (``$KUBECONFIG`` / ``~/.kube/config``, optional context).

Every client makes one attempt per call (no urllib3 retries): the callers pass a
``_request_timeout`` that is meant as the whole call's budget, and their own loops
retry (the next autoscaler tick, the discovery watch's back-off). The client's
default of 3 retries made one read of a hung API server take 4x the timeout, and
a SIGTERM wait that long.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from edgewise.errors import ConfigError

#: urllib3 retries per API call: none, so ``_request_timeout`` bounds the whole call
API_RETRIES = 0


@dataclass(frozen=True)
class KubeAccess:
    """How to reach the API server."""

    api_server: str | None = None
    token: str | None = None
    ca_file: str | None = None
    verify_tls: bool = True
    kubeconfig: str | None = None
    context: str | None = None


def build_api_client(access: KubeAccess) -> Any:
    """A ``kubernetes.client.ApiClient`` for ``access``; ConfigError says what to fix."""
    from kubernetes import client, config

    if access.api_server:
        cfg = client.Configuration()
        cfg.host = access.api_server.rstrip("/")
        if access.token:
            cfg.api_key = {"BearerToken": access.token, "authorization": access.token}
            cfg.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
        cfg.verify_ssl = access.verify_tls
        if access.ca_file:
            cfg.ssl_ca_cert = access.ca_file
        cfg.retries = API_RETRIES
        return client.ApiClient(cfg)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as exc:
            raise ConfigError(f"in-cluster Kubernetes config is broken ({exc}); check the pod's "
                              "service account token mount, or pass an explicit API server URL") from None
        cfg.retries = API_RETRIES
        return client.ApiClient(cfg)
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=access.kubeconfig, context=access.context,
                                client_configuration=cfg)
    except (config.ConfigException, OSError) as exc:
        where = access.kubeconfig or os.environ.get("KUBECONFIG", "~/.kube/config")
        raise ConfigError(f"no Kubernetes access: not in a cluster and kubeconfig {where} failed ({exc}); "
                          "pass --kubeconfig, --api-server URL with a token, or run in-cluster") from None
    cfg.retries = API_RETRIES
    return client.ApiClient(cfg)
