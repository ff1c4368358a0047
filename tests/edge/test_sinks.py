"""Sinks with real destinations: the JSON Lines file and a real Mosquitto broker.

The MQTT sink is store-and-forward through its on-disk outbox: a broker outage
loses nothing up to the outbox's bound (the oldest beyond it are dropped, counted),
everything is published once the broker is back, in order, and a late record is
never published twice, also not by a second sink instance on the same outbox (a
daemon restarted after a crash between the sink write and the spool ack)."""

from __future__ import annotations

import json
import os
import re
import socket
import time

import pytest

from edge.metrics import EdgeMetrics
from edge.outbox import Outbox
from edge.sinks import JsonlSink, MqttSink, Sinks
from edge.spool import wal_working_bytes
from edge.transports.mqtt import SESSION_EXPIRY_S, MqttConnection
from tests.conftest import TopicRecorder
from tests.edge.helpers import frame_record, read_jsonl
from tests.waiting import wait_until

TOPIC = "edgewise/dev/detections"


def connect(broker):
    """The daemon's connection for the sink: a kept session, so records go out at QoS 2."""
    conn = MqttConnection(broker.host, broker.port, client_id="sink-test", session_expiry_s=SESSION_EXPIRY_S)
    conn.start()
    wait_until(conn.connected.is_set, 10, "the sink's MQTT connection")
    return conn


def late(seq):
    rec = frame_record("cam", seq)
    rec.late, rec.outcome = True, "cloud"
    return rec


def write(sinks, rec):
    sinks.write(rec)


def test_broker_outage_loses_nothing_and_late_records_are_published_once(tmp_path, mosquitto):
    rec_topic = TopicRecorder(mosquitto, TOPIC)
    metrics = EdgeMetrics()
    conn = connect(mosquitto)
    outbox = tmp_path / "outbox.db"
    sink = MqttSink(conn, TOPIC, Outbox(outbox, 1000), metrics)
    sinks = Sinks([sink])
    try:
        for seq in range(5):
            write(sinks, frame_record("cam", seq))
        wait_until(lambda: len(rec_topic.messages) == 5, 10, "5 records on the topic")
        wait_until(lambda: len(sink.outbox) == 0, 10, "an empty outbox")
        mosquitto.stop()
        wait_until(lambda: not conn.connected.is_set(), 10, "the disconnect")
        for seq in range(5, 12):
            write(sinks, frame_record("cam", seq))
        write(sinks, late(3))
        write(sinks, late(3))  # the replay repeated: not stored again
        assert len(sink.outbox) == 8
        assert metrics.sink_backlog.labels("mqtt")._value.get() == 8
        mosquitto.start()
        wait_until(lambda: len(rec_topic.messages) >= 13 and len(sink.outbox) == 0, 60,
                   "the backlog published after the broker came back")
    finally:
        sink.close()
        conn.stop()
    # A restarted daemon (a new sink on the same outbox) replays late record 3 again.
    conn = connect(mosquitto)
    sink = MqttSink(conn, TOPIC, Outbox(outbox, 1000), metrics)
    try:
        write(Sinks([sink]), late(3))
        write(Sinks([sink]), late(4))
        wait_until(lambda: len(rec_topic.messages) >= 14, 10, "late record 4")
    finally:
        sink.close()
        conn.stop()
        rec_topic.stop()
    got = [(r["frame_seq"], r["late"]) for r in rec_topic.json()]
    assert got == [(s, False) for s in range(12)] + [(3, True), (4, True)]
    assert metrics.sink_backlog.labels("mqtt")._value.get() == 0


def test_outbox_bound_drops_the_oldest_and_counts_them(tmp_path, mosquitto):
    rec_topic = TopicRecorder(mosquitto, TOPIC)  # a persistent session: the broker keeps its messages
    mosquitto.stop()  # the broker is down when the sink starts
    metrics = EdgeMetrics()
    conn = MqttConnection(mosquitto.host, mosquitto.port, client_id="sink-bound", session_expiry_s=SESSION_EXPIRY_S)
    conn.start()
    sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 5), metrics)
    try:
        for seq in range(8):
            write(Sinks([sink]), frame_record("cam", seq))
        assert len(sink.outbox) == 5
        assert metrics.sink_dropped.labels("mqtt")._value.get() == 3
        mosquitto.start()
        wait_until(lambda: len(rec_topic.messages) == 5, 60, "the 5 kept records")
        rec_topic.stop()
    finally:
        sink.close()
        conn.stop()
    assert [r["frame_seq"] for r in rec_topic.json()] == [3, 4, 5, 6, 7]


def test_jsonl_sink_writes_each_late_record_once_also_after_a_restart(tmp_path):
    path = tmp_path / "out.jsonl"
    sinks = Sinks([JsonlSink(str(path))])
    write(sinks, frame_record("cam", 1))
    write(sinks, late(1))
    write(sinks, late(1))
    sinks.close()
    sinks = Sinks([JsonlSink(str(path))])  # reloads the late keys from the file's tail
    write(sinks, late(1))
    sinks.close()
    assert [(r["frame_seq"], r["late"]) for r in read_jsonl(path)] == [(1, False), (1, True)]
    assert json.loads(path.read_text().splitlines()[0])["detail"] == ""


