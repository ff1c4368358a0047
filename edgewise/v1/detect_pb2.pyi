from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    OK: _ClassVar[Status]
    INVALID_ARGUMENT: _ClassVar[Status]
    RESOURCE_EXHAUSTED: _ClassVar[Status]
    UNAVAILABLE: _ClassVar[Status]
    DEADLINE_EXCEEDED: _ClassVar[Status]
    UNAUTHENTICATED: _ClassVar[Status]
    INTERNAL: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
OK: Status
INVALID_ARGUMENT: Status
RESOURCE_EXHAUSTED: Status
UNAVAILABLE: Status
DEADLINE_EXCEEDED: Status
UNAUTHENTICATED: Status
INTERNAL: Status

class Image(_message.Message):
    __slots__ = ("encoding", "data", "shape", "dtype", "offset_x", "offset_y", "source_width", "source_height", "tiles")
    class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ENCODING_UNSPECIFIED: _ClassVar[Image.Encoding]
        JPEG: _ClassVar[Image.Encoding]
        PNG: _ClassVar[Image.Encoding]
        RAW: _ClassVar[Image.Encoding]
    ENCODING_UNSPECIFIED: Image.Encoding
    JPEG: Image.Encoding
    PNG: Image.Encoding
    RAW: Image.Encoding
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_X_FIELD_NUMBER: _ClassVar[int]
    OFFSET_Y_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    TILES_FIELD_NUMBER: _ClassVar[int]
    encoding: Image.Encoding
    data: bytes
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    offset_x: int
    offset_y: int
    source_width: int
    source_height: int
    tiles: _containers.RepeatedCompositeFieldContainer[Tile]
    def __init__(self, encoding: _Optional[_Union[Image.Encoding, str]] = ..., data: _Optional[bytes] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., offset_x: _Optional[int] = ..., offset_y: _Optional[int] = ..., source_width: _Optional[int] = ..., source_height: _Optional[int] = ..., tiles: _Optional[_Iterable[_Union[Tile, _Mapping]]] = ...) -> None: ...

class Tile(_message.Message):
    __slots__ = ("x", "y", "width", "height", "source_x", "source_y", "scale")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_X_FIELD_NUMBER: _ClassVar[int]
    SOURCE_Y_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    width: int
    height: int
    source_x: int
    source_y: int
    scale: float
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., source_x: _Optional[int] = ..., source_y: _Optional[int] = ..., scale: _Optional[float] = ...) -> None: ...

class Detection(_message.Message):
    __slots__ = ("x1", "y1", "x2", "y2", "score", "class_id", "class_name", "class_scores", "source")
    X1_FIELD_NUMBER: _ClassVar[int]
    Y1_FIELD_NUMBER: _ClassVar[int]
    X2_FIELD_NUMBER: _ClassVar[int]
    Y2_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CLASS_ID_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    CLASS_SCORES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    x1: float
    y1: float
    x2: float
    y2: float
    score: float
    class_id: int
    class_name: str
    class_scores: _containers.RepeatedScalarFieldContainer[float]
    source: str
    def __init__(self, x1: _Optional[float] = ..., y1: _Optional[float] = ..., x2: _Optional[float] = ..., y2: _Optional[float] = ..., score: _Optional[float] = ..., class_id: _Optional[int] = ..., class_name: _Optional[str] = ..., class_scores: _Optional[_Iterable[float]] = ..., source: _Optional[str] = ...) -> None: ...

class Hardness(_message.Message):
    __slots__ = ("score", "signals")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    score: float
    signals: _containers.ScalarMap[str, float]
    def __init__(self, score: _Optional[float] = ..., signals: _Optional[_Mapping[str, float]] = ...) -> None: ...

class DetectRequest(_message.Message):
    __slots__ = ("device_id", "stream_id", "frame_seq", "capture_time_unix_ns", "deadline_unix_ns", "priority", "trace_id", "image", "edge_detections", "hardness", "reason", "replay")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_SEQ_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    EDGE_DETECTIONS_FIELD_NUMBER: _ClassVar[int]
    HARDNESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    stream_id: str
    frame_seq: int
    capture_time_unix_ns: int
    deadline_unix_ns: int
    priority: int
    trace_id: str
    image: Image
    edge_detections: _containers.RepeatedCompositeFieldContainer[Detection]
    hardness: Hardness
    reason: str
    replay: bool
    def __init__(self, device_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., frame_seq: _Optional[int] = ..., capture_time_unix_ns: _Optional[int] = ..., deadline_unix_ns: _Optional[int] = ..., priority: _Optional[int] = ..., trace_id: _Optional[str] = ..., image: _Optional[_Union[Image, _Mapping]] = ..., edge_detections: _Optional[_Iterable[_Union[Detection, _Mapping]]] = ..., hardness: _Optional[_Union[Hardness, _Mapping]] = ..., reason: _Optional[str] = ..., replay: bool = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ms", "compute_ms", "gateway_ms", "batch_size")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    compute_ms: float
    gateway_ms: float
    batch_size: int
    def __init__(self, queue_ms: _Optional[float] = ..., compute_ms: _Optional[float] = ..., gateway_ms: _Optional[float] = ..., batch_size: _Optional[int] = ...) -> None: ...

class DetectResponse(_message.Message):
    __slots__ = ("status", "error", "device_id", "stream_id", "frame_seq", "trace_id", "detections", "model_name", "model_version", "worker_id", "timing")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    DETECTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    status: Status
    error: str
    device_id: str
    stream_id: str
    frame_seq: int
    trace_id: str
    detections: _containers.RepeatedCompositeFieldContainer[Detection]
    model_name: str
    model_version: str
    worker_id: str
    timing: Timing
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., error: _Optional[str] = ..., device_id: _Optional[str] = ..., stream_id: _Optional[str] = ..., frame_seq: _Optional[int] = ..., trace_id: _Optional[str] = ..., detections: _Optional[_Iterable[_Union[Detection, _Mapping]]] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., worker_id: _Optional[str] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("worker_id", "in_flight", "queue_depth", "capacity", "max_batch_size", "max_queue_size", "model_name", "model_version", "serving", "peak_capacity", "pixel_rate", "devices_in_turn")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    PEAK_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PIXEL_RATE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_IN_TURN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    in_flight: int
    queue_depth: int
    capacity: float
    max_batch_size: int
    max_queue_size: int
    model_name: str
    model_version: str
    serving: bool
    peak_capacity: float
    pixel_rate: float
    devices_in_turn: bool
    def __init__(self, worker_id: _Optional[str] = ..., in_flight: _Optional[int] = ..., queue_depth: _Optional[int] = ..., capacity: _Optional[float] = ..., max_batch_size: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., serving: bool = ..., peak_capacity: _Optional[float] = ..., pixel_rate: _Optional[float] = ..., devices_in_turn: bool = ...) -> None: ...
