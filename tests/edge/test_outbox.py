"""The MQTT sink's outbox: the session it ties a device's restarts to, and its bound."""

from __future__ import annotations

from edge.outbox import Outbox, this_host


def test_the_client_id_is_kept_for_the_device_on_this_host_and_made_anew_elsewhere(tmp_path):
    path = tmp_path / "mqtt-outbox.db"
    made = iter(f"cam-1-{i:08x}" for i in range(10))
    box = Outbox(path, 10)
    first = box.client_id("cam-1-", lambda: next(made), "m1/host-a")
    box.put(b"r1")
    box.hand(1, 7)
    box.received(1)
    box.close()
    box = Outbox(path, 10)  # a restart on the same machine: the same session, the exchange to complete
    assert box.client_id("cam-1-", lambda: next(made), "m1/host-a") == first
    assert box.in_flight() == [(1, 7, True, b"r1")]
    # the file copied to another machine (a cloned image): its own id, the exchange is not its own
    other = box.client_id("cam-1-", lambda: next(made), "m2/host-b")
    assert other != first and box.in_flight() == [] and len(box) == 1
    assert box.client_id("cam-2-", lambda: "cam-2-0000abcd", "m2/host-b") == "cam-2-0000abcd"  # renamed device
    box.close()
    assert this_host()


def test_the_bound_drops_the_oldest_records_not_those_in_flight(tmp_path):
    box = Outbox(tmp_path / "o.db", 3)
    for i in range(3):
        box.put(f"r{i}".encode())
    box.hand(1, 5)  # r0 in flight: the broker's session may hold its packet identifier
    box.put(b"r3")
    assert [d for _, d in box.peek(0, 10)] == [b"r0", b"r2", b"r3"] and box.dropped == 1
    box.close()
