"""edgewise_tools.cpu: CPU seconds from /proc, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgewise_tools.cpu import TICK, busy_s, proc_cpu_s, stat_cpu_s, thread_cpu_s, tree_cpu_s

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


def test_threads_and_cpus_add_up() -> None:
    threads = thread_cpu_s(os.getpid())
    assert os.getpid() in threads and all(v >= 0 for v in threads.values())
    assert busy_s() >= busy_s(0) > 0


def test_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # pid (comm) state ppid ... field 14 utime = 250 ticks, field 15 stime = 50 ticks
    stat.write_text("42 (a) (b c) S 1 " + " ".join(["0"] * 9) + f" {int(2.5 * TICK)} {int(0.5 * TICK)} 0 0\n")
    assert stat_cpu_s(stat) == 3.0
    assert stat_cpu_s(tmp_path / "missing") is None
