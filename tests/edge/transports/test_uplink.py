"""The escalation transports' uplink window (``edge.transports.uplink``), on a hand-driven clock."""

from __future__ import annotations

from typing import List, Optional, Tuple

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
    assert not w.queueing()  # c has waited 0.5 s, less than 1.5 x a's 0.6 s on the idle link
    assert w.refusal(500_000, 0.5) is None
    clock.t += 0.45  # c has waited 0.95 s: it is queued
    # c is 500 kB ahead of a new one: 1 MB in 1 s at 1 MB/s, within 3/4 of 1.4 s, not of 1.2 s
    assert w.refusal(500_000, 1.4) is None
    refused = w.refusal(500_000, 1.2)
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
    clock.t += 0.5
    w.acknowledged("c")
    clock.t += 9.6
    w.sent("d", 500_000)
    assert w.rate() is None and w.refusal(500_000, 2.0) is None


def _twenty_a_second_over_300_ms(w: UplinkWindow, clock: Clock, late: Optional[int]) -> List[Tuple[float, int]]:
    """40 requests of 20 kB, 50 ms apart, each acknowledged 300 ms after it was sent (request
    ``late`` 900 ms after), the acknowledgements due by each send taken first; returns those still
    to come, (due, request) in order."""
    sends = [clock.t + 0.05 * i for i in range(40)]
    acks = sorted((t + (0.9 if i == late else 0.3), i) for i, t in enumerate(sends))
    for i, t in enumerate(sends):
        while acks and acks[0][0] <= t:
            clock.t = acks[0][0]
            w.acknowledged(acks.pop(0)[1])
        clock.t = t
        w.sent(i, 20_000)
    return acks


def test_a_link_the_escalations_do_not_fill_is_not_judged_by_their_rate():
    """20 requests a second over a fast link with a 300 ms round trip: each is acknowledged 300 ms
    after it was sent, so the acknowledgements come 50 ms apart, as the requests went, and read as
    a rate of 400 kB/s. Eight more at once were then refused (8 x 20 kB ahead at 400 kB/s: 0.5 s),
    where the link carried them in 16 ms."""
    w, clock = window()
    _twenty_a_second_over_300_ms(w, clock, late=None)
    assert w.rate() == pytest.approx(400_000)
    for k in range(8):  # a burst, beside the 6 in flight
        assert w.refusal(20_000, 0.5) is None
        w.sent(("burst", k), 20_000)
    assert not w.queueing()


def test_requests_waiting_longer_than_the_round_trip_are_queueing():
    w, clock = window()
    w.sent("a", 1000)
    clock.t += 0.2
    w.acknowledged("a")  # 0.2 s: the shortest lately
    w.sent("b", 1000)
    clock.t += 0.25
    assert not w.queueing()
    clock.t += 0.1  # b has waited 0.35 s, over 1.5 x 0.2
    assert w.queueing()


def test_one_late_acknowledgement_does_not_make_a_link_the_escalations_do_not_fill_queueing():
    """The link of the test above, where one acknowledgement comes late (a jittery cellular
    link): the requests waiting now are not queued, so the burst after it is not refused by the
    escalations' own rate (counting the last acknowledgement's time too refused it)."""
    w, clock = window()
    acks = _twenty_a_second_over_300_ms(w, clock, late=35)
    while acks:  # every request acknowledged, the late one last (0.9 s, three times the floor)
        clock.t = acks[0][0]
        w.acknowledged(acks.pop(0)[1])
    for k in range(8):  # a burst onto the idle link, then more while those are in flight
        assert w.refusal(20_000, 0.5) is None
        w.sent(("burst", k), 20_000)
    clock.t += 0.1
    assert not w.queueing() and w.refusal(20_000, 0.5) is None


def grpc_window() -> Tuple[UplinkWindow, Clock]:
    """The gRPC transport's window: no byte cap, no stall rule, the idle calls' rate as a bound."""
    clock = Clock()
    return UplinkWindow(1 << 62, clock=clock, acknowledger="the gRPC cloud", refuse_stalled=False,
                        idle_bound=True), clock


def test_a_call_that_missed_its_deadline_makes_the_uplink_queueing_for_as_long_again():
    """140 kB whole frames at 64 kB/s: one sent to an idle uplink answered in 2.25 s (a floor of
    2.25 s, a bound of 62 kB/s); the next, sent 1 s into the following one, waited less than 1.5
    times the floor and went, and the two missed their 3 s deadlines together. Before, the call
    after them was let through as well (no queue seen, no rate measured behind another), and the
    convoy went on; now a miss counts as queueing for as long as the call took, the bound refuses
    the call, and once that time is over the uplink is itself again."""
    w, clock = grpc_window()
    w.sent("idle", 140_000)
    clock.t += 2.25
    w.acknowledged("idle")
    w.sent("a", 140_000)
    clock.t += 1.0
    assert w.refusal(140_000, 3.0) is None  # not seen as queueing: it overlaps
    w.sent("b", 140_000)
    clock.t += 2.0
    w.missed("a")  # at its 3 s deadline
    assert w.held_bytes == 140_000
    refused = w.refusal(140_000, 3.0)
    assert refused is not None and refused.status == status.DEADLINE_EXCEEDED, refused
    assert "140000 bytes are ahead of it and the gRPC cloud acknowledges 62 kB/s" in refused.message
    clock.t += 1.0
    w.missed("b")
    assert w.refusal(140_000, 3.0) is None  # nothing held: an idle uplink takes one
    w.sent("c", 140_000)
    clock.t += 3.05  # past the miss's span (3 s), c not yet waiting 1.5 floors
    assert w.refusal(140_000, 3.0) is None


