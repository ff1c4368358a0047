"""INT8 post-training quantization of a YOLOv5 ONNX model with ONNX Runtime (static, QDQ).

Steps: validate the model (``edgewise.runtime.metadata``) and the calibration source
(``edgewise_tools.models.calibration``); bring the float model to one self-contained file
at an opset the chosen layout needs (``_float_for_qdq``: external data inlined, opset < 13
upgraded for per-channel weights or else per-tensor); ``quant_pre_process`` with
``skip_symbolic_shape`` (symbolic shape inference fails on the dynamic batch axis, see
``docs/design/edge-runtime.md#int8-quantization``); calibrate on frames letterboxed
exactly as the runtime does (``edgewise.runtime.letterbox.preprocess_batch``), a few frames per batch,
streamed so memory stays bounded and progress can be shown; quantize with
``quantize_static`` in QDQ format, per-channel symmetric QInt8 weights and QUInt8
activations (U8S8, ``reduce_range=False``: ORT's recommendation for x86 CPUs with VNNI;
``target="tensorrt"`` makes activations symmetric QInt8 and leaves biases float, the only
QDQ form TensorRT takes: ``edgewise.runtime.opsets.tensorrt_problems``);
copy the float model's metadata; load the result with ONNX Runtime and run one frame
before it is moved into place; then compare INT8 against float detections on held-out
frames (``edgewise_tools.models.agreement``) and time both (``edgewise_tools.models.heldout``).

The YOLOv5 decode tail after the Detect convolutions (sigmoid, grid/anchor arithmetic,
the concat of pixel boxes with probabilities) always stays float: one 8-bit scale
cannot hold 0..640 pixels and 0..1 scores at once. Everything else is INT8 by default,
the Detect convolutions with their outputs over a fixed logit range
(``HEAD_LOGIT_RANGE``). ``keep_float`` can keep the first convolution (``first_conv``),
the three Detect convolutions (``detect_head``) or the SiLU activations (``silu``) in
float. The default was chosen by measurement (``bench/int8_variants.py``,
``models/MODEL_CARD.md``, "INT8 layout"): quantizing the head and first convolution
made YOLOv5s@640 about 20% faster than keeping them float, and with the head's logit
range the INT8-vs-float agreement of both reference models stayed at F1 0.97; float
SiLU pairs are slower (ONNX Runtime does not fuse them between Q/DQ nodes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from edgewise.errors import EdgewiseError, InvalidInputError, ModelError
from edgewise.outputs import check_output_file, replace_durably
from edgewise.runtime.cpu import cpu_lacks_vnni
from edgewise.runtime.firstframe import first_frame_problem
from edgewise.runtime.metadata import (
    DEFAULT_CONF,
    ModelInfo,
    check_output,
    find_sidecar,
    imgsz_guess_warning,
    load_model_info,
    names_to_metadata,
)
from edgewise.runtime.opsets import model_problems, tensorrt_problems, unused_domains
from edgewise_tools.models.agreement import Agreement
from edgewise_tools.models.calibration import (
    CalibrationReader,
    Progress,
    calib_batch_size,
    open_frames,
    split_indices,
)
from edgewise_tools.models.heldout import Speed, check_agreement, cpu_session

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
METHODS = ("minmax", "entropy", "percentile")
KEEP_FLOAT_CHOICES = ("first_conv", "detect_head", "silu")
#: measured (module docstring): nothing but the decode tail stays float
DEFAULT_KEEP_FLOAT: Tuple[str, ...] = ()
#: The Detect convolutions output logits that only ever go through a sigmoid, which is
#: within 3.4e-4 of 0 or 1 beyond +-8. A quantized head's calibrated output range is
#: clipped to it: a trained YOLOv5s's P5 head spans -251..105 logits on real frames
#: (1.4 logits per 8-bit step: objectness flips across conf 0.25 and agreement fell to
#: F1 0.71), while +-8 gives 0.063 logits per step and loses nothing downstream.
HEAD_LOGIT_RANGE = 8.0
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
    speed: Optional[Speed] = None
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
        if self.speed is not None:
            lines.append(f"  {self.speed.summary()}")
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
            "speed": self.speed.as_dict() if self.speed is not None else None,
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
                f"--keep-float {item!r}: unknown layer group; "
                "use first_conv, head (detect_head), silu or none"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def graph_regions(model: Any) -> Dict[str, List[str]]:
    """Node names of the first conv, the Detect convs, the SiLU activations and the decode tail.

    Found structurally (works for any exporter's node names): the Detect convs are the
    convolutions with no convolution downstream; the decode tail is every other node
    with no convolution downstream; the first conv is the first Conv in topological order;
    ``silu`` holds the Sigmoid and Mul of every ``x * sigmoid(x)`` outside the tail.
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
    sigmoid_in = {n.output[0]: n for i, n in enumerate(nodes) if n.op_type == "Sigmoid" and reaches_conv[i]}
    silu: List[str] = []
    for n in nodes:
        if n.op_type != "Mul" or len(n.input) != 2:
            continue
        for a, b in (n.input, n.input[::-1]):
            sig = sigmoid_in.get(b)
            if sig is not None and sig.input[0] == a:
                silu.extend((sig.name, n.name))
                break
    return {"first_conv": first, "detect_head": head, "silu": silu, "decode_tail": tail}


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
    conf_thres: Optional[float] = None,
    iou_thres: float = 0.45,
    threads: int = 0,
    progress: Optional[Progress] = None,
    op_types: Optional[Sequence[str]] = None,
    target: str = "cpu",
    reduce_range: bool = False,
    imgsz: Union[int, Sequence[int], None] = None,
) -> QuantReport:
    """Quantize ``model_path`` to INT8 (QDQ) at ``out_path`` and report agreement with float.

    Args:
        calib: folder of images or a video file; ``samples`` frames calibrate.
        out_path: defaults to ``<model>-int8.onnx`` next to the model.
        method: ``minmax``, ``entropy`` or ``percentile`` (99.999th).
        keep_float: layer groups left in float (``first_conv``, ``detect_head``, ``silu``),
            or "none" (the default: only the decode tail stays float).
        holdout: frames for the agreement check, taken from ``holdout_source`` when
            given, else from ``calib`` disjoint from the calibration frames; 0 skips it.
            The same frames time both models (``QuantReport.speed``).
        conf_thres, iou_thres: decode thresholds of the agreement check, in [0, 1] (checked
            before anything runs); ``conf_thres`` None is the model's own threshold (metadata
            ``edgewise_conf_thres``, what the edge, the worker and ``eval`` run it at), else 0.25.
        threads: intra-op threads of the agreement sessions (0 = ORT default).
        progress: ``progress(stage, done, total)`` callback.
        op_types: operator types to quantize (default: per ``target``, see ``TARGETS``).
        target: ``cpu`` (ONNX Runtime on x86/ARM: QUInt8 activations) or ``tensorrt``
            (symmetric QInt8 activations, which TensorRT's explicit quantization requires).
        reduce_range: 7-bit weights, ORT's advice for x86 CPUs without VNNI, whose U8S8
            kernels (``vpmaddubsw``) can saturate; unneeded with VNNI or on ARM.
        imgsz: input size for a model whose graph and metadata do not fix it (calibration
            and agreement run at it; it is written into the INT8 model's metadata).
    Raises:
        ModelError: missing/corrupt/not-YOLOv5 model, or a quantization step that failed
        (one line; nothing is written at ``out_path`` then). InvalidInputError: bad
        arguments or an unreadable/empty calibration source.
    """

    t0 = time.perf_counter()
    _check_numbers(conf_thres=conf_thres, iou_thres=iou_thres, threads=threads)
    if method not in METHODS:
        raise InvalidInputError(f"--method {method!r}: use one of {', '.join(METHODS)}")
    if target not in TARGETS:
        raise InvalidInputError(f"--target {target!r}: use one of {', '.join(TARGETS)}")
    act_name, default_ops = TARGETS[target]
    ops = list(op_types) if op_types is not None else (list(default_ops) if default_ops else None)
    groups = parse_keep_float(keep_float)
    info = load_model_info(Path(model_path), imgsz)
    if conf_thres is None:  # the agreement is measured where the runtime runs the model
        conf_thres = info.conf_thres if info.conf_thres is not None else DEFAULT_CONF
    if info.precision == "int8":
        raise InvalidInputError(f"{info.path} is already quantized (int8); pass the float model")
    if info.precision == "float16":  # ONNX Runtime's calibration feeds float32 and fails deep inside
        raise InvalidInputError(f"{info.path} is a float16 model; quantize the float32 export (YOLOv5's "
                                "export.py without --half)")
    src = Path(model_path)
    out = Path(out_path) if out_path is not None else src.with_name(f"{src.stem}-int8.onnx")
    if out.resolve() == src.resolve():
        raise InvalidInputError(f"output {out} would overwrite the input model; choose another -o")
    check_output_file(out, "-o")  # before calibration, which takes minutes
    problem = first_frame_problem(info, 1)  # a float model no runtime takes (NaN, logits) makes no INT8 one
    if problem:
        raise ModelError(f"{info.path}: {problem}")
    source = open_frames(calib, "calibration source")
    notes: List[str] = []
    if info.imgsz_source == "default":
        notes.append(imgsz_guess_warning(info))
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
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    cal_method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[method]
    with tempfile.TemporaryDirectory(prefix="edgewise-quant-") as tmp:
        float_in, per_channel, note = _float_for_qdq(info.path, Path(tmp), per_channel)
        if note:
            notes.append(note)
        pre = Path(tmp) / "preprocessed.onnx"
        with _quiet_ort_info(), _as_model_error(info.path, "ONNX Runtime's pre-processing"):
            from onnxruntime.quantization import quant_pre_process

            quant_pre_process(str(float_in), str(pre), skip_symbolic_shape=True)
        pre_model = onnx.load(str(pre))
        regions = graph_regions(pre_model)
        exclude: List[str] = list(regions["decode_tail"])
        for g in groups:
            exclude.extend(regions[g])
        by_name = {n.name: n for n in pre_model.graph.node}
        head_outputs = [by_name[name].output[0] for name in regions["detect_head"]]
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
        with _quiet_ort_info(), _as_model_error(
            info.path, "ONNX Runtime's quantize_static"
        ), _explain_histogram_errors(method):
            from onnxruntime.quantization import quantize_static

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
                    # TensorRT's DequantizeLinear takes int8 only: its biases stay float (it
                    # folds them into the INT8 convolution itself); opsets.tensorrt_problems
                    "QuantizeBias": target != "tensorrt",
                },
            )
        calib_seconds = time.perf_counter() - t_cal
        del pre_model
        if "detect_head" not in groups:
            _clip_head_ranges(staged, head_outputs)
        quant_meta = {"method": method, "frames": reader.frames_used, "target": target}
        extra = {"edgewise_quant": json.dumps(quant_meta)}
        extra.update(sidecar_metadata(info))
        set_metadata(staged, extra, like=info.path)
        dropped = drop_unused_opsets(staged)
        if dropped:
            notes.append(f"dropped opset imports no node uses: {', '.join(dropped)} (a JetPack 5.1 device "
                         "refuses some of them)")
        # Validate before publishing: a failed or interrupted run leaves no half-written
        # or invalid model at ``out``.
        _validate_staged(staged, info, probe)
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        try:
            shutil.copyfile(staged, part)
            replace_durably(part, out)
        finally:
            if part.exists():
                part.unlink()
    if target == "cpu" and not reduce_range and cpu_lacks_vnni():
        notes.append(
            "this x86 CPU has no VNNI: ORT's U8S8 kernels may saturate here; "
            "if agreement is poor, try --reduce-range"
        )
    out_info = load_model_info(out)
    notes.extend(f"not loadable on a Jetson: {line}" for line in model_problems(out_info, tensorrt=False))
    notes.extend(f"not loadable by a Jetson's TensorRT: {line}"
                 for line in tensorrt_problems(out_info.ops, out_info.qdq))
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
        float_bytes=info.file_bytes,
        int8_bytes=out.stat().st_size,
        conf_thres=conf_thres,
        notes=notes,
    )
    if hold_idx:
        agreement, report.speed = check_agreement(
            info.path, out, hsource, hold_idx, conf_thres, iou_thres, threads, progress, info.imgsz
        )
        report.holdout_frames = agreement.frames
        if agreement.frames == 0:
            # nothing was compared: no figures (they would be NaN), and nothing said of the model
            report.notes.append(
                f"none of the {len(hold_idx)} held-out frames of {hsource.path} could be decoded: agreement "
                "and speed not checked (the INT8 model was written; check it with --holdout-source)"
            )
        else:
            report.agreement = agreement
            if agreement.ref_boxes < 10:
                report.notes.append(
                    f"the float model found only {agreement.ref_boxes} boxes on the held-out frames "
                    f"at conf {conf_thres:g}: the agreement figures say little (lower --conf or use other frames)"
                )
    else:
        report.notes.append("no held-out frames: agreement and speed not checked")
    # after the agreement check: the held-out frames it could not read are skipped images too
    for used in dict.fromkeys((source, hsource)):
        skipped = sorted(set(used.skipped))
        if skipped:
            report.notes.append(f"{len(skipped)} unreadable images of {used.path} skipped, e.g. {skipped[0]}")
    report.total_seconds = time.perf_counter() - t0
    return report


