"""The escalation policy schema (``apiVersion: edgewise/v1``, ``kind: EscalationPolicy``).

Frozen dataclasses, so a loaded :class:`Policy` is an immutable value that can be
swapped atomically between frames. Each field's YAML key, allowed values and
description live in its metadata (:func:`edgewise.policy.fields.opt`);
:func:`describe_schema` turns them into reference rows.

Precedence of overrides: per-stream > per-class > global (``Policy.threshold_for``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from edgewise.carrying import SCOPES as CARRY_SCOPES
from edgewise.carrying import CarryConfig
from edgewise.detections import Detections
from edgewise.fieldrules import POLICY_KIND, class_name_form
from edgewise.hardness.carrystate import CARRY_MOTION
from edgewise.hardness.learned import GainModel
from edgewise.hardness.motion import MOTION_SIGNALS, MotionConfig
from edgewise.hardness.signals import COMBINE_MODES, SIGNAL_NAMES, SignalConfig
from edgewise.merging import STRATEGIES, carried_boxes, merge
from edgewise.policy.budget import MAX_WINDOW_FRAMES, elapsed
from edgewise.policy.fields import FieldSpec, field_default, opt
from edgewise.regions import (
    MAX_TILES,
    MODES,
    PayloadPlan,
    plan_payload,
    propose_regions,
    regions_most,
)

API_VERSION = "edgewise/v1"
KIND = POLICY_KIND
TRANSPORTS = ("grpc", "mqtt")
PAYLOAD_MODES = MODES
UNAVAILABLE_ACTIONS = ("spool", "edge_only", "drop")
MERGE_STRATEGIES = STRATEGIES  # edgewise.merging's
STREAM_MODES = ("auto", "always", "never")
PRIORITIES = ("hardest", "fifo")

#: Default signal weights: the cheap signals the literature found most informative
#: (uncertain boxes, missed objects, tracker disagreement) count fully, the
#: weakest (mean confidence) least (docs/design/escalation.md#default-weights).
DEFAULT_WEIGHTS: Dict[str, float] = {
    "uncertain_count": 1.0,
    "missed_object": 1.0,
    "tracker_disagreement": 0.8,
    "entropy": 0.6,
    "margin": 0.6,
    "small_boxes": 0.4,
    "mean_conf": 0.3,
}


def _default_weights() -> Dict[str, float]:
    return dict(DEFAULT_WEIGHTS)


@dataclass(frozen=True)
class Band:
    """Uncertainty band on a box score: scores in [low, high] count as uncertain."""

    low: float = opt("low", "float", "Lowest box score inside the band.", 0.25, required=True, lo=0, hi=1)
    high: float = opt("high", "float", "Highest box score inside the band.", 0.6, required=True, lo=0, hi=1)


@dataclass(frozen=True)
class Metadata:
    """Identity of the policy."""

    name: str = opt("name", "str", "Name of the policy, shown in logs, metrics and explain.", "", required=True)
    description: str = opt("description", "str", "Free text for operators.", "")


@dataclass(frozen=True)
class Motion:
    """The motion signals' background subtractor (``edgewise.hardness.motion``)."""

    width: int = opt("width", "int", "Width in pixels of the grey copy the background subtractor runs on.", 160,
                     lo=16, hi=1920)
    history: int = opt("history", "int", "Frames of the background model (MOG2 history).", 100, lo=1, hi=100000)
    var_threshold: float = opt(
        "varThreshold", "float", "Squared distance (in standard deviations) above which a pixel is foreground.",
        25.0, lo=1, hi=1000,
    )
    warmup_frames: int = opt("warmupFrames", "int", "Frames of a stream before the motion signals count.", 5,
                             lo=0, hi=100000)
    explain_margin: float = opt(
        "explainMargin", "float", "A detection explains a blob within this fraction of the frame width.", 0.01,
        lo=0, hi=1,
    )
    small_blob: float = opt("smallBlob", "float", "Largest blob, as a share of the frame, counted by motion_blobs.",
                            0.002, lo=0, hi=1, lo_open=True)
    area_saturation: float = opt(
        "areaSaturation", "float", "Unexplained foreground share of the frame at which motion reaches 1.", 0.01,
        lo=0, hi=1, lo_open=True,
    )
    blob_saturation: int = opt("blobSaturation", "int", "Small unexplained blobs at which motion_blobs reaches 1.",
                               8, lo=1, hi=10000)

    def config(self) -> MotionConfig:
        return MotionConfig(width=self.width, history=self.history, var_threshold=self.var_threshold,
                            warmup_frames=self.warmup_frames, explain_margin=self.explain_margin,
                            small_blob=self.small_blob, area_saturation=self.area_saturation,
                            blob_saturation=self.blob_saturation)


