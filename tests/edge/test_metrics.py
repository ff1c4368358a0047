"""The edge's metrics/health HTTP endpoint under abuse: a burst of half-open
connections does not delay a scrape, clients that reset are not tracebacks, and a
port already in use is one clear error naming it."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import struct
import threading
import time
import urllib.request

import pytest

from edge.metrics import EdgeMetrics, MetricsServer
from edgewise.errors import ConfigError
from tests.waiting import wait_until


def serve():
    server = MetricsServer(EdgeMetrics(), lambda: (True, {"status": "ok"}), "127.0.0.1", 0)
    server.start()
    return server


@contextlib.contextmanager
def served():
    server = serve()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def idle_clients(server, n: int):
    """``n`` connections to ``server`` that say nothing; all closed after."""
    idle: list = []
    try:
        for _ in range(n):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        yield idle
    finally:
        for s in idle:
            s.close()


def get(server, path: str) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10).read()


def test_200_half_open_connections_do_not_delay_a_scrape_and_resets_are_quiet(caplog):
    caplog.set_level(logging.DEBUG, logger="edge.metrics")
    with served() as server:
        t0 = time.monotonic()
        with idle_clients(server, 200) as idle:  # connect and say nothing
            connected_s = time.monotonic() - t0
            t0 = time.monotonic()
            body = get(server, "/metrics")
            scrape_s = time.monotonic() - t0
            assert b"edgewise_edge_frames" in body or b"edgewise_build_info" in body
            for s in idle[:50]:  # these reset mid-request
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            assert b'"ok"' in get(server, "/healthz")
    assert connected_s < 5 and scrape_s < 2, (connected_s, scrape_s)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text


def test_a_metrics_port_in_use_is_one_config_error():
    taken = serve()
    try:
        with pytest.raises(ConfigError) as ei:
            MetricsServer(EdgeMetrics(), lambda: (True, {}), "127.0.0.1", taken.port)
    finally:
        taken.stop()
    msg = str(ei.value)
    assert f"metrics.port {taken.port} on 127.0.0.1 is already in use" in msg and "\n" not in msg


def test_reconnects_are_counted_per_stream_from_the_source_states():
    """A ``connecting`` after any earlier state is a reconnect; the first one is not, nor is
    the back-off of a run of corrupt frames (streaming again without a new connection)."""
    from prometheus_client import CollectorRegistry

    from edge.sources.base import SourceState as S

    m = EdgeMetrics(CollectorRegistry())
    for state in (S.CONNECTING, S.STREAMING, S.BACKOFF, S.STREAMING, S.BACKOFF, S.CONNECTING,
                  S.BACKOFF, S.CONNECTING, S.STREAMING, S.ENDED):
        m.set_source_state("a", state)
    m.set_source_state("b", S.CONNECTING)
    m.set_source_state("b", S.STREAMING)
    value = m.registry.get_sample_value
    assert value("edgewise_edge_source_reconnects_total", {"stream": "a"}) == 2
    assert value("edgewise_edge_source_reconnects_total", {"stream": "b"}) is None


def test_connections_beyond_the_cap_are_closed_and_take_no_thread(monkeypatch):
    """A thread per connection, without bound: slow clients held a thread each, and enough of
    them would use up the unit's TasksMax, after which no camera could start its reader thread
    (found by a probe). Past the cap a connection is closed on arrival; the slots come back
    when the held ones end."""
    import edge.metrics as M

    monkeypatch.setattr(M, "HTTP_MAX_CONNECTIONS", 8)
    with served() as server:
        before = threading.active_count()
        with idle_clients(server, 20) as held:
            wait_until(lambda: server.httpd.refused == 12, 10, "the connections past the cap refused")
            assert threading.active_count() - before <= 8
            for s in held:
                s.close()
            wait_until(lambda: threading.active_count() <= before, 10, "the held connections' threads ended")
            assert b"edgewise_" in get(server, "/metrics")


def test_counters_alerts_read_with_increase_start_at_zero():
    # A series that first appears at 1 has no increase() in Prometheus: a daemon's first refused
    # policy reload never fired increase(...{result="refused"}[15m]) > 0 on a real Prometheus.
    from pathlib import Path

    from prometheus_client import generate_latest

    from edge.metrics import RELOAD_RESULTS, SPOOL_EVENTS

    text = generate_latest(EdgeMetrics().registry).decode()
    for result in ("ok", "refused", "error"):
        assert f'edgewise_edge_policy_reloads_total{{result="{result}"}} 0.0' in text
    for event in ("put", "refused", "evicted", "expired", "rejected", "disk_full", "write_failed", "corrupt"):
        assert f'edgewise_edge_spool_events_total{{event="{event}"}} 0.0' in text
    # every label value the daemon counts is one exported from the start
    source = "".join(p.read_text() for p in Path(__file__).resolve().parents[2].joinpath("edge").rglob("*.py"))
    used = set(re.findall(r'spool_events\.labels\("(\w+)"\)', source))
    assert used and used <= set(SPOOL_EVENTS), used - set(SPOOL_EVENTS)
    used = set(re.findall(r'reloads\.labels\("(\w+)"\)', source))
    assert used and used <= set(RELOAD_RESULTS), used - set(RELOAD_RESULTS)


def test_escalations_start_at_zero_with_every_reason_and_outcome():
    """Their series appeared at the first escalation of each reason and outcome, at 1, which has
    no increase() or rate() in Prometheus: the first escalations a dead cloud made the daemon
    spool or drop showed nowhere in ``sum by (outcome) (rate(edgewise_edge_escalations_total[5m]))``."""
    from pathlib import Path

    from prometheus_client import generate_latest

    text = generate_latest(EdgeMetrics().registry).decode()
    outcomes = ("ok", "spooled", "late", "edge_only", "dropped", "error")
    for reason in ("hard", "always", "audit"):
        for outcome in outcomes:
            assert f'edgewise_edge_escalations_total{{outcome="{outcome}",reason="{reason}"}} 0.0' in text \
                or f'edgewise_edge_escalations_total{{reason="{reason}",outcome="{outcome}"}} 0.0' in text, \
                (reason, outcome)
    # every outcome the daemon counts is one exported from the start (the spool's: record.outcome)
    source = Path(__file__).resolve().parents[2].joinpath("edge", "escalating.py").read_text()
    used = set(re.findall(r'escalations\.labels\([^,()]+, "(\w+)"\)', source))
    used |= set(re.findall(r'record\.outcome = "(\w+)"', source)) - {"cloud"}  # "cloud" is counted as "ok"
    assert used and used <= set(outcomes), used - set(outcomes)


def test_a_followed_stream_has_every_drop_reason_the_daemon_counts_at_zero():
    """``rate(edgewise_edge_dropped_total{reason="queue_full"}[5m]) > 0`` missed a stream's first
    drops: its series appeared at 1. Every reason the code names is one exported from the start."""
    from pathlib import Path

    from edge.metrics import DROP_REASONS

    m = EdgeMetrics()
    m.follow_stream("cam")
    m.follow_transport("grpc")
    value = m.registry.get_sample_value
    for reason in DROP_REASONS:
        assert value("edgewise_edge_dropped_total", {"stream": "cam", "reason": reason}) == 0, reason
    for name in ("frames", "corrupt_frames", "truncated_videos", "source_skipped_frames", "source_reconnects"):
        assert value(f"edgewise_edge_{name}_total", {"stream": "cam"}) == 0, name
    assert value("edgewise_edge_frame_age_seconds_count", {"stream": "cam"}) == 0
    assert value("edgewise_edge_cloud_rtt_seconds_count", {"transport": "grpc"}) == 0
    assert value("edgewise_edge_uplink_bytes_total", {"transport": "grpc"}) == 0
    source = "".join(p.read_text() for p in Path(__file__).resolve().parents[2].joinpath("edge").rglob("*.py"))
    used = set(re.findall(r'drops\.labels\([^,()]+, "(\w+)"\)', source))
    assert used and used <= set(DROP_REASONS), used - set(DROP_REASONS)


def test_an_ipv6_host_is_served_on_ipv6():
    """``metrics.host: "::1"`` (an IPv6-only network) was refused at the start: the server was
    IPv4 only ("cannot listen (Address family for hostname not supported)")."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server = MetricsServer(EdgeMetrics(), lambda: (True, {"status": "ok"}), "::1", 0)
    server.start()
    try:
        body = urllib.request.urlopen(f"http://[::1]:{server.port}/healthz", timeout=10).read()
        assert b'"status": "ok"' in body
    finally:
        server.stop()


