"""The fault suite: real processes, real signals, and every escalated frame counted.

Each case runs ``edgewise edge run`` against the shared real cloud (gateway and
workers as processes, the gateway's MQTT bridge on a real Mosquitto), breaks
something for real (``kill -9`` of the gateway, a worker or the edge itself, a
broker restart, a full spool disk, files that are not a policy), lets it recover,
stops the edge cleanly and counts what every sink got (``harness.account``):
nothing lost, nothing duplicated, in the JSON Lines file and on the MQTT topic.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional

import pytest

from tests.conftest import TopicRecorder
from tests.faults.harness import DEVICE, ROOT, Row, Sinks, account, cut_at_kill, edge_settings, key
from tests.processes import EdgeProcess
from tests.waiting import wait_until

TOPIC = f"edgewise/{DEVICE}/detections"


class Case:
    """One case's edge, sinks and the bookkeeping shared by all cases."""

    def __init__(self, tmp: Path, cloud: Any, broker: Any, transport: str = "grpc", mqtt_sink: bool = False,
                 spool_dir: Optional[Path] = None, hard_size: str = "160x120",
                 jsonl_dir: Optional[Path] = None) -> None:
        c: dict = {"endpoints": [cloud.address]}
        if transport == "mqtt" or mqtt_sink:
            c["mqtt"] = {"host": broker.host, "port": broker.port}
        self.recorder = TopicRecorder(broker, TOPIC, client_id=f"rec-{tmp.name}") if mqtt_sink else None
        self.config = edge_settings(tmp, c, transport=transport, mqtt_sink=mqtt_sink, spool_dir=spool_dir,
                                    hard_size=hard_size, jsonl_dir=jsonl_dir)
        self.spool = (spool_dir or tmp) / "spool.db"
        self.sinks = Sinks((jsonl_dir or tmp) / "out.jsonl", self.recorder)
        self.edge = EdgeProcess(self.config, tmp / "edge.log")

    def wait(self, what: str, pred: Any, timeout: float = 60.0) -> None:
        wait_until(lambda: self.edge.check() and pred(), timeout, what)

    def answered(self) -> int:
        return len(self.sinks.outcome("cloud"))

    def kill9_edge(self) -> None:
        self.edge.kill9(self.sinks.running_epoch())

    def finish(self, fault: str, table: List[Row]) -> Row:
        """Stop the edge cleanly, let the MQTT topic settle, count, and check the log."""
        assert self.edge.stop() == 0
        if self.recorder is not None:
            records = self.sinks.records()
            # (the record a kill -9 caught between the file and the outbox may be in the file only)
            want = {(key(r), bool(r.get("late"))) for r in records} - cut_at_kill(records, self.edge.killed_epochs)
            try:
                wait_until(lambda: want <= {(key(r), bool(r.get("late"))) for r in self.recorder.json()}, 30,
                           "every record on the MQTT topic")
            except AssertionError:
                got = {(key(r), bool(r.get("late"))) for r in self.recorder.json()}
                raise AssertionError(f"missing on the topic: {sorted(want - got)}; got {len(got)}") from None
            self.recorder.stop()
            with open(self.sinks.jsonl.with_name("topic.jsonl"), "wb") as f:  # what the topic got, to read
                f.writelines(payload + b"\n" for _, payload in self.recorder.messages)
        row = account(fault, self.sinks, self.spool, sorted(self.edge.killed_epochs))
        table.append(row)
        assert "Traceback" not in self.edge.log.read_text(), self.edge.log
        return row

    def close(self) -> None:
        self.edge.close()
        if self.recorder is not None:
            self.recorder.stop()


def check(row: Row) -> None:
    assert (row.lost, row.duplicated) == (0, 0), row
    assert row.escalated > 0 and row.frames > row.escalated, row


def test_gateway_kill9_mid_stream(tmp_path, fault_cloud, fault_broker, fault_table):
    case = Case(tmp_path, fault_cloud, fault_broker)
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 3)
        fault_cloud.kill_gateway(signal.SIGKILL)
        case.wait("escalations spooled while the gateway is gone", lambda: len(case.sinks.spooled_keys()) >= 3)
        fault_cloud.restart_gateway()
        n = case.answered()
        case.wait("answers again", lambda: case.answered() >= n + 3)
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("gateway kill -9 mid-stream", fault_table)
    finally:
        case.close()
    check(row)
    assert row.late >= 3


