"""CPU seconds of processes, from ``/proc/<pid>/stat`` (Linux; proc(5) fields 14 and 15).

The demo and the system bench state the cloud's CPU cost per escalation: the CPU time its
worker processes spent, divided by the escalations they answered. :class:`CpuMeter`
follows processes that come and go (a killed worker's seconds count up to its last sample).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, Optional

TICK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def proc_cpu_s(pid: int) -> Optional[float]:
    """utime + stime of a process in seconds (None once it is gone or where /proc is absent)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


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
