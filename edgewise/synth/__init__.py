"""Procedural video scenes with exact ground truth (digits over real video/photos).

Public API: :class:`Difficulty`, :func:`load_difficulty`, :data:`PRESETS`,
:func:`default_size` (a preset's frame size),
:class:`StreamGenerator` (one camera stream, ``next_frame() -> (bgr, labels)``),
:class:`SynthJob` + :func:`generate` (write frames, YOLO txt, COCO json).
"""

from __future__ import annotations

from edgewise.synth.render import ALPHA_THRESHOLD, CLASS_NAMES, ObjectLabel, StreamGenerator
from edgewise.synth.settings import (
    PRESET_SIZES,
    PRESETS,
    Difficulty,
    default_size,
    difficulty_from_mapping,
    load_difficulty,
)
from edgewise.synth.writer import SynthJob, generate, yolo_lines

__all__ = ["ALPHA_THRESHOLD", "CLASS_NAMES", "PRESETS", "PRESET_SIZES", "Difficulty", "ObjectLabel",
           "StreamGenerator", "SynthJob", "default_size", "difficulty_from_mapping", "generate",
           "load_difficulty", "yolo_lines"]
