"""Spool benchmark: what the edge's spool costs at start and per escalation, by its size.

For each size a real spool file is filled to its byte cap with region payloads of
``--item-bytes`` (37 kB: the camera world's measured mean), as a long cloud outage leaves
it, and measured in one run on this machine's disk:

* **read file**: reading the file once, sequentially (the I/O floor of anything that
  reads it all);
* **open**: ``Spool(...)`` as the daemon opens it (``PRAGMA quick_check`` reads every
  page), from a cold page cache (the file's pages dropped with ``posix_fadvise``) and warm;
* **salvage**: ``open_spool`` on a copy with one table page damaged (moved aside, every
  readable item copied into a new file), cold;
* **put + stats**, **peek**: what one escalation of an outage costs the spool thread at the
  cap (each put evicts the oldest), median of ``--calls``; beside the shipped spool the
  same file without its age index (``edge.spool.AGE_INDEX``), as the previous version had
  it, where each of these calls read the whole file.

Prints a Markdown table (medians of ``--repeat`` runs for the start-up rows) with each
row's ratio to the file read, the filesystem and the load average.

    .venv/bin/python bench/spool.py                  # 16, 64 and 256 MiB (the default cap)
    .venv/bin/python bench/spool.py --sizes 64 --repeat 5 --dir /var/lib/edgewise

Run it on the device's own storage (``--dir``) to see its start-up cost there: a Jetson's
SD card or eMMC reads several times slower than this host's disk.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

ROOT = Path(__file__).resolve().parents[1]
# first, also when ROOT is on sys.path already (PYTHONPATH) but after this folder: the `edge`
# package, not bench/edge.py, must be what `import edge` finds
sys.path.insert(0, str(ROOT))

from edge.spool import AGE_INDEX, Spool  # noqa: E402  (after the sys.path line above)
from edge.spool_salvage import open_spool  # noqa: E402

MAX_AGE_S = 24 * 3600.0


def drop_cache(path: Path) -> None:
    """Evict ``path``'s pages (and its WAL's) from the page cache: the next read is cold."""
    for p in (path, Path(f"{path}-wal")):
        if p.exists():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def marker(i: int) -> bytes:
    return f"<bench-item-{i:07d}>".encode()


def fill(path: Path, cap: int, item_bytes: int) -> int:
    """A closed spool at ``path`` holding ``cap`` bytes of items; returns how many."""
    body = os.urandom(item_bytes)
    n = 0
    with Spool(path, max_bytes=cap, max_age_s=MAX_AGE_S) as sp:
        while sp.stats().bytes + item_bytes + 64 <= cap:
            m = marker(n)
            assert sp.put(f"bench/cam/{n}", m + body[len(m):], {"i": n, "transport": "grpc"})
            n += 1
    return n


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def read_file(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass


def read_cold(path: Path) -> float:
    drop_cache(path)
    return timed(lambda: read_file(path))


def open_cold(path: Path, cap: int) -> float:
    drop_cache(path)
    t = time.perf_counter()
    Spool(path, max_bytes=cap, max_age_s=MAX_AGE_S).close()
    return time.perf_counter() - t


def salvage_cold(base: Path, work: Path, cap: int, n: int) -> float:
    from tests.edge.spooldamage import damage_page_holding

    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    path = work / "spool.db"
    shutil.copyfile(base, path)
    damage_page_holding(path, marker(n // 2))
    drop_cache(path)
    t = time.perf_counter()
    open_spool(path, max_bytes=cap, max_age_s=MAX_AGE_S).close()
    return time.perf_counter() - t


def per_call(path: Path, cap: int, item_bytes: int, calls: int, age_index: bool = True) -> Dict[str, float]:
    """Median seconds of put+stats and of peek(16) on the spool at ``path`` (at its cap);
    ``age_index=False`` drops the index once open (opening adds it), as the previous version."""
    body = os.urandom(item_bytes)
    puts: List[float] = []
    peeks: List[float] = []
    with Spool(path, max_bytes=cap, max_age_s=MAX_AGE_S) as sp:
        if not age_index:
            sp._db.execute(f"DROP INDEX {AGE_INDEX}")
        for i in range(calls):
            def put(i: int = i) -> None:
                sp.put(f"bench/new/{i}", body, {"i": i})
                sp.stats()
            puts.append(timed(put))
            peeks.append(timed(lambda: sp.peek(16)))
    return {"put": statistics.median(puts), "peek": statistics.median(peeks)}


def ms(s: float) -> str:
    return f"{s * 1000:.1f}" if s < 10 else f"{s * 1000:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,64,256", help="spool sizes (its byte cap), MiB")
    ap.add_argument("--item-bytes", type=int, default=37_300, help="bytes of one spooled payload")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each start-up row (median)")
    ap.add_argument("--calls", type=int, default=20, help="put/peek calls per spool (median)")
    ap.add_argument("--dir", default="/var/tmp", help="folder on the filesystem to measure")
    args = ap.parse_args()
    logging.getLogger("edge").setLevel(logging.CRITICAL)  # the salvage's ERROR and eviction lines
    sizes = [int(s) for s in args.sizes.split(",") if s]
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout.splitlines()[-1:]
    load0 = os.getloadavg()[0]
    rows: List[str] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="edgewise-bench-spool-") as tmp:
        for mib in sizes:
            cap = mib << 20
            base = Path(tmp) / f"base-{mib}.db"
            t0 = time.perf_counter()
            n = fill(base, cap, args.item_bytes)
            print(f"{mib} MiB: {n} items filled in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            read = statistics.median(read_cold(base) for _ in range(args.repeat))
            cold = statistics.median(open_cold(base, cap) for _ in range(args.repeat))
            warm = statistics.median(timed(lambda: Spool(base, max_bytes=cap, max_age_s=MAX_AGE_S).close())
                                     for _ in range(args.repeat))
            salv = statistics.median(salvage_cold(base, Path(tmp) / "salvage", cap, n) for _ in range(args.repeat))
            calls = {}
            for age_index in (True, False):
                copy = Path(tmp) / "calls.db"
                shutil.copyfile(base, copy)
                calls[age_index] = per_call(copy, cap, args.item_bytes, args.calls, age_index)
                copy.unlink()
            new_calls, old_calls = calls[True], calls[False]
            size = base.stat().st_size
            base.unlink()
            rows.append(
                f"| {mib} MiB ({n} items, file {size / 2**20:.0f} MiB) | {ms(read)} | {ms(cold)} ({cold / read:.1f}x) "
                f"| {ms(warm)} | {ms(salv)} ({salv / read:.1f}x) | {ms(new_calls['put'])} | {ms(new_calls['peek'])} "
                f"| {ms(old_calls['put'])} ({old_calls['put'] / new_calls['put']:.0f}x) "
                f"| {ms(old_calls['peek'])} ({old_calls['peek'] / new_calls['peek']:.0f}x) |"
            )
    print(f"\n### Spool at its cap, {args.item_bytes} B items, on {' '.join(fs[0].split()[:2]) if fs else args.dir} "
          f"(load average {load0:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print("| spool | read file ms (cold) | open ms, cold (x read) | open ms, warm | salvage ms, cold (x read) "
          "| put+stats ms | peek ms | put+stats ms without age index (x shipped) | peek ms without (x shipped) |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nStart-up rows: median of {args.repeat}; per-call rows: median of {args.calls} calls at the cap "
          "(each put evicts the oldest item). 'without age index': the same file as the previous version "
          "left it, whose caps and stats read every row's overflow pages.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
