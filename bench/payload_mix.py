"""The images a camera fleet escalates: region payloads as the shipped camera edge builds them.

Routing benches that send one image over and over give every request the same cost, and then
no router can know more than nginx's connection count (``bench/routing_sim.py``). Real
escalations differ: with ``payload.mode: regions`` the edge sends a mosaic of the full-resolution
crops it doubts, or the whole frame when there is no region or they cover too much of it
(``edgewise.regions``), and a cloud model that runs each image at its own size (the camera pair's,
``input_size: native``) spends time in proportion to those pixels. This module makes that mix
from scratch, nothing downloaded: ``edgewise synth --difficulty camera`` frames (validation
sprites and backgrounds), the camera pair's INT8 edge model with the motion detector over each
stream in frame order (``edgewise_tools.evaluation.frames.edge_pass``, as the eval runs it), and
the payload that ``examples/policy.yaml`` plans for each frame, JPEG-encoded at its
quality. Every frame's payload is kept, not only those the policy would escalate; how the
escalated frames' mix differs was not measured (hard frames plausibly carry more regions).

    .venv/bin/python bench/payload_mix.py     # prints the mix's pixel and byte distribution
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EDGE_MODEL = ROOT / "models" / "camera" / "edge-int8.onnx"
POLICY = ROOT / "examples" / "policy.yaml"


@dataclass(frozen=True)
class Payload:
    jpeg: bytes
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def region_payloads(frames: int = 30, streams: int = 4, seed: int = 20261202) -> list[Payload]:
    """One payload per generated frame (``streams`` x ``frames``), in stream and frame order."""
    from edgewise.hardness.signals import score_bands
    from edgewise.policy import load_policy
    from edgewise.runtime import Detector
    from edgewise_tools.evaluation.frames import edge_pass

    policy = load_policy(POLICY)
    pl = policy.spec.payload
    edge = Detector.from_file(EDGE_MODEL, threads=1)
    out: list[Payload] = []
    with tempfile.TemporaryDirectory(prefix="edgewise-mix-") as tmp:
        subprocess.run([sys.executable, "-m", "edgewise", "synth", "--out", tmp, "--difficulty", "camera",
                        "--split", "val", "--frames", str(frames), "--streams", str(streams), "--seed", str(seed)],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        for v in edge_pass(Path(tmp), edge, policy):
            plan = pl.plan(v.image, v.edge, v.motion.blobs, score_bands(v.edge, v.config), "regions")
            ok, buf = cv2.imencode(".jpg", plan.image, [cv2.IMWRITE_JPEG_QUALITY, pl.jpeg_quality])
            if not ok:
                raise RuntimeError("could not JPEG-encode a payload")
            h, w = plan.image.shape[:2]
            out.append(Payload(buf.tobytes(), w, h))
    return out


def describe(mix: list[Payload]) -> str:
    px = sorted(p.pixels for p in mix)
    full = sum(1 for p in mix if p.pixels >= 1280 * 720)
    q = lambda f: px[min(len(px) - 1, int(f * len(px)))]  # noqa: E731
    mean = sum(px) / len(px)
    return (f"{len(mix)} payloads: {full} whole frames ({full / len(mix):.0%}); pixels p10 {q(.1):,} / p50 {q(.5):,} / "
            f"p90 {q(.9):,} / max {px[-1]:,}, mean {mean:,.0f} (cost CV {(sum((x - mean) ** 2 for x in px) / len(px)) ** .5 / mean:.2f}); "
            f"bytes mean {sum(len(p.jpeg) for p in mix) / len(mix) / 1e3:.1f} kB")


if __name__ == "__main__":
    print(describe(region_payloads()))
