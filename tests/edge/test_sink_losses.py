"""Every live record a durable sink loses is counted in ``edgewise_edge_sink_dropped_total``,
and a sink's close puts its held records in for a bounded time (``edge.sinks.CLOSE_TIMEOUT_S``).

Real components: a real tmpfs filled by another file (the JSON Lines sink's full disk), a
real process holding the MQTT outbox's SQLite write lock, an MQTT connection to a port where
no broker listens (an outage). Records are lost beyond the 16 MiB held in memory
(``edge.sinks.BACKLOG_BYTES``) and at exit; both used to be logged only."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from edge.metrics import EdgeMetrics
from edge.outbox import Outbox
from edge.sinks import BACKLOG_BYTES, JsonlSink, MqttSink, Sinks
from edge.transports.mqtt import SESSION_EXPIRY_S, MqttConnection
from tests.conftest import free_port
from tests.edge.helpers import frame_record, held_behind_a_lock, hold_write_lock, let_go, read_jsonl

TOPIC = "edgewise/dev/detections"
PAD = 4000  # bytes of ``error`` that make a record about 4.3 KB


def _big(seq: int):
    rec = frame_record("cam", seq)
    rec.error = "x" * PAD
    return rec


def _over_the_hold() -> int:
    """More records of :func:`_big` size than :data:`BACKLOG_BYTES` holds (by about 60)."""
    return BACKLOG_BYTES // len(_big(0).to_json()) + 60


def _dropped(metrics: EdgeMetrics, sink: str) -> float:
    return metrics.sink_dropped.labels(sink)._value.get()


def _unreachable_broker() -> MqttConnection:
    conn = MqttConnection("127.0.0.1", free_port(), client_id="sink-losses", session_expiry_s=SESSION_EXPIRY_S)
    conn.start()
    return conn


def test_live_lines_the_jsonl_sink_loses_beyond_the_hold_and_at_exit_are_counted(small_fs, caplog):
    """The JSON Lines file's disk is full: live lines wait in memory; beyond 16 MiB the oldest
    are dropped and counted as they are dropped, and at the close, the disk still full, the
    ones held are lost and counted too: every record written and not in the file is counted,
    once."""
    fs = small_fs(64 * 1024)
    path = fs.path / "out.jsonl"
    metrics = EdgeMetrics()
    sink = JsonlSink(str(path), metrics=metrics)
    sinks = Sinks([sink])
    assert sinks.write(frame_record("cam", 0))
    fs.fill()
    n = _over_the_hold()
    for seq in range(1, n + 1):
        assert sinks.write(_big(seq)) is False
    beyond = _dropped(metrics, "jsonl")
    assert beyond == sink.held.dropped > 0 and beyond + len(sink.held) == n, (beyond, len(sink.held), n)
    caplog.set_level(logging.ERROR)
    sink.close()
    assert [r["frame_seq"] for r in read_jsonl(path)] == [0]
    assert _dropped(metrics, "jsonl") == n
    assert any("live records held in memory are lost at exit" in r.message for r in caplog.records)


def test_live_records_the_mqtt_sink_loses_under_a_foreign_lock_are_counted(tmp_path, caplog):
    """The broker is unreachable and another process holds the outbox's write lock for good:
    live records wait in memory, the oldest beyond 16 MiB dropped and counted; the close waits
    for the lock its close time, no longer, and counts the records still held as lost."""
    metrics = EdgeMetrics()
    conn = _unreachable_broker()
    sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 50_000), metrics, close_timeout_s=1.0)
    sinks = Sinks([sink])
    n = _over_the_hold()
    holder = hold_write_lock(tmp_path / "outbox.db")
    try:
        for seq in range(n):
            assert sinks.write(_big(seq)) is False
        beyond = _dropped(metrics, "mqtt")
        assert beyond == sink.held.dropped > 0 and beyond + len(sink.held) == n, (beyond, len(sink.held), n)
        caplog.set_level(logging.ERROR)
        t0 = time.monotonic()
        sink.close()
        took = time.monotonic() - t0
    finally:
        let_go(holder)
        conn.stop()
    assert _dropped(metrics, "mqtt") == n and took < 1.0 + 3.0, (_dropped(metrics, "mqtt"), took)
    assert any("live records held in memory are lost at exit" in r.message for r in caplog.records)
    left = Outbox(tmp_path / "outbox.db", 50_000)
    try:
        assert len(left) == 0
    finally:
        left.close()


def test_the_mqtt_sinks_close_puts_held_records_in_for_its_close_time_and_counts_the_rest(tmp_path, caplog):
    """20,000 live records were held while another process locked the outbox; the lock is let
    go just before the stop. The close puts them in for its close time (0.05 s here), in order,
    and counts the rest as lost, where it used to put every one in first with no limit (16 MiB
    of them took 8.9 s, past what systemd's TimeoutStopSec leaves after the grace). What the
    outbox kept plus what was counted is every record, and the kept ones are the oldest.
    (A record a transaction: a fast machine put all of 10,000 in within 0.5 s and lost none,
    failing a CI run; 20,000 in 0.05 s would take 2.5 µs a record, several times what a commit
    takes.)"""
    metrics = EdgeMetrics()
    conn = _unreachable_broker()
    sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 50_000), metrics, close_timeout_s=0.05)
    sinks = Sinks([sink])
    n = 20_000
    held_behind_a_lock(sinks, tmp_path / "outbox.db", n)
    assert len(sink.held) == n and _dropped(metrics, "mqtt") == 0
    caplog.set_level(logging.ERROR)
    try:
        t0 = time.monotonic()
        sink.close()
        took = time.monotonic() - t0
    finally:
        conn.stop()
    lost = _dropped(metrics, "mqtt")
    left = Outbox(tmp_path / "outbox.db", 50_000)
    try:
        kept = [int(json.loads(data)["frame_seq"]) for _, data in left.peek(0, n)]
    finally:
        left.close()
    assert took < 0.05 + 2.0, took  # the rest: the publisher thread's stop, the outbox's close
    assert 0 < lost < n and len(kept) + lost == n, (len(kept), lost)
    assert kept == list(range(len(kept)))
    assert any("not put in within the sink's close time" in r.message for r in caplog.records)


def test_nothing_is_counted_when_the_held_records_go_in_at_the_close(tmp_path: Path):
    """The counter moves for losses only: records held while the outbox was locked, all put in
    at the close within its time, count nothing."""
    metrics = EdgeMetrics()
    conn = _unreachable_broker()
    sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 50_000), metrics)
    holder = hold_write_lock(tmp_path / "outbox.db")
    try:
        for seq in range(20):
            assert Sinks([sink]).write(frame_record("cam", seq)) is False
    finally:
        let_go(holder)
    try:
        sink.close()
    finally:
        conn.stop()
    assert _dropped(metrics, "mqtt") == 0
    left = Outbox(tmp_path / "outbox.db", 50_000)
    try:
        assert len(left) == 20
    finally:
        left.close()


def test_records_the_mqtt_outbox_drops_are_counted_once_though_two_threads_report_them(tmp_path: Path):
    """The broker is unreachable and the outbox is at its bound: each record written drops the
    oldest. The event loop (``write``) and the publisher thread, woken by each write, both
    report the outbox's drops; with threads switching often (a loaded device) both used to count
    the same drops (1,046 counted for 990 dropped). The counter is the outbox's count, exactly."""
    metrics = EdgeMetrics()
    conn = _unreachable_broker()
    sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 10), metrics)
    sinks = Sinks([sink])
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for seq in range(1000):
            assert sinks.write(frame_record("cam", seq))
    finally:
        sys.setswitchinterval(before)
        sink.close()
        conn.stop()
    assert sink.outbox.dropped == 990
    assert _dropped(metrics, "mqtt") == 990


