"""Files a process keeps following while it runs (TLS certificates, keys, CA bundles, the
gateway's device tokens): the one rule of when they are read again, and a small shell that says
what happened.

A certificate renewed in place by an agent (``step ca renew --daemon``, certbot, ``edgewise edge
provision``), a Secret that kubelet swaps (``..data``), a CA bundle rotated by an operator: a
process that read its files once keeps the old ones until a restart, and once the old
certificate expires its next connection fails. The gateway's server certificate
(``cloud.gateway.tlsreload``), its MQTT bridge (``cloud.gateway.mqtt_tls``), its device tokens
file (``Gateway.check_tokens_file``), the Kubernetes client's projected token
(``cloud.discovery.kubeclient``) and the edge's transports (``edge.transports.grpc``,
``edge.transports.mqtt``) follow their files with :class:`ReloadDecision`:

* the files are looked at (:func:`edgewise.filereads.file_identity`: resolved path, inode, size,
  times) at most once per ``interval_s``, and read only when they differ from those in force;
* files that cannot be put in force (a certificate written before its key, a file that does not
  parse or is gone) are refused and reported once per change: the same files are read again only
  every ``retry_s`` (:data:`RETRY_REFUSED_S`, a minute), and reported again only when the problem
  differs. A read that failed for a passing reason (``EIO`` from a network volume, ``EMFILE``
  when the process was out of descriptors) is refused like a malformed file, and the files did
  not change, so without that retry a renewal that met such a moment would wait for the next
  renewal, after the files in force had expired;
* files that changed while they were read (the identities after the read differ from before)
  may be half old, half new: nothing is put in force, they are read again at the next look.

:class:`ReloadDecision` is pure (a clock reading, a function giving the identities and a loader
are passed in). :class:`FollowedFiles` is the shell the edge's transports share: it looks, logs
one ERROR per refused change naming the settings and the problem, one INFO when new files are
in force, and never raises (what goes wrong while looking is logged, a few times a minute, and
the files in force stay).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Tuple, TypeVar

from edgewise.errors import ConfigError
from edgewise.filereads import FileIdentity, file_identity
from edgewise.observability import LogThrottle

#: Looks at the files at most once per this many seconds, by default: a renewal is in force
#: about a second after it was written, and a storm of calls costs one ``stat`` per file per second.
RECHECK_S = 1.0

#: Files refused are read again, unchanged, at most once per this many seconds by default (and
#: reported again only when the problem differs): a read error that passes does not hold a
#: renewal back until the files change again, and a file that stays bad costs one read a minute.
RETRY_REFUSED_S = 60.0

#: The identities of the watched files, in a fixed order (:func:`file_identity`; None: no file).
Identities = Tuple[Optional[FileIdentity], ...]

#: What the files are loaded into: the gateway's ``ServerFiles``, a client ``ssl.SSLContext``,
#: gRPC channel credentials.
Loaded = TypeVar("Loaded")


def identities_of(paths: Tuple[str, ...]) -> Identities:
    """The identities of ``paths``, in their order (an empty path: None)."""
    return tuple(file_identity(p) for p in paths)


@dataclass(frozen=True)
class Outcome(Generic[Loaded]):
    """What one look decided: ``files`` to use from now on, or the ``problem`` of files that
    changed and cannot be used (once per change), or neither (no look was due, nothing
    changed, or the files changed while they were read). ``changed``: the positions of the
    identities that differ from those of the files in force."""

    files: Optional[Loaded] = None
    problem: Optional[str] = None
    changed: Tuple[int, ...] = ()


NOTHING: Outcome[Any] = Outcome()


class ReloadDecision(Generic[Loaded]):
    """The identities of the files in force and of the last refused ones, and what a look
    means. Pure: the shell passes the clock reading, the looking and the loading (a
    ``ConfigError`` naming the files when they cannot be put in force)."""

    def __init__(self, served: Identities, now: float, interval_s: float = RECHECK_S,
                 retry_s: Optional[float] = None) -> None:
        self.served = served
        self.refused: Optional[Identities] = None
        self.interval_s = interval_s
        self.retry_s = RETRY_REFUSED_S if retry_s is None else retry_s
        self.last_look = now  # the start has just looked
        self._refused_at = now  # when the refused files were last read
        self._problem: Optional[str] = None  # why they were refused, as last reported

    def look(self, now: float, identities: Callable[[], Identities],
             load: Callable[[], Loaded]) -> Outcome[Loaded]:
        """At most one look per ``interval_s``: the files are loaded only when their identities
        differ from those in force and from the last refused ones (those are read again every
        ``retry_s``, and a refusal is reported once per change and problem), and taken only when
        they did not change while loaded."""
        if now - self.last_look < self.interval_s:
            return NOTHING
        self.last_look = now
        before = identities()
        if before == self.served or (before == self.refused and now - self._refused_at < self.retry_s):
            return NOTHING
        changed = tuple(i for i, (a, b) in enumerate(zip(before, self.served)) if a != b)
        files: Optional[Loaded]
        try:
            files = load()
            problem = None
        except ConfigError as exc:
            files, problem = None, str(exc)
        if identities() != before:  # written while read: perhaps half old, half new; again next look
            return NOTHING
        if files is None:
            again = before == self.refused and problem == self._problem
            self.refused, self._refused_at, self._problem = before, now, problem
            return NOTHING if again else Outcome(problem=problem, changed=changed)
        self.served, self.refused, self._problem = before, None, None
        return Outcome(files=files, changed=changed)

    @property
    def when_again(self) -> str:
        """When refused files are read again, for the shells' messages."""
        return f"they are read again when they change, and tried again every {self.retry_s:g} s"

    def acted(self, served: Identities) -> None:
        """Files with identities ``served`` were read and put in force by another path (the
        gateway's SIGHUP reads its tokens file): a look compares with those from now on."""
        self.served, self.refused, self._problem = served, None, None


