"""``edgewise edge engine`` and ``edgewise edge model-info``: the model commands of a device.

The Jetson bundle ships only ``edgewise`` and ``edge`` (``edgewise_tools`` with its onnx and
torch needs stays on the build host), so what the service units and the L4T entry point run
before the daemon lives here, on ``edgewise.runtime`` alone:

* ``edge engine --config edge.yaml`` builds the TensorRT engine ``edge run --config edge.yaml``
  will load (same model, input size, precision, largest batch ``model.max_batch`` and engine
  cache: ``$EDGEWISE_ENGINE_CACHE``), or reuses the cached one; with an ONNX Runtime backend
  there is nothing to build and it says so. Run as the unit's ``ExecStartPre`` so the minutes
  of a first INT8 build on a Xavier NX happen before the watchdog starts counting.
* ``edge model-info MODEL`` describes a model: classes, input size, precision, hash, opsets
  (and whether a JetPack 5.1 device loads them), and
  the engine cache entry it maps to where TensorRT is installed.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, Union

from edge.settings import SCHEMA, ModelSettings
from edgewise.errors import ConfigError
from edgewise.runtime.metadata import MAX_FIXED_BATCH, load_model_info, setting_imgsz
from edgewise.runtime.opsets import model_problems
from edgewise.settings import add_settings_arguments, settings_from_args
from edgewise.settings.cli import positive_int


def register(subparsers: Any) -> None:
    """Add ``engine`` and ``model-info`` to the ``edge`` group."""
    eng = subparsers.add_parser(
        "engine", help="build (or reuse) the TensorRT engine the daemon will load",
        description="Build or reuse the TensorRT engine `edge run` loads with the same settings "
                    "(model.path, model.imgsz, model.max_batch, $EDGEWISE_ENGINE_CACHE).")
    add_settings_arguments(eng, SCHEMA)
    eng.set_defaults(func=_engine, own_sigterm=True)  # a TensorRT build ends at SIGTERM at once (edgewise.cli)

    info = subparsers.add_parser("model-info", help="describe a YOLOv5 ONNX model (classes, size, precision)")
    info.add_argument("model", help="path of the .onnx file")
    info.add_argument("--imgsz", default="0", metavar="N|H,W",
                      help="input size of a model that does not state it (model.imgsz: 640 or 384,640)")
    info.add_argument("--max-batch", type=positive_int, default=ModelSettings().max_batch,
                      help="the daemon's model.max_batch, part of the engine's cache key (default: the "
                           "daemon's default)")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=_model_info)


def _engine(args: argparse.Namespace) -> int:
    from edge.preflight import check_backend, check_writable
    from edge.sdnotify import Notifier
    from edgewise.runtime.backends import tensorrt as trtb

    s = settings_from_args(args, SCHEMA)
    info = load_model_info(s.model.path, setting_imgsz(s.model.imgsz))
    backend = check_backend(s)
    if backend != "tensorrt":
        print(f"model.backend {s.model.backend}: the daemon runs {info.path} on {backend}; "
              "no TensorRT engine to build")
        return 0
    path, precision, max_batch = trtb.engine_file(info, max_batch=s.model.max_batch)
    if path.is_file():
        print(f"TensorRT {precision} engine for {info.path} (batch <= {max_batch}) is cached: {path}")
        return 0
    check_writable("$EDGEWISE_ENGINE_CACHE", str(path))
    t0 = time.perf_counter()
    with Notifier().busy(f"building the TensorRT {precision} engine of {info.path}"):  # ExecStartPre
        trtb.TensorRTBackend.from_onnx(info, precision=precision, max_batch=s.model.max_batch).close()
    print(f"TensorRT {precision} engine for {info.path} (batch <= {max_batch}) built in "
          f"{time.perf_counter() - t0:.0f} s: {path}")
    return 0


def describe(model: str, imgsz: Union[str, int] = 0, max_batch: int = ModelSettings().max_batch) -> Dict[str, Any]:
    """What ``model-info`` prints, as a dict (the engine entry is the one ``edge engine`` and
    ``edge run`` use with ``model.max_batch`` = ``max_batch``)."""
    from edgewise.runtime.detector import tensorrt_unusable_reason

    info = load_model_info(model, setting_imgsz(imgsz, "--imgsz"))
    out: Dict[str, Any] = {
        "path": str(info.path), "sha256": info.sha256, "bytes": info.file_bytes, "precision": info.precision,
        "classes": info.nc, "names": list(info.names), "imgsz": list(info.imgsz),
        "imgsz_source": info.imgsz_source, "stride": info.stride,
        "input": {"name": info.input_name, "shape": list(info.input_shape), "dtype": info.input_dtype},
        "output": {"name": info.output_name, "shape": list(info.output_shape)},
        "batch": "dynamic" if info.dynamic_batch else info.fixed_batch,
        "opsets": {d or "ai.onnx": v for d, v in sorted(info.opsets.items())},
        "jetpack51": model_problems(info) or "loads",
    }
    why_not = tensorrt_unusable_reason()
    if why_not:
        out["tensorrt_engine"] = f"not available here: {why_not}"
    else:
        from edgewise.runtime.backends.tensorrt import engine_file

        path, _, batch = engine_file(info, max_batch=max_batch)
        out["tensorrt_engine"] = f"{path} (batch <= {batch}; {'cached' if path.is_file() else 'not built yet'})"
    return out


def _model_info(args: argparse.Namespace) -> int:
    if args.max_batch > MAX_FIXED_BATCH:  # model.max_batch's own range
        raise ConfigError(f"--max-batch {args.max_batch}: must be within 1..{MAX_FIXED_BATCH} (model.max_batch's range)")
    d = describe(args.model, args.imgsz, args.max_batch)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    names = ", ".join(d["names"][:10]) + (", ..." if d["classes"] > 10 else "")
    h, w = d["imgsz"]
    print(f"{d['path']}: YOLOv5 detector, {d['precision']}, {d['bytes'] / 1e6:.1f} MB, sha256 {d['sha256'][:16]}")
    print(f"  input  {d['input']['name']} {d['input']['shape']} {d['input']['dtype']}; size {h}x{w} "
          f"({d['imgsz_source']}), stride {d['stride']}, batch {d['batch']}")
    print(f"  output {d['output']['name']} {d['output']['shape']}")
    print(f"  classes {d['classes']}: {names}")
    print(f"  opsets {', '.join(f'{k} {v}' for k, v in d['opsets'].items())}; on JetPack 5.1: "
          + (d["jetpack51"] if isinstance(d["jetpack51"], str) else "; ".join(d["jetpack51"])))
    print(f"  TensorRT engine: {d['tensorrt_engine']}")
    return 0
