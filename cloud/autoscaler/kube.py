"""The scale target: the worker Deployment's ``scale`` subresource via the ``kubernetes`` client.

Reads ``GET /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`` (HPA reads
``spec.replicas`` as the current count) and writes the decision as a JSON merge
patch ``{"spec": {"replicas": N}}`` to the same subresource, carrying the
resourceVersion it read so a concurrent change by someone else fails with 409
instead of being overwritten (the next tick re-reads). In dry-run mode the
decision is printed and nothing is patched.

The client is blocking; the loop calls these methods in a worker thread, each bounded to
``request_timeout_s`` in all by :func:`cloud.discovery.kubeclient.deadline` (a trickling API
server held a read for 76 s with a 2 s timeout, and the daemon's SIGTERM with it); a call cut
off there is unavailable, like a timeout.

An API server that sheds load (429 Too Many Requests from its max-in-flight limit or API
Priority and Fairness, a 5xx while it starts or stops) says in ``Retry-After`` when to come
back: the call fails with :class:`ThrottledError`, whose ``wait_s`` (``retry_after_s``, at most
``RETRY_AFTER_MAX_S``) the loop waits before its next tick, as client-go does (429 and 5xx).
"""

from __future__ import annotations

import email.utils
import json
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timezone
from typing import Any, Protocol

from cloud.discovery.kubeclient import deadline, track_calls
from edgewise.errors import ConfigError, UnavailableError

log = logging.getLogger(__name__)


class ScaleConflictError(UnavailableError):
    """The scale changed between our read and our patch (409): someone else scaled meanwhile.

    An expected outcome of optimistic concurrency, not a fault: nothing was overwritten, and the
    next tick re-reads and decides again."""


#: The longest the API server's ``Retry-After`` holds the autoscaler's next call back, seconds.
#: An API server asks for a second or a few; a larger value (a proxy's, a clock that is off
#: for an HTTP date) would stop scaling for as long, so one call a minute goes out at most:
#: no load on a server that sheds it.
RETRY_AFTER_MAX_S = 60.0
_DELAY_SECONDS = re.compile(r"[0-9]+")


def retry_after_s(value: str | None, now: float) -> float | None:
    """The seconds a ``Retry-After`` header ``value`` asks to wait (RFC 9110 section 10.2.3:
    delay-seconds, or an HTTP date, counted from the wall clock ``now``, ``time.time()``; a date
    past is 0); None when there is none, or it is neither."""
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC, as an HTTP date always is
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)


class ThrottledError(UnavailableError):
    """The API server shed the call (429, or a 5xx with ``Retry-After``); the next call waits
    ``wait_s`` seconds (0: at the next tick as usual)."""

    def __init__(self, message: str, wait_s: float) -> None:
        super().__init__(message)
        self.wait_s = wait_s


def _header(headers: Any, name: str) -> str | None:
    """Header ``name`` of an ``ApiException`` (urllib3's case-insensitive dict, or a plain one)."""
    if not isinstance(headers, Mapping):
        return None
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if str(k).lower() == name.lower()), None)
    return None if value is None else str(value)


def throttled(where: str, status: int, reason: str, retry_after: str | None,
              now: float) -> ThrottledError | None:
    """The :class:`ThrottledError` of an answer ``status`` whose ``Retry-After`` header is
    ``retry_after`` (``where``: the call, for the message), or None: not one that sheds load
    (429, or a 5xx that says when to come back)."""
    asked = retry_after_s(retry_after, now)
    if status != 429 and not (status >= 500 and asked is not None):
        return None
    said = f"{where}: API server answered {status} {reason}"
    if asked is None:
        unread = f" (its Retry-After {retry_after[:40]!r} is neither seconds nor an HTTP date: ignored)" \
            if retry_after is not None else " without a Retry-After"
        return ThrottledError(f"{said}{unread}; the next tick tries again. If it lasts, the API server sheds "
                              "load: check its flow control (apiserver_flowcontrol_rejected_requests_total)", 0.0)
    wait = min(asked, RETRY_AFTER_MAX_S)
    capped = f", more than the {RETRY_AFTER_MAX_S:g} s the autoscaler waits at most" if asked > wait else ""
    return ThrottledError(f"{said} and asks to retry after {asked:g} s (Retry-After){capped}: the next call waits "
                          f"{wait:g} s. If it lasts, the API server sheds load: check its flow control "
                          "(apiserver_flowcontrol_rejected_requests_total)", wait)


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
        track_calls(api_client, self._calls)

    @property
    def _what(self) -> str:
        return f"deployment {self.namespace}/{self.name} scale"

    def _bounded(self, verb: str, call: Callable[[], Any]) -> Any:
        """``call()``'s result within ``timeout`` seconds in all, else UnavailableError; its
        errors as ``_error`` says them (module doc)."""
        from kubernetes.client.exceptions import ApiException

        with deadline(self._calls, self.timeout) as expired:
            try:
                return call()
            except Exception as exc:
                if expired() and not isinstance(exc, ApiException):  # an answer (a 409) is one
                    raise self._timed_out(verb) from None
                raise self._error(verb, exc) from exc

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
            shed = throttled(f"{verb} {what}", status, exc.reason, _header(exc.headers, "Retry-After"), time.time())
            if shed is not None:
                return shed
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
        said = " ".join(str(exc).split())  # one line: a validation error of the client's models spans several
        return UnavailableError(f"{verb} {what}: {type(exc).__name__}: {said}")

    def read(self) -> ScaleState:
        scale = self._bounded("reading", lambda: self.api.read_namespaced_deployment_scale(
            self.name, self.namespace, _request_timeout=self.timeout))
        spec, status, meta = (_field(scale, "spec"), _field(scale, "status"), _field(scale, "metadata"))
        replicas = _field(spec, "replicas") if spec is not None else None  # absent: 0 (omitempty)
        version = _field(meta, "resource_version", "resourceVersion") if meta is not None else None
        # A 200 that is no Scale (`{}`, `null`: another service at kubernetes.api_server, a proxy's
        # own answer) read as 0 replicas: "autoscaling inactive, scale it to >= 1" at every tick,
        # whatever the Deployment had; a negative count was scaled "up" to min_replicas.
        if not version or (replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int)
                                                     or replicas < 0)):
            said = "it has no metadata.resourceVersion" if not version else f"spec.replicas is {replicas!r}"
            raise UnavailableError(f"reading {self._what}: the answer is not a Scale ({said}); check that "
                                   "kubernetes.api_server (or the kubeconfig) is the Kubernetes API server")
        return ScaleState(
            spec_replicas=int(replicas or 0),
            status_replicas=int((_field(status, "replicas") if status is not None else 0) or 0),
            resource_version=str(version),
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