def test_worker_kill9(tmp_path, fault_cloud, fault_broker, fault_table):
    case = Case(tmp_path, fault_cloud, fault_broker)
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 3)
        fault_cloud.kill_worker(0, signal.SIGKILL)
        n = case.answered()
        case.wait("answers from the other worker", lambda: case.answered() >= n + 5)
        fault_cloud.restart_worker(0)
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("worker kill -9", fault_table)
    finally:
        case.close()
    check(row)


def test_broker_restart_with_the_mqtt_transport(tmp_path, fault_cloud, fault_broker, fault_table):
    case = Case(tmp_path, fault_cloud, fault_broker, transport="mqtt", mqtt_sink=True)
    try:
        case.wait("answers over MQTT", lambda: case.answered() >= 3)
        fault_broker.stop()
        case.wait("escalations spooled while the broker is down", lambda: len(case.sinks.spooled_keys()) >= 3)
        fault_broker.start()
        n = case.answered()
        case.wait("answers over MQTT again", lambda: case.answered() >= n + 3)
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("broker restart (MQTT transport and sink)", fault_table)
    finally:
        case.close()
    check(row)
    assert row.late >= 3


@pytest.mark.faults_slow
def test_cloud_outage_with_edge_kill9_and_restart(tmp_path, fault_cloud, fault_broker, fault_table):
    case = Case(tmp_path, fault_cloud, fault_broker, mqtt_sink=True)
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 3)
        fault_cloud.kill_gateway(signal.SIGKILL)
        case.wait("escalations spooled", lambda: len(case.sinks.spooled_keys()) >= 4)
        case.kill9_edge()
        first = case.sinks.spooled_keys()
        case.edge.start()  # the cloud is still down: the replay fails, new escalations spool
        case.wait("the second run spooling", lambda: len(case.sinks.spooled_keys()) >= len(first) + 3)
        fault_cloud.restart_gateway()
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("cloud outage, edge kill -9 and restart", fault_table)
    finally:
        case.close()
    check(row)
    assert first <= case.sinks.late_keys()


@pytest.mark.faults_slow
def test_edge_kill9_during_replay_mqtt_sink_publishes_late_records_once(tmp_path, fault_cloud, fault_broker,
                                                                        fault_table):
    """Issue 15.3: the edge killed while it replays its spool; restarted, it replays again.
    The JSON Lines file and the MQTT topic each get every late record exactly once."""
    case = Case(tmp_path, fault_cloud, fault_broker, mqtt_sink=True)
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 2)
        fault_cloud.kill_gateway(signal.SIGKILL)
        case.wait("a backlog in the spool", lambda: len(case.sinks.spooled_keys()) >= 30, 90)
        fault_cloud.restart_gateway()
        spooled = len(case.sinks.spooled_keys())
        wait_until(lambda: case.edge.check() and len(case.sinks.late_keys()) >= 4, 60, "the replay under way",
                   interval=0.005)
        case.kill9_edge()
        assert len(case.sinks.late_keys()) < spooled, "the replay finished before the kill"
        case.edge.start()
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("edge kill -9 during replay (MQTT sink)", fault_table)
    finally:
        case.close()
    check(row)
    assert row.late >= 30


@pytest.mark.faults_slow
def test_spool_disk_full(tmp_path, fault_cloud, fault_broker, fault_table, small_fs):
    """Issue 15.1: the spool on a real 2 MiB tmpfs, the cloud down until the disk is full
    (640x480 frames, ~40 KB each, fill it in a few seconds)."""
    fs = small_fs(2 << 20)
    case = Case(tmp_path, fault_cloud, fault_broker, spool_dir=fs.path, hard_size="640x480")
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 2)
        fault_cloud.kill_gateway(signal.SIGKILL)
        case.wait("escalations refused by the full spool",
                  lambda: sum("not spooled" in (r.get("error") or "") for r in case.sinks.outcome("edge_only")) >= 3,
                  90)
        fault_cloud.restart_gateway()
        case.sinks.wait_all_spooled_late(case.edge)
        n = len(case.sinks.spooled_keys())
        fault_cloud.kill_gateway(signal.SIGKILL)  # space came back: the next outage spools again
        case.wait("spooling again", lambda: len(case.sinks.spooled_keys()) >= n + 2)
        fault_cloud.restart_gateway()
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("spool disk full", fault_table)
    finally:
        case.close()
    check(row)
    assert row.edge_only >= 3 and row.late >= 5


