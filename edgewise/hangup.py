"""SIGHUP while a daemon starts: remembered and acted on once it runs, never fatal.

The edge daemon and the gateway reload on SIGHUP, but their event loops install that handler
only once started: imports, settings, the model, the spool (seconds on a Jetson). SIGHUP's
default action ends a process, so a reload sent in that window (``kill -HUP``, a config
reloader next to the gateway, a script that changed the policy) killed the daemon.

The command dispatcher calls :func:`hold` first thing: a SIGHUP is then noted, not acted on.
Once the command is known, a command that does not reload on SIGHUP gets its previous
disposition back (:func:`release`), and a SIGHUP noted meanwhile acts as it would have (the
default ends the process, as a closed terminal should). A daemon keeps the note until its
loop's own handler is in place, then asks :func:`take` and reloads once if one came. When it is
done (its stop over, the process about to exit) it calls :func:`ignore_from_now`: its loop's
close would give SIGHUP back its default, and one in the exit's last moments ended a clean stop
killed by SIGHUP.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any, Optional

_pending = False
_held = False
_previous: Any = None  # the disposition before hold() (None: one not installed from Python)


def _note(_signum: int, _frame: Optional[FrameType]) -> None:
    global _pending
    _pending = True


def hold() -> None:
    """Note SIGHUP instead of acting on it (main thread of a POSIX process; else a no-op)."""
    global _previous, _held
    sig = getattr(signal, "SIGHUP", None)
    if sig is None or _held:
        return
    try:
        _previous = signal.signal(sig, _note)
    except ValueError:  # not the main thread: whoever runs us owns the signals
        return
    _held = True


def take() -> bool:
    """Whether a SIGHUP was noted since :func:`hold` (and forget it). A daemon calls it once
    its own SIGHUP handler is installed, and reloads if it says so. Where none was installed
    (its loop could not), the disposition from before :func:`hold` comes back, so that later
    SIGHUPs are not noted for nobody."""
    global _pending, _held
    if _held and signal.getsignal(signal.SIGHUP) is _note:
        signal.signal(signal.SIGHUP, signal.SIG_DFL if _previous is None else _previous)
    _held = False  # the daemon's own handler is in force from now on
    was, _pending = _pending, False
    return was


def release(deliver: bool = True) -> None:
    """Give SIGHUP its disposition from before :func:`hold` back. With ``deliver``, a SIGHUP
    noted meanwhile is sent again, so it acts as it would have (SIG_DFL ends the process);
    without, it is dropped: a daemon that ended before it ran has nothing to reload."""
    global _pending, _held
    if not _held:
        return
    _held = False
    signal.signal(signal.SIGHUP, signal.SIG_DFL if _previous is None else _previous)
    came, _pending = _pending, False  # read after the restore: a later one acts by itself
    if came and deliver and _previous is not signal.SIG_IGN:
        os.kill(os.getpid(), signal.SIGHUP)


def ignore_from_now(loop: Any) -> None:
    """A daemon whose stop is over: SIGHUP is ignored until the process ends. ``loop``'s handler
    goes (its close would put SIGHUP's default back), so a SIGHUP in the exit's last moments
    (the loop's executor and the interpreter's shutdown: threads joined, the model runtime and
    gRPC torn down) no longer ends a clean stop killed by SIGHUP, which systemd and Kubernetes
    report as a failure (a reload script, ``kill -HUP``, came as the daemon stopped). There is
    nothing left to reload. A no-op where ``loop`` has no SIGHUP handler (not the main thread).

    SIGHUP is ignored first and only then taken out of the loop's table: asyncio's
    ``remove_signal_handler`` puts SIG_DFL back before it returns, and a SIGHUP between that and
    our SIG_IGN ended the stop killed by it (1 of 20 stops under a SIGHUP every 2 ms, in CI). The
    loop's table is CPython's ``_signal_handlers`` (3.8 to 3.13); a loop without one (another
    event loop implementation) goes the old way."""
    sig = getattr(signal, "SIGHUP", None)
    if sig is None:
        return
    handlers = getattr(loop, "_signal_handlers", None)
    if not isinstance(handlers, dict):
        if loop.remove_signal_handler(sig):
            signal.signal(sig, signal.SIG_IGN)
        return
    if sig not in handlers:
        return
    signal.signal(sig, signal.SIG_IGN)  # never SIG_DFL on the way
    del handlers[sig]  # the loop's close leaves it alone (a SIGHUP meanwhile: the loop finds no handler)
    if not handlers:  # as remove_signal_handler does for the last one: the loop's close closes the
        try:  # wake-up socket, and a signal after it wrote to that descriptor, or to its next owner
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            pass


__all__ = ["hold", "ignore_from_now", "release", "take"]
