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

That timeout bounds each socket read, not the answer: an API server, or a proxy in front of
it, that trickled its answer a byte every half second held a read for as long as it
trickled (76 s with a 2 s timeout), and a stop with it. So a client's connections are noted
per thread (:func:`track_calls`) and :func:`deadline` shuts the socket of a call still running
at its time budget down, which ends any read in progress. (Leaving the call to a daemon thread
instead aborted the process at exit: a daemon thread that wakes while the interpreter finalizes
calls ``pthread_exit``, which aborts on this CPython.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
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


def track_calls(api_client: Any, calls: dict[int, Any]) -> None:
    """Make ``api_client``'s connections note themselves in ``calls`` (by thread) as each
    connects (the TLS handshake included) and as each request starts, so that a deadline can
    shut the socket of the call it bounds. The manager's own pool classes are extended, so a
    proxy's (SOCKS: extra connection arguments) keep working."""
    def noted(base: Any) -> Any:
        class Noted(base):  # type: ignore[misc,valid-type]
            noted_sock: Any = None  # kept: an answer with "Connection: close" takes the socket from the connection

            def connect(self) -> Any:
                calls[threading.get_ident()] = self
                super().connect()
                self.noted_sock = self.sock

            def request(self, *args: Any, **kwargs: Any) -> Any:
                calls[threading.get_ident()] = self
                return super().request(*args, **kwargs)
        return Noted

    manager = api_client.rest_client.pool_manager
    manager.pool_classes_by_scheme = {
        scheme: type(f"Noted{pool.__name__}", (pool,), {"ConnectionCls": noted(pool.ConnectionCls)})
        for scheme, pool in manager.pool_classes_by_scheme.items()}


def shut_call(conn: Any) -> None:
    """Shut down the socket of urllib3 connection ``conn``, ending any read or handshake on it:
    the one it holds, else the one its request went out on (http.client hands that to the
    response of a "Connection: close" answer; closed in name, it is open until the answer is
    read). Through an HTTPS proxy to an HTTPS server it is urllib3's TLS-in-TLS wrapper, whose
    ``socket`` is the real one."""
    sock = getattr(conn, "sock", None) or getattr(conn, "noted_sock", None)
    sock = getattr(sock, "socket", sock)
    if sock is not None:
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def deadline(calls: dict[int, Any], timeout_s: float) -> Iterator[Callable[[], bool]]:
    """Bound the API call this thread makes inside the block (on a client :func:`track_calls`
    notes into ``calls``) to ``timeout_s`` in all: at the deadline its socket is shut down, so
    the call fails at once. Yields whether that happened: a failure then is the deadline's (an
    answer that came, a 409, is still one)."""
    me = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "expired": False}

    def expire() -> None:
        with lock:  # never after the call ended: its connection may serve the next one
            if not state["done"]:
                state["expired"] = True
                shut_call(calls.get(me))

    timer = threading.Timer(timeout_s, expire)  # not a daemon: cancelled, it ends at once
    timer.start()
    try:
        yield lambda: state["expired"]
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
        calls.pop(me, None)