def test_a_full_disk_never_leaves_a_torn_line_nor_a_late_key_it_did_not_write(tmp_path, small_fs):
    """The JSON Lines file on a real tmpfs that fills up: a record that does not fit raises
    (Sinks.write says the durable sink did not take it), the file keeps whole lines only and
    the late key is not remembered, so the spool's replay writes it once space returns."""
    fs = small_fs(64 * 1024)
    path = fs.path / "out.jsonl"
    sink = JsonlSink(str(path))
    sinks = Sinks([sink])
    rec = late(1)
    rec.error = "x" * 20_000  # bigger than what is left once the disk is filled
    assert all(sinks.write(frame_record("cam", i)) for i in range(1, 3))
    filler = fs.fill()  # another process fills the disk
    before = path.stat().st_size
    assert sinks.write(rec) is False
    assert path.stat().st_size == before and path.read_bytes().endswith(b"\n")
    assert rec.key not in sink.late_keys
    filler.unlink()
    assert sinks.write(rec) is True
    assert sinks.write(rec) is True  # a repeat is skipped, not an error
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["frame_seq"] for x in lines] == [1, 2, 1] and lines[-1]["late"]
    sink.close()


def test_live_records_a_full_disk_refuses_are_held_and_written_in_order_once_it_has_room(tmp_path, small_fs,
                                                                                          monkeypatch, caplog):
    """A live record has no other copy (the spool holds only escalations): while another
    process has filled the disk they wait in memory, and land in frame order, before the
    next one, when space returns; a late record is not held (the spool replays it). Beyond
    the bound the oldest are dropped and counted, and the log says so once, not per frame."""
    import edge.sinks as sinks_mod

    fs = small_fs(64 * 1024)
    path = fs.path / "out.jsonl"
    sink = JsonlSink(str(path))
    sinks = Sinks([sink])
    assert sinks.write(frame_record("cam", 1))
    filler = fs.fill()
    caplog.set_level("WARNING")
    for seq in range(2, 12):
        big = frame_record("cam", seq)
        big.error = "x" * 4000  # does not fit once the disk is full
        assert sinks.write(big) is False
    assert sinks.write(late(20)) is False and len(sink.held) == 10  # the late one is the spool's
    assert len([r for r in caplog.records if "failed to write" in r.message]) == 1  # throttled
    filler.unlink()
    assert sinks.write(frame_record("cam", 12))
    assert [r["frame_seq"] for r in read_jsonl(path)] == list(range(1, 13))
    assert not sink.held and sink.held.bytes == 0

    monkeypatch.setattr(sinks_mod, "BACKLOG_BYTES", 3 * 4200)  # room for 3 of those records
    filler = fs.fill()
    for seq in range(13, 19):
        big = frame_record("cam", seq)
        big.error = "x" * 4000
        sinks.write(big)
    assert len(sink.held) <= 3 and sink.held.dropped == 6 - len(sink.held)
    filler.unlink()
    kept = len(sink.held)
    sink.close()  # what is held is written at exit
    seqs = [r["frame_seq"] for r in read_jsonl(path)]
    assert seqs == list(range(1, 13)) + list(range(19 - kept, 19))


def test_a_broker_that_takes_qos_1_only_gets_the_records_at_qos_1(tmp_path, caplog):
    """Mosquitto ``max_qos 1`` drops a client that publishes at QoS 2: the sink reads the
    broker's Maximum QoS and sends at QoS 1 (at least once), keeping no packet identifier."""
    from tests.conftest import configured_mosquitto

    with configured_mosquitto("max_qos 1") as broker:
        rec_topic = TopicRecorder(broker, TOPIC)
        conn = connect(broker)
        sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 100), EdgeMetrics())
        try:
            assert conn.max_qos == 1 and not conn.exactly_once
            assert "takes QoS 1 at most: the MQTT sink publishes at QoS 1" in caplog.text
            for seq in range(4):
                write(Sinks([sink]), frame_record("cam", seq))
            wait_until(lambda: len(rec_topic.messages) == 4 and len(sink.outbox) == 0, 10, "4 records delivered")
            assert conn.connected.is_set()
        finally:
            sink.close()
            conn.stop()
            rec_topic.stop()
        assert [r["frame_seq"] for r in rec_topic.json()] == [0, 1, 2, 3]


def test_escalations_keep_slots_on_a_connection_whose_sink_records_are_stuck_in_flight(tmp_path):
    """The sink and the escalations share one MQTT connection (20 messages in flight, paho
    queueing the rest first in, first out). 60 records of a backlog, with the broker's
    PUBRECs held back (a slow uplink, at its worst): the sink keeps a quarter of the slots
    free (``sink_window``), so an escalation still goes out and is answered. Before, the sink
    handed 64 records to paho and every escalation waited behind them until its deadline."""
    import asyncio

    from edge.sinks import sink_window
    from edge.transports.mqtt import MqttTransport
    from tests.conftest import configured_mosquitto
    from tests.edge.test_mqtt_sink_restart import PUBREC, HoldingProxy
    from tests.edge.transports.test_mqtt_refusals import Responder, request

    with configured_mosquitto() as broker:
        responder = Responder(broker)
        proxy = HoldingProxy(broker.port, {PUBREC})
        conn = MqttConnection("127.0.0.1", proxy.port, client_id="cam-1-shared", session_expiry_s=SESSION_EXPIRY_S)
        sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 1000), EdgeMetrics())
        conn.start()
        try:
            wait_until(conn.connected.is_set, 10, "the shared connection")
            assert conn.exactly_once  # the sink's records go out at QoS 2, and their PUBRECs are held
            for seq in range(60):
                sink.write(frame_record("cam", seq), b"record %d" % seq)
            stuck = min(sink_window(conn.in_flight_bound, sink.window), conn.in_flight_bound)
            wait_until(lambda: proxy.held >= stuck, 10, f"{stuck} PUBRECs held")

            async def escalate():
                t = MqttTransport(conn, "cam-1")
                await t.start()
                try:
                    for seq in range(6):  # more than the free slots, one after the other
                        assert (await t.detect(request(seq), 5.0)).frame_seq == seq
                finally:
                    await t.close()
            asyncio.run(escalate())
            assert proxy.held == stuck and len(sink._pending) == stuck  # the sink took no more slots
            assert (conn.in_flight_bound, stuck) == (20, 15)
        finally:
            sink.close()
            responder.close()
            proxy.close()


