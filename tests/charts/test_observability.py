"""The chart's SLO alerts and Grafana dashboard against Prometheus and the real processes.

* ``promtool check rules`` on the rendered PrometheusRule, and on every dashboard query
  (as recording rules) so a typo in PromQL fails here;
* ``promtool test rules``: each alert fires on the situation it names and not on a
  neighbouring release, namespace or job (two releases share one Prometheus); the KEDA
  query and the Prometheus Adapter rule of docs/install-cloud.md count this release only;
* every metric name the dashboard, the rules and the autoscaling queries use is one the
  processes export: a real worker, gateway, autoscaler and edge daemon are started, an
  edge escalates through the gateway, and their ``/metrics`` are scraped.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Set

import pytest
import yaml

from cloud.local import LocalCloud, cli_command
from tests.charts.helm import MODES, NAMESPACE, RELEASE, by_kind, named, render
from tests.cloud.autoscaler.servers import ScaleAPI
from tests.conftest import free_port
from tests.docs.test_guide import yaml_blocks
from tests.edge.helpers import policy_yaml, settings_yaml

OURS = f'namespace="{NAMESPACE}",app_kubernetes_io_instance="{RELEASE}"'
OTHER_RELEASE = f'namespace="{NAMESPACE}",app_kubernetes_io_instance="other"'
#: Series Prometheus makes itself, not the processes (scrape health of a target).
PROMETHEUS_OWN = {"up"}
#: Grafana variables as a query would see them.
GRAFANA_VARS = {"$__rate_interval": "5m", "$namespace": NAMESPACE, "$release": RELEASE,
                "$edge_job": "edgewise-edge", "$device": ".*"}


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not installed: `make system-deps` installs Debian's prometheus package")
    return str(exe)


def _rules() -> List[Dict[str, Any]]:
    return list(by_kind(render(*MODES["observability"]), "PrometheusRule")[0]["spec"]["groups"])


def _dashboard() -> Dict[str, Any]:
    cm = named(render(*MODES["observability"]), "ConfigMap", "dashboard")
    return dict(json.loads(cm["data"]["edgewise.json"]))


def _dashboard_targets() -> Iterator[Dict[str, Any]]:
    def panels(items: List[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(_dashboard()["panels"]):
        yield from p.get("targets", [])


def _dashboard_queries() -> Iterator[str]:
    for t in _dashboard_targets():
        yield str(t["expr"])


def _grafana(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def _keda_query() -> str:
    return str(by_kind(render(*MODES["keda"]), "ScaledObject")[0]["spec"]["triggers"][0]["metadata"]["query"])


def _adapter_query() -> str:
    """The Prometheus Adapter rule of docs/install-cloud.md, as the adapter expands it for the
    chart's HPA (its selector plus the HPA's namespace)."""
    rules = [yaml.safe_load(text) for page, text in yaml_blocks()
             if page == "install-cloud.md" and "externalRules" in text]
    assert len(rules) == 1, "docs/install-cloud.md: one Prometheus Adapter externalRules example"
    rule = rules[0]["externalRules"][0]
    hpa = by_kind(render(*MODES["hpa"]), "HorizontalPodAutoscaler")[0]["spec"]["metrics"][0]["external"]["metric"]
    assert rule["name"]["as"] == hpa["name"]
    matchers = ",".join([f'namespace="{NAMESPACE}"'] + [f'{k}="{v}"' for k, v in hpa["selector"]["matchLabels"].items()])
    return str(rule["metricsQuery"]).replace("<<.LabelMatchers>>", matchers)


# --------------------------------------------------------------------------- PromQL names

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                 "offset", "inf", "nan"}


def metric_names(expr: str) -> Set[str]:
    """Metric names a PromQL expression reads (functions, keywords, labels and strings removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", e):
        if m.group(2) is None and m.group(1) not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def test_metric_names_reads_only_metrics() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, transport) (rate(a_bucket{x="y(z)"}[5m]))) > 0.5') \
        == {"a_bucket"}
    assert metric_names("sum(a{n=\"1\"}) / on (namespace) group_left sum(b) and up == bool 0") == {"a", "b", "up"}


