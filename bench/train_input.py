"""Trainer input benchmark: how fast batches are prepared, against what a GPU consumes.

On the lent H200 (models/MODEL_CARD.md, "The mission's pair on a GPU") YOLOv5x at 1280 trained
at 14-17 images/s in float32 and 20-21 with bfloat16 autocast: no faster than one process
prepares 1280x720 frames. This measures that preparation, side by side in one run, on
generated ``camera`` frames (``edgewise synth --difficulty camera``, 1280x720):

* **float batches**: ``batches()`` as the trainer used it, float32 0..1 scaled on the CPU;
* **uint8 batches**: ``batches(as_uint8=True)``, scaled by the trainer on its device (the
  shipped trainer), the same values;
* **uint8, prefetched**: the same through ``prefetched()`` (a background thread), consumed
  by a loop that spends ``--step-ms`` per batch as a GPU step would (sleeping: the GIL is
  free, as it is while CUDA works): the images/s a training loop sees.

Prints a Markdown table of medians over ``--repeat`` passes, the ratio to the float batches,
and the CPU.

    .venv/bin/python bench/train_input.py            # 1280 px, batch 16, about 2 min
    .venv/bin/python bench/train_input.py --imgsz 640 --step-ms 100
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgewise.runtime.cpu import cpu_flags
from edgewise.synth import PRESETS, SynthJob, generate
from edgewise_tools.train.data import Augment, YoloDataset, batches, prefetched


def _pass(run: Callable[[], int]) -> float:
    t = time.perf_counter()
    n = run()
    return n / (time.perf_counter() - t)


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--imgsz", type=int, default=1280)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--frames", type=int, default=48, help="generated 1280x720 camera frames")
    p.add_argument("--step-ms", type=float, default=400.0,
                   help="time a training step takes per batch in the prefetched row (default: 400)")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "cam"
        generate(SynthJob(out=data, frames=a.frames // 4, streams=4, seed=31, split="train", width=1280, height=720,
                          difficulty=PRESETS["camera"], stride=1))
        ds = YoloDataset(data, a.imgsz)
    aug = Augment()

    def plain(as_uint8: bool) -> Callable[[], int]:
        def run() -> int:
            return sum(len(x) for x, _, _ in batches(ds, a.batch, np.random.default_rng(0), aug, as_uint8=as_uint8))
        return run

    def ahead() -> int:
        n = 0
        for x, _, _ in prefetched(batches(ds, a.batch, np.random.default_rng(0), aug, as_uint8=True)):
            time.sleep(a.step_ms / 1000.0)
            n += len(x)
        return n

    def stepped() -> int:
        n = 0
        for x, _, _ in batches(ds, a.batch, np.random.default_rng(0), aug, as_uint8=True):
            time.sleep(a.step_ms / 1000.0)
            n += len(x)
        return n

    rows = [("float batches (previous trainer)", plain(False)), ("uint8 batches (shipped trainer)", plain(True)),
            (f"uint8 + a {a.step_ms:g} ms step, in line", stepped),
            (f"uint8 + a {a.step_ms:g} ms step, prefetched (shipped trainer)", ahead)]
    rates = {name: statistics.median(_pass(run) for _ in range(a.repeat)) for name, run in rows}
    base = rates[rows[0][0]]
    print(f"{len(ds)} camera frames letterboxed to {a.imgsz}, batch {a.batch}, augmentation on; "
          f"median of {a.repeat} passes; {os.cpu_count()} CPUs, AVX-512: {'avx512f' in (cpu_flags() or ())}\n")
    print("| input | images/s | x float batches |")
    print("|---|---|---|")
    for name, _ in rows:
        print(f"| {name} | {rates[name]:.1f} | {rates[name] / base:.2f} |")
    print(f"\nA step of {a.step_ms:g} ms alone allows {a.batch * 1000 / a.step_ms:.1f} images/s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
