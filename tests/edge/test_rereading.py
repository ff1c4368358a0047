"""``edge.rereading.Rereader``: one thread reads the settings again at a time, however many
SIGHUPs come (a script sending one every 2 ms during a stop started a read per signal, and on
Python 3.8 their executor futures logged "Event loop is closed" tracebacks at the exit)."""

from __future__ import annotations

import threading
from typing import List

from edge.rereading import Rereader
from edge.settings import EdgeSettings
from tests.waiting import wait_until


def test_sighups_while_a_read_runs_make_one_more_read_not_one_each() -> None:
    loaded = EdgeSettings(device_id="dev")
    release = threading.Event()
    reads: List[str] = []

    def reread() -> EdgeSettings:
        reads.append(threading.current_thread().name)
        release.wait(10)
        return EdgeSettings(device_id="dev")

    r = Rereader(loaded, reread)
    r.request()
    wait_until(lambda: reads, 10, "the first read")
    for _ in range(200):
        r.request()
    release.set()
    wait_until(lambda: r._thread is None, 10, "the reads over")
    assert reads == ["settings-reread"] * 2  # the first, and one for all the SIGHUPs during it
    r.request()  # a later SIGHUP reads again
    wait_until(lambda: len(reads) == 3 and r._thread is None, 10, "the third read")


def test_the_comparison_is_with_the_settings_as_loaded_not_as_the_start_filled_them_in() -> None:
    loaded = EdgeSettings()
    r = Rereader(loaded, lambda: EdgeSettings())
    loaded.device_id = "serial-1234"  # what the start resolves an empty device_id to
    assert r.loaded.device_id == ""
