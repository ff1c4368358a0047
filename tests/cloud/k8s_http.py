"""Shared base of the local HTTP servers that speak enough of the Kubernetes API for tests."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class KubeJsonHandler(BaseHTTPRequestHandler):
    """JSON answers and Kubernetes ``Status`` errors; quiet logs."""

    def log_message(self, *a):
        pass

    def _json(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code, reason, message):
        self._json(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "reason": reason, "message": message, "code": code})
