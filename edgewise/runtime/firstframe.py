"""One grey frame through a model before it is trusted: what ``edgewise model info`` and
``edgewise edge check-config`` run, so that a model every runtime would refuse at its first
frame is refused where the operator checks it.

A model's metadata and graph can be valid while its output is not one this runtime decodes:
a symbolic output width that disagrees with the class names, a dynamic YOLOv8 export
(``[B,4+nc,N]``, whose shape only a run shows), logits where scores belong. Only running it
shows these; ``edgewise.runtime.metadata.check_output`` is the one rule every backend applies.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

import numpy as np

from edgewise.errors import ModelError
from edgewise.runtime.metadata import ModelInfo, check_output


def batch_failure(info: ModelInfo, batch: int, exc: BaseException, setting: str) -> ModelError:
    """The error for a model that runs one frame but not ``batch`` of them: most often a batch
    dimension dynamic in name only (a reshape inside fixed at 1), or a batch that does not fit
    the device. It passed every check, and then the edge dropped every batch it formed and the
    worker ran one image per call."""
    why = " ".join(str(exc).replace(f"{info.path}: ", "", 1).split())[:300] or type(exc).__name__
    return ModelError(f"{info.path}: one frame runs but a batch of {batch} fails ({why}): the model's batch "
                      "dimension may be dynamic in name only (a reshape fixed at 1), or the batch does not fit; "
                      f"re-export it with a truly dynamic batch, or set {setting} to 1")


def run_failure(info: ModelInfo, hw: Tuple[int, int], exc: BaseException) -> ModelError:
    """The one-line error for a model that loaded but whose first frame failed in the runtime (a
    shape the graph cannot take): the runtime's own error is several lines. A run that found no
    memory (``short_of_memory``) is no fault of the model and is not made one of these."""
    why = " ".join(str(exc).replace(f"{info.path}: ", "", 1).split())[:300].rstrip(".") or type(exc).__name__
    return ModelError(f"{info.path}: first inference ({hw[0]}x{hw[1]}) failed: {why}; check the model with "
                      "`edgewise model info` and fix or re-export it")


#: how ONNX Runtime, CUDA and TensorRT say a run found no memory ("CUDA failure 2: out of memory",
#: "BFCArena ... Failed to allocate memory", "std::bad_alloc", "OutOfMemory")
_NO_MEMORY = re.compile(r"out of memory|outofmemory|failed to allocate|bad_alloc", re.IGNORECASE)


def short_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the run found no memory for it: a shortage (another process holding
    the GPU's memory, or on a Jetson the memory it shares with the CPU) that a later start may not
    meet, where the model is not at fault."""
    return isinstance(exc, MemoryError) or bool(_NO_MEMORY.search(str(exc)))


def first_frame_problem(info: ModelInfo, batch: int = 2, setting: str = "model.max_batch") -> Optional[str]:
    """None when one grey frame through the model (ONNX Runtime on the CPU, at its fixed
    batch and input size), and for a dynamic batch ``batch`` of them, give an output the
    runtime decodes, else the one-line reason every runtime would refuse it with
    (``setting``: what limits the batch where the model runs)."""
    one, many = first_frame_problems(info, batch, setting)
    return one or many


def first_frame_problems(info: ModelInfo, batch: int = 2,
                         setting: str = "model.max_batch") -> Tuple[Optional[str], Optional[str]]:
    """``first_frame_problem`` in two parts: why one frame fails (the model is unusable), and
    why, one frame running, a dynamic batch of ``batch`` fails (usable with ``setting`` 1)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    shape = (info.fixed_batch or 1, 3, info.imgsz[0], info.imgsz[1])
    dtype = np.float16 if info.input_dtype == "float16" else np.float32
    try:
        sess = ort.InferenceSession(str(info.path), so, providers=["CPUExecutionProvider"])
        raw = sess.run([info.output_name], {info.input_name: np.full(shape, 114 / 255, dtype)})[0]
        check_output(info, shape, np.asarray(raw, np.float32))
    except ModelError as e:
        return "first inference: " + str(e).replace(f"{info.path}: ", "", 1), None
    except Exception as e:  # ONNX Runtime failing at run time (e.g. a shape the graph cannot take)
        return f"first inference ({shape[2]}x{shape[3]}): ONNX Runtime: " + " ".join(str(e).split())[:300], None
    if info.dynamic_batch and batch > 1:
        many = (batch,) + shape[1:]
        try:
            quiet = ort.RunOptions()
            quiet.log_severity_level = 4  # the failure is reported here, in one line
            raw = sess.run([info.output_name], {info.input_name: np.full(many, 114 / 255, dtype)}, quiet)[0]
            check_output(info, many, np.asarray(raw, np.float32))
        except Exception as e:
            return None, str(batch_failure(info, batch, e, setting)).replace(f"{info.path}: ", "", 1)
    return None, None
