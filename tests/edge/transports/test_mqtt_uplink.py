"""The MQTT transport over an uplink slower than the escalations, and over a broker that hangs:
a real Mosquitto, the real ``MqttTransport``, and between them ``ThrottleProxy``, a TCP proxy
that passes the edge's bytes to the broker at a fixed rate (a token bucket) and the broker's
back at once. A responder subscribed to the request topic answers each request at once (the
cloud's time is not what is measured here: the uplink is).

``run_uplink`` is also the measurement: ``python -m tests.edge.transports.test_mqtt_uplink``
prints what a 1 MB/s uplink made of 30 s of 490 kB escalations (1080p frames), 4 a second with
the low-bandwidth example policy's 2 s deadline: answered in time, refused, timed out, the
requests that still reached the cloud after their deadline, and the peak bytes paho held."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Tuple

from edge.transports import TransportError
from edge.transports.mqtt import MqttConnection, MqttTransport
from edgewise import status
from edgewise.v1 import detect_pb2
from tests.conftest import Broker, configured_mosquitto, free_port
from tests.waiting import async_wait_until


class ThrottleProxy:
    """127.0.0.1:``port`` -> ``upstream_port``: the client's bytes go on at ``rate`` bytes a second
    (a token bucket of ``burst`` bytes), the upstream's come back at once. Its sockets keep small
    receive buffers, so what the link has not carried yet waits in the client's own socket, as
    behind a slow modem, not in this proxy. Runs its own event loop in a thread."""

    def __init__(self, upstream_port: int, rate: float, burst: int = 16384, delay_s: float = 0.0) -> None:
        self.upstream_port, self.rate, self.burst, self.delay_s = upstream_port, float(rate), burst, delay_s
        self.port = free_port()
        self.carried = 0  # bytes passed upstream
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        if not started.wait(10):
            raise RuntimeError("the throttling proxy did not start")

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(
            self._client, "127.0.0.1", self.port, limit=self.burst))
        started.set()
        try:
            self.loop.run_forever()
        finally:
            server.close()
            self.loop.run_until_complete(server.wait_closed())
            self.loop.close()

    async def _throttled(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tokens, last = float(self.burst), time.monotonic()
        while True:
            data = await reader.read(self.burst)
            if not data:
                break
            now = time.monotonic()
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            last = now
            if tokens < len(data):
                await asyncio.sleep((len(data) - tokens) / self.rate)
                now = time.monotonic()
                tokens += (now - last) * self.rate
                last = now
            tokens -= len(data)
            writer.write(data)
            await writer.drain()
            self.carried += len(data)
        writer.close()

    async def _plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The way back, each chunk ``delay_s`` late (order kept): the link's round trip."""
        queue: asyncio.Queue[Tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
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
        writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except BaseException:
            writer.close()
            raise
        try:
            await asyncio.gather(self._throttled(reader, up_writer), self._plain(up_reader, writer),
                                 return_exceptions=True)
        except asyncio.CancelledError:
            pass  # close(): ends as a finished task (3.11's streams log a cancelled one as an error)
        finally:
            # also when close() cancels this: an unclosed transport is a ResourceWarning when
            # the garbage collector meets it, which fails whichever later test it lands in
            writer.close()
            up_writer.close()

    def close(self) -> None:
        async def stop() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0)  # the closed transports' connection_lost callbacks run
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self.loop)
        self.thread.join(5)


class Responder:
    """Answers every request on ``topic`` at once, on its response topic with its correlation
    data (an OK ``DetectResponse`` of its frame), and notes when each arrived."""

    def __init__(self, broker: Broker, topic: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.arrived: Dict[int, float] = {}  # frame_seq -> time.monotonic() the request reached the cloud
        subscribed = threading.Event()
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="responder",
                                  protocol=mqtt.MQTTv5)
        self.client.on_subscribe = lambda c, u, mid, rcs, p: subscribed.set()
        self.client.on_message = self._answer
        self.client.connect(broker.host, broker.port)
        self.client.subscribe(topic, qos=1)
        self.client.loop_start()
        if not subscribed.wait(10):
            raise RuntimeError(f"the responder could not subscribe to {topic}")

    def _answer(self, client: Any, userdata: Any, msg: Any) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        req = detect_pb2.DetectRequest()
        req.ParseFromString(msg.payload)
        self.arrived[req.frame_seq] = time.monotonic()
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = msg.properties.CorrelationData
        resp = detect_pb2.DetectResponse(status=detect_pb2.OK, frame_seq=req.frame_seq, device_id=req.device_id,
                                         stream_id=req.stream_id)
        client.publish(msg.properties.ResponseTopic, resp.SerializeToString(), qos=1, properties=props)

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def frame_request(seq: int, size: int) -> detect_pb2.DetectRequest:
    req = detect_pb2.DetectRequest(device_id="d", stream_id="s", frame_seq=seq)
    req.image.encoding = detect_pb2.Image.JPEG
    req.image.data = os.urandom(int(size))
    return req


