"""Noticing a changed ``auth.tokens_file`` without a signal.

In Kubernetes the device tokens come from a Secret mounted as a directory. When an operator
revokes or adds a token and updates the Secret, kubelet writes the new files into a fresh
timestamped directory and swaps the ``..data`` symlink to it (atomically); nothing signals the
gateway, so a revoked token kept working until SIGHUP or a restart. The gateway now looks at the
file every ``auth.tokens_poll_s`` and re-reads the tokens when it changed, through the same path
as SIGHUP (``Gateway.reload_tokens``).

:func:`edgewise.filereads.file_identity` is the one look (a ``stat`` through the links, the
rule every watched file of the project uses); :class:`FileWatch` is the
pure decision, identity by identity, of what a look means. The file is read only when its
identity changed, so a half-written or invalid file is refused (and logged) once per change,
not at every poll, and the identity is taken *before* the file is read: a file rewritten while
it was read differs at the next look and is read again.
"""

from __future__ import annotations

import enum

from edgewise.filereads import FileIdentity


class Change(enum.Enum):
    """What a look at the file means (:meth:`FileWatch.look`)."""

    NONE = "none"          # the file acted on last, or still nothing there
    CHANGED = "changed"    # another file, or the same one written again: read it
    GONE = "gone"          # nothing there any more (said once): the tokens in force stay


class FileWatch:
    """The identity of the file acted on last, and what a new look at it means. Pure: the shell
    (``Gateway.check_tokens_file``) does the looking, the reading and the logging."""

    def __init__(self, seen: FileIdentity | None) -> None:
        self.seen = seen

    def look(self, now: FileIdentity | None) -> Change:
        """Compare a look with the file acted on last, and remember it: each change (a new
        identity, or the file going) is reported once."""
        if now == self.seen:
            return Change.NONE
        self.seen = now
        return Change.GONE if now is None else Change.CHANGED

    def acted(self, seen: FileIdentity | None) -> None:
        """The file with identity ``seen`` was read by another path (SIGHUP): no change to it."""
        self.seen = seen
