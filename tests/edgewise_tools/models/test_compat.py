"""YOLOv5 exports as users have them, through every command (issue 22).

The fixture set is produced by the project's own exporter
(``edgewise_tools.models.export``), so no download is needed:

* ``v7-op12-fixed``: YOLOv5 v7.0 ``export.py`` defaults: TorchScript exporter, opset 12,
  fixed batch 1, metadata ``stride='32'`` and ``names`` as a Python dict string, no ``imgsz``;
* ``v7-op12-dynamic``: the same with ``--dynamic`` (axes ``batch``/``height``/``width`` and
  ``anchors``): nothing in the file states the input size;
* ``v7-op13`` and ``v7-op17``: ``--opset 13`` / ``--opset 17``, dynamic batch;
* ``dynamo-op18``: torch >= 2.9's default dynamo exporter, opset 18, weights in ``.data``.

Each goes through ``model info``, ``model quantize`` (per-channel and per-tensor), the
detector, ``edge run`` and a worker process; paths are relative and the commands run
from another directory than the repository.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict

import cv2
import grpc
import onnx
import pytest
import yaml

from edgewise import wire
from edgewise.cli import main
from edgewise.runtime.detector import Detector
from edgewise.runtime.metadata import load_model_info
from edgewise.v1 import detect_pb2, service_pb2_grpc
from edgewise_tools.models.info import check_graph
from tests.conftest import MODEL_CACHE
from tests.edge.helpers import read_jsonl

ROOT = Path(__file__).resolve().parents[3]
DATA = Path("/usr/share/doc/opencv-doc/examples/data")
NAMES = ("person", "bicycle", "car")
IMGSZ = 96  # exported size: neither 640 (the guess) nor a size the dynamic model could be mistaken for
#: fixture name -> export_onnx keyword arguments
FORMS: Dict[str, Dict[str, Any]] = {
    "v7-op12-fixed": dict(style="yolov5-v7.0", opset=12, dynamic_batch=False),
    "v7-op12-dynamic": dict(style="yolov5-v7.0", opset=12, dynamic_hw=True),
    "v7-op13": dict(style="yolov5-v7.0", opset=13),
    "v7-op17": dict(style="yolov5-v7.0", opset=17),
    "dynamo-op18": dict(style="yolov5-v7.0", opset=18, dynamo=True),
}
CONF = "0.001"  # random weights: tiny scores


def _export(name: str) -> Path:
    from edgewise_tools.models.export import export_onnx
    from edgewise_tools.models.yolov5 import build_model

    path = MODEL_CACHE / "compat" / f"{name}.onnx"
    if not path.exists():
        export_onnx(build_model("yolov5n", nc=len(NAMES), seed=0), path, imgsz=IMGSZ, names=NAMES,
                    **FORMS[name])
    return path


@pytest.fixture(scope="module", params=sorted(FORMS))
def form(request, tmp_path_factory) -> Dict[str, Any]:
    """One export copied (with its external data) into a fresh directory, used by relative path."""
    src = _export(request.param)
    d = tmp_path_factory.mktemp(request.param)
    (d / "models").mkdir()
    for f in [src, *src.parent.glob(src.name + ".data")]:
        shutil.copy(f, d / "models" / f.name)
    return {"name": request.param, "dir": d, "model": f"models/{src.name}", **FORMS[request.param]}


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("frames")
    for f in sorted(DATA.glob("*.jpg"))[:6]:
        shutil.copy(f, d / f.name)
    return d


def test_export_is_in_the_upstream_format(form):
    proto = onnx.load(str(form["dir"] / form["model"]), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta == {"stride": "32", "names": "{0: 'person', 1: 'bicycle', 2: 'car'}"}
    assert next(o.version for o in proto.opset_import if o.domain == "") == form["opset"]
    dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    if form.get("dynamic_hw"):
        assert dims == ["batch", 3, "height", "width"]
        out = proto.graph.output[0].type.tensor_type.shape.dim
        assert [d.dim_param for d in out][:2] == ["batch", "anchors"]
    else:
        assert dims[1:] == [3, IMGSZ, IMGSZ] and (dims[0] == 1) == (form["opset"] == 12)
    info = load_model_info(form["dir"] / form["model"])
    assert info.names == NAMES and info.stride == 32
    assert bool(info.external_data) == bool(form.get("dynamo"))


def test_model_info(form, monkeypatch, capsys):
    monkeypatch.chdir(form["dir"])
    assert main(["model", "info", form["model"]]) == 0
    out = capsys.readouterr().out
    assert "graph      valid" in out and "classes    3: person, bicycle, car" in out
    if form.get("dynamic_hw"):
        assert "imgsz      640x640 (assumed" in out and "warning    " in out and "--imgsz" in out
        assert main(["model", "info", form["model"], "--imgsz", str(IMGSZ)]) == 0
        out = capsys.readouterr().out
        assert f"imgsz      {IMGSZ}x{IMGSZ} (as given)" in out and "warning" not in out
    else:
        assert f"imgsz      {IMGSZ}x{IMGSZ}," in out and "warning" not in out


@pytest.mark.parametrize("per_tensor", [False, True], ids=["per-channel", "per-tensor"])
def test_model_quantize(form, per_tensor, frames, monkeypatch, capsys):
    monkeypatch.chdir(form["dir"])
    out = f"models/{form['name']}-{'pt' if per_tensor else 'pc'}-int8.onnx"
    argv = ["model", "quantize", form["model"], "--calib", str(frames), "--samples", "3",
            "--holdout", "3", "--conf", CONF, "--threads", "1", "-o", out, "--imgsz", str(IMGSZ)]
    assert main(argv + (["--per-tensor"] if per_tensor else [])) == 0
    text = capsys.readouterr().out
    assert "agreement on 3 held-out frames" in text
    assert "speed: INT8" in text and "on this CPU (" in text
    assert ("per-channel" in text) != per_tensor
    if form["opset"] < 13 and not per_tensor:
        assert "opset 12 upgraded to 13" in text
    assert check_graph(form["dir"] / out) is None
    info = load_model_info(form["dir"] / out)
    assert info.precision == "int8" and info.names == NAMES and info.imgsz == (IMGSZ, IMGSZ)
    assert info.dynamic_batch == (form["opset"] != 12 or bool(form.get("dynamic_hw")))
    # the size given for a dynamic model is recorded in the INT8 file: no guess next time
    assert info.imgsz_source == ("onnx-metadata" if form.get("dynamic_hw") else "graph")


def test_detector(form, monkeypatch, caplog):
    monkeypatch.chdir(form["dir"])
    im = cv2.imread(str(DATA / "fruits.jpg"))
    with Detector.from_file(form["model"], backend="onnxruntime", conf_thres=float(CONF), threads=1,
                            imgsz=IMGSZ if form.get("dynamic_hw") else None) as det:
        assert det.imgsz == (IMGSZ, IMGSZ)
        (dets,) = det.detect([im])
        raw = det.infer(det.preprocess([im])[0])
    assert raw.shape == (1, 3 * ((IMGSZ // 8) ** 2 + (IMGSZ // 16) ** 2 + (IMGSZ // 32) ** 2), 8)
    assert len(dets.scores) > 0
    assert (dets.boxes[:, 2] <= im.shape[1]).all() and (dets.boxes[:, 3] <= im.shape[0]).all()
    assert "does not state its input size" not in caplog.text
    if form.get("dynamic_hw"):
        with Detector.from_file(form["model"], backend="onnxruntime", threads=1) as det:
            assert det.imgsz == (640, 640)
        assert "does not state its input size" in caplog.text


def test_edge_run(form, monkeypatch):
    monkeypatch.chdir(form["dir"])
    model: Dict[str, Any] = {"path": form["model"], "conf_thres": float(CONF), "threads": 1, "max_batch": 2}
    if form.get("dynamic_hw"):
        model["imgsz"] = IMGSZ
    Path("edge.yaml").write_text(yaml.safe_dump({
        "device_id": "compat",
        "streams": [{"id": "s", "kind": "synthetic", "uri": "160x120", "max_frames": 4}],
        "model": model,
        "sinks": {"jsonl": "out.jsonl"},
        "spool": {"path": "spool.db"},
        "metrics": {"port": -1},
    }))
    assert main(["edge", "run", "--config", "edge.yaml"]) == 0
    recs = read_jsonl(Path("out.jsonl"))
    assert [r["frame_seq"] for r in recs] == [0, 1, 2, 3]
    assert all(r["detections"] and r["detections"][0]["class_name"] in NAMES for r in recs)


def test_worker_serves_it(form):
    """A real ``edgewise cloud worker`` process, started in the fixture's directory."""
    extra = ["--imgsz", str(IMGSZ)] if form.get("dynamic_hw") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgewise.cli", "cloud", "worker", "--model", form["model"], "--port", "0",
         "--host", "127.0.0.1", "--metrics-port", "-1", "--threads", "1", "--conf", CONF, *extra],
        cwd=form["dir"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout or ()], daemon=True)
    reader.start()
    seen = []
    try:
        port = None
        deadline = time.monotonic() + 60
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail("worker did not become SERVING in 60 s:\n" + "".join(seen))
            seen.append(line)
            if line.startswith("EDGEWISE_WORKER_LISTENING"):
                port = dict(kv.split("=", 1) for kv in line.split()[1:])["port"]
            if line.startswith("EDGEWISE_WORKER_SERVING"):
                break
        img = wire.encode_image(cv2.imread(str(DATA / "fruits.jpg")), "jpeg")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            resp = service_pb2_grpc.WorkerStub(ch).Infer(detect_pb2.DetectRequest(image=img), timeout=30)
        assert resp.status == detect_pb2.OK and len(resp.detections) > 0
        assert {d.class_name for d in resp.detections} <= set(NAMES)
    finally:
        proc.terminate()
        proc.wait(30)
        reader.join(10)  # EOF after the exit; then the pipe can be closed (filterwarnings = error)
        if proc.stdout is not None:
            proc.stdout.close()
    assert "does not state its input size" not in "".join(seen)
