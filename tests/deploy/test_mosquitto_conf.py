"""The shipped broker configuration (deploy/mosquitto/mosquitto.conf) sets what the chart's broker
sets, for the same reasons (docs/install-cloud.md), and a real Mosquitto takes it."""

from __future__ import annotations

from pathlib import Path

from cloud.gateway.mqtt_bridge import receive_limit
from cloud.gateway.settings import LimitSettings
from tests.conftest import configured_mosquitto

CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "mosquitto.conf"
#: the options a broker for edgewise needs beyond access control (the chart's template sets them)
TUNING = ("max_packet_size", "max_inflight_messages", "set_tcp_nodelay")


def _options() -> dict[str, str]:
    out = {}
    for line in CONF.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            out[key] = value
    return out


def test_the_shipped_broker_takes_the_bridges_packets_100_in_flight_and_no_nagle() -> None:
    """The docs told operators of an external broker to set these three, and the shipped file had
    none of them: a request over Mosquitto's limit was dropped unanswered, and the edge timed out
    and replayed it, where gRPC answers INVALID_ARGUMENT (found by a probe)."""
    opts = _options()
    assert int(opts["max_packet_size"]) == receive_limit(LimitSettings().max_message_bytes)
    assert opts["max_inflight_messages"] == "100" and opts["set_tcp_nodelay"] == "true"
    with configured_mosquitto("\n".join(f"{k} {opts[k]}" for k in TUNING)) as broker:
        assert broker.proc.poll() is None  # it started on them
