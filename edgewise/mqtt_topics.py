"""The MQTT topic layout between edge and gateway, in one place: build, parse, check.

::

    <prefix>/<device>/escalate            edge -> gateway: serialized DetectRequest
    <prefix>/<device>/response/<client>   gateway -> edge: DetectResponse (MQTT v5 Response Topic)
    <prefix>/<device>/detections          edge sink: one JSON record per frame

Gateway replicas share ``$share/<group>/<prefix>/+/escalate`` (MQTT v5 shared
subscription, OASIS MQTT 5.0 section 4.8.2). Each device lives in its own subtree
``<prefix>/<device>/``, which a broker ACL can confine it to (``deploy/mosquitto``);
the gateway answers only on response topics inside the requesting device's subtree,
or on a pattern the operator configures with a ``{device}`` placeholder. A request
carries its device's bearer token as the MQTT v5 User Property ``authorization``.
"""

from __future__ import annotations

from typing import List

from edgewise.errors import InvalidInputError

#: MQTT v5 User Property that carries ``Bearer <token>`` on a request (as gRPC metadata does).
AUTHORIZATION_PROPERTY = "authorization"
ESCALATE = "escalate"
RESPONSE = "response"
DETECTIONS = "detections"
DEVICE_PLACEHOLDER = "{device}"
_FORBIDDEN = ("+", "#", "\x00")


def _malformed(c: str) -> bool:
    """Whether ``c`` is a control character (U+0001..U+001F, U+007F..U+009F) or a noncharacter
    (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF), which MQTT 5.0 section 1.5.4 lets a broker close the
    connection of a client for and Mosquitto does ("malformed packet"), or a surrogate
    (U+D800..U+DFFF, a byte that is not UTF-8 read from the environment), which is not UTF-8."""
    return (c < "\x20" or "\x7f" <= c <= "\x9f" or "\ud800" <= c <= "\udfff" or "\ufdd0" <= c <= "\ufdef"
            or ord(c) & 0xFFFE == 0xFFFE)


def _control(value: str) -> bool:
    """Whether ``value`` holds a character a broker refuses in a topic (``_malformed``)."""
    return any(_malformed(c) for c in value)


def check_segment(value: str, what: str) -> str:
    """One topic level (device id, client id, group): non-empty, no ``/``, wildcard, NUL
    or other character a broker refuses (``_malformed``: a line break, a noncharacter, a byte
    that is not UTF-8), not starting with ``$`` (reserved for the broker, MQTT 5.0 section 4.7.2)."""
    if (not value or "/" in value or any(c in value for c in _FORBIDDEN) or _control(value)
            or value.startswith("$")):
        raise InvalidInputError(
            f"{what} {value!r} cannot be an MQTT topic level: it must be non-empty, without "
            f"'/', '+', '#', NUL or another control character (a line break), a noncharacter or a byte that "
            f"is not UTF-8, and not start with '$'")
    return value


def check_prefix(prefix: str, what: str = "topic_prefix") -> str:
    """A topic prefix: one or more levels separated by ``/``, each a valid segment."""
    if not prefix or prefix.startswith("/") or prefix.endswith("/"):
        raise InvalidInputError(
            f"{what} {prefix!r}: must be a non-empty topic without a leading or trailing '/'")
    for level in prefix.split("/"):
        check_segment(level, f"{what} level")
    return prefix


def escalate_topic(prefix: str, device: str) -> str:
    return f"{prefix}/{device}/{ESCALATE}"


def escalate_filter(prefix: str) -> str:
    """The filter matching every device's requests."""
    return f"{prefix}/+/{ESCALATE}"


def shared_subscription(group: str, prefix: str) -> str:
    return f"$share/{group}/{escalate_filter(prefix)}"


def response_topic(prefix: str, device: str, client: str) -> str:
    return f"{prefix}/{device}/{RESPONSE}/{client}"


def response_pattern(prefix: str) -> str:
    """The default response-topic pattern: the device's own ``response`` subtree."""
    return f"{prefix}/{DEVICE_PLACEHOLDER}/{RESPONSE}/#"


def detections_topic(prefix: str, device: str) -> str:
    return f"{prefix}/{device}/{DETECTIONS}"


def device_of_request(prefix: str, topic: str) -> str:
    """The device of a request topic ``<prefix>/<device>/escalate``; InvalidInputError otherwise."""
    head = prefix + "/"
    tail = "/" + ESCALATE
    if not topic.startswith(head) or not topic.endswith(tail):
        raise InvalidInputError(f"topic {topic!r} is not {escalate_topic(prefix, '<device>')}")
    return check_segment(topic[len(head):-len(tail)], f"device in topic {topic!r}")


def check_pattern(pattern: str, what: str = "response_topic_pattern") -> str:
    """An operator's response-topic pattern: an MQTT topic filter whose levels may be
    ``{device}`` (the requesting device), ``+`` or a final ``#``; it must contain ``{device}``
    so that no device can have its answers sent into another device's topics."""
    levels = pattern.split("/") if pattern else []
    if DEVICE_PLACEHOLDER not in levels:
        raise InvalidInputError(
            f"{what} {pattern!r}: must contain a level {DEVICE_PLACEHOLDER} (e.g. "
            f"'replies/{DEVICE_PLACEHOLDER}/#'), so each device gets answers only in its own topics")
    for i, level in enumerate(levels):
        if level in (DEVICE_PLACEHOLDER, "+") or (level == "#" and i == len(levels) - 1):
            continue
        check_segment(level, f"{what} level")
    return pattern


def response_topic_allowed(pattern: str, device: str, topic: str) -> bool:
    """Whether the gateway may publish ``device``'s answer to ``topic`` under ``pattern``."""
    if not topic or any(c in topic for c in _FORBIDDEN) or topic.startswith("$"):
        return False
    return _matches(pattern.split("/"), topic.split("/"), device)


def _matches(filt: List[str], levels: List[str], device: str) -> bool:
    """MQTT 5.0 section 4.7 topic-filter matching, with ``{device}`` matching exactly ``device``."""
    for i, f in enumerate(filt):
        if f == "#":
            return len(levels) > i  # at least one level below: the subtree, not the parent
        if i >= len(levels):
            return False
        if f == "+":
            if not levels[i]:
                return False
            continue
        if levels[i] != (device if f == DEVICE_PLACEHOLDER else f):
            return False
    return len(filt) == len(levels)