# --------------------------------------------------------------------------- promtool

def _write_rules(tmp_path: Path, groups: List[Dict[str, Any]]) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def _check(path: Path) -> None:
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    groups = _rules()
    _check(_write_rules(tmp_path, groups))
    assert sum(len(g["rules"]) for g in groups) >= 6


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    queries = list(_dashboard_queries())
    assert len(queries) >= 20
    rules = [{"record": f"dashboard:query_{i}", "expr": _grafana(q)} for i, q in enumerate(queries)]
    _check(_write_rules(tmp_path, [{"name": "dashboard", "rules": rules}]))


SLOW = {"0.1": 0, "0.5": 10, "1": 100, "+Inf": 100}       # p99 ~ 0.99 s
FAST = {"0.1": 10000, "0.5": 10000, "1": 10000, "+Inf": 10000}


def _series(name: str, labels: str, values: str) -> Dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def _hist(name: str, labels: str, buckets: Dict[str, int]) -> List[Dict[str, str]]:
    return [_series(f"{name}_bucket", f'{labels},le="{le}"', f"0+{n}x20") for le, n in buckets.items()]


def _alert_expr(groups: List[Dict[str, Any]], alert: str) -> str:
    return next(str(r["expr"]) for g in groups for r in g["rules"] if r.get("alert") == alert)


