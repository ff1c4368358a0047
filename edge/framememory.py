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
settings to lower, when the worst case passes ``WARN_SHARE`` of the device's memory.
"""

from __future__ import annotations

import logging
from typing import Dict, Mapping, Optional, Tuple

log = logging.getLogger(__name__)

#: Share of the device's memory (``MemTotal``) the frames may take at worst before a warning.
WARN_SHARE = 0.5


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
    grew), warns once when ``worst_case_bytes`` passes ``share`` of ``total`` bytes."""

    def __init__(self, queue_sizes: Mapping[str, int], max_batch: int, max_in_flight: int,
                 total: Optional[int] = None, share: float = WARN_SHARE) -> None:
        self.queue_sizes = dict(queue_sizes)
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.total = mem_total_bytes() if total is None else total
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
        message = (f"frames may hold {worst / 2**30:.1f} GiB at once, {worst / self.total:.0%} of this device's "
                   f"{self.total / 2**30:.1f} GiB ({sizes}; per stream its streams[].queue_size + 1, two batches "
                   f"of model.max_batch {self.max_batch}, and twice cloud.max_in_flight {self.max_in_flight} "
                   "escalations): lower those settings, or have the cameras send a lower resolution, before "
                   "the kernel's OOM killer ends the daemon")
        log.warning("%s", message)
        return message
