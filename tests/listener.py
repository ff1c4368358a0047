"""A real TCP listener on a free port for tests that play a misbehaving peer (a hung API
server, a trickling gateway, a port that answers TCP but no protocol): each accepted
connection goes to ``on_connection`` in the accepting thread."""

from __future__ import annotations

import socket
import threading


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
