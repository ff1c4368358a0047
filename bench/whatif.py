"""What-if replay benchmark: ``edgewise edge check-policy --replay`` over a day of one camera.

Generates the frame records a 15 fps camera's daemon writes in 24 hours (1,296,000
records, laid out exactly as ``edge.records.FrameRecord.to_json`` writes them),
decided by the real decision core under ``examples/policy.yaml`` with a daemon-like
clock, written out of order the way the daemon writes them (an escalated frame's
record after a few later frames) and rotated into 24 hourly files, gzip'd except
the last, named as the edge's own rotation names them (``edge.rotation``). Traffic
follows a day: busy hours have more hard frames. Then replays them with the CLI, as an operator would, and prints
the load average and the CPU's flags, the replay's rate and wall time (target: <= 60 s for the
day), the what-if table
against a stricter policy, and checks that the replay reproduced every recorded decision.

    .venv/bin/python bench/whatif.py                 # one day (about 3 minutes on 2 cores)
    .venv/bin/python bench/whatif.py --hours 1       # quick
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import IO, Any, Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.records import OPTIONAL_FIELDS, FrameRecord  # noqa: E402
from edgewise.cli import main  # noqa: E402
from edgewise.hardness import SIGNAL_NAMES  # noqa: E402
from edgewise.policy import Escalator, load_policy  # noqa: E402
from edgewise.policy.deciding import FrameFacts  # noqa: E402
from edgewise.policy.digest import policy_digest  # noqa: E402
from edgewise_tools.cpu import simd_summary  # noqa: E402

FPS = 15
T0_NS = 1_767_571_200 * 10**9  # 2026-01-05 00:00:00 UTC
CLASSES = ("car", "person", "bike")
SIGNALS = SIGNAL_NAMES  # every signal a daemon records, motion included (the default policy weighs it)
COLS = 22  # random columns per record before the signals' own
WIDTH, HEIGHT = 1280, 720
DISPLACE = 6  # an escalated frame's record is written after this many later frames


def _record(i: int, rng_row: np.ndarray, esc: Escalator, digest: str, name: str) -> Dict[str, Any]:
    t_s = i / FPS
    hour = (t_s / 3600.0) % 24
    busy = 0.5 + 0.5 * math.sin((hour - 8) / 24 * 2 * math.pi)  # traffic peaks in the afternoon
    base = 0.1 + 0.35 * busy
    sig = {k: round(float(min(1.0, max(0.0, base + 0.25 * (rng_row[COLS + j] - 0.5) * 2))), 4)
           for j, k in enumerate(SIGNALS)}
    if rng_row[19] < 0.02 + 0.3 * busy ** 3:  # a hard moment: a vehicle half hidden, a missed object
        sig[SIGNALS[int(rng_row[20] * len(SIGNALS)) % len(SIGNALS)]] = round(0.5 + 0.5 * float(rng_row[21]), 4)
    n = int(rng_row[9] * 6 * (0.3 + busy))
    classes = sorted({CLASSES[int(rng_row[10 + b] * 3) % 3] for b in range(n)})
    scores = [round(0.25 + 0.7 * float(rng_row[13 + b % 4]), 4) for b in range(n)]
    facts = FrameFacts(tuple(classes), n, max(scores) if scores else 0.0)
    now = 5000.0 + t_s + 0.004 * float(rng_row[17])  # the daemon's monotonic clock at the decision
    d = esc.decide_facts("gate", i, facts, sig, now)
    cap = T0_NS + int(t_s * 1e9)
    dets = [{"box": [100.5 + b, 200.25, 300.75, 400.0], "score": scores[b], "class_id": CLASSES.index(classes[b % len(classes)]),
             "class_name": classes[b % len(classes)], "source": "edge"} for b in range(n)]
    rec = {
        "device": "jetson-01", "stream": "gate", "frame_seq": i, "capture_unix_ns": cap,
        "emit_unix_ns": cap + 60_000_000, "width": WIDTH, "height": HEIGHT, "detections": dets,
        "escalated": d.escalate, "reason": d.reason, "hardness": round(d.hardness, 4), "signals": sig,
        "suppressed_by": d.suppressed_by or "", "detail": d.detail, "threshold": round(d.threshold, 4),
        "origin": d.origin, "priority": d.priority, "policy": name, "policy_generation": 1,
        "latency_ms": {"read": 1.234, "queue": 12.5, "preprocess": 3.1, "infer": 38.7, "postprocess": 1.2,
                       "hardness_policy": 0.21, "frame_age": 15.3, "total": 58.9},
        "outcome": "cloud" if d.escalate else "edge", "late": False,
        "cloud_rtt_ms": 85.3 if d.escalate else None, "read_unix_ns": cap, "capture_clock": "read",
        "decided_s": now, "edge_boxes": n, "edge_classes": classes, "edge_max_score": facts.max_score,
        "policy_digest": digest,
    }
    if d.escalate:
        rec["cloud_model"] = "yolov5x"
        rec["payload_bytes"] = int(WIDTH * HEIGHT * 0.2 * (0.8 + 0.4 * float(rng_row[18])))
    return rec


def generate(out: Path, hours: float, policy_path: Path) -> List[Path]:
    """Write ``hours`` of records, one file per hour (gzip'd but the last); returns the files."""
    policy = load_policy(policy_path)
    esc = Escalator(policy)
    digest = policy_digest(policy)
    total = int(hours * 3600 * FPS)
    per_file = 3600 * FPS
    rng = np.random.default_rng(42)
    files: List[Path] = []
    f: IO[bytes] = open(os.devnull, "wb")
    pending: List[Any] = []  # (write at frame, line) of escalated frames
    names = [fl.name for fl in fields(FrameRecord)]
    for start in range(0, total, 10_000):
        block = rng.random((min(10_000, total - start), COLS + len(SIGNALS)))
        for k, row in enumerate(block):
            i = start + k
            if i % per_file == 0:
                f.close()
                hour = i // per_file
                last = i + per_file >= total
                # edge.rotation's names: the file rotated at the end of its hour, gzip'd
                stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(T0_NS // 10**9 + (hour + 1) * 3600))
                p = out / ("detections.jsonl" if last else f"detections.jsonl.{stamp}.000000Z.gz")
                f = open(p, "wb") if last else gzip.open(p, "wb", compresslevel=1)  # type: ignore[assignment]
                files.append(p)
            rec = _record(i, row, esc, digest, policy.metadata.name)
            doc = {k2: rec[k2] for k2 in names if k2 in rec}  # FrameRecord.to_dict's layout
            if i == 0:
                assert len(doc) == len(rec) and set(names) - set(OPTIONAL_FIELDS) <= set(doc)
            line = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
            if rec["escalated"]:
                pending.append((i + DISPLACE, line))
            else:
                f.write(line)
            while pending and pending[0][0] <= i:
                f.write(pending.pop(0)[1])
    for _, line in pending:
        f.write(line)
    f.close()
    return files


def main_() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--keep", default=None, help="folder to write (and reuse) the records in")
    args = p.parse_args()
    policy = ROOT / "examples" / "policy.yaml"
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="whatif-"))
    work.mkdir(parents=True, exist_ok=True)
    files = sorted(work.glob("detections.jsonl*"))
    if not files:
        t = time.perf_counter()
        files = generate(work, args.hours, policy)
        print(f"generated {args.hours:g} h of records ({int(args.hours * 3600 * FPS):,} frames) in "
              f"{time.perf_counter() - t:.0f} s: {sum(f.stat().st_size for f in files) / 1e6:.0f} MB in {len(files)} files")
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} CPUs ({simd_summary()})")
    stricter = work / "stricter.yaml"
    stricter.write_text(policy.read_text().replace("threshold: 0.5", "threshold: 0.6")
                        .replace("name: default", "name: stricter"))
    for cmd in (["edge", "check-policy", str(policy), "--replay", *map(str, files), "--json"],
                ["edge", "check-policy", str(stricter), "--replay", *map(str, files)]):
        t = time.perf_counter()
        if "--json" in cmd:
            import contextlib
            import io
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = main(cmd)
            report = json.loads(buf.getvalue())
            rec = report["replay"]["records"]
            repro = report["replay"]["sides"][0].get("reproduction", {})
            cpu_rate = rec["lines"] / rec["cpu_seconds"] if rec["cpu_seconds"] > 0 else 0.0
            print(f"same policy: {rec['lines']:,} records in {rec['seconds']:.1f} s = "
                  f"{rec['records_per_second']:,} records/s (wall {time.perf_counter() - t:.1f} s incl. start); "
                  f"{rec['cpu_seconds']:.1f} s of CPU = {cpu_rate:,.0f} records per CPU second; "
                  f"reproduced {repro.get('agreed', 0):,} of {repro.get('checked', 0):,} decisions; exit {rc}")
        else:
            rc = main(cmd)
            print(f"stricter policy: wall {time.perf_counter() - t:.1f} s; exit {rc}")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