class FollowedFiles(Generic[Loaded]):
    """A client's TLS files, followed: ``paths`` (an empty one is not used) named by ``settings`` in
    the messages, ``load`` reading and checking them (a ``ConfigError`` naming the setting and
    the problem when they cannot be used). Built at start, where files that cannot be loaded
    are the ``ConfigError`` of ``load``; ``loaded`` is what is in force. :meth:`look` before a
    connection or a call: the newly loaded files when they changed and can be used, else None.

    ``user`` says who uses the files, for the log (``"the gRPC transport"``); ``interval_s`` 0
    looks at every call (where calls are spaced already, as paho's reconnect attempts are)."""

    def __init__(self, paths: Tuple[str, ...], settings: Tuple[str, ...], load: Callable[[], Loaded],
                 user: str, logger: logging.Logger, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = RECHECK_S) -> None:
        self.paths = paths
        self.settings = settings
        self._load = load
        self.user = user
        self._log = logger
        self._clock = clock
        self._bug_log = LogThrottle(60.0, clock=clock)
        seen = self.identities()  # before the read: files written meanwhile differ at the first look
        self.loaded: Loaded = load()
        self.decision: ReloadDecision[Loaded] = ReloadDecision(seen, clock(), interval_s)

    def identities(self) -> Identities:
        return identities_of(self.paths)

    def load(self) -> Loaded:
        return self._load()

    def look(self) -> Optional[Loaded]:
        """The files, loaded, when they changed since those in force and can be used (they are in
        force from now on); None otherwise: no look due, nothing changed, or they cannot be used
        (one ERROR per change). Never raises."""
        try:
            out = self.decision.look(self._clock(), self.identities, self.load)
            named = ", ".join(f"{self.settings[i]} {self.paths[i]}" for i in out.changed if self.paths[i])
            if out.problem is not None:
                self._log.error("TLS files changed (%s) but were not put in force: %s "
                                "connects with the files it had; %s: %s",
                                named, self.user, self.decision.when_again, out.problem)
            if out.files is None:
                return None
            self.loaded = out.files
            self._log.info("TLS files changed: %s connects with the new files from now on; changed: %s",
                           self.user, named)
            return out.files
        except Exception:
            held = self._bug_log.allow()
            if held is not None:
                self._log.exception("looking at the TLS files failed; %s connects with the files it had%s",
                                    self.user, f" ({held} more failures not logged)" if held else "")
            return None