def test_alerts_fire_for_this_release_only(tmp_path: Path) -> None:
    groups = _rules()
    edge, other_job = 'job="edgewise-edge"', 'job="node"'
    series = [
        *_hist("edgewise_gateway_request_seconds", OURS + ',outcome="OK"', SLOW),
        *_hist("edgewise_gateway_request_seconds", OTHER_RELEASE + ',outcome="OK"', FAST),  # would hide ours
        _series("edgewise_gateway_requests_total", OURS, "0+100x20"),
        _series("edgewise_gateway_rejected_total", OURS + ',reason="saturated"', "0+10x20"),
        _series("edgewise_gateway_requests_total", OTHER_RELEASE, "0+10000x20"),
        # of our 100 + 30 requests a minute, 30 expired (answered DEADLINE_EXCEEDED): 23%
        _series("edgewise_gateway_requests_total", OURS + ',status="DEADLINE_EXCEEDED"', "0+30x20"),
        _series("edgewise_gateway_requests_total", OTHER_RELEASE + ',status="DEADLINE_EXCEEDED"', "0x20"),
        *[_series("edgewise_gateway_worker_ejected", f'{OURS},pod="gw-0",worker="{w}"', "1x20") for w in "ab"],
        _series("edgewise_gateway_worker_ejected", f'{OURS},pod="gw-1",worker="a"', "1x20"),
        _series("edgewise_gateway_worker_ejected", f'{OURS},pod="gw-1",worker="b"', "0x20"),
        _series("edgewise_gateway_worker_ejected", f'{OTHER_RELEASE},pod="gw-9",worker="a"', "1x20"),
        # every answer of gw-0's two workers is INTERNAL, while only one of them is ejected at a time
        # (max_ejection_percent); gw-1's workers answer OK but for a client's own mistakes
        *[_series("edgewise_gateway_worker_picks_total", f'{OURS},pod="gw-{g}",worker="{w}"', "0+30x20")
          for g in "01" for w in "ab"],
        *[_series("edgewise_gateway_worker_errors_total", f'{OURS},pod="gw-0",worker="{w}",status="INTERNAL"',
                  "0+30x20") for w in "ab"],
        _series("edgewise_gateway_worker_errors_total", f'{OURS},pod="gw-1",worker="a",status="INVALID_ARGUMENT"',
                "0+30x20"),
        _series("edgewise_gateway_worker_picks_total", f'{OTHER_RELEASE},pod="gw-9",worker="a"', "0+30x20"),
        _series("edgewise_gateway_worker_errors_total", f'{OTHER_RELEASE},pod="gw-9",worker="a",status="INTERNAL"',
                "0+30x20"),
        *_hist("edgewise_edge_cloud_rtt_seconds", edge + ',instance="a",transport="grpc"', SLOW),
        *_hist("edgewise_edge_cloud_rtt_seconds", edge + ',instance="a",transport="mqtt"', FAST),
        *_hist("edgewise_edge_cloud_rtt_seconds", other_job + ',instance="n",transport="grpc"', SLOW),
        _series("edgewise_edge_spool_depth", edge + ',instance="a"', "0+5x20"),
        _series("edgewise_edge_spool_depth", edge + ',instance="b"', "10x20"),
        _series("edgewise_edge_spool_depth", edge + ',instance="c"', "0x20"),
        # at its cap (spool.max_bytes): flat, dropping the oldest, still cut off from the cloud
        _series("edgewise_edge_spool_depth", edge + ',instance="d"', "90x20"),
        _series("edgewise_edge_spool_events_total", edge + ',instance="d",event="evicted"', "0+120x20"),
        _series("edgewise_edge_spool_events_total", edge + ',instance="b",event="evicted"', "7x20"),  # long ago
        _series("edgewise_edge_spool_depth", other_job + ',instance="n"', "0+5x20"),
        _series("up", edge + ',instance="a"', "0x20"),
        _series("up", edge + ',instance="b"', "1x20"),
        _series("up", other_job + ',instance="n"', "0x20"),
        # at 18 min: gw-0's certificate ends in 3 days, gw-1's in 30, another release's in 1
        _series("edgewise_gateway_tls_certificate_expiry_timestamp_seconds", f'{OURS},pod="gw-0"', f"{1080 + 3 * 86400}x20"),
        _series("edgewise_gateway_tls_certificate_expiry_timestamp_seconds", f'{OURS},pod="gw-1"', f"{1080 + 30 * 86400}x20"),
        _series("edgewise_gateway_tls_certificate_expiry_timestamp_seconds", f'{OTHER_RELEASE},pod="gw-9"',
                f"{1080 + 86400}x20"),
        *[_series("edgewise_worker_in_flight", f'{OURS},pod="w{i}"', "1x20") for i in range(2)],
        *[_series("edgewise_worker_capacity_images_per_second", f'{OURS},pod="w{i}"', "4x20") for i in range(2)],
        _series("edgewise_worker_in_flight", OTHER_RELEASE + ',pod="x"', "50x20"),
        _series("edgewise_worker_capacity_images_per_second", OTHER_RELEASE + ',pod="x"', "10x20"),
    ]
    fires = {  # alert -> the series it must fire for (labels after aggregation)
        "EdgewiseEscalatedP99OverSLO": ["{}"],
        "EdgewiseRejectionRatioHigh": ["{}"],
        "EdgewiseDeadlinesMissed": ["{}"],
        "EdgewiseAllWorkersEjected": [f'{{namespace="{NAMESPACE}",pod="gw-0"}}'],
        "EdgewiseWorkersFailing": [f'{{namespace="{NAMESPACE}",pod="gw-0"}}'],
        "EdgewiseGatewayCertificateExpiresSoon": [f'{{namespace="{NAMESPACE}",pod="gw-0"}}'],
        "EdgewiseEdgeCloudP99OverSLO": ['{transport="grpc"}'],
        "EdgewiseSpoolBacklogGrowing": ['{instance="a",job="edgewise-edge"}', '{instance="d",job="edgewise-edge"}'],
        "EdgewiseEdgeOffline": ['{instance="a",job="edgewise-edge"}'],
    }
    tests = [{"expr": f"({_alert_expr(groups, alert)}) * 0 + 1", "eval_time": "18m",
              "exp_samples": [{"labels": labels, "value": 1} for labels in expected]}
             for alert, expected in fires.items()]
    # in-flight per capacity of this release: (1 + 1) / (4 + 4), not (2 + 50) / (8 + 10)
    for query in (_keda_query(), _adapter_query()):
        tests.append({"expr": query, "eval_time": "18m", "exp_samples": [{"labels": "{}", "value": 0.25}]})
    _promtool_test(tmp_path, series, tests, groups)


