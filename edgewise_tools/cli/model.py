"""``edgewise model``: info, build, quantize and engine subcommands.

Heavy dependencies load inside the handlers: torch only for ``build``, ONNX Runtime's
quantization tools only for ``quantize``, TensorRT only for ``engine``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

from edgewise.settings.cli import positive_int
from edgewise_tools.models import ARCHITECTURES

ENGINE_NEEDS = (
    "model engine builds a TensorRT engine and needs a JetPack/TensorRT machine "
    "(a Jetson with JetPack 5.1+, or an x86 host with an NVIDIA GPU and TensorRT)"
)


def register(subparsers: Any) -> None:
    """Add ``info``, ``build``, ``quantize`` and ``engine`` to the ``model`` group."""
    p = subparsers.add_parser(
        "info", help="describe and validate a YOLOv5 ONNX model (exit status 1 if its graph is broken)"
    )
    p.add_argument("model", help="path of the .onnx file")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_imgsz(p)
    p.set_defaults(func=cmd_info)

    p = subparsers.add_parser(
        "build", help="build an architecture-exact YOLOv5 v7.0 ONNX with random weights"
    )
    p.add_argument("--arch", required=True, choices=ARCHITECTURES)
    p.add_argument("--imgsz", type=int, default=640, help="input size, a multiple of 32 (640)")
    p.add_argument("--classes", type=int, default=80, help="number of classes (80)")
    p.add_argument("--names", default=None, help="comma-separated class names (default 0..K-1)")
    p.add_argument("--seed", type=int, default=0, help="weight initialisation seed (0)")
    p.add_argument("--static-batch", action="store_true", help="fixed batch 1 instead of dynamic")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (17; YOLOv5 v7.0 export.py: 12)")
    p.add_argument(
        "--dynamic",
        action="store_true",
        help="dynamic batch, height and width, axes named as YOLOv5 export.py --dynamic names them",
    )
    p.add_argument(
        "--dynamo",
        action="store_true",
        help="torch's dynamo exporter (torch >= 2.9's default): weights in an external .data file",
    )
    p.add_argument(
        "--metadata",
        default="edgewise",
        choices=("edgewise", "yolov5-v7.0"),
        help="edgewise (stride, names, imgsz, arch) or only what YOLOv5 v7.0 writes (stride, names)",
    )
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.set_defaults(func=cmd_build)

    p = subparsers.add_parser(
        "quantize", help="INT8 static quantization (ONNX Runtime QDQ) with an agreement check"
    )
    p.add_argument("model", help="float YOLOv5 .onnx")
    p.add_argument("--calib", required=True, help="folder of images or a video file")
    p.add_argument("--samples", type=int, default=500, help="calibration frames (500)")
    p.add_argument("--method", default="minmax", choices=("minmax", "entropy", "percentile"))
    p.add_argument(
        "--keep-float",
        default="none",
        help="layers left in float, comma-separated: first_conv, head, silu, or none "
        "(default none: chosen by measurement, see models/MODEL_CARD.md; the decode tail is always float)",
    )
    p.add_argument(
        "--per-tensor", action="store_true", help="per-tensor instead of per-channel weights"
    )
    p.add_argument(
        "--target",
        default="cpu",
        choices=("cpu", "tensorrt"),
        help="cpu: ONNX Runtime U8S8 (default); tensorrt: symmetric INT8 QDQ for TensorRT",
    )
    p.add_argument(
        "--reduce-range",
        action="store_true",
        help="7-bit weights for x86 CPUs without VNNI (avoids U8S8 saturation)",
    )
    p.add_argument(
        "--holdout",
        type=int,
        default=50,
        help="held-out frames for the agreement check (50; 0 skips)",
    )
    p.add_argument(
        "--holdout-source", default=None, help="take held-out frames from this folder/video instead"
    )
    p.add_argument(
        "--conf", type=float, default=None,
        help="confidence threshold of the agreement check (default: the model's own, metadata "
             "edgewise_conf_thres, else 0.25)"
    )
    p.add_argument(
        "--threads", type=int, default=0, help="ONNX Runtime threads for the check (0 = all)"
    )
    p.add_argument("--report", default=None, help="also write the report as JSON to this file")
    _add_imgsz(p)
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.set_defaults(func=cmd_quantize)

    p = subparsers.add_parser("engine", help="build (and cache) a TensorRT engine; GPU only")
    p.add_argument("model", help="YOLOv5 .onnx (float, or QDQ INT8)")
    p.add_argument("--precision", default="fp16", choices=("fp16", "int8"))
    p.add_argument(
        "--calib", default=None, help="calibration images for INT8 (not needed for a QDQ model)"
    )
    p.add_argument(
        "--calib-cache", default=None, help="an existing TensorRT calibration cache to reuse"
    )
    p.add_argument(
        "--cache-dir", default=None, help="engine cache folder (default ~/.cache/edgewise/engines)"
    )
    p.add_argument("--max-batch", type=positive_int, default=8, help="largest batch the engine accepts (8)")
    _add_imgsz(p)
    p.set_defaults(func=cmd_engine, own_sigterm=True)  # a TensorRT build ends at SIGTERM at once (edgewise.cli)


IMGSZ_HELP = (
    "input size N or H,W for a model that does not state it (dynamic height/width and "
    "no imgsz metadata, e.g. YOLOv5 v7.0 --dynamic exports); default: the model's, else 640"
)


def _add_imgsz(p: argparse.ArgumentParser) -> None:
    p.add_argument("--imgsz", default=None, help=IMGSZ_HELP)


def cmd_info(args: argparse.Namespace) -> int:
    from edgewise_tools.models.info import describe, format_description

    d = describe(args.model, args.imgsz)
    print(json.dumps(d, indent=2) if args.json else format_description(d))
    if d["graph_error"]:
        print(f"edgewise: error: {d['path']}: the graph is broken: {d['graph_error']}", file=sys.stderr)
        return 1
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from edgewise_tools.models import build_onnx

    names: Optional[List[str]] = None
    if args.names:
        names = [n.strip() for n in args.names.split(",")]
    t0 = time.perf_counter()
    out = build_onnx(
        args.arch,
        imgsz=args.imgsz,
        nc=args.classes,
        path=args.output,
        names=names,
        seed=args.seed,
        dynamic_batch=not args.static_batch,
        opset=args.opset,
        style=args.metadata,
        dynamic_hw=args.dynamic,
        dynamo=args.dynamo,
    )
    size = sum(f.stat().st_size for f in [out, *out.parent.glob(out.name + ".data")]) / 1e6
    print(
        f"built {args.arch} @ {args.imgsz} with {args.classes} classes -> {out} ({size:.1f} MB) in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _progress_printer(
    stream: Any = None, every_s: float = 2.0
) -> Callable[[str, int, int], None]:
    """A progress callback printing at most every ``every_s`` seconds (and at each stage's end).

    ``stream`` defaults to the ``sys.stderr`` of the moment of each print (not of import
    time, which would pin a stream that may since have been replaced).
    """
    last_t = [0.0]
    last_stage = [""]

    def show(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if stage != last_stage[0] or done >= total or now - last_t[0] >= every_s:
            last_t[0], last_stage[0] = now, stage
            pct = 100.0 * done / total if total else 100.0
            print(f"  {stage}: {done}/{total} frames ({pct:.0f}%)", file=stream or sys.stderr, flush=True)

    return show


def cmd_quantize(args: argparse.Namespace) -> int:
    from edgewise.errors import InvalidInputError
    from edgewise.outputs import check_output_file
    from edgewise_tools.models.quantize import quantize

    if args.report:
        check_output_file(args.report, "--report")
        for flag, other in (("the model", args.model), ("-o", args.output)):
            if Path(args.report).resolve() == Path(other).resolve():
                raise InvalidInputError(f"--report {args.report} is also {flag}: the report would overwrite it; "
                                        "give the report its own file (e.g. quantize-report.json)")
    report = quantize(
        args.model,
        args.calib,
        samples=args.samples,
        out_path=args.output,
        method=args.method,
        per_channel=not args.per_tensor,
        keep_float=args.keep_float,
        holdout=args.holdout,
        holdout_source=args.holdout_source,
        conf_thres=args.conf,
        threads=args.threads,
        progress=_progress_printer(),
        target=args.target,
        reduce_range=args.reduce_range,
        imgsz=args.imgsz,
    )
    print(report.summary())
    if args.report:
        Path(args.report).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    try:
        from edgewise.runtime.backends import tensorrt as trt_backend
    except ImportError as e:  # a trimmed install without the runtime's TensorRT backend
        print(f"edgewise: error: {ENGINE_NEEDS}; {e}", file=sys.stderr)
        return 2
    try:
        trt_backend.import_tensorrt()
    except trt_backend.TensorRTUnavailableError as e:
        print(f"edgewise: error: {ENGINE_NEEDS}; {e}", file=sys.stderr)
        return 2
    import shutil

    from edgewise.runtime.metadata import imgsz_guess_warning, load_model_info

    info = load_model_info(Path(args.model), args.imgsz)  # the engine is built for one input size
    if info.imgsz_source == "default":
        print(f"warning: {imgsz_guess_warning(info)}", file=sys.stderr)
    cache_dir = Path(args.cache_dir) if args.cache_dir else trt_backend.default_cache_dir()
    if args.calib_cache:
        src = Path(args.calib_cache)
        if not src.is_file():
            print(f"edgewise: error: --calib-cache {src} does not exist", file=sys.stderr)
            return 2
        dst = trt_backend.calibration_cache_path(cache_dir, info)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.resolve() != dst.resolve():
            shutil.copyfile(src, dst)
    calibration = None
    if args.calib:
        calibration = trt_backend.CalibrationBatches.from_dir(
            args.calib, info.imgsz, stride=info.stride
        )
    t0 = time.perf_counter()
    backend = trt_backend.TensorRTBackend.from_onnx(
        info,
        cache_dir=cache_dir,
        precision=args.precision,
        max_batch=args.max_batch,
        calibration=calibration,
    )
    backend.close()
    print(
        f"TensorRT {args.precision} engine for {info.path} ready in {cache_dir} ({time.perf_counter() - t0:.1f} s)"
    )
    return 0