def held_bytes(conn: MqttConnection) -> int:
    """What paho holds of the messages not yet acknowledged: their payloads, and the packets it
    has yet to write (a second copy of each)."""
    client = conn.client
    with client._out_message_mutex:
        payloads = sum(len(m.payload) for m in client._out_messages.values())
    unwritten = sum(p["to_process"] for p in list(client._out_packet))
    return payloads + unwritten


async def _escalate(t: MqttTransport, seq: int, size: int, deadline_s: float,
                    outcomes: List[Tuple[int, str, float, str]]) -> None:
    t0 = time.monotonic()
    try:
        await t.detect(frame_request(seq, size), deadline_s)
        outcomes.append((seq, "ok", time.monotonic() - t0, ""))
    except TransportError as exc:
        outcomes.append((seq, status.name(exc.status), time.monotonic() - t0, exc.message))


def run_uplink(rate: float = 1_000_000, size: int = 490_000, per_s: float = 4.0, seconds: float = 30.0,
               deadline_s: float = 2.0, settle_s: float = 15.0, rtt_s: float = 0.0, burst: int = 1,
               burst_every: int = 0) -> Dict[str, Any]:
    """Escalate ``per_s`` requests of ``size`` bytes a second for ``seconds`` over an uplink of
    ``rate`` bytes a second and a round trip of ``rtt_s``, each with ``deadline_s`` (with
    ``burst_every``, every that many-th is ``burst`` requests at once, as cameras escalating
    together); then wait up to ``settle_s`` for what the link still carries. Returns the counts
    and the peak bytes paho held."""
    with configured_mosquitto("max_inflight_messages 100\nset_tcp_nodelay true") as broker:
        proxy = ThrottleProxy(broker.port, rate, delay_s=rtt_s)
        responder = Responder(broker, "edgewise/d/escalate")
        conn = MqttConnection(broker.host, proxy.port, client_id="edge-uplink")
        conn.start()
        t = MqttTransport(conn, "d")
        peak = [0]
        outcomes: List[Tuple[int, str, float, str]] = []
        sent_at: Dict[int, float] = {}
        left: Dict[str, int] = {}

        async def run() -> None:
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set() and conn.in_flight_bound == 100, 10,
                                   "connected with 100 in flight")
            await asyncio.sleep(0.3)  # the response topic's SUBACK
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], held_bytes(conn))
                    await asyncio.sleep(0.02)

            sampler = asyncio.ensure_future(sample())
            tasks = []
            start = time.monotonic()
            seq = 0
            for i in range(int(seconds * per_s)):
                await asyncio.sleep(max(0.0, start + i / per_s - time.monotonic()))
                for _ in range(int(burst) if burst_every and i % int(burst_every) == 0 else 1):
                    sent_at[seq] = time.monotonic()
                    tasks.append(asyncio.ensure_future(_escalate(t, seq, size, deadline_s, outcomes)))
                    seq += 1
            await asyncio.gather(*tasks)
            left["held_when_done"] = held_bytes(conn)
            end = time.monotonic() + settle_s
            while time.monotonic() < end and held_bytes(conn) > 0:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)
            left["held_after_settle"] = held_bytes(conn)
            stop.set()
            await sampler
            await t.close()

        try:
            asyncio.run(run())
        finally:
            conn.stop()
            responder.stop()
            proxy.close()
    ok = [o for o in outcomes if o[1] == "ok"]
    failed: Dict[str, int] = {}
    fast: Dict[str, int] = {}
    for o in outcomes:
        if o[1] != "ok":
            failed[o[1]] = failed.get(o[1], 0) + 1
            if o[2] < deadline_s * 0.5:
                fast[o[1]] = fast.get(o[1], 0) + 1
    answered = {o[0] for o in ok}
    late = [s for s, at in responder.arrived.items() if s not in answered and at - sent_at[s] > deadline_s]
    return {
        "escalations": len(outcomes), "answered_in_time": len(ok), "failed": failed,
        "failed_fast": fast, "reached_cloud": len(responder.arrived),
        "reached_cloud_after_deadline": len(late), "peak_held_bytes": peak[0],
        "uplink_bytes": proxy.carried, **left,
    }