def test_the_jsonl_sinks_close_leaves_a_gzip_it_has_no_time_for_to_the_next_start(tmp_path: Path, caplog):
    """A rotated file waits for its gzip (one left plain by the last run, as here, or one just
    rotated) when the daemon stops: the JSON Lines sink's close gives the gzip what is left of
    its close time and returns, the file staying plain for the next start, where it used to wait
    for the gzip up to 20 s more (seconds for a 64 MiB file on a Jetson's core), past the close
    time that docs/settings/edge.md and the stop's budget count. 32 MiB of poorly compressible
    lines (1.4 s of gzip here) and a close time of 0.1 s."""
    path = tmp_path / "out.jsonl"
    rotated = tmp_path / "out.jsonl.20261206T000000.000000Z"
    with open(rotated, "wb") as f:
        for _ in range(32):  # 1 MiB lines: few for the start's read of late keys, slow to gzip
            f.write(b"z" + os.urandom(512 * 1024).hex().encode() + b"\n")
    sink = JsonlSink(str(path), max_bytes=1 << 20, keep=4, compress=True, close_timeout_s=0.1)
    assert sink.compressor is not None
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    sink.close()
    took = time.monotonic() - t0
    plain_at_close = rotated.exists()
    sink.compressor.thread.join(120)  # (the process would end here; a test process goes on)
    assert plain_at_close and took < 0.1 + 1.0, (plain_at_close, took)
    assert not rotated.exists() and Path(f"{rotated}.gz").exists()  # gzip'd whole once it ran to its end
    assert any("stay plain; the next start gzips them" in r.message for r in caplog.records)