def test_a_jsonl_sink_that_cannot_be_opened_is_one_line_naming_the_setting(tmp_path):
    """A folder that cannot be made (a file in its place) or a file that cannot be appended to
    is the sink's one-line error naming ``sinks.jsonl``, not an OSError's traceback."""
    from edge.sinks import JsonlSink
    from edgewise.errors import DeploymentError

    (tmp_path / "flat").write_text("")
    for path in (tmp_path / "flat" / "x.jsonl", tmp_path):
        with pytest.raises(DeploymentError, match=rf"sinks.jsonl {re.escape(str(path))}: cannot open it for "
                                                  "appending"):
            JsonlSink(str(path))
    made = tmp_path / "new" / "deeper" / "d.jsonl"
    JsonlSink(str(made)).close()
    assert made.exists()


def test_a_jsonl_file_removed_moved_or_replaced_while_running_is_followed(tmp_path, caplog):
    """An operator's ``rm`` of the file while the daemon ran sent every later record, late ones
    included (their spool entries then acknowledged), into the unlinked file: all lost, no
    log line (found by a fault probe); with rotation on, every write failed from then on. The
    sink now writes the file that is at its path: made again when removed or moved away, the
    new one when replaced, measured again when truncated in place; where no new file can be
    made there, the moved one goes on taking records."""
    caplog.set_level("WARNING", logger="edge.sinks")
    path = tmp_path / "out.jsonl"
    size = len(frame_record("cam", 1).to_json()) + 1
    sinks = Sinks([JsonlSink(str(path), max_bytes=4 * size + 20, keep=2)])  # four records, not five
    write(sinks, frame_record("cam", 1))
    path.unlink()
    write(sinks, frame_record("cam", 2))
    write(sinks, late(2))
    assert [(r["frame_seq"], r["late"]) for r in read_jsonl(path)] == [(2, False), (2, True)]
    for seq in range(3, 7):  # past max_bytes: the new file rotates like the first
        write(sinks, frame_record("cam", seq))
    assert [r["frame_seq"] for r in read_jsonl(path)] == [5, 6]
    assert len(list(tmp_path.glob("out.jsonl.*"))) == 1
    path.rename(tmp_path / "moved.jsonl")  # a rotation of someone else's ("create")
    path.write_bytes(b'{"frame_seq": 99, "tor')  # and a new file there, ending mid-line
    write(sinks, frame_record("cam", 7))
    assert path.read_bytes().splitlines()[1].startswith(b'{"device"')  # its own line
    assert [r["frame_seq"] for r in read_jsonl(path)] == [7]
    with open(path, "r+b") as f:  # "copytruncate": the same file, emptied
        f.truncate(0)
    for seq in range(8, 12):  # four records fit: the bytes truncated away do not count
        write(sinks, frame_record("cam", seq))
    assert [r["frame_seq"] for r in read_jsonl(path)] == [8, 9, 10, 11]
    path.rename(tmp_path / "kept.jsonl")
    path.mkdir()  # nothing can be opened at the path: the moved file goes on
    write(sinks, frame_record("cam", 12))
    path.rmdir()
    write(sinks, frame_record("cam", 13))
    assert [r["frame_seq"] for r in read_jsonl(tmp_path / "kept.jsonl")] == [8, 9, 10, 11, 12]
    assert [r["frame_seq"] for r in read_jsonl(path)] == [13]
    sinks.close()
    said = [r.getMessage().split(str(path), 1)[1] for r in caplog.records if "sinks.jsonl" in r.getMessage()]
    assert [("removed" in m, "replaced" in m, "cannot be opened anew" in m) for m in said] == [
        (True, False, False), (False, False, False), (False, True, False), (False, True, True), (True, False, False)
    ], said  # removed; the torn line; replaced; nothing to open, the moved file goes on; made again


def test_a_torn_last_line_on_a_full_disk_does_not_stop_the_start(small_fs):
    """The torn line's newline is written with the next record: writing it at the start made a
    full disk stop the daemon (an OSError out of the sink's constructor), found by a review."""
    fs = small_fs(64 * 1024)
    path = fs.path / "out.jsonl"
    path.write_bytes(b'{"frame_seq": 1, "tor')
    filler = fs.fill()
    sink = JsonlSink(str(path))  # no write at the start
    sinks = Sinks([sink])
    big = frame_record("cam", 2)
    big.error = "x" * 8000
    assert sinks.write(big) is False and len(sink.held) == 1
    filler.unlink()
    assert sinks.write(frame_record("cam", 3))
    sinks.close()
    assert [r["frame_seq"] for r in read_jsonl(path)] == [2, 3]
    assert path.read_bytes().splitlines()[0] == b'{"frame_seq": 1, "tor'


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    """A power cut mid-write leaves a line without its end; the next run's first record was
    appended to it, one unreadable line and that record lost to any line reader."""
    path = tmp_path / "out.jsonl"
    sinks = Sinks([JsonlSink(str(path))])
    write(sinks, frame_record("cam", 1))
    sinks.close()
    whole = path.read_bytes()
    path.write_bytes(whole + whole[:40])  # the torn copy of a line
    sinks = Sinks([JsonlSink(str(path))])
    write(sinks, frame_record("cam", 2))
    sinks.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3 and lines[1] == whole[:40]
    assert [r["frame_seq"] for r in read_jsonl(path)] == [1, 2]


