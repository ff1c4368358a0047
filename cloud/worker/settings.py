"""Settings of one cloud worker process: the dataclasses, their cross-field rules, the flags.

Loaded by the shared mechanism of :mod:`edgewise.settings`: defaults < YAML file
(``--config``) < environment ``EDGEWISE_WORKER__KEY`` (nested keys joined by ``__``,
e.g. ``EDGEWISE_WORKER__BATCHING__MAX_BATCH_SIZE=4``) < ``--set`` < the named
flags below. Callers: ``cloud.worker.cli`` builds it; ``cloud.worker.server``
consumes it.
"""

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from cloud.binding import GRPC_INT_MAX
from cloud.worker.batching import BATCHING_MODES, BatchPolicy
from edgewise.imagefiles import DEFAULT_MAX_PIXELS
from edgewise.runtime.metadata import IMGSZ_SETTING_DOC, MAX_FIXED_BATCH, imgsz_problem
from edgewise.settings import Flag, Invalid, Schema, check, setting


@dataclass
class BatchingSettings:
    """Dynamic batcher knobs (Triton's names, docs/design/batching.md#knobs)."""

    max_batch_size: int = setting("Most images in one model call (the warm-up runs one batch this large: "
                                  "its input tensor must fit in memory; the chart allows as much).", 8, lo=1, hi=MAX_FIXED_BATCH)
    max_queue_delay_ms: float = setting("Longest a request waits for a fuller batch, milliseconds (0 = never "
                                        "wait).", 5.0, lo=0, hi=10_000)
    preferred_batch_sizes: tuple[int, ...] = setting("Batch sizes sent as soon as they can be formed (e.g. "
                                                     "TensorRT profiles); each at most `max_batch_size`.",
                                                     (), lo=1)
    max_queue_size: int = setting("Most requests waiting; the next one gets RESOURCE_EXHAUSTED at once, unless one "
                                  "ranked below it waits (a replay, for a live request): the newest of those gives "
                                  "way and gets it instead. At least `max_batch_size`: a batch is formed from the "
                                  "requests waiting.", 64,
                                  lo=1, hi=1_000_000)
    mode: str = setting(
        "Whether to batch: `auto` measures at warm-up (at least 3 rounds) whether a batch serves at least "
        "`min_gain` times the images/s of batch 1 and otherwise serves batch 1 without queue delay (CPU "
        "backends; the decision is logged and exported as `edgewise_worker_batching`); `on` batches as "
        "configured (GPU profiles); `off` always serves batch 1 without delay.", "auto",
        choices=BATCHING_MODES)
    min_gain: float = setting("`auto`: the throughput gain over batch 1 (images/s at the best measured batch "
                              "size / images/s at batch 1) that batching must reach to be used.", 1.5, lo=1)

    def policy(self) -> BatchPolicy:
        """The batcher core's policy (validates the ranges)."""
        return BatchPolicy(
            max_batch_size=self.max_batch_size,
            max_queue_delay_s=self.max_queue_delay_ms / 1e3,
            preferred_batch_sizes=tuple(self.preferred_batch_sizes),
            max_queue_size=self.max_queue_size,
        )


@dataclass
class WorkerSettings:
    """Everything one worker process needs; built by ``load_settings``."""

    model: str = setting("Path of the YOLOv5 ONNX model (required).", "")
    imgsz: str = setting(IMGSZ_SETTING_DOC, "0")
    host: str = setting("Address the gRPC server binds. The worker port has no authentication and no TLS: "
                        "only the gateway may reach it (the chart's NetworkPolicy admits gateway pods only); "
                        "bind an address the edge devices cannot reach.", "0.0.0.0")
    port: int = setting("gRPC port; 0 picks a free one (printed as `EDGEWISE_WORKER_LISTENING port=N`).", 50061,
                        lo=0, hi=65535)
    metrics_port: int = setting("Prometheus `/metrics` HTTP port; 0 picks a free one, -1 disables it.", 9101,
                                lo=-1, hi=65535)
    metrics_host: str = setting("Address the metrics server binds (`::`: every IPv6 and IPv4 address).", "0.0.0.0")
    worker_id: str = setting("Name reported in responses and load; default `<hostname>-<pid>`.", "")
    threads: int = setting("ONNX Runtime intra-op threads; 0 lets ONNX Runtime decide.", 0, lo=0, hi=1024)
    input_size: str = setting(
        "Input size of the model: `model` letterboxes every image to the model's size; `native` runs each "
        "image at its own scale (rounded up to the stride, never enlarged), which a model trained on "
        "full-resolution crops needs to see whole frames and region payloads; `auto` is `native` for a model "
        "that asks for it (symbolic height/width and the metadata `input_size: native`, like the camera "
        "pair's cloud model), else `model`.", "auto", choices=("auto", "model", "native"))
    native_max_side: int = setting(
        "With native input: an image whose longer side exceeds this is scaled down to it first (0 = never; "
        "else at least 64), bounding the cost of one request.", 1920, lo=0)
    decode_threads: int = setting("Threads decoding and letterboxing incoming images (off the event loop).", 2,
                                  lo=1)
    decode_pixel_budget: int = setting(
        "Most pixels (declared width x height, summed) being decoded at once; a decode that would exceed it "
        "waits in arrival order until its deadline, then RESOURCE_EXHAUSTED. One image larger than the budget "
        "decodes alone. Default: one 7680x4320 frame.", DEFAULT_MAX_PIXELS, lo=1)
    grace_s: float = setting("On SIGTERM (or SIGHUP: a worker reloads nothing): seconds to finish in-flight requests before exiting.", 10.0, lo=0)
    max_message_bytes: int = setting("Largest gRPC request accepted, bytes.", 8 * 1024 * 1024, lo=1024,
                                     hi=GRPC_INT_MAX)
    max_image_pixels: int = setting(
        "Largest image, width x height as its header declares, checked before decoding. Keep it at the "
        "gateway's `limits.max_image_pixels` (the chart passes that value here): the worker refuses what it "
        "does not allow, whatever the gateway admitted.", DEFAULT_MAX_PIXELS, lo=1)
    conf_threshold: Optional[float] = setting(
        "Lowest detection score returned; null: the model's own (ONNX metadata edgewise_conf_thres, chosen "
        "where the model was made), else 0.25.", None, lo=0, hi=1)
    iou_threshold: float = setting("NMS IoU threshold.", 0.45, lo=0, hi=1, lo_open=True)
    max_det: int = setting("Most detections returned per image.", 300, lo=1)
    warmup_rounds: int = setting("Dummy batches run at each batch size warmed before reporting SERVING (with "
                                 "`batching.mode: auto`, at least 3 unless 0).", 2, lo=0)
    batching: BatchingSettings = setting("Dynamic batcher knobs.", factory=BatchingSettings)

    def __post_init__(self) -> None:
        if not self.worker_id:
            self.worker_id = f"{socket.gethostname()}-{os.getpid()}"

    def validate(self) -> "WorkerSettings":
        """Check the ranges of the field metadata and the cross-field rules (for settings
        built in code); raises :class:`Invalid` naming the key."""
        check(self)
        check(self.batching, "batching")
        validate(self)
        return self