@pytest.mark.faults_slow
def test_a_full_disk_shared_by_the_sink_and_the_spool_loses_no_answer(tmp_path, fault_cloud, fault_broker,
                                                                      fault_table, small_fs):
    """The default layout (the JSON Lines file next to the spool) on a real tmpfs that
    another process fills while escalations are spooled: the cloud's answers to them come
    back while the sink cannot write, so they must stay spooled, not be acknowledged and
    lost; once space returns every spooled escalation has its late record, once. (Records
    of live frames that came while the disk was full cannot be written anywhere: those
    frames are counted, not asserted on.)"""
    fs = small_fs(4 << 20)
    case = Case(tmp_path, fault_cloud, fault_broker, spool_dir=fs.path, jsonl_dir=fs.path)
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 2)
        fault_cloud.kill_gateway(signal.SIGKILL)
        case.wait("escalations spooled", lambda: len(case.sinks.spooled_keys()) >= 5)
        filler = fs.fill()  # another process fills the disk
        spooled = case.sinks.spooled_keys()
        fault_cloud.restart_gateway()
        case.wait("replayed answers kept spooled while the sink cannot write",
                  lambda: "could not be written to every durable sink" in case.edge.log.read_text(), 90)
        filler.unlink()
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("sink and spool disk full", fault_table)
    finally:
        case.close()
    assert spooled <= case.sinks.late_keys(), sorted(spooled - case.sinks.late_keys())
    assert row.duplicated == 0 and row.pending == 0, row
    assert "duplicate replay ignored" not in case.edge.log.read_text()


def test_policy_hot_reload_survives_files_that_are_not_a_policy(tmp_path, fault_cloud, fault_broker,
                                                               fault_table):
    """Issue 15.2 with the real process and real SIGHUPs: a 5000-digit number, 20,000
    nesting levels and binary garbage are refused with one log line each; a valid file
    after them is put in force."""
    case = Case(tmp_path, fault_cloud, fault_broker)
    policy = tmp_path / "policy.yaml"
    good = policy.read_text()
    try:
        case.wait("answers from the cloud", lambda: case.answered() >= 2)
        head = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: x}\nspec:\n  threshold: "
        for n, bad in enumerate((head + "9" * 5000, head + "[" * 20000 + "]" * 20000, "\xff\xfe\x00junk"), 1):
            policy.write_bytes(bad.encode("latin-1"))
            case.edge.proc.send_signal(signal.SIGHUP)
            case.wait(f"refusal {n} in the log", lambda: case.edge.log.read_text().count("reload refused") >= n)
        policy.write_text(good.replace("name: faults", "name: faults-v2"))
        case.edge.proc.send_signal(signal.SIGHUP)
        case.wait("the valid policy in force", lambda: any(r["policy"] == "faults-v2" for r in case.sinks.records()))
        case.sinks.wait_all_spooled_late(case.edge)
        row = case.finish("policy hot reload of non-policy files", fault_table)
    finally:
        case.close()
    check(row)


def test_corrupt_spool_file_is_one_line_then_moved_aside_the_edge_runs(tmp_path, tiny_model):
    """Issue 15.4: a corrupt spool stops ``edgewise edge run`` with one line naming it
    (exit 2); moved aside as the line says, the daemon starts with a new spool."""
    config = edge_settings(tmp_path, {"endpoints": ["127.0.0.1:1"]})
    spool = tmp_path / "spool.db"
    spool.write_bytes(os.urandom(16384))
    cmd = [sys.executable, "-m", "edgewise.cli", "edge", "run", "--config", str(config)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"edgewise: error: spool {spool} is not a readable spool")
    spool.rename(tmp_path / "spool.db.bad")
    edge = EdgeProcess(config, tmp_path / "edge.log")
    try:
        sinks = Sinks(tmp_path / "out.jsonl")
        wait_until(lambda: edge.check() and len(sinks.records()) >= 4, 60, "records from the restarted edge")
        assert edge.stop() == 0
    finally:
        edge.close()


@pytest.fixture(autouse=True)
def _mosquitto_is_up(fault_broker):
    """A case that stopped the broker and failed midway must not break the next one."""
    yield
    if fault_broker.proc.poll() is not None:
        fault_broker.start()
