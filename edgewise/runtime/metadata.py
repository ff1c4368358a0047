"""What a YOLOv5 ONNX model is: ``ModelInfo`` read and validated from the file.

Class names, stride and input size come from the ONNX ``metadata_props`` the
way Ultralytics ``export.py`` writes them (``names`` = a Python dict literal
such as ``"{0: 'person', 1: 'bicycle'}"``, ``stride`` = ``"32"``, ``imgsz`` =
``"[640, 640]"``), or from a sidecar YAML next to the model (``<model>.yaml``,
then ``model.yaml``) with the keys ``names``, ``stride``, ``imgsz``. A fixed-size
graph input is the truth for the input size; a dynamic-size one (``--dynamic``
exports, which YOLOv5 v7.0 writes without ``imgsz``) takes the caller's ``imgsz``,
then the metadata's, and otherwise assumes 640x640 (``imgsz_source == "default"``,
which callers warn about). The graph
is checked to be a YOLOv5 detector: one input ``[B, 3, H, W]`` and a first
output ``[B, N, 5 + nc]`` consistent with the class names. Every failure is a
``ModelError`` naming the file and saying what was expected. The file is parsed by
``edgewise.runtime.onnxproto`` (protobuf only: a device has no ``onnx`` package).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import numbers
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from edgewise.errors import ModelError
from edgewise.fieldrules import ASCII_DIGITS_HINT, MAX_NAME_CHARS, ascii_digits, class_name_form
from edgewise.runtime.onnxproto import EXTERNAL, FLOAT, FLOAT16, INTEGER_TYPES, parse_model
from edgewise.yamlnodes import UNQUOTED_BOOLEAN

PathLike = Union[str, Path]
ImgszLike = Union[int, Sequence[int]]
#: ONNX operators of a graph with non-maximum suppression built in (an end-to-end export): ONNX's
#: own and TensorRT's NMS plugins as exporters name them
NMS_OPS = frozenset({"NonMaxSuppression", "EfficientNMS_TRT", "EfficientNMS_ONNX_TRT", "BatchedNMS_TRT",
                     "BatchedNMSDynamic_TRT"})
#: ONNX element types the detection output may have: not stated (0), float32 (1), float16 (10),
#: double (11); the backends hand the decoder float32
_OUTPUT_TYPES = (0, FLOAT, FLOAT16, 11)
#: the largest input side a model may declare (pixels): beyond it one image would need gigabytes
MAX_INPUT_SIDE = 8192
#: the largest fixed batch a model may declare: every call runs that many images, padded
MAX_FIXED_BATCH = 256
#: the size YOLOv5 assumes when nothing states it (export.py / detect.py ``--imgsz`` default)
DEFAULT_IMGSZ = (640, 640)
#: metadata key of the score threshold a model's maker chose for it (the one maximising F1 on
#: validation frames; ``python -m edgewise_tools.train.camera`` writes it); the runtime uses it
#: where no threshold is configured, else :data:`DEFAULT_CONF`
CONF_KEY = "edgewise_conf_thres"
#: YOLOv5's detect.py default score threshold
DEFAULT_CONF = 0.25
QUANT_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "ConvInteger",
        "MatMulInteger",
        "DynamicQuantizeLinear",
    }
)


@dataclass(frozen=True)
class ModelInfo:
    """A validated YOLOv5 detector.

    Attributes:
        path: the model file.
        names: class names, index = class id.
        nc: number of classes (``len(names)``).
        stride: largest head stride (32 for P5 models).
        imgsz: network input ``(height, width)``.
        input_name: name of the image input (Ultralytics: ``images``).
        input_shape: input dims; ``None`` where symbolic.
        output_name: name of the detection output (Ultralytics: ``output0``).
        output_shape: output dims; ``None`` where symbolic.
        dynamic_batch: the batch axis is symbolic.
        fixed_batch: the batch size the model requires when not dynamic.
        dynamic_hw: height/width are symbolic (any multiple of the stride).
        input_dtype: numpy dtype name of the input (``float32`` or ``float16``).
        precision: ``float32``, ``float16`` or ``int8`` (QDQ / QLinear nodes).
        sha256: hex digest of the file bytes.
        metadata: the raw ``metadata_props``.
        names_source: where the names came from (``onnx-metadata``, a YAML path, ``default``).
        imgsz_source: where the input size came from: ``graph`` (fixed input dims),
            ``override`` (the caller's ``imgsz``), ``onnx-metadata``, a YAML path, or
            ``default`` (a guess: dynamic H/W and nothing states the size).
        external_data: files next to the model holding its weights (torch's dynamo
            exporter writes ``<model>.data``); ``sha256`` covers them too.
        conf_thres: the score threshold stated in the metadata (:data:`CONF_KEY`), if any.
        opsets: ``opset_import``, domain -> version (``""`` is the default domain).
        node_domains: the operator domains the nodes use.
        ir_version: the file's ONNX IR version (``ModelProto.ir_version``).
        ops: the distinct ``(domain, op_type)`` of the nodes.
        qdq: the distinct forms of the model's QuantizeLinear/DequantizeLinear nodes, as
            ``(op_type, integer type, a zero point is not 0)``: the type of the zero point, or
            of a DequantizeLinear's constant input (an int32 bias), or ``uint8`` for a
            QuantizeLinear without one (ONNX's default); ``?`` where it is not a constant.
    """

    path: Path
    names: Tuple[str, ...]
    nc: int
    stride: int
    imgsz: Tuple[int, int]
    input_name: str
    input_shape: Tuple[Optional[int], ...]
    output_name: str
    output_shape: Tuple[Optional[int], ...]
    dynamic_batch: bool
    fixed_batch: int
    dynamic_hw: bool
    input_dtype: str
    precision: str
    sha256: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    names_source: str = "default"
    imgsz_source: str = "default"
    external_data: Tuple[Path, ...] = ()
    conf_thres: Optional[float] = None
    opsets: Mapping[str, int] = field(default_factory=dict)
    node_domains: Tuple[str, ...] = ()
    ir_version: int = 0
    ops: Tuple[Tuple[str, str], ...] = ()
    qdq: Tuple[Tuple[str, str, bool], ...] = ()

    @property
    def file_bytes(self) -> int:
        """Size of the model file plus its external data files."""
        return sum(f.stat().st_size for f in (self.path,) + self.external_data)

    @property
    def num_candidates(self) -> Optional[int]:
        """Head rows N (25,200 for 640x640 P5), when known."""
        return self.output_shape[1] if len(self.output_shape) > 1 else None


#: What to do about repeated class names in a model's metadata (:func:`parse_names`'s ``fix``).
FIX_MODEL_NAMES = "rename one in the names metadata or in a sidecar <model>.yaml"


def parse_names(value: Any, where: str, fix: str = FIX_MODEL_NAMES) -> Tuple[str, ...]:
    """Class names from a dict ``{id: name}``, a list, or their string literal.

    Dict keys must be exactly ``0..nc-1``. Uses ``ast.literal_eval`` (no code
    execution) for strings. The one rule of a class name (:func:`_class_name`), also for the
    names a model is exported with and a dataset is trained on; ``fix`` is what to do about
    repeated names, for the message.
    """
    if isinstance(value, str):
        text = value
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
            why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise ModelError(
                f"{where}: class names {text[:80]!r}{'...' if len(text) > 80 else ''} are not a Python "
                f"dict/list literal like \"{{0: 'person', 1: 'bicycle'}}\" ({why}); rewrite the names metadata"
            ) from None
    if isinstance(value, Mapping):
        try:
            items = sorted(((_strict_int(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        except (TypeError, ValueError):
            keys = list(value)[:20]
            raise ModelError(f"{where}: class names dict keys must be integers 0..nc-1, got {keys}"
                             f"{_digits_hint(keys)}") from None
        if [k for k, _ in items] != list(range(len(items))):
            raise ModelError(
                f"{where}: class ids must be 0..{len(items) - 1} without gaps, got {[k for k, _ in items][:20]}"
            )
        raw = [v for _, v in items]
    elif isinstance(value, (list, tuple)):
        raw = list(value)
    else:
        raise ModelError(f"{where}: class names must be a dict {{id: name}} or a list, got {type(value).__name__}")
    if not raw:
        raise ModelError(f"{where}: class names are empty")
    names = tuple(_class_name(v, i, where) for i, v in enumerate(raw))
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise ModelError(f"{where}: class names repeat ({', '.join(map(repr, repeated[:5]))}): the edge and the "
                         f"cloud model's classes are matched by name, so each must be unique; {fix}")
    return names


#: Unicode categories no class name may hold: control characters, line and paragraph separators,
#: lone surrogates (a non-breaking space or a zero-width joiner is fine: real names use them)
_NOT_IN_NAMES = frozenset({"Cc", "Zl", "Zp", "Cs"})


def _class_name(value: Any, i: int, where: str) -> str:
    """Class ``i``'s name: text (a number is taken as its digits) of printable characters, in
    Unicode normal form C (names are matched by name: a name taken from a macOS file name is
    decomposed, NFD, and differed from the same name typed elsewhere, NFC, though both look alike).
    Anything else was turned into text before, so a list, a null or a YAML alias bomb became a
    name (the bomb: hundreds of MB of one)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        shown = f" {value!r}" if value is None or isinstance(value, (bool, float)) else ""  # never a container's repr
        hint = f" ({UNQUOTED_BOOLEAN})" if isinstance(value, bool) else ""
        raise ModelError(f"{where}: class name {i} is a {type(value).__name__}{shown}, not text{hint}")
    # one form of each name: an edge and a cloud model (and the policy that names a class) must
    # agree on a name that looks the same, whichever Unicode form each was written in
    name = class_name_form(str(value))
    if not name.strip() or len(name) > MAX_NAME_CHARS or any(unicodedata.category(c) in _NOT_IN_NAMES for c in name):
        raise ModelError(f"{where}: class name {i} {name[:40]!r} must be 1..{MAX_NAME_CHARS} characters, not blank, "
                         "without control characters or line breaks")
    return name


def _parse_conf(value: str, where: str) -> float:
    try:
        out = float(value)
    except ValueError:
        raise ModelError(f"{where}: {CONF_KEY} must be a number in [0, 1], got {value!r}") from None
    if not 0.0 <= out <= 1.0:  # NaN fails too
        raise ModelError(f"{where}: {CONF_KEY} must be a number in [0, 1], got {value!r}")
    return out


def _strict_int(value: Any) -> int:
    """``value`` as an int: ints, integral floats (``32.0``) and quoted numbers in the ASCII digits
    0-9 (:func:`~edgewise.fieldrules.ascii_digits`, the one rule: ``str.isdigit`` took ``'٣٢'``
    as 32); bools, ``32.9``, other text refused."""
    if isinstance(value, bool):
        raise TypeError(value)
    if isinstance(value, numbers.Integral):  # numpy's too
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not number.is_integer():
            raise ValueError(value)
        return int(number)
    if isinstance(value, str) and ascii_digits(value.strip()):  # a quoted number
        return int(value)
    raise TypeError(value)


def _digits_hint(raw: Any) -> str:
    """`` (write it in the ASCII digits 0-9)`` where ``raw`` shows another script's digits, for a message."""
    return f" ({ASCII_DIGITS_HINT})" if any(c.isdigit() and not c.isascii() for c in str(raw)) else ""


def _parse_int(value: Any, key: str, where: str) -> int:
    raw = value
    try:
        if isinstance(value, str):
            value = ast.literal_eval(value.strip())
        if isinstance(value, (list, tuple)):  # some exports write stride as a list
            value = max(_strict_int(v) for v in value)
        out = _strict_int(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ModelError(f"{where}: {key} must be an integer like 32, got {raw!r}{_digits_hint(raw)}; "
                         f"fix the {key} metadata") from None
    if out <= 0:
        raise ModelError(f"{where}: {key} must be positive, got {out}")
    return out


def _parse_imgsz(value: Any, where: str) -> Tuple[int, int]:
    raw = value
    try:
        if isinstance(value, str):
            text = value.strip()
            if ("x" in text or "," in text) and not text.startswith(("[", "(")):  # "480x640", "480,640"
                value = [v.strip() for v in text.replace("x", ",").split(",")]  # "64x" is [64, ""]: refused
            else:
                value = ast.literal_eval(text)
        # each side an integer: 64.5 was cut to 64, and the text '64' read as the sides 6 and 4
        vals = [_strict_int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ModelError(f"{where}: imgsz must be an int or [h, w], got {raw!r}{_digits_hint(raw)}") from None
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2 or min(vals) <= 0:
        raise ModelError(f"{where}: imgsz must be an int or [h, w] of positive ints, got {raw!r}")
    return (vals[0], vals[1])


def find_sidecar(path: Path) -> Optional[Path]:
    """``<model>.yaml`` / ``<model>.yml`` next to the model, else ``model.yaml``."""
    for cand in (path.with_suffix(".yaml"), path.with_suffix(".yml"), path.parent / "model.yaml"):
        if cand.is_file():
            return cand
    return None


def _read_sidecar(path: Path) -> Dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: sidecar YAML is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    except (OSError, yaml.YAMLError, RecursionError, MemoryError, ValueError) as e:  # ValueError: a 5000-digit int
        why = " ".join(str(e).split())[:200] or type(e).__name__
        raise ModelError(f"{path}: cannot read sidecar YAML: {why}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ModelError(
            f"{path}: sidecar YAML must be a mapping with names/stride/imgsz, got a {type(data).__name__}; "
            "fix it, or move it away if it is not this model's sidecar"
        )
    return data


def _dims(value_info: Any) -> Tuple[Optional[int], ...]:
    """A tensor's dims, None where symbolic; -1 too, which tf2onnx and paddle2onnx write for
    "any" and ONNX Runtime runs at any size."""
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return ()
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value != -1 else None for d in tt.shape.dim)


def parse_imgsz(value: Any, where: str) -> Tuple[int, int]:
    """``640``, ``[480, 640]``, ``"640"``, ``"[480, 640]"``, ``"480,640"`` or ``"480x640"`` ->
    ``(h, w)``, from a setting, a flag, the metadata or a sidecar alike.

    Raises ``ModelError`` naming ``where`` for anything else.
    """
    return _parse_imgsz(value, where)


#: the ``imgsz`` setting of the edge daemon (``model.imgsz``) and of the worker, one text for both
IMGSZ_SETTING_DOC = ("Input size for a model that does not state it (dynamic height/width and no `imgsz` "
                     "metadata, e.g. YOLOv5 v7.0 `--dynamic` exports): `640` (square) or `384,640` (height, "
                     "width; `384x640` too); 0 = the model's own (else 640, with a warning). A fixed-size model "
                     "must match it; the stride is checked when the model loads.")


def setting_imgsz(value: Union[str, int], where: str = "imgsz") -> Optional[Tuple[int, int]]:
    """The ``imgsz`` setting (:data:`IMGSZ_SETTING_DOC`) as ``(h, w)``; None for 0, the model's
    own. Raises ``ModelError`` naming ``where`` for anything else that is not a size."""
    if str(value).strip() in ("0", ""):
        return None
    return parse_imgsz(value, where)


def imgsz_problem(value: Union[str, int]) -> str:
    """What is wrong with an ``imgsz`` setting ("" if nothing), for the settings' validation."""
    try:
        size = setting_imgsz(value)
    except ModelError:
        return f"{str(value)!r} is not a size; write 640 (square) or 384,640 (height, width), or 0 for the model's own"
    if size is not None and max(size) > MAX_INPUT_SIDE:
        return f"{str(value)!r}: each side at most {MAX_INPUT_SIDE}"
    return ""


def load_model_info(path: PathLike, imgsz: Optional[ImgszLike] = None) -> ModelInfo:
    """Read, hash and validate a YOLOv5 ONNX model; see the module docstring.

    ``imgsz`` (an int or ``(h, w)``) is the input size for a model whose graph leaves
    it dynamic; for a fixed-size graph it must equal the graph's size.
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model file {p} does not exist; pass the path of a YOLOv5 .onnx file")
    if not p.is_file():
        raise ModelError(f"model path {p} is not a file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read model file {p}: {e}") from None
    sha = hashlib.sha256(data).hexdigest()
    try:
        model = parse_model(data)
    except Exception as e:  # protobuf DecodeError and friends
        raise ModelError(f"{p} is not a valid ONNX model (corrupt or truncated?): {e}") from None
    del data
    graph = model.graph
    if len(graph.node) == 0:
        raise ModelError(f"{p} is not a valid ONNX model: the graph has no nodes")
    external = _external_data_files(p, model)
    if external:
        h = hashlib.sha256(bytes.fromhex(sha))
        for f in external:
            try:
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
            except OSError as e:
                raise ModelError(
                    f"{p}: its weights are stored in {f}, which cannot be read ({e.strerror}); "
                    "keep the external data file next to the model"
                ) from None
        sha = h.hexdigest()
    override = parse_imgsz(imgsz, f"{p} (imgsz asked for)") if imgsz is not None else None
    info = _info_from_graph(p, model, sha, override)
    return dataclasses.replace(info, external_data=external) if external else info


def _external_data_files(p: Path, model: Any) -> Tuple[Path, ...]:
    """The distinct files a model's external tensors live in, in first-use order. A location
    is a path relative to the model's folder (ONNX external data); one that leaves the folder
    is refused (``edge bundle`` copied ``../../etc/hostname`` into a device image), and so is one
    that is not a regular file (``/dev/zero`` or a FIFO was read for ever)."""
    files: List[Path] = []
    for t in model.graph.initializer:
        if t.data_location != EXTERNAL:
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        if not loc:
            continue
        if Path(loc).is_absolute() or ".." in Path(loc).parts:
            raise ModelError(f"{p}: tensor {t.name!r} keeps its weights at {loc!r}, outside the model's folder; "
                             "external data must be a path inside it (re-export, or re-save the model with "
                             "onnx.save(..., save_as_external_data=True))")
        f = p.parent / loc
        if f in files:
            continue
        if f.exists() and not f.is_file():
            raise ModelError(f"{p}: its weights are stored in {f}, which is not a regular file; keep the "
                             "external data file next to the model")
        files.append(f)
    return tuple(files)


def _info_from_graph(
    p: Path, model: Any, sha: str, override: Optional[Tuple[int, int]] = None
) -> ModelInfo:
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in init_names]
    expected = "a YOLOv5 detector: one image input [B,3,H,W] and an output [B,N,5+nc]"
    if len(inputs) != 1:
        raise ModelError(f"{p}: expected {expected}; found {len(inputs)} graph inputs")
    inp = inputs[0]
    ishape = _dims(inp)
    if not inp.type.tensor_type.HasField("shape"):
        raise ModelError(f"{p}: input {inp.name!r} declares no shape (its rank is unknown, not 0); re-export the "
                         "model stating it, [B,3,H,W] (torch.onnx.export and YOLOv5's export.py do)")
    if len(ishape) != 4:
        raise ModelError(f"{p}: expected {expected}; input {inp.name!r} has rank {len(ishape)} {ishape}")
    if ishape[3] == 3 and ishape[1] != 3:
        raise ModelError(f"{p}: input {inp.name!r} {_shape_str(ishape)} is [B,H,W,3] (channels last); "
                         "export with channels first [B,3,H,W] as YOLOv5's export.py does")
    if ishape[1] not in (None, 3):
        raise ModelError(f"{p}: expected {expected}; input {inp.name!r} has {ishape[1]} channels")
    elem = inp.type.tensor_type.elem_type
    if elem == FLOAT:
        input_dtype = "float32"
    elif elem == FLOAT16:
        input_dtype = "float16"
    else:
        kind = INTEGER_TYPES.get(elem, f"ONNX type {elem}")
        raise ModelError(f"{p}: expected a float32/float16 image input, {inp.name!r} is {kind}; export the model with "
                         "a float input taking RGB in 0..1 (YOLOv5's export.py does: edgewise scales the pixels)")
    if not graph.output:
        raise ModelError(f"{p}: expected {expected}; the graph has no outputs")
    nms = sorted({node.op_type for node in graph.node if node.op_type in NMS_OPS})
    if nms:  # its outputs are kept boxes (num_dets, boxes, scores, classes), not the head: "rank 2" said nothing
        raise ModelError(f"{p}: the graph runs its own non-maximum suppression ({', '.join(nms)}), as an "
                         "end-to-end export does (YOLOv7's export.py --end2end, a TensorRT EfficientNMS plugin); "
                         "edgewise needs the raw head (an output [B,N,5+nc]) and runs NMS itself: export without NMS "
                         "(YOLOv5: python export.py --weights W.pt --include onnx)")
    protos = [o for o in graph.output[1:] if len(_dims(o)) == 4]
    if protos:  # mask coefficients ride in the head's columns: their 32 columns were read as 32 classes
        raise ModelError(f"{p}: output {protos[0].name!r} {_shape_str(_dims(protos[0]))} holds mask prototypes: this "
                         "is a segmentation export (YOLOv5-seg, YOLOv8-seg), whose head carries mask coefficients "
                         "edgewise would read as classes; edgewise runs detection models: export the detection "
                         "weights (YOLOv5: python export.py --weights yolov5s.pt --include onnx)")
    out = graph.output[0]
    if out.type.tensor_type.elem_type not in _OUTPUT_TYPES:
        raise ModelError(f"{p}: first output {out.name!r} has ONNX type {out.type.tensor_type.elem_type}, not "
                         "floating-point boxes and scores (integer scores truncate to 0: nothing would ever be "
                         "detected); export the YOLOv5 head as float32 or float16")
    oshape = _dims(out)
    if not out.type.tensor_type.HasField("shape"):
        raise ModelError(f"{p}: first output {out.name!r} declares no shape (its rank is unknown, not 0); state it "
                         "with ONNX's shape inference: m = onnx.load(p); onnx.save(onnx.shape_inference.infer_shapes(m), "
                         "p), or re-export the model")
    if len(oshape) != 3:
        raise ModelError(
            f"{p}: expected {expected}; first output {out.name!r} has rank {len(oshape)} {oshape}"
        )

    meta = {m.key: m.value for m in model.metadata_props}
    where = f"{p} (ONNX metadata)"
    names: Optional[Tuple[str, ...]] = None
    names_source = "default"
    stride: Optional[int] = None
    imgsz: Optional[Tuple[int, int]] = None
    imgsz_source = "default"
    if "names" in meta:
        names = parse_names(meta["names"], where)
        names_source = "onnx-metadata"
    if "stride" in meta:
        stride = _parse_int(meta["stride"], "stride", where)
    if "imgsz" in meta:
        imgsz = _parse_imgsz(meta["imgsz"], where)
        imgsz_source = "onnx-metadata"
    conf = _parse_conf(meta[CONF_KEY], where) if CONF_KEY in meta else None
    hw_static = ishape[2] is not None and ishape[3] is not None
    # The sidecar is read only for what the ONNX metadata lacks: an unrelated (or broken)
    # model.yaml next to a model whose metadata is complete does not stop it loading.
    missing = names is None or stride is None or (imgsz is None and not hw_static)
    side = find_sidecar(p) if missing else None
    if side is not None:
        sd = _read_sidecar(side)
        if names is None and "names" in sd:
            names = parse_names(sd["names"], str(side))
            names_source = str(side)
        if stride is None and "stride" in sd:
            stride = _parse_int(sd["stride"], "stride", str(side))
        if imgsz is None and "imgsz" in sd:
            imgsz = _parse_imgsz(sd["imgsz"], str(side))
            imgsz_source = str(side)

    cols = oshape[2]
    names_known = names is not None
    if names is not None and oshape[1] == 5 + len(names) and oshape[2] not in (None, oshape[1]):
        raise ModelError(f"{p}: output {out.name!r} {_shape_str(oshape)}: {transposed_yolov5(len(names))}")
    if not _exact_yolov5_head(oshape, ishape, names):  # (checked with the input size below)
        _check_head_layout(p, out.name, oshape, None, names_known)  # [B,4+nc,N] before "cannot tell nc"
    if names is None:
        if cols is None or cols < 6:
            raise ModelError(
                f"{p}: expected {expected}; cannot tell nc: output {out.name!r} is {oshape} and "
                f"there are no class names in the ONNX metadata or a sidecar YAML"
            )
        names = tuple(str(i) for i in range(cols - 5))
    nc = len(names)
    if cols is not None and cols != 5 + nc:
        if cols == 4 + nc and _one_row_per_cell(oshape[1], ishape if hw_static else None):
            raise ModelError(
                f"{p}: output {out.name!r} {_shape_str(oshape)} has 4 + nc = {cols} columns for {nc} class "
                "names (no objectness column): a YOLOv8 anchor-free output is not supported; export YOLOv5"
            )
        raise ModelError(
            f"{p}: expected {expected}; output {out.name!r} has {cols} columns but there are "
            f"{nc} class names ({names_source}), so 5 + nc = {5 + nc} was expected"
        )
    if stride is None:
        stride = 32
    if hw_static:  # the graph is the truth for a fixed-size input
        imgsz, imgsz_source = (int(ishape[2] or 0), int(ishape[3] or 0)), "graph"
        if override is not None and override != imgsz:
            raise ModelError(
                f"{p}: imgsz {override[0]}x{override[1]} was asked for but the model's input is "
                f"fixed at {imgsz[0]}x{imgsz[1]}; leave imgsz out (the setting model.imgsz, or the command's --imgsz) "
                "or export with --dynamic"
            )
    elif override is not None:
        imgsz, imgsz_source = override, "override"
    elif imgsz is None:
        imgsz = DEFAULT_IMGSZ
    if not hw_static:
        imgsz = _with_fixed_side(p, inp.name, ishape, imgsz, imgsz_source)
    which = "imgsz" if imgsz_source == "override" else "input size"
    if not all(0 < side <= MAX_INPUT_SIDE for side in imgsz):
        raise ModelError(f"{p}: {which} {imgsz[0]}x{imgsz[1]} is not a usable image size (each side in 1.."
                         f"{MAX_INPUT_SIDE} pixels); export the model at the size it runs at")
    if imgsz[0] % stride or imgsz[1] % stride:
        up = [-(-side // stride) * stride for side in imgsz]
        raise ModelError(f"{p}: {which} {imgsz[0]}x{imgsz[1]} is not a multiple of the stride {stride}; use "
                         f"multiples of {stride}, e.g. {up[0]}x{up[1]}")
    if hw_static:
        _check_head_layout(p, out.name, oshape, ishape, names_known)
    ops = {n.op_type for n in graph.node}
    if ops & QUANT_OPS:
        precision = "int8"
    elif input_dtype == "float16" or _mostly_fp16(graph):
        precision = "float16"
    else:
        precision = "float32"
    batch = ishape[0]
    if batch is not None and not 0 < batch <= MAX_FIXED_BATCH:  # (-1, "any", is None: ``_dims``)
        raise ModelError(f"{p}: input {inp.name!r} {_shape_str(ishape)} has a fixed batch of {batch} (allowed: "
                         f"1..{MAX_FIXED_BATCH}); export with batch 1, or a dynamic batch")
    return ModelInfo(
        path=p,
        names=names,
        nc=nc,
        stride=stride,
        imgsz=imgsz,
        input_name=inp.name,
        input_shape=ishape,
        output_name=out.name,
        output_shape=oshape,
        dynamic_batch=batch is None,
        fixed_batch=int(batch) if batch is not None else 0,
        dynamic_hw=not hw_static,
        input_dtype=input_dtype,
        precision=precision,
        sha256=sha,
        metadata=meta,
        names_source=names_source,
        imgsz_source=imgsz_source,
        conf_thres=conf,
        opsets={o.domain: int(o.version) for o in model.opset_import},
        node_domains=tuple(sorted({n.domain for n in graph.node})),
        ir_version=int(model.ir_version),
        ops=tuple(sorted({(n.domain, n.op_type) for n in graph.node})),
        qdq=_qdq_forms(graph),
    )


def _with_fixed_side(p: Path, name: str, ishape: Tuple[Optional[int], ...], imgsz: Tuple[int, int],
                     source: str) -> Tuple[int, int]:
    """``imgsz`` for an input with one side fixed and the other symbolic (``[B,3,384,'width']``): the
    fixed side is the graph's. An assumed size (``default``) takes it; a size that was asked for or
    stated and differs is an error (ONNX Runtime refused every frame of it, at the first one)."""
    fixed = [(i, "height" if i == 0 else "width", ishape[2 + i]) for i in (0, 1) if ishape[2 + i] is not None]
    out = list(imgsz)
    for i, side, size in fixed:
        if size == out[i]:
            continue
        if source != "default":
            asked = "was asked for" if source == "override" else f"is stated ({source})"
            raise ModelError(f"{p}: input size {imgsz[0]}x{imgsz[1]} {asked} but input {name!r} "
                             f"{_shape_str(ishape)} has its {side} fixed at {size}; give a size with that {side}")
        out[i] = int(size or 0)
    return (out[0], out[1])


def _qdq_forms(graph: Any) -> Tuple[Tuple[str, str, bool], ...]:
    """``ModelInfo.qdq``: what TensorRT's explicit quantization is judged by
    (``edgewise.runtime.opsets.tensorrt_problems``)."""
    consts = {t.name: t for t in graph.initializer}
    forms = set()
    for n in graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or n.domain not in ("", "ai.onnx"):
            continue
        given = len(n.input) > 2 and bool(n.input[2])
        zp = consts.get(n.input[2]) if given else None
        if zp is not None:
            nonzero = any(zp.int32_data) or any(zp.raw_data)
            forms.add((n.op_type, INTEGER_TYPES.get(zp.data_type, str(zp.data_type)), bool(nonzero)))
        elif given:  # a zero point computed or from a Constant node (torch exports): not read here
            forms.add((n.op_type, "?", False))
        elif n.op_type == "QuantizeLinear":
            forms.add((n.op_type, "uint8", False))
        else:
            x = consts.get(n.input[0]) if n.input else None
            forms.add((n.op_type, INTEGER_TYPES.get(x.data_type, str(x.data_type)) if x is not None else "?", False))
    return tuple(sorted(forms))


#: head strides of YOLOv5 P5 models (P6 models add 64)
P5_STRIDES = (8, 16, 32)
P6_STRIDES = (8, 16, 32, 64)
#: the strides a YOLOv5 head can have; a head detects on two or more consecutive ones starting at
#: 4, 8 or 16 (yolov5-p2 4-32, P5 8-32, P6 8-64, yolov5-p7 8-128, yolov5-p34 8-16, yolov3-tiny
#: 16-32): its rows are a whole number of anchors (at most :data:`MAX_ANCHORS_PER_CELL`) per grid
#: cell of one of these runs
_ALL_STRIDES = (4, 8, 16, 32, 64, 128)
HEAD_STRIDES = tuple(_ALL_STRIDES[i:j] for i in range(3) for j in range(i + 2, len(_ALL_STRIDES) + 1))
MAX_ANCHORS_PER_CELL = 4  # YOLOv5 has 3; one more for custom anchors, no more (max_det would pass)
#: anchors per grid cell of every YOLOv5 model
ANCHORS_PER_CELL = 3


def _shape_str(shape: Sequence[Optional[int]]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def grid_cells(h: int, w: int, strides: Sequence[int]) -> int:
    """Grid cells of a head at input ``h x w`` (YOLOv5 pads to the stride: ceil)."""
    return sum(-(-h // s) * -(-w // s) for s in strides)


def yolov5_rows(h: int, w: int) -> Tuple[int, int]:
    """Head rows ``N`` of a YOLOv5 P5 and P6 model at input ``h x w`` (25,200 and 25,500 at 640)."""
    return (ANCHORS_PER_CELL * grid_cells(h, w, P5_STRIDES), ANCHORS_PER_CELL * grid_cells(h, w, P6_STRIDES))


def head_problem(rows: int, cols: int, hw: Tuple[int, int], names_known: bool) -> str:
    """Why an output of ``rows x cols`` at input ``hw`` is not a YOLOv5 head ("" when it may be one).

    Only told apart where no real YOLOv5 head is refused: ``[B,4+nc,N]`` (fewer rows than
    columns) and ``[B,N,4+nc]`` with one row per grid cell are YOLOv8's anchor-free layouts; without
    class names (nothing else vouches for the layout) the row count must be YOLOv5's
    ``3 * sum((H/s) * (W/s))`` over strides 8, 16, 32 (and 64 for P6 models).
    """
    h, w = hw
    p5, p6 = yolov5_rows(h, w)
    if rows in (p5, p6):
        return ""
    if rows < cols:
        return (f"{cols} columns by {rows} rows is YOLOv8's transposed [B,4+nc,N] layout: "
                "YOLOv8 anchor-free output is not supported; export YOLOv5")
    if names_known:  # the columns agree with the names: trust custom anchors and heads, not any count
        if any(rows % grid_cells(h, w, strides) == 0 and rows // grid_cells(h, w, strides) <= MAX_ANCHORS_PER_CELL
               for strides in HEAD_STRIDES):
            return ""
        return (f"{rows} rows is no YOLOv5 head's anchors x grid cells at {h}x{w} ({p5} for P5 models with 3 "
                f"anchors, {p6} for P6; strides 4 to 128): an output after NMS ([B,max_det,6]: boxes, score, class id)? a one-class "
                "model would then decode to nothing; export the raw YOLOv5 head (no --nms, no end-to-end export)")
    if rows in (grid_cells(h, w, P5_STRIDES), grid_cells(h, w, P6_STRIDES)):
        return (f"{rows} rows is one per grid cell at {h}x{w}, YOLOv8's anchor-free [B,N,4+nc] layout: "
                "YOLOv8 anchor-free output is not supported; export YOLOv5")
    return (f"{rows} rows is not a YOLOv5 head's 3 x grid cells at {h}x{w} ({p5}, or {p6} for P6 "
            f"models): not a YOLOv5 head (an output after NMS, [B,max_det,6]?); export the raw YOLOv5 "
            "head, or state the class names in the metadata if it is one")


def _one_row_per_cell(rows: Optional[int], ishape: Optional[Sequence[Optional[int]]]) -> bool:
    """``rows`` is one per grid cell (YOLOv8's anchor-free head) for the input ``ishape``."""
    if rows is None or ishape is None or len(ishape) != 4 or ishape[2] is None or ishape[3] is None:
        return False
    h, w = int(ishape[2]), int(ishape[3])
    return rows in (grid_cells(h, w, P5_STRIDES), grid_cells(h, w, P6_STRIDES))


def transposed_yolov5(nc: int) -> str:
    """Why an output ``[B,5+nc,N]`` is refused: a YOLOv5 head transposed, whose columns are not
    the class names' fault (its rows are 5 + nc)."""
    return (f"its rows are 5 + {nc} class names = {5 + nc}, so it is a YOLOv5 head transposed ([B,5+nc,N]); "
            "export the head as [B,N,5+nc], as YOLOv5's export.py does (or drop the final Transpose/Permute)")


def _exact_yolov5_head(oshape: Sequence[Optional[int]], ishape: Sequence[Optional[int]],
                       names: Optional[Sequence[str]]) -> bool:
    """The output is a YOLOv5 head beyond doubt: a fixed input size, YOLOv5's exact row count for
    it and 5 + the class names' columns. Such a head may have more columns than rows (365 classes
    at 64x64: ``[1,252,370]``), which is no YOLOv8 ``[B,4+nc,N]``: that one's rows are 4 + nc."""
    rows, cols = oshape[1], oshape[2]
    if names is None or cols != 5 + len(names) or len(ishape) != 4 or ishape[2] is None or ishape[3] is None:
        return False
    return rows in yolov5_rows(int(ishape[2]), int(ishape[3]))


def _check_head_layout(p: Path, out_name: str, oshape: Tuple[Optional[int], ...],
                       ishape: Optional[Tuple[Optional[int], ...]], names_known: bool) -> None:
    """Refuse outputs that are not a YOLOv5 head where the static shapes tell (``head_problem``)."""
    rows, cols = oshape[1], oshape[2]
    if rows is None or cols is None:
        return
    if ishape is None:  # input size unknown: only the transposed layout is plain to see
        if rows < cols:
            raise ModelError(f"{p}: output {out_name!r} {_shape_str(oshape)}: {cols} columns by {rows} rows is "
                             "YOLOv8's transposed [B,4+nc,N] layout: YOLOv8 anchor-free output is not "
                             "supported; export YOLOv5")
        return
    why = head_problem(rows, cols, (int(ishape[2] or 0), int(ishape[3] or 0)), names_known)
    if why:
        raise ModelError(f"{p}: output {out_name!r} {_shape_str(oshape)}: {why}")


#: box centres all within this of 0 at an input of 64 px or more: normalized, not pixels (a
#: YOLOv5 head's centres cover its grid whatever the frame shows; found by a probe)
NORMALIZED_REACH = 2.0
#: how far a score may stray outside [0, 1] (rounding of float16 / int8 outputs)
SCORE_TOLERANCE = 0.01


def check_output(info: ModelInfo, batch_shape: Sequence[int], raw: Any) -> None:
    """Check the first real output of ``info``'s model against what its load promised.

    ``raw`` is the ``[B,N,5+nc]`` numpy output for an input of ``batch_shape``; raises a
    one-line ``ModelError`` naming the file when the columns disagree with the class names
    (a symbolic output width is only known now), when the rows are not a YOLOv5 head's
    for this input size (``head_problem``), or when the scores are not probabilities.
    """
    import numpy as np

    p = info.path
    shape = tuple(int(d) for d in getattr(raw, "shape", ()))
    if len(shape) != 3:
        raise ModelError(f"{p}: the model's output is {list(shape)}, not a YOLOv5 head [B,N,5+nc]; export YOLOv5")
    if batch_shape and shape[0] != int(batch_shape[0]):
        raise ModelError(f"{p}: the model's output {list(shape)} holds {shape[0]} image(s) for an input batch of "
                         f"{int(batch_shape[0])} (its batch size is fixed inside the graph)")
    rows, cols = shape[1], shape[2]
    if cols != 5 + info.nc:
        if cols == 4 + info.nc and _one_row_per_cell(rows, tuple(batch_shape)):
            hint = " (4 + nc, one row per grid cell: a YOLOv8 anchor-free output is not supported; export YOLOv5)"
        elif rows == 4 + info.nc and _one_row_per_cell(cols, tuple(batch_shape)):
            # a dynamic YOLOv8 export: its [B,4+nc,N] shape is symbolic, so only the run shows it
            raise ModelError(f"{p}: the model's output {list(shape)} is YOLOv8's transposed [B,4+nc,N] layout "
                             f"(4 + {info.nc} class names = {rows} rows, one column per grid cell): YOLOv8 "
                             "anchor-free output is not supported; export YOLOv5")
        elif rows == 5 + info.nc:  # a symbolic [B,5+nc,N]: only the run shows it
            raise ModelError(f"{p}: the model's output {list(shape)}: {transposed_yolov5(info.nc)}")
        else:
            hint = "; fix the names metadata or re-export the model"
        raise ModelError(f"{p}: the model's output has {cols} columns but there are {info.nc} class names "
                         f"({info.names_source}), so 5 + nc = {5 + info.nc} was expected{hint}")
    if len(batch_shape) == 4 and rows:
        why = head_problem(rows, cols, (int(batch_shape[2]), int(batch_shape[3])),
                           info.names_source != "default")
        if why:
            raise ModelError(f"{p}: the model's output {list(shape)}: {why}")
    if raw.size:
        bad = int(np.count_nonzero(~np.isfinite(raw)))
        if bad:
            raise ModelError(f"{p}: the model's output holds {bad} NaN or infinite values (of {raw.size}) on a "
                             "frame it was shown: broken weights, or a float16 export whose activations "
                             "overflow; re-export the model (float32, or check its weights)")
        if rows >= 64 and len(batch_shape) == 4 and min(int(batch_shape[2]), int(batch_shape[3])) >= 64:
            # a head's box centres span its grid, in input pixels, whatever the frame shows
            reach = float(np.abs(raw[..., :2]).max())
            if reach <= NORMALIZED_REACH:
                raise ModelError(f"{p}: every box centre of the model's output is within {reach:.2f} of 0 at a "
                                 f"{int(batch_shape[2])}x{int(batch_shape[3])} input: boxes in normalized [0, 1] "
                                 "coordinates? YOLOv5's head gives them in input pixels; export the raw YOLOv5 head")
        scores = raw[..., 4:]
        lo, hi = float(scores.min()), float(scores.max())
        if lo < -SCORE_TOLERANCE or hi > 1 + SCORE_TOLERANCE:
            raise ModelError(f"{p}: objectness/class scores range over [{lo:.3g}, {hi:.3g}]: outputs are not sigmoid "
                             "probabilities (logits, or an output after NMS?); export the YOLOv5 head with its "
                             "Detect layer's sigmoid (export.py does)")


def imgsz_guess_warning(info: ModelInfo) -> str:
    """The one-line warning for a model whose input size is assumed, not stated."""
    h, w = info.imgsz
    return (
        f"{info.path}: the model does not state its input size (dynamic height/width and no "
        f"imgsz metadata, as YOLOv5 v7.0 --dynamic exports); assuming {h}x{w}. Give the size "
        "it was exported for: --imgsz (model info/quantize, cloud worker), --edge-imgsz / "
        "--cloud-imgsz (eval) or the imgsz setting (edge model.imgsz, worker imgsz)"
    )


def _mostly_fp16(graph: Any) -> bool:
    counts: List[int] = [0, 0]
    for t in graph.initializer:
        if t.data_type == FLOAT16:
            counts[0] += 1
        elif t.data_type == FLOAT:
            counts[1] += 1
    return counts[0] > counts[1]


def names_to_metadata(names: Sequence[str]) -> str:
    """``names`` as Ultralytics writes them into ONNX metadata (dict literal)."""
    return repr({i: n for i, n in enumerate(names)})
