"""INT8 post-training quantization of a YOLOv5 ONNX model with ONNX Runtime (static, QDQ).

Steps: validate the model (``edgewise.runtime.metadata``) and the calibration source
(``edgewise_tools.models.calibration``); ``quant_pre_process`` with ``skip_symbolic_shape``
(symbolic shape inference fails on the dynamic batch axis, see
``docs/design/edge-runtime.md#int8-quantization``); calibrate on frames letterboxed exactly as the
runtime does (``edgewise.runtime.letterbox.preprocess_batch``), a few frames per batch,
streamed so memory stays bounded and progress can be shown; quantize with
``quantize_static`` in QDQ format, per-channel symmetric QInt8 weights and QUInt8
activations (U8S8, ``reduce_range=False``: ORT's recommendation for x86 CPUs with VNNI;
``target="tensorrt"`` makes activations symmetric QInt8, the only QDQ form TensorRT takes);
copy the float model's metadata; then compare INT8 against float detections on held-out
frames (``edgewise_tools.models.agreement``).

The YOLOv5 decode tail after the Detect convolutions (sigmoid, grid/anchor arithmetic,
the concat of pixel boxes with probabilities) always stays float: one 8-bit scale
cannot hold 0..640 pixels and 0..1 scores at once. ``keep_float`` can also keep the
first convolution (``first_conv``) and the three Detect convolutions (``detect_head``)
in float, the layers most sensitive to quantization.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from edgewise.errors import InvalidInputError
from edgewise_tools.models.agreement import Agreement
from edgewise_tools.models.calibration import (
    CalibrationReader,
    Progress,
    calib_batch_size,
    open_frames,
    split_indices,
)
from edgewise_tools.models.heldout import check_agreement

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
METHODS = ("minmax", "entropy", "percentile")
KEEP_FLOAT_CHOICES = ("first_conv", "detect_head")
DEFAULT_KEEP_FLOAT: Tuple[str, ...] = ("first_conv", "detect_head")
#: target -> (activation type, operator types quantized; None = every op ORT can).
#: cpu: U8S8 as ORT recommends for x86 with VNNI, every op quantized: ORT then fuses
#: QLinearConv/QLinearSigmoid/QLinearMul/QLinearAdd/QLinearConcat and tensors stay uint8
#: between layers (measured here: YOLOv5s@640 min 607 ms vs 963 ms with Conv-only QDQ, on a
#: loaded 2-core host). tensorrt: TensorRT takes only symmetric INT8 QDQ on Conv inputs.
TARGETS: Dict[str, Tuple[str, Optional[Tuple[str, ...]]]] = {
    "cpu": ("QUInt8", None),
    "tensorrt": ("QInt8", ("Conv",)),
}


@dataclass
class QuantReport:
    """What ``quantize`` did and how close the INT8 model stays to the float one."""

    model_path: Path
    out_path: Path
    method: str
    per_channel: bool
    activation_type: str
    weight_type: str
    calib_source: str
    calib_frames: int
    holdout_frames: int
    kept_float: List[str] = field(default_factory=list)
    calib_seconds: float = 0.0
    total_seconds: float = 0.0
    float_bytes: int = 0
    int8_bytes: int = 0
    conf_thres: float = 0.25
    agreement: Optional[Agreement] = None
    notes: List[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"quantized {self.model_path} -> {self.out_path} "
            f"({self.float_bytes / 1e6:.1f} MB -> {self.int8_bytes / 1e6:.1f} MB)",
            f"  {self.method} calibration on {self.calib_frames} frames of {self.calib_source} "
            f"in {self.calib_seconds:.1f} s (total {self.total_seconds:.1f} s); "
            f"weights {self.weight_type}{' per-channel' if self.per_channel else ''}, "
            f"activations {self.activation_type}; kept float: {', '.join(self.kept_float) or 'decode tail only'}",
        ]
        if self.agreement is not None:
            lines.append(f"  {self.agreement.summary()} at conf {self.conf_thres:g}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "model": str(self.model_path),
            "output": str(self.out_path),
            "method": self.method,
            "per_channel": self.per_channel,
            "activation_type": self.activation_type,
            "weight_type": self.weight_type,
            "calib_source": self.calib_source,
            "calib_frames": self.calib_frames,
            "holdout_frames": self.holdout_frames,
            "kept_float": list(self.kept_float),
            "calib_seconds": round(self.calib_seconds, 3),
            "total_seconds": round(self.total_seconds, 3),
            "float_bytes": self.float_bytes,
            "int8_bytes": self.int8_bytes,
            "conf_thres": self.conf_thres,
            "agreement": self.agreement.as_dict() if self.agreement is not None else None,
            "notes": list(self.notes),
        }


def parse_keep_float(value: Union[str, Sequence[str], None]) -> Tuple[str, ...]:
    """``"first_conv,head"`` / ``"none"`` / a sequence -> validated tuple of KEEP_FLOAT_CHOICES."""
    if value is None:
        return ()
    items = (
        [v.strip() for v in value.split(",")] if isinstance(value, str) else [str(v) for v in value]
    )
    out: List[str] = []
    for item in items:
        if item in ("", "none"):
            continue
        name = "detect_head" if item in ("head", "detect", "detect_head") else item
        if name not in KEEP_FLOAT_CHOICES:
            raise InvalidInputError(
                f"--keep-float {item!r}: unknown layer group; use first_conv, head (detect_head) or none"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def graph_regions(model: Any) -> Dict[str, List[str]]:
    """Node names of the first conv, the Detect convs and the decode tail of a YOLOv5 graph.

    Found structurally (works for any exporter's node names): the Detect convs are the
    convolutions with no convolution downstream; the decode tail is every other node
    with no convolution downstream; the first conv is the first Conv in topological order.
    """
    nodes = list(model.graph.node)
    consumers: Dict[str, List[int]] = {}
    for idx, n in enumerate(nodes):
        for t in n.input:
            consumers.setdefault(t, []).append(idx)
    reaches_conv = [False] * len(nodes)
    for idx in range(len(nodes) - 1, -1, -1):  # ONNX graphs are topologically sorted
        for t in nodes[idx].output:
            for c in consumers.get(t, ()):
                if nodes[c].op_type == "Conv" or reaches_conv[c]:
                    reaches_conv[idx] = True
                    break
            if reaches_conv[idx]:
                break
    convs = [i for i, n in enumerate(nodes) if n.op_type == "Conv"]
    head = [nodes[i].name for i in convs if not reaches_conv[i]]
    tail = [n.name for i, n in enumerate(nodes) if n.op_type != "Conv" and not reaches_conv[i]]
    first = [nodes[convs[0]].name] if convs else []
    return {"first_conv": first, "detect_head": head, "decode_tail": tail}


def quantize(
    model_path: PathLike,
    calib: PathLike,
    samples: int = 500,
    out_path: Optional[PathLike] = None,
    method: str = "minmax",
    per_channel: bool = True,
    keep_float: Union[str, Sequence[str], None] = DEFAULT_KEEP_FLOAT,
    holdout: int = 50,
    holdout_source: Optional[PathLike] = None,
    conf_thres: float = 0.25,
    iou_thres: float = 0.45,
    threads: int = 0,
    progress: Optional[Progress] = None,
    op_types: Optional[Sequence[str]] = None,
    target: str = "cpu",
    reduce_range: bool = False,
) -> QuantReport:
    """Quantize ``model_path`` to INT8 (QDQ) at ``out_path`` and report agreement with float.

    Args:
        calib: folder of images or a video file; ``samples`` frames calibrate.
        out_path: defaults to ``<model>-int8.onnx`` next to the model.
        method: ``minmax``, ``entropy`` or ``percentile`` (99.999th).
        keep_float: layer groups left in float (``first_conv``, ``detect_head``), or "none".
        holdout: frames for the agreement check, taken from ``holdout_source`` when
            given, else from ``calib`` disjoint from the calibration frames; 0 skips it.
        conf_thres, iou_thres: decode thresholds of the agreement check.
        threads: intra-op threads of the agreement sessions (0 = ORT default).
        progress: ``progress(stage, done, total)`` callback.
        op_types: operator types to quantize (default: per ``target``, see ``TARGETS``).
        target: ``cpu`` (ONNX Runtime on x86/ARM: QUInt8 activations) or ``tensorrt``
            (symmetric QInt8 activations, which TensorRT's explicit quantization requires).
        reduce_range: 7-bit weights, ORT's advice for x86 CPUs without VNNI, whose U8S8
            kernels (``vpmaddubsw``) can saturate; unneeded with VNNI or on ARM.
    Raises:
        ModelError: missing/corrupt/not-YOLOv5 model. InvalidInputError: bad arguments or
        an unreadable/empty calibration source.
    """
    from edgewise.runtime.metadata import load_model_info

    t0 = time.perf_counter()
    if method not in METHODS:
        raise InvalidInputError(f"--method {method!r}: use one of {', '.join(METHODS)}")
    if target not in TARGETS:
        raise InvalidInputError(f"--target {target!r}: use one of {', '.join(TARGETS)}")
    act_name, default_ops = TARGETS[target]
    ops = list(op_types) if op_types is not None else (list(default_ops) if default_ops else None)
    groups = parse_keep_float(keep_float)
    info = load_model_info(Path(model_path))
    if info.precision == "int8":
        raise InvalidInputError(f"{info.path} is already quantized (int8); pass the float model")
    src = Path(model_path)
    out = Path(out_path) if out_path is not None else src.with_name(f"{src.stem}-int8.onnx")
    if out.resolve() == src.resolve():
        raise InvalidInputError(f"output {out} would overwrite the input model; choose another -o")
    source = open_frames(calib, "calibration source")
    notes: List[str] = []
    if holdout_source is not None:
        hsource = open_frames(holdout_source, "held-out source")
        cal_idx, _, note = split_indices(source.count, samples, 0)
        hold_idx = list(range(min(holdout, hsource.count or holdout)))
    else:
        hsource = source
        cal_idx, hold_idx, note = split_indices(source.count, samples, holdout)
    if note:
        notes.append(note)
    if samples > len(cal_idx) and not note:
        notes.append(
            f"{source.path} has {source.count} frames: calibrating on {len(cal_idx)}, not {samples}"
        )

    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    cal_method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgewise-quant-") as tmp:
        pre = Path(tmp) / "preprocessed.onnx"
        with _quiet_ort_info():
            quant_pre_process(str(info.path), str(pre), skip_symbolic_shape=True)
        pre_model = onnx.load(str(pre))
        regions = graph_regions(pre_model)
        exclude: List[str] = list(regions["decode_tail"])
        for g in groups:
            exclude.extend(regions[g])
        reader = CalibrationReader(
            source,
            cal_idx,
            info.input_name,
            info.imgsz,
            info.stride,
            calib_batch_size(info.imgsz, method) if info.dynamic_batch else info.fixed_batch,
            progress,
            fixed_batch=not info.dynamic_batch,
        )
        t_cal = time.perf_counter()
        reader.progress = None  # probe the source: at least one frame must decode
        probe = reader._pull(0)
        reader.progress = progress
        if probe is None:
            raise InvalidInputError(
                f"calibration source {source.path}: none of the selected frames could be decoded"
            )
        reader.rewind()
        reader.frames_used = 0
        staged = Path(tmp) / "int8.onnx"
        with _quiet_ort_info(), _explain_histogram_errors(method):
            quantize_static(
                str(pre),
                str(staged),
                reader,
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                reduce_range=reduce_range,
                activation_type=QuantType.QUInt8 if act_name == "QUInt8" else QuantType.QInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=exclude,
                op_types_to_quantize=ops,
                calibrate_method=cal_method,
                extra_options={
                    "CalibStridedMinMax": 1,  # one batch per collect_data call (bounded memory)
                    "WeightSymmetric": True,
                    "ActivationSymmetric": act_name == "QInt8",
                    "CalibPercentile": 99.999,
                },
            )
        calib_seconds = time.perf_counter() - t_cal
        del pre_model
        quant_meta = {"method": method, "frames": reader.frames_used, "target": target}
        _copy_metadata(info.path, staged, {"edgewise_quant": json.dumps(quant_meta)})
        # Publish atomically: a failed or interrupted run leaves no half-written model.
        part = out.with_name(out.name + ".part")
        shutil.copyfile(staged, part)
        os.replace(part, out)
    if target == "cpu" and not reduce_range and cpu_lacks_vnni():
        notes.append(
            "this x86 CPU has no VNNI: ORT's U8S8 kernels may saturate here; "
            "if agreement is poor, try --reduce-range"
        )
    skipped = sorted(set(source.skipped))
    if skipped:
        notes.append(f"{len(skipped)} unreadable images skipped, e.g. {skipped[0]}")
    report = QuantReport(
        model_path=info.path,
        out_path=out,
        method=method,
        per_channel=per_channel,
        activation_type=act_name,
        weight_type="QInt8",
        calib_source=str(source.path),
        calib_frames=reader.frames_used,
        holdout_frames=0,
        kept_float=list(groups),
        calib_seconds=calib_seconds,
        float_bytes=info.path.stat().st_size,
        int8_bytes=out.stat().st_size,
        conf_thres=conf_thres,
        notes=notes,
    )
    if hold_idx:
        report.agreement = check_agreement(
            info.path, out, hsource, hold_idx, conf_thres, iou_thres, threads, progress
        )
        report.holdout_frames = report.agreement.frames
        if report.agreement.ref_boxes < 10:
            report.notes.append(
                f"the float model found only {report.agreement.ref_boxes} boxes on the held-out frames "
                f"at conf {conf_thres:g}: the agreement figures say little (lower --conf or use other frames)"
            )
    else:
        report.notes.append("no held-out frames: agreement not checked")
    report.total_seconds = time.perf_counter() - t0
    return report


class _DropOrtInfo(logging.Filter):
    """Drops ONNX Runtime quantization's INFO chatter, logged on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "onnxruntime" not in record.pathname


@contextlib.contextmanager
def _quiet_ort_info() -> Iterator[None]:
    root = logging.getLogger()
    f = _DropOrtInfo()
    root.addFilter(f)
    try:
        yield
    finally:
        root.removeFilter(f)


@contextlib.contextmanager
def _explain_histogram_errors(method: str) -> Iterator[None]:
    """ORT's histogram calibrators call np.histogram with a fixed bin count (2048 for
    percentile), which fails on an activation whose values span almost nothing (a
    collapsed layer, typical of untrained weights): say so and what to use instead."""
    try:
        yield
    except ValueError as e:
        if "bins" not in str(e) or method == "minmax":
            raise
        raise InvalidInputError(
            f"{method} calibration failed: an activation's range is too narrow for its "
            f"histogram ({e}); this happens with untrained/collapsed weights; use --method minmax"
        ) from None


def cpu_lacks_vnni() -> bool:
    """True on an x86 Linux CPU whose flags show AVX2 but neither AVX512-VNNI nor AVX-VNNI."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return False
    return "avx2" in flags and not {"avx512_vnni", "avx_vnni"} & set(flags)


def _copy_metadata(src: Path, dst: Path, extra: Dict[str, str]) -> None:
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(src), load_external_data=False).metadata_props}
    meta.update(extra)
    model = onnx.load(str(dst))
    del model.metadata_props[:]
    for k, v in meta.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = k, v
    onnx.save(model, str(dst))
