"""Why the broker ended a connection: the one rule both MQTT ends (the edge's connection,
``edge.transports.mqtt``, and the gateway's bridge, ``cloud.gateway.mqtt_bridge``) use to tell a
client-id clash from a broker that went away.

Two clients with one client id take the session from each other on every reconnect. An MQTT 5.0
broker may say so: a DISCONNECT with reason code 0x8E "Session taken over" (:data:`SESSION_TAKEN_OVER`),
evidence enough to name the clash. Mosquitto 2.0 closes the older connection without a DISCONNECT,
exactly as it closes every connection when it is stopped or restarted, so a connection the broker
closes silently soon after accepting it (within :data:`SHORT_SESSION_S`, :data:`SHORT_SESSIONS_IN_A_ROW`
times in a row) is one of two things, and the warning says both (:data:`SILENT_CLOSES_CAUSES`): a broker
restarted that often, or another client with the same id. Both ends used to call it "most likely another
client with the same id", and a broker restarted three times within ten seconds sent an operator looking
for a twin that did not exist. A connection attempt that failed in between (the broker could not be
reached: it was away) ends the count: a clash never keeps the broker from answering.

Pure: the caller passes the times and what paho reported, and logs.
"""

from __future__ import annotations

from typing import Any, Optional

#: DISCONNECT reason code "Session taken over" (MQTT 5.0, 3.14.2.1)
SESSION_TAKEN_OVER = 0x8E
#: seconds ``edgewise.mqtt_client.Client.loop_stop`` waits for the broker to acknowledge what is
#: in flight before it shuts the connection down (a broker that answers takes milliseconds). Here,
#: without paho, for ``edge.settings``' bound of the stop (an edge without the MQTT extra has no paho)
STOP_FLUSH_S = 2.0
#: A connection the broker closes, without a DISCONNECT, this soon after accepting it ...
SHORT_SESSION_S = 10.0
#: ... this many times in a row, without a failed connection attempt in between, is reported
SHORT_SESSIONS_IN_A_ROW = 3
#: what a run of silent closes may mean, for the warning
SILENT_CLOSES_CAUSES = ("the broker was restarted (or its connections dropped) that often, or another client "
                        "connects with the same client id (Mosquitto closes the older connection of an id "
                        "without a reason)")

#: :meth:`SessionWatch.closed`'s verdicts
TAKEN_OVER = "taken over"
SILENT_CLOSES = "silent closes"


class SessionWatch:
    """One MQTT client's connections, as the broker accepts and ends them."""

    def __init__(self) -> None:
        self._connected_at: Optional[float] = None
        #: connections in a row the broker closed soon after accepting them, without a reason
        self.short_sessions = 0

    def connected(self, now: float) -> None:
        """The broker accepted a connection (a CONNACK without a failure), at ``now`` (monotonic)."""
        self._connected_at = now

    def unreachable(self) -> None:
        """A connection attempt failed (refused, unreachable): the broker was away, so the silent
        closes before it were no clash."""
        self.short_sessions = 0

    def closed(self, now: float, reason_code: Any, from_server: bool) -> Optional[str]:
        """The connection ended at ``now`` with paho's ``reason_code``; ``from_server``: the broker
        sent a DISCONNECT. :data:`TAKEN_OVER` (the broker said so), :data:`SILENT_CLOSES` (the
        ambiguous run, :data:`SILENT_CLOSES_CAUSES`) or None."""
        lasted = now - self._connected_at if self._connected_at is not None else None
        self._connected_at = None
        if reason_code == 0:  # this client's own DISCONNECT ("Normal disconnection"), not the broker's doing
            self.short_sessions = 0
            return None
        if lasted is not None and lasted < SHORT_SESSION_S and not from_server:
            self.short_sessions += 1
        elif lasted is not None:
            self.short_sessions = 0
        if reason_code == SESSION_TAKEN_OVER:
            return TAKEN_OVER
        if lasted is not None and self.short_sessions >= SHORT_SESSIONS_IN_A_ROW:
            return SILENT_CLOSES
        return None

    def silent_closes(self) -> str:
        """The run of silent closes, for the warning: what happened and what it may mean."""
        return (f"closed its connection {self.short_sessions} "
                f"times in a row within seconds of accepting it, without a reason: {SILENT_CLOSES_CAUSES}")
