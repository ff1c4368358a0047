"""Fixtures shared by the tools' tests."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import pytest


@pytest.fixture
def renamed_model(tmp_path: Path) -> Callable[[Path, Sequence[str]], Path]:
    """``renamed_model(model, names)``: a copy of ``model`` whose ONNX metadata names other
    classes (as many as it has): a model of other classes, without building one."""
    import onnx

    def make(model: Path, names: Sequence[str]) -> Path:
        proto = onnx.load(str(model))
        for prop in proto.metadata_props:
            if prop.key == "names":
                prop.value = repr(dict(enumerate(names)))
        out = tmp_path / f"renamed-{model.name}"
        onnx.save(proto, str(out))
        return out

    return make
