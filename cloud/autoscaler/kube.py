"""The scale target: the worker Deployment's ``scale`` subresource via the ``kubernetes`` client.

Reads ``GET /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`` (HPA reads
``spec.replicas`` as the current count) and writes the decision as a JSON merge
patch ``{"spec": {"replicas": N}}`` to the same subresource, carrying the
resourceVersion it read so a concurrent change by someone else fails with 409
instead of being overwritten (the next tick re-reads). In dry-run mode the
decision is printed and nothing is patched.

The client is blocking; the loop calls these methods in a worker thread. Its timeout
(``_request_timeout``) bounds each socket read, not the answer: an API server, or a proxy in
front of it, that trickled its answer a byte every half second held a read for 76 s with a 2 s
timeout, and the daemon's SIGTERM with it. So the client's connections are tracked per thread
(``_track``), and a timer shuts the socket of a call still running after ``request_timeout_s``
down, which ends any read in progress; the call is then unavailable, like a timeout. (Leaving
the call to a daemon thread instead aborted the process at exit: a daemon thread that wakes
while the interpreter finalizes calls ``pthread_exit``, which aborts on this CPython.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from edgewise.errors import ConfigError, UnavailableError

log = logging.getLogger(__name__)


class ScaleConflictError(UnavailableError):
    """The scale changed between our read and our patch (409): someone else scaled meanwhile.

    An expected outcome of optimistic concurrency, not a fault: nothing was overwritten, and the
    next tick re-reads and decides again."""


@dataclass(frozen=True)
class ScaleState:
    """What the scale subresource says now."""

    spec_replicas: int
    status_replicas: int
    resource_version: str | None = None


class ScaleTarget(Protocol):
    """The seam between the loop and whatever holds the replica count."""

    def read(self) -> ScaleState: ...

    def apply(self, replicas: int, state: ScaleState, reason: str) -> bool:
        """Set the replica count; False when it was not applied (dry run)."""
        ...


def _field(obj: Any, *names: str) -> Any:
    for n in names:
        if isinstance(obj, dict):
            if n in obj:
                return obj[n]
        elif hasattr(obj, n):
            return getattr(obj, n)
    return None


class DeploymentScale:
    """:class:`ScaleTarget` over ``AppsV1Api`` ``*_namespaced_deployment_scale``."""

    def __init__(self, api_client: Any, namespace: str, name: str, *, dry_run: bool = False,
                 request_timeout_s: float = 10.0, out: Callable[[str], None] | None = None) -> None:
        from kubernetes import client

        self.api = client.AppsV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.dry_run = dry_run
        self.timeout = request_timeout_s
        self.out = out or (lambda line: print(line, file=sys.stdout, flush=True))
        self._calls: dict[int, Any] = {}  # thread ident -> the connection its call is using
        _track(api_client, self._calls)

    @property
    def _what(self) -> str:
        return f"deployment {self.namespace}/{self.name} scale"

    def _bounded(self, verb: str, call: Callable[[], Any]) -> Any:
        """``call()``'s result within ``timeout`` seconds in all, else UnavailableError; its
        errors as ``_error`` says them (module doc)."""
        from kubernetes.client.exceptions import ApiException

        me = threading.get_ident()
        lock = threading.Lock()
        state = {"done": False, "expired": False}

        def expire() -> None:
            with lock:  # never after the call ended: its connection may serve the next one
                if not state["done"]:
                    state["expired"] = True
                    _shut(self._calls.get(me))

        timer = threading.Timer(self.timeout, expire)  # not a daemon: cancelled, it ends at once
        timer.start()
        try:
            return call()
        except Exception as exc:
            if state["expired"] and not isinstance(exc, ApiException):  # an answer (a 409) is one
                raise self._timed_out(verb) from None
            raise self._error(verb, exc) from exc
        finally:
            with lock:
                state["done"] = True
            timer.cancel()
            self._calls.pop(me, None)

    def _timed_out(self, verb: str) -> UnavailableError:
        """No answer, or not all of it, within the time budget (a silent or a trickling server)."""
        return UnavailableError(f"{verb} {self._what}: no answer within kubernetes.request_timeout_s "
                                f"({self.timeout:g} s); check the API server and the network to it")

    def _error(self, verb: str, exc: Exception) -> Exception:
        from kubernetes.client.exceptions import ApiException

        what = self._what
        if isinstance(exc, ApiException):
            status = exc.status
            if status == 404:
                return ConfigError(f"{verb} {what}: not found (404); check --namespace and --deployment")
            if status == 409:
                return ScaleConflictError(f"{verb} {what}: it changed since it was read (409 Conflict; someone "
                                          "else scaled it); nothing was overwritten, the next tick re-reads it")
            if status == 401:
                return ConfigError(f"{verb} {what}: unauthorized (401): the API server rejected the token "
                                   "(expired, rotated or revoked, or one for another cluster); check "
                                   "kubernetes.token_file or the pod's service-account token")
            if status == 403:
                return ConfigError(f"{verb} {what}: forbidden (403); the service account needs "
                                   "get/patch on deployments/scale in that namespace")
            return UnavailableError(f"{verb} {what}: API server answered {status} {exc.reason}")
        from urllib3.exceptions import MaxRetryError, NewConnectionError
        from urllib3.exceptions import TimeoutError as Urllib3Timeout

        if isinstance(exc, MaxRetryError) and exc.reason is not None:  # one attempt: say what failed
            exc = exc.reason
        if isinstance(exc, NewConnectionError):  # refused, unreachable, a name that does not resolve
            # (urllib3 2 derives it from its connect timeout, so it is told apart first)
            return UnavailableError(f"{verb} {what}: cannot connect to the API server ({exc}); check "
                                    "kubernetes.api_server (or the kubeconfig) and the network to it")
        if isinstance(exc, Urllib3Timeout):
            return self._timed_out(verb)
        return UnavailableError(f"{verb} {what}: {type(exc).__name__}: {exc}")

    def read(self) -> ScaleState:
        scale = self._bounded("reading", lambda: self.api.read_namespaced_deployment_scale(
            self.name, self.namespace, _request_timeout=self.timeout))
        spec, status, meta = (_field(scale, "spec"), _field(scale, "status"), _field(scale, "metadata"))
        replicas = _field(spec, "replicas") if spec is not None else None
        return ScaleState(
            spec_replicas=int(replicas or 0),
            status_replicas=int((_field(status, "replicas") if status is not None else 0) or 0),
            resource_version=_field(meta, "resource_version", "resourceVersion") if meta is not None else None,
        )

    def apply(self, replicas: int, state: ScaleState, reason: str) -> bool:
        body: dict[str, Any] = {"spec": {"replicas": int(replicas)}}
        if state.resource_version:
            body["metadata"] = {"resourceVersion": state.resource_version}
        if self.dry_run:
            self.out(json.dumps({"dry_run": True, "namespace": self.namespace, "deployment": self.name,
                                 "from": state.spec_replicas, "to": replicas, "reason": reason}))
            return False
        self._bounded("patching", lambda: self.api.patch_namespaced_deployment_scale(
            self.name, self.namespace, body, _content_type="application/merge-patch+json",
            _request_timeout=self.timeout))
        log.info("scaled %s/%s %d -> %d: %s", self.namespace, self.name, state.spec_replicas, replicas, reason)
        return True



def _track(api_client: Any, calls: dict[int, Any]) -> None:
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


def _shut(conn: Any) -> None:
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