def test_a_line_nested_past_the_json_decoders_depth_does_not_stop_the_start(tmp_path):
    """The sink reads the tail of its file at start (late keys, the last run): a line of 100000
    '[' made json.loads raise RecursionError, and the daemon died at every start with a
    traceback (exit 1, restarted by systemd for ever). It is a line that is not a record."""
    path = tmp_path / "out.jsonl"
    path.write_text('{"late": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    sinks = Sinks([JsonlSink(str(path))])
    write(sinks, frame_record("cam", 2))
    sinks.close()
    assert json.loads(path.read_text().splitlines()[-1])["frame_seq"] == 2


def test_live_records_the_mqtt_outbox_cannot_take_are_held_and_published_in_order(small_fs, mosquitto):
    """The outbox sits by default beside the spool, on the disk an outage fills: every live
    record it refused was lost (counted as a sink error, nothing held), while the JSON Lines
    file kept them (found by a fault probe). They now wait in memory like the file's and go
    into the outbox, in order, before the next record; a late one stays the spool's."""
    fs = small_fs(1024 * 1024)
    rec_topic = TopicRecorder(mosquitto, TOPIC)
    conn = connect(mosquitto)
    sink = MqttSink(conn, TOPIC, Outbox(fs.path / "outbox.db", 1000), EdgeMetrics())
    sinks = Sinks([sink])
    try:
        assert sinks.write(frame_record("cam", 1))
        wait_until(lambda: len(rec_topic.messages) == 1, 10, "the first record")
        filler = fs.fill()
        for seq in range(2, 7):
            big = frame_record("cam", seq)
            big.error = "x" * 20_000  # does not fit once the disk is full
            assert sinks.write(big) is False
        assert sinks.write(late(30)) is False and len(sink.held) == 5  # the late one is the spool's
        filler.unlink()
        assert sinks.write(frame_record("cam", 7))
        wait_until(lambda: len(rec_topic.messages) == 7, 30, "the held records and the next one")
    finally:
        sink.close()
        conn.stop()
        rec_topic.stop()
    assert [r["frame_seq"] for r in rec_topic.json()] == list(range(1, 8))


def test_records_held_while_another_process_locked_the_outbox_go_in_a_slice_per_write_in_order(
        tmp_path, mosquitto):
    """Another process holds the outbox's write lock (an sqlite3 shell left in a transaction):
    each write returns at once and its record is held. Once the lock is let go, a write puts
    held records in for at most DRAIN_SLICE_S, the record itself held behind those left; the
    next writes go on, and every record reaches the topic in order. The first write used to put
    the whole backlog in at once on the event loop: 16 MiB of records held it up 8.9 s."""
    import time

    from edge.sinks import DRAIN_SLICE_S
    from tests.edge.helpers import held_behind_a_lock

    rec_topic = TopicRecorder(mosquitto, TOPIC)
    conn = connect(mosquitto)
    sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 50_000), EdgeMetrics())
    sinks = Sinks([sink])
    n = 5000
    try:
        held_behind_a_lock(sinks, tmp_path / "outbox.db", n)
        assert len(sink.held) == n and sinks.failing == {"mqtt"}
        t0 = time.monotonic()
        assert sinks.write(frame_record("cam", n))  # taken: in memory behind the held ones
        took = time.monotonic() - t0
        assert 0 < len(sink.held) < n and took < DRAIN_SLICE_S + 0.5, (len(sink.held), took)
        seq = n + 1
        while sink.held:
            assert sinks.write(frame_record("cam", seq)) and seq < 3 * n
            seq += 1
        assert not sinks.failing
        wait_until(lambda: len(rec_topic.messages) == seq, 60, "every record on the topic")
    finally:
        sink.close()
        conn.stop()
        rec_topic.stop()
    assert [r["frame_seq"] for r in rec_topic.json()] == list(range(seq))


