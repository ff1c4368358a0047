"""``build_onnx``: an Ultralytics-format ONNX that ONNX Runtime runs like torch does."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgewise.errors import InvalidInputError
from edgewise_tools.models import build_onnx

torch = pytest.importorskip("torch")


def test_tiny_model_format(tiny_model):
    proto = onnx.load(str(tiny_model))
    onnx.checker.check_model(proto)
    assert proto.opset_import[0].version == 17
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["stride"] == "32"
    assert ast.literal_eval(meta["names"]) == {i: str(i) for i in range(10)}
    assert ast.literal_eval(meta["imgsz"]) == [160, 160]
    assert meta["edgewise_arch"] == "yolov5n"
    (inp,) = proto.graph.input
    assert inp.name == "images"
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 160, 160]
    (out,) = proto.graph.output
    assert out.name == "output0"
    dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert dims == ["batch", 3 * (20**2 + 10**2 + 5**2), 15]


@pytest.mark.parametrize("batch", [1, 4])
def test_onnxruntime_matches_torch(tiny_model, batch):
    import onnxruntime as ort

    from edgewise_tools.models.yolov5 import build_model

    sess = ort.InferenceSession(str(tiny_model), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(batch).random((batch, 3, 160, 160), dtype=np.float32)
    (y,) = sess.run(None, {"images": x})
    assert y.shape == (batch, 1575, 15)
    model = build_model("yolov5n", nc=10, seed=0).eval()  # same seed as the fixture
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    # Relative agreement over the tensor (BN folding changes rounding only).
    err = np.abs(y - ref) / (np.abs(ref) + 1e-3)
    assert float(err.max()) < 1e-4, float(err.max())


def test_dynamic_hw_export_runs_any_multiple_of_the_stride(native_model):
    import onnxruntime as ort

    from edgewise.runtime.metadata import load_model_info
    from edgewise_tools.models.yolov5 import build_model

    info = load_model_info(native_model)
    assert info.dynamic_hw and info.imgsz == (160, 160) and info.metadata["input_size"] == "native"
    sess = ort.InferenceSession(str(native_model), providers=["CPUExecutionProvider"])
    model = build_model("yolov5n", nc=10, seed=0).eval()
    for h, w in ((64, 64), (96, 224), (160, 160)):
        x = np.random.default_rng(h).random((1, 3, h, w), dtype=np.float32)
        (y,) = sess.run(None, {"images": x})
        assert y.shape == (1, 3 * (h * w // 64 + h * w // 256 + h * w // 1024), 15)
        with torch.no_grad():
            ref = model(torch.from_numpy(x)).numpy()
        assert float((np.abs(y - ref) / (np.abs(ref) + 1e-3)).max()) < 1e-4


def test_build_static_batch_and_default_names(tmp_path):
    path = build_onnx("yolov5n", imgsz=64, nc=2, path=tmp_path / "m.onnx", dynamic_batch=False)
    proto = onnx.load(str(path))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert ast.literal_eval(meta["names"]) == {0: "0", 1: "1"}
    dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 64, 64]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"arch": "yolov5q"}, "yolov5q"),
        ({"arch": "yolov5n", "imgsz": 100}, "multiple of 32"),
        ({"arch": "yolov5n", "nc": 0}, r"--classes 0: need 1\.\.10000 classes"),
        ({"arch": "yolov5n", "nc": 2, "names": ["a"]}, "1 names given for 2 classes"),
        # each was a traceback (an allocation, torch's RuntimeError), or opset 18 written for 30
        ({"arch": "yolov5n", "imgsz": 32768}, r"--imgsz 32768: must be a multiple of 32 .* in 32..8192"),
        ({"arch": "yolov5n", "opset": 99}, "TorchScript exporter writes at most opset 20"),
        ({"arch": "yolov5n", "opset": 30, "dynamo": True}, "dynamo exporter writes at most opset 23"),
        ({"arch": "yolov5n", "path": "."}, r"-o \.: is a folder; give the path of the file to write"),
    ],
)
def test_build_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        build_onnx(**{"path": tmp_path / "x.onnx", **kwargs})


def test_models_import_without_torch_and_build_says_what_to_install():
    """The edge (Jetson) has no torch: importing the model tools must not need it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import edgewise_tools.models, edgewise_tools.models.quantize, edgewise_tools.models.info, edgewise_tools.cli.model\n"
        "from edgewise.cli import main\n"
        "sys.exit(main(['model', 'build', '--arch', 'yolov5n', '-o', '/nonexistent/x.onnx']))\n"
    )
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs PyTorch" in proc.stderr and "edgewise[train]" in proc.stderr


def test_an_export_at_another_opset_than_asked_is_refused() -> None:
    """The opset decides where the model loads (TensorRT 8.5: at most 17); an exporter that
    writes another one than ``--opset`` (torch's dynamo exporter wrote 18 for an opset it lacked)
    is refused by name rather than written. The check reads the written model's own opset."""
    from onnx import TensorProto, helper

    from edgewise_tools.models.export import written_opset_problem

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1),
                                                    helper.make_opsetid("", 18)])
    assert written_opset_problem(proto, 18) is None
    problem = written_opset_problem(proto, 17) or ""
    assert "exporter wrote opset 18 where --opset 17 was asked" in problem