def test_the_idle_bound_outlives_the_rate_memory_until_another_is_measured():
    """A convoy answers nothing: after a miss, the last idle call's rate stands after
    ``RATE_MEMORY_S``, or the window would let the convoy go on with no rate to refuse by."""
    w, clock = grpc_window()
    w.sent("idle", 140_000)
    clock.t += 2.0
    w.acknowledged("idle")
    clock.t += 60
    assert w.rate() is None  # no call missed its deadline: the idle rate stands for nothing
    w.sent("a", 140_000)
    clock.t += 3.0
    w.missed("a")
    assert w.rate() == pytest.approx(70_000)
    mqtt, mclock = window()
    mqtt.sent("idle", 140_000)
    mclock.t += 2.0
    mqtt.acknowledged("idle")
    assert mqtt.rate() is None  # the MQTT window waits for a rate measured behind another


def test_a_small_call_that_missed_its_deadline_on_a_slow_cloud_leaves_the_uplink_as_it_was():
    """A fast link with a 300 ms round trip (40 kB answered in 0.3 s sent alone: 133 kB/s at
    least) and a replay of 40 kB that missed its 10 s deadline in a busy cloud (replays are
    served after the live calls): its transmission is 0.3 s of 10, not the link's doing, and a
    live call sent beside another is not refused for the next 10 s."""
    w, clock = grpc_window()
    w.sent("idle", 40_000)
    clock.t += 0.3
    w.acknowledged("idle")
    w.sent("replay", 40_000)
    clock.t += 10.0
    w.missed("replay")
    w.sent("live", 40_000)
    clock.t += 0.05
    assert w.refusal(40_000, 0.5) is None


def test_calls_waiting_in_a_slow_cloud_on_a_fast_link_are_not_queueing():
    """A fast link with a 300 ms round trip and a cloud that takes 350 ms (a worker batching with
    a max delay), 40 kB calls 10 a second with a 0.9 s deadline, each answered 0.65 s after it was
    sent, in time. A call not answered yet has waited the cloud's time too; taken as the link's,
    the oldest one (0.6 s) looked queued behind the round trip (1.5 x 0.3 s), the rate was the
    calls' own (400 kB/s: their acknowledgements come as they went) and the 240 kB in flight and
    this one's 40 kB would take 0.7 s of it, past 0.75 of the deadline: refused. Through a real
    10 MB/s link (``test_grpc_uplink.py``) 31 of 100 were refused where all 100 were answered in
    time without the window. The cloud's time the answers show is not counted as waiting on the
    link."""
    w, clock = grpc_window()
    w.sent("idle", 1000)
    clock.t += 0.31
    w.acknowledged("idle", clock.t - 0.01, answered_at=clock.t)  # the round trip; the cloud 10 ms
    start, refused = clock.t, []
    events = sorted([(start + k * 0.1, "send", k) for k in range(40)] +
                    [(start + k * 0.1 + 0.65, "answer", k) for k in range(40)])
    for t, what, k in events:
        clock.t = t
        if what == "send":
            if w.refusal(40_000, 0.9) is not None:
                refused.append(k)
            else:
                w.sent(k, 40_000)
        elif k not in refused:
            w.acknowledged(k, t - 0.35, answered_at=t)  # the gateway's own 350 ms
    assert refused == []
    assert w.rate() is not None and w.rate() < 500_000  # the calls' own rate, as before: not used


def test_a_link_queue_longer_than_the_cloud_s_time_is_still_queueing():
    """The cloud's time is taken off a waiting call's, no more: over a slow link (40 kB in 1.25 s
    sent alone, a cloud of 50 ms) a call waiting 2.5 s behind another is queueing, and one more
    that cannot be carried by its 2 s deadline is refused."""
    w, clock = grpc_window()
    w.sent("idle", 40_000)
    clock.t += 1.3
    w.acknowledged("idle", clock.t - 0.05, answered_at=clock.t)
    w.sent("a", 40_000)
    w.sent("b", 40_000)
    clock.t += 1.3
    w.acknowledged("a", clock.t - 0.05, answered_at=clock.t)
    clock.t += 1.25
    w.acknowledged("b", clock.t - 0.05, answered_at=clock.t)  # queued behind a: 32 kB/s measured
    w.sent("c", 40_000)
    w.sent("d", 40_000)
    clock.t += 2.5
    assert w.queueing()
    refused = w.refusal(40_000, 2.0)
    assert refused is not None and refused.status == status.DEADLINE_EXCEEDED, refused
