"""The big one, with real processes and real signals: the cloud (``cloud.local``: a
real gateway and worker as processes) loses its gateway to ``kill -9`` mid-run,
escalations are spooled, the daemon is ``kill -9``'d, restarted while the gateway is
still down, the gateway comes back, and every spooled escalation reaches the sink
exactly once (by idempotency key), marked late. Then SIGTERM stops the daemon
cleanly. The daemon runs as ``edgewise edge run``."""

from __future__ import annotations

import signal
from collections import Counter

from cloud.local import LocalCloud
from tests.edge.helpers import policy_yaml, read_jsonl, settings_yaml
from tests.processes import EdgeProcess
from tests.waiting import wait_until


def key(r):
    return f"{r['device']}/{r['stream']}/{r['frame_seq']}"


def test_cloud_killed_daemon_kill9_restart_exactly_once(tmp_path, tiny_model):
    out = tmp_path / "out.jsonl"
    log = tmp_path / "daemon.log"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml("all", {"cam": "always"}, deadline_ms=800))
    with LocalCloud(tiny_model, workers=1, log_dir=tmp_path / "cloud") as cloud:
        config = settings_yaml(
            tmp_path / "edge.yaml", device_id="jet",
            streams=[{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 15}],
            model={"path": str(tiny_model), "max_batch": 2},
            policy_file=str(policy),
            cloud={"endpoints": [cloud.address]},
            spool={"path": str(tmp_path / "spool.db"), "replay_interval_s": 0.3},
            sinks={"jsonl": str(out)}, metrics={"port": -1}, shutdown_grace_s=2.0,
        )
        daemon = EdgeProcess(config, log)
        try:
            recs = lambda: read_jsonl(out)  # noqa: E731
            outcome = lambda o: [r for r in recs() if r.get("outcome") == o]  # noqa: E731
            wait_until(lambda: daemon.check() and len(outcome("cloud")) >= 3, 60, "answers from the cloud")
            cloud.kill_gateway(signal.SIGKILL)
            wait_until(lambda: daemon.check() and len(outcome("spooled")) >= 6, 30, "spooled escalations")
            daemon.kill9(0)
            first_run_spooled = {key(r) for r in outcome("spooled")}

            daemon.start()  # the gateway still down: replays fail and stay spooled
            wait_until(lambda: daemon.check() and len({key(r) for r in outcome("spooled")}) >
                       len(first_run_spooled) + 2, 60, "second run spooling")
            cloud.restart_gateway()
            late_keys = lambda: {key(r) for r in recs() if r.get("late")}  # noqa: E731
            wait_until(lambda: daemon.check() and first_run_spooled <= late_keys() and len(outcome("cloud")) > 8,
                       60, "replay of the spooled escalations")
            assert daemon.stop(20) == 0
        finally:
            daemon.close()

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
