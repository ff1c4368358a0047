"""Local HTTP servers for autoscaler tests: the Kubernetes scale subresource and a gateway /pool.

The scale server is the one fake allowed here (no cluster runs on these machines):
it speaks ``GET``/``PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale``
as the API server does (autoscaling/v1 Scale, JSON merge patch, resourceVersion
precondition -> 409, bearer token -> 401) and records every request. ``shed`` queues
answers that shed load, as an API server under its max-in-flight limit or API Priority and
Fairness gives them: ``(status, Retry-After or None[, method])``, each the answer to the next
request (of that method), before it serves again. ``answer`` replaces the Scale in every 200 (another
service, or a proxy's own answer, where the API server should be).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.cloud.k8s_http import KubeJsonHandler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class ScaleAPI:
    def __init__(self, namespace="ns", name="edgewise-worker", replicas=2, token=None):
        self.namespace, self.name, self.token = namespace, name, token
        self.replicas = replicas
        self.rv = 1
        self.requests = []   # (method, path, headers, body-or-None)
        self.times = []      # time.monotonic() of each request, as it came
        self.shed = []       # (status, Retry-After or None[, method]): the next requests' answers
        self.patches = []    # parsed PATCH bodies that were accepted
        self.answer = None   # bytes: the body of every 200 instead of the Scale (something else answering)
        self.lock = threading.Lock()
        api = self

        class Handler(KubeJsonHandler):
            def _handle(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else None
                with api.lock:
                    api.requests.append((method, self.path, {k.lower(): v for k, v in self.headers.items()}, raw))
                    api.times.append(time.monotonic())
                    i = next((i for i, e in enumerate(api.shed) if e[2:] in ((), (method,))), None)
                    shed = api.shed.pop(i) if i is not None else None
                if shed is not None:
                    return self._shed(*shed[:2])
                if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                want = f"/apis/apps/v1/namespaces/{api.namespace}/deployments/{api.name}/scale"
                if self.path.split("?")[0] != want:
                    return self._status(404, "NotFound", f"deployments.apps {self.path!r} not found")
                with api.lock:
                    if method == "PATCH":
                        if self.headers.get("Content-Type") != "application/merge-patch+json":
                            return self._status(415, "UnsupportedMediaType", self.headers.get("Content-Type"))
                        body = json.loads(raw)
                        rv = body.get("metadata", {}).get("resourceVersion")
                        if rv is not None and rv != str(api.rv):
                            return self._status(409, "Conflict", "the object has been modified")
                        api.replicas = int(body["spec"]["replicas"])
                        api.rv += 1
                        api.patches.append(body)
                    if api.answer is not None:
                        return self._raw(200, api.answer)
                    return self._json(200, api.scale_doc())

            def _raw(self, code, body):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _shed(self, code, retry_after):
                # kube-apiserver's answer when it sheds a request (staging/src/k8s.io/apiserver, filters)
                body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                   "reason": "TooManyRequests" if code == 429 else "ServiceUnavailable",
                                   "message": "too many requests, please try again later", "code": code}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._handle("GET")

            def do_PATCH(self):
                self._handle("PATCH")

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def scale_doc(self):
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": str(self.rv)},
                "spec": {"replicas": self.replicas},
                "status": {"replicas": self.replicas, "selector": "app=edgewise-worker"}}

    def bump(self, replicas):
        """Someone else (an operator) changes the replica count."""
        with self.lock:
            self.replicas, self.rv = replicas, self.rv + 1

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _Server6(_Server):
    address_family = socket.AF_INET6  # on "::", IPv4 too (as ::ffff:a.b.c.d): a dual-stack pod's port


class PoolServer:
    """Serves a mutable ``/pool`` document like the gateway's side port (``host="::"``: on IPv6 and
    IPv4 at one port, as a gateway on a dual-stack pod)."""

    def __init__(self, doc=None, host="127.0.0.1"):
        self.doc = doc or pool_doc(0, 0.0)
        self.status = 200
        self.hits = 0
        self.on_get = None  # called before each answer (a test advances its fake clock here)
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                srv.hits += 1
                if srv.on_get is not None:
                    srv.on_get()
                body = (srv.doc if isinstance(srv.doc, bytes) else json.dumps(srv.doc).encode())
                self.send_response(srv.status if self.path == "/pool" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = (_Server6 if ":" in host else _Server)((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def pool_doc(n_workers, in_flight, cap=10.0, qw=0.0, first=0):
    """A gateway /pool document: n ready workers of capacity ``cap``, ``in_flight`` spread."""
    workers = [{"name": f"w{i}", "address": f"10.0.0.{i}:50051", "state": "ready",
                "in_flight": in_flight / max(1, n_workers), "queue_depth": 0, "capacity": cap,
                "weight": 1.0, "ejected": False} for i in range(first, first + n_workers)]
    return {"workers": workers, "in_flight": in_flight, "capacity": cap * n_workers, "queue_wait_ms_p90": qw}
