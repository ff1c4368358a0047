"""Kubernetes discovery: watch the worker Service's EndpointSlices (docs/design/balancing.md#discovery).

The gateway balances per request, so it must see every worker pod directly,
not a ClusterIP (kube-proxy pins a gRPC connection to one pod). This module
lists and then watches ``discovery.k8s.io/v1`` EndpointSlices labelled
``kubernetes.io/service-name=<service>`` through the ``kubernetes`` client and
yields the merged endpoint set on every change.

Pure part (:func:`endpoints_from_slices`), tested on real-shaped objects:

* conditions (API reference, EndpointConditions; nil ready/serving = true, nil
  terminating = false): ``ready and not terminating`` → READY; anything else
  (terminating — serving or not — or not ready) → DRAINING: no new picks,
  in-flight work finishes (graceful drain, docs/design/balancing.md#draining);
* several slices are merged; an address listed twice (slices are reshuffled
  non-atomically) keeps its READY copy, as kube-proxy does;
* the port is the slice port named ``port_name`` (or the only/first port, or
  the configured ``port`` override);
* weight = the pod's ``edgewise.io/weight`` annotation (via ``targetRef``),
  default 1; a bad annotation is logged and ignored.

Shell (:class:`KubernetesDiscovery`): the blocking client runs in a thread —
list (paginated), then watch from the list's resourceVersion with bookmarks;
a watch that ends normally resumes from the last resourceVersion; 410 Gone
re-lists; any other error backs off exponentially (with jitter, capped) and
re-lists. Snapshots go to the event loop through a one-slot queue whose drop
policy is *keep newest* (each snapshot is the full set, so an older one is
worthless once a newer exists); replaced snapshots are counted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cloud.discovery.base import Endpoint, EndpointState, number_option
from cloud.discovery.kubeclient import (
    KubeAccess,
    build_api_client,
    deadline,
    read_token_file,
    shut_call,
    track_calls,
)
from cloud.discovery.static import format_address
from edgewise.errors import ConfigError
from edgewise.fieldrules import show

log = logging.getLogger(__name__)

WEIGHT_ANNOTATION = "edgewise.io/weight"
SERVICE_LABEL = "kubernetes.io/service-name"
#: a watch that ends sooner than this with no event counts as a failure and backs off (client-go's
#: reflector treats a watch of under a second with no items as "very short" the same way)
MIN_WATCH_S = 1.0
#: after a pod read (for its weight annotation) fails, no pod is read for this long
WEIGHT_RETRY_S = 30.0


#: where the gateway's config holds this source's options (its errors name the key there)
_WHERE = "discovery.kubernetes"

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _own_namespace() -> str:
    """The pod's namespace in-cluster (service-account mount), else "default"."""
    try:
        return _SA_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _get(obj: Any, camel: str, snake: str | None = None) -> Any:
    """Field of a raw dict (camelCase) or a kubernetes client model (snake_case)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(camel)
    return getattr(obj, snake or camel, None)


def _slice_port(slc: Any, port_name: str | None, override: int | None) -> int | None:
    if override is not None:
        return override
    ports = _get(slc, "ports") or []
    if port_name is not None:
        for p in ports:
            if _get(p, "name") == port_name and _get(p, "port"):
                return int(_get(p, "port"))
        return None
    named = [p for p in ports if _get(p, "port")]
    return int(_get(named[0], "port")) if named else None


def _state(conditions: Any) -> EndpointState:
    ready = _get(conditions, "ready")
    terminating = _get(conditions, "terminating")
    ready = True if ready is None else bool(ready)
    terminating = False if terminating is None else bool(terminating)
    return EndpointState.READY if ready and not terminating else EndpointState.DRAINING


def pod_name(ep: Any) -> str | None:
    ref = _get(ep, "targetRef", "target_ref")
    if ref is not None and _get(ref, "kind") == "Pod":
        name = _get(ref, "name")
        return str(name) if name else None
    return None


def pods_of(slices: Iterable[Any]) -> set[str]:
    """Pod names referenced by the slices' endpoints."""
    return {n for s in slices for ep in (_get(s, "endpoints") or []) if (n := pod_name(ep))}


