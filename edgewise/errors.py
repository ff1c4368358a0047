"""Error taxonomy of edgewise: what went wrong and what the caller should do.

Every error we raise names the input (file, field, key path) and says what to
change. ``status`` is the gRPC status the boundary maps it to (see
``edgewise.grpcutil`` in the shells), following kopf's PermanentError /
TemporaryError split and h11's ``error_status_hint``.
"""

from __future__ import annotations


class EdgewiseError(Exception):
    """Base class. ``status`` names the gRPC status code at a service boundary."""

    status = "INTERNAL"


class InvalidInputError(EdgewiseError, ValueError):
    """Input from outside (image, request, file, config) is wrong; fix the input."""

    status = "INVALID_ARGUMENT"


class ConfigError(InvalidInputError):
    """A settings or policy file is invalid; the message names file, line and key path."""


class ModelError(InvalidInputError):
    """A model file is missing, corrupt, or not a YOLOv5 detector."""


class OverloadedError(EdgewiseError):
    """Capacity exhausted right now; retry later or elsewhere (RESOURCE_EXHAUSTED)."""

    status = "RESOURCE_EXHAUSTED"


class UnavailableError(EdgewiseError):
    """A peer is unreachable or shutting down; retry on another peer (UNAVAILABLE)."""

    status = "UNAVAILABLE"


class DeadlineExceededError(EdgewiseError):
    """The request's deadline passed before it could be served (DEADLINE_EXCEEDED)."""

    status = "DEADLINE_EXCEEDED"