def run_hang(size: int = 490_000, per_s: float = 10.0, seconds: float = 3.0, deadline_s: float = 0.5,
             keepalive_s: int = 30) -> Dict[str, Any]:
    """A broker that hangs (SIGSTOP: its connection stays open, nothing is answered) while the edge
    escalates ``per_s`` requests of ``size`` bytes a second for ``seconds``: how the escalations
    ended and how long each took, and the peak bytes paho held (freed only by a PUBACK or a
    reconnect: the keepalive notices a hung broker after 1 to 1.5 times ``keepalive_s``)."""
    with configured_mosquitto("max_inflight_messages 100") as broker:
        conn = MqttConnection(broker.host, broker.port, client_id="edge-hang", keepalive_s=keepalive_s)
        conn.start()
        t = MqttTransport(conn, "d")
        peak = [0]
        outcomes: List[Tuple[int, str, float, str]] = []

        async def run() -> None:
            await t.start()
            await async_wait_until(lambda: conn.connected.is_set(), 10, "connected")
            broker.proc.send_signal(signal.SIGSTOP)
            try:
                tasks = []
                start = time.monotonic()
                for i in range(int(seconds * per_s)):
                    await asyncio.sleep(max(0.0, start + i / per_s - time.monotonic()))
                    tasks.append(asyncio.ensure_future(_escalate(t, i, int(size), deadline_s, outcomes)))
                    peak[0] = max(peak[0], held_bytes(conn))
                await asyncio.gather(*tasks)
                peak[0] = max(peak[0], held_bytes(conn))
            finally:
                broker.proc.send_signal(signal.SIGCONT)
            await t.close()

        try:
            asyncio.run(run())
        finally:
            conn.stop()
    failed: Dict[str, int] = {}
    fast = 0
    for o in outcomes:
        failed[o[1]] = failed.get(o[1], 0) + 1
        fast += o[2] < 0.1
    return {"escalations": len(outcomes), "outcomes": failed, "ended_within_100ms": fast,
            "peak_held_bytes": peak[0]}


def test_a_slow_uplink_carries_in_time_what_it_can_and_refuses_the_rest_at_once():
    """1 MB/s, 490 kB requests 4 a second, 2 s deadlines (the module docstring). paho took every
    request (up to 100 in flight) and wrote them in turn: in these 8 s, 7 of 32 were answered in time
    and the other 25 reached the cloud after their deadline (over 30 s: 7 of 120, 94 late, and paho
    held 54 MB at the peak)."""
    got = run_uplink(seconds=8.0, settle_s=10.0)
    assert got["reached_cloud_after_deadline"] <= 3, got
    assert got["answered_in_time"] >= 8, got  # the link carries about 16 of the 32 in 8 s
    assert got["peak_held_bytes"] <= 4_000_000, got  # about the deadline's worth of the link, twice (paho's copy)
    assert sum(got["failed_fast"].values()) >= 8, got


def test_a_link_the_escalations_do_not_fill_refuses_none_of_them():
    """A fast link (10 MB/s) with a 300 ms round trip, 20 escalations of 40 kB a second and 8 more
    at once each second, 500 ms deadlines: the link carries them all in time. Reading the rate at
    which they were acknowledged (theirs, not the link's) as the link's refused 44 of 270."""
    got = run_uplink(rate=10_000_000, size=40_000, per_s=20, rtt_s=0.3, deadline_s=0.5, burst=8, burst_every=20,
                     seconds=5.0, settle_s=2.0)
    assert got["escalations"] == 135
    assert sum(got["failed_fast"].values()) <= 2, got


def test_a_hung_broker_fills_the_window_and_the_escalations_after_it_fail_at_once():
    """The broker stops answering with its connection open: paho took every request until the
    keepalive noticed (30-60 s), each escalation waited its whole deadline, and paho held every
    request (25 MB for the 30 here: their payloads and the packets not yet written). Once the oldest
    request has waited past a deadline, later escalations fail at once and paho is not given them."""
    got = run_hang()
    assert got["escalations"] == 30
    assert set(got["outcomes"]) == {"DEADLINE_EXCEEDED"}, got
    assert got["ended_within_100ms"] >= 18, got
    assert got["peak_held_bytes"] <= 5_000_000, got



