"""The memory a daemon's frames may hold at once, and one warning when it is too much.

Every frame is a full decoded BGR image until its record is written: an 8K camera's is
99.5 MB (7680 x 4320 x 3), a 4K one's 24.9 MB, 1080p 6.2 MB. Frames wait in each stream's
queue (``streams[].queue_size``, plus the one being read), in the inference batches (the
batch being run and the next one taken, ``model.max_batch`` each) and, escalated, until the
cloud answers (``cloud.max_in_flight`` calls, and as many again waiting for the spool).
On a Xavier NX the CPU and the GPU share 8 GB, so a few 8K streams with the file
defaults can ask for more than the device has, and the kernel's OOM killer ends the
daemon with whatever it held. The resolution is known only once a stream delivers, so
``FrameMemory`` is told each stream's frame size as it comes and warns once, naming the
settings to lower, when the worst case passes ``WARN_SHARE`` of the memory the daemon may
use: the device's, or less where its cgroup has a memory limit (the shipped unit's
``MemoryMax=4G``, a container's ``--memory``), which the kernel enforces by killing the daemon
(an 8K file stream in a 4 GiB unit on a 32 GB Orin was never warned about: half of 32 GB).
"""

from __future__ import annotations

import logging
import os
from typing import Dict, List, Mapping, Optional, Tuple

log = logging.getLogger(__name__)

#: Share of the memory the daemon may use (``memory_bytes``) the frames may take at worst before a warning.
WARN_SHARE = 0.5
#: Where the cgroup file systems are mounted: v2's unified one, v1's memory controller below it.
CGROUP_ROOT = "/sys/fs/cgroup"
#: This process's cgroups, one line per hierarchy (``0::/path`` for v2).
PROC_CGROUP = "/proc/self/cgroup"
#: A cgroup v1 limit this large is "no limit" (the kernel shows PAGE_COUNTER_MAX pages in bytes).
CGROUP_V1_UNLIMITED = 1 << 60


def mem_total_bytes(path: str = "/proc/meminfo") -> Optional[int]:
    """The device's memory (``MemTotal``), None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_folders(root: str, path: str) -> List[str]:
    """The folders under ``root`` of the cgroup ``path`` (from ``/proc/self/cgroup``) and of each
    cgroup above it: a parent's limit holds its children too. A container's mount shows its own
    cgroup as ``root`` while ``path`` may still name it from the host's root, so leading parts
    of ``path`` are dropped until the folder exists."""
    parts = [p for p in path.split("/") if p]
    here = root
    for i in range(len(parts) + 1):
        if os.path.isdir(os.path.join(root, *parts[i:])):
            here = os.path.join(root, *parts[i:])
            break
    folders = [here]
    while os.path.normpath(here) != os.path.normpath(root):
        here = os.path.dirname(here)
        folders.append(here)
    return folders


def _limit_in(path: str) -> Optional[int]:
    """A cgroup memory limit file's bytes; None for no limit (``max``, v1's huge number) or unreadable."""
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
        value = int(text)
    except (OSError, ValueError):
        return None
    return value if 0 < value < CGROUP_V1_UNLIMITED else None


def cgroup_memory_limit(proc_cgroup: Optional[str] = None, root: Optional[str] = None) -> Optional[int]:
    """The smallest memory limit of this process's cgroup and those above it: v2 ``memory.max``
    (systemd's ``MemoryMax=``, a container's limit), v1 ``memory.limit_in_bytes``; None when
    there is none or it cannot be read. ``proc_cgroup`` and ``root`` default to ``PROC_CGROUP``
    and ``CGROUP_ROOT``."""
    proc_cgroup = proc_cgroup or PROC_CGROUP
    root = root or CGROUP_ROOT
    try:
        with open(proc_cgroup, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    files: List[str] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":  # v2: "0::/system.slice/edgewise-edge.service"
            files += [os.path.join(f, "memory.max") for f in _cgroup_folders(root, parts[2])]
        elif "memory" in parts[1].split(","):  # v1: "4:memory:/system.slice/..."
            files += [os.path.join(f, "memory.limit_in_bytes")
                      for f in _cgroup_folders(os.path.join(root, "memory"), parts[2])]
    limits = [b for b in (_limit_in(f) for f in files) if b is not None]
    return min(limits) if limits else None


def memory_bytes() -> Tuple[Optional[int], str]:
    """The memory the daemon may use and what sets it: the device's (``MemTotal``), or its
    cgroup's limit where that is smaller; (None, "") where neither can be read."""
    total, limit = mem_total_bytes(), cgroup_memory_limit()
    if limit is not None and (total is None or limit < total):
        return limit, "memory limit of this daemon's cgroup (MemoryMax=, a container's limit)"
    return total, "memory of this device"


def worst_case_bytes(frame_bytes: Mapping[str, int], queue_sizes: Mapping[str, int], max_batch: int,
                     max_in_flight: int) -> int:
    """The bytes of frames the daemon may hold at once: each stream's queue and the frame being
    read at its own size, two inference batches and ``2 x max_in_flight`` escalations (in
    flight, and waiting for the spool) at the largest size (``max_in_flight`` 0: no cloud)."""
    if not frame_bytes:
        return 0
    largest = max(frame_bytes.values())
    queued = sum((queue_sizes.get(sid, 0) + 1) * size for sid, size in frame_bytes.items())
    return queued + (2 * max_batch + 2 * max_in_flight) * largest


class FrameMemory:
    """Told each stream's frame shape (``seen``, per frame: a dict lookup unless the size
    grew), warns once when ``worst_case_bytes`` passes ``share`` of ``total`` bytes (by default
    ``memory_bytes``: the device's memory or its cgroup's limit, the smaller)."""

    def __init__(self, queue_sizes: Mapping[str, int], max_batch: int, max_in_flight: int,
                 total: Optional[int] = None, share: float = WARN_SHARE) -> None:
        self.queue_sizes = dict(queue_sizes)
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.total, self.what = memory_bytes() if total is None else (total, "memory of this device")
        self.share = share
        self.frame_bytes: Dict[str, int] = {}  # each stream's largest frame so far
        self.sizes: Dict[str, str] = {}  # its width x height, for the warning
        self.warned = False

    def seen(self, stream_id: str, shape: Tuple[int, ...]) -> Optional[str]:
        """Note a frame of ``shape`` from ``stream_id``; the warning when it is the one that
        crosses the line (logged here too), else None."""
        size = 1
        for n in shape:
            size *= int(n)
        if size <= self.frame_bytes.get(stream_id, 0):
            return None
        self.frame_bytes[stream_id] = size
        self.sizes[stream_id] = f"{shape[1]}x{shape[0]}"
        if self.warned or not self.total:
            return None
        worst = worst_case_bytes(self.frame_bytes, self.queue_sizes, self.max_batch, self.max_in_flight)
        if worst <= self.share * self.total:
            return None
        self.warned = True
        sizes = ", ".join(f"{sid} {wh}" for sid, wh in self.sizes.items())
        message = (f"frames may hold {worst / 2**30:.1f} GiB at once, {worst / self.total:.0%} of the "
                   f"{self.total / 2**30:.1f} GiB {self.what} ({sizes}; per stream its streams[].queue_size + 1, two batches "
                   f"of model.max_batch {self.max_batch}, and twice cloud.max_in_flight {self.max_in_flight} "
                   "escalations): lower those settings, or have the cameras send a lower resolution, before "
                   "the kernel's OOM killer ends the daemon")
        log.warning("%s", message)
        return message
