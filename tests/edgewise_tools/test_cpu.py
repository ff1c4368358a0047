"""edgewise_tools.cpu: CPU seconds from /proc, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from edgewise_tools.cpu import (
    SIMD_FLAGS,
    TICK,
    busy_s,
    cpu_flags,
    memory_mb,
    proc_cpu_s,
    simd_summary,
    stat_cpu_s,
    thread_cpu_s,
    tree_cpu_s,
)

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('done', flush=True)\n" \
       "import sys; sys.stdin.read()"


def test_a_busy_child_counts_in_its_own_and_its_parents_tree() -> None:
    # a shell parent that does nothing, with a child that burns 0.3 s of CPU and then waits
    with subprocess.Popen(["sh", "-c", f'{sys.executable} -c "$0"; sleep 30', BURN],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as parent:
        try:
            assert parent.stdout is not None and parent.stdout.readline().strip() == "done"
            assert (proc_cpu_s(parent.pid) or 0.0) < 0.1
            assert tree_cpu_s(parent.pid) >= 0.3 - 2 / TICK
        finally:
            parent.kill()
            parent.wait()
    assert proc_cpu_s(parent.pid) is None  # gone


def test_a_busy_thread_counts_and_threads_add_up_to_at_most_the_process() -> None:
    done, tid = threading.Event(), []

    def burn() -> None:
        tid.append(threading.get_native_id())
        t = time.thread_time()
        while time.thread_time() - t < 0.2:
            pass
        done.wait(10)  # stay alive: a live thread is listed

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        t_end = time.monotonic() + 10
        while not tid or thread_cpu_s(os.getpid()).get(tid[0], 0.0) < 0.2 - 2 / TICK:  # its 0.2 s, listed
            assert time.monotonic() < t_end, "the busy thread's CPU seconds never showed in /proc"
            time.sleep(0.02)
        threads = thread_cpu_s(os.getpid())
        total = proc_cpu_s(os.getpid())
    finally:
        done.set()
        worker.join()
    assert os.getpid() in threads and all(v >= 0 for v in threads.values())
    # the process's seconds include threads that have ended, so its live threads add up to at
    # most that (each rounded down to a tick; read a moment apart)
    assert total is not None and sum(threads.values()) <= total + (len(threads) + 5) / TICK
    assert busy_s() >= busy_s(0) > 0


def test_memory_and_cpu_flags() -> None:
    rss, peak = memory_mb(os.getpid())
    grown = bytearray(64 << 20)  # 64 MB touched: the peak covers it
    grown[::4096] = b"x" * len(grown[::4096])
    rss2, peak2 = memory_mb(os.getpid())
    assert 0 < rss <= peak and rss2 >= rss + 50 and peak2 >= rss2
    flags = cpu_flags()
    summary = simd_summary()
    if flags is None:
        assert summary == "none of AVX2/AVX-512/VNNI/NEON"
    else:
        assert summary == (", ".join(f for f in SIMD_FLAGS if f in flags) or "none of AVX2/AVX-512/VNNI/NEON")


def test_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # pid (comm) state ppid ... field 14 utime = 250 ticks, field 15 stime = 50 ticks
    stat.write_text("42 (a) (b c) S 1 " + " ".join(["0"] * 9) + f" {int(2.5 * TICK)} {int(0.5 * TICK)} 0 0\n")
    assert stat_cpu_s(stat) == 3.0
    assert stat_cpu_s(tmp_path / "missing") is None
