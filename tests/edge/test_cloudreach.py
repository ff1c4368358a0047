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


def test_health_is_whole_whenever_the_loop_records_an_answer_meanwhile() -> None:
    """``/healthz`` is served by the metrics server's threads (``edge.metrics``) while the event
    loop records the calls' outcomes. ``health`` read the state field by field, so an answer
    recorded between its reads (a thread switch, which CPython 3.8, the Jetson's, makes between
    any two attribute stores) made it raise: ``TypeError: float - NoneType`` (found by review R:
    a hammering thread on 3.8 hit it 24 times in 3 s), a /healthz request dropped with a
    traceback. Here the answer lands at each bytecode of ``health`` in turn."""
    import sys

    ran = 0
    for at in range(200):
        clock = Clock()
        reach = CloudReach(clock)
        for _ in range(FAILING_AFTER):
            reach.failed("UNAVAILABLE: connection refused")
        seen = [0]

        def trace(frame, event, _arg, _at=at, _reach=reach, _seen=seen):  # type: ignore[no-untyped-def]
            if frame.f_code is not CloudReach.health.__code__:
                return None
            frame.f_trace_opcodes = True
            if event == "opcode":
                _seen[0] += 1
                if _seen[0] == _at:
                    _reach.answered()  # the loop's thread, between two of health's bytecodes
            return trace

        sys.settrace(trace)
        try:
            got = reach.health()
        finally:
            sys.settrace(None)
        if seen[0] < at:
            break  # past health's last bytecode
        ran += 1
        assert got["state"] in ("failing", "answering"), got
        if got["state"] == "failing":
            assert isinstance(got["failing_for_s"], float) and got["failed_in_a_row"] == FAILING_AFTER, got
    assert ran > 10  # the answer landed at every point of health