def endpoints_from_slices(
    slices: Iterable[Any], *, port_name: str | None = None, port: int | None = None,
    weights: Mapping[str, float] | None = None, default_weight: float = 1.0, portless: set[str] | None = None,
) -> frozenset[Endpoint]:
    """Merge EndpointSlices (dicts or ``V1EndpointSlice``) into one endpoint set: one endpoint
    per pod. A dual-stack Service has an IPv4 and an IPv6 slice listing every pod: counted as
    two workers, each pod got two channels and twice its share of requests, and the autoscaler
    saw half the load per worker. A pod's READY copy wins, then its IPv4 address (the same
    choice whichever slice comes first). A slice without the port is skipped; its name goes
    into ``portless``."""
    weights = weights or {}
    merged: dict[str, tuple[Endpoint, bool]] = {}  # pod (or address) -> endpoint, whether it is IPv6
    for slc in slices:
        v6 = str(_get(slc, "addressType", "address_type") or "") == "IPv6"
        p = _slice_port(slc, port_name, port)
        if p is None:
            if portless is not None:
                portless.add(str(_get(_get(slc, "metadata"), "name")))
            continue
        for ep in _get(slc, "endpoints") or []:
            addrs = _get(ep, "addresses") or []
            if not addrs:
                continue
            # "These are all assumed to be fungible and clients may choose to only use the first element."
            address = format_address(str(addrs[0]), p)
            pod = pod_name(ep)
            e = Endpoint(address=address, weight=weights.get(pod, default_weight) if pod else default_weight,
                         state=_state(_get(ep, "conditions")),
                         name=pod or str(_get(ep, "hostname") or addrs[0]))
            key = f"pod/{pod}" if pod else address
            old = merged.get(key)
            if old is None or _better(e, v6, *old):
                merged[key] = (e, v6)
    return frozenset(e for e, _ in merged.values())


def _better(e: Endpoint, v6: bool, old: Endpoint, old_v6: bool) -> bool:
    """Whether ``e`` should stand for its pod instead of ``old``: READY first, then IPv4."""
    ready, old_ready = e.state is EndpointState.READY, old.state is EndpointState.READY
    if ready != old_ready:
        return ready
    return old_v6 and not v6


def weight_from_pod(pod: Any, annotation: str = WEIGHT_ANNOTATION) -> float | None:
    """The pod's weight annotation as a positive float; None when absent or invalid (logged)."""
    meta = _get(pod, "metadata")
    annotations = _get(meta, "annotations") or {}
    raw = annotations.get(annotation)
    if raw is None:
        return None
    try:
        w = float(raw)
    except (TypeError, ValueError):
        w = math.nan
    if not math.isfinite(w) or w <= 0:
        log.warning("pod %s: annotation %s=%r is not a positive number; using the default weight",
                    _get(meta, "name"), annotation, raw)
        return None
    return w


