"""How many records a second the MQTT sink carries over an uplink with a given round trip.

The sink keeps at most ``edge.sinks.sink_window`` messages in flight (15 of Mosquitto's
default Receive Maximum of 20, 64 of the chart's broker's 100; the rest left to escalations).
At QoS 2 a message holds its slot for two round trips (PUBLISH/PUBREC, PUBREL/PUBCOMP; MQTT 5.0
section 4.3.3), at QoS 1 for one, so over a link of round trip ``r`` the sink carries about
``window / (2 r)`` records a second at QoS 2 and ``window / r`` at QoS 1; a device that makes more (one record per frame: four
cameras at 15 fps make 60 a second) fills its outbox until the link is faster again.

Here: a real Mosquitto (``max_inflight_messages`` as asked, ``set_tcp_nodelay true`` as the
chart's broker; ``max_qos 1`` for the QoS 1 rows), a TCP proxy between it and the sink that
delays each direction by half the round trip (asyncio's sockets have Nagle's algorithm off, as
the edge's), the real sink and outbox, ``--records`` records written at once; the time until
the outbox is empty gives the rate. The proxy ends TCP on each side, so TCP's own behaviour
over a long link (its acknowledgements, windows, losses) is not what is measured: the rows
show the bound the in-flight slots set.

    python bench/mqtt_sink.py                       # round trips 0, 100 and 300 ms, about 1 min
    python bench/mqtt_sink.py --rtt-ms 600 --records 200
    python bench/mqtt_sink.py --rtt-ms 100 --nagle   # beside rows with Nagle's algorithm on
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

import paho.mqtt.client as paho  # noqa: E402  (for the rows with Nagle's algorithm on)

from edge.outbox import Outbox  # noqa: E402  (after the sys.path line above)
from edge.records import FrameRecord  # noqa: E402
from edge.sinks import SINK_WINDOW, MqttSink, sink_window  # noqa: E402
from edge.transports.mqtt import SESSION_EXPIRY_S, MqttConnection  # noqa: E402
from edgewise.mqtt_client import Client  # noqa: E402

NODELAY_SOCKET = Client._create_socket_connection

TOPIC = "edgewise/cam/detections"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DelayProxy:
    """127.0.0.1:``port`` -> the broker, each direction delayed by ``delay_s`` (order kept)."""

    def __init__(self, broker_port: int, delay_s: float) -> None:
        self.broker_port, self.delay_s = broker_port, delay_s
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.port))
        started.set()
        self.loop.run_forever()
        server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[Tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        while True:
            data = await reader.read(65536)
            queue.put_nowait((time.monotonic() + self.delay_s, data))
            if not data:
                break
        await sender

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.broker_port)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                                 return_exceptions=True)
        except asyncio.CancelledError:
            # close() with bytes still delayed (a round trip added): end, not cancelled, as
            # Python 3.11's start_server printed a traceback for each cancelled connection
            # (its callback asks a cancelled task for its exception)
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self.loop)
        self.thread.join(5)


def mosquitto(folder: Path, max_qos: int, inflight: int, nodelay: bool = True) -> Tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_inflight_messages {inflight}\n"
                    + ("set_tcp_nodelay true\n" if nodelay else "") + (f"max_qos {max_qos}\n" if max_qos < 2 else ""))
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"mosquitto ({binary}) did not start")


def record(seq: int) -> FrameRecord:
    box = {"xyxy": [10.0, 20.0, 110.0, 220.0], "score": 0.8, "cls": 0, "name": "person"}
    return FrameRecord(device="dev", stream="cam", frame_seq=seq, capture_unix_ns=0, emit_unix_ns=0, width=1280,
                       height=720, detections=[box] * 5, escalated=False, reason="", hardness=0.1, outcome="edge")


def one(rtt_ms: float, max_qos: int, records: int, inflight: int, nodelay: bool = True) -> Tuple[float, int, int]:
    """(records per second through the sink, record bytes, the sink's window) over a link of
    ``rtt_ms`` to a broker whose Receive Maximum is ``inflight``."""
    with tempfile.TemporaryDirectory(prefix="edgewise-bench-") as tmp:
        proc, port = mosquitto(Path(tmp), max_qos, inflight, nodelay)
        if not nodelay:  # the edge's socket as paho makes it: Nagle's algorithm on
            Client._create_socket_connection = paho.Client._create_socket_connection  # type: ignore[method-assign]
        proxy = DelayProxy(port, rtt_ms / 2000.0)
        conn = MqttConnection("127.0.0.1", proxy.port, client_id=f"bench-{os.getpid()}",
                              session_expiry_s=SESSION_EXPIRY_S)
        outbox = Outbox(Path(tmp) / "outbox.db", records + 10)
        sink = MqttSink(conn, TOPIC, outbox)
        try:
            conn.start()
            if not conn.connected.wait(10):
                raise SystemExit("the sink did not connect")
            time.sleep(0.3 + rtt_ms / 1000.0)  # the connection settled (CONNACK, the subscriptions)
            data = [(r, r.to_json()) for r in (record(i) for i in range(records))]
            start = time.monotonic()
            for r, d in data:
                sink.write(r, d)
            while len(outbox):
                if time.monotonic() - start > 600:
                    raise SystemExit(f"rtt {rtt_ms} ms: the outbox did not empty in 10 minutes")
                time.sleep(0.01)
            return (records / (time.monotonic() - start), len(data[0][1]),
                    sink_window(conn.in_flight_bound, SINK_WINDOW))
        finally:
            Client._create_socket_connection = NODELAY_SOCKET  # type: ignore[method-assign]
            sink.close()
            proxy.close()
            proc.terminate()
            proc.wait(10)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", default="0,100,300", help="round trips to add, ms, comma-separated")
    ap.add_argument("--records", type=int, default=300, help="records written per cell")
    ap.add_argument("--nagle", action="store_true",
                    help="also rows with Nagle's algorithm on (paho's socket as it makes it, the broker without "
                         "set_tcp_nodelay): what TCP_NODELAY is worth")
    ap.add_argument("--inflight", default="20,100",
                    help="the broker's max_inflight_messages (its Receive Maximum), comma-separated: 20 is "
                         "Mosquitto's default, 100 the chart's broker")
    args = ap.parse_args(argv)
    rows = []
    size = 0
    for inflight in (int(x) for x in args.inflight.split(",")):
        for rtt in (float(x) for x in args.rtt_ms.split(",")):
            for qos in (2, 1):
                for nodelay in (True, False) if args.nagle else (True,):
                    rate, size, window = one(rtt, qos, args.records, inflight, nodelay)
                    bound = f"{window / (qos * rtt / 1000.0):.1f}" if rtt else "-"
                    rows.append(f"| {inflight} | {window} | {rtt:g} | {qos} | {'off' if nodelay else 'on'} | "
                                f"{rate:.1f} | {bound} | {rate * size / 1024:.0f} |")
                    print(f"  receive maximum {inflight}, rtt {rtt:g} ms, QoS {qos}, Nagle {'off' if nodelay else 'on'}: "
                          f"{rate:.1f} records/s", file=sys.stderr)
    print(f"MQTT sink over a delayed link: {args.records} records of {size} bytes each per cell, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| broker Receive Maximum | sink window | added round trip ms | QoS | Nagle | records/s "
          "| window / (QoS x round trip) | KiB/s |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
