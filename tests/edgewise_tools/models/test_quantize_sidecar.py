"""``edgewise model quantize`` of a model whose class names, stride and input size come from a
sidecar YAML (``<model>.yaml``): the sidecar sits next to the float model, not next to ``-o``,
so the INT8 model must carry them in its own metadata or it loads with names ``0..nc-1`` and
an assumed 640x640 input. Real models, real quantization, no mocks."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
import yaml

from edgewise.runtime.metadata import load_model_info
from edgewise_tools.models.quantize import quantize

DATA = Path("/usr/share/doc/opencv-doc/examples/data")
NAMES = ["car", "truck", "bus", "bike", "person", "dog", "cat", "tree", "sign", "light"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("photos")
    for f in sorted(DATA.glob("*.jpg"))[:4]:
        shutil.copy(f, d / f.name)
    if not any(d.iterdir()):
        pytest.skip("opencv-doc sample photographs are not installed")
    return d


def _strip(src: Path, dest: Path, keys: tuple) -> Path:
    model = onnx.load(str(src))
    keep = [(p.key, p.value) for p in model.metadata_props if p.key not in keys]
    del model.metadata_props[:]
    for k, v in keep:
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(dest))
    return dest


def test_names_stride_and_imgsz_from_a_sidecar_reach_the_int8_model(native_model: Path, photos: Path,
                                                                     tmp_path: Path) -> None:
    # a dynamic height/width export with nothing but the sidecar to state names, stride and size
    src = tmp_path / "float" / "mine.onnx"
    src.parent.mkdir()
    _strip(native_model, src, ("names", "stride", "imgsz"))
    (tmp_path / "float" / "mine.yaml").write_text(yaml.safe_dump({"names": NAMES, "stride": 32,
                                                                   "imgsz": [160, 160]}))
    before = load_model_info(src)
    assert before.names == tuple(NAMES) and before.imgsz == (160, 160) and before.dynamic_hw
    out = tmp_path / "int8" / "mine-int8.onnx"  # elsewhere: the sidecar is not next to it
    report = quantize(src, photos, samples=2, holdout=0, out_path=out, threads=1)
    assert not any("assuming" in n for n in report.notes), report.notes
    after = load_model_info(out)
    assert after.precision == "int8"
    assert after.names == tuple(NAMES) and after.names_source == "onnx-metadata"
    assert after.imgsz == (160, 160) and after.imgsz_source == "onnx-metadata"
    assert after.stride == 32 and after.metadata["stride"] == "32"


def test_complete_metadata_is_copied_unchanged(tiny_model: Path, photos: Path, tmp_path: Path) -> None:
    out = tmp_path / "q.onnx"
    quantize(tiny_model, photos, samples=2, holdout=0, out_path=out, threads=1)
    src_meta = dict(load_model_info(tiny_model).metadata)
    out_meta = dict(load_model_info(out).metadata)
    out_meta.pop("edgewise_quant")
    assert out_meta == src_meta
