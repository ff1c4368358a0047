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

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import yaml

from edgewise.errors import ConfigError
from edgewise.filereads import SMALL_FILE_BYTES, read_capped
from edgewise.filewatch import Identities, ReloadDecision, identities_of

log = logging.getLogger(__name__)

#: urllib3 retries per API call: none, so ``_request_timeout`` bounds the whole call
API_RETRIES = 0


@dataclass(frozen=True)
class KubeAccess:
    """How to reach the API server."""

    api_server: str | None = None
    token: str | None = None
    #: file the token came from: re-read whenever it changes, since kubelet rotates projected
    #: service-account tokens in place (a token read once is refused after it expires)
    token_file: str | None = None
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
            _set_token(cfg, access.token)
            cfg.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
        if access.token_file:
            cfg.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
            hook = _TokenFile(access.token_file, access.token)
            cfg.refresh_api_key_hook = hook  # type: ignore[assignment]  # the client annotates it as None
            hook(cfg)
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
    except (config.ConfigException, OSError, ValueError, TypeError, AttributeError, yaml.YAMLError) as exc:
        # beyond its own ConfigException, the client lets through what its YAML reading of a file that
        # is no kubeconfig raises: UnicodeDecodeError (binary), a YAMLError, TypeError (a list at the top)
        where = access.kubeconfig or os.environ.get("KUBECONFIG", "~/.kube/config")
        why = " ".join(str(exc).split())  # a YAMLError spans lines
        raise ConfigError(f"no Kubernetes access: not in a cluster and kubeconfig {where} failed ({why}); "
                          "pass --kubeconfig, --api-server URL with a token, or run in-cluster") from None
    cfg.retries = API_RETRIES
    return client.ApiClient(cfg)


#: a token file that could not be used is read again, unchanged, at most this often (the old code
#: read it at every call; a call costs a round trip to the API server anyway)
TOKEN_RETRY_S = 1.0


def _set_token(cfg: Any, token: str) -> None:
    cfg.api_key = {"BearerToken": token, "authorization": token}


def read_token_file(path: str) -> str:
    """The bearer token in the file at ``path`` (a projected service account token), stripped;
    ConfigError saying what is wrong (unreadable, not a regular file: a named pipe would block,
    not UTF-8, empty). The one rule of the gateway's discovery and the autoscaler, at start and
    at every rotation (``_TokenFile``): the start took an empty file as the token ``''`` and
    a non-UTF-8 one was a traceback (found by a probe)."""
    try:
        data, _ = read_capped(path, SMALL_FILE_BYTES, "a token file")
        token = data.decode("utf-8").strip()
    except ConfigError as exc:  # not a regular file: said without the path, which callers name
        raise ConfigError(str(exc).replace(f"{path}: ", "", 1)) from None
    except UnicodeDecodeError:
        raise ConfigError("it is not UTF-8 text (a bearer token is)") from None
    except OSError as exc:
        raise ConfigError(str(exc.strerror or exc)) from None
    if not token:
        raise ConfigError("it is empty")
    return token


class _TokenFile:
    """``Configuration.refresh_api_key_hook`` (called before every request) that re-reads the token
    file when it changed, by the rule every followed file has (``edgewise.filewatch.ReloadDecision``):
    kubelet replaces a projected token by swapping a symlink, so the new token is used from the
    next request. An unreadable or empty file keeps the token in use (logged once per change
    and problem) and is read again, unchanged, at most every :data:`TOKEN_RETRY_S`: a read error
    that passes (``EIO``, too many open files) at the moment kubelet rotates the token does not
    hold the new one back until the next rotation (about 48 min, past the old one's expiry)."""

    def __init__(self, path: str, token: str | None) -> None:
        self.path = path
        self._token = token
        # with a token given, the file as it is now is what it came from; without, it is read first
        served: Identities = identities_of((path,)) if token is not None else ()
        self._watch: ReloadDecision[str] = ReloadDecision(served, time.monotonic(), interval_s=0.0,
                                                          retry_s=TOKEN_RETRY_S)
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> _TokenFile:  # Configuration copies: share the file's state
        return self

    def _read(self) -> str:
        return read_token_file(self.path)

    def __call__(self, cfg: Any) -> None:
        with self._lock:
            out = self._watch.look(time.monotonic(), lambda: identities_of((self.path,)), self._read)
            if out.problem is not None:
                log.warning("kubernetes token_file %s: cannot read it (%s); keeping the token read before",
                            self.path, out.problem)
            elif out.files is not None:
                if self._token is not None and out.files != self._token:
                    log.info("kubernetes token_file %s changed: using the new token", self.path)
                self._token = out.files
            if self._token is not None:
                _set_token(cfg, self._token)
