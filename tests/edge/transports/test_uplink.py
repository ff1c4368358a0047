"""The MQTT transport's uplink window (``edge.transports.uplink``), on a hand-driven clock."""

from __future__ import annotations

from typing import Tuple

import pytest

from edge.transports.uplink import UplinkWindow
from edgewise import status


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def window(max_bytes: int = 10_000_000) -> Tuple[UplinkWindow, Clock]:
    clock = Clock()
    return UplinkWindow(max_bytes, clock=clock), clock


def test_an_idle_uplink_takes_any_one_request():
    w, clock = window(max_bytes=1000)
    assert w.refusal(5000, 0.5) is None  # larger than the cap, and nothing known of the rate
    w.sent("a", 5000)
    clock.t += 10
    w.acknowledged("a")
    assert w.held_bytes == 0 and w.refusal(5000, 0.5) is None


def test_bytes_not_acknowledged_are_bounded():
    w, clock = window(max_bytes=1_000_000)
    w.sent("a", 600_000)
    refused = w.refusal(500_000, 5.0)
    assert refused is not None and refused.status == status.RESOURCE_EXHAUSTED
    assert "cloud.mqtt.max_in_flight_bytes" in refused.message
    assert w.refusal(400_000, 5.0) is None


def test_a_stalled_uplink_refuses_once_its_oldest_request_is_older_than_the_deadline():
    w, clock = window()
    w.sent("a", 1000)
    clock.t += 0.4
    assert w.refusal(1000, 0.5) is None
    clock.t += 0.2
    refused = w.refusal(1000, 0.5)
    assert refused is not None and refused.status == status.DEADLINE_EXCEEDED and "stalled" in refused.message
    assert w.refusal(1000, 10.0) is None  # a replay's deadline is further off


def test_the_rate_is_measured_on_requests_queued_behind_another():
    w, clock = window()
    w.sent("a", 500_000)  # to an idle uplink: its time includes the round trip, not a rate sample
    w.sent("b", 500_000)
    clock.t += 0.6
    w.acknowledged("a")
    assert w.rate() is None
    w.sent("c", 500_000)
    clock.t += 0.5
    w.acknowledged("b")
    assert w.rate() == pytest.approx(1_000_000)  # 500 kB in the 0.5 s since a's acknowledgement
    # c is 500 kB ahead of a new one: 1 MB in 1 s at 1 MB/s
    assert w.refusal(500_000, 1.2) is None
    refused = w.refusal(500_000, 0.8)
    assert refused is not None and refused.status == status.DEADLINE_EXCEEDED and "1000 kB/s" in refused.message


def test_acknowledgements_that_come_together_count_their_bytes_in_the_time_before():
    w, clock = window()
    for k in "abc":
        w.sent(k, 100_000)
    clock.t += 0.1
    w.acknowledged("a")
    clock.t += 0.2
    w.acknowledged("b")
    w.acknowledged("c")  # read in the same packet as b's
    assert w.rate() == pytest.approx(1_000_000)  # 200 kB in 0.2 s


def test_a_request_forgotten_without_an_acknowledgement_leaves_the_window():
    w, clock = window(max_bytes=1000)
    w.sent("a", 600)
    w.sent("b", 300)
    w.keep_only(lambda k: k == "b")  # a withdrawn at its deadline, or dropped at a reconnect
    assert w.held_bytes == 300 and len(w) == 1
    assert w.refusal(600, 5.0) is None


def test_an_acknowledgement_before_the_send_is_noted_is_harmless():
    w, clock = window()
    w.acknowledged("a")  # paho's PUBACK read before publish() returned
    w.sent("a", 100)
    w.keep_only(lambda k: False)
    assert w.held_bytes == 0 and len(w) == 0


def test_a_rate_measured_across_a_stall_is_forgotten():
    """The acknowledgements that end a stall measure the stall: kept, they refused every request
    sent beside another one, and requests sent one at a time never measured the link again."""
    w, clock = window()
    w.sent("a", 500_000)
    w.sent("b", 500_000)
    clock.t += 0.1
    w.acknowledged("a")
    clock.t += 60  # the broker hung
    w.acknowledged("b")
    assert w.rate() == pytest.approx(500_000 / 60)
    w.sent("c", 500_000)  # one at a time: no new measurement
    assert w.refusal(500_000, 2.0) is not None
    clock.t += 0.5
    w.acknowledged("c")
    clock.t += 9.6
    w.sent("d", 500_000)
    assert w.rate() is None and w.refusal(500_000, 2.0) is None
