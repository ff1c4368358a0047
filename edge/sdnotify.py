"""systemd notification (sd_notify) for the edge daemon: READY, WATCHDOG, STOPPING.

The Jetson unit runs ``Type=notify`` with ``WatchdogSec=``: the daemon says
READY=1 once its model is loaded and sources are open, then pets the watchdog
from the pipeline loop, so a wedged pipeline (not just a dead process) gets
restarted. Speaks the datagram protocol of sd_notify(3) directly (no libsystemd
binding on JetPack's Python); a no-op when ``NOTIFY_SOCKET`` is unset.

A step that may outlast ``TimeoutStartSec=`` (a TensorRT engine build: minutes on a
Xavier NX, more for large inputs or batches) runs under :meth:`Notifier.busy`, which
keeps extending the start timeout (``EXTEND_TIMEOUT_USEC``, systemd 236+; JetPack 5.1
has 245) and says what it is doing in ``STATUS=``, up to a cap after which the unit's own
timeout applies again. Without it a build killed at the timeout restarts from scratch,
forever. The unit sets ``NotifyAccess=all`` so the build in ``ExecStartPre`` is heard.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Iterator, Optional


class Notifier:
    """Sends sd_notify messages to ``NOTIFY_SOCKET`` (absolute or abstract path)."""

    def __init__(self, address: Optional[str] = None) -> None:
        addr = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        ok_pid = not pid or pid == str(os.getpid())
        #: Seconds between watchdog pets (half the configured timeout), or None.
        self.watchdog_interval: Optional[float] = (
            int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and ok_pid else None
        )

    @property
    def enabled(self) -> bool:
        return bool(self._addr)

    def notify(self, message: str) -> bool:
        """Send one message such as ``"READY=1"``; False when not under systemd or on error."""
        if not self._addr:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._addr)
                sock.sendall(message.encode())
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def reloading(self) -> bool:
        return self.notify("RELOADING=1")

    @contextlib.contextmanager
    def busy(self, status: str, every_s: float = 20.0, extend_s: float = 60.0,
             limit_s: float = 3 * 3600.0) -> Iterator[None]:
        """Keep systemd waiting while the block runs (module doc): every ``every_s`` the start
        timeout is extended by ``extend_s`` from now and the watchdog is petted, for at most
        ``limit_s`` (a step stuck longer meets the unit's timeout). No-op outside systemd."""
        if not self.enabled:
            yield
            return
        done = threading.Event()
        t0 = time.monotonic()

        def beat() -> None:
            while True:
                spent = time.monotonic() - t0
                if spent >= limit_s:
                    return
                self.notify(f"EXTEND_TIMEOUT_USEC={int(extend_s * 1e6)}\nWATCHDOG=1\n"
                            f"STATUS={status} ({spent:.0f} s)")
                if done.wait(every_s):
                    return

        thread = threading.Thread(target=beat, name="sd-notify-busy", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
