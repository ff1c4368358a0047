"""The gateway's metrics: every label value a rate or an alert reads exists at 0 from the start,
and the lists of those values agree with the code that counts them and with docs/metrics.md."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from cloud.gateway.balancing import Balancer, BalancerConfig
from cloud.gateway.metrics import MQTT_RESULTS, REJECT_REASONS, RETRY_RESULTS, GatewayMetrics

ROOT = Path(__file__).resolve().parents[3]


def _text(m: GatewayMetrics) -> str:
    return generate_latest(m.registry).decode()


def test_counters_start_at_zero_and_mqtt_ones_only_with_the_bridge():
    # a series that first appears at 1 has no increase()/rate() in Prometheus: the first refusal
    # of a gateway's life never showed in the rejection ratio or the MQTT refusal alert
    m = GatewayMetrics(Balancer(BalancerConfig()))
    text = _text(m)
    for reason in REJECT_REASONS:
        assert f'edgewise_gateway_rejected_total{{reason="{reason}"}} 0.0' in text
    for result in RETRY_RESULTS:
        assert f'edgewise_gateway_retries_total{{result="{result}"}} 0.0' in text
    for transport in ("grpc", "grpc-stream"):
        for name in ("OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "INVALID_ARGUMENT"):
            assert f'edgewise_gateway_requests_total{{status="{name}",transport="{transport}"}} 0.0' in text
    for transport in ("grpc", "grpc-stream"):
        assert f'edgewise_gateway_unanswered_total{{transport="{transport}"}} 0.0' in text
    assert 'edgewise_gateway_request_seconds_bucket{le="+Inf",outcome="OK"} 0.0' in text  # the p99 alert's
    assert 'transport="mqtt"' not in text and "edgewise_gateway_mqtt_messages_total{" not in text
    m.follow_mqtt()
    text = _text(m)
    for result in MQTT_RESULTS:
        assert f'edgewise_gateway_mqtt_messages_total{{result="{result}"}} 0.0' in text
    assert 'edgewise_gateway_rejected_total{reason="mqtt_overloaded"} 0.0' in text
    assert 'edgewise_gateway_requests_total{status="OK",transport="mqtt"} 0.0' in text


def _literals(pattern: str, *files: str) -> set[str]:
    return {v for f in files for v in re.findall(pattern, (ROOT / f).read_text())}


def test_the_lists_name_every_value_the_code_counts_and_the_docs_explain_each():
    bridge = "cloud/gateway/mqtt_bridge.py"
    counted = _literals(r'_(?:count|refuse)\(\s*"([a-z_]+)"', bridge)
    assert counted and counted <= set(MQTT_RESULTS), counted - set(MQTT_RESULTS)
    rejected = _literals(r'rejected\.labels\(reason="([a-z_]+)"\)', "cloud/gateway/server.py", "cloud/gateway/pool.py",
                         bridge)
    assert rejected <= set(REJECT_REASONS) | {"mqtt_overloaded"}, rejected
    docs = (ROOT / "docs/metrics.md").read_text()
    rows = {name: line for line in docs.splitlines()
            for name in ("edgewise_gateway_rejected_total", "edgewise_gateway_mqtt_messages_total")
            if line.startswith(f"| `{name}`")}
    for reason in (*REJECT_REASONS, "mqtt_overloaded"):
        assert f"`{reason}`" in rows["edgewise_gateway_rejected_total"], reason
    for result in MQTT_RESULTS:
        assert f"`{result}`" in rows["edgewise_gateway_mqtt_messages_total"], result


def test_a_paused_worker_shows_as_paused():
    # a worker the gateway sends nothing (it reports not serving, or its Load polls fail) kept
    # its effective weight and showed nowhere in /metrics, only in /pool
    b = Balancer(BalancerConfig())
    b.set_endpoints([("w0:1", 1.0, "w0", False), ("w1:1", 1.0, "w1", False)])
    b.report_load("w1:1", capacity=None, serving=False)
    m = GatewayMetrics(b)
    assert m.registry.get_sample_value("edgewise_gateway_worker_paused", {"worker": "w1"}) == 1.0
    assert m.registry.get_sample_value("edgewise_gateway_worker_paused", {"worker": "w0"}) == 0.0
