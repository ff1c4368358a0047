"""The scale target's answers to an API server that sheds load (429, a 5xx with Retry-After).

``retry_after_s`` is pure and driven with a fixed wall clock; ``DeploymentScale`` talks to the
local scale server (``servers.ScaleAPI``) through the real ``kubernetes`` client.
"""

from __future__ import annotations

import email.utils
import time

import pytest

from cloud.discovery.kubeclient import KubeAccess, build_api_client
from edgewise.errors import UnavailableError
from tests.cloud.autoscaler.servers import ScaleAPI

NOW = 1_700_000_000.0  # a wall-clock time, 2023-11-14T22:13:20Z


@pytest.mark.parametrize("value, seconds", [
    ("7", 7.0), (" 0 ", 0.0), ("120", 120.0),  # delay-seconds
    (email.utils.formatdate(NOW + 5, usegmt=True), 5.0),  # an HTTP date (IMF-fixdate), 5 s ahead
    ("Tue, 14 Nov 2023 22:13:30 -0000", 10.0),  # the same, zone written as -0000
    (email.utils.formatdate(NOW - 60, usegmt=True), 0.0),  # a date past: at once
    (None, None), ("", None), ("soon", None), ("-5", None), ("1.5", None), ("\u0661", None),  # none, not one
])
def test_retry_after_reads_seconds_and_http_dates(value, seconds) -> None:
    from cloud.autoscaler.kube import retry_after_s

    assert retry_after_s(value, NOW) == seconds


@pytest.fixture
def api():
    s = ScaleAPI(namespace="ns", name="edgewise-worker", replicas=2, token="t0k3n")
    yield s
    s.close()


def _target(api: ScaleAPI):
    from cloud.autoscaler.kube import DeploymentScale

    return DeploymentScale(build_api_client(KubeAccess(api_server=api.url, token="t0k3n")), "ns", "edgewise-worker")


def test_a_call_the_api_server_sheds_says_how_long_the_next_one_waits(api: ScaleAPI) -> None:
    """A 429 (max-in-flight, API Priority and Fairness) or a 503 with Retry-After was one more
    "API server answered 429": the loop called again at its next tick, whatever the server
    asked. It is a ``ThrottledError`` whose ``wait_s`` is the Retry-After (seconds or an HTTP
    date), at most ``RETRY_AFTER_MAX_S``; one without a readable Retry-After waits for nothing
    more than the next tick; a 5xx without one is no throttle."""
    from cloud.autoscaler.kube import RETRY_AFTER_MAX_S, ThrottledError

    api.shed = [(429, "7"), (503, email.utils.formatdate(time.time() + 30, usegmt=True)), (429, "86400"),
                (429, "later"), (429, None), (500, None)]
    target = _target(api)
    waits, messages = [], []
    for _ in range(5):
        with pytest.raises(ThrottledError) as ei:
            target.read()
        waits.append(ei.value.wait_s)
        messages.append(str(ei.value))
    assert waits[0] == 7.0 and 25 < waits[1] <= 30 and waits[2:] == [RETRY_AFTER_MAX_S, 0.0, 0.0]
    assert messages[0].startswith("reading deployment ns/edgewise-worker scale: API server answered 429 Too Many "
                                  "Requests and asks to retry after 7 s (Retry-After): the next call waits 7 s")
    assert "apiserver_flowcontrol_rejected_requests_total" in messages[0]
    assert "503 Service Unavailable and asks to retry after" in messages[1]
    assert (f"asks to retry after 86400 s (Retry-After), more than the {RETRY_AFTER_MAX_S:g} s the autoscaler "
            f"waits at most: the next call waits {RETRY_AFTER_MAX_S:g} s") in messages[2]
    assert "its Retry-After 'later' is neither seconds nor an HTTP date: ignored" in messages[3]
    assert "429 Too Many Requests without a Retry-After; the next tick tries again" in messages[4]
    with pytest.raises(UnavailableError) as ei:
        target.read()
    assert not isinstance(ei.value, ThrottledError) and "API server answered 500" in str(ei.value)
    assert target.read().spec_replicas == 2  # served again


@pytest.mark.parametrize("answer, said", [
    (b"{}", "the answer is not a Scale (it has no metadata.resourceVersion)"),
    (b"null", "the answer is not a Scale (it has no metadata.resourceVersion)"),
    (b'{"kind": "Scale", "metadata": {"name": "w", "resourceVersion": "7"}, "spec": {"replicas": -4}}',
     "the answer is not a Scale (spec.replicas is -4)"),
    (b'{"kind": "Scale", "metadata": {"name": "w", "resourceVersion": "7"}, "spec": {"replicas": "3"}}',
     "ValidationError: 1 validation error for V1ScaleSpec replicas Input should be a valid integer"),
])
def test_an_answer_that_is_no_scale_is_unavailable_said_in_one_line(api: ScaleAPI, answer: bytes,
                                                                    said: str) -> None:
    """A 200 that is no Scale (another service at kubernetes.api_server, a proxy's own ``{}``)
    read as 0 replicas: the autoscaler logged "target has 0 replicas: autoscaling inactive ...
    scale it to >= 1 to resume" at every tick whatever the Deployment had, and a negative count
    was "scaled up" to min_replicas with a patch. It is an unavailable read, said on one line."""
    api.answer = answer
    with pytest.raises(UnavailableError) as ei:
        _target(api).read()
    assert str(ei.value).startswith("reading deployment ns/edgewise-worker scale: ") and said in str(ei.value)
    assert "\n" not in str(ei.value)


def test_a_negative_count_in_the_answer_is_not_scaled_to_min_replicas(api: ScaleAPI) -> None:
    """The whole tick: a Scale saying -4 replicas was "below min_replicas" and patched to 1."""
    import asyncio

    from cloud.autoscaler.loop import AutoscalerLoop, GatewayPoller
    from cloud.autoscaler.scaling import Scaler, ScalerConfig
    from tests.cloud.autoscaler.servers import PoolServer, pool_doc

    gw = PoolServer(pool_doc(2, 1.4))
    try:
        api.answer = b'{"kind": "Scale", "metadata": {"name": "w", "resourceVersion": "7"}, "spec": {"replicas": -4}}'
        loop = AutoscalerLoop(Scaler(ScalerConfig(min_replicas=1, max_replicas=20, target_utilization=0.07)),
                              _target(api), GatewayPoller([gw.url]))
        assert asyncio.run(loop.tick()) is None  # no decision: the read failed
        assert loop.metrics.apply_errors.labels("read")._value.get() == 1
        assert not [r for r in api.requests if r[0] == "PATCH"]
    finally:
        gw.close()