@dataclass(frozen=True)
class Signals:
    """Which hardness signals count, their weights, and their parameters."""

    combine: str = opt(
        "combine", "str",
        "How weighted signals become one hardness: max = max(w*s) (one strong signal suffices); "
        "mean = sum(w*s)/sum(w).",
        "max", choices=COMBINE_MODES,
    )
    weights: Mapping[str, float] = opt(
        "weights", "weights",
        "Weight in [0, 1] of each signal; signals not listed (or weight 0) are ignored. "
        "At least one weight must be > 0.",
        factory=_default_weights, keys=SIGNAL_NAMES,
    )
    uncertain_saturation: int = opt(
        "uncertainSaturation", "int",
        "Number of boxes inside the band at which uncertain_count reaches 1.", 3, lo=1, hi=1000,
    )
    small_area: float = opt(
        "smallArea", "float",
        "A box is small below this fraction of the frame area (DDS uses 0.04).", 0.01,
        lo=0, hi=1, lo_open=True,
    )
    track_iou: float = opt(
        "trackIou", "float", "IoU that matches a detection to a track (tracker_disagreement).", 0.3,
        lo=0, hi=1, lo_open=True,
    )
    track_min_hits: int = opt(
        "trackMinHits", "int", "Frames a track must be matched before its vanishing counts.", 2,
        lo=1, hi=100,
    )
    track_max_age: int = opt(
        "trackMaxAge", "int", "Frames an unmatched track is kept before it is dropped.", 2,
        lo=0, hi=100,
    )
    learned_model: str = opt(
        "learnedModel", "str",
        "Gain model file written by `edgewise eval --train-data` (a path relative to this policy "
        "file). When set, hardness is the percentile of the frame's predicted F1 gain among the "
        "model's training frames (threshold 0.85 = its top 15%) and weights/combine are unused. "
        "The file is read when the policy is (re)loaded.",
        "",
    )
    motion: Motion = opt(
        "motion", "section",
        "Background subtraction behind the motion and motion_blobs signals and the motion regions of a "
        "regions payload; it runs only when one of them is used.",
        Motion(), cls=Motion,
    )


@dataclass(frozen=True)
class ClassOverride:
    """Per-class override; applies to frames containing a box of that class name."""

    threshold: Optional[float] = opt(
        "threshold", "float", "Hardness threshold for frames containing this class.", None,
        lo=0, hi=1, nullable=True, null_means="inherit",
    )
    band: Optional[Band] = opt(
        "band", "section", "Uncertainty band for boxes of this class.", None, cls=Band,
        nullable=True, null_means="inherit",
    )


@dataclass(frozen=True)
class StreamOverride:
    """Per-stream override; wins over per-class and global settings."""

    mode: str = opt(
        "mode", "str",
        "auto = decide by hardness; always = escalate every frame (budget still applies); "
        "never = keep this stream on the edge.",
        "auto", choices=STREAM_MODES,
    )
    threshold: Optional[float] = opt(
        "threshold", "float", "Hardness threshold for this stream (wins over class thresholds).",
        None, lo=0, hi=1, nullable=True, null_means="inherit",
    )
    band: Optional[Band] = opt(
        "band", "section", "Uncertainty band for every box of this stream.", None, cls=Band,
        nullable=True, null_means="inherit",
    )
    cooldown_seconds: Optional[float] = opt(
        "cooldownSeconds", "float", "Cooldown of this stream.", None, lo=0, hi=86400,
        nullable=True, null_means="inherit",
    )
    max_per_second: Optional[float] = opt(
        "maxPerSecond", "float", "Token-bucket rate of this stream.", None, lo=0, lo_open=True,
        hi=1000, nullable=True, null_means="inherit",
    )
    burst: Optional[int] = opt(
        "burst", "int", "Token-bucket capacity of this stream.", None, lo=1, hi=10000,
        nullable=True, null_means="inherit",
    )
    max_fraction: Optional[float] = opt(
        "maxFraction", "float", "Max fraction of frames of this stream.", None, lo=0, hi=1,
        nullable=True, null_means="inherit",
    )