class KubernetesDiscovery:
    """A :class:`~cloud.discovery.base.Discovery` over an EndpointSlice watch."""

    def __init__(
        self, service: str, namespace: str | None = None, *, port_name: str | None = None,
        port: int | None = None, api_client: Any = None, access: KubeAccess | None = None,
        api_server: str | None = None, token: str | None = None, token_file: str | None = None,
        ca_file: str | None = None, verify_tls: bool = True, kubeconfig: str | None = None,
        context: str | None = None,
        weight_annotation: str = WEIGHT_ANNOTATION, default_weight: float = 1.0,
        watch_timeout_s: int = 300, request_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.5, backoff_max_s: float = 30.0,
    ) -> None:
        """``service``: the worker Service; ``namespace``: default the pod's own (in-cluster) or
        "default"; ``port_name``/``port``: which slice port (or a fixed port); API access from
        ``api_client``, ``access``, or the plain ``api_server``/``token``/``kubeconfig`` keys
        (so a YAML ``discovery.kubernetes`` mapping can be passed straight in)."""
        namespace = namespace or _own_namespace()
        if not service or not isinstance(service, str):
            raise ConfigError("kubernetes discovery needs the worker Service name (service: ...)")
        if port_name is not None and (not isinstance(port_name, str) or not port_name):
            raise ConfigError(f"{_WHERE}.port_name: {show(port_name)} is not allowed; allowed: the name of "
                              "the worker Service's port, a non-empty string (a port number goes in port)")
        if port is not None:
            number_option(_WHERE, "port", port, lo=1, hi=65535, integer=True)
        number_option(_WHERE, "default_weight", default_weight, lo=0, lo_open=True)
        number_option(_WHERE, "watch_timeout_s", watch_timeout_s, lo=1, integer=True)
        number_option(_WHERE, "request_timeout_s", request_timeout_s, lo=0, lo_open=True, hi=600)
        number_option(_WHERE, "backoff_initial_s", backoff_initial_s, lo=0, lo_open=True, hi=3600)
        number_option(_WHERE, "backoff_max_s", backoff_max_s, lo=0, lo_open=True, hi=3600)
        if backoff_max_s < backoff_initial_s:
            raise ConfigError(f"{_WHERE}.backoff_max_s: {show(backoff_max_s)} is below backoff_initial_s "
                              f"({show(backoff_initial_s)}); allowed: a number >= backoff_initial_s")
        if access is None and api_client is None:
            if token_file and not token:
                try:
                    token = read_token_file(token_file)
                except ConfigError as exc:
                    raise ConfigError(f"kubernetes discovery: token_file {token_file}: {exc}") from None
            access = KubeAccess(api_server=api_server, token=token, token_file=token_file, ca_file=ca_file,
                                verify_tls=verify_tls,
                                kubeconfig=kubeconfig, context=context)
        self.service, self.namespace = service, namespace
        self.port_name, self.port = port_name, port
        self.annotation, self.default_weight = weight_annotation, default_weight
        self.watch_timeout_s, self.request_timeout_s = watch_timeout_s, request_timeout_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._api_client = api_client if api_client is not None else build_api_client(access or KubeAccess())
        self._calls: dict[int, Any] = {}  # thread ident -> the connection its list or pod read is using
        track_calls(self._api_client, self._calls)
        self._slices: dict[str, Any] = {}
        self._weights: dict[tuple[str, str], float | None] = {}  # (pod, uid) -> weight
        self._last: frozenset[Endpoint] | None = None
        self._portless: set[str] = set()  # slices skipped for want of the port, said once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._queue: asyncio.Queue[frozenset[Endpoint]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # counters (read by the gateway's metrics)
        self.lists = 0
        self.relists_410 = 0
        self.errors = 0
        self.snapshots_replaced = 0
        self._watch_began: float | None = None  # when the last watch was opened (None: none since the list)
        self._watch_events = 0
        self._weights_retry_at = 0.0  # monotonic time before which no pod is read (a read failed)
        self.weight_errors = 0

    # ---- asyncio side ------------------------------------------------------------------
    async def watch(self) -> AsyncIterator[frozenset[Endpoint]]:
        """Yield the endpoint set after the first list and after every change."""
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue(maxsize=1)
            self._thread = threading.Thread(target=self._run, name=f"endpointslices-{self.service}", daemon=True)
            self._thread.start()
        assert self._queue is not None
        while True:
            yield await self._queue.get()

    def _offer(self, eps: frozenset[Endpoint]) -> None:  # on the event loop
        assert self._queue is not None
        if self._queue.full():
            self._queue.get_nowait()
            self.snapshots_replaced += 1
        self._queue.put_nowait(eps)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Stop the watch thread: ``Watch.stop`` shuts its socket down so a blocked read returns.

        Repeated until the thread exits, since the thread may be between requests
        (no socket yet) when close is called.
        """
        self._stop.set()
        thread = self._thread
        if thread is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while thread.is_alive() and loop.time() < end:
            w = self._watch
            if w is not None:
                w.stop()
            for conn in list(self._calls.values()):  # a list or pod read in progress ends too
                shut_call(conn)
            await asyncio.to_thread(thread.join, 0.05)
        if thread.is_alive():
            log.warning("EndpointSlice watch thread did not stop within %.0f s; leaving it (daemon)", timeout_s)

    # ---- thread side -------------------------------------------------------------------
    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = self.backoff_initial_s
        while not self._stop.is_set():
            self._watch_began = None
            try:
                rv = self._list()
                while not self._stop.is_set():
                    rv = self._watch_from(rv)
                    if self._watch_worked():
                        backoff = self.backoff_initial_s
                        continue
                    # A watch that ends at once with nothing in it (a proxy closing streams, an API
                    # server shutting down): re-watching at once would loop as fast as the network
                    # answers, so it waits like an error (client-go's "very short watch").
                    self.errors += 1
                    log.warning("EndpointSlice watch of %s/%s ended after %.2f s with no event (the API server, "
                                "or a proxy in front of it, closes watches early); watching again in %.1f s",
                                self.namespace, self.service, self._watch_age(), backoff)
                    self._stop.wait(backoff * random.uniform(0.8, 1.2))
                    backoff = min(self.backoff_max_s, backoff * 2)
            except ApiException as exc:
                if self._stop.is_set():
                    break
                worked = self._watch_worked()
                if worked:
                    backoff = self.backoff_initial_s
                if exc.status == 410:
                    self.relists_410 += 1
                    if worked:  # the usual case: a watch that ran a while fell behind the history
                        log.info("EndpointSlice watch expired (410 Gone); re-listing")
                        continue
                    # 410 again right after a list: re-listing at once would loop on the API server
                    log.warning("EndpointSlice watch of %s/%s expired (410 Gone) right after listing; "
                                "re-listing in %.1f s", self.namespace, self.service, backoff)
                else:
                    self.errors += 1
                    log.warning("EndpointSlice list/watch of %s/%s failed: %s %s%s; retrying in %.1f s",
                                self.namespace, self.service, exc.status, exc.reason, self._hint(exc.status),
                                backoff)
            except Exception as exc:  # connection errors, timeouts, bad payloads
                if self._stop.is_set():
                    break
                if self._watch_worked():
                    backoff = self.backoff_initial_s
                self.errors += 1
                log.warning("EndpointSlice list/watch of %s/%s failed: %s: %s; retrying in %.1f s",
                            self.namespace, self.service, type(exc).__name__,
                            " ".join(str(exc).split()), backoff)  # one line: a model's validation error spans several
            self._stop.wait(backoff * random.uniform(0.8, 1.2))
            backoff = min(self.backoff_max_s, backoff * 2)

    def _watch_age(self) -> float:
        return 0.0 if self._watch_began is None else time.monotonic() - self._watch_began

    def _watch_worked(self) -> bool:
        """Whether the last watch delivered an event or ran at least :data:`MIN_WATCH_S`: only then is
        the back-off reset (a list that succeeds followed by a watch that fails at once is no recovery)."""
        return self._watch_began is not None and (self._watch_events > 0 or self._watch_age() >= MIN_WATCH_S)

    def _hint(self, status: int | None) -> str:
        if status == 401:
            return (" (the API server rejected the token: an expired or rotated service-account token, or "
                    "the wrong one for this cluster)")
        if status == 403:
            return (f" (the service account may not list/watch endpointslices.discovery.k8s.io in namespace "
                    f"{self.namespace}: check the gateway's Role and RoleBinding)")
        return ""

    def _apis(self) -> tuple[Any, Any]:
        from kubernetes import client

        return client.DiscoveryV1Api(self._api_client), client.CoreV1Api(self._api_client)

    def _selector(self) -> str:
        return f"{SERVICE_LABEL}={self.service}"

    def _bounded(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()`` within ``request_timeout_s`` in all (``kubeclient.deadline``): the client's
        timeout bounds each read, so an API server or proxy trickling a list held it, and the
        worker set, for as long as it trickled, and a gateway stopping meanwhile left the thread
        reading and aborted at exit (SIGABRT)."""
        from kubernetes.client.exceptions import ApiException

        with deadline(self._calls, self.request_timeout_s) as expired:
            try:
                return call()
            except Exception as exc:
                if expired() and not isinstance(exc, ApiException) and not self._stop.is_set():
                    raise TimeoutError(f"{what}: no complete answer within request_timeout_s "
                                       f"({self.request_timeout_s:g} s); check the API server and the "
                                       "network to it") from None
                raise

    def _list(self) -> str:
        disc, _ = self._apis()
        slices: dict[str, Any] = {}
        cont: str | None = None
        while True:
            res = self._bounded("listing EndpointSlices", functools.partial(
                disc.list_namespaced_endpoint_slice, self.namespace, label_selector=self._selector(), limit=500,
                _continue=cont, _request_timeout=self.request_timeout_s))
            # A 200 that is no EndpointSliceList (another service at api_server, a proxy's own {} or
            # {"items": []}) failed with "'NoneType' object has no attribute 'items'", or, with no
            # items, replaced every worker with none before its missing resourceVersion failed.
            version = _get(_get(res, "metadata"), "resourceVersion", "resource_version")
            if not version or not isinstance(_get(res, "items"), list):
                raise ValueError("the answer to listing EndpointSlices is not an EndpointSliceList (no "
                                 f"{'metadata.resourceVersion' if not version else 'items'}); check that "
                                 "api_server (or the kubeconfig) is the Kubernetes API server")
            for s in res.items:
                slices[s.metadata.name] = s
            cont = res.metadata._continue
            if not cont:
                break
        self.lists += 1
        self._slices = slices
        self._emit()
        return str(version)

    def _watch_from(self, rv: str) -> str:
        from kubernetes import watch

        disc, _ = self._apis()
        w = watch.Watch()
        self._watch = w
        self._watch_began, self._watch_events = time.monotonic(), 0
        if self._stop.is_set():
            return rv
        try:
            for ev in w.stream(disc.list_namespaced_endpoint_slice, self.namespace,
                               label_selector=self._selector(), resource_version=rv,
                               allow_watch_bookmarks=True, timeout_seconds=self.watch_timeout_s,
                               _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30)):
                if not isinstance(ev, Mapping) or "type" not in ev or "object" not in ev:
                    raise ValueError("the API server sent a watch event that is not a JSON object with 'type' "
                                     f"and 'object' ({'not JSON' if ev is None else repr(ev)[:120]})")
                self._watch_events += 1
                kind, obj = ev["type"], ev["object"]
                if kind == "BOOKMARK":
                    rv = str(ev["raw_object"]["metadata"]["resourceVersion"])
                    continue
                name = _get(_get(obj, "metadata"), "name")
                if kind in ("ADDED", "MODIFIED"):
                    self._slices[name] = obj
                elif kind == "DELETED":
                    self._slices.pop(name, None)
                rv = str(_get(_get(obj, "metadata"), "resourceVersion", "resource_version") or rv)
                self._emit()
                if self._stop.is_set():
                    break
        finally:
            self._watch = None
        return rv

    def _pod_weights(self) -> dict[str, float]:
        from kubernetes.client.exceptions import ApiException

        _, core = self._apis()
        wanted: dict[tuple[str, str], str] = {}
        for s in self._slices.values():
            for ep in _get(s, "endpoints") or []:
                ref = _get(ep, "targetRef", "target_ref")
                name = pod_name(ep)
                if name:
                    wanted[(name, str(_get(ref, "uid") or ""))] = str(_get(ref, "namespace") or self.namespace)
        for key in list(self._weights):
            if key not in wanted:
                del self._weights[key]
        out: dict[str, float] = {}
        now = time.monotonic()
        for key, ns in wanted.items():
            if key not in self._weights:
                if now < self._weights_retry_at:  # reads failed lately: default weight, read later
                    continue
                try:
                    pod = self._bounded("reading a pod", functools.partial(
                        core.read_namespaced_pod, key[0], ns, _request_timeout=self.request_timeout_s))
                    self._weights[key] = weight_from_pod(pod, self.annotation)
                except ApiException as exc:
                    if exc.status == 404:  # gone already; the slice will follow
                        self._weights[key] = None
                    else:
                        self._weight_read_failed(ns, key[0], f"{exc.status} {exc.reason}", exc.status)
                        continue
                except Exception as exc:
                    self._weight_read_failed(ns, key[0], f"{type(exc).__name__}: {exc}", None)
                    continue
            w = self._weights[key]
            if w is not None:
                out[key[0]] = w
        return out

    def _weight_read_failed(self, ns: str, pod: str, what: str, status: int | None) -> None:
        """One failed pod read stops the others for ``WEIGHT_RETRY_S``: reading each pod in turn,
        each waiting ``request_timeout_s`` on a slow API server, held every endpoint change back by
        pods x timeout, and a Role without ``get pods`` logged one warning per pod per change."""
        self._weights_retry_at = time.monotonic() + WEIGHT_RETRY_S
        self.weight_errors += 1
        hint = {403: "; the gateway's service account needs get on pods in that namespace",
                401: "; the API server rejected the token"}.get(status or 0, "")
        log.warning("reading pod %s/%s for its %s weight failed (%s)%s; pods whose weight is not known yet get "
                    "the default weight %g, read again in %.0f s at the next change",
                    ns, pod, self.annotation, what, hint, self.default_weight, WEIGHT_RETRY_S)

    def _emit(self) -> None:
        portless: set[str] = set()
        eps = endpoints_from_slices(self._slices.values(), port_name=self.port_name, port=self.port,
                                    weights=self._pod_weights(), default_weight=self.default_weight,
                                    portless=portless)
        if portless - self._portless:  # once per slice, not at each of its watch events
            log.warning("EndpointSlice %s has no port %s; skipped (set the port name in discovery)",
                        ", ".join(sorted(portless - self._portless)),
                        repr(self.port_name) if self.port_name else "(none listed)")
        self._portless = portless
        if eps != self._last:
            self._last = eps
            if self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._offer, eps)
                except RuntimeError:  # the loop closed under us: we are shutting down
                    self._stop.set()
