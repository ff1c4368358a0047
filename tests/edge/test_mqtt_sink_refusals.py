"""The MQTT detections sink when a real Mosquitto refuses its records.

Only a PUBACK with a reason code below 0x80 is a delivery: a record the broker's ACL
refuses stays in the outbox (logged, counted with its topic and reason) and reaches
the topic once the ACL lets it; a record over the broker's maximum packet size stays
in the outbox too, and neither stalls the records behind it nor the connection."""

from __future__ import annotations

import logging
import threading
import uuid

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge.metrics import EdgeMetrics
from edge.outbox import Outbox
from edge.sinks import MqttSink, Sinks
from edge.transports.mqtt import SESSION_EXPIRY_S, MqttConnection
from tests.conftest import configured_mosquitto
from tests.edge.helpers import frame_record
from tests.edge.transports.test_mqtt_refusals import refused_count, reload, warnings_with
from tests.waiting import wait_until

TOPIC = "edgewise/cam-1/detections"
USERS = {"cam-1": "pw", "reader": "pw"}
READER_ACL = "user reader\ntopic read edgewise/+/detections\n\n"


class Reader:
    """A subscriber to the detections topic, logged in as ``reader``."""

    def __init__(self, broker, username: str = "", password: str = "") -> None:
        self.got: list[bytes] = []
        self.ready = threading.Event()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"reader-{uuid.uuid4().hex[:6]}",
                             protocol=mqtt.MQTTv5)
        if username:
            self.c.username_pw_set(username, password)
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(TOPIC, qos=1)
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.ready.set()
        self.c.on_message = lambda c, u, m: self.got.append(bytes(m.payload))
        self.c.connect(broker.host, broker.port)
        self.c.loop_start()
        assert self.ready.wait(10)

    def seqs(self) -> list[int]:
        import json
        return [json.loads(p)["frame_seq"] for p in self.got]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.mark.parametrize("session_expiry_s", [SESSION_EXPIRY_S, 0], ids=["qos2", "qos1"])
def test_records_the_acl_refuses_stay_in_the_outbox_and_go_out_once_it_allows_them(tmp_path, caplog,
                                                                                    session_expiry_s):
    """At QoS 2 (the daemon's sink) the refusal comes in the PUBREC, which ends the exchange:
    no PUBREL after it, and no packet identifier kept for a restart to complete."""
    caplog.set_level(logging.INFO, logger="edge.transports.mqtt")
    denied = READER_ACL + "pattern write edgewise/%u/escalate\n"
    with configured_mosquitto(users=USERS, acl=denied) as broker:
        reader = Reader(broker, "reader", "pw")
        metrics = EdgeMetrics()
        conn = MqttConnection(broker.host, broker.port, client_id="cam-1-sink", username="cam-1", password="pw",
                              session_expiry_s=session_expiry_s)
        conn.start()
        wait_until(conn.connected.is_set, 10, "the sink's connection")
        sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 100), metrics, retry_refused_s=0.5)
        try:
            for seq in range(3):
                Sinks([sink]).write(frame_record("cam", seq, device="cam-1"))
            wait_until(lambda: refused_count(metrics, TOPIC, "not_authorized") >= 3, 10, "3 refusals")
            assert len(sink.outbox) == 3  # nothing deleted: a refusal is not a delivery
            assert metrics.sink_backlog.labels("mqtt")._value.get() == 3
            refusal = warnings_with(caplog, f"broker refused publish to {TOPIC}: Not authorized")[0]
            assert "check the broker's ACL" in refusal and "stays in the MQTT outbox" in refusal
            wait_until(lambda: refused_count(metrics, TOPIC, "not_authorized") >= 4, 10, "a retry, refused")
            assert len(sink.outbox) == 3 and reader.got == []
            # refused: no exchange left to complete (between retries: one every 0.5 s may be on its way)
            wait_until(lambda: sink.outbox.in_flight() == [], 5, "no exchange left after the refusals")
            (broker.conf.parent / "acl").write_text(denied + "pattern write edgewise/%u/detections\n")
            reload(broker)
            wait_until(lambda: len(sink.outbox) == 0, 20, "the kept records delivered once the ACL allows them")
            wait_until(lambda: len(reader.got) == 3, 10, "the 3 records on the topic")
            assert sorted(reader.seqs()) == [0, 1, 2]  # each once (the probe that found the ACL fixed first)
            Sinks([sink]).write(frame_record("cam", 3, device="cam-1"))
            wait_until(lambda: len(reader.got) == 4 and reader.seqs()[3] == 3, 10, "a new record straight through")
        finally:
            sink.close()
            conn.stop()
            reader.close()


def test_a_record_over_the_brokers_packet_size_is_kept_and_stalls_nothing(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="edge.transports.mqtt")
    with configured_mosquitto("max_packet_size 2000") as broker:
        reader = Reader(broker)
        metrics = EdgeMetrics()
        conn = MqttConnection(broker.host, broker.port, client_id="cam-1-big")
        conn.start()
        wait_until(conn.connected.is_set, 10, "the sink's connection")
        sink = MqttSink(conn, TOPIC, Outbox(tmp_path / "outbox.db", 100), metrics, retry_refused_s=0.5)
        try:
            big = frame_record("cam", 1, device="cam-1")
            big.detections = [{"box": [1.0, 2.0, 3.0, 4.0], "score": 0.5, "class_id": 0, "label": "x" * 40}] * 40
            records = [frame_record("cam", 0, device="cam-1"), big, frame_record("cam", 2, device="cam-1")]
            for rec in records:
                Sinks([sink]).write(rec)
            wait_until(lambda: reader.seqs() == [0, 2], 10, "the records around the big one")
            wait_until(lambda: refused_count(metrics, TOPIC, "packet_too_large") >= 2, 10, "the big one retried")
            assert len(sink.outbox) == 1 and conn.connected.is_set()
            assert not warnings_with(caplog, "disconnected")
            assert "over the Maximum Packet Size of 2000 bytes" in warnings_with(caplog, TOPIC)[0]
            Sinks([sink]).write(frame_record("cam", 3, device="cam-1"))
            wait_until(lambda: reader.seqs() == [0, 2, 3], 10, "a new record straight through")
        finally:
            sink.close()
            conn.stop()
            reader.close()
        assert reader.seqs() == [0, 2, 3]
