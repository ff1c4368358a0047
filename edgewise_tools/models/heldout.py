"""Run a float and an INT8 model on the same held-out frames and compare their detections.

Frames are letterboxed and decoded exactly as the runtime does
(``edgewise.runtime.letterbox.preprocess_batch`` and ``edgewise.runtime.decoding.decode``);
the comparison itself is ``edgewise_tools.models.agreement.compare``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from edgewise.detections import Detections
from edgewise_tools.models.agreement import Agreement, compare
from edgewise_tools.models.calibration import FrameSource, Progress


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
) -> List[Detections]:
    """Letterbox, run and decode frames one at a time (a fixed batch is filled with copies)."""
    from edgewise.runtime.decoding import DecodeParams, decode
    from edgewise.runtime.letterbox import preprocess_batch

    params = DecodeParams(conf_thres=conf_thres, iou_thres=iou_thres)
    inp = session.get_inputs()[0]
    fixed = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 1 else 1
    out: List[Detections] = []
    for f in frames:
        x, metas = preprocess_batch([f] * fixed, imgsz, auto=False, stride=stride)
        raw = session.run(None, {inp.name: x})[0][:1]
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
) -> Agreement:
    """Run both models on the frames ``indices`` of ``source`` and compare detections."""
    from edgewise.runtime.metadata import load_model_info

    info = load_model_info(float_path)
    fs, qs = cpu_session(float_path, threads), cpu_session(int8_path, threads)
    refs: List[Detections] = []
    cands: List[Detections] = []
    for k, (_, frame) in enumerate(source.read(indices)):
        refs.extend(
            detect_frames(
                fs, [frame], info.names, info.imgsz, info.stride, conf_thres, iou_thres, "float"
            )
        )
        cands.extend(
            detect_frames(
                qs, [frame], info.names, info.imgsz, info.stride, conf_thres, iou_thres, "int8"
            )
        )
        if progress is not None:
            progress("agreement", k + 1, len(indices))
    return compare(refs, cands, iou_thres=0.5)