def test_the_ipv6_wildcard_serves_ipv4_too_where_the_kernel_binds_ipv6_only(monkeypatch):
    """``metrics.host: "::"`` answers both families (docs/metrics.md), but only by the kernel's
    default: with ``net.ipv6.bindv6only=1`` an AF_INET6 socket starts IPv6-only, and IPv4
    scrapers were refused. Simulated here: every new AF_INET6 socket starts IPv6-only."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")

    class V6OnlySocket(socket.socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            super().__init__(family, type, proto, fileno)
            if fileno is None and self.family == socket.AF_INET6:
                self.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)

    monkeypatch.setattr(socket, "socket", V6OnlySocket)
    server = MetricsServer(EdgeMetrics(), lambda: (True, {"status": "ok"}), "::", 0)
    server.start()
    try:
        for url in (f"http://127.0.0.1:{server.port}/healthz", f"http://[::1]:{server.port}/healthz"):
            assert b'"status": "ok"' in urllib.request.urlopen(url, timeout=10).read(), url
    finally:
        server.stop()


#: A metrics server in a process of its own, its open-file limit lowered to the descriptors it
#: holds: it says "limited", and, told "go", spends 1.5 s at the limit, says the CPU time it
#: used meanwhile, raises the limit again and serves on until told "stop".
_AT_THE_FD_LIMIT = """
import logging, os, resource, sys, time
from edge.metrics import EdgeMetrics, MetricsServer
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
server = MetricsServer(EdgeMetrics(), lambda: (True, {"status": "ok"}), "127.0.0.1", 0)
server.start()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print(server.port, flush=True)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, hard))  # less the listing's own
print("limited", flush=True)
sys.stdin.readline()
cpu = time.process_time()
time.sleep(1.5)
print(time.process_time() - cpu, flush=True)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
sys.stdin.readline()
server.stop()
"""


def test_at_the_open_file_limit_the_server_waits_says_why_and_serves_once_descriptors_free():
    """A connection the server cannot accept (EMFILE: the process is at its open-file limit)
    stays in the listen queue, so the socket is readable again at once: socketserver's loop
    retried ``accept`` without a pause, a thread at 100% CPU beside the pipeline's, and said
    nothing (found by a probe: the daemon went from 30% to 118% CPU). Now it says why, waits
    between tries, and serves the waiting scraper once descriptors are free."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with subprocess.Popen([sys.executable, "-c", _AT_THE_FD_LIMIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root))) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            port = int(child.stdout.readline())
            assert child.stdout.readline().strip() == "limited"
            with socket.create_connection(("127.0.0.1", port), timeout=10) as scraper:  # queued, not accepted
                child.stdin.write("go\n")
                child.stdin.flush()
                cpu = float(child.stdout.readline())
                assert cpu < 0.2, f"{cpu:.2f} s of CPU in 1.5 s at the open-file limit"
                scraper.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                with scraper.makefile("rb") as answer:
                    assert b'"status": "ok"' in answer.read()
            _, said = child.communicate("stop\n", timeout=20)
            assert "open-file limit" in said
        finally:
            child.kill()


def test_a_connection_no_thread_can_be_started_for_is_closed_and_said_once_without_a_traceback(monkeypatch,
                                                                                                 caplog):
    """At the thread limit (TasksMax, a container's pids.max) ``Thread.start`` raises
    RuntimeError: each scrape was logged as a failed request with its traceback (found by a
    probe: pids.max at the daemon's thread count). Now the connection is closed, counted in
    ``refused`` and said once a minute; once threads can start again, scrapes are served."""
    real_start = threading.Thread.start

    def at_the_limit(thread: threading.Thread) -> None:
        if thread.name.startswith("Thread-"):  # socketserver's per-connection thread
            raise RuntimeError("can't start new thread")
        real_start(thread)

    caplog.set_level(logging.WARNING, "edge.metrics")
    with served() as server:
        monkeypatch.setattr(threading.Thread, "start", at_the_limit)
        for _ in range(3):
            with pytest.raises(OSError):  # closed without an answer
                get(server, "/healthz")
        monkeypatch.undo()
        assert server.httpd.refused == 3
        assert b'"status": "ok"' in get(server, "/healthz")
    said = [r for r in caplog.records if r.name == "edge.metrics"]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and "thread limit" in said[0].getMessage(), said
    assert said[0].exc_info is None
