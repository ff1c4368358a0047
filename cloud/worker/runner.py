"""The worker's model adapter: wire image -> prepared input -> Detections, per request.

Wraps ``edgewise.runtime.Detector`` (the shared detector; no second one here)
and splits its stages between the worker's two thread pools:

* ``prepare`` (decode pool, many threads): ``edgewise.wire.decode_image`` +
  ``Detector.preprocess`` of one image. A bad image fails here, for that
  request only, before it ever reaches the batcher.
* ``run`` (inference thread, one): stack the prepared images, ``infer``,
  ``postprocess``, map crops back into source-frame pixels
  (``wire.shift_detections``). Wrapped in
  ``batching.run_isolated`` so a failure is retried per image and only the
  image that fails alone gets an error.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cloud.worker.batching import run_isolated
from cloud.worker.settings import WorkerSettings
from edgewise import wire
from edgewise.detections import Detections
from edgewise.errors import InvalidInputError
from edgewise.runtime.detector import Detector
from edgewise.runtime.letterbox import LetterboxMeta
from edgewise.v1 import detect_pb2


@dataclass(frozen=True)
class Prepared:
    """One request's letterboxed input and how to map its boxes back."""

    tensor: np.ndarray  # [1,3,H,W] float32
    meta: LetterboxMeta
    offset: tuple[float, float] = (0.0, 0.0)
    source_size: tuple[int, int] | None = None  # (width, height) of the full frame


class ModelRunner:
    """One loaded model with the worker's per-request stage split."""

    def __init__(self, detector: Detector, name: str | None = None) -> None:
        self.detector = detector
        info = detector.info
        self.name = name or detector.source
        self.version = str(info.metadata.get("version") or "") or f"sha256:{info.sha256[:12]}"
        self.imgsz = info.imgsz
        if not info.dynamic_batch and info.fixed_batch != 1:
            # A fixed-batch export cannot take the batcher's variable batches.
            raise InvalidInputError(
                f"{info.path}: the model has a fixed batch of {info.fixed_batch}; "
                "export it with a dynamic batch axis for the worker"
            )
        self.max_batch = None if info.dynamic_batch else 1

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> ModelRunner:
        """Load ``settings.model`` on the best backend with the worker's thresholds."""
        det = Detector.from_file(
            settings.model,
            conf_thres=settings.conf_threshold,
            iou_thres=settings.iou_threshold,
            max_det=settings.max_det,
            threads=settings.threads or None,
            imgsz=settings.imgsz or None,
        )
        return cls(det)

    # -- decode pool ------------------------------------------------------------
    def prepare(self, image: detect_pb2.Image) -> Prepared:
        """Decode and letterbox one wire image; ``InvalidInputError`` names what is wrong."""
        bgr = wire.decode_image(image)
        return self.prepare_array(
            bgr,
            offset=(float(image.offset_x), float(image.offset_y)),
            source_size=(int(image.source_width), int(image.source_height))
            if image.source_width and image.source_height else None,
        )

    def prepare_array(
        self,
        bgr: np.ndarray,
        offset: tuple[float, float] = (0.0, 0.0),
        source_size: tuple[int, int] | None = None,
    ) -> Prepared:
        """Letterbox a decoded BGR image (also used for warm-up)."""
        tensor, metas = self.detector.preprocess([bgr])
        return Prepared(tensor, metas[0], offset, source_size)

    def dummy(self) -> Prepared:
        """A gray frame at the model's input size, for warm-up batches."""
        h, w = self.imgsz
        return self.prepare_array(np.full((h, w, 3), 114, np.uint8))

    # -- inference thread -------------------------------------------------------
    def run(self, items: Sequence[Prepared]) -> tuple[list[Detections | Exception], float]:
        """Detections (or the error) per item, in order, and the compute seconds."""
        t0 = time.perf_counter()
        out = run_isolated(items, self._run_batch)
        return out, time.perf_counter() - t0

    def _run_batch(self, items: Sequence[Prepared]) -> list[Detections]:
        batch = items[0].tensor if len(items) == 1 else np.concatenate([p.tensor for p in items])
        raw = self.detector.infer(batch)
        dets = self.detector.postprocess(raw, [p.meta for p in items])
        return [
            wire.shift_detections(d, p.offset[0], p.offset[1], p.source_size)
            for d, p in zip(dets, items, strict=True)
        ]

    def close(self) -> None:
        self.detector.close()
