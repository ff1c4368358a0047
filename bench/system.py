"""End-to-end system benchmark: N cameras -> edge daemons -> local cloud pool.

For each N (e.g. 1, 2, 4, 8 cameras at a fixed frame rate) it starts fresh edge
daemons (one per ``--per-daemon`` cameras) against one warm local cloud (gateway
+ ``--workers`` workers with dynamic batching) and measures, in the same run:
sustained frames/s, end-to-end latency p50/p95/p99 of edge-only frames and of
escalated frames (capture -> merged cloud answer written), escalation share,
uplink bytes against streaming every frame, edge stage medians and CPU seconds
per process role (``/proc/<pid>/stat``). It states the knee of the cost curve
from the data (first N where a stream keeps < 90% of its frame rate or escalated
p99 grows past 1.5x its value at the smallest N, judged on distribution-free 95%
intervals so that one slow sample among a few dozen cannot place it; the smallest N is
run again when it answered fewer than the 368 escalations a bounded p99 interval needs
(runs pooled), and the knee falls back to the p95 when it still has fewer; the table
states each point's sample count and interval) and whether the project's target
(escalated p99 <= 200 ms at the load the pool is sized for) is met on this machine. Then two failure
runs, each with its escalation accounting (lost must be 0): a worker SIGKILLed
for a few seconds, and (over MQTT) our own Mosquitto broker restarted.

    .venv/bin/python bench/system.py                  # full run, ~7-8 min on 2 cores
    .venv/bin/python bench/system.py --quick --json out.json
    .venv/bin/python bench/system.py --n 1,2,4 --fps 5 --seconds 20 --workers 2

Models: the demo's reference pair (``models/camera/``) when present, else seeded stand-ins
(YOLOv5n@320 INT8 edge, YOLOv5s@320 cloud); override with ``--edge-model/--cloud-model``.
The cameras show the world the cloud model was trained for, at its frame size and with its
policy, as ``edgewise demo`` does (camera pair: 1280x720 frames, ``examples/policy.yaml``;
episodes pair and stand-ins: 224x224, ``examples/policies/episodes.yaml``); ``--size`` and ``--policy``
override. Targets: docs/design/README.md#targets.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from bench import _system_run as run  # noqa: E402
from bench import _system_stats as stats  # noqa: E402

TARGET_MS = 200.0  # docs/design/README.md#targets: < 200 ms end to end for escalated frames
FPS_FLOOR = 0.9  # knee: a stream below 90% of its camera frame rate has degraded
P99_GROWTH = 1.5  # knee: escalated p99 surely (95% CIs) above 1.5x its value at the smallest N


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: N=1,2, 6 s per point, short failure runs")
    p.add_argument("--n", default=None, help="camera counts, e.g. 1,2,4,8 (default 1,2,4,8; quick 1,2)")
    p.add_argument("--fps", type=float, default=None, help="frame rate of every camera (default 5)")
    p.add_argument("--seconds", type=float, default=None, help="camera time per load point (default 20; quick 6)")
    p.add_argument("--workers", type=int, default=2, help="cloud workers (default 2)")
    p.add_argument("--worker-threads", type=int, default=1, help="ONNX Runtime threads per worker")
    p.add_argument("--max-batch", type=int, default=2,
                   help="worker dynamic batch: most images per call (default 2: on CPU a batch buys "
                        "no throughput, see docs/design/batching.md#batching-on-cpu, and the worker's deadline check uses the "
                        "expected batch time)")
    p.add_argument("--max-delay-ms", type=float, default=5.0, help="worker dynamic batch: longest wait")
    p.add_argument("--per-daemon", type=int, default=4, help="cameras per edge daemon (default 4)")
    p.add_argument("--edge-model", type=Path, default=None, help="edge ONNX (default models/camera/edge-int8.onnx "
                   "or a YOLOv5n@320 INT8 stand-in)")
    p.add_argument("--cloud-model", type=Path, default=None, help="cloud ONNX (default models/camera/cloud.onnx "
                   "or a YOLOv5s@320 stand-in)")
    p.add_argument("--policy", type=Path, default=None,
                   help="escalation policy (default: the world's, as in edgewise demo)")
    p.add_argument("--audit-fraction", type=float, default=None,
                   help="escalate this deterministic random fraction of easy frames (policy auditFraction; "
                        "default 0 with the reference models, 0.15 with the stand-ins, whose random "
                        "weights detect nothing)")
    p.add_argument("--deadline-ms", type=float, default=1000.0,
                   help="cloud deadline written into the policy copy (default 1000; 0 keeps the "
                        "policy's). The latency target is judged on measured latency, not on this")
    p.add_argument("--transport", choices=("grpc", "mqtt"), default="grpc",
                   help="transport of the cost-curve runs (the broker-restart run always uses mqtt)")
    p.add_argument("--failures", default="kill,broker",
                   help="failure runs: kill, broker, both comma-separated, or none")
    p.add_argument("--fail-n", type=int, default=2, help="cameras in the failure runs")
    p.add_argument("--down-seconds", type=float, default=None, help="how long the worker/broker stays down "
                   "(default 4; quick 2)")
    p.add_argument("--baseline-max-seconds", type=float, default=None,
                   help="run the smallest N again (pooling its latencies) until it can bound its p99, "
                        "up to this much camera time in all (the knee's reference; default 420; quick 0 = never)")
    p.add_argument("--target-ms", type=float, default=TARGET_MS, help="escalated p99 target (default 200)")
    p.add_argument("--size", default="", help="camera frame size WxH (default: the world's, as in edgewise demo)")
    p.add_argument("--seed", type=int, default=7, help="data seed")
    p.add_argument("--json", type=Path, default=None, help="write the JSON summary here")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, sinks)")
    p.add_argument("--report-from", type=Path, default=None,
                   help="print the report of an earlier run's --json file again (runs nothing)")
    a = p.parse_args(argv)
    a.preset = ""  # the world, set with the models (main) or read back (rerender)
    a.n = [int(x) for x in (a.n or ("1,2" if a.quick else "1,2,4,8")).split(",") if x.strip()]
    a.fps = a.fps if a.fps is not None else 5.0
    a.seconds = a.seconds if a.seconds is not None else (6.0 if a.quick else 20.0)
    if a.baseline_max_seconds is None:
        a.baseline_max_seconds = 0.0 if a.quick else 420.0
    a.down_seconds = a.down_seconds if a.down_seconds is not None else (2.0 if a.quick else 4.0)
    a.failures = [] if a.failures.strip() in ("", "none") else [f.strip() for f in a.failures.split(",")]
    bad = [f for f in a.failures if f not in ("kill", "broker")]
    if bad or not a.n or min(a.n) < 1 or a.fps <= 0 or a.seconds < 2 or a.workers < 1 or a.per_daemon < 1:
        p.error("need --n >= 1, --fps > 0, --seconds >= 2, --workers >= 1, --per-daemon >= 1, "
                f"--failures from kill,broker,none (got unknown {bad})" if bad else
                "need --n >= 1, --fps > 0, --seconds >= 2, --workers >= 1, --per-daemon >= 1")
    w, _, h = a.size.partition("x")
    if a.size and not (w.isdigit() and h.isdigit()):
        p.error(f"--size {a.size!r}: use WxH, e.g. 320x240")
    a.size = (int(w), int(h)) if a.size else None
    return a


def rerender(a: argparse.Namespace) -> int:
    """The report of an earlier run, from its JSON (same tables, current formulas)."""
    doc = json.loads(Path(a.report_from).read_text())
    c = doc["config"]
    for k in ("n", "fps", "seconds", "workers", "worker_threads", "transport", "max_batch", "max_delay_ms",
              "deadline_ms", "target_ms", "preset"):
        setattr(a, k, c.get(k, getattr(a, k, None)))
    a.policy = Path(c.get("policy", a.policy or "?"))  # runs before the world was recorded: unknown
    a.size = tuple(c["size"]) if c.get("size") else None
    m = doc["models"]
    out = report(a, doc["curve"], doc["failures"], int(c["cores"]), m["note"], Path(m["edge"]),
                 Path(m["cloud"]), float(doc.get("wall_seconds", 0.0)), float(c.get("audit_fraction", 0.0)),
                 doc.get("provenance"))
    out["skipped"] = doc.get("skipped", {})
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    if a.report_from is not None:
        return rerender(a)
    t_start = time.monotonic()
    from cloud.local import LocalCloud
    from edgewise_tools.demo import DemoConfig

    if a.edge_model is None or a.cloud_model is None:
        de, dc, note = run.default_models()
        edge_model, cloud_model = a.edge_model or de, a.cloud_model or dc
        models_note = note if (a.edge_model is None and a.cloud_model is None) else "given + " + note
    else:
        edge_model, cloud_model, models_note = a.edge_model, a.cloud_model, "given on the command line"
    audit = a.audit_fraction if a.audit_fraction is not None else (0.0 if "reference" in models_note else 0.15)
    world = DemoConfig(edge_model=edge_model, cloud_model=cloud_model, policy=a.policy, size=a.size)
    a.policy, a.size, a.preset = world.policy_file, world.frame_size, world.preset
    for m in (edge_model, cloud_model, a.policy):
        if not Path(m).is_file():
            print(f"system bench: {m} not found", file=sys.stderr)
            return 2
    from edgewise_tools.provenance import provenance

    prov = provenance({"edge": edge_model, "cloud": cloud_model}, a.policy)  # the tree as the run starts
    work = Path(tempfile.mkdtemp(prefix="edgewise-sysbench-"))
    distinct = min(4, max(a.n + ([a.fail_n] if a.failures else [])))
    folders = run.camera_folders(world.preset, distinct, 24, a.size, a.seed)
    skipped: Dict[str, str] = {}
    if not run.mqtt_bridge_available():
        if a.transport == "mqtt":
            print("system bench: --transport mqtt needs the gateway's MQTT bridge "
                  "(cloud.gateway.mqtt_bridge), which this checkout lacks", file=sys.stderr)
            shutil.rmtree(work, ignore_errors=True)
            return 2
        if "broker" in a.failures:
            skipped["broker_restart"] = "the gateway's MQTT bridge (cloud.gateway.mqtt_bridge) is missing"
            a.failures.remove("broker")
            run.say(f"broker-restart run skipped: {skipped['broker_restart']}")
    need_mqtt = "broker" in a.failures or a.transport == "mqtt"
    broker = run.Broker(work) if need_mqtt else None
    gw: Dict[str, Any] = {}
    if broker is not None:
        gw = {"mqtt.enabled": True, "mqtt.host": "127.0.0.1", "mqtt.port": broker.port}
    wargs = ["--max-batch", str(a.max_batch), "--max-delay-ms", f"{a.max_delay_ms:g}"]
    cloud = LocalCloud(cloud_model, workers=a.workers, worker_threads=a.worker_threads, worker_args=wargs,
                       gateway_settings=gw, log_dir=work / "cloud")
    cores = os.cpu_count() or 1
    points: List[Dict[str, Any]] = []
    failures: Dict[str, Dict[str, Any]] = {}
    try:
        run.say(f"system bench: N={a.n} at {a.fps:g} fps for {a.seconds:g} s, {a.workers} workers, "
                f"{cores} cores; models: {models_note}; work dir {work}")
        cloud.start()
        waited = run.settle(lambda: [p.popen.pid for p in cloud.workers if p is not None])
        run.say(f"cloud warm-up settled after {waited:.0f} s")
        run.say(f"cloud up: gateway {cloud.address}" + (f", mosquitto :{broker.port}" if broker else ""))

        def point(n: int, transport: str, seconds: float, tag: str, fault_of: Any = None) -> Dict[str, Any]:
            pol, quality = run.policy_copy(a.policy, transport, work / f"policy-{transport}.yaml", audit,
                                           a.deadline_ms or None)
            pc = run.PointConfig(n=n, fps=a.fps, seconds=seconds, per_daemon=a.per_daemon,
                                 edge_model=Path(edge_model), policy=pol, transport=transport,
                                 gateway=cloud.address, mqtt_port=broker.port if broker else None,
                                 folders=folders)
            sizes = {f"cam{i}": run.jpeg_sizes(folders[i % len(folders)], quality) for i in range(n)}
            before = run.gateway_counters(cloud)
            res = run.run_point(pc, work / tag, cloud, broker, fault_of(pc) if fault_of else None)
            after = run.gateway_counters(cloud)
            final = stats.merge_finals(res["records"])
            summ = stats.summarize_point(final, n_streams=n, fps=a.fps, offered_per_stream=pc.frames_per_stream,
                                         warmup_s=1.0, frame_bytes=sizes, cpu_s=res["cpu_s"],
                                         wall_s=res["wall_s"], daemons=res["daemons"])
            summ["events"] = res["events"]
            summ["transport"] = transport
            summ["exit_codes"] = res["exit_codes"]
            summ["gateway_counters"] = {k: v - before.get(k, 0.0) for k, v in after.items()
                                        if v - before.get(k, 0.0)}
            ours = sum(res["cpu_s"].values())
            summ["other_cores"] = round(max(0.0, res["machine_cpu_s"] - ours) / max(1e-9, res["wall_s"]), 2)
            summ["loadavg_1m"] = round(res["loadavg"], 2)
            x = summ["escalated_ms"]
            run.say(f"  [{tag}] N={n}: {summ['processed_frames']}/{summ['offered_frames']} frames, "
                    f"{summ['sustained_fps']:g} fps, escalated {summ['accounting']['escalated']} "
                    f"(p99 {x['p99']} ms), lost {summ['accounting']['lost']}, "
                    f"{time.monotonic() - t_start:.0f} s elapsed")
            return summ

        for n in a.n:
            points.append(point(n, a.transport, a.seconds, f"n{n}"))
            if n == min(a.n):
                points[-1] = pooled_baseline(a, points[-1],
                                             lambda k: point(n, a.transport, a.seconds, f"n{n}-run{k}"))
        # The fault starts a few seconds in and ends early enough for the spool to replay
        # (every 1 s) before the cameras stop.
        at = 2.0 if a.quick else max(3.0, 0.25 * a.seconds)
        fail_s = max(a.seconds, at + a.down_seconds + (5.0 if a.quick else 8.0))
        if "kill" in a.failures:
            failures["worker_kill"] = point(
                a.fail_n, a.transport, fail_s, "kill",
                lambda pc: run.worker_kill_fault(cloud, at, a.down_seconds))
        if "broker" in a.failures and broker is not None:
            failures["broker_restart"] = point(
                a.fail_n, "mqtt", fail_s, "broker",
                lambda pc: run.broker_restart_fault(broker, at, a.down_seconds))
    finally:
        cloud.stop()
        if broker is not None:
            broker.stop()
    out = report(a, points, failures, cores, models_note, edge_model, cloud_model,
                 time.monotonic() - t_start, audit, prov)
    out["skipped"] = skipped
    for name, why in skipped.items():
        print(f"{name} run skipped: {why}.")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    if a.keep:
        run.say(f"work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    lost = sum(f["accounting"]["lost"] for f in failures.values())
    return 0 if lost == 0 and points else 1


def pooled_baseline(a: argparse.Namespace, first: Dict[str, Any], measure: Any) -> Dict[str, Any]:
    """The smallest N run again and pooled until it can bound its p99, or the time is spent.

    The knee judges latency growth against the high end of this point's interval, which is
    unbounded below ``stats.samples_for_bounded(0.99)`` answered escalations (368; the knee
    falls back to the p95, which needs 72). Each extra run is a fresh start of the same point,
    like every other point, so the pooled latencies come from the same regime as theirs (a
    single long run would not: the policy's escalation budget window fills up after a minute).
    At most ``--baseline-max-seconds`` of camera time in all.
    """
    need = stats.samples_for_bounded(0.99)
    runs = [first]
    have = first["escalated_ms"]["n"]
    if have == 0 or have >= need:
        return first
    run.say(f"  N={first['n']} answered {have} escalations; a bounded p99 needs {need}: running it again "
            f"(at most {a.baseline_max_seconds:g} s of camera time)")
    while have < need and (len(runs) + 1) * a.seconds <= a.baseline_max_seconds:
        runs.append(measure(len(runs)))
        have += runs[-1]["escalated_ms"]["n"]
    return stats.pool_runs(runs) if len(runs) > 1 else first


def report(a: argparse.Namespace, points: List[Dict[str, Any]], failures: Dict[str, Dict[str, Any]],
           cores: int, models_note: str, edge_model: Path, cloud_model: Path, wall: float,
           audit: float, prov: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Print the Markdown report; return the JSON summary. ``prov``: what produced the run
    (``edgewise_tools.provenance``, taken as it started; None for a run recorded before it)."""
    from edgewise_tools.provenance import markdown as provenance_text

    kn = stats.knee(points, FPS_FLOOR, P99_GROWTH)
    base = min(points, key=lambda p: p["n"]) if points else None
    sized = stats.sized_for(points, a.workers, cores)
    at = next((p for p in points if p["n"] == sized["n"]), None)
    verdict: Dict[str, Any]
    if at is None:
        verdict = {"met": None, "n": None, "note": "no sized-for load could be derived"}
    else:
        p99 = at["escalated_ms"]["p99"]
        met = p99 is not None and p99 <= a.target_ms
        verdict = {"met": met, "n": at["n"], "escalated_p99_ms": p99,
                   "gap_ms": None if p99 is None else round(p99 - a.target_ms, 1),
                   "cpu_path_ms": at.get("cpu_path_ms")}
    lines = [
        f"## System benchmark ({len(points)} load points, {a.fps:g} fps per camera, {a.seconds:g} s each; "
        f"{a.workers} cloud workers x {a.worker_threads} thread; {cores} CPU cores)",
        "",
        f"Models: {models_note} — edge `{Path(edge_model).name}`, cloud `{Path(cloud_model).name}`. "
        + (f"Cameras: the `{a.preset}` world at {a.size[0]}x{a.size[1]}. " if a.preset and a.size else "")
        + f"Policy `{a.policy.name}`"
        + (f" with auditFraction {audit:g} (random weights detect nothing, so hardness alone escalates "
           f"nothing)" if audit else "")
        + (f", cloud deadline {a.deadline_ms:g} ms" if a.deadline_ms else "")
        + f". Worker dynamic batching: max batch {a.max_batch}, max delay {a.max_delay_ms:g} ms"
        + f". Transport {a.transport}. Latency = capture -> record written (escalated: merged cloud answer, "
        f"answered in time; first 1 s of each stream left out). Ratios against N={min(a.n)}. "
        f"'+others' = cores busy with other processes on this shared machine during the window "
        f"(1-min load average {', '.join(str(p.get('loadavg_1m')) for p in points)}).",
        "",
        *([provenance_text(prov), ""] if prov else []),
        stats.curve_table(points, a.target_ms, FPS_FLOOR, P99_GROWTH),
        "CPU path = edge CPU ms per frame + cloud CPU ms per escalation: the serial work on an "
        "escalated frame, what its latency approaches without queueing or CPU contention (an estimate).",
        "",
        "Edge stage medians (ms) and CPU seconds per process role over each window:",
        "",
        stats.stage_table(points),
        f"Knee criterion: {kn['criterion']}; {kn['note']}"
        + (f" (N={base['n']}'s escalated latencies pooled over {base['runs']} runs of {a.seconds:g} s)"
           if base and base.get("runs", 1) > 1 else "") + ". "
        + (f"**Knee at N={kn['knee_n']}** ({'; '.join(kn['why'])}); last N meeting it: {kn['last_ok_n']}."
           if kn["knee_n"] is not None else f"No knee within N={a.n}: every point meets it."),
        "",
        f"Pool sizing: {sized['note']}. "
        + (f"Target escalated p99 <= {a.target_ms:g} ms at the sized-for load N={verdict['n']}: "
           f"{'MET' if verdict['met'] else 'NOT MET'} (p99 {verdict['escalated_p99_ms']} ms, "
           f"gap {verdict['gap_ms']} ms; CPU path {verdict['cpu_path_ms']} ms)."
           if verdict["n"] is not None else verdict["note"] + "."),
        "",
    ]
    if failures:
        lines += ["Failure runs (escalation accounting; lost = escalated frames without a cloud answer):", "",
                  stats.failure_table(failures)]
    text = "\n".join(lines)
    print(text)
    sys.stdout.flush()
    return {
        "config": {"n": a.n, "fps": a.fps, "seconds": a.seconds, "workers": a.workers,
                   "worker_threads": a.worker_threads, "per_daemon": a.per_daemon, "transport": a.transport,
                   "max_batch": a.max_batch, "max_delay_ms": a.max_delay_ms, "cores": cores,
                   "deadline_ms": a.deadline_ms, "preset": a.preset, "size": list(a.size or ()),
                   "policy": str(a.policy), "quick": a.quick, "audit_fraction": audit,
                   "p99_growth": P99_GROWTH, "target_ms": a.target_ms, "fps_floor": FPS_FLOOR},
        "models": {"edge": str(edge_model), "cloud": str(cloud_model), "note": models_note},
        "curve": points,
        "knee": kn,
        "sized_for": sized,
        "target": verdict,
        "failures": failures,
        "table": text,
        "wall_seconds": round(wall, 1),
        **({"provenance": prov} if prov else {}),
    }


if __name__ == "__main__":
    sys.exit(main())
