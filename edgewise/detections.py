"""Detections of one image: the data type every stage of edgewise passes around.

The runtime (decode + NMS) produces it, hardness signals and policies read it,
merge combines two of them, and the wire codecs turn it into protobuf. Boxes are
xyxy in *source-image pixels*; arrays are kept columnar so per-frame code stays
vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Detections:
    """Detections of one image, columnar.

    Attributes:
        boxes: float32 ``[N, 4]`` xyxy in source pixels.
        scores: float32 ``[N]`` final confidence (objectness x class score).
        class_ids: int32 ``[N]`` index into ``names``.
        class_scores: float32 ``[N, nc]`` per-class scores (objectness x class
            probability) kept for hardness signals; may be ``None`` when unknown
            (for example boxes received from a peer that did not send them).
        objectness: float32 ``[N]`` raw objectness of each kept box, or ``None``.
        names: class names; ``names[class_ids[i]]`` names box ``i``.
        source: which model produced the boxes (``"edge"``, ``"cloud"``, a model
            name); merge keeps it per box in ``sources``.
        sources: per-box producer when boxes of several models were merged, or
            ``None`` when all came from ``source``.
        missed_objectness: highest objectness among head candidates that were
            *not* kept and do not overlap a kept box (IoU < 0.5); the
            "missed object" hardness signal, so a frame with no detections can
            still be escalated. 0 when unknown.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    class_scores: Optional[np.ndarray] = None
    objectness: Optional[np.ndarray] = None
    names: Tuple[str, ...] = ()
    source: str = ""
    sources: Optional[Tuple[str, ...]] = field(default=None)
    missed_objectness: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.scores)
        if self.boxes.shape != (n, 4):
            raise ValueError(f"Detections.boxes must be [N,4] with N={n}, got {self.boxes.shape}")
        if self.class_ids.shape != (n,):
            raise ValueError(f"Detections.class_ids must be [{n}], got {self.class_ids.shape}")
        if self.class_scores is not None and (
            self.class_scores.ndim != 2 or self.class_scores.shape[0] != n
        ):
            raise ValueError(
                f"Detections.class_scores must be [N,nc] with N={n}, got {self.class_scores.shape}"
            )
        if self.objectness is not None and self.objectness.shape != (n,):
            raise ValueError(f"Detections.objectness must be [{n}], got {self.objectness.shape}")
        if self.sources is not None and len(self.sources) != n:
            raise ValueError(f"Detections.sources must have {n} entries, got {len(self.sources)}")

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def scored_within(self, low: Any, high: Any) -> np.ndarray:
        """Mask of the boxes whose score lies in [``low``, ``high``] (scalars or one bound per
        box), compared in float32 like the scores: a score of 0.6 (stored as 0.6000000238) is
        inside a band ending at 0.6. The one test of "uncertain" for signals and payloads."""
        s = self.scores.astype(np.float32, copy=False)
        return (s >= np.asarray(low, np.float32)) & (s <= np.asarray(high, np.float32))

    @classmethod
    def empty(cls, names: Sequence[str] = (), source: str = "", nc: int = 0) -> Detections:
        """No boxes (``nc`` > 0 keeps a correctly shaped ``class_scores``)."""
        return cls(
            boxes=np.zeros((0, 4), np.float32),
            scores=np.zeros((0,), np.float32),
            class_ids=np.zeros((0,), np.int32),
            class_scores=np.zeros((0, nc), np.float32) if nc else None,
            objectness=np.zeros((0,), np.float32) if nc else None,
            names=tuple(names),
            source=source,
        )

    def box_sources(self) -> Tuple[str, ...]:
        """Producer of every box (``sources`` or ``source`` repeated)."""
        return self.sources if self.sources is not None else (self.source,) * len(self)

    def select(self, keep: np.ndarray) -> Detections:
        """The subset given by an index array or boolean mask."""
        srcs = None
        if self.sources is not None:
            idx = np.arange(len(self))[keep]
            srcs = tuple(self.sources[int(i)] for i in idx)
        return Detections(
            boxes=self.boxes[keep],
            scores=self.scores[keep],
            class_ids=self.class_ids[keep],
            class_scores=None if self.class_scores is None else self.class_scores[keep],
            objectness=None if self.objectness is None else self.objectness[keep],
            names=self.names,
            source=self.source,
            sources=srcs,
            missed_objectness=self.missed_objectness,
        )
