"""bench/routing_sim.py: the real Balancer core and the nginx least_conn model on a virtual clock."""

from __future__ import annotations

from bench import routing_sim as S
from cloud.gateway.balancing import BalancerConfig


def test_nginx_model_follows_least_conn_with_weights() -> None:
    ng = S.NginxLeastConn()
    # all idle: smooth WRR over 4:2:1 picks w0; then w1 and w2 tie at 0 active and the tie's
    # smooth WRR (weights 2:1) picks w1; then w2 is the only one idle (0 < 1/4 < 1/2)
    assert [ng.pick(), ng.pick(), ng.pick()] == ["w0", "w1", "w2"]
    assert ng.pick() == "w0"  # 1/4 < 1/2 < 1/1: fewest active per weight
    ng.done("w0")
    assert ng.active == {"w0": 1, "w1": 1, "w2": 1}


def test_both_routers_send_work_to_every_worker_and_queue_under_load() -> None:
    for router, cfg in (("gateway", BalancerConfig()), ("nginx", None)):
        p50_low, p99_low = S.simulate(router, cfg, 0.3, 3000, seed=1, exponential=False)
        # at low load nothing queues: the slowest answer is the slow worker's service time
        assert abs(p99_low - 160.0) < 1e-6 and 40.0 <= p50_low <= 160.0
        p50_hi, p99_hi = S.simulate(router, cfg, 0.95, 3000, seed=1, exponential=False)
        assert p99_hi > p99_low and p50_hi >= p50_low


def test_same_seed_same_answer() -> None:
    a = S.simulate("gateway", BalancerConfig(), 0.8, 2000, seed=3, exponential=True)
    assert a == S.simulate("gateway", BalancerConfig(), 0.8, 2000, seed=3, exponential=True)


def test_pixel_costs_reach_the_balancer_and_pay_where_requests_differ() -> None:
    """docs/design/balancing.md#work-not-requests on the virtual clock: a mix of small payloads
    and whole frames (cost 1:9), service time in proportion to the pixels."""
    mix = [100_000] * 4 + [900_000]
    ours = [S.simulate("gateway", BalancerConfig(), 0.8, 6000, seed=s, exponential=False, pixels=mix)
            for s in (1, 2, 3)]
    count = [S.simulate("gateway", BalancerConfig(cost="requests"), 0.8, 6000, seed=s, exponential=False,
                        pixels=mix) for s in (1, 2, 3)]
    nginx = [S.simulate("nginx", None, 0.8, 6000, seed=s, exponential=False, pixels=mix) for s in (1, 2, 3)]
    p99 = lambda runs: sum(r[1] for r in runs) / len(runs)  # noqa: E731
    assert ours != count  # the costs changed the picks
    assert p99(ours) < p99(count) and p99(ours) < p99(nginx)


def test_the_payload_mix_is_real_region_payloads() -> None:
    from bench.payload_mix import region_payloads

    mix = region_payloads(frames=4, streams=2, seed=5)
    assert len(mix) == 8
    assert all(p.jpeg[:2] == b"\xff\xd8" and 0 < p.width <= 1280 and 0 < p.height <= 720 for p in mix)
    import cv2
    import numpy as np

    first = cv2.imdecode(np.frombuffer(mix[0].jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert first.shape[:2] == (mix[0].height, mix[0].width)
