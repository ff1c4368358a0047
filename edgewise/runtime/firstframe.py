"""One grey frame through a model before it is trusted: what ``edgewise model info`` and
``edgewise edge check-config`` run, so that a model every runtime would refuse at its first
frame is refused where the operator checks it.

A model's metadata and graph can be valid while its output is not one this runtime decodes:
a symbolic output width that disagrees with the class names, a dynamic YOLOv8 export
(``[B,4+nc,N]``, whose shape only a run shows), logits where scores belong. Only running it
shows these; ``edgewise.runtime.metadata.check_output`` is the one rule every backend applies.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from edgewise.errors import ModelError
from edgewise.runtime.metadata import ModelInfo, check_output


def first_frame_problem(info: ModelInfo) -> Optional[str]:
    """None when one grey frame through the model (ONNX Runtime on the CPU, at its fixed
    batch and input size) gives an output the runtime decodes, else the one-line reason every
    runtime would refuse it with at its first frame."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    shape = (info.fixed_batch or 1, 3, info.imgsz[0], info.imgsz[1])
    try:
        sess = ort.InferenceSession(str(info.path), so, providers=["CPUExecutionProvider"])
        frame = np.full(shape, 114 / 255, np.float16 if info.input_dtype == "float16" else np.float32)
        raw = sess.run([info.output_name], {info.input_name: frame})[0]
        check_output(info, shape, np.asarray(raw, np.float32))
    except ModelError as e:
        return "first inference: " + str(e).replace(f"{info.path}: ", "", 1)
    except Exception as e:  # ONNX Runtime failing at run time (e.g. a shape the graph cannot take)
        return f"first inference ({shape[2]}x{shape[3]}): ONNX Runtime: " + " ".join(str(e).split())[:300]
    return None
