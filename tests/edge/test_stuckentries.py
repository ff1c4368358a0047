"""The rule of what a replay round steps over (edge.stuckentries), on an injected clock."""

from edge.stuckentries import ATTEMPTS, EVIDENCE_S, MAX_REST_S, StuckEntries


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_an_entry_is_stuck_after_attempts_failures_in_a_row_and_forgotten_once_settled():
    s = StuckEntries(2.0, Clock())
    for _ in range(ATTEMPTS - 1):
        assert s.failed(7) is False
    assert s.failed(7) is True and s.stuck(7)
    s.settled(7)
    assert not s.stuck(7) and s.failures(7) == 0


def test_a_stuck_entry_is_stepped_over_only_while_the_cloud_is_known_to_answer():
    clock = Clock()
    s = StuckEntries(2.0, clock)
    for _ in range(ATTEMPTS):
        s.failed(1)
    assert not s.steps_over(1) and s.needs_probe(1)  # its own failures are no evidence
    s.answered()  # (a probe was answered)
    assert not s.steps_over(1) and not s.needs_probe(1)  # failed during an outage only: sent first
    s.failed(1)  # failed while the cloud answers: stuck for a reason of its own, or the cloud gone again
    assert not s.answering() and not s.steps_over(1) and s.needs_probe(1)
    s.answered()  # (the probe behind it was answered: the entry's own)
    assert s.steps_over(1) and not s.needs_probe(1)
    clock.t += EVIDENCE_S + 0.1  # an answer long ago says nothing about now
    assert not s.steps_over(1) and s.needs_probe(1)
    s.answered()
    s.unanswered()  # a live escalation or an entry not stuck failed since: an outage, maybe
    assert not s.steps_over(1)


def test_failures_during_an_outage_do_not_make_the_head_rest_once_the_cloud_is_back():
    """A long outage fails the head at every round; the cloud back, it is sent first (resting
    it for the outage's length held its late answer for minutes)."""
    s = StuckEntries(2.0, Clock())
    for _ in range(ATTEMPTS * 10):
        s.failed(1)
    s.answered()
    assert s.stuck(1) and not s.resting(1) and s.resting_count() == 0


def test_the_failure_of_an_entry_not_stuck_says_the_cloud_does_not_answer_and_a_stuck_ones_does_not():
    s = StuckEntries(2.0, Clock())
    for _ in range(ATTEMPTS):
        s.failed(1)
    s.answered()
    s.failed(1)  # its first failure while the cloud answered: no evidence either way yet
    s.answered()
    s.failed(1)  # stuck for a reason of its own: it fails whatever the cloud does
    assert s.answering()
    s.failed(2)
    assert not s.answering()


def test_an_entry_failed_only_during_an_outage_says_the_cloud_does_not_answer():
    """The probes of an outage fail each entry behind the head ATTEMPTS times; the cloud answers
    once and is gone again: such an entry's failure is no different from the head's."""
    s = StuckEntries(2.0, Clock())
    for _ in range(ATTEMPTS * 2):
        s.failed(2)  # (probe_failed: the same count)
    s.answered()
    s.failed(2)
    assert not s.answering() and not s.steps_over(2)


def test_a_stuck_entry_rests_between_tries_longer_each_time_up_to_the_bound():
    clock = Clock()
    s = StuckEntries(2.0, clock)
    rests = []
    for _ in range(ATTEMPTS + 10):
        s.answered()  # live escalations keep being answered
        s.failed(1)
        s.answered()
        start = clock.t
        while s.resting(1):
            clock.t += 0.5
            s.answered()  # live escalations keep being answered
        rests.append(clock.t - start)
    assert rests[:ATTEMPTS - 1] == [0.0] * (ATTEMPTS - 1)  # not stuck: sent at each round
    assert rests[ATTEMPTS - 1:ATTEMPTS + 2] == [2.0, 4.0, 8.0]
    assert rests[-1] == MAX_REST_S and max(rests) == MAX_REST_S


def test_resting_entries_are_counted_and_only_while_the_cloud_answers():
    clock = Clock()
    s = StuckEntries(2.0, clock)
    for entry in (1, 2):
        for _ in range(ATTEMPTS):
            s.answered()
            s.failed(entry)
    s.failed(3)
    assert s.resting_count() == 0
    s.answered()
    assert s.resting_count() == 2
    s.keep([2, 3])  # 1 left the spool
    assert s.resting_count() == 1 and s.failures(1) == 0


def test_the_probe_is_the_entry_failed_least_often_oldest_first():
    s = StuckEntries(2.0, Clock())
    assert s.probe([]) is None
    s.failed(4)
    s.failed(5)
    assert s.probe([4, 5, 6]) == 6
    assert s.probe([4, 5]) == 4