def _check_numbers(conf_thres: Optional[float], iou_thres: float, threads: int) -> None:
    """The agreement check's options, refused before anything runs (calibration takes
    minutes): one line naming the flag, as ``edgewise eval``'s option checks do."""
    for flag, value, meaning in (("--conf", conf_thres, "the agreement check's confidence threshold"),
                                 ("iou_thres", iou_thres, "the agreement check's NMS IoU threshold")):
        if value is not None and not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise InvalidInputError(f"{flag} {value:g}: must be in [0, 1] ({meaning})")
    if threads < 0:
        raise InvalidInputError(f"--threads {threads}: must be >= 0 (ONNX Runtime threads; 0 = its default)")


#: per-channel QDQ puts ``axis`` on QuantizeLinear/DequantizeLinear: ONNX opset 13
PER_CHANNEL_OPSET = 13


def _clip_head_ranges(path: Path, head_outputs: Sequence[str]) -> None:
    """Clip the calibrated 8-bit range of the Detect convolutions' outputs to
    +-``HEAD_LOGIT_RANGE`` (never wider than calibrated), rewriting their Q/DQ scale and
    zero point in place."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    lim = float(HEAD_LOGIT_RANGE)
    for q in model.graph.node:
        if q.op_type != "QuantizeLinear" or q.input[0] not in head_outputs:
            continue
        scale = float(numpy_helper.to_array(inits[q.input[1]]))
        zp_arr = numpy_helper.to_array(inits[q.input[2]])
        qmin, qmax = (0, 255) if zp_arr.dtype == np.uint8 else (-128, 127)
        rmin, rmax = (qmin - int(zp_arr)) * scale, (qmax - int(zp_arr)) * scale
        if zp_arr.dtype == np.uint8:  # asymmetric, as ORT computes it
            lo, hi = max(rmin, -lim), min(rmax, lim)
            new_scale = (hi - lo) / (qmax - qmin)
            new_zp = int(np.clip(round(qmin - lo / new_scale), qmin, qmax))
        else:  # symmetric int8 (TensorRT): zero point stays 0
            new_scale = min(max(-rmin, rmax), lim) / qmax
            new_zp = int(zp_arr)
        if new_scale >= scale:  # already within the logit range
            continue
        inits[q.input[1]].CopyFrom(numpy_helper.from_array(np.array(new_scale, np.float32), q.input[1]))
        inits[q.input[2]].CopyFrom(numpy_helper.from_array(np.array(new_zp, zp_arr.dtype), q.input[2]))
    onnx.save(model, str(path))


def _float_for_qdq(path: Path, tmp: Path, per_channel: bool) -> Tuple[Path, bool, str]:
    """The float model to quantize, whether per-channel is possible, and a note.

    ONNX Runtime's pre-processing wants one self-contained file: a model with external
    data (torch's dynamo exporter writes ``<model>.data``) is saved inline into ``tmp``.
    Per-channel weights need opset >= 13 (``axis`` on Q/DQ). An older model (YOLOv5
    v7.0's ``export.py`` defaults to opset 12) is upgraded with ONNX's version converter;
    if that fails, quantization falls back to per-tensor weights and the note says why.
    """
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        model = onnx.load(str(path))  # with external data
    except Exception as e:
        raise ModelError(f"{path}: cannot load the model with its weights: {_one_line(e)}") from None
    bare = onnx.load(str(path), load_external_data=False)
    external = any(uses_external_data(t) for t in bare.graph.initializer)
    del bare
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 10:
        raise ModelError(
            f"{path}: opset {opset} predates QuantizeLinear (opset 10); re-export at opset 13 or newer"
        )
    note, rewrite = "", external
    if per_channel and opset < PER_CHANNEL_OPSET:
        from onnx import version_converter

        try:
            converted = version_converter.convert_version(model, PER_CHANNEL_OPSET)
            onnx.checker.check_model(converted)
        except Exception as e:
            per_channel = False
            note = (
                f"opset {opset}: per-channel weights need opset {PER_CHANNEL_OPSET} and ONNX's "
                f"version converter failed ({_one_line(e)}); quantized per-tensor instead"
            )
        else:
            model, rewrite = converted, True
            note = f"opset {opset} upgraded to {PER_CHANNEL_OPSET} (ONNX version converter) for per-channel weights"
    if not rewrite:
        return path, per_channel, note
    self_contained = tmp / "float.onnx"
    for t in model.graph.initializer:  # the tensors are in memory now: store them inline
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    onnx.save(model, str(self_contained))
    return self_contained, per_channel, note


def _validate_staged(staged: Path, info: Any, batch: Any) -> None:
    """Load the INT8 model with ONNX Runtime and run one calibration frame (a letterboxed
    ``batch``, cut to the model's fixed batch or 1); ``ModelError`` if anything fails."""
    import numpy as np

    with _as_model_error(info.path, "the INT8 model's validation (ONNX Runtime load + one frame)"):
        session = cpu_session(staged, 1)
        frame = batch[: max(1, info.fixed_batch)]
        raw = np.asarray(session.run(None, {info.input_name: frame})[0], np.float32)
        try:
            check_output(info, frame.shape, raw)
        except ModelError as exc:  # the float model passed this check: the quantization broke it
            why = str(exc).replace(f"{info.path}: ", "", 1)
            raise ModelError(f"{info.path}: the INT8 model fails the runtime's output check ({why}); keep the "
                             "detect head in float (--keep-float head) or try another --method or --target") from None


def _one_line(e: BaseException) -> str:
    """The error on one line; a long one keeps its start and its end (ONNX Runtime puts
    the node dump first and the reason last)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else f"{text[:140]} ... {text[-155:]}"


@contextlib.contextmanager
def _as_model_error(path: Path, stage: str) -> Iterator[None]:
    """Turn anything a third-party step raises into a one-line ``ModelError``."""
    try:
        yield
    except EdgewiseError:
        raise
    except Exception as e:  # ONNX / ONNX Runtime raise many types, some not Exception subclasses we know
        raise ModelError(f"{path}: {stage} failed: {type(e).__name__}: {_one_line(e)}") from None


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


def _node_domains(graph: Any) -> Iterator[str]:
    """The domain of every node in ``graph`` and in its subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node.domain
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _node_domains(sub)


def drop_unused_opsets(path: Path) -> List[str]:
    """Remove the opset imports of ``path`` that no node uses (``edgewise.runtime.opsets``), in
    place and atomically; the domains removed. What a runtime computes does not change."""
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    used = list(_node_domains(model.graph))
    for fn in model.functions:
        used.extend(n.domain for n in fn.node)
    unused = unused_domains({o.domain: o.version for o in model.opset_import}, used)
    if not unused:
        return []
    keep = [o for o in model.opset_import if o.domain not in unused]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    part = path.with_name(path.name + ".part")
    onnx.save(model, str(part))
    replace_durably(part, path)
    return unused


def sidecar_metadata(info: ModelInfo) -> Dict[str, str]:
    """What the INT8 model's metadata must add to the float model's to load the same way.

    The class names, stride and input size the float model took from a sidecar YAML (or
    the caller's ``imgsz``) come from next to the float model, not next to ``-o``: left
    out, the INT8 model would load with names ``0..nc-1`` and an assumed 640x640 input."""
    out: Dict[str, str] = {}
    if "names" not in info.metadata and info.names_source != "default":
        out["names"] = names_to_metadata(info.names)
    if "stride" not in info.metadata and find_sidecar(info.path) is not None:
        out["stride"] = str(info.stride)  # the sidecar's, or the 32 it loaded with
    if info.imgsz_source not in ("graph", "default", "onnx-metadata"):  # override or a sidecar path
        out["imgsz"] = str(list(info.imgsz))  # calibrated at this size: say so in the file
    return out


def set_metadata(path: Path, extra: Dict[str, str], like: Optional[Path] = None) -> None:
    """Replace ``path``'s ONNX ``metadata_props`` with ``like``'s (default: its own) plus ``extra``,
    writing the file atomically; external weight files stay where they are."""
    import onnx

    path = Path(path)
    meta = {p.key: p.value for p in onnx.load(str(like or path), load_external_data=False).metadata_props}
    meta.update(extra)
    model = onnx.load(str(path), load_external_data=False)
    del model.metadata_props[:]
    for k, v in meta.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = k, v
    part = path.with_name(path.name + ".part")
    onnx.save(model, str(part))
    replace_durably(part, path)