def test_a_lock_another_process_holds_on_the_outbox_never_holds_up_pahos_thread(tmp_path):
    """A broker whose Maximum QoS is 1 (AWS IoT Core's; Mosquitto's ``max_qos 1``): each PUBACK
    deletes its record from the outbox on paho's thread, the thread that also takes the
    escalations' answers, shared connection. With another process holding the outbox's lock,
    that delete waited SQLite's 30 s busy timeout per record there, and the answers with it. Now
    paho's thread never waits for the lock: the delete is left to the publisher thread, done
    once the lock is let go; nothing is published twice."""
    import time

    import paho.mqtt.publish as mqtt_publish

    from tests.conftest import configured_mosquitto
    from tests.edge.helpers import hold_write_lock, let_go

    path = tmp_path / "outbox.db"
    with configured_mosquitto("max_qos 1", persistence=True) as broker:
        rec_topic = TopicRecorder(broker, TOPIC)
        conn = connect(broker)
        answers = []
        conn.subscribe("edgewise/dev/answers", lambda msg: answers.append(time.monotonic()))
        sink = MqttSink(conn, TOPIC, Outbox(path, 1000), EdgeMetrics())
        sinks = Sinks([sink])
        holder = None
        try:
            broker.stop()
            wait_until(lambda: not conn.connected.is_set(), 10, "the broker gone")
            for seq in range(10):  # kept in the outbox until the broker is back
                assert sinks.write(frame_record("cam", seq))
            holder = hold_write_lock(path)
            broker.start()
            wait_until(lambda: len(rec_topic.messages) == 10, 30, "the records published, their PUBACKs in")
            assert not conn.exactly_once and len(sink.outbox) == 10  # not deleted: the lock is held
            t0 = time.monotonic()
            mqtt_publish.single("edgewise/dev/answers", b"answer", qos=1, hostname=broker.host, port=broker.port)
            wait_until(lambda: answers, 20, "the answer on the sink's connection")
            assert answers[0] - t0 < 2.0, answers[0] - t0
            let_go(holder)
            holder = None
            wait_until(lambda: len(sink.outbox) == 0, 10, "the records deleted once the lock is let go")
        finally:
            if holder is not None:
                let_go(holder)
            sink.close()
            conn.stop()
            rec_topic.stop()
    assert [r["frame_seq"] for r in rec_topic.json()] == list(range(10))


def test_live_records_leave_the_spools_reserve_free_in_the_mqtt_outbox_too(small_fs, mosquitto):
    """The JSON Lines file kept the spool's reserve, but the MQTT outbox beside the spool (the
    default) could still take its last bytes, and the spool could then acknowledge nothing. With
    ``reserve_bytes`` a live record that would eat into it is held in memory; a late one, which
    lets the spool acknowledge, goes in; everything is published, in order, once space is back."""
    reserve = 96 * 1024
    fs = small_fs(768 * 1024)
    rec_topic = TopicRecorder(mosquitto, TOPIC)
    conn = connect(mosquitto)
    sink = MqttSink(conn, TOPIC, Outbox(fs.path / "outbox.db", 1000), EdgeMetrics(), reserve_bytes=reserve)
    sinks = Sinks([sink])
    try:
        assert sinks.write(frame_record("cam", 0))
        wait_until(lambda: len(rec_topic.messages) == 1, 10, "the first record")
        working = wal_working_bytes(sink.outbox._db)  # what the outbox's WAL may still take
        filler = fs.fill(leave=reserve + working + 48 * 1024)  # room for a few records above both
        seq = 1
        while sinks.write(frame_record("cam", seq)):
            seq += 1
            assert seq < 200, "live records went on into the reserve"
        assert seq > 1 and len(sink.held) == 1
        # the publisher's acknowledgements (deletes in the WAL) go on meanwhile: under load they
        # took 36 KiB of the reserve when the WAL's growth was not counted before a live record
        wait_until(lambda: len(rec_topic.messages) == seq, 30, "the records stored published")
        # their acknowledgements written (each deleted from the outbox once the broker's PUBACK is
        # read, which may come after the subscriber got the record)
        wait_until(lambda: len(sink.outbox) == 0, 30, "the records' acknowledgements written")
        assert fs.free() >= reserve - 16 * 1024  # the reserve is left (less one commit's pages)
        assert sinks.write(late(1000)) is True  # a late record may use it
        assert sinks.write(frame_record("cam", seq + 1)) is False and len(sink.held) == 2
        filler.unlink()
        assert sinks.write(frame_record("cam", seq + 2))
        wait_until(lambda: len(rec_topic.messages) == seq + 4, 30, "the held records and the next one")
    finally:
        sink.close()
        conn.stop()
        rec_topic.stop()
    assert [r["frame_seq"] for r in rec_topic.json()] == list(range(seq)) + [1000, seq, seq + 1, seq + 2]


def test_a_named_pipe_as_the_jsonl_file_is_refused_not_waited_on(tmp_path):
    """A FIFO at ``sinks.jsonl`` blocked the daemon's start until a reader came, then its
    start read the pipe it held open for writing, for ever (found by a review); check-config
    said ok. It is refused by name, with what to use instead."""
    from edge.sinks import JsonlSink
    from edgewise.errors import DeploymentError

    fifo = tmp_path / "records"
    os.mkfifo(fifo)
    with pytest.raises(DeploymentError, match=r"is a named pipe \(FIFO\), not a file; .*use sinks.stdout"):
        JsonlSink(str(fifo))


def test_a_named_pipe_put_at_the_jsonl_path_while_running_is_not_opened(tmp_path, caplog):
    """The same FIFO made at the path while the daemon runs (the file moved away first) would
    block the sink's reopen, and with it every record, until a reader came. The moved file goes
    on taking records, said in a WARNING; a removed one cannot, and the record is held."""
    caplog.set_level("WARNING", logger="edge.sinks")
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(str(path))
    sinks = Sinks([sink])
    try:
        write(sinks, frame_record("cam", 1))
        path.rename(tmp_path / "moved.jsonl")
        os.mkfifo(path)
        write(sinks, frame_record("cam", 2))  # returns: the pipe is looked at, not opened
        assert [r["frame_seq"] for r in read_jsonl(tmp_path / "moved.jsonl")] == [1, 2]
        assert any("is a named pipe (FIFO) now, not a file" in r.getMessage() for r in caplog.records)
        (tmp_path / "moved.jsonl").unlink()  # its last name gone: nowhere to write
        assert not sinks.write(frame_record("cam", 3))
        assert len(sink.held) == 1
    finally:
        sink.close()


