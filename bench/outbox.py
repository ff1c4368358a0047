"""MQTT sink outbox benchmark: what QoS 2 across restarts costs each record on disk.

At QoS 1 the outbox writes a record twice: appended when the sink takes it (``put``) and
deleted when the broker acknowledged it (``ack``). At QoS 2 it also notes the record's packet
identifier before the broker can see it (``hand``) and the broker's PUBREC (``received``), so
that a daemon killed with records in flight completes their exchanges after the restart
(``docs/records.md``). Both sequences run side by side on a real outbox file on this
machine's disk, off the daemon's event loop as in the sink (its publisher thread and paho's).

Prints a Markdown table: microseconds per record (median of ``--repeat`` runs of
``--records`` records of ``--bytes`` bytes) and the ratio to QoS 1.

    .venv/bin/python bench/outbox.py
    .venv/bin/python bench/outbox.py --dir /var/lib/edgewise   # the device's own storage
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from edge.outbox import Outbox  # noqa: E402  (after the sys.path line above)


def per_record_us(directory: str, records: int, size: int, qos2: bool) -> float:
    with tempfile.TemporaryDirectory(dir=directory) as d:
        box = Outbox(os.path.join(d, "mqtt-outbox.db"), records + 1)
        data = b"x" * size
        t0 = time.perf_counter()
        for rid in range(1, records + 1):
            box.put(data)
            if qos2:
                box.hand(rid, rid % 65535 + 1)
                box.received(rid)
            box.ack([rid])
        elapsed = time.perf_counter() - t0
        box.close()
    return elapsed / records * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--bytes", type=int, default=900, help="a record's size (a frame record is about 1 KB)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the outbox file lives (default: the temp folder)")
    a = ap.parse_args()
    runs: dict = {False: [], True: []}
    for _ in range(a.repeat):  # interleaved, so drift on a shared machine hits both rows alike
        for qos2 in (False, True):
            runs[qos2].append(per_record_us(a.dir or tempfile.gettempdir(), a.records, a.bytes, qos2))
    base = statistics.median(runs[False])
    print(f"outbox: {a.records} records of {a.bytes} bytes, median of {a.repeat} runs, "
          f"{os.cpu_count()} CPUs, dir {a.dir or tempfile.gettempdir()}\n")
    print("| sequence per record | µs per record | ratio |")
    print("|---|---|---|")
    for qos2, name in ((False, "QoS 1: put, ack"), (True, "QoS 2 (shipped): put, hand, received, ack")):
        m = statistics.median(runs[qos2])
        print(f"| {name} | {m:.1f} | {m / base:.2f} |")


if __name__ == "__main__":
    main()
