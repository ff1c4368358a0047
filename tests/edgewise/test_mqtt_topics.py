"""The MQTT topic layout: build, parse, check segments, response-topic patterns."""

from __future__ import annotations

import pytest

from edgewise import mqtt_topics as mt
from edgewise.errors import InvalidInputError


def test_layout_round_trips():
    assert mt.escalate_topic("edgewise", "cam-1") == "edgewise/cam-1/escalate"
    assert mt.device_of_request("edgewise", "edgewise/cam-1/escalate") == "cam-1"
    assert mt.device_of_request("site/a", "site/a/cam-1/escalate") == "cam-1"
    assert mt.shared_subscription("gw", "edgewise") == "$share/gw/edgewise/+/escalate"
    assert mt.response_topic("edgewise", "cam-1", "c1") == "edgewise/cam-1/response/c1"
    assert mt.detections_topic("edgewise", "cam-1") == "edgewise/cam-1/detections"
    for bad in ("edgewise/escalate", "other/cam-1/escalate", "edgewise/a/b/escalate", "edgewise/cam-1/detections",
                "edgewise/$SYS/escalate"):
        with pytest.raises(InvalidInputError):
            mt.device_of_request("edgewise", bad)


# a control character (a trailing \r from an environment file edited on Windows): Mosquitto
# drops the connection of a client that subscribes or publishes to such a topic ("malformed
# packet", MQTT 5.0 section 1.5.4), so every record and escalation waited for ever
@pytest.mark.parametrize("value", ["", "a/b", "a+", "#", "$sys", "a\x00", "edgewise\r", "a\tb", "a\x7f", "a\x85"])
def test_segments_and_prefixes_are_checked(value):
    with pytest.raises(InvalidInputError, match="cannot be an MQTT topic level"):
        mt.check_segment(value, "device_id")
    assert mt.check_prefix("a/b") == "a/b"
    for prefix in ("", "/a", "a/", "a//b", "a/+/b"):
        with pytest.raises(InvalidInputError):
            mt.check_prefix(prefix)


def test_response_topics_stay_in_the_device_subtree():
    default = mt.response_pattern("edgewise")
    ok = mt.response_topic_allowed
    assert ok(default, "cam-1", "edgewise/cam-1/response/c1")
    assert ok(default, "cam-1", "edgewise/cam-1/response/a/b")
    for topic in ("edgewise/cam-2/response/c1", "edgewise/cam-2/detections", "edgewise/cam-1/response",
                  "edgewise/cam-1/detections", "edgewise/cam-1/response/+", "edgewise/cam-1/response/#",
                  "$SYS/x", ""):
        assert not ok(default, "cam-1", topic), topic
    custom = mt.check_pattern("replies/{device}/+")
    assert ok(custom, "cam-1", "replies/cam-1/x") and not ok(custom, "cam-1", "replies/cam-1/x/y")
    assert not ok(custom, "cam-1", "replies/cam-2/x")


def test_patterns_must_bind_the_device():
    with pytest.raises(InvalidInputError, match=r"must contain a level \{device\}"):
        mt.check_pattern("replies/#")
    with pytest.raises(InvalidInputError, match="cannot be an MQTT topic level"):
        mt.check_pattern("replies/{device}/#/x")


# what else Mosquitto refuses in a topic (MQTT 5.0 section 1.5.4, "malformed packet": the
# connection dropped at each subscribe and publish, as for a control character): a
# noncharacter (U+FFFE, U+FDD0..U+FDEF); and a surrogate (a Latin-1 byte in an environment
# file, which Python reads as U+DC80..U+DCFF) is not UTF-8 at all: paho raises UnicodeEncodeError
@pytest.mark.parametrize("value", ["a\ufffe", "a\uffff", "a\ufdd0", "a\ufdef", "a\U0001fffe", "caf\udce9", "a\ud800"])
def test_characters_a_broker_refuses_as_malformed_are_refused_too(value):
    with pytest.raises(InvalidInputError, match="cannot be an MQTT topic level"):
        mt.check_segment(value, "device_id")
    with pytest.raises(InvalidInputError):
        mt.check_prefix(f"site/{value}")


def test_other_characters_beyond_ascii_are_topic_levels():
    for value in ("caf\u00e9", "a\u2028", "\u76e3\u8996", "a\U0001f600", "a\ufdcf", "a\ufdf0", "a\ufffd"):
        assert mt.check_segment(value, "device_id") == value
