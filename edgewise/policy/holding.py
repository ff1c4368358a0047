"""Atomically swappable holder of the policy in force, and the pure reload decision.

The daemon's watcher shell (file change or SIGHUP) calls
:meth:`PolicyHolder.reload`; it never raises. A valid new file replaces the
policy in one reference assignment under a lock and notifies listeners (the
:class:`~edgewise.policy.deciding.Escalator` registers its ``swap``); an
invalid one is refused with the loader's message and the old policy stays in
force. An unchanged file (same bytes) is a no-op, so a touch or a duplicate
inotify event does not reset anything.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Union

from edgewise.errors import ConfigError
from edgewise.policy.loading import MAX_POLICY_BYTES, load_policy, parse_policy
from edgewise.policy.schema import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReloadResult:
    """Outcome of a reload.

    Attributes:
        ok: the new file is valid (whether or not it changed anything).
        error: the reason it was refused (file, line, key path), when not ok.
        changed: the policy in force was replaced.
        policy: the policy in force after the call.
        version: counter of policies put in force (1 for the initial one).
    """

    ok: bool
    error: Optional[str]
    changed: bool
    policy: Policy
    version: int


@dataclass(frozen=True)
class ReloadPlan:
    """Pure decision of what a reload should do (see :func:`plan_reload`)."""

    ok: bool
    error: Optional[str]
    changed: bool
    policy: Optional[Policy]
    digest: str


def plan_reload(current_digest: str, data: Union[str, bytes], source_name: str) -> ReloadPlan:
    """Decide a reload from the new file contents: refuse, no-op, or replace."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    digest = hashlib.sha256(raw).hexdigest()
    if digest == current_digest:
        return ReloadPlan(True, None, False, None, digest)
    try:
        policy = parse_policy(raw, source_name)
    except ConfigError as exc:
        return ReloadPlan(False, str(exc), False, None, digest)
    return ReloadPlan(True, None, True, policy, digest)


Listener = Callable[[Policy], None]


class PolicyHolder:
    """The policy in force, replaced atomically; thread-safe."""

    def __init__(self, policy: Policy, data: Union[str, bytes, None] = None) -> None:
        self._lock = threading.Lock()
        self._policy = policy
        raw = data.encode("utf-8") if isinstance(data, str) else data
        self._digest = hashlib.sha256(raw).hexdigest() if raw is not None else ""
        self._listeners: List[Listener] = []
        self.version = 1
        self.reloads_ok = 0
        self.reloads_failed = 0
        self.last_error: Optional[str] = None

    @classmethod
    def from_file(cls, path: Union[str, Path]) -> PolicyHolder:
        """Load the initial policy (raises :class:`ConfigError` when invalid)."""
        p = Path(path)
        policy = load_policy(p)
        return cls(policy, p.read_bytes())

    @property
    def policy(self) -> Policy:
        """The policy in force (an immutable value; safe to keep for one frame)."""
        return self._policy

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(new_policy)`` after every successful replacement."""
        with self._lock:
            self._listeners.append(listener)

    def reload(self, path: Union[str, Path]) -> ReloadResult:
        """Re-read ``path``; never raises (a read or validation error keeps the old policy)."""
        p = Path(path)
        try:
            if p.stat().st_size > MAX_POLICY_BYTES:
                return self._refuse(f"{p}: policy file over the {MAX_POLICY_BYTES}-byte limit")
            data = p.read_bytes()
        except OSError as exc:
            return self._refuse(f"{p}: cannot read the policy file: {exc.strerror or exc}")
        return self.reload_text(data, str(p))

    def reload_text(self, data: Union[str, bytes], source_name: str) -> ReloadResult:
        """Validate ``data`` and put it in force when valid and different; never raises."""
        with self._lock:
            plan = plan_reload(self._digest, data, source_name)
            if not plan.ok:
                self.reloads_failed += 1
                self.last_error = plan.error
                log.warning("policy reload refused, keeping %r: %s",
                            self._policy.metadata.name, plan.error)
                return ReloadResult(False, plan.error, False, self._policy, self.version)
            if not plan.changed or plan.policy is None:
                return ReloadResult(True, None, False, self._policy, self.version)
            self._policy = plan.policy
            self._digest = plan.digest
            self.version += 1
            self.reloads_ok += 1
            self.last_error = None
            policy = self._policy
            version = self.version
            # Inside the lock so listeners see replacements in order.
            for fn in self._listeners:
                fn(policy)
        log.info("policy %r (version %d) in force from %s",
                 policy.metadata.name, version, source_name)
        return ReloadResult(True, None, True, policy, version)

    def _refuse(self, error: str) -> ReloadResult:
        with self._lock:
            self.reloads_failed += 1
            self.last_error = error
            log.warning("policy reload refused, keeping %r: %s", self._policy.metadata.name, error)
            return ReloadResult(False, error, False, self._policy, self.version)