@dataclass(frozen=True)
class Budget:
    """Escalation budget, enforced per stream; see ``edgewise.policy.budget``."""

    max_fraction: float = opt(
        "maxFraction", "float",
        "At most this fraction of any windowFrames consecutive frames of a stream is escalated.",
        0.2, lo=0, hi=1,
    )
    window_frames: int = opt(
        "windowFrames", "int", "Sliding window (frames) of maxFraction and of the priority ranking.",
        300, lo=1, hi=MAX_WINDOW_FRAMES,
    )
    max_per_second: Optional[float] = opt(
        "maxPerSecond", "float", "Token-bucket refill rate: escalations per second per stream.",
        2.0, lo=0, lo_open=True, hi=1000, nullable=True, null_means="no rate limit",
    )
    burst: int = opt(
        "burst", "int", "Token-bucket capacity: escalations allowed back to back.", 4, lo=1, hi=10000,
    )
    priority: str = opt(
        "priority", "str",
        "hardest = when candidates outnumber the budget, admit only frames in the recent top-k "
        "by hardness; fifo = admit in arrival order while tokens last.",
        "hardest", choices=PRIORITIES,
    )


@dataclass(frozen=True)
class Payload:
    """What an escalation sends (``edgewise.regions``)."""

    jpeg_quality: int = opt("jpegQuality", "int", "JPEG quality of the sent image.", 85, lo=1, hi=100)
    mode: str = opt(
        "mode", "str",
        "full = the whole frame at full resolution; crops = one padded crop around the uncertain boxes; "
        "downscaled = the whole frame scaled to downscaleWidth; regions = full-resolution regions around "
        "the uncertain boxes and the motion no detection explains, merged and padded, packed into one "
        "image (DDS-style; without any region, the whole frame); low+regions = the frame scaled to "
        "downscaleWidth plus those regions, in one image.",
        "full", choices=PAYLOAD_MODES,
    )
    crop_padding: float = opt(
        "cropPadding", "float", "Padding added around each crop or region, as a fraction of the box size.",
        0.2, lo=0, hi=2,
    )
    downscale_width: int = opt(
        "downscaleWidth", "int", "Width of the frame in downscaled and low+regions payloads (never enlarged: "
        "a frame no wider goes whole).",
        640, lo=32, hi=8192,
    )
    region_min: int = opt(
        "regionMin", "int", "Smallest region side in pixels: a small box is sent with this much context.", 96,
        lo=8, hi=8192,
    )
    max_regions: int = opt("maxRegions", "int", "Most regions per escalation (the most uncertain first); "
                           f"low+regions packs at most {MAX_TILES - 1}, for its image holds at most {MAX_TILES} "
                           "parts.", 8, lo=1, hi=MAX_TILES)
    max_region_area: float = opt(
        "maxRegionArea", "float",
        "Most of the frame the regions may cover together; beyond it the whole frame is sent.", 0.4,
        lo=0, hi=1, lo_open=True,
    )

    whole_frame_every_s: float = opt(
        "wholeFrameEverySeconds", "float",
        "With a partial payload (crops, downscaled, regions, low+regions): an escalation of a stream whose last "
        "whole frame was sent this many seconds ago or more (or never) sends the whole frame at full "
        "resolution instead. It finds what no region points at (far objects that do not move), which "
        "merge.carryFrames then keeps, for at most one extra whole frame per stream per period; 0: never "
        "(docs/design/escalation.md#whole-frame-refresh).", 0.0, lo=0, hi=86400,
    )

    @property
    def refreshes(self) -> bool:
        """Whether the whole-frame refresh is on: a partial mode and a period > 0."""
        return self.mode != "full" and self.whole_frame_every_s > 0

    def whole_frame_due(self, last_whole_s: Optional[float], now_s: float) -> bool:
        """Whether an escalation at ``now_s`` (the stream's decision clock, seconds) sends the
        whole frame at full resolution instead of ``mode``: a partial mode, the refresh on,
        and the stream's last whole frame (``last_whole_s``; None: none yet) that long ago, or
        after ``now_s`` (a clock that went back belongs to a new run)."""
        if not self.refreshes:
            return False
        return last_whole_s is None or now_s < last_whole_s or elapsed(last_whole_s, now_s, self.whole_frame_every_s)

    def proposals(self, dets: Any, motion_blobs: Any, size: Tuple[int, int], band: Any) -> Optional[np.ndarray]:
        """The regions a ``regions`` payload of a frame of ``size`` (width, height) would send
        under these settings ([k, 4]; None: the whole frame would go), whatever this payload's
        mode: what the carry-state feature ``new_regions`` compares (:mod:`edgewise.hardness.carrystate`)."""
        rs = propose_regions(dets, motion_blobs, size, band, self.crop_padding, self.region_min,
                             regions_most("regions", self.max_regions), self.max_region_area)
        return None if rs is None else np.asarray(rs, np.float64).reshape(-1, 4)

    def plan(self, frame: Any, dets: Any, motion_blobs: Any, band: Any,
             mode: Optional[str] = None) -> PayloadPlan:
        """What an escalation of ``frame`` sends under these settings, in ``mode`` (default: this
        payload's; :func:`edgewise.regions.plan_payload`)."""
        return plan_payload(frame, dets, motion_blobs, mode or self.mode, band, self.crop_padding, self.region_min,
                            self.max_regions, self.max_region_area, self.downscale_width)


