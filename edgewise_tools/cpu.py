"""CPU seconds and memory of processes, from ``/proc/<pid>/stat`` and ``status`` (Linux;
proc(5)), and this CPU's SIMD flags from ``/proc/cpuinfo``.

The demo and the system bench state the cloud's CPU cost per escalation: the CPU time its
worker processes spent, divided by the escalations they answered. :class:`CpuMeter`
follows processes that come and go (a killed worker's seconds count up to its last sample).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

from edgewise.runtime.cpu import cpu_flags

TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


#: The flags that decide INT8 and float speed, as benches print them: x86 AVX2 / AVX-512 /
#: VNNI / AMX, arm64 NEON (asimd) and its int8 dot product (asimddp).
SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "asimddp")


def simd_summary() -> str:
    """:data:`SIMD_FLAGS` this CPU has, for a bench's header line."""
    have = cpu_flags() or frozenset()
    return ", ".join(f for f in SIMD_FLAGS if f in have) or "none of AVX2/AVX-512/VNNI/NEON"


def memory_mb(pid: int) -> Tuple[float, float]:
    """(VmRSS, VmHWM: the peak) of a process in MB."""
    kb = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            kb[line[:5]] = int(line.split()[1])
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def stat_cpu_s(stat: Path) -> Optional[float]:
    """utime + stime in seconds from a ``/proc`` ``stat`` file of a process or thread (None
    once it is gone). The fields are counted after the last ")", since the command name may
    hold spaces and parentheses."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_cpu_s(pid: int) -> Optional[float]:
    """utime + stime of a process in seconds (None once it is gone or where /proc is absent)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def thread_cpu_s(pid: int) -> Dict[int, float]:
    """utime + stime of every live thread of ``pid``, seconds by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        s = stat_cpu_s(task / "stat")
        if s is not None:
            out[int(task.name)] = s
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its direct children (nginx: the master and its workers)."""
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            pids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return sum(proc_cpu_s(q) or 0.0 for q in pids)


def busy_s(cpu: Optional[int] = None) -> float:
    """Busy seconds since boot of one CPU, or of the whole machine (``cpu=None``), all
    processes: user, nice, system, irq, softirq and steal of ``/proc/stat`` (proc(5))."""
    label = "cpu " if cpu is None else f"cpu{cpu} "
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(label):
            v = [int(x) for x in line.split()[1:]]
            return (v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)) / TICK
    return 0.0


class CpuMeter:
    """CPU seconds a changing set of processes spent since each was first sampled."""

    def __init__(self) -> None:
        self.first: Dict[int, float] = {}
        self.last: Dict[int, float] = {}

    def sample(self, pids: Iterable[int]) -> None:
        for pid in pids:
            s = proc_cpu_s(pid)
            if s is None:
                continue
            self.first.setdefault(pid, s)
            self.last[pid] = s

    @property
    def seconds(self) -> float:
        return sum(self.last[p] - self.first[p] for p in self.last)
