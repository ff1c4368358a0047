"""``Detector``: BGR images in, ``Detections`` per image out.

The three stages are exposed separately so a pipeline can time them and run
them on different threads: ``preprocess`` (validate + letterbox into one NCHW
batch), ``infer`` (the backend), ``postprocess`` (YOLOv5 decode + NMS + map back
to source pixels). ``detect`` chains them.

Input size: ``model`` (default) letterboxes every image to the model's ``imgsz``;
``auto`` is ``native`` for a model that asks for it (symbolic height/width and the
metadata ``input_size: native``, as ``python -m edgewise_tools.train.camera`` exports
the camera pair's cloud model), else ``model``; ``native`` runs each image at its own scale (its size rounded up to the stride,
padded, never scaled up; scaled down only beyond ``max_side``), which needs a model
exported with a symbolic height/width. A model trained on full-resolution crops thus
sees a 1280x720 frame as 1280x736 and a region crop at its own size: the cloud side
of a camera whose far objects vanish in the edge's downscale.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from edgewise.detections import Detections
from edgewise.errors import ConfigError, DeploymentError, InvalidInputError
from edgewise.images import check_bgr
from edgewise.runtime.backends import InferenceBackend
from edgewise.runtime.decoding import DecodeParams, decode
from edgewise.runtime.letterbox import LetterboxMeta, native_shape, preprocess_batch
from edgewise.runtime.metadata import (
    DEFAULT_CONF,
    ImgszLike,
    ModelInfo,
    check_output,
    imgsz_guess_warning,
    load_model_info,
)
from edgewise.runtime.opsets import tensorrt_problems

log = logging.getLogger(__name__)

BACKENDS = ("auto", "onnxruntime", "tensorrt")
INPUT_SIZES = ("model", "native", "auto")
#: metadata key by which a model asks to run at each image's native size (``auto``)
NATIVE_KEY = "input_size"


def validate_images(images: Sequence[Any]) -> None:
    """Every image must be a non-empty HxWx3 uint8 BGR array; errors name the index."""
    if isinstance(images, np.ndarray):
        raise InvalidInputError(
            "images must be a sequence of HxWx3 uint8 arrays (a list), not one array; "
            "wrap a single image as [image]"
        )
    for i, im in enumerate(images):
        check_bgr(im, f"image {i}")


class Detector:
    """A YOLOv5 detector on one backend.

    Attributes:
        info: the validated model.
        params: decode thresholds.
        backend: the ``InferenceBackend`` running the model.
        source: label put on the produced ``Detections`` (default: model file stem).
    """

    def __init__(
        self,
        info: ModelInfo,
        backend: InferenceBackend,
        params: DecodeParams = DecodeParams(),
        source: Optional[str] = None,
        input_size: str = "model",
        max_side: int = 0,
    ) -> None:
        if input_size not in INPUT_SIZES:
            raise ConfigError(f"input size {input_size!r}: use one of {', '.join(INPUT_SIZES)}")
        if input_size == "auto":
            input_size = auto_input_size(info)
        if input_size == "native" and any(side is not None for side in info.input_shape[2:4]):
            fixed = (f"is fixed at {info.imgsz[0]}x{info.imgsz[1]}" if not info.dynamic_hw else
                     f"has one side fixed ({info.input_shape[2] or '?'}x{info.input_shape[3] or '?'})")
            raise ConfigError(f"{info.path}: input size 'native' needs a model exported with a dynamic height and "
                              f"width; this one {fixed} (use 'model')")
        if max_side < 0:
            raise ConfigError(f"max_side must be >= 0 (0 = no cap), got {max_side}")
        self.info = info
        self.backend = backend
        self.params = params
        self.source = source if source is not None else info.path.stem
        self.imgsz = info.imgsz
        self.input_size = input_size
        self.max_side = int(max_side)
        # A model with a dynamic H/W could take YOLOv5's min-rect; a fixed one cannot.
        self.auto = False
        #: the first output was checked against the model's promises (``metadata.check_output``)
        self._output_checked = False

    @classmethod
    def from_file(
        cls,
        path: Union[str, Path],
        backend: str = "auto",
        conf_thres: Optional[float] = None,
        iou_thres: float = 0.45,
        max_det: int = 300,
        threads: Optional[int] = None,
        providers: Optional[Sequence[str]] = None,
        multi_label: bool = False,
        source: Optional[str] = None,
        cache_dir: Optional[Union[str, Path]] = None,
        precision: Optional[str] = None,
        imgsz: Optional[ImgszLike] = None,
        input_size: str = "model",
        max_side: int = 0,
        max_batch: int = 8,
        spinning: Optional[bool] = None,
    ) -> Detector:
        """Load and validate ``path`` and open it on ``backend``.

        ``auto`` picks native TensorRT when it is importable, a GPU is there and TensorRT can
        build the model (``opsets.tensorrt_problems``; a warning says why not), else ONNX Runtime (whose own provider list prefers TensorRT -> CUDA -> CPU).
        ``cache_dir`` / ``precision`` / ``max_batch`` (the largest batch an engine takes; part
        of its cache key) apply to TensorRT engines, ``spinning`` (busy-waiting pool threads; None
        = the runtime's default) to ONNX Runtime. ``imgsz`` is the input
        size of a model whose graph leaves it dynamic (see ``load_model_info``); a model
        whose size is only assumed is logged as a warning. ``input_size`` /
        ``max_side`` are described in the module docstring. ``conf_thres`` None is the
        model's own threshold (metadata ``edgewise_conf_thres``), else 0.25.
        """
        if backend not in BACKENDS:
            raise ConfigError(f"backend {backend!r}: use one of {', '.join(BACKENDS)}")
        info = load_model_info(path, imgsz)
        if conf_thres is None:
            conf_thres = info.conf_thres if info.conf_thres is not None else DEFAULT_CONF
            log.info("%s: score threshold %g (%s)", info.path, conf_thres,
                     "the model's own" if info.conf_thres is not None else "YOLOv5's default; the model states none")
        try:
            params = DecodeParams(conf_thres=conf_thres, iou_thres=iou_thres, max_det=max_det,
                                  multi_label=multi_label)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if info.imgsz_source == "default":
            log.warning("%s", imgsz_guess_warning(info))
        if input_size == "auto":
            input_size = auto_input_size(info)
        be: InferenceBackend
        why_not_trt = ""
        if backend == "auto":
            why_not_trt = tensorrt_unusable_reason()
            refusals = [] if why_not_trt else tensorrt_problems(info.ops, info.qdq)
            if refusals:
                why_not_trt = f"TensorRT cannot build {info.path}: {'; '.join(refusals)}"
                log.warning("backend auto: %s; running it on ONNX Runtime", why_not_trt)
            # a TensorRT engine is built for one input shape; native sizes vary per image
            backend = "onnxruntime" if why_not_trt or input_size == "native" else "tensorrt"
        if backend == "tensorrt" and input_size == "native":
            raise ConfigError("input size 'native' runs on ONNX Runtime (whose CUDA provider takes any shape); "
                              "a TensorRT engine is built for one input size")
        if backend == "tensorrt":
            from edgewise.runtime.backends.tensorrt import TensorRTBackend

            be = TensorRTBackend.from_onnx(info, cache_dir=cache_dir, precision=precision,
                                           max_batch=max_batch)
        else:
            from edgewise.runtime.backends.onnxruntime import OnnxRuntimeBackend

            try:
                be = OnnxRuntimeBackend(info, providers=providers, threads=threads, spinning=spinning)
            except DeploymentError as exc:
                if not why_not_trt:
                    raise
                raise DeploymentError(f"backend auto: TensorRT is not usable here ({why_not_trt}) "
                                      f"and {exc}") from None
        return cls(info, be, params, source, input_size, max_side)

    @property
    def names(self) -> Tuple[str, ...]:
        return self.info.names

    def preprocess(self, images: Sequence[np.ndarray]) -> Tuple[np.ndarray, List[LetterboxMeta]]:
        """Validate and letterbox BGR uint8 images into ``[B,3,H,W]`` float32 RGB /255."""
        validate_images(images)
        if self.input_size == "native" and len(images):
            # one batch needs one shape: the largest native shape, the others padded to it
            shapes = [native_shape(im.shape[:2], self.info.stride, self.max_side) for im in images]
            hw = (max(h for h, _ in shapes), max(w for _, w in shapes))
            return preprocess_batch(images, hw, auto=False, scaleup=False, stride=self.info.stride)
        return preprocess_batch(images, self.imgsz, auto=self.auto, stride=self.info.stride)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Run the model: ``[B,3,H,W]`` -> raw head ``[B,N,5+nc]``."""
        if batch.ndim != 4 or batch.shape[1] != 3:
            raise InvalidInputError(f"batch must be [B,3,H,W], got {batch.shape}")
        if batch.shape[0] == 0:
            return np.zeros((0, 0, 5 + self.info.nc), np.float32)
        raw = self.backend.run(batch)
        if not self._output_checked:
            # what the graph leaves symbolic (output width, rows) and the score range are known
            # only now: a model that cannot be decoded fails here, once, with a ModelError
            check_output(self.info, batch.shape, raw)
            self._output_checked = True
        return raw

    def postprocess(self, raw: np.ndarray, metas: Sequence[LetterboxMeta]) -> List[Detections]:
        """Decode + NMS + map back to source pixels, one ``Detections`` per image."""
        if raw.shape[0] == 0:
            return []
        return decode(raw, metas, self.info.names, self.params, self.source)

    def detect(self, images: Sequence[np.ndarray]) -> List[Detections]:
        """All three stages on a batch of BGR uint8 HxWx3 images."""
        batch, metas = self.preprocess(images)
        return self.postprocess(self.infer(batch), metas)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def auto_input_size(info: ModelInfo) -> str:
    """``native`` for a model that asks for it (symbolic height/width and the metadata
    ``input_size: native``), else ``model``. Both sides must be symbolic: ``dynamic_hw`` is
    also true of an input with one side fixed (``[B,3,384,'width']``), which 'native' cannot
    feed (each image its own height)."""
    free = info.dynamic_hw and all(side is None for side in info.input_shape[2:4])
    return "native" if free and info.metadata.get(NATIVE_KEY) == "native" else "model"


def tensorrt_unusable_reason() -> str:
    """Why native TensorRT cannot run here ("" when it can: importable and a CUDA device)."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt module is not installed"
    try:
        from edgewise.runtime.backends.tensorrt import cuda_device_name

        if cuda_device_name() is None:
            return "no CUDA device or libcudart"
        return ""
    except Exception as e:  # a broken install must not stop the ONNX Runtime path
        log.warning("TensorRT is installed but unusable (%s); using onnxruntime", e)
        return f"TensorRT is installed but unusable: {e}"