class WholeFrames:
    """Per stream, when its last escalation went as the whole frame, and the payload mode of
    the next one (:meth:`Payload.whole_frame_due`): the daemon, ``edgewise eval`` and the
    what-if replay each keep one, on their decision clock."""

    def __init__(self) -> None:
        self.last: Dict[Hashable, float] = {}

    def mode(self, payload: Payload, stream: Hashable, now_s: float) -> str:
        """The mode an escalation of ``stream`` at ``now_s`` sends under ``payload``: ``full``
        when the refresh is due (noted as the stream's last whole frame), else the payload's."""
        if payload.whole_frame_due(self.last.get(stream), now_s):
            self.last[stream] = now_s
            return "full"
        return payload.mode

    def forget(self, stream: Hashable) -> None:
        """A new daemon run of ``stream`` (a restart): it has sent no whole frame yet, so its
        first escalation under a refresh goes whole, as the restarted daemon's does."""
        self.last.pop(stream, None)

    def sent_whole(self, stream: Hashable, now_s: float) -> None:
        """A partial payload fell back to the whole frame at ``now_s``: it counts as a refresh."""
        self.last[stream] = max(now_s, self.last.get(stream, now_s))


@dataclass(frozen=True)
class Merge:
    """How cloud boxes combine with edge boxes (``edgewise.merging.merge``)."""

    strategy: str = opt(
        "strategy", "str",
        "replace = keep cloud boxes only; fuse = weighted box fusion of matched pairs.",
        "fuse", choices=MERGE_STRATEGIES,
    )
    iou: float = opt(
        "iou", "float", "IoU at which an edge and a cloud box of the same class are fused.", 0.55,
        lo=0, hi=1, lo_open=True,
    )
    edge_floor: float = opt(
        "edgeFloor", "float", "Unmatched edge boxes are kept only with a score >= this.", 0.5,
        lo=0, hi=1,
    )
    carry_frames: int = opt(
        "carryFrames", "int",
        "Frames after a cloud answer during which the edge tracks the cloud's boxes and keeps publishing "
        "them (0: off). It pays with a fixed camera and a cloud whose boxes are precise; with a noisy cloud "
        "it carries its false boxes (docs/design/escalation.md#carrying-the-clouds-answer).", 0, lo=0, hi=1000,
    )
    carry_match: float = opt(
        "carryMatch", "float",
        "Template match (normalised cross-correlation) below which a carried box is lost and dropped.", 0.5,
        lo=0, hi=1, lo_open=True,
    )
    carry_scope: str = opt(
        "carryScope", "str",
        "What a newer cloud answer replaces among the carried boxes: answer = all of them; regions = only "
        "those inside the regions a region payload sent, the older answers' boxes elsewhere stay carried "
        "until their own carryFrames run out (a whole-frame answer replaces all).", "answer",
        choices=CARRY_SCOPES,
    )
    carry_edge_floor: bool = opt(
        "carryEdgeFloor", "bool",
        "Between answers, drop the edge's boxes under edgeFloor that no carried box confirms, where an answer "
        "in force looked (its regions, or the whole frame): the cloud saw that place and found nothing, as "
        "edgeFloor rules on the escalated frame (docs/design/escalation.md#carrying-the-clouds-answer).", False,
    )

    def carry(self) -> CarryConfig:
        """The carrying these settings ask for (:mod:`edgewise.carrying`)."""
        return CarryConfig(frames=self.carry_frames, min_match=self.carry_match, scope=self.carry_scope,
                           edge_floor=self.edge_floor if self.carry_edge_floor else 0.0)

    def apply(self, edge: Detections, cloud: Detections, regions: Optional[np.ndarray] = None) -> Detections:
        """A frame's final boxes from the edge's and the cloud's answer under these settings; the
        one place the daemon, ``edgewise eval`` and ``check-policy --data`` merge.
        ``regions`` [M, 4] are the crops the cloud saw (None: the whole frame)."""
        return merge(edge, cloud, self.strategy, self.iou, edge_floor=self.edge_floor, regions=regions)

    def carried(self, edge: Detections, cloud: Detections, regions: Optional[np.ndarray] = None) -> Detections:
        """The cloud's boxes the edge carries into the stream's next frames under these settings
        (:func:`edgewise.merging.carried_boxes`); the one place the daemon and ``edgewise eval``
        take them from."""
        return carried_boxes(edge, cloud, self.strategy, self.iou, regions)


