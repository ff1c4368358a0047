"""``edgewise model build/info/quantize/engine`` through the real CLI entry point."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from edgewise.cli import main

DATA = Path("/usr/share/doc/opencv-doc/examples/data")


def test_build_info_quantize(tmp_path, capsys, caplog):
    pytest.importorskip("torch")
    model = tmp_path / "m.onnx"
    rc = main(
        [
            "model",
            "build",
            "--arch",
            "yolov5n",
            "--imgsz",
            "96",
            "--classes",
            "3",
            "--names",
            "cat,dog,fox",
            "--seed",
            "3",
            "-o",
            str(model),
        ]
    )
    assert rc == 0 and model.is_file()
    assert "built yolov5n @ 96 with 3 classes" in capsys.readouterr().out

    assert main(["model", "info", str(model), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["classes"] == ["cat", "dog", "fox"] and d["precision"] == "float32"
    assert d["inputs"][0]["shape"] == ["batch", 3, 96, 96]
    assert d["outputs"][0]["shape"] == ["batch", 3 * (12 * 12 + 6 * 6 + 3 * 3), 8]
    assert d["imgsz"] == [96, 96] and d["stride"] == 32 and d["opset"] == 17

    cal = tmp_path / "cal"
    cal.mkdir()
    for f in sorted(DATA.glob("*.jpg"))[:10]:
        shutil.copy(f, cal / f.name)
    out = tmp_path / "m-int8.onnx"
    report = tmp_path / "report.json"
    caplog.set_level(logging.INFO)
    rc = main(
        [
            "model",
            "quantize",
            str(model),
            "--calib",
            str(cal),
            "--samples",
            "4",
            "--holdout",
            "3",
            "--conf",
            "0.001",
            "--keep-float",
            "none",
            "--report",
            str(report),
            "-o",
            str(out),
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "F1@0.5" in cap.out and "calibrate: 4/4 frames" in cap.err
    # ONNX Runtime's quantizer logs INFO chatter on the root logger; it is filtered out.
    assert not [
        r for r in caplog.records if "onnxruntime" in r.pathname and r.levelno < logging.WARNING
    ]
    r = json.loads(report.read_text())
    assert r["calib_frames"] == 4 and r["agreement"]["frames"] == 3 and r["kept_float"] == []

    assert main(["model", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "precision  int8 (60/60 convolutions in INT8)" in text
    assert "cat, dog, fox" in text
    assert "quantized  minmax calibration on 4 frames (target cpu)" in text


def test_bad_inputs_exit_2_with_message(tmp_path, capsys):
    assert main(["model", "info", str(tmp_path / "missing.onnx")]) == 2
    assert f"{tmp_path / 'missing.onnx'} does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"junk" * 50)
    assert main(["model", "info", str(bad)]) == 2
    assert "is not a valid ONNX model" in capsys.readouterr().err
    assert (
        main(
            [
                "model",
                "build",
                "--arch",
                "yolov5n",
                "--imgsz",
                "100",
                "-o",
                str(tmp_path / "x.onnx"),
            ]
        )
        == 2
    )
    assert "--imgsz 100: must be a multiple of 32 (the largest stride) in 32..8192" in capsys.readouterr().err
    for classes in ("0", "10001", "100000000"):  # 100 million was a traceback allocating 77 GB
        out = tmp_path / f"c{classes}.onnx"
        assert main(["model", "build", "--arch", "yolov5n", "--imgsz", "64", "--classes", classes, "-o", str(out)]) == 2
        assert f"--classes {classes}: need 1..10000 classes" in capsys.readouterr().err and not out.exists()


def test_engine_needs_tensorrt(tiny_model, capsys):
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip(
            "TensorRT is installed here; the GPU path is covered by the runtime's gpu tests"
        )
    assert main(["model", "engine", str(tiny_model), "--precision", "fp16"]) == 2
    assert "needs a JetPack/TensorRT machine" in capsys.readouterr().err


def test_info_says_when_the_graph_is_broken(tiny_model, tmp_path, capsys):
    """A valid YOLOv5 header around a graph no runtime accepts (per-channel Q/DQ in an
    opset-12 model, what quantizing a v7.0 export used to leave behind): exit status 1."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(tiny_model))
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("", 12))
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    w = next(t for t in m.graph.initializer if t.name == conv.input[1])
    m.graph.initializer.extend([numpy_helper.from_array(numpy_helper.to_array(w).astype("int8"), "wq"),
                                numpy_helper.from_array(numpy_helper.to_array(w)[:, 0, 0, 0] * 0 + 0.1, "ws")])
    m.graph.node.insert(0, helper.make_node("DequantizeLinear", ["wq", "ws"], ["wdq"], axis=0))
    conv.input[1] = "wdq"
    bad = tmp_path / "broken-int8.onnx"
    onnx.save(m, str(bad))
    assert main(["model", "info", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert "graph      BROKEN: ONNX checker: Unrecognized attribute: axis for operator DequantizeLinear" in out
    assert "precision  int8" in out
    assert f"{bad}: the graph is broken" in err
    assert main(["model", "info", str(tiny_model), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["graph_error"] is None and d["imgsz_source"] == "graph" and d["warnings"] == []


def test_info_says_whether_a_jetson_loads_the_opsets(tiny_model, tmp_path, capsys):
    """``model info`` states the device rule (``edgewise.runtime.opsets``): a model importing
    ai.onnx.ml opset 5, as ONNX Runtime's newer quantizer writes, is one JetPack 5.1 refuses."""
    import onnx

    assert main(["model", "info", str(tiny_model)]) == 0
    assert "jetson     its opsets and operators load on JetPack 5.1" in capsys.readouterr().out
    m = onnx.load(str(tiny_model))
    m.opset_import.add(domain="ai.onnx.ml", version=5)
    newer = tmp_path / "newer.onnx"
    onnx.save(m, str(newer))
    assert main(["model", "info", str(newer), "--json"]) == 0
    (line,) = json.loads(capsys.readouterr().out)["jetpack51"]
    assert line.startswith("imports ai.onnx.ml opset 5") and "edgewise model quantize" in line


def test_engine_builds_at_the_size_asked_for_and_warns_when_it_guesses(tmp_path, capsys, monkeypatch):
    """`model engine` had no --imgsz and no warning: a --dynamic export without imgsz metadata
    silently got (and cached) a 640x640 engine (found by a probe). Driven through the recording
    TensorRT stand-in, the engine is built at --imgsz, and a guess is said."""
    from edgewise.runtime.backends import tensorrt as trtb
    from tests.edgewise.runtime import fake_tensorrt
    pytest.importorskip("torch")
    model = tmp_path / "dyn.onnx"
    assert main(["model", "build", "--arch", "yolov5n", "--imgsz", "64", "--classes", "2", "--dynamic",
                 "--metadata", "yolov5-v7.0", "-o", str(model)]) == 0
    cuda = fake_tensorrt.HostCuda()
    mod = fake_tensorrt.make("8.5.2.2", True, lambda *a: None)
    monkeypatch.setattr(trtb, "import_tensorrt", lambda: mod)
    monkeypatch.setattr(trtb, "_Cuda", lambda: cuda)
    monkeypatch.setattr(trtb, "cuda_device_name", lambda: "Fake GPU")
    capsys.readouterr()
    assert main(["model", "engine", str(model), "--imgsz", "96,128", "--cache-dir", str(tmp_path / "e")]) == 0
    assert ("profile.set_shape", "images", (1, 3, 96, 128), (1, 3, 96, 128), (8, 3, 96, 128)) in mod.calls
    assert "warning" not in capsys.readouterr().err
    assert main(["model", "engine", str(model), "--cache-dir", str(tmp_path / "e")]) == 0
    assert "640x640" in capsys.readouterr().err


def test_sigterm_stops_quantize_as_ctrl_c_does_leaving_no_temporary_copies(tmp_path):
    """SIGTERM (a `timeout`, a job's cancel) ended `model quantize` where it stood: its temporary
    folder with the model's float and preprocessed copies stayed in $TMPDIR at every kill. A real
    SIGTERM while it calibrates now runs Ctrl-C's clean-up: exit 143, no traceback, nothing left
    in $TMPDIR and no output file."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "q.onnx"
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "edgewise.cli", "model", "quantize",
                             str(root / "models" / "edge.onnx"), "--calib", str(DATA), "--samples", "40",
                             "--holdout", "0", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    said = []
    try:
        for line in proc.stderr:  # the calibration has started: the temporary folder is there
            said.append(line)
            if "calibrate:" in line:
                assert list(tmp.glob("edgewise-quant-*"))
                proc.send_signal(signal.SIGTERM)
                break
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    text = "".join(said) + err
    assert proc.returncode == 143, text[-3000:]
    assert "Traceback" not in text
    assert list(tmp.glob("edgewise-quant-*")) == [] and not out.exists()


@pytest.mark.parametrize("names, expected", [
    ("car,car", "names: class names repeat ('car'): the edge and the cloud model's classes are matched by name, "
                "so each must be unique; give each class a name of its own"),
    ("car,", "names: class name 1 '' must be 1..256 characters, not blank"),
])
def test_build_refuses_names_no_tool_loads_a_model_with(tmp_path, capsys, names, expected):
    """`model build --names car,car` wrote a model that every loader (edge, worker, eval,
    `model info`) then refused for its repeated class names; the names follow the loaders'
    rule before anything is written."""
    pytest.importorskip("torch")
    model = tmp_path / "m.onnx"
    rc = main(["model", "build", "--arch", "yolov5n", "--imgsz", "64", "--classes", "2", "--names", names,
               "-o", str(model)])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err, err
    assert "Traceback" not in err and not model.exists()
