"""Atomically swappable holder of the policy in force, and the pure reload decision.

The daemon's watcher shell (file change or SIGHUP) reads and validates the new file
with :meth:`PolicyHolder.prepare` in a worker thread (a hostile file takes seconds to
refuse; frames go on meanwhile) and puts the result in force with
:meth:`PolicyHolder.apply` on its own thread, between two frames;
:meth:`PolicyHolder.reload` does both. None of them raises. A valid new file replaces
the policy in one reference assignment under a lock and notifies listeners (the
:class:`~edgewise.policy.deciding.Escalator` registers its ``swap``); an invalid one is
refused with the loader's message, logged once, and the old policy stays in force. An
unchanged file (same bytes) is a no-op, so a touch or a duplicate inotify event does not
reset anything.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Union

from edgewise.errors import ConfigError
from edgewise.policy.loading import parse_policy, read_policy_bytes
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
    source: str = ""


#: what a deployment checks of a valid policy beyond the policy itself ("" when it can run it),
#: e.g. that the transport it names is configured
Fit = Callable[[Policy], str]


def _fits(fit: Optional[Fit], policy: Policy, source_name: str) -> None:
    problem = fit(policy) if fit is not None else ""
    if problem:
        raise ConfigError(f"{source_name}: {problem}")


def plan_reload(current_digest: str, data: Union[str, bytes], source_name: str,
                fit: Optional[Fit] = None) -> ReloadPlan:
    """Decide a reload from the new file contents: refuse, no-op, or replace."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    digest = hashlib.sha256(raw).hexdigest()
    if digest == current_digest:
        return ReloadPlan(True, None, False, None, digest, source_name)
    try:
        policy = parse_policy(raw, source_name)
        _fits(fit, policy, source_name)
    except ConfigError as exc:
        return ReloadPlan(False, str(exc), False, None, digest, source_name)
    return ReloadPlan(True, None, True, policy, digest, source_name)


Listener = Callable[[Policy], None]


class PolicyHolder:
    """The policy in force, replaced atomically; thread-safe."""

    def __init__(self, policy: Policy, data: Union[str, bytes, None] = None, fit: Optional[Fit] = None) -> None:
        _fits(fit, policy, policy.source)
        self._fit = fit
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
    def from_file(cls, path: Union[str, Path], fit: Optional[Fit] = None) -> PolicyHolder:
        """Load the initial policy (raises :class:`ConfigError` when invalid or when ``fit``
        says this deployment cannot run it; a reload it refuses keeps the old policy)."""
        data = read_policy_bytes(path, regular_only=True)
        return cls(parse_policy(data, str(path)), data, fit)

    @property
    def policy(self) -> Policy:
        """The policy in force (an immutable value; safe to keep for one frame)."""
        return self._policy

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(new_policy)`` after every successful replacement."""
        with self._lock:
            self._listeners.append(listener)

    def reload(self, path: Union[str, Path]) -> ReloadResult:
        """Re-read ``path`` and put it in force when valid and different; never raises."""
        return self.apply(self.prepare(path))

    def prepare(self, path: Union[str, Path]) -> ReloadPlan:
        """Read and validate ``path`` without changing anything (any thread); never raises."""
        try:
            data = read_policy_bytes(path, regular_only=True)
        except ConfigError as exc:
            return ReloadPlan(False, str(exc), False, None, "", str(path))
        return plan_reload(self._digest, data, str(path), self._fit)

    def reload_text(self, data: Union[str, bytes], source_name: str) -> ReloadResult:
        """Validate ``data`` and put it in force when valid and different; never raises."""
        return self.apply(plan_reload(self._digest, data, source_name, self._fit))

    def apply(self, plan: ReloadPlan) -> ReloadResult:
        """Put a prepared plan in force (refusal logged once); never raises."""
        with self._lock:
            if not plan.ok:
                self.reloads_failed += 1
                self.last_error = plan.error
                log.warning("policy reload refused, keeping %r: %s",
                            self._policy.metadata.name, plan.error)
                return ReloadResult(False, plan.error, False, self._policy, self.version)
            if not plan.changed or plan.policy is None or plan.digest == self._digest:
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
                 policy.metadata.name, version, plan.source)
        return ReloadResult(True, None, True, policy, version)
