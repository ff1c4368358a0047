"""paho-mqtt's client as both MQTT ends of edgewise need it: the edge's connection
(``edge.transports.mqtt``) and the gateway's bridge (``cloud.gateway.mqtt_bridge``).

Things paho does not do, each of which would otherwise keep a connection down for good
(paho sends an unacknowledged message again after every reconnect) or deliver a message twice:

* Mosquitto answers a message over its ``message_size_limit`` with a PUBACK (or PUBREC)
  "Packet too large" (0x95), a reason code MQTT 5.0 lists for CONNACK and DISCONNECT only.
  paho calls that a malformed packet and drops the connection; ``Client`` hands it to
  ``on_publish`` as the refusal it is (paho then forgets the message).
* A PUBREC with a failure reason code ends a QoS 2 exchange (MQTT 5.0, 4.3.3): paho ignores
  the code and sends PUBREL anyway. ``Client`` hands the refusal to ``on_publish``.
* A broker that takes QoS 0 only (its CONNACK's *Maximum QoS*, Mosquitto ``max_qos 0``)
  drops a client that publishes at QoS 1. ``Client.drop_queued_over`` forgets what paho
  holds above the broker's QoS, from ``on_connect``, before paho sends it again.
* QoS 2 exactly once across a restart of the process (MQTT 5.0, 4.3.3 and 4.4): the
  publisher keeps each message's packet identifier on disk before the broker can see it
  (``reserve_mid``, ``publish_as``) and whether the broker's PUBREC came (``on_pubrec``, called
  before paho sends the PUBREL); the next process, in the same session (same client id,
  clean start off), sends those messages again with the same identifiers (``resume``): the
  PUBLISH of one the broker holds unreleased, the PUBREL of one it already received. The
  broker delivers each once. Where the broker did not keep the session (its CONNACK says
  so), ``on_connack`` starts those exchanges over with a PUBLISH: at least once, not lost.
* paho reads a packet's properties in time that grows with the square of their number: one
  request of 100,000 User Properties held the bridge's network thread for 18 s.
  ``edgewise.mqtt_properties`` reads them in one pass, at most 64 of them.
* paho's reconnect reset (``_messages_reconnect_reset_out``) turns a PUBREL still owed from
  the last connection into a new PUBLISH when a connection attempt fails in between (a
  second delivery), and marks every held message for sending at once, past the in-flight
  bound and the broker's *Receive Maximum* (refused "Quota exceeded"). The override keeps
  owed PUBRELs and holds everything back; ``on_connack`` sends what the connection owes,
  owed PUBRELs first, within the broker's bound as soon as its CONNACK is read.
* paho cannot take back a message: one given up (an escalation past its deadline, spooled for
  a replay) still went out once the broker read again, so a stalled broker's backlog of given-up
  requests reached the cloud all at once. ``Client.withdraw`` forgets one never written yet, or
  written on an earlier connection only; one written on the last connection is dropped at the
  next reconnect (``drop_expired``) instead of being sent again: its Message Expiry Interval,
  whole seconds, outlived the escalation's deadline, and a request given up (and spooled) when
  its connection dropped went out again after the reconnect, for the gateway to compute twice
  (found by a probe).
* A message with a *Message Expiry Interval* (the edge's escalation: its deadline) that paho
  still held when its connection was lost went out again after the reconnect, with the whole
  interval: the broker counts it from the message's arrival (MQTT 5.0, 3.3.2.3.3), so it
  handed the gateway requests the edge had given up on (spooled) long before, in one burst
  after a hung broker's outage (hundreds; their workers' queues then timed out the live
  escalations behind them; found by a probe). ``Client`` notes when each such message was
  published; ``drop_expired``, from ``on_connect`` before ``on_connack``, forgets those whose
  interval has passed since.
* paho's ``loop_stop`` ends its network thread only once every QoS 1 and 2 message is
  acknowledged, or the connection dies: after a ``disconnect()`` whose DISCONNECT cannot be
  written (a broker that hangs, or a link that went dead, with the socket's buffers full of
  unacknowledged escalations) that was the keepalive, 30 s and more: the edge's stop took 39 s
  with a hung broker, past systemd's ``TimeoutStopSec=30`` (found by a probe). ``loop_stop``
  gives the broker ``STOP_FLUSH_S`` to answer, then shuts the socket down: what is
  unacknowledged is the outbox's and the spool's to send again, never lost with the thread.
* A message whose topic is not UTF-8 (MQTT 5.0, 1.5.4: a broker must not send one; a hostile
  broker, or a man in the middle without TLS, can) made ``message.topic`` raise in the
  ``on_message`` of both ends, and paho let that end its network thread: the edge took no
  answer again, did not reconnect, and still said it was connected (found by a probe).
  ``Client`` drops such a message before ``on_message``, acknowledged, with a throttled WARNING.
* Any other exception out of a callback, or out of paho itself, ended paho's network thread
  the same way, silently but for a traceback on stderr: nothing was received, sent or
  reconnected again until the process restarted. ``Client``'s network thread logs it, ends
  the connection as lost (``on_disconnect``: what waits on it learns so) and goes on, paho
  reconnecting with its own backoff, until ``loop_stop`` or a ``disconnect()``.
* paho's network loop waits with ``select()``, which refuses a descriptor of 1024 or more: a
  socket opened past 1023 (many connections open in the process) lost every connection at
  once, quietly. ``edgewise.mqtt_poll`` has it wait with ``poll()``.
* paho closes the socket pair ``loop_start`` makes (what wakes its thread for a publish) only
  in its ``__del__``. A connection and its client hold each other (its callbacks), so the
  garbage collector frees them together, and it may finalize the sockets before the client:
  a ResourceWarning "unclosed socket" from whatever ran then (a test suite that turns warnings
  into errors failed a module for it). ``loop_stop`` closes the pair once the thread is done.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from edgewise import mqtt_poll, mqtt_properties
from edgewise.mqtt_sessions import STOP_FLUSH_S
from edgewise.observability import LogThrottle

log = logging.getLogger("edgewise.mqtt")
mqtt_properties.install()  # paho's property reader takes time in the square of their number
mqtt_poll.install()  # paho's loop waits with select(), which refuses a descriptor past 1023

#: packet identifiers MQTT has (1..65535)
MAX_MID = 65535
#: QoS 1 and 2 messages in flight at once, at most: the broker's Receive Maximum lowers it
#: (Mosquitto announces its ``max_inflight_messages``, 20 by default; the chart's broker 100).
#: Over a link of round trip r the MQTT sink carries about (its share of this) / (2 r) records
#: a second at QoS 2 (``bench/mqtt_sink.py``): 20 held a device to 75 records/s at 100 ms, 25 at 300
MAX_INFLIGHT = 100
_OWES_PUBREL = (mqtt.mqtt_ms_wait_for_pubcomp, mqtt.mqtt_ms_resend_pubrel)
_SENT = (mqtt.mqtt_ms_wait_for_puback, mqtt.mqtt_ms_wait_for_pubrec)
#: states of a message paho holds back: beyond the in-flight bound, or published while disconnected
_UNSENT = (mqtt.mqtt_ms_queued, mqtt.mqtt_ms_publish)
#: paho's states after a ``disconnect()`` the program asked for (its loop ends, never reconnects)
_ASKED_TO_DISCONNECT = (mqtt._ConnectionState.MQTT_CS_DISCONNECTING, mqtt._ConnectionState.MQTT_CS_DISCONNECTED)


class Withdrawn(NamedTuple):
    """What ``Client.withdraw`` did with a message: ``forgotten``, it made paho forget it (nothing
    of it is sent, and no answer to it is handed on); ``written``, it went out on a connection, so
    the broker may have it (False: it never left this client)."""

    forgotten: bool
    written: bool


class OffTableReason(ReasonCode):
    """A PUBACK or PUBREC reason code paho's table does not name for that packet (Mosquitto's
    0x95 Packet too large); named as MQTT names it for the other packets."""

    def __init__(self, value: int, packet_type: int = PacketTypes.PUBACK) -> None:
        super().__init__(packet_type)
        self.value = value

    def getName(self) -> str:
        return next(iter(self.names.get(self.value, ())), f"reason code {self.value}")


def _reason(packet_type: int, code: int) -> ReasonCode:
    try:
        return ReasonCode(packet_type, identifier=code)
    except (KeyError, ValueError):
        return OffTableReason(code, packet_type)


class Client(mqtt.Client):
    """paho's client, with the additions the module docstring gives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: called (paho's thread) with the mid of a QoS 2 message the broker received (its PUBREC
        #: succeeded), before the PUBREL goes out: where the publisher notes that on disk
        self.on_pubrec: Optional[Callable[[int], None]] = None
        self._reserved: Set[int] = set()  # mids handed out by reserve_mid, not yet in _out_messages
        self._forced = threading.local()  # publish_as: the mid this thread's next publish takes
        self._bad_topic_log = LogThrottle(60.0, burst=3)
        self._loop_log = LogThrottle(60.0, burst=3)
        #: mid -> time.monotonic() from which a message paho holds is not to be sent again after a
        #: reconnect: its Message Expiry Interval ends, or its publisher gave it up (``withdraw``)
        self._expires_at: Dict[int, float] = {}

    def _handle_on_message(self, message: Any) -> None:
        """Hand a message to ``on_message``, unless its topic is not UTF-8 (the module docstring)."""
        raw: bytes = message._topic  # (paho decodes it at each read of message.topic)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            held = self._bad_topic_log.allow()
            if held is not None:
                log.warning("MQTT message dropped: its topic %r is not UTF-8 (%s), which no MQTT broker may send; "
                            "check what answers at the broker's address%s", raw[:200], exc.reason,
                            f" ({held} more not logged)" if held else "")
            return
        super()._handle_on_message(message)

    def _thread_main(self) -> None:
        """paho's network thread (``loop_start``), kept running through an exception (the module
        docstring): logged, the connection ended as lost, and the loop resumed."""
        try:
            while not self._thread_terminate:
                try:
                    self.loop_forever(retry_first_connection=True)
                    return
                except Exception:  # a callback's or paho's: the thread must not end with it
                    held = self._loop_log.allow()
                    if held is not None:
                        log.error("MQTT network loop failed; the connection is dropped and made again%s",
                                  f" ({held} more not logged)" if held else "", exc_info=True)
                    self._lost()
        finally:
            self._thread = None

    def loop_stop(self) -> Any:
        """paho's, bounded (the module docstring): the network thread ends within about
        ``STOP_FLUSH_S`` whatever the broker does."""
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            self._thread_terminate = True
            thread.join(STOP_FLUSH_S)
            shutdown = getattr(self._sock, "shutdown", None)  # (a TCP or TLS socket)
            if thread.is_alive() and shutdown is not None:
                try:  # the loop reads the end of the connection, and ends as after a lost one
                    shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        rc = super().loop_stop()
        if thread is None or not thread.is_alive():  # (None: it ended on its own, after a disconnect)
            # the thread's wake-up pair (module doc): forgotten first, so a publish after the stop
            # skips it as it does before a start
            pair, self._sockpairR, self._sockpairW = (self._sockpairR, self._sockpairW), None, None
            for end in pair:
                if end is not None:
                    end.close()
        return rc

    def _lost(self) -> None:
        """End the connection a failed network loop leaves in an unknown state (a packet may be
        half read) as paho ends a lost one, then pause a second: the loop reconnects with paho's
        backoff, and an exception that comes back at once does not spin. A ``disconnect()`` the
        program asked for stays one (paho's state says so): the loop then ends, not reconnects."""
        try:
            self._loop_rc_handle(mqtt.MQTTErrorCode.MQTT_ERR_CONN_LOST)
        except Exception:  # on_disconnect's own: the socket is closed first, the state below
            log.error("MQTT on_disconnect failed after a failed network loop", exc_info=True)
            self._sock_close()
            if self._state not in _ASKED_TO_DISCONNECT:
                self._state = mqtt._ConnectionState.MQTT_CS_CONNECTION_LOST
        time.sleep(1.0)

    def _create_socket_connection(self) -> Any:
        """paho's TCP connection, with Nagle's algorithm off (``TCP_NODELAY``): MQTT's packets are
        small and each waits for the other side's answer (PUBACK, PUBREC, PUBREL, PUBCOMP), so a
        packet held back until the previous segment is acknowledged costs up to a round trip
        each; with it on, the sink carried up to a third less over a delayed link (``bench/mqtt_sink.py``)."""
        sock = super()._create_socket_connection()
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # not a TCP socket (a proxy's own kind): as paho made it
            pass
        return sock

    def _mid_generate(self) -> int:
        forced = getattr(self._forced, "mid", None)
        if forced is not None:
            self._forced.mid = None
            return int(forced)
        with self._mid_generate_mutex:
            return self._free_mid()

    def _free_mid(self) -> int:
        """(under ``_mid_generate_mutex``) The next mid neither paho nor a reservation holds: a
        message resumed from the last process keeps its own."""
        for _ in range(MAX_MID):
            self._last_mid = self._last_mid % MAX_MID + 1
            if self._last_mid not in self._out_messages and self._last_mid not in self._reserved:
                break
        return self._last_mid

    def reserve_mid(self) -> int:
        """A packet identifier for ``publish_as``, kept from every other publish meanwhile."""
        with self._mid_generate_mutex:
            mid = self._free_mid()
            self._reserved.add(mid)
            return mid

    def release_mid(self, mid: int) -> None:
        with self._mid_generate_mutex:
            self._reserved.discard(mid)

    def publish(self, topic: str, payload: Any = None, qos: int = 0, retain: bool = False,
                properties: Optional[Properties] = None) -> mqtt.MQTTMessageInfo:
        """paho's ``publish``; a QoS 1 or 2 message with a Message Expiry Interval is noted for
        ``drop_expired``."""
        expiry = getattr(properties, "MessageExpiryInterval", None) if properties is not None else None
        info = super().publish(topic, payload, qos=qos, retain=retain, properties=properties)
        with self._out_message_mutex:
            if qos > 0 and isinstance(expiry, int) and expiry > 0 and info.mid in self._out_messages:
                self._expires_at[info.mid] = time.monotonic() + expiry  # (its PUBACK may have come already)
            else:  # (no entry may outlive its message: a mid is used again)
                self._expires_at.pop(info.mid, None)
        return info

    def _do_on_publish(self, mid: int, reason_code: Any, properties: Any) -> Any:
        """(paho, under ``_out_message_mutex``) A message's exchange ended (PUBACK, PUBCOMP)."""
        self._expires_at.pop(mid, None)
        return super()._do_on_publish(mid, reason_code, properties)

    def drop_expired(self) -> Dict[int, str]:
        """Forget the messages paho holds whose Message Expiry Interval has passed since they were
        published, or that were given up written (``withdraw``; the module docstring): called from
        ``on_connect``, before ``on_connack`` sends them again; their mids and topics. Their
        publisher gave up on them: the broker would take each as new, with its whole interval."""
        now = time.monotonic()
        dropped: Dict[int, str] = {}
        with self._out_message_mutex:
            for mid, ends in list(self._expires_at.items()):
                m = self._out_messages.get(mid)
                if m is None or ends <= now:
                    del self._expires_at[mid]
                if m is not None and ends <= now:
                    del self._out_messages[mid]
                    dropped[mid] = m.topic
        return dropped

    def publish_as(self, mid: int, topic: str, payload: bytes, qos: int,
                   properties: Optional[Properties] = None) -> mqtt.MQTTMessageInfo:
        """``publish`` with the packet identifier ``mid`` (from ``reserve_mid``)."""
        self._forced.mid = mid
        try:
            return self.publish(topic, payload, qos=qos, properties=properties)
        finally:
            self._forced.mid = None
            self.release_mid(mid)

    def resume(self, mid: int, topic: str, payload: bytes, received: bool,
               properties: Optional[Properties] = None) -> mqtt.MQTTMessageInfo:
        """Take over a QoS 2 message the last process sent with ``mid`` and did not see completed:
        paho sends its PUBREL (``received``: the broker's PUBREC had come) or its PUBLISH again
        (DUP set) at the next connection, which must continue the session (clean start off).
        Call it before the first connection: the messages go out in the order resumed."""
        if self._sock is not None:
            raise RuntimeError("resume() is for messages of the last process, before the first connection")
        m = mqtt.MQTTMessage(mid, topic.encode("utf-8"))
        m.payload, m.qos, m.retain, m.dup, m.properties = payload, 2, False, True, properties
        m.state = mqtt.mqtt_ms_wait_for_pubcomp if received else mqtt.mqtt_ms_wait_for_pubrec
        with self._out_message_mutex:
            if mid in self._out_messages:
                raise ValueError(f"MQTT packet identifier {mid} is resumed twice")
            self._out_messages[mid] = m
        return m.info

    def _handle_pubackcomp(self, cmd: Any) -> Any:
        packet = self._in_packet["packet"]
        if (cmd == "PUBACK" and self._protocol == mqtt.MQTTv5 and len(packet) >= 3 and packet[2] >= 0x80
                and isinstance(_reason(PacketTypes.PUBACK, packet[2]), OffTableReason)):
            return self._refused(packet, PacketTypes.PUBACK)
        return super()._handle_pubackcomp(cmd)

    def _handle_pubrec(self) -> Any:
        packet = self._in_packet["packet"]
        if self._protocol == mqtt.MQTTv5 and len(packet) >= 3 and packet[2] >= 0x80:
            return self._refused(packet, PacketTypes.PUBREC)
        hook = self.on_pubrec
        if hook is not None and len(packet) >= 2:
            mid = struct.unpack("!H", bytes(packet[:2]))[0]
            with self._out_message_mutex:
                ours = mid in self._out_messages and self._out_messages[mid].qos == 2
            if ours:
                try:
                    hook(mid)
                except Exception:  # the hook reports its own failures; the exchange goes on
                    pass
        return super()._handle_pubrec()

    def _messages_reconnect_reset_out(self) -> None:
        """(paho, before each connection attempt) In place of paho's reset (the module docstring):
        everything waits for ``on_connack``, which ``on_connect`` must call, to send it as the
        CONNACK allows. A PUBREL still owed stays owed, a message sent before gets DUP, and a
        publish from another thread before the CONNACK waits too (the bound counts as taken)."""
        with self._out_message_mutex:
            for m in self._out_messages.values():
                m.timestamp = 0
                if m.qos == 2 and m.state in _OWES_PUBREL:
                    m.state = mqtt.mqtt_ms_resend_pubrel
                    continue
                if m.state in _SENT:
                    m.dup = True
                m.state = mqtt.mqtt_ms_queued
            self._inflight_messages = self._max_inflight_messages

    @property
    def in_flight_bound(self) -> int:
        """How many QoS 1/2 messages may be in flight at once: min(``MAX_INFLIGHT``, the broker's
        Receive Maximum from the last CONNACK); paho queues the ones beyond it, first in, first out."""
        return int(self._max_inflight_messages)

    def on_connack(self, session_present: bool, receive_maximum: int) -> List[int]:
        """(``on_connect``, paho's thread, before paho's own CONNACK loop) Send now what this
        connection owes the broker, within min(``MAX_INFLIGHT``, its Receive Maximum): the owed PUBRELs where
        it kept the session; where it did not, those exchanges start over with a PUBLISH (their
        mids are returned); then what waits, in order; the rest stays queued. Nothing is left
        for paho's loop, so a publish from another thread from here on counts against the right
        in-flight number. Messages sent on this connection before its CONNACK count as in flight."""
        restarted: List[int] = []
        with self._out_message_mutex:
            self._max_inflight_messages = max(1, min(MAX_INFLIGHT, int(receive_maximum)))
            owed = [mid for mid, m in self._out_messages.items()
                    if m.qos == 2 and m.state == mqtt.mqtt_ms_resend_pubrel]
            for mid in reversed(owed):
                self._out_messages.move_to_end(mid, last=False)
            inflight = sum(1 for m in self._out_messages.values()
                           if m.qos > 0 and (m.state in _SENT or m.state == mqtt.mqtt_ms_wait_for_pubcomp))
            for m in self._out_messages.values():
                if m.qos == 2 and m.state == mqtt.mqtt_ms_resend_pubrel:
                    if session_present:
                        m.state = mqtt.mqtt_ms_wait_for_pubcomp
                        inflight += 1
                        self._send_pubrel(m.mid)
                        continue
                    restarted.append(m.mid)
                    m.state, m.dup = mqtt.mqtt_ms_publish, False  # a new message in the new session
                if m.qos == 0 or m.state not in (mqtt.mqtt_ms_publish, mqtt.mqtt_ms_queued):
                    continue
                if inflight >= self._max_inflight_messages:
                    m.state = mqtt.mqtt_ms_queued
                    continue
                m.state = mqtt.mqtt_ms_wait_for_puback if m.qos == 1 else mqtt.mqtt_ms_wait_for_pubrec
                inflight += 1
                self._send_publish(m.mid, m.topic.encode("utf-8"), m.payload, m.qos, m.retain, m.dup,
                                   properties=m.properties)
            self._inflight_messages = inflight
        return restarted

    def _refused(self, packet: Any, packet_type: int) -> Any:
        """The broker refused the message (a PUBACK or PUBREC reason code >= 0x80): the
        exchange ends there, ``on_publish`` gets the reason."""
        mid = struct.unpack("!H", bytes(packet[:2]))[0]
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, _reason(packet_type, packet[2]), Properties(packet_type))
        return mqtt.MQTT_ERR_SUCCESS

    def withdraw(self, info: mqtt.MQTTMessageInfo) -> Withdrawn:
        """Give up the QoS 1 message ``publish`` returned ``info`` for: it is not sent again from here
        on. One never written (held beyond the in-flight bound, published while disconnected), or
        written on an earlier connection only, is forgotten. One written on this connection stays
        while its PUBACK may come (paho counts it in flight), marked so that a reconnect drops it
        (``drop_expired``) instead of sending it again. A message that took its packet identifier
        since is another's, and a QoS 2 one the broker may hold unreleased (written, ``dup``) must
        end its exchange: both are left alone."""
        with self._out_message_mutex:
            m = self._out_messages.get(info.mid)
            if m is None or m.info is not info:
                return Withdrawn(forgotten=False, written=True)  # answered or dropped: it may have gone
            if m.state in _UNSENT and (m.qos == 1 or not m.dup):
                del self._out_messages[info.mid]
                self._expires_at.pop(info.mid, None)
                return Withdrawn(forgotten=True, written=bool(m.dup))
            if m.qos == 1:
                self._expires_at[info.mid] = time.monotonic()  # written on this connection: never again
            return Withdrawn(forgotten=False, written=True)

    def holds(self, info: mqtt.MQTTMessageInfo) -> bool:
        """Whether paho still holds the message ``publish`` returned ``info`` for: not acknowledged,
        withdrawn or dropped (a message that took its packet identifier since is another)."""
        with self._out_message_mutex:
            m = self._out_messages.get(info.mid)
            return m is not None and m.info is info

    def drop_queued_over(self, max_qos: int) -> Dict[int, str]:
        """Forget the messages paho holds to send (again) at a QoS over ``max_qos``: called from
        ``on_connect``, before paho sends them again; their mids and topics."""
        dropped: Dict[int, str] = {}
        with self._out_message_mutex:
            for mid, m in list(self._out_messages.items()):
                if m.qos > max_qos:
                    del self._out_messages[mid]
                    self._expires_at.pop(mid, None)
                    dropped[mid] = m.topic
        return dropped