#: the smallest ``native_max_side`` other than 0: one cell of a P6 model's coarsest layer
NATIVE_MIN_SIDE = 64


def validate(s: WorkerSettings) -> None:
    """The rules that span fields; raises :class:`Invalid` naming the key."""
    if not s.model:
        raise Invalid("model", "a YOLOv5 ONNX file is required (--model or model: in the YAML)")
    bad = imgsz_problem(s.imgsz)
    if bad:
        raise Invalid("imgsz", bad)
    try:
        s.batching.policy()
    except ValueError as exc:
        raise Invalid("batching", str(exc)) from None
    b = s.batching
    if b.max_queue_size < b.max_batch_size:  # the chart's rule too (templates/validate.yaml)
        # A batch is taken from the queue: none grew past the queue's size, a full queue was held for
        # the delay waiting for company that could not come, and the gateway, which sends a worker up
        # to max batch + max queue, had the rest refused (16 of 90 requests with 8 and 1, measured).
        raise Invalid("batching.max_queue_size", f"{b.max_queue_size} is less than batching.max_batch_size "
                                                 f"{b.max_batch_size}: a batch is formed from the requests waiting, "
                                                 f"so none could exceed {b.max_queue_size}; give a queue of at least "
                                                 f"{b.max_batch_size}, or a smaller max_batch_size",
                      also=("batching.max_batch_size",))
    if s.port and s.port == s.metrics_port:
        raise Invalid("metrics_port", f"{s.metrics_port} is also the gRPC port; give each its own port",
                      also=("port",))
    if 0 < s.native_max_side < NATIVE_MIN_SIDE:  # every image shrunk to a few pixels: answers, all empty
        raise Invalid("native_max_side", f"{s.native_max_side} leaves nothing to detect; give 0 (never scale "
                                         f"down) or at least {NATIVE_MIN_SIDE} (the largest stride of YOLOv5 P6 "
                                         "models)")


SCHEMA: Schema[WorkerSettings] = Schema(
    "worker", WorkerSettings, command="edgewise cloud worker", validate=validate,
    flags=(
        Flag("--model", "model", metavar="FILE"),
        Flag("--imgsz", "imgsz", metavar="N|H,W"),
        Flag("--host", "host"),
        Flag("--port", "port"),
        Flag("--metrics-port", "metrics_port", metavar="PORT"),
        Flag("--worker-id", "worker_id", metavar="ID"),
        Flag("--threads", "threads", metavar="N"),
        Flag("--input-size", "input_size", metavar="auto|model|native"),
        Flag("--grace", "grace_s", metavar="SECONDS"),
        Flag("--max-message-bytes", "max_message_bytes", metavar="BYTES"),
        Flag("--max-image-pixels", "max_image_pixels", metavar="PIXELS"),
        Flag("--conf", "conf_threshold", metavar="SCORE"),
        Flag("--iou", "iou_threshold", metavar="IOU"),
        Flag("--max-batch", "batching.max_batch_size", metavar="N"),
        Flag("--max-delay-ms", "batching.max_queue_delay_ms", metavar="MS"),
        Flag("--preferred-batch", "batching.preferred_batch_sizes", metavar="N,N"),
        Flag("--queue-size", "batching.max_queue_size", metavar="N"),
        Flag("--batching", "batching.mode", metavar="auto|on|off"),
    ),
)


def load_settings(config: str | Path | None = None, overrides: Sequence[str] | Mapping[str, Any] = (),
                  env: Mapping[str, str] | None = None) -> WorkerSettings:
    """Validated settings: ``config`` YAML < ``env`` (default ``os.environ``) < ``overrides``
    (``key.path=value`` strings or a mapping such as ``{"batching.max_batch_size": 4}``)."""
    return SCHEMA.load(config, overrides, env)