def _dashboard_query(legend: str) -> str:
    """The query of the dashboard target drawn as ``legend``, with the Grafana variables filled in."""
    exprs = [str(t["expr"]) for t in _dashboard_targets() if t.get("legendFormat") == legend]
    assert len(exprs) == 1, f"one dashboard target drawn as {legend!r}: {exprs}"
    return _grafana(exprs[0])


def _promtool_test(tmp_path: Path, series: List[Dict[str, str]], tests: List[Dict[str, Any]],
                   groups: Sequence[Dict[str, Any]] = ()) -> None:
    rules = _write_rules(tmp_path, list(groups))
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": tests}]}, sort_keys=False))
    out = subprocess.run([promtool(), "test", "rules", spec.name], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_escalated_share_counts_a_replayed_escalation_once(tmp_path: Path) -> None:
    # 100 frames a minute, 20 escalations answered at once and 10 spooled, whose replays are
    # answered (late) as the spool drains: 30 of 100 frames were escalated, not 40.
    edge = 'job="edgewise-edge",instance="a"'
    series = [
        _series("edgewise_edge_frames_total", edge + ',stream="cam"', "0+100x20"),
        _series("edgewise_edge_escalations_total", edge + ',reason="hard",outcome="ok"', "0+20x20"),
        _series("edgewise_edge_escalations_total", edge + ',reason="hard",outcome="spooled"', "0+10x20"),
        _series("edgewise_edge_escalations_total", edge + ',reason="hard",outcome="late"', "0+10x20"),
    ]
    _promtool_test(tmp_path, series, [{"expr": _dashboard_query("escalated share"), "eval_time": "18m",
                                       "exp_samples": [{"labels": "{}", "value": 0.3}]}])


def test_an_edge_whose_escalations_time_out_is_alerted_on_though_its_p99_cannot_be(tmp_path: Path) -> None:
    """``edgewise_edge_cloud_rtt_seconds`` holds answered escalations only, and an answer later
    than the policy's ``deadlineMs`` is none: with the default policy (500 ms) and SLO (0.5 s) its
    p99 stays at or under the SLO however many escalations time out on the way (a slow or lossy
    uplink the gateway never sees). Device a: 40% of its escalations time out and spool (their
    replays are answered late), its answered round trips all within 0.5 s; device b: 1%."""
    groups = _rules()
    edge, other_job = 'job="edgewise-edge"', 'job="node"'
    just_in_time = {"0.1": 0, "0.25": 20, "0.5": 60, "1": 60, "+Inf": 60}
    series = [
        *_hist("edgewise_edge_cloud_rtt_seconds", edge + ',instance="a",transport="grpc"', just_in_time),
        _series("edgewise_edge_escalations_total", edge + ',instance="a",reason="hard",outcome="ok"', "0+60x20"),
        _series("edgewise_edge_escalations_total", edge + ',instance="a",reason="hard",outcome="spooled"', "0+40x20"),
        _series("edgewise_edge_escalations_total", edge + ',instance="a",reason="hard",outcome="late"', "0+40x20"),
        _series("edgewise_edge_escalations_total", edge + ',instance="b",reason="hard",outcome="ok"', "0+99x20"),
        _series("edgewise_edge_escalations_total", edge + ',instance="b",reason="hard",outcome="spooled"', "0+1x20"),
        _series("edgewise_edge_escalations_total", edge + ',instance="c",reason="hard",outcome="ok"', "0x20"),  # idle
        _series("edgewise_edge_escalations_total", other_job + ',instance="n",reason="hard",outcome="spooled"',
                "0+40x20"),
    ]
    tests = [{"expr": f"({_alert_expr(groups, alert)}) * 0 + 1", "eval_time": "18m",
              "exp_samples": [{"labels": labels, "value": 1} for labels in expected]}
             for alert, expected in {"EdgewiseEdgeCloudP99OverSLO": [],
                                     "EdgewiseEdgeEscalationsFailing": ['{instance="a",job="edgewise-edge"}']}.items()]
    # (the docs' query names no job: it reads every job's devices, the other job's n too)
    tests.append({"expr": f"({_doc_alert('Escalations failing')}) * 0 + 1", "eval_time": "18m",
                  "exp_samples": [{"labels": '{instance="a",job="edgewise-edge"}', "value": 1},
                                  {"labels": '{instance="n",job="node"}', "value": 1}]})
    _promtool_test(tmp_path, series, tests, groups)


def _doc_alert(name: str) -> str:
    """The expression of one row of docs/metrics.md's "What to alert on" table."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    rows = re.findall(rf"^\| {re.escape(name)} \| `([^`]+)`", text, re.M)
    assert len(rows) == 1, f"docs/metrics.md: one alert row named {name!r}"
    return str(rows[0])


def test_no_serving_worker_fires_when_the_workers_are_gone(tmp_path: Path) -> None:
    # serving for 5 minutes, not serving for 5, then killed: no series at all (a SIGKILLed
    # worker on a real Prometheus left sum(edgewise_worker_serving) == 0 empty, never firing)
    series = [_series("edgewise_worker_serving", OURS + ',pod="w0"', "1x5 0x5 _x10")]
    expr = _doc_alert("No serving worker")
    _promtool_test(tmp_path, series, [
        {"expr": expr, "eval_time": "3m", "exp_samples": []},
        {"expr": expr, "eval_time": "8m", "exp_samples": [{"labels": "{}", "value": 1}]},
        {"expr": expr, "eval_time": "18m", "exp_samples": [{"labels": "{}", "value": 1}]},
    ])


# --------------------------------------------------------------------------- against the processes

def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def _families(text: str) -> Dict[str, Set[str]]:
    """Family name -> the sample names Prometheus stores for it (counters _total, histograms
    _bucket/_sum/_count), from the TYPE lines too, so a labelled family with no series yet counts."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Dict[str, Set[str]] = {}
    for fam in text_string_to_metric_families(text):
        names = {s.name for s in fam.samples}
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "summary": ("", "_sum", "_count")}.get(fam.type, ("",))
        out[fam.name] = names | {fam.name + s for s in suffixes}
    return out


