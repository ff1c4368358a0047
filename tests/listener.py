"""A real TCP listener on a free port for tests that play a misbehaving peer (a hung API
server, a trickling gateway, a port that answers TCP but no protocol): each accepted
connection goes to ``on_connection`` in the accepting thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class Listener:
    """Listens on 127.0.0.1 (``port``, ``url``) until ``close``."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.on_connection(conn)

    def on_connection(self, conn: socket.socket) -> None:
        """What to do with a connection; by default close it at once."""
        conn.close()

    def close(self) -> None:
        self.sock.close()


class TricklingGateway(Listener):
    """Answers any request (a gateway's ``/pool``, an API server's list) a byte every 50 ms for
    ``seconds`` (a gateway, API server or proxy that is alive but hardly sends): in the headers
    (``where="headers"``) or in the body."""

    def __init__(self, where: str, seconds: float = 6.0, close: bool = False) -> None:
        self.where, self.seconds, self.close_header = where, seconds, close
        self.stopped = threading.Event()
        self.connections = 0
        super().__init__()

    def on_connection(self, conn: Any) -> None:
        self.connections += 1
        threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: Any) -> None:
        with conn:
            try:
                conn.recv(65536)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                if self.close_header:
                    head += b"Connection: close\r\n"
                conn.sendall(head + (b"X-Slow: " if self.where == "headers" else b"Content-Length: 100000\r\n\r\n"))
                end = time.monotonic() + self.seconds
                while time.monotonic() < end and not self.stopped.is_set():
                    conn.sendall(b"a" if self.where == "headers" else b" ")
                    time.sleep(0.05)
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        super().close()
