"""The MQTT sink as a process of its own, to be killed with SIGKILL by
``tests/edge/test_mqtt_sink_restart.py``: an outbox, the connection with the client id and
session the daemon gives it (``edge.daemon``; a damaged outbox salvaged as there), the sink made before the connection starts
(it resumes what the last process left in flight), and ``count`` records written.

    python -m tests.edge.mqtt_sink_process HOST PORT OUTBOX TOPIC COUNT
"""

from __future__ import annotations

import sys
import time

from edge.outbox import this_host
from edge.outbox_salvage import open_outbox
from edge.sinks import MqttSink, Sinks
from edge.transports.mqtt import SESSION_EXPIRY_S, MqttConnection
from tests.edge.helpers import frame_record


def main(host: str, port: str, outbox_path: str, topic: str, count: str) -> None:
    outbox = open_outbox(outbox_path, 1000)  # as the daemon opens it
    client_id = outbox.client_id("cam-", lambda: MqttConnection.unique_client_id("cam"), this_host())
    conn = MqttConnection(host, int(port), client_id=client_id, session_expiry_s=SESSION_EXPIRY_S)
    sinks = Sinks([MqttSink(conn, topic, outbox)])
    conn.start()
    for seq in range(int(count)):
        sinks.write(frame_record("cam", seq))
    print("written", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:])