def test_requests_sent_again_at_a_reconnect_are_answered_on_the_subscription_made_before_them():
    """Three 200 kB escalations in flight over a 1 MB/s uplink when the connection drops (another
    client takes the session over for a moment): paho sends them again at the reconnect, 1 s later.
    The SUBSCRIBE to the answers went out behind them, so the broker routed the cloud's answers to
    the first two before it knew the new session's subscription and dropped them: both escalations
    timed out (spooled, to be computed again) though the cloud had answered in time."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from tests.edge.transports.test_mqtt_refusals import Responder as AnyDeviceResponder

    with configured_mosquitto("max_inflight_messages 100") as broker:
        proxy = ThrottleProxy(broker.port, 1_000_000)
        responder = AnyDeviceResponder(broker)
        conn = MqttConnection("127.0.0.1", proxy.port, client_id="edge-resubscribed")
        conn.start()
        t = MqttTransport(conn, "d")

        async def run() -> List[Any]:
            await t.start()

            async def answered() -> bool:
                try:
                    return bool(await t.detect(frame_request(0, 100), 2.0))
                except TransportError:
                    return False  # the response subscription may still be settling
            await async_wait_until(answered, 10, "a first answer")
            waiting = [asyncio.ensure_future(t.detect(frame_request(seq, 200_000), 3.0)) for seq in (1, 2, 3)]
            await asyncio.sleep(0.1)
            thief = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="edge-resubscribed",
                                protocol=mqtt.MQTTv5)
            thief.connect(broker.host, broker.port)
            thief.disconnect()
            return await asyncio.gather(*waiting, return_exceptions=True)
        try:
            got = asyncio.run(run())
        finally:
            conn.stop()
            responder.close()
            proxy.close()
    assert [getattr(r, "frame_seq", r) for r in got] == [1, 2, 3]


def _connected_transport(broker: Broker, client_id: str) -> Tuple[MqttConnection, MqttTransport]:
    conn = MqttConnection(broker.host, broker.port, client_id=client_id)
    conn.start()
    return conn, MqttTransport(conn, "d")


def test_a_puback_read_before_publish_returned_is_counted_by_the_window():
    """paho's thread can read a request's PUBACK before ``publish`` returns in the event loop's
    (that thread preempted): MqttConnection then settles it once ``publish`` returns, and the
    transport's callback found no request to acknowledge yet. The window never heard of the
    acknowledgement: it held the request until the next escalation's look at paho, and the request
    sent to an idle uplink gave no time without a queue, so the window took the uplink for
    queueing (and judged by the rate) though nothing waited."""
    with configured_mosquitto() as broker:
        conn, t = _connected_transport(broker, "edge-early-ack")

        async def run() -> None:
            await t.start()
            await async_wait_until(conn.connected.is_set, 10, "connected")
            publish = conn.client.publish

            def preempted(*args: Any, **kwargs: Any) -> Any:
                info = publish(*args, **kwargs)
                end = time.monotonic() + 10
                while info.mid not in conn._early and time.monotonic() < end:  # paho's thread reads the PUBACK
                    time.sleep(0.001)
                assert info.mid in conn._early, "the PUBACK did not come"
                return info

            conn.client.publish = preempted
            try:
                await t.detect(frame_request(0, 1000), 0.3)  # nobody answers: DEADLINE_EXCEEDED
            except TransportError as exc:
                assert exc.status == detect_pb2.DEADLINE_EXCEEDED
            assert len(t.window) == 0 and t.window.held_bytes == 0
            assert not t.window.queueing()
            # its time from handed to paho to acknowledged: not 0 (sent noted after the PUBACK), which
            # took any request held at all for a queue
            assert list(t.window._floor) and min(t.window._floor) > 0
            await t.close()

        try:
            asyncio.run(run())
        finally:
            conn.stop()


def test_a_puback_not_yet_handled_when_the_next_escalation_looks_is_counted_by_the_window():
    """The PUBACK comes in paho's thread, which stops holding the request there and hands the window
    its acknowledgement through the event loop; an escalation already due in the loop ran first and
    its look at paho (``keep_only``) dropped the request as withdrawn, so the acknowledgement found
    nothing: the request sent to an idle uplink gave no time without a queue, and the window took
    the uplink for queueing though nothing waited."""
    with configured_mosquitto() as broker:
        conn, t = _connected_transport(broker, "edge-late-ack")

        async def run() -> None:
            await t.start()
            await async_wait_until(conn.connected.is_set, 10, "connected")
            first = asyncio.ensure_future(t.detect(frame_request(0, 1000), 0.5))
            await asyncio.sleep(0)  # it is handed to paho
            (info,) = list(t.window._held)
            second = asyncio.ensure_future(t.detect(frame_request(1, 1000), 0.5))  # due in the loop
            end = time.monotonic() + 10
            while conn.client.holds(info) and time.monotonic() < end:  # the loop busy; paho reads the PUBACK
                time.sleep(0.001)
            assert not conn.client.holds(info), "the PUBACK did not come"
            await asyncio.sleep(0)  # the second escalation's look at paho, then the acknowledgement
            assert not t.window.queueing()
            await asyncio.gather(first, second, return_exceptions=True)  # nobody answers
            await t.close()

        try:
            asyncio.run(run())
        finally:
            conn.stop()


if __name__ == "__main__":  # the measurements (module docstring): uplink|hang key=value...
    what = run_hang if sys.argv[1:2] == ["hang"] else run_uplink
    args = dict(a.split("=") for a in sys.argv[1:] if "=" in a)
    print(json.dumps(what(**{k: float(v) for k, v in args.items()}), indent=1))
