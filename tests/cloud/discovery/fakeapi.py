"""A local HTTP server speaking enough of the Kubernetes API for the EndpointSlice watch.

The one fake allowed in these tests (no cluster runs here). It serves, like the
API server does:

* ``GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=…``
  → an ``EndpointSliceList`` with ``metadata.resourceVersion`` (``limit``/``continue``
  pagination honoured);
* the same with ``watch=true&resourceVersion=N`` → a chunked stream of JSON watch
  events (``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``) after N, ending at
  ``timeoutSeconds``; a resourceVersion older than the compaction point gets an
  ``ERROR`` event with a 410 ``Expired`` Status, as etcd compaction causes;
* ``GET /api/v1/namespaces/{ns}/pods/{name}`` → the pod (annotations) or 404.

Faults a misbehaving API server (or a proxy in front of it) shows: ``watch_fault`` ("empty":
watches end at once, "gone": every watch answers 410), ``pod_status`` and ``pod_delay_s``.

Tests mutate slices and pods; every request is recorded; ``fail_next`` makes the
next list calls answer 500. With ``ssl_context`` it serves HTTPS, as a real API server
does for in-cluster clients (``host`` is then the address pods reach it on).
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import time
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.cloud.k8s_http import KubeJsonHandler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def slice_doc(name, service, endpoints, *, ports=(("grpc", 50051),), address_type="IPv4"):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": service}},
            "addressType": address_type, "endpoints": endpoints,
            "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports]}


def endpoint(ip, pod, *, ready=True, serving=None, terminating=None, uid=None):
    cond = {"ready": ready}
    if serving is not None:
        cond["serving"] = serving
    if terminating is not None:
        cond["terminating"] = terminating
    return {"addresses": [ip], "conditions": cond, "nodeName": "node-1",
            "targetRef": {"kind": "Pod", "namespace": "ns", "name": pod, "uid": uid or f"uid-{pod}"}}


class FakeKubeAPI:
    def __init__(self, namespace="ns", service="edgewise-worker", host="127.0.0.1",
                 ssl_context: ssl.SSLContext | None = None):
        self.namespace, self.service = namespace, service
        self.rv = 100
        self.compacted = 0
        self.slices = {}
        self.pods = {}
        self.history = []  # (rv, type, obj)
        self.requests = []
        self.fail_next = 0
        self.list_answer = None  # bytes every list gets instead (something else answering at the URL)
        self.watch_fault = None  # "empty": every watch ends at once with no event; "gone": every watch gets 410
        self.pod_status = None   # answer every pod read with this Status code (403: the Role lacks get pods)
        self.pod_delay_s = 0.0   # answer every pod read this late (a slow API server)
        self.cond = threading.Condition()
        self.generation = 0  # bump to end active watch streams
        api = self

        class Handler(KubeJsonHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                u = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(u.query).items()}
                with api.cond:
                    api.requests.append((u.path, q, self.headers.get("Authorization")))
                base = f"/apis/discovery.k8s.io/v1/namespaces/{api.namespace}/endpointslices"
                pods = f"/api/v1/namespaces/{api.namespace}/pods/"
                if u.path == base:
                    if q.get("labelSelector") != f"kubernetes.io/service-name={api.service}":
                        return self._status(400, "BadRequest", f"unexpected selector {q.get('labelSelector')}")
                    if q.get("watch") in ("true", "1", "True"):
                        return self._watch(q)
                    return self._list(q)
                if u.path.startswith(pods):
                    if api.pod_delay_s:
                        time.sleep(api.pod_delay_s)
                    if api.pod_status is not None:
                        return self._status(api.pod_status, "Forbidden", "pods is forbidden")
                    with api.cond:
                        pod = api.pods.get(u.path[len(pods):])
                    if pod is None:
                        return self._status(404, "NotFound", "pods not found")
                    return self._json(200, pod)
                return self._status(404, "NotFound", u.path)

            def _list(self, q):
                with api.cond:
                    if api.fail_next > 0:
                        api.fail_next -= 1
                        return self._status(500, "InternalError", "etcd is sad")
                    if api.list_answer is not None:
                        return self._raw(200, api.list_answer)
                    items = [copy.deepcopy(s) for _, s in sorted(api.slices.items())]
                    rv = api.rv
                limit = int(q.get("limit", 0) or 0)
                start = int(q.get("continue", 0) or 0)
                meta = {"resourceVersion": str(rv)}
                if limit and start + limit < len(items):
                    meta["continue"] = str(start + limit)
                if limit:
                    items = items[start:start + limit]
                self._json(200, {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                 "metadata": meta, "items": items})

            def _raw(self, code, body):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, doc):
                data = (json.dumps(doc) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(self, q):
                since = int(q.get("resourceVersion", 0) or 0)
                deadline = time.monotonic() + float(q.get("timeoutSeconds", 30))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if api.watch_fault == "empty":  # a complete, empty stream; the connection stays open
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                try:
                    with api.cond:
                        gen = api.generation
                        if since < api.compacted or api.watch_fault == "gone":
                            self._chunk({"type": "ERROR", "object": {
                                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "message": f"too old resource version: {since} ({api.compacted})",
                                "reason": "Expired", "code": 410}})
                            return
                        sent = since
                        while time.monotonic() < deadline and gen == api.generation:
                            for rv, kind, obj in api.history:
                                if rv > sent:
                                    self._chunk({"type": kind, "object": obj})
                                    sent = rv
                            api.cond.wait(timeout=0.1)
                finally:
                    try:  # the stream ends; the connection stays open for the next request, as a real
                        self.wfile.write(b"0\r\n\r\n")  # API server keeps it (closing it unannounced made the
                        self.wfile.flush()  # client's next watch fail on the reused connection, and re-list)
                    except OSError:
                        self.close_connection = True

        self.server = _Server((host, 0), Handler)
        if ssl_context is not None:
            self.server.socket = ssl_context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if ssl_context else 'http'}://{host}:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    # ---- mutations (as the EndpointSlice controller / kubelet would make them) ----
    def put_slice(self, doc):
        with self.cond:
            self.rv += 1
            doc = copy.deepcopy(doc)
            doc["metadata"]["resourceVersion"] = str(self.rv)
            kind = "MODIFIED" if doc["metadata"]["name"] in self.slices else "ADDED"
            self.slices[doc["metadata"]["name"]] = doc
            self.history.append((self.rv, kind, doc))
            self.cond.notify_all()

    def delete_slice(self, name):
        with self.cond:
            self.rv += 1
            doc = copy.deepcopy(self.slices.pop(name))
            doc["metadata"]["resourceVersion"] = str(self.rv)
            self.history.append((self.rv, "DELETED", doc))
            self.cond.notify_all()

    def bookmark(self):
        with self.cond:
            self.rv += 1
            self.history.append((self.rv, "BOOKMARK", {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                                                       "metadata": {"resourceVersion": str(self.rv)}}))
            self.cond.notify_all()

    def expire(self):
        """Compact history (future re-watches from an old resourceVersion get 410) and end the streams."""
        with self.cond:
            self.compacted = self.rv + 1
            self.generation += 1
            self.cond.notify_all()

    def put_pod(self, name, weight=None):
        ann = {} if weight is None else {"edgewise.io/weight": str(weight)}
        with self.cond:
            self.pods[name] = {"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}",
                                            "annotations": ann},
                               "spec": {"containers": [{"name": "worker", "image": "edgewise"}]}}

    def count(self, path_suffix, **query):
        with self.cond:
            return sum(1 for p, q, _ in self.requests if p.endswith(path_suffix)
                       and all(q.get(k) == v for k, v in query.items()))

    def close(self):
        with self.cond:
            self.generation += 1
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