def _wait(cond: Any, timeout: float, what: str, procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except OSError:
            pass
        for p in procs:
            assert p.poll() is None, f"a process exited ({p.returncode}) while waiting for {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def exported(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Dict[str, Set[str]]]:
    """Process -> its metric families, scraped from a real worker, gateway, autoscaler and edge
    daemon while the edge escalates every frame through the gateway."""
    tmp = tmp_path_factory.mktemp("scrape")
    worker_port, edge_port, autoscaler_port = free_port(), free_port(), free_port()
    api = ScaleAPI(namespace=NAMESPACE, name=f"{RELEASE}-edgewise-worker", replicas=1, token="t")
    (tmp / "token").write_text("t\n")
    procs: List[subprocess.Popen[bytes]] = []
    stack = contextlib.ExitStack()
    try:
        with LocalCloud(tiny_model, workers=1, worker_args=["--metrics-port", str(worker_port)]) as cloud:
            policy = tmp / "policy.yaml"
            policy.write_text(policy_yaml("all", {"cam": "always"}, deadline_ms=5000))
            edge_cfg = settings_yaml(
                tmp / "edge.yaml", device_id="jet", policy_file=str(policy),
                streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 5}],
                model={"path": str(tiny_model), "max_batch": 1}, cloud={"endpoints": [cloud.address]},
                spool={"path": str(tmp / "spool.db")}, sinks={"jsonl": str(tmp / "out.jsonl")},
                metrics={"host": "127.0.0.1", "port": edge_port})
            env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}
            log = stack.enter_context(open(tmp / "procs.log", "ab"))
            procs.append(subprocess.Popen(cli_command("edge", "run", "--config", str(edge_cfg)),
                                          stdout=log, stderr=log, env={**cloud.env, **env}))
            procs.append(subprocess.Popen(cli_command(
                "cloud", "autoscaler", "--gateway-url", f"http://127.0.0.1:{cloud.metrics_port}",
                "--namespace", NAMESPACE, "--deployment", f"{RELEASE}-edgewise-worker", "--api-server", api.url,
                "--token-file", str(tmp / "token"), "--dry-run", "--interval", "0.5",
                "--metrics-host", "127.0.0.1", "--metrics-port", str(autoscaler_port)),
                stdout=log, stderr=log, env={**cloud.env, **env}))
            edge_url = f"http://127.0.0.1:{edge_port}/metrics"
            _wait(lambda: re.search(r'edgewise_edge_escalations_total\{[^}]*outcome="ok"[^}]*\} [3-9]',
                                    _get(edge_url)), 120, "three escalations answered by the cloud", procs)
            _wait(lambda: "edgewise_autoscaler_desired_replicas 1.0" in
                  _get(f"http://127.0.0.1:{autoscaler_port}/metrics"), 60, "an autoscaler decision", procs)
            return {
                "edge": _families(_get(edge_url)),
                "gateway": _families(cloud.metrics_text()),
                "worker": _families(_get(f"http://127.0.0.1:{worker_port}/metrics")),
                "autoscaler": _families(_get(f"http://127.0.0.1:{autoscaler_port}/metrics")),
            }
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        api.close()
        stack.close()


