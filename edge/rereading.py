"""On SIGHUP, what of the daemon's settings a reload does not apply: read again, compared, said.

The edge daemon reloads its policy file on SIGHUP; its settings (``edge.yaml``, the
environment's ``EDGEWISE_EDGE__*``, ``--set`` and the flags: streams, model, cloud, sinks) are
read at start only. An operator who changed a camera's URL or the cloud's endpoints and sent
SIGHUP read "reloading policy" and nothing more, and waited for a change that never came (the
gateway names such keys on its SIGHUP: ``cloud.gateway.server``; found by a probe). The daemon
now reads its settings again as its start did, off the event loop, and names the keys that
changed: they wait for a restart (names only: a value may be a secret). Settings that no
longer load are said too, while the daemon still runs on those it started with: the next
restart would fail with that error.

The settings are compared with a copy of those loaded (the start fills some in: an empty
``device_id`` becomes the serial number). One thread reads at a time, outside the event loop
and its executor: SIGHUPs that come while it reads make it read once more after (a script that
sends a SIGHUP every few milliseconds starts no thread per signal), and nothing it does touches
the loop (on Python 3.8 an executor's future finishing after the loop closed logged "Event
loop is closed" tracebacks at the daemon's exit).
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Callable, Optional

from edge.settings import EdgeSettings
from edgewise.errors import EdgewiseError
from edgewise.settings.fields import changed_keys

log = logging.getLogger(__name__)


def unapplied(started: EdgeSettings, reread: Callable[[], EdgeSettings]) -> Optional[str]:
    """What a SIGHUP leaves unapplied of the settings ``reread`` loads now, against those the daemon
    ``started`` with: a WARNING's text, or None when they are the same."""
    try:
        fresh = reread()
    except EdgewiseError as exc:
        return (f"SIGHUP: the daemon's settings no longer load: {exc}; it goes on with those it started with, "
                "and a restart would fail with this error: fix it first")
    keys = changed_keys(started, fresh)
    if not keys:
        return None
    return (f"SIGHUP: {', '.join(keys)} changed in the settings (edge.yaml, the environment, the command line), "
            "which a reload does not apply (it reloads the policy file only): restart the daemon to apply "
            f"{'them' if len(keys) > 1 else 'it'}")


def say_unapplied(started: EdgeSettings, reread: Callable[[], EdgeSettings]) -> None:
    """Log ``unapplied`` (in a worker thread: the file is read and validated)."""
    try:
        said = unapplied(started, reread)
    except Exception:  # a reader's bug must not pass without a word (nor end the daemon)
        log.exception("SIGHUP: reading the settings again failed")
        return
    if said:
        log.warning("%s", said)


class Rereader:
    """Reads the settings again on request, one thread at a time (the module docstring)."""

    def __init__(self, loaded: EdgeSettings, reread: Callable[[], EdgeSettings]) -> None:
        self.loaded = copy.deepcopy(loaded)  # before the start fills anything in
        self.reread = reread
        self._lock = threading.Lock()
        self._pending = False
        self._thread: Optional[threading.Thread] = None

    def request(self) -> None:
        """Compare the settings as they load now (in the thread; at once if none runs)."""
        with self._lock:
            self._pending = True
            if self._thread is not None:
                return  # the running one reads once more
            self._thread = threading.Thread(target=self._run, name="settings-reread", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
                self._pending = False
            say_unapplied(self.loaded, self.reread)

