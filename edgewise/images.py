"""The one check every BGR frame passes before it is encoded or inferred on."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgewise.errors import InvalidInputError


def check_bgr(im: Any, what: str = "image") -> None:
    """Raise InvalidInputError (naming ``what``) unless ``im`` is a non-empty HxWx3 uint8 array."""
    if not isinstance(im, np.ndarray):
        raise InvalidInputError(f"{what}: expected a numpy array (BGR uint8 HxWx3), got {type(im).__name__}")
    if im.dtype != np.uint8:
        raise InvalidInputError(f"{what}: expected dtype uint8 (BGR 0..255), got {im.dtype}")
    if im.ndim != 3 or im.shape[2] != 3:
        raise InvalidInputError(f"{what}: expected shape HxWx3 (BGR), got {im.shape}")
    if im.shape[0] == 0 or im.shape[1] == 0:
        raise InvalidInputError(f"{what}: empty image of shape {im.shape}")
