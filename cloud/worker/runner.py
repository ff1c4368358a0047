"""The worker's model adapter: wire image -> prepared input -> Detections, per request.

Wraps ``edgewise.runtime.Detector`` (the shared detector; no second one here)
and splits its stages between the worker's two thread pools:

* ``prepare`` (decode pool, many threads): ``edgewise.wire.decode_image`` +
  ``Detector.preprocess`` of one image. A bad image fails here, for that
  request only, before it ever reaches the batcher.
* ``run`` (inference thread, one): stack the prepared images (images of one shape
  per model call: with ``input_size: native`` each image keeps its own size), ``infer``,
  ``postprocess``, map crops and packed regions back into source-frame pixels
  (``wire.map_to_source``). Wrapped in ``batching.run_isolated`` so a failure is retried
  per image and only the image that fails alone gets an error.
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
from edgewise.errors import EdgewiseError, ModelError
from edgewise.imagefiles import DEFAULT_MAX_PIXELS
from edgewise.regions import Tile
from edgewise.runtime.detector import Detector
from edgewise.runtime.letterbox import LetterboxMeta
from edgewise.runtime.metadata import setting_imgsz
from edgewise.v1 import detect_pb2


@dataclass(frozen=True)
class Prepared:
    """One request's letterboxed input and how to map its boxes back."""

    tensor: np.ndarray  # [1,3,H,W] float32
    meta: LetterboxMeta
    offset: tuple[float, float] = (0.0, 0.0)
    source_size: tuple[int, int] | None = None  # (width, height) of the full frame
    tiles: tuple[Tile, ...] = ()  # parts of the frame packed into the image (edgewise.regions)


class ModelRunner:
    """One loaded model with the worker's per-request stage split."""

    def __init__(self, detector: Detector, name: str | None = None) -> None:
        self.detector = detector
        info = detector.info
        self.name = name or detector.source
        self.version = str(info.metadata.get("version") or "") or f"sha256:{info.sha256[:12]}"
        self.imgsz = info.imgsz
        # A fixed-batch export takes the batcher's variable batches too: the backend runs
        # them in chunks of exactly its batch, the last one padded (backends.split_fixed_batch).
        self.max_batch = None if info.dynamic_batch else info.fixed_batch
        #: each image runs at its own size, so its time grows with its pixels (the worker
        #: then measures and reports its pixels/s)
        self.pixel_cost = detector.input_size == "native"

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> ModelRunner:
        """Load ``settings.model`` on the best backend with the worker's thresholds."""
        det = Detector.from_file(
            settings.model,
            conf_thres=settings.conf_threshold,
            iou_thres=settings.iou_threshold,
            max_det=settings.max_det,
            threads=settings.threads or None,
            input_size=settings.input_size,
            max_side=settings.native_max_side,
            imgsz=setting_imgsz(settings.imgsz),
        )
        return cls(det)

    # -- decode pool ------------------------------------------------------------
    def prepare(self, image: detect_pb2.Image, max_pixels: int = DEFAULT_MAX_PIXELS) -> Prepared:
        """Decode and letterbox one wire image (at most ``max_pixels``, the worker's
        ``max_image_pixels``); ``InvalidInputError`` names what is wrong."""
        bgr = wire.decode_image(image, max_pixels)
        offset, size, tiles = wire.source_mapping(image)
        return self.prepare_array(bgr, offset=offset, source_size=size, tiles=tiles)

    def prepare_array(
        self,
        bgr: np.ndarray,
        offset: tuple[float, float] = (0.0, 0.0),
        source_size: tuple[int, int] | None = None,
        tiles: tuple[Tile, ...] = (),
    ) -> Prepared:
        """Letterbox a decoded BGR image (also used for warm-up)."""
        tensor, metas = self.detector.preprocess([bgr])
        return Prepared(tensor, metas[0], offset, source_size, tiles)

    def dummy(self) -> Prepared:
        """A gray frame at the model's input size, for warm-up batches."""
        h, w = self.imgsz
        return self.prepare_array(np.full((h, w, 3), 114, np.uint8))

    def native_probe(self) -> Prepared | None:
        """With ``input_size: native``: a gray frame one stride larger than the model's size
        each way (an odd multiple of the stride), which a model whose true stride is larger
        than the stated one (a P6 model, 64, without stride metadata) cannot take; else None."""
        if not self.pixel_cost:
            return None
        s = self.detector.info.stride
        h, w = self.imgsz
        return self.prepare_array(np.full((h + s, w + s, 3), 114, np.uint8))

    def warmup_error(self, exc: Exception, probe: Prepared | None = None) -> EdgewiseError:
        """A warm-up failure (of ``probe``: ``native_probe``'s frame) as a one-line error naming
        the model and the cause."""
        info = self.detector.info
        if probe is None and isinstance(exc, EdgewiseError) and len(str(exc).splitlines()) <= 1:
            return exc  # ours already name the model and say what to do
        why = " ".join(str(exc).split())[:400] or type(exc).__name__
        if probe is not None:
            h, w = probe.tensor.shape[2:]
            return ModelError(f"{info.path}: inference at native size {h}x{w}, a multiple of the stride {info.stride}, "
                              f"failed ({why}); if the model's true stride is larger (P6 models: 64), state it "
                              "in the stride metadata")
        return ModelError(f"{info.path}: warm-up inference failed ({why}); the worker cannot serve this model: "
                          "check it with `edgewise model info` and fix or re-export it")

    # -- inference thread -------------------------------------------------------
    def run(self, items: Sequence[Prepared], whole: bool = False) -> tuple[list[Detections | Exception], float]:
        """Detections (or the error) per item, in order, and the compute seconds. A failed
        batch is retried one item at a time, so that only the items that fail alone fail;
        ``whole`` raises instead (the warm-up: a model that runs one image but not a batch
        would otherwise serve one image per call, silently)."""
        t0 = time.perf_counter()
        out: list[Detections | Exception] = list(self._run_batch(items)) if whole else \
            run_isolated(items, self._run_batch)
        return out, time.perf_counter() - t0

    def call_sizes(self, items: Sequence[Prepared]) -> list[int]:
        """Images per model call when ``run`` takes ``items``: one call per input shape."""
        return [len(idx) for idx in _by_shape(items)]

    def _run_batch(self, items: Sequence[Prepared]) -> list[Detections]:
        out: list[Detections | None] = [None] * len(items)
        for idx in _by_shape(items):
            batch = items[idx[0]].tensor if len(idx) == 1 else np.concatenate([items[i].tensor for i in idx])
            raw = self.detector.infer(batch)
            for i, d in zip(idx, self.detector.postprocess(raw, [items[i].meta for i in idx]), strict=True):
                p = items[i]
                out[i] = wire.map_to_source(d, p.offset, p.source_size, p.tiles)
        return out  # type: ignore[return-value]  # every index is in exactly one group: none is left None

    def close(self) -> None:
        self.detector.close()


def _by_shape(items: Sequence[Prepared]) -> list[list[int]]:
    """Indices of ``items`` grouped by input shape, in order of first appearance: one model
    call per group (with ``input_size: native`` each image may have its own size)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(items):
        groups.setdefault(tuple(p.tensor.shape[2:]), []).append(i)
    return list(groups.values())
