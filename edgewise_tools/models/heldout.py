"""Run a float and an INT8 model on the same held-out frames: agreement and speed.

Frames are letterboxed and decoded exactly as the runtime does
(``edgewise.runtime.letterbox.preprocess_batch`` and ``edgewise.runtime.decoding.decode``);
the comparison itself is ``edgewise_tools.models.agreement.compare``. The two models run
alternately frame by frame, so their inference times (``Speed``) are measured under the
same machine load; ``cpu_int8_support`` says what this CPU offers ONNX Runtime's INT8
kernels (VNNI or not), since that decides the speed-up.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgewise.detections import Detections
from edgewise.runtime.cpu import cpu_int8_support
from edgewise_tools.models.agreement import Agreement, compare
from edgewise_tools.models.calibration import FrameSource, Progress


@dataclass
class Speed:
    """INT8 against float inference time on this CPU (batch 1, interleaved per frame).

    Attributes:
        frames: timed frames (the first, warm-up frame is not counted when there are more).
        float_ms, int8_ms: median inference milliseconds per frame.
        speedup: median over frames of float time / INT8 time.
        threads: ONNX Runtime intra-op threads (0 = its default).
        cpu: ``cpu_int8_support()``.
    """

    frames: int
    float_ms: float
    int8_ms: float
    speedup: float
    threads: int
    cpu: str

    def summary(self) -> str:
        threads = f"{self.threads} threads" if self.threads else "default threads"
        return (
            f"speed: INT8 {self.speedup:.2f}x float ({self.int8_ms:.1f} vs {self.float_ms:.1f} ms "
            f"per frame, batch 1, median of {self.frames} frames, {threads}) on this CPU ({self.cpu})"
        )

    def as_dict(self) -> Dict[str, Any]:
        return {
            "frames": self.frames,
            "float_ms": round(self.float_ms, 2),
            "int8_ms": round(self.int8_ms, 2),
            "speedup": round(self.speedup, 3),
            "threads": self.threads,
            "cpu": self.cpu,
        }


def cpu_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session; ``threads`` intra-op threads (0 = ORT default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads > 0:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def detect_frames(
    session: Any,
    frames: Sequence[np.ndarray],
    names: Sequence[str],
    imgsz: Tuple[int, int],
    stride: int,
    conf_thres: float,
    iou_thres: float,
    source: str = "",
    run_seconds: Optional[List[float]] = None,
) -> List[Detections]:
    """Letterbox, run and decode frames one at a time (a fixed batch is filled with copies).

    ``run_seconds``, when given, receives the inference time of each frame.
    """
    from edgewise.runtime.decoding import DecodeParams, decode
    from edgewise.runtime.letterbox import preprocess_batch

    params = DecodeParams(conf_thres=conf_thres, iou_thres=iou_thres)
    inp = session.get_inputs()[0]
    fixed = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 1 else 1
    out: List[Detections] = []
    for f in frames:
        x, metas = preprocess_batch([f] * fixed, imgsz, auto=False, stride=stride)
        t0 = time.perf_counter()
        raw = session.run(None, {inp.name: x})[0][:1]
        if run_seconds is not None:
            run_seconds.append(time.perf_counter() - t0)
        out.extend(decode(raw, list(metas[:1]), names, params, source))
    return out


def check_agreement(
    float_path: Path,
    int8_path: Path,
    source: FrameSource,
    indices: Sequence[int],
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    threads: int = 0,
    progress: Optional[Progress] = None,
    imgsz: Union[int, Sequence[int], None] = None,
) -> Tuple[Agreement, Optional[Speed]]:
    """Run both models on the frames ``indices`` of ``source``; compare detections and speed.

    ``imgsz``: input size of a model without size metadata (see ``load_model_info``).
    The speed is None when no frame could be read.
    """
    from edgewise.runtime.metadata import load_model_info

    info = load_model_info(float_path, imgsz)
    fs, qs = cpu_session(float_path, threads), cpu_session(int8_path, threads)
    refs: List[Detections] = []
    cands: List[Detections] = []
    t_float: List[float] = []
    t_int8: List[float] = []
    for k, (_, frame) in enumerate(source.read(indices)):
        # Alternate which model runs first so neither always follows the other's cache state.
        order = [(fs, refs, t_float, "float"), (qs, cands, t_int8, "int8")]
        for session, dets, times, label in order if k % 2 == 0 else order[::-1]:
            dets.extend(
                detect_frames(
                    session, [frame], info.names, info.imgsz, info.stride, conf_thres, iou_thres,
                    label, times,
                )
            )
        if progress is not None:
            progress("agreement", k + 1, len(indices))
    speed: Optional[Speed] = None
    if t_float:
        skip = 1 if len(t_float) > 1 else 0  # the first run includes ONNX Runtime's lazy set-up
        ratios = [f / q for f, q in zip(t_float[skip:], t_int8[skip:])]
        speed = Speed(
            frames=len(ratios),
            float_ms=statistics.median(t_float[skip:]) * 1e3,
            int8_ms=statistics.median(t_int8[skip:]) * 1e3,
            speedup=statistics.median(ratios),
            threads=threads,
            cpu=cpu_int8_support(),
        )
    return compare(refs, cands, iou_thres=0.5), speed
