"""Procedural video scenes with exact ground truth (digits over real video/photos).

Public API: :class:`Difficulty`, :func:`load_difficulty`, :data:`PRESETS`,
:func:`default_layout` (a preset's frame size, streams, frames and pool),
:class:`StreamGenerator` (one camera stream, ``next_frame() -> (bgr, labels)``),
:class:`SynthJob` + :func:`generate` (write frames, YOLO txt, COCO json).
"""

from __future__ import annotations

from edgewise.synth.render import ALPHA_THRESHOLD, CLASS_NAMES, ObjectLabel, StreamGenerator
from edgewise.synth.settings import (
    PRESET_LAYOUTS,
    PRESET_SIZES,
    PRESETS,
    Difficulty,
    Layout,
    default_layout,
    default_size,
    difficulty_from_mapping,
    load_difficulty,
)
from edgewise.synth.writer import SynthJob, generate, yolo_lines

__all__ = ["ALPHA_THRESHOLD", "CLASS_NAMES", "PRESETS", "PRESET_LAYOUTS", "PRESET_SIZES", "Difficulty", "Layout",
           "ObjectLabel", "StreamGenerator", "SynthJob", "default_layout", "default_size", "difficulty_from_mapping", "generate",
           "load_difficulty", "yolo_lines"]