@dataclass(frozen=True)
class Spec:
    """The policy proper."""

    threshold: float = opt(
        "threshold", "float", "A frame is hard when its combined hardness is >= this.", 0.5, lo=0, hi=1,
    )
    band: Band = opt(
        "band", "section", "Global uncertainty band on box scores (uncertain_count).", Band(), cls=Band,
    )
    signals: Signals = opt("signals", "section", "Signals, weights and their parameters.", Signals(), cls=Signals)
    classes: Mapping[str, ClassOverride] = opt(
        "classes", "map", "Per-class overrides keyed by class name (taken in Unicode NFC, as the model's names are).",
        factory=dict, cls=ClassOverride, key_form=class_name_form,
    )
    streams: Mapping[str, StreamOverride] = opt(
        "streams", "map", "Per-stream overrides keyed by stream id.", factory=dict, cls=StreamOverride,
    )
    budget: Budget = opt("budget", "section", "Escalation budget per stream.", Budget(), cls=Budget)
    cooldown_seconds: float = opt(
        "cooldownSeconds", "float", "Minimum time between two escalations of a stream.", 0.0, lo=0, hi=86400,
    )
    audit_fraction: float = opt(
        "auditFraction", "float",
        "Fraction of otherwise easy frames escalated as random audits (chosen by hashing stream "
        "and frame number, so reproducible); budget still applies.",
        0.0, lo=0, hi=1,
    )
    transport: Optional[str] = opt(
        "transport", "str", "How escalations travel to the cloud.", None, choices=TRANSPORTS,
        nullable=True, null_means="the device's cloud.transport",
    )
    deadline_ms: int = opt(
        "deadlineMs", "int", "Deadline of one escalation round trip, milliseconds.", 500, lo=1, hi=600000,
    )
    payload: Payload = opt("payload", "section", "What an escalation sends.", Payload(), cls=Payload)
    on_cloud_unavailable: str = opt(
        "onCloudUnavailable", "str",
        "spool = queue on disk and replay when the cloud is back; edge_only = publish the edge "
        "result and forget the escalation; drop = publish nothing for the frame.",
        "spool", choices=UNAVAILABLE_ACTIONS,
    )
    merge: Merge = opt("merge", "section", "How cloud and edge boxes combine.", Merge(), cls=Merge)