@pytest.mark.parametrize("broker_inflight, bound, window", [(None, 20, 15), (100, 100, 64), (500, 100, 64)])
def test_the_in_flight_slots_follow_the_brokers_receive_maximum(tmp_path, broker_inflight, bound, window):
    """A QoS 2 record holds a slot for two round trips: the edge kept to 20 slots whatever the
    broker announced, which held the sink to about 55 records/s over a 100 ms uplink
    (bench/mqtt_sink.py). It now takes what the broker's Receive Maximum allows, up to 100."""
    from edge.sinks import SINK_WINDOW, sink_window
    from tests.conftest import configured_mosquitto

    extra = f"max_inflight_messages {broker_inflight}" if broker_inflight else ""
    with configured_mosquitto(extra) as broker:
        conn = connect(broker)
        try:
            assert conn.in_flight_bound == bound
            assert sink_window(conn.in_flight_bound, SINK_WINDOW) == window
            sock = conn.client.socket()  # small packets that each wait for an answer: no Nagle delay
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            conn.stop()


def test_live_lines_leave_the_spools_reserve_free_and_late_ones_may_use_it(small_fs):
    """On a disk shared with the spool, live lines took its last bytes: the spool could not
    acknowledge what it replayed, replayed it again and again, and every late record failed
    (found by a probe, a 2 MB tmpfs). With ``reserve_bytes`` a live line that would eat into
    the reserve is held in memory (as on a full disk), while a late line, whose
    acknowledgement frees the spool, still goes in."""
    reserve = 64 * 1024
    fs = small_fs(256 * 1024)
    path = fs.path / "out.jsonl"
    sink = JsonlSink(str(path), reserve_bytes=reserve)
    sinks = Sinks([sink])
    filler = fs.fill(leave=reserve + 8 * 1024)  # room for a few lines above the reserve
    seq = 0
    while sinks.write(frame_record("cam", seq)):
        seq += 1
    assert 0 < seq < 40 and len(sink.held) == 1
    assert fs.free() >= reserve - 4096  # the reserve is left (less one block's rounding)
    assert sinks.write(late(1000)) is True  # a late line may use it
    assert sinks.write(frame_record("cam", seq + 1)) is False and len(sink.held) == 2, [x[:40] for x in sink.held.items]
    filler.unlink()
    assert sinks.write(frame_record("cam", seq + 2))
    assert [r["frame_seq"] for r in read_jsonl(path)] == list(range(seq)) + [1000, seq, seq + 1, seq + 2]
    sink.close()


def test_paho_holds_at_most_the_byte_window_of_large_records_and_a_larger_one_goes_alone(tmp_path, mosquitto):
    """Records of 2,000 boxes (about 210 KB each) with a byte window of 600,000: a broker that
    stops answering (SIGSTOP) leaves paho holding 2 of them, not the 13 the record window (15
    of Mosquitto's 20) let through: at 10,000 boxes a frame that was 64 records, about 50 MB in
    paho's memory. A record of 8,000 boxes, larger than the window, still goes, alone, and
    every record arrives, in order, once the broker answers again."""
    import signal

    window = 600_000
    box = {"box": [101.5, 202.25, 303.75, 404.5], "score": 0.87654, "class_id": 2, "class_name": "car",
           "source": "edge"}
    records = []
    for seq in range(13):
        rec = frame_record("cam", seq)
        rec.detections = [dict(box) for _ in range(8000 if seq == 6 else 2000)]
        records.append(rec)
    sizes = [len(r.to_json()) for r in records]
    assert 2 * sizes[0] <= window < 3 * sizes[0] and sizes[6] > window, sizes
    recorder = TopicRecorder(mosquitto, TOPIC)
    conn = connect(mosquitto)
    held_at_publish = []  # bytes of records paho holds once it has the one published, and whether it is alone
    publish = conn.publish

    def measured(topic, payload, *args, **kwargs):
        held = sum(len(m.payload) for m in list(conn.client._out_messages.values()) if m.topic == TOPIC)
        held_at_publish.append((held + len(payload), held == 0, len(payload)))
        return publish(topic, payload, *args, **kwargs)

    conn.publish = measured
    outbox = Outbox(tmp_path / "outbox.db", 1000)
    with pytest.raises(ValueError, match="window_bytes"):
        MqttSink(conn, TOPIC, outbox, window_bytes=0)
    sink = MqttSink(conn, TOPIC, outbox, window_bytes=window)
    sinks = Sinks([sink])
    try:
        mosquitto.proc.send_signal(signal.SIGSTOP)
        try:
            for rec in records:
                assert sinks.write(rec)
            wait_until(lambda: len(held_at_publish) >= 2, 30, "the first records handed to paho")
            time.sleep(1.0)  # a stopped broker answers nothing, so the sink hands nothing more (it handed all 13)
            assert len(held_at_publish) == 2, held_at_publish
        finally:
            mosquitto.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: len(recorder.messages) == 13, 60, "all 13 records on the topic")
        assert [r["frame_seq"] for r in recorder.json()] == list(range(13))
        assert max(held for held, _, _ in held_at_publish) <= sizes[6]
        assert all(held <= window for held, _, size in held_at_publish if size != sizes[6]), held_at_publish
        assert [alone for _, alone, size in held_at_publish if size == sizes[6]] == [True]
    finally:
        sink.close()
        recorder.stop()


