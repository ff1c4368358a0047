"""The big one, with real processes and real signals: the cloud is killed mid-run,
escalations are spooled, the daemon is ``kill -9``'d, restarted while the cloud is
still down, the cloud comes back, and every spooled escalation reaches the sink
exactly once (by idempotency key), marked late. Then SIGTERM stops the daemon
cleanly. The daemon runs as ``edgewise edge run``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tests.conftest import free_port
from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml

ROOT = Path(__file__).resolve().parents[2]


def edgewise_cmd():
    exe = Path(sys.executable).parent / "edgewise"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "edgewise.cli"]


def start_cloud(port: int, model: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(ROOT / "tests" / "edge" / "cloudstub.py"), "--port", str(port),
                          "--model", str(model)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    line = p.stdout.readline().decode()
    assert line.startswith("READY"), p.stderr.read().decode()
    return p


def start_daemon(config: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.Popen(edgewise_cmd() + ["edge", "run", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"), cwd=ROOT, env=env)


def wait_for(pred, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        for p in procs:
            assert p.poll() is None, f"process exited early ({p.returncode}) while waiting for {what}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def key(r):
    return f"{r['device']}/{r['stream']}/{r['frame_seq']}"


def test_cloud_killed_daemon_kill9_restart_exactly_once(tmp_path, tiny_model):
    port = free_port()
    out = tmp_path / "out.jsonl"
    log = tmp_path / "daemon.log"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("all", {"cam": "always"}, deadline_ms=800))
    config = settings_yaml(
        tmp_path / "edge.yaml", device_id="jet",
        streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 15}],
        model={"path": str(tiny_model), "max_batch": 2},
        policy_file=str(policy),
        cloud={"endpoints": [f"127.0.0.1:{port}"]},
        spool={"path": str(tmp_path / "spool.db"), "replay_interval_s": 0.3},
        sinks={"jsonl": str(out)}, metrics={"port": -1}, shutdown_grace_s=2.0,
    )
    cloud = start_cloud(port, tiny_model)
    daemon = start_daemon(config, log)
    try:
        recs = lambda: read_jsonl(out)  # noqa: E731
        outcome = lambda o: [r for r in recs() if r.get("outcome") == o]  # noqa: E731
        wait_for(lambda: len(outcome("cloud")) >= 3, 60, "escalations answered by the cloud", [daemon])
        cloud.kill()
        cloud.wait()
        wait_for(lambda: len(outcome("spooled")) >= 6, 30, "spooled escalations", [daemon])
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        first_run_spooled = {key(r) for r in outcome("spooled")}

        daemon = start_daemon(config, log)  # cloud still down: replays fail and stay spooled
        wait_for(lambda: len({key(r) for r in outcome("spooled")}) > len(first_run_spooled) + 2, 60,
                 "second run spooling", [daemon])
        cloud = start_cloud(port, tiny_model)
        late_keys = lambda: {key(r) for r in recs() if r.get("late")}  # noqa: E731
        wait_for(lambda: first_run_spooled <= late_keys() and len(outcome("cloud")) > 8, 60,
                 "replay of the spooled escalations", [daemon])
        t0 = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
        assert time.monotonic() - t0 < 15
    finally:
        for p in (daemon, cloud):
            if p.poll() is None:
                p.kill()
                p.wait()

    records = read_jsonl(out)
    late = [r for r in records if r.get("late")]
    counts = Counter(key(r) for r in late)
    assert all(n == 1 for n in counts.values()), [k for k, n in counts.items() if n > 1]
    spooled = {key(r) for r in records if r.get("outcome") == "spooled"}
    # Every escalation spooled before the crash was delivered, exactly once.
    assert first_run_spooled <= set(counts)
    # Nothing was delivered late that had not been spooled (a key may lack its
    # "spooled" line only if kill -9 struck between the spool put and the sink write).
    edge_keys = {key(r) for r in records if not r.get("late")}
    assert set(counts) <= spooled | (set(counts) - edge_keys)
    for r in late:
        assert r["outcome"] == "cloud" and r["escalated"] and r["cloud_rtt_ms"] > 0
        assert all(d["source"] in ("edge", "cloud") for d in r["detections"])
    # Sequence numbers of the second run never reuse the first run's keys.
    seqs = [r["frame_seq"] for r in records if not r.get("late")]
    assert len(seqs) == len(set(seqs))
    assert any(s >= 1 << 32 for s in seqs)
    # After the clean stop, whatever was still undelivered is in the spool, nothing else.
    from edge.spool import Spool

    sp = Spool(str(tmp_path / "spool.db"), max_bytes=1 << 30, max_age_s=3600)
    left = {item.key for item in sp.peek(10000)}
    sp.close()
    assert left.isdisjoint(counts)  # what was delivered was acknowledged
    # Undelivered and spooled; or its record never written (kill -9 between put and sink write).
    recorded = {key(r) for r in records}
    assert all(k in spooled or k not in recorded for k in left), left - spooled
    assert "Traceback" not in log.read_text()