@dataclass(frozen=True)
class Policy:
    """An escalation policy file."""

    api_version: str = opt("apiVersion", "str", "Schema version.", API_VERSION, required=True, choices=(API_VERSION,))
    kind: str = opt("kind", "str", "Document kind.", KIND, required=True, choices=(KIND,))
    metadata: Metadata = opt("metadata", "section", "Identity of the policy.", Metadata(), cls=Metadata, required=True)
    spec: Spec = opt("spec", "section", "The policy.", Spec(), cls=Spec, required=True)
    source: str = ""  # file it came from (not a YAML key)
    #: the loaded ``signals.learnedModel`` (not a YAML key)
    learned: Optional[GainModel] = field(default=None, compare=False, repr=False)

    # --- effective values (per-stream > per-class > global) -------------------

    def stream(self, stream_id: str) -> StreamOverride:
        """The stream's override (an all-inherit one when the stream is not listed)."""
        return self.spec.streams.get(stream_id, _NO_STREAM)

    def threshold_for(self, stream_id: str, class_names: Sequence[str] = ()) -> Tuple[float, str]:
        """(threshold, where it came from) for a frame of ``stream_id`` with these classes.

        A stream threshold wins. Otherwise each class present contributes its
        override (or the global threshold) and the lowest wins — the most
        sensitive class present decides. An empty frame uses the global one.
        """
        st = self.stream(stream_id)
        if st.threshold is not None:
            return st.threshold, f"stream {stream_id}"
        best: Optional[float] = None
        origin = "global"
        for name in class_names:
            co = self.spec.classes.get(name)
            if co is not None and co.threshold is not None:
                value, where = co.threshold, f"class {name}"
            else:
                value, where = self.spec.threshold, "global"
            if best is None or value < best:
                best, origin = value, where
        return (self.spec.threshold, "global") if best is None else (best, origin)

    def unknown_classes(self, names: Sequence[str]) -> List[str]:
        """The ``spec.classes`` keys that are not among a model's class ``names``: overrides that
        never apply with that model (a policy written for another model, a misspelt name)."""
        known = set(names)
        return sorted(k for k in self.spec.classes if k not in known)

    def unknown_classes_warning(self, names: Sequence[str], model: str) -> Optional[str]:
        """The one line the daemon logs (at start and each reload) and ``check-config`` prints
        when ``unknown_classes`` finds any, else None."""
        unknown = self.unknown_classes(names)
        if not unknown:
            return None
        return (f"policy {self.source or self.metadata.name}: spec.classes {', '.join(unknown)} are not classes of "
                f"{model} ({', '.join(names[:20])}{', ...' if len(names) > 20 else ''}): those overrides never "
                "apply; use the model's class names")

    def unknown_streams_warning(self, stream_ids: Sequence[str]) -> Optional[str]:
        """The line said when ``spec.streams`` names streams this device does not have, else None:
        a misspelt id (``Cam`` for ``cam``) leaves that stream on the policy's defaults, so a
        stream meant to be ``mode: never`` (a private area) was escalated, silently."""
        unknown = sorted(k for k in self.spec.streams if k not in set(stream_ids))
        if not unknown:
            return None
        return (f"policy {self.source or self.metadata.name}: spec.streams {', '.join(unknown)} "
                f"are not streams of this device ({', '.join(stream_ids[:20])}{', ...' if len(stream_ids) > 20 else ''}): those "
                "overrides apply to no stream here, its streams follow the policy's defaults; use the stream ids "
                "of the settings (a policy shared by several devices may name other devices' streams)")

    def fit_warnings(self, names: Sequence[str], model: str, stream_ids: Sequence[str]) -> List[str]:
        """What the daemon logs (at start and each reload) and ``check-config`` prints of a valid
        policy that names classes its model does not have or streams its device does not have."""
        return [w for w in (self.unknown_classes_warning(names, model), self.unknown_streams_warning(stream_ids)) if w]

    def cooldown_for(self, stream_id: str) -> float:
        """Cooldown seconds of a stream."""
        st = self.stream(stream_id)
        return st.cooldown_seconds if st.cooldown_seconds is not None else self.spec.cooldown_seconds

    def rate_for(self, stream_id: str) -> Tuple[Optional[float], int]:
        """(maxPerSecond or None for unlimited, burst) of a stream."""
        st = self.stream(stream_id)
        b = self.spec.budget
        rate = st.max_per_second if st.max_per_second is not None else b.max_per_second
        return rate, (st.burst if st.burst is not None else b.burst)

    def fraction_for(self, stream_id: str) -> float:
        """maxFraction of a stream."""
        st = self.stream(stream_id)
        return st.max_fraction if st.max_fraction is not None else self.spec.budget.max_fraction

    def uses_motion(self) -> bool:
        """Whether the motion detector must run: a motion weight counts, the learned model
        was fitted on a motion signal, or region payloads propose motion regions."""
        sig = self.spec.signals
        if self.learned is not None:
            weighted = any(n in self.learned.features for n in MOTION_SIGNALS + CARRY_MOTION)
        else:
            weighted = any(sig.weights.get(n, 0.0) > 0 for n in MOTION_SIGNALS)
        return weighted or self.spec.payload.mode in ("regions", "low+regions")

    def uses_carry(self) -> bool:
        """Whether the policy's gain model reads the carry-state features
        (:mod:`edgewise.hardness.carrystate`): the daemon then computes them before deciding."""
        return self.learned is not None and self.learned.uses_carry()

    def signal_config(
        self, stream_id: Optional[str] = None, frame_size: Optional[Tuple[int, int]] = None
    ) -> SignalConfig:
        """The :class:`SignalConfig` for a stream: stream band > class bands > global band."""
        sig = self.spec.signals
        band = self.spec.band
        class_bands: Dict[str, Tuple[float, float]] = {
            name: (co.band.low, co.band.high)
            for name, co in self.spec.classes.items()
            if co.band is not None
        }
        if stream_id is not None:
            st = self.stream(stream_id)
            if st.band is not None:
                band, class_bands = st.band, {}
        return SignalConfig(
            band_low=band.low,
            band_high=band.high,
            class_bands=class_bands,
            uncertain_saturation=sig.uncertain_saturation,
            small_area=sig.small_area,
            frame_size=frame_size,
            track_iou=sig.track_iou,
            track_min_hits=sig.track_min_hits,
            track_max_age=sig.track_max_age,
        )


