"""Error taxonomy of edgewise: what went wrong and what the caller should do.

Every error we raise names the input (file, field, key path) and says what to
change. Which wire status (``detect_pb2.Status``) and gRPC code each class maps
to at a service boundary is decided in one table, ``edgewise.status``, following
kopf's PermanentError / TemporaryError split and h11's ``error_status_hint``.
"""

from __future__ import annotations


class EdgewiseError(Exception):
    """Base class; at a boundary an error of no more specific class is INTERNAL."""


class InvalidInputError(EdgewiseError, ValueError):
    """Input from outside (image, request, file, config) is wrong; fix the input."""


class ConfigError(InvalidInputError):
    """A settings or policy file is invalid; the message names file, line and key path."""


class ModelError(InvalidInputError):
    """A model file is missing, corrupt, or not a YOLOv5 detector."""


class DeploymentError(EdgewiseError):
    """This host lacks something the configuration needs (a library, a device).

    Not the caller's fault and not fixable by changing the request: the installation
    must be fixed, and meanwhile another replica may serve the same request.
    """


class OverloadedError(EdgewiseError):
    """Capacity exhausted right now; retry later or elsewhere."""


class UnavailableError(EdgewiseError):
    """A peer is unreachable or shutting down; retry on another peer."""


class DeadlineExceededError(EdgewiseError):
    """The request's deadline passed before it could be served."""


class UnauthenticatedError(EdgewiseError):
    """The caller's identity (token, certificate, topic) is missing or does not match."""
