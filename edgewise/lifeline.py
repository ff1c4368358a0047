"""A child process that ends when the process that started it is gone, however that one ended.

``edgewise cloud up``, ``edgewise demo`` and the tests start workers, gateways and edge daemons
as child processes, each in its own session (a Ctrl-C in the terminal must reach the parent,
which stops them in order). A parent killed with SIGKILL (the OOM killer, ``kill -9``, a CI
job's timeout) ran no clean-up, so its children went on under init, holding their ports and
the machine's cores.

The parent makes one pipe (:class:`Lifeline`), keeps its write end for as long as the children
should live, and gives each child the read end (``pass_fds``) and its number in
``EDGEWISE_LIFELINE_FD``. The child's :func:`watch` reads it in a daemon thread: the read
returns at end of file once no process holds the write end, which the kernel closes when the
parent ends, whichever way, and the child then sends itself SIGTERM, its usual stop (a
worker or a gateway drains; a command still starting ends). ``prctl(PR_SET_PDEATHSIG)`` would
not do: it fires when the *thread* that started the child ends, not the process.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Dict, MutableMapping, Optional

log = logging.getLogger(__name__)

#: the variable that names the inherited read end in a child
ENV = "EDGEWISE_LIFELINE_FD"


class Lifeline:
    """The parent's side: a pipe whose write end only this process holds."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()  # both close-on-exec: only pass_fds hands one on

    def child_env(self, env: MutableMapping[str, str]) -> Dict[str, str]:
        """``env`` with the variable a child's :func:`watch` reads; start the child with
        ``pass_fds=(lifeline.read_fd,)``."""
        return {**env, ENV: str(self.read_fd)}

    def close(self) -> None:
        """Let the children go (they end as at the parent's end): call once they are stopped."""
        for fd in (self._write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._write_fd = self.read_fd = -1


def watch(environ: Optional[MutableMapping[str, str]] = None) -> bool:
    """In a child: when ``EDGEWISE_LIFELINE_FD`` names an inherited pipe, end this process with
    SIGTERM once its parent is gone. The variable is removed, so this process's own children
    do not watch a pipe they were not given. False when there is nothing to watch."""
    env = os.environ if environ is None else environ
    text = env.pop(ENV, None)
    if text is None:
        return False
    try:
        fd = int(text)
        os.fstat(fd)
    except (ValueError, OSError):
        log.warning("%s=%r names no open pipe: this process will not end with its parent", ENV, text)
        return False

    def wait_for_the_parent() -> None:
        try:
            while os.read(fd, 1):  # the parent never writes: only its end ends the read
                pass
        except OSError:
            return
        log.warning("the process that started this one is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait_for_the_parent, name="lifeline", daemon=True).start()
    return True


__all__ = ["ENV", "Lifeline", "watch"]