def _stdout_into_a_pipe(monkeypatch):
    """``sys.stdout`` writing into a pipe of its own; (read end, the stdout object)."""
    import io
    import sys

    r, w = os.pipe()
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(w, "w")), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    return r, out


def _read_lines(fd: int, n: int, timeout_s: float = 30.0) -> list:
    """``n`` lines read from ``fd`` (fewer if it ends or ``timeout_s`` passes)."""
    import select

    buf = b""
    end = time.monotonic() + timeout_s
    while buf.count(b"\n") < n and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            buf += chunk
    return buf.splitlines()


def test_a_stdout_reader_that_stops_reading_holds_up_no_other_sink(tmp_path, monkeypatch):
    """sinks.stdout is how records are piped to a program. The record was written and flushed
    on the event loop: once the program stopped reading (or fell behind by a pipe's 64 KiB) the
    write blocked, and with it the whole daemon: a probe's real daemon stopped after 48 frames,
    the JSON Lines file with it, /healthz still said ok, and SIGTERM could not stop it. Now the
    records wait for the reader in memory, and the other sinks go on."""
    import threading

    from edge.sinks import StdoutSink

    r, out = _stdout_into_a_pipe(monkeypatch)
    stdout = StdoutSink()
    sinks = Sinks([stdout, JsonlSink(str(tmp_path / "d.jsonl"))])
    n = 2000  # about 700 KB of records: ten times what a pipe holds
    done = threading.Thread(target=lambda: [sinks.write(frame_record("cam", i)) for i in range(n)], daemon=True)
    done.start()
    done.join(30)
    try:
        assert not done.is_alive(), "the records were held up by stdout's reader"
        assert [rec["frame_seq"] for rec in read_jsonl(tmp_path / "d.jsonl")] == list(range(n))
        assert sinks.failing == frozenset()
        lines = _read_lines(r, n)  # the reader comes back: every record, in order
        assert [json.loads(line)["frame_seq"] for line in lines] == list(range(n))
    finally:
        os.close(r)  # a writer still blocked (before: the loop's thread) gets EPIPE and ends
        done.join(10)
        sinks.close()
        out.close()


def test_records_a_stuck_stdout_cannot_take_are_dropped_beyond_the_bound_counted_and_said(tmp_path, monkeypatch):
    """What waits for stdout's reader is bounded (the oldest dropped beyond it, counted in
    edgewise_edge_sink_dropped_total{sink="stdout"}); the sink is failing meanwhile; a reader
    gone (EPIPE) fails the records after it, and a close does not wait on a stuck reader for
    longer than the sinks' close time."""
    import edge.sinks as sinks_mod
    from edge.sinks import StdoutSink, counter

    monkeypatch.setattr(sinks_mod, "STDOUT_BACKLOG_BYTES", 64 * 1024)
    monkeypatch.setattr(sinks_mod, "CLOSE_TIMEOUT_S", 0.5)
    r, out = _stdout_into_a_pipe(monkeypatch)
    metrics = EdgeMetrics()
    stdout = StdoutSink(on_lost=counter(metrics, "stdout"))
    sinks = Sinks([stdout, JsonlSink(str(tmp_path / "d.jsonl"))])
    try:
        for i in range(2000):
            sinks.write(frame_record("cam", i))
        assert sinks.failing == {"stdout"}
        dropped = metrics.sink_dropped.labels("stdout")._value.get()
        assert dropped > 1000, dropped
        assert len(read_jsonl(tmp_path / "d.jsonl")) == 2000
        t0 = time.monotonic()
        stdout.close()  # the reader never comes back
        assert time.monotonic() - t0 < 3
        assert metrics.sink_dropped.labels("stdout")._value.get() > dropped  # what it still held
        os.close(r)  # the reader is gone: the records after fail
        r = -1

        def broken() -> bool:
            try:
                stdout.write(frame_record("cam", 9999), b"{}")
            except OSError as exc:
                return "Broken pipe" in str(exc)
            return False
        wait_until(broken, 10, "a write failing once the reader is gone")
    finally:
        if r >= 0:
            os.close(r)
        sinks.close()
        out.close()


def test_a_stdout_reader_gone_during_the_close_counts_the_record_being_written(monkeypatch):
    """Every record stdout's reader did not get is counted in sink_dropped{sink=stdout}. The
    record being written when the reader went away was counted only when no close was under
    way: a reader gone while the close waited for it (a program piped to the daemon that ends
    with it) lost that record uncounted."""
    import threading

    import edge.sinks as sinks_mod
    from edge.sinks import StdoutSink, counter

    r, out = _stdout_into_a_pipe(monkeypatch)
    entered, gone = threading.Event(), threading.Event()

    class _Os:
        """``os`` whose ``write`` blocks as into a pipe nobody reads, until the reader goes."""

        def __getattr__(self, name: str):
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data) -> int:
            entered.set()
            gone.wait(10)
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sinks_mod, "os", _Os())
    metrics = EdgeMetrics()
    stdout = StdoutSink(on_lost=counter(metrics, "stdout"))
    try:
        for i in range(3):
            stdout.write(frame_record("cam", i), b"{}")
        assert entered.wait(10)
        closing = threading.Thread(target=stdout.close)
        closing.start()
        wait_until(lambda: stdout._closing, 10, "the close under way")
        gone.set()  # the reader goes while the close waits for it
        closing.join(10)
        assert metrics.sink_dropped.labels("stdout")._value.get() == 3  # none of the three was written
    finally:
        gone.set()
        os.close(r)
        out.close()