def _sample_names(exported: Dict[str, Dict[str, Set[str]]]) -> Set[str]:
    return set().union(*(names for fams in exported.values() for names in fams.values()))


#: Exported by a gateway that serves TLS only (the scraped one does not): its own test reads it
#: (tests/cloud/gateway/test_tls_reload.py).
TLS_ONLY = {"edgewise_gateway_tls_certificate_expiry_timestamp_seconds"}


def test_every_metric_the_dashboard_and_rules_read_is_exported(exported: Dict[str, Dict[str, Set[str]]]) -> None:
    valid = _sample_names(exported) | PROMETHEUS_OWN | TLS_ONLY
    used: Dict[str, Set[str]] = {
        "dashboard": set().union(*(metric_names(q) for q in _dashboard_queries())),
        "dashboard variables": set(re.findall(r"label_values\((\w+)", json.dumps(_dashboard()["templating"]))),
        "rules": set().union(*(metric_names(str(r["expr"])) for g in _rules() for r in g["rules"])),
        "rule annotations": set(re.findall(r"\bedgewise_[a-z0-9_]+", json.dumps(
            [r.get("annotations") for g in _rules() for r in g["rules"]]))),
        "keda query": metric_names(_keda_query()),
        "adapter rule": metric_names(_adapter_query()),
    }
    bad = {where: sorted(names - valid) for where, names in used.items() if names - valid}
    assert not bad, f"names no process exports (scraped: {sorted(exported)}): {bad}"


def test_the_dashboard_shows_every_slo_signal(exported: Dict[str, Dict[str, Set[str]]]) -> None:
    read = set().union(*(metric_names(q) for q in _dashboard_queries()))
    for family in ("edgewise_edge_escalations", "edgewise_edge_frames", "edgewise_gateway_rejected",
                   "edgewise_gateway_worker_ejections", "edgewise_edge_uplink_bytes"):
        assert f"{family}_total" in read, family
    for name in ("edgewise_edge_cloud_rtt_seconds_bucket", "edgewise_gateway_request_seconds_bucket",
                 "edgewise_worker_request_seconds_bucket", "edgewise_worker_queue_wait_seconds_bucket",
                 "edgewise_worker_in_flight", "edgewise_worker_capacity_images_per_second",
                 "edgewise_autoscaler_desired_replicas", "edgewise_autoscaler_current_replicas",
                 "edgewise_edge_spool_depth"):
        assert name in read, name
    # the edge's uplink counter is real: bytes were counted for the escalations the test made
    assert "edgewise_edge_uplink_bytes_total" in exported["edge"]["edgewise_edge_uplink_bytes"]


def test_processes_export_build_info_and_no_created_series(exported: Dict[str, Dict[str, Set[str]]]) -> None:
    """Already on main (edgewise/observability.py); checked here on the scraped processes."""
    for process, fams in exported.items():
        assert "edgewise_build_info" in fams and "process_cpu_seconds" in fams, process
        assert not [n for names in fams.values() for n in names if n.endswith("_created")], process
