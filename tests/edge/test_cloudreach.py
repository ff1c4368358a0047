"""The cloud's part of the edge's /healthz (``edge.cloudreach``): a pure core on a fake clock."""

from __future__ import annotations

from edge.cloudreach import FAILING_AFTER, CloudReach


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_failing_takes_failures_in_a_row_and_one_answer_ends_it() -> None:
    clock = Clock()
    reach = CloudReach(clock)
    assert reach.health() == {"state": "unknown"}
    reach.answered()
    clock.t += 2.0
    assert reach.health() == {"state": "answering", "last_answer_s_ago": 2.0}
    for i in range(FAILING_AFTER - 1):  # a missed deadline or two in a busy minute: not an outage
        reach.failed(f"DEADLINE_EXCEEDED: call {i}")
        clock.t += 1.0
        assert reach.health()["state"] == "answering" and not reach.failing()
    reach.failed("UNAVAILABLE: failed to connect to all addresses")
    clock.t += 5.0
    assert reach.health() == {"state": "failing", "failed_in_a_row": FAILING_AFTER, "failing_for_s": 7.0,
                              "last_error": "UNAVAILABLE: failed to connect to all addresses",
                              "last_answer_s_ago": 9.0}
    reach.answered()  # a replay or a live call answered: the outage is over
    assert reach.health() == {"state": "answering", "last_answer_s_ago": 0.0}
    reach.failed("UNAVAILABLE: x")
    assert reach.health()["state"] == "answering"  # the count starts again


def test_a_device_whose_cloud_never_answered_is_failing_with_no_last_answer() -> None:
    clock = Clock()
    reach = CloudReach(clock)
    reach.failed("UNAVAILABLE: x")
    assert reach.health() == {"state": "answering", "last_answer_s_ago": None}  # too few to tell
    for _ in range(FAILING_AFTER):
        reach.failed("UNAVAILABLE: y")
    doc = reach.health()
    assert doc["state"] == "failing" and doc["last_answer_s_ago"] is None and doc["failed_in_a_row"] == FAILING_AFTER + 1