def test_a_stdout_in_non_blocking_mode_waits_for_its_reader_too(monkeypatch):
    """A stdout shared with a parent that set it non-blocking (O_NONBLOCK is the open file's,
    not the process's: Node.js and some supervisors do) makes a write into a full pipe fail
    with EAGAIN instead of waiting. The writer thread took that for a reader gone: every record
    after it failed for as long as the daemon ran, though the reader only fell behind."""
    import fcntl

    from edge.sinks import StdoutSink

    r, out = _stdout_into_a_pipe(monkeypatch)
    w = out.fileno()
    fcntl.fcntl(w, fcntl.F_SETFL, fcntl.fcntl(w, fcntl.F_GETFL) | os.O_NONBLOCK)
    stdout = StdoutSink()
    n = 2000  # about 700 KB of records: ten times what a pipe holds
    try:
        for i in range(n):
            stdout.write(frame_record("cam", i), frame_record("cam", i).to_json())
        time.sleep(0.3)  # the pipe fills and stays full a while
        lines = _read_lines(r, n)  # the reader catches up: every record, in order
        assert [json.loads(line)["frame_seq"] for line in lines] == list(range(n))
        stdout.write(frame_record("cam", n), b"{}")  # and the sink still takes records
    finally:
        os.close(r)
        stdout.close()
        out.close()


def test_a_record_a_torn_page_left_as_zeros_is_dropped_not_published(tmp_path, mosquitto, caplog):
    """A record's last overflow page half written (a power cut, a card that lied about its write):
    the outbox's b-tree is sound, quick_check passes and the outbox opens as it is, but the record
    reads back as zeros. It was published as it was, a message of NUL bytes to every consumer of
    the topic; it is dropped now, said and counted, and the records around it go out in order."""
    import logging

    from edge.outbox_salvage import open_outbox
    from tests.edge.spooldamage import tear_page_holding

    path = tmp_path / "outbox.db"
    records = [json.dumps({"frame_seq": seq, "pad": "x" * 6000, "end": f"<end-{seq}>"}).encode() for seq in range(6)]
    outbox = Outbox(path, 1000)
    for data in records:  # each larger than a page: its end on an overflow page
        outbox.put(data)
    outbox.close()
    tear_page_holding(path, b"<end-3>")
    rec_topic = TopicRecorder(mosquitto, TOPIC)
    metrics = EdgeMetrics()
    opened = open_outbox(path, 1000)
    assert len(opened) == 6  # opened as it is: nothing for the start's salvage to see
    conn = connect(mosquitto)
    sink = MqttSink(conn, TOPIC, opened, metrics)
    try:
        wait_until(lambda: len(sink.outbox) == 0, 10, "the outbox published")
        wait_until(lambda: len(rec_topic.messages) >= 5, 10, "5 records on the topic")
        time.sleep(0.2)
    finally:
        sink.close()
        conn.stop()
        rec_topic.stop()
    assert [b"\0" in payload for _, payload in rec_topic.messages] == [False] * 5
    assert [r["frame_seq"] for r in rec_topic.json()] == [0, 1, 2, 4, 5]
    assert metrics.sink_dropped.labels("mqtt")._value.get() == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"MQTT sink: record 4 in the outbox {path} reads back as {len(records[3])} bytes of garbage "
                      "(zeros: a page a power cut or the storage left half written); dropped, not published. If this recurs, "
                      "check the disk (dmesg)"], errors


def test_durable_syncs_the_file_a_late_record_went_to_when_the_sink_rotated_since(tmp_path, monkeypatch):
    """The spool acknowledges a replay round's answers after ``Sinks.durable``'s call synced
    their late records. A round takes seconds (each window waits for the cloud) while live
    records go on: when the JSON Lines file rotated between a late record's write and the
    acknowledgement, the call synced only the new file, and the late record sat unsynced in
    the rotated one (plain, ``jsonl_compress`` off) while the spool's fsync'd delete let its
    answer go: a power cut then lost it from both."""
    path = tmp_path / "records.jsonl"
    sink = JsonlSink(str(path), max_bytes=600, keep=4)
    sinks = Sinks([sink])
    sinks.write(late(1))  # the replayed answer's late record
    n = 0
    while not [p for p in os.listdir(tmp_path) if p.startswith("records.jsonl.")]:
        n += 1
        sinks.write(frame_record("cam", 100 + n))  # live records meanwhile: the file rotates
    (rotated,) = [str(tmp_path / p) for p in os.listdir(tmp_path) if p.startswith("records.jsonl.")]
    with open(rotated, "rb") as f:
        assert b'"late":true' in f.read()
    synced = []
    real_fsync = os.fsync
    refuse = [True]

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name == rotated and refuse[0]:
            raise OSError(5, "Input/output error")
        synced.append(name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError):  # the disk refused: the spool's acknowledgement waits
        sinks.durable()()
    refuse[0] = False
    sinks.durable()()  # the next round's call syncs the rotated file still
    assert rotated in synced and str(path) in synced
    synced.clear()
    sinks.durable()()  # synced once: a later call syncs what is written from then on
    assert synced == [str(path)]
    sinks.close()
