"""Settings precedence and validation, and the real ``edgewise cloud autoscaler`` process
against local servers: dry run prints and never PATCHes; a live run PATCHes and serves metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from cloud.autoscaler.scaling import DEFAULT_TARGET_LOAD, default_scale_down
from cloud.autoscaler.settings import load_settings
from edgewise.errors import ConfigError
from tests.cloud.autoscaler.servers import PoolServer, ScaleAPI, pool_doc
from tests.conftest import free_port
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
EDGEWISE = [sys.executable, "-c", "import sys; from edgewise.cli import main; sys.exit(main(sys.argv[1:]))"]


def test_precedence_defaults_yaml_env_flags(tmp_path):
    cfg = tmp_path / "autoscaler.yaml"
    cfg.write_text(
        "gateway_urls: [http://gw:9100]\nmin_replicas: 2\nmax_replicas: 8\ninterval_s: 30\n"
        "kubernetes: {namespace: yaml-ns}\nscale_down: {stabilization_window_s: 120}\n"
        "scale_up:\n  stabilization_window_s: 0\n  select_policy: Min\n"
        "  policies: [{type: Pods, value: 1, period_s: 60}]\n")
    env = {"EDGEWISE_AUTOSCALER__MAX_REPLICAS": "12", "EDGEWISE_AUTOSCALER__KUBERNETES__NAMESPACE": "env-ns",
           "EDGEWISE_AUTOSCALER__DRY_RUN": "true"}
    s = load_settings(cfg, {"max_replicas": 20, "queue_wait_slo_ms": 50.0}, env)
    assert (s.min_replicas, s.max_replicas, s.interval_s, s.dry_run) == (2, 20, 30.0, True)
    assert s.kubernetes.namespace == "env-ns" and s.kubernetes.deployment == "edgewise-worker"
    assert s.scale_down.stabilization_window_s == 120 and len(s.scale_down.policies) == 1
    assert s.scale_up.select_policy == "Min" and s.scale_up.policies[0].value == 1
    sc = s.scaler_config()
    assert sc.queue_wait_slo_ms == 50.0 and sc.target_utilization is None and sc.stale_after_s == 90.0
    # no target configured: the shipped load target, nothing else
    dflt = load_settings(None, {"gateway_urls": ["http://g:1"]}, {}).scaler_config()
    assert (dflt.target_load, dflt.target_utilization, dflt.queue_wait_slo_ms) == (DEFAULT_TARGET_LOAD, None, None)
    assert load_settings(None, {"gateway_urls": ["http://g:1"], "target_utilization": 0.1}, {}).scaler_config() \
        .target_load is None


def test_metrics_port_minus_one_is_no_listener_as_for_the_other_processes():
    # `--metrics-port -1` turns the edge's, gateway's and worker's listener off; here it was refused
    # ("allowed: an integer in [0, 65535], or null"), and null cannot be written as a flag
    urls = {"gateway_urls": ["http://g:1"]}
    assert load_settings(None, ["metrics_port=-1"], {"EDGEWISE_AUTOSCALER__GATEWAY_URLS": "http://g:1"}) \
        .metrics_listen_port() is None
    assert load_settings(None, {**urls, "metrics_port": None}, {}).metrics_listen_port() is None
    assert load_settings(None, urls, {}).metrics_listen_port() == 9102
    assert load_settings(None, {**urls, "metrics_port": 0}, {}).metrics_listen_port() == 0


@pytest.mark.parametrize("text, msg", [
    ("gateway_urls: [http://g:1]\nmin_replica: 2\n",
     r"autoscaler.yaml:2: min_replica: unknown key \(did you mean 'min_replicas'\?\)"),
    ("kubernetes: {namespce: x}\n", "autoscaler.yaml:1: kubernetes.namespce: unknown key"),
    ("scale_up: {policies: [{type: Pods, value: 1, period: 15}]}\n",
     r"autoscaler.yaml:1: scale_up.policies\[0\].period: unknown key \(did you mean 'period_s'\?\)"),
    ("gateway_urls: [http://g:1]\nmin_replicas: two\n", "autoscaler.yaml:2: min_replicas: 'two' is not an integer"),
    ("gateway_urls: [http://g:1]\nmin_replicas: 5\nmax_replicas: 3\n",
     "autoscaler.yaml:3: max_replicas: need min_replicas <= max_replicas"),
    ("gateway_urls: [gw:9100]\n", r"autoscaler.yaml:1: gateway_urls\[0\]: 'gw:9100' must start with http"),
    ("gateway_urls: [http://g:1]\nscale_down: {select_policy: Sometimes}\n",
     "autoscaler.yaml:2: scale_down.select_policy: 'Sometimes' is not allowed; allowed: Max | Min | Disabled"),
    ("gateway_urls: [http://g:1]\nscale_down: {policies: [], select_policy: Max}\n",
     "autoscaler.yaml:2: scale_down.policies: at least one scaling policy is needed"),
    ("gateway_urls: [http://g:1]\nscale_up: {policies: [{type: Pods, value: 1}]}\n",
     r"autoscaler.yaml:2: scale_up.policies\[0\].period_s: required key is missing"),
    ("gateway_urls: [http://g:1]\nkubernetes: {namespace: Bad_NS}\n",
     "autoscaler.yaml:2: kubernetes.namespace: 'Bad_NS' is not a valid Kubernetes name"),
    ("gateway_urls: [http://g:1]\ntolerance: 1\n", r"tolerance: 1 is out of range; allowed: a number in \[0, 1\)"),
    ("gateway_urls: ['http://gw:abc']\n", r"gateway_urls\[0\]: 'http://gw:abc' is not a URL \(Port could not"),
    ("gateway_urls: ['http://[::1:9100']\n", r"gateway_urls\[0\]: 'http://\[::1:9100' is not a URL"),
    (f"gateway_urls: ['http://{'a' * 70}:9100']\n", r"gateway_urls\[0\]: .* is not a URL .*label too long"),
    ("gateway_urls: ['http://gw name:9100']\n", r"gateway_urls\[0\]: 'http://gw name:9100' names no host"),
    ("gateway_urls: ['http://127.0.0.1:99999']\n", r"gateway_urls\[0\]: .* is not a URL \(Port out of range"),
    ("gateway_urls: [http://g:1]\ngateway_timeout_s: 1e300\n", r"gateway_timeout_s: 1e\+300 is out of range; allowed: a number in \(0, 600\]"),
    ("gateway_urls: [http://g:1]\nkubernetes: {request_timeout_s: 1e300}\n",
     r"kubernetes.request_timeout_s: 1e\+300 is out of range"),
    ("gateway_urls: [http://g:1]\ninterval_s: 1e-300\n", r"interval_s: 1e-300 is out of range; allowed: a number in \[0.1, 3600\]"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("min_replicas: [\n", "not valid YAML"),
])
def test_bad_files_name_file_and_key(tmp_path, text, msg):
    cfg = tmp_path / "autoscaler.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_settings(cfg, {}, {})


def test_bad_env_and_missing_gateway():
    with pytest.raises(ConfigError, match=r"^EDGEWISE_AUTOSCALER__MAXREPLICAS: unknown key \(did you mean "
                                          r"EDGEWISE_AUTOSCALER__MAX_REPLICAS\?\)"):
        load_settings(None, {"gateway_urls": ["http://g:1"]}, {"EDGEWISE_AUTOSCALER__MAXREPLICAS": "3"})
    with pytest.raises(ConfigError, match="^autoscaler settings: gateway_urls: no gateway to poll"):
        load_settings(None, {}, {})
    s = load_settings(None, {}, {"EDGEWISE_AUTOSCALER__GATEWAY_URLS": "http://a:1, http://b:2"})
    assert s.gateway_urls == ("http://a:1", "http://b:2")


def test_partial_sections_keep_their_defaults_and_items_are_addressable():
    s = load_settings(None, ["gateway_urls=http://g:1", "scale_up.policies.1.value=8"], {})
    assert [(p.type, p.value) for p in s.scale_up.policies] == [("Percent", 100), ("Pods", 8)]
    assert s.scale_down == default_scale_down()


def _spawn(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env = {k: v for k, v in env.items() if not k.startswith("EDGEWISE_AUTOSCALER_") and k != "KUBERNETES_SERVICE_HOST"}
    return subprocess.Popen(EDGEWISE + ["--log-level", "INFO", "cloud", "autoscaler"] + args, cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def servers(tmp_path):
    api = ScaleAPI(namespace="prod", name="edgewise-worker", replicas=2, token="s3cret")
    gw = PoolServer(pool_doc(2, 28.0))  # 28 / 20 = 1.4 vs 0.7 -> 4 replicas
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    yield api, gw, token
    api.close()
    gw.close()


def _common(api, gw, token):
    return ["--gateway-url", gw.url, "--namespace", "prod", "--deployment", "edgewise-worker",
            "--target-utilization", "0.7", "--min", "1", "--max", "20", "--interval", "0.2",
            "--api-server", api.url, "--token-file", str(token)]


def test_dry_run_process_prints_decisions_and_sends_no_patch(servers, tmp_path):
    api, gw, token = servers
    p = _spawn(_common(api, gw, token) + ["--dry-run", "--metrics-port", "0"], tmp_path)
    try:
        wait_until(lambda: sum(1 for r in api.requests if r[0] == "GET") >= 3, 20, "3 reads of the scale")
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=15)
    assert p.returncode == 0, err
    assert not [r for r in api.requests if r[0] != "GET"]
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert lines and all(x["dry_run"] and x["from"] == 2 and x["to"] == 4 for x in lines)
    assert api.replicas == 2


def test_live_process_patches_and_exports_metrics(servers, tmp_path):
    api, gw, token = servers
    port = free_port()
    p = _spawn(_common(api, gw, token) + ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"], tmp_path)
    try:
        wait_until(lambda: api.replicas == 4, 20, "the scale-up to 4")
        gw.doc = pool_doc(4, 28.0)  # workers came up: at target, no further change
        reads = sum(1 for r in api.requests if r[0] == "GET")
        wait_until(lambda: sum(1 for r in api.requests if r[0] == "GET") >= reads + 3, 20,
                   "three more decisions at the target")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)  # the chart's liveness
        assert (health.status, health.read()) == (200, b"ok\n")
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=15)
    assert p.returncode == 0, err
    assert api.patches[0] == {"spec": {"replicas": 4}, "metadata": {"resourceVersion": "1"}}
    assert all(b["spec"]["replicas"] == 4 for b in api.patches)
    assert "edgewise_autoscaler_desired_replicas 4.0" in text
    assert 'edgewise_autoscaler_decisions_total{direction="up"} 1.0' in text


def test_sigterm_ends_the_process_while_the_api_server_trickles_its_answer(tmp_path):
    """A trickling API server held the scale read for 76 s with a 2 s request timeout, and the
    process exited 73 s after its SIGTERM (Kubernetes kills it after 30). Now within the timeout."""
    import time

    from tests.listener import TricklingGateway

    slow, gw = TricklingGateway("body", seconds=60.0), PoolServer(pool_doc(2, 28.0))
    token = tmp_path / "token"
    token.write_text("t\n")
    try:
        p = _spawn(["--gateway-url", gw.url, "--namespace", "prod", "--deployment", "edgewise-worker", "--min", "1",
                    "--max", "20", "--interval", "0.2", "--api-server", slow.url, "--token-file", str(token),
                    "--set", "kubernetes.request_timeout_s=1"], tmp_path)
        try:
            wait_until(lambda: slow.connections > 0, 20, "the scale read to reach the trickling server")
        finally:
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            _out, err = p.communicate(timeout=15)
        assert p.returncode == 0, err
        assert time.monotonic() - t0 < 5.0, err
        assert "no answer within kubernetes.request_timeout_s (1 s)" in err
    finally:
        slow.close()
        gw.close()


def test_process_rejects_bad_flags_with_a_message(tmp_path):
    p = _spawn(["--gateway-url", "gw:9100", "--api-server", "http://127.0.0.1:9"], tmp_path)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2 and "--gateway-url: gateway_urls[0]: 'gw:9100' must start with http" in err


def test_example_config_loads_with_hpa_defaults():
    s = load_settings(ROOT / "cloud/autoscaler/autoscaler.example.yaml", {}, {})
    from cloud.autoscaler.scaling import default_scale_up

    assert s.scale_up == default_scale_up() and s.scale_down == default_scale_down()
    sc = s.scaler_config()
    assert sc.target_load == DEFAULT_TARGET_LOAD and sc.target_utilization is None and s.max_replicas == 20


def test_a_token_file_the_rotation_would_refuse_is_refused_at_the_start_too(tmp_path):
    """The start took an empty token file as the token '' and a non-UTF-8 one was a traceback,
    while the rotation refused both (found by a probe): one rule, ``kubeclient.read_token_file``."""
    token = tmp_path / "token"
    flags = {"gateway_urls": ["http://g:1"], "kubernetes.token_file": str(token)}
    for data, why in ((b"", "it is empty"), (b"\xff\xfe tok", "not UTF-8"), (None, "named pipe")):
        if data is None:
            token.unlink()
            os.mkfifo(token)
        else:
            token.write_bytes(data)
        with pytest.raises(ConfigError, match=rf"kubernetes.token_file {token}: cannot read it \(.*{why}"):
            load_settings(None, flags, environ={})
    token.unlink()
    token.write_text(" secret\n")
    assert load_settings(None, flags, environ={}).kubernetes.token == "secret"