_NO_STREAM = StreamOverride()


# --- schema reference -------------------------------------------------------

SchemaRow = Tuple[str, str, str, str, str]


def _type_name(spec: FieldSpec) -> str:
    return {
        "float": "number",
        "int": "integer",
        "str": "string",
        "bool": "boolean",
        "section": "mapping",
        "map": "mapping",
        "weights": "mapping",
    }[spec.kind]


def _default_text(value: Any, spec: FieldSpec) -> str:
    if spec.required:
        return "(required)"
    if spec.kind == "section":
        return "(section)" if value is not None else "null"
    if value is None:
        return "null"
    if spec.kind == "weights":
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if spec.kind == "map":
        return "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != "" else '""'  # an empty string would read as a missing cell


def describe_schema(cls: Any = Policy, prefix: str = "") -> List[SchemaRow]:
    """Reference rows (key path, type, default, allowed, description) of the whole schema.

    Map entries are written ``spec.classes.<name>.threshold``.
    """
    rows: List[SchemaRow] = []
    for f in fields(cls):
        spec = f.metadata.get("spec")
        if not isinstance(spec, FieldSpec):
            continue
        path = f"{prefix}{spec.key}"
        default = field_default(cls, f.name)
        rows.append((path, _type_name(spec), _default_text(default, spec), spec.allowed(), spec.doc))
        if spec.kind == "section":
            rows.extend(describe_schema(spec.cls, path + "."))
        elif spec.kind == "map":
            placeholder = "<name>" if spec.cls is ClassOverride else "<stream>"
            rows.extend(describe_schema(spec.cls, f"{path}.{placeholder}."))
    return rows


def schema_markdown() -> str:
    """The schema reference as a Markdown table (for the docs)."""
    out = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for row in describe_schema():
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(out) + "\n"
