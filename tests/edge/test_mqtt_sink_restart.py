"""The MQTT sink killed with records in flight delivers each once after the restart.

A real Mosquitto, the sink in a real process (``tests.edge.mqtt_sink_process``) killed with
SIGKILL, and between them a proxy that holds back one kind of the broker's answers, so the
kill lands at a chosen step of MQTT's QoS 2 exchange:

* PUBREC held: the broker has the records, not yet released to subscribers; the restarted
  sink sends each PUBLISH again with its packet identifier and the broker delivers it once;
* PUBCOMP held: the broker has delivered the records; the restarted sink sends their PUBREL
  only, and they are not published again (a QoS 1 sink, as before, published them twice).

Each also with the broker restarted meanwhile (Mosquitto without persistence forgets the
session): the PUBLISH goes out anew (the broker had never released it), the PUBREL gets
"Packet identifier not found" and counts as delivered (it had been).
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from typing import List, Set

import pytest

from tests.conftest import TopicRecorder
from tests.processes import ROOT
from tests.waiting import wait_until

TOPIC = "edgewise/cam/detections"
PUBREC, PUBCOMP = 5, 7  # MQTT packet types
RECORDS = 6


class HoldingProxy:
    """TCP proxy client <-> broker that drops the broker's packets of the types in ``hold``
    (counted in ``held``); everything else passes unchanged."""

    def __init__(self, broker_port: int, hold: Set[int]) -> None:
        self.broker_port = broker_port
        self.hold = hold
        self.held = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: List[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.broker_port))
            self.socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._packets, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            s.close()

    def _packets(self, src: socket.socket, dst: socket.socket) -> None:
        f = src.makefile("rb")
        try:
            while True:
                head = f.read(1)
                if not head:
                    break
                length, shift, raw = 0, 0, b""
                while True:  # the remaining length: a variable byte integer
                    b = f.read(1)
                    raw += b
                    length |= (b[0] & 0x7F) << shift
                    shift += 7
                    if not b[0] & 0x80:
                        break
                body = f.read(length)
                if head[0] >> 4 in self.hold:
                    self.held += 1
                    continue
                dst.sendall(head + raw + body)
        except (OSError, IndexError):
            pass
        for s in (src, dst):
            s.close()

    def close(self) -> None:
        self.listener.close()
        for s in self.socks:
            s.close()


def start_sink(port: int, outbox: str, count: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "tests.edge.mqtt_sink_process", "127.0.0.1", str(port),
                             outbox, TOPIC, str(count)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def in_flight(outbox: str) -> List[tuple]:
    with sqlite3.connect(outbox) as db:
        return db.execute("SELECT mid, received FROM records ORDER BY id").fetchall()


@pytest.mark.parametrize("broker_restart", [False, True], ids=["session-kept", "broker-restarted"])
@pytest.mark.parametrize("hold", [PUBREC, PUBCOMP], ids=["kill-before-pubrec", "kill-before-pubcomp"])
def test_records_in_flight_at_a_kill_reach_the_topic_once(tmp_path, mosquitto, hold, broker_restart):
    recorder = TopicRecorder(mosquitto, TOPIC)
    proxy = HoldingProxy(mosquitto.port, {hold})
    outbox = str(tmp_path / "mqtt-outbox.db")
    sink = start_sink(proxy.port, outbox, RECORDS)
    try:
        released = RECORDS if hold == PUBCOMP else 0  # what the broker delivered before the kill
        wait_until(lambda: sink.poll() is None and proxy.held >= RECORDS and len(recorder.messages) >= released,
                   30, f"{RECORDS} answers held")
        sink.send_signal(signal.SIGKILL)
        sink.wait(10)
        rows = in_flight(outbox)
        assert len(rows) == RECORDS and all(mid for mid, _ in rows), rows
        assert {received for _, received in rows} == {int(hold == PUBCOMP)}, rows
        assert len(recorder.messages) == released
        if broker_restart:
            recorder.subscribed.clear()
            mosquitto.stop()
            mosquitto.start()
            wait_until(recorder.subscribed.is_set, 30, "the recorder back on the broker")
        proxy.hold = set()
        sink = start_sink(proxy.port, outbox, 0)
        wait_until(lambda: sink.poll() is None and not in_flight(outbox), 30, "the outbox emptied")
        if hold == PUBREC:
            wait_until(lambda: len(recorder.messages) >= RECORDS, 30, "the records on the topic")
    finally:
        sink.kill()
        sink.wait(10)
        proxy.close()
        recorder.stop()
    seqs = Counter(r["frame_seq"] for r in recorder.json())
    assert seqs == Counter(range(RECORDS)), seqs
