"""What-if replay: what a policy would have done on recorded traffic, and what it changes.

``edgewise edge check-policy FILE --replay RECORDS...`` decides every recorded
frame again with the policy's real decision core,
:meth:`~edgewise.policy.deciding.Escalator.decide_facts` (the code the daemon
runs), on the recorded inputs: the signals (recorded at the precision the daemon
decided on), the facts of the edge boxes (``edge_classes``, ``edge_boxes``,
``edge_max_score``) and the daemon's decision clock (``decided_s``). Each
stream's frames go through in the daemon's decision order
(:mod:`edgewise.policy.recorded`), and a daemon restart (a new ``frame_seq``
epoch) resets the stream's budget and whole-frame refresh as it did in the daemon. So replaying records
with the policy that decided them reproduces every decision, budget and cooldown
included (checked frame by frame whenever the records' ``policy_digest`` is the
replayed policy's: :func:`edgewise.policy.digest.policy_digest`), except the frames a
policy decided after a live reload from another version in the same daemon run: the
daemon's budget then came from the other version's decisions, which the records do not
hold, so those are compared and counted apart (:meth:`Side.check`).

Two *sides* are compared: the policy, and either another policy file or the
decisions the records carry. For each, per stream and overall: frames, escalated
frames and share, escalations per clock hour (p50/p95 over the hours), uplink
bytes per day, suppressed candidates by limit, how often and how long the budget
was saturated, and the hardest frames held back; plus how many decisions change
in each direction.

Uplink bytes: an escalation's recorded ``payload_bytes`` (the bytes of the image
sent, ``edge.payloads.note_payload``) where the side sends what was recorded (the
records' policy is known, by digest, and has the same ``payload`` section);
otherwise the frame's pixels (or the area of its recorded crop or regions) times
bytes per pixel at the side's ``jpegQuality``, from :data:`JPEG_BYTES_PER_PIXEL`,
scaled to the recorded sizes when those are known to be at a known quality (the
bytes per pixel are measured on the recorded escalations that sent frame pixels at
full resolution: not on ``downscaled`` or ``low+regions`` payloads).

Capture time: the hours and spans are the stretches of capture time the records
cover (:meth:`Stream.spans`). A stream whose capture time jumps by more than
:data:`GAP_S` between two frames, forward or back (a clock stepped by NTP, a camera
off for a night) has a stretch on each side of the jump, and the gap between them is
no capture time: escalations per hour are over the clock hours the stretches cover,
uplink per day and the saturated share over their length, and a note says how many
jumps there were, how large and how much time the records cover. So the work of the
per-hour figures is bounded by the records (at most about two hours per frame),
never by the time from the first capture to the last. Capture times no clock could
have taken are skipped on reading (:data:`edgewise.policy.recorded.CAPTURE_MIN_NS`).

What cannot be reproduced is said in ``notes``: records from another policy
version, records without ``decided_s`` (older daemons: the budget runs on capture
time) or without the edge facts, missing signals, capture time going backwards or
jumping, records out of order beyond the reorder window (a stream's share of the one
budget of records held across all streams, :data:`edgewise.policy.recorded.REORDER_BUDGET`:
the note names both), lines that are not records, records with a field of the wrong type
or a value that cannot be used (a capture time outside 2000-2200, NaN, an infinity or a
number too large for a float, in a field or in the signals: skipped), files that could
not be read to their end. Records of which not one frame can be replayed are an
InvalidInputError (``check-policy`` exits 2).

The report does not depend on how the streams' frames interleave (so not on the reorder
budget either, for records within it): each stream's frames are decided in their own order,
the hardest frames held back are ranked by hardness, then capture time, stream and
frame_seq, and the mismatches listed are the first by (device, stream, frame_seq).
"""

from __future__ import annotations

import gc
import math
import time
from bisect import insort
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from edgewise.errors import InvalidInputError
from edgewise.hardness.carrystate import CARRY_FEATURES
from edgewise.hardness.signals import SIGNAL_NAMES
from edgewise.policy.deciding import Decision, Escalator, FrameFacts
from edgewise.policy.digest import policy_digest
from edgewise.policy.recorded import (
    MAX_LINE,
    MAX_NUMBER,
    REORDER_BUDGET,
    REORDER_FRAMES,
    Reading,
    Record,
    frames,
    value_rule,
)
from edgewise.policy.schema import Payload, Policy, WholeFrames
from edgewise.regions import low_is_frame

#: A stream of the records: (device, stream id); frame_seqs and budgets are a device's.
Key = Tuple[str, str]
#: Suppressions that mean the budget was used up (cooldown is a separate limit).
BUDGET_SUPPRESSORS = ("priority", "budget_fraction", "budget_rate")
#: JPEG bytes per pixel by quality, measured with OpenCV on the frames of OpenCV's
#: ``vtest.avi`` (768x576 pedestrian video); linear in between.
JPEG_BYTES_PER_PIXEL: Tuple[Tuple[int, float], ...] = (
    (1, 0.02), (10, 0.036), (30, 0.074), (50, 0.103), (60, 0.118), (70, 0.139), (75, 0.151),
    (80, 0.171), (85, 0.2), (90, 0.247), (95, 0.341), (100, 0.663),
)
#: An hour bucket covering less than this many seconds is left out of the per-hour
#: percentiles (a stream that started at 10:58) unless it is the only one.
MIN_HOUR_COVERAGE_S = 360.0
#: A step of a stream's capture time between two frames (forward or back) larger than this
#: is a jump: the time in between is not counted as capture time (see module doc).
GAP_S = 3600.0
#: Mismatches listed when a replay does not reproduce the records.
MAX_MISMATCHES = 20
#: Payload modes that send part of the frame (its area is recorded as ``crop`` or ``regions``).
PART_MODES = ("crops", "regions")
#: Payload modes whose image is not the frame's pixels at full resolution: their recorded
#: sizes do not calibrate the bytes per pixel.
SCALED_MODES = ("downscaled", "low+regions")
#: ``isinstance``'s second argument for every signal of a record (a record whose signal is
#: JSON ``true`` is counted a bad value; the daemon writes numbers only)
_BOOL = repeat(bool)


def jpeg_bytes_per_pixel(quality: int) -> float:
    """Bytes per pixel of a JPEG at ``quality`` (:data:`JPEG_BYTES_PER_PIXEL`)."""
    table = JPEG_BYTES_PER_PIXEL
    q = min(max(quality, table[0][0]), table[-1][0])
    for (q0, b0), (q1, b1) in zip(table, table[1:]):
        if q <= q1:
            return b0 + (b1 - b0) * (q - q0) / (q1 - q0)
    return table[-1][1]  # pragma: no cover


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    return float(s[max(0, min(len(s) - 1, int(math.ceil(p / 100.0 * len(s))) - 1))])


class Figures:
    """What one side did on one stream (or all of them)."""

    __slots__ = ("frames", "escalated", "hours", "measured_bytes", "measured_pixels", "measured_unknown",
                 "measured", "est_pixels", "est_unknown", "suppressed", "episodes", "sat_s", "sat_longest_s",
                 "sat_start", "sat_last")

    def __init__(self) -> None:
        self.frames = 0
        self.escalated = 0
        self.hours: Dict[int, int] = {}  # clock hour (unix s // 3600) -> escalations
        self.measured_bytes = 0          # recorded payload_bytes of escalations that have them
        self.measured = 0
        # the pixels this side would send (Side.pixels_of), of escalations with a recorded size
        # and of those without; "unknown": frame pixels of which an unknown part is sent
        self.measured_pixels = 0.0
        self.measured_unknown = 0.0
        self.est_pixels = 0.0
        self.est_unknown = 0.0
        self.suppressed: Dict[str, int] = {}
        self.episodes = 0
        self.sat_s = 0.0
        self.sat_longest_s = 0.0
        self.sat_start: Optional[float] = None
        self.sat_last = 0.0

    def close_saturation(self, end: float) -> None:
        if self.sat_start is not None:
            d = max(0.0, end - self.sat_start)
            self.sat_s += d
            self.sat_longest_s = max(self.sat_longest_s, d)
            self.sat_start = None

    def add(self, other: Figures) -> None:
        """Sum ``other`` into this (for the overall figures)."""
        for name in ("frames", "escalated", "measured_bytes", "measured_pixels", "measured_unknown", "measured",
                     "est_pixels", "est_unknown", "episodes", "sat_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.sat_longest_s = max(self.sat_longest_s, other.sat_longest_s)
        for hour, n in other.hours.items():
            self.hours[hour] = self.hours.get(hour, 0) + n
        for by, n in other.suppressed.items():
            self.suppressed[by] = self.suppressed.get(by, 0) + n


class Side:
    """One column of the comparison: a policy replayed, or the recorded decisions."""

    def __init__(self, label: str, policy: Optional[Policy], top: int) -> None:
        self.label = label
        self.policy = policy
        self.digest = policy_digest(policy) if policy is not None else ""
        # per device: frame_seqs and budgets are a device's, and two devices may name a stream alike
        self.escalators: Dict[str, Escalator] = {}
        self.payload = policy.spec.payload if policy is not None else None  # None: the recorded sends
        self.whole_frames = WholeFrames()  # the policy's payload.wholeFrameEverySeconds, per stream
        self.top = top
        # the hardest held back, best first: (-hardness, capture ns, stream, seq, by)
        self.hardest: List[Tuple[float, int, Key, int, str]] = []
        self.checked = 0
        self.agreed = 0
        self.mismatches: List[Dict[str, Any]] = []
        # frames this side's policy decided after a live reload from another version in the same daemon
        # run: their budget started from that version's decisions (see Side.check), compared, not checked
        self.after_reload = 0
        self.agreed_after_reload = 0

    def escalator(self, device: str) -> Optional[Escalator]:
        """The policy's decision core for the streams of ``device`` (None: the recorded decisions)."""
        if self.policy is None:
            return None
        esc = self.escalators.get(device)
        if esc is None:
            esc = self.escalators[device] = Escalator(self.policy, clock=lambda: 0.0)
        return esc

    def pixels_of(self, pixels: float, width: int, part: Optional[float], sid: Key = ("", ""),
                  t: float = 0.0) -> Tuple[float, float]:
        """(full-resolution pixels this side sends for a frame of ``pixels`` whose recorded
        part, when known, covers ``part``, escalated at ``t`` in stream ``sid``; frame pixels of
        which it sends a part of unknown size). The recorded decisions send what was recorded;
        a policy with ``payload.wholeFrameEverySeconds`` sends the whole frame when it is due."""
        pl = self.payload
        if pl is None:
            return (part if part is not None else pixels), 0.0
        mode = self.whole_frames.mode(pl, sid, t)  # full when the refresh is due
        if mode in PART_MODES:
            return (part, 0.0) if part is not None else (0.0, pixels)
        if mode == "full" or (mode in SCALED_MODES and width > 0 and low_is_frame(width, pl.downscale_width)):
            return pixels, 0.0
        low = pixels * min(1.0, pl.downscale_width / width) ** 2 if width > 0 else pixels
        if mode == "downscaled":
            return low, 0.0
        return (low + part, 0.0) if part is not None else (low, pixels)  # low+regions

    def note_suppressed(self, hardness: float, cap_ns: int, sid: Key, seq: int, by: str) -> None:
        """Keep the ``top`` hardest frames held back: by hardness, then the earliest capture
        (then stream and frame_seq), so the same whatever the order the streams interleave in."""
        h = self.hardest
        if len(h) >= self.top:
            if not self.top or -hardness > h[-1][0]:
                return
            entry = (-hardness, cap_ns, sid, seq, by)
            if entry >= h[-1]:
                return
            h.pop()
        else:
            entry = (-hardness, cap_ns, sid, seq, by)
        insort(h, entry)

    def check(self, doc: Record, d: Decision, recorded: bool, reloaded: bool = False) -> None:
        """This side's policy decided the recorded frame: the replay must agree with it. The
        mismatches kept are the first :data:`MAX_MISMATCHES` by (device, stream, frame_seq),
        whatever the order the streams interleave in. ``reloaded``: the daemon put this policy
        in force by a live reload from another version earlier in the same run, so its budget
        state (tokens, window, cooldown, ranking) came from that version's decisions, which the
        records do not hold: such a frame is compared and counted apart, not checked (a token
        bucket out of phase can differ for the rest of the run, not only right after the reload)."""
        if reloaded:
            self.after_reload += 1
            self.agreed_after_reload += d.escalate == recorded
            return
        self.checked += 1
        if d.escalate == recorded:
            self.agreed += 1
            return
        ms = self.mismatches
        order = (doc.get("device", ""), doc["stream"], doc["frame_seq"])
        if len(ms) >= MAX_MISMATCHES:
            worst = max(range(len(ms)), key=lambda i: _mismatch_order(ms[i]))
            if order >= _mismatch_order(ms[worst]):
                return
            del ms[worst]
        ms.append({
            "device": order[0], "stream": order[1], "frame_seq": order[2], "recorded": recorded,
            "recorded_reason": doc.get("reason"), "recorded_suppressed_by": doc.get("suppressed_by") or None,
            "recorded_hardness": doc.get("hardness"), "replayed": d.escalate, "replayed_reason": d.reason,
            "replayed_suppressed_by": d.suppressed_by, "replayed_hardness": round(d.hardness, 4)})


def _mismatch_order(m: Dict[str, Any]) -> Tuple[str, str, int]:
    return m["device"], m["stream"], m["frame_seq"]


class Stream:
    """One stream's capture-time stretches, daemon runs, oddities and figures per side."""

    __slots__ = ("first_s", "last_s", "stretches", "jumps", "largest_jump_s", "epoch", "runs", "backwards",
                 "largest_back_s", "figs", "version", "run_frames", "escalators", "run_digests", "run_carry")

    def __init__(self, t: float, epoch: int, n_sides: int, escalators: Sequence[Optional[Escalator]] = ()) -> None:
        self.first_s = t  # the current stretch of capture time: earliest and latest frame
        self.last_s = t
        self.stretches: List[Tuple[float, float]] = []  # the stretches before it (see jump)
        self.jumps = 0
        self.largest_jump_s = 0.0
        self.epoch = epoch
        self.runs = 1
        self.backwards = 0
        self.largest_back_s = 0.0
        self.figs = [Figures() for _ in range(n_sides)]
        self.version: Tuple[Any, ...] = ()  # (policy, digest, generation) of the current frames
        self.run_frames = 0                 # frames of that version so far
        self.run_carry: Set[str] = set()    # the carry-state features a side reads that its records hold
        self.escalators = list(escalators)  # each side's decision core for the stream's device
        self.run_digests: Set[str] = set()  # the policy digests that decided frames of the current daemon run

    def jump(self, t: float) -> None:
        """Capture time jumped to ``t`` by more than :data:`GAP_S`: the current stretch ends
        (and so does any budget saturation: the gap is no time saturated), one starts at ``t``."""
        self.stretches.append((self.first_s, self.last_s))
        self.jumps += 1
        self.largest_jump_s = max(self.largest_jump_s, abs(t - self.last_s))
        self.first_s = self.last_s = t
        for fig in self.figs:
            fig.close_saturation(fig.sat_last)

    def spans(self) -> List[Tuple[float, float]]:
        """The capture time the stream's frames cover, as disjoint sorted (start, end) spans:
        each stretch from its first frame to one mean frame interval after its last."""
        stretches = self.stretches + [(self.first_s, self.last_s)]
        n = self.figs[0].frames
        step = (sum(b - a for a, b in stretches) / (n - len(stretches))) if n > len(stretches) else 0.0
        return union((a, b + step) for a, b in stretches)


def union(spans: Iterable[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """Spans of time merged where they overlap, sorted."""
    out: List[Tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def covered(spans: Sequence[Tuple[float, float]]) -> float:
    """Seconds the (disjoint) spans cover."""
    return sum(b - a for a, b in spans)


@dataclass
class Replay:
    """The state of one replay (see :func:`replay`)."""

    sides: List[Side]
    reading: Reading = field(default_factory=Reading)
    streams: Dict[Key, Stream] = field(default_factory=dict)  # by (device, stream)
    versions: Dict[Tuple[str, str], Dict[str, Any]] = field(default_factory=dict)
    changes: Dict[Key, List[int]] = field(default_factory=dict)  # stream -> [newly, no longer]
    no_clock: int = 0
    no_facts: int = 0
    bad_values: int = 0
    missing_signals: Dict[str, int] = field(default_factory=dict)
    cal_bytes: int = 0
    cal_pixels: float = 0.0
    crop_pixels: float = 0.0
    crop_frames_pixels: float = 0.0
    needed: Set[str] = field(default_factory=set)
    carry_read: Set[str] = field(default_factory=set)  # the carry-state features a side's gain model reads
    reorder_window: int = REORDER_FRAMES  # the records of a stream it may hold (the budget may leave fewer)

    def count_version(self, st: Stream) -> None:
        """Add a stream's run of frames of one policy version to :attr:`versions`."""
        if st.run_frames:
            name, digest, epoch, gen = st.version
            v = self.versions.get((name, digest))
            if v is None:
                v = self.versions[(name, digest)] = {"name": name, "digest": digest, "frames": 0,
                                                     "generations": set()}
            v["frames"] += st.run_frames
            v["generations"].add(gen)
            v.setdefault("carry", set()).update(st.run_carry)
        st.run_frames = 0
        st.run_carry = set()

    def restart(self, key: Key, st: Stream, epoch: int) -> None:
        """The daemon restarted (a new frame_seq epoch): budgets and the whole-frame refresh
        start afresh, as they did (the restarted daemon's first escalation under
        ``payload.wholeFrameEverySeconds`` goes whole, however little its decision clock moved)."""
        st.epoch = epoch
        st.runs += 1
        st.run_digests.clear()
        for side, esc, fig in zip(self.sides, st.escalators, st.figs):
            if esc is not None:
                esc.forget(key[1])
            side.whole_frames.forget(key)
            fig.close_saturation(fig.sat_last)

    def name(self, key: Key) -> str:
        """How the report names a stream: its id, prefixed with its device's when the records
        come from more than one device."""
        if len({dev for dev, _ in self.streams}) > 1:
            return f"{key[0]}/{key[1]}"
        return key[1]


def _facts_from_boxes(doc: Record) -> FrameFacts:
    """Best effort for records of older daemons: the recorded boxes (the merged ones for frames
    the cloud answered, hence only the edge's boxes where the record says which)."""
    dets = [d for d in doc.get("detections") or () if isinstance(d, dict) and d.get("source", "edge") == "edge"]
    scores = [float(d.get("score", 0.0)) for d in dets]
    names = sorted({str(d.get("class_name")) for d in dets if d.get("class_name") is not None})
    return FrameFacts(tuple(names), len(dets), max(scores) if scores else 0.0)


def _needed(policy: Policy) -> Set[str]:
    if policy.learned is not None:  # the signals the model was fitted on, the carry state's included
        return set(SIGNAL_NAMES + CARRY_FEATURES).intersection(policy.learned.features)
    return {k for k, w in policy.spec.signals.weights.items() if w > 0}


def _carry_read(policy: Policy) -> Set[str]:
    """The carry-state features ``policy``'s gain model reads (none when it reads no carry state)."""
    return _needed(policy).intersection(CARRY_FEATURES) if policy.uses_carry() else set()


def _crop_area(crop: Any) -> Optional[float]:
    try:
        return float(max(0, crop[2] - crop[0]) * max(0, crop[3] - crop[1]))
    except (TypeError, IndexError, KeyError):
        return None


def _part_area(doc: Record) -> Optional[float]:
    """The frame area an escalation sent at full resolution when it was part of the frame
    (its ``crop``, or its ``regions`` together); None when the record names no part."""
    if "crop" in doc:
        return _crop_area(doc["crop"])
    regions = doc.get("regions")
    if regions.__class__ is not list:
        return None
    areas = [_crop_area(r) for r in regions]
    return None if None in areas else sum(a for a in areas if a is not None)


def _take(r: Replay, doc: Record) -> None:
    """Decide one recorded frame on both sides and account for it (the replay's hot loop:
    about 1.3 million calls for a day of one camera, so kept lean)."""
    sid = doc["stream"]
    key = (doc.get("device", ""), sid)
    seq = doc["frame_seq"]
    cap_ns = doc["capture_unix_ns"]  # an int in range: recorded.bad_value skipped the others
    t = cap_ns / 1e9
    st = r.streams.get(key)
    if st is None:
        st = r.streams[key] = Stream(t, seq >> 32, 2, [side.escalator(key[0]) for side in r.sides])
    else:
        if seq >> 32 != st.epoch:
            r.restart(key, st, seq >> 32)
        if t >= st.last_s:
            if t - st.last_s > GAP_S:
                st.jump(t)
            else:
                st.last_s = t
        else:
            st.backwards += 1
            back = st.last_s - t
            if back > st.largest_back_s:
                st.largest_back_s = back
            if back > GAP_S:
                st.jump(t)
            elif t < st.first_s:
                st.first_s = t
    now = doc.get("decided_s")
    if now.__class__ is not float and now.__class__ is not int:
        now = t
        r.no_clock += 1
    classes = doc.get("edge_classes")
    signals = doc["signals"]
    if not r.needed.issubset(signals):
        for name in r.needed.difference(signals):
            r.missing_signals[name] = r.missing_signals.get(name, 0) + 1
    side0, side1 = r.sides
    esc0, esc1 = st.escalators
    try:
        # every signal, weighted or not, a finite number within +-MAX_NUMBER: NaN or an infinity
        # makes the sum fail the comparison, a string, null or list raises TypeError, and a
        # 400-digit integer (no float holds it) OverflowError, or fails the comparison alone
        if not sum(map(abs, signals.values())) <= MAX_NUMBER or any(map(isinstance, signals.values(), _BOOL)):
            raise ValueError("a signal is not a finite number")  # JSON true is no number (abs(True) is 1)
        if classes.__class__ is list:
            facts = FrameFacts(tuple(classes), doc.get("edge_boxes", 0), doc.get("edge_max_score", 0.0))
        else:
            facts = _facts_from_boxes(doc)  # an older daemon's boxes: a score may not be a number
            r.no_facts += 1
        d0 = esc0.decide_facts(sid, seq, facts, signals, now)  # type: ignore[union-attr]
        d1 = esc1.decide_facts(sid, seq, facts, signals, now) if esc1 is not None else None
    except (TypeError, ValueError, OverflowError):  # a signal or fact that is not a (usable) number
        r.bad_values += 1
        return
    digest = doc.get("policy_digest", "")
    version = (doc.get("policy", ""), digest, seq >> 32, doc.get("policy_generation", 0))
    if version != st.version:
        r.count_version(st)
        st.version = version
    run_digests = st.run_digests
    run_digests.add(digest)
    st.run_frames += 1
    if r.carry_read:
        st.run_carry.update(r.carry_read.intersection(signals))
    recorded = doc.get("escalated") is True
    up0 = d0.escalate
    up1 = d1.escalate if d1 is not None else recorded
    pixels = 0.0
    width = 0
    crop = None
    pb = doc.get("payload_bytes")
    if up0 or up1 or recorded:
        width, height = doc.get("width", 0), doc.get("height", 0)
        if width.__class__ is int and height.__class__ is int:
            pixels = float(width * height)
        else:
            width = 0
        crop = _part_area(doc)
        mode = doc.get("payload")
        if crop is None and mode in PART_MODES:
            crop = pixels  # a part payload that found no part sent the whole frame
        if pb.__class__ is not int:
            pb = None
        elif mode not in SCALED_MODES:  # full-resolution pixels: they calibrate
            r.cal_bytes += pb
            r.cal_pixels += crop if crop is not None else pixels
        if crop is not None:
            r.crop_pixels += crop
            r.crop_frames_pixels += pixels
    if digest == side0.digest:
        side0.check(doc, d0, recorded, len(run_digests) > 1)
    fig0, fig1 = st.figs
    _account(side0, fig0, up0, d0.suppressed_by, d0.hardness, t, cap_ns, key, seq, pb, crop, pixels, width, now)
    if d1 is not None:
        if digest == side1.digest:
            side1.check(doc, d1, recorded, len(run_digests) > 1)
        _account(side1, fig1, up1, d1.suppressed_by, d1.hardness, t, cap_ns, key, seq, pb, crop, pixels, width,
                 now)
    else:
        _account(side1, fig1, up1, doc.get("suppressed_by") or None, doc.get("hardness", 0.0), t, cap_ns, key,
                 seq, pb, crop, pixels, width, now)
    if up0 != up1:
        ch = r.changes.get(key)
        if ch is None:
            ch = r.changes[key] = [0, 0]
        ch[0 if up0 else 1] += 1


def _account(side: Side, fig: Figures, escalate: bool, by: Optional[str], hardness: float, t: float,
             cap_ns: int, sid: Key, seq: int, pb: Optional[int], crop: Optional[float], pixels: float,
             width: int, now: float) -> None:
    """Count one frame's decision (taken at ``now``, the decision clock) on one side."""
    fig.frames += 1
    if escalate:
        fig.escalated += 1
        hour = int(t // 3600)
        fig.hours[hour] = fig.hours.get(hour, 0) + 1
        known, unknown = side.pixels_of(pixels, width, crop, sid, float(now))
        if pb is not None:
            fig.measured += 1
            fig.measured_bytes += pb
            fig.measured_pixels += known
            fig.measured_unknown += unknown
        else:
            fig.est_pixels += known
            fig.est_unknown += unknown
        if fig.sat_start is not None:
            fig.close_saturation(t)
    elif by:
        fig.suppressed[by] = fig.suppressed.get(by, 0) + 1
        side.note_suppressed(hardness, cap_ns, sid, seq, by)
        if by in BUDGET_SUPPRESSORS:
            if fig.sat_start is None:
                fig.sat_start = t
                fig.episodes += 1
            fig.sat_last = t


def replay(paths: Sequence[str], policy: Policy, against: Optional[Policy] = None, top: int = 10,
           label: str = "", against_label: str = "", reorder_frames: int = REORDER_FRAMES,
           reorder_budget: int = REORDER_BUDGET) -> Dict[str, Any]:
    """Replay ``policy`` (and ``against``, or else the recorded decisions) over the records in
    ``paths``; the JSON-ready report (see module doc; rendered by :mod:`edgewise.policy.whatif`).
    The labels name the sides in the report (default: the policy files). The records held to
    restore each stream's order are at most ``reorder_frames`` of a stream and
    ``reorder_budget`` in all (:func:`edgewise.policy.recorded.frames`)."""
    sides = [Side(label or policy.source or policy.metadata.name, policy, top),
             Side(against_label or against.source or against.metadata.name, against, top)
             if against is not None else Side("recorded decisions", None, top)]
    r = Replay(sides, reorder_window=reorder_frames)
    for side in sides:
        if side.policy is not None:
            r.needed |= _needed(side.policy)
            r.carry_read |= _carry_read(side.policy)
    t0, c0 = time.perf_counter(), time.process_time()
    collecting = gc.isenabled()
    gc.disable()  # millions of short-lived dicts, no cycles: the collector would cost a third of the time
    try:
        for doc in frames(paths, r.reading, reorder_frames, reorder_budget):
            _take(r, doc)
    finally:
        if collecting:
            gc.enable()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if not any(st.figs[0].frames for st in r.streams.values()):
        raise InvalidInputError(_nothing_usable(r))
    for st in r.streams.values():
        r.count_version(st)
        for fig in st.figs:
            fig.close_saturation(fig.sat_last)
    return _report(r, elapsed, cpu)


# --------------------------------------------------------------------------- the report

def _recorded_payload(r: Replay) -> Optional[Payload]:
    """The payload section of the policy that decided the records, when one of ours is it."""
    digests = {d for (_, d) in r.versions}
    if len(digests) != 1:
        return None
    for side in r.sides:
        if side.policy is not None and side.digest in digests:
            return side.policy.spec.payload
    return None


def _uplink(r: Replay, side: Side, fig: Figures, rec_payload: Optional[Payload]) -> Tuple[float, str]:
    """(bytes, how they were counted) of a side's escalations in ``fig``."""
    cal = r.cal_bytes / r.cal_pixels if r.cal_pixels > 0 else None
    crop_frac = r.crop_pixels / r.crop_frames_pixels if r.crop_frames_pixels > 0 else 1.0
    payload = side.policy.spec.payload if side.policy is not None else rec_payload
    same = side.policy is None or (rec_payload is not None and payload == rec_payload)
    quality = payload.jpeg_quality if payload is not None else Payload().jpeg_quality
    if same and cal is not None:
        bpp, how = cal, f"{cal:.3f} B/px measured on the recorded escalations"
    elif cal is not None and rec_payload is not None:
        bpp = cal * jpeg_bytes_per_pixel(quality) / jpeg_bytes_per_pixel(rec_payload.jpeg_quality)
        how = f"{bpp:.3f} B/px: the recorded sizes scaled from jpegQuality {rec_payload.jpeg_quality} to {quality}"
    elif cal is not None:
        bpp = cal
        how = (f"{cal:.3f} B/px measured on the recorded escalations, taken to be at jpegQuality {quality} "
               "(--against the policy that recorded them makes this exact)")
    else:
        bpp = jpeg_bytes_per_pixel(quality)
        how = f"{bpp:.3f} B/px, the rule of thumb for jpegQuality {quality}"
    est = fig.est_pixels + fig.est_unknown * crop_frac
    if same:
        return fig.measured_bytes + est * bpp, f"{fig.measured} recorded sizes, the rest at {how}"
    return (fig.measured_pixels + fig.measured_unknown * crop_frac + est) * bpp, f"estimated at {how}"


def _per_hour(hours: Dict[int, int], spans: Sequence[Tuple[float, float]]) -> List[float]:
    """Escalations per hour in each clock hour the (disjoint) spans cover enough of: only the
    hours they touch, so the work is bounded by the spans' length, not by the time between
    the first and the last (a gap between spans is no hour)."""
    cover: Dict[int, float] = {}
    for a, b in spans:
        for h in range(int(a // 3600), int(b // 3600) + 1):
            cover[h] = cover.get(h, 0.0) + min(b, (h + 1) * 3600.0) - max(a, h * 3600.0)
    out = [(hours.get(h, 0), c) for h, c in sorted(cover.items())]
    keep = [(n, c) for n, c in out if c >= MIN_HOUR_COVERAGE_S] or out
    return [n * 3600.0 / max(c, 1.0) for n, c in keep]


def _figures_doc(r: Replay, side: Side, fig: Figures, spans: Sequence[Tuple[float, float]],
                 rec_payload: Optional[Payload], stream_seconds: Optional[float] = None) -> Dict[str, Any]:
    """One side's figures on one stream, or overall, over the capture time of ``spans``;
    ``stream_seconds`` (overall) is the sum of the streams' capture time, which the summed
    saturation time is a share of."""
    span = covered(spans)
    sat_span = span if stream_seconds is None else stream_seconds
    per_hour = _per_hour(fig.hours, spans)
    uplink, basis = _uplink(r, side, fig, rec_payload)
    return {
        "frames": fig.frames,
        "escalated": fig.escalated,
        "share": fig.escalated / fig.frames if fig.frames else 0.0,
        "per_hour_p50": round(percentile(per_hour, 50), 1),
        "per_hour_p95": round(percentile(per_hour, 95), 1),
        "hours": len(per_hour),
        "uplink_bytes": int(round(uplink)),
        "uplink_bytes_per_day": int(round(uplink * 86400.0 / span)) if span > 0 else None,
        "uplink_basis": basis,
        "suppressed": dict(sorted(fig.suppressed.items())),
        "budget_saturated": {
            "episodes": fig.episodes,
            "seconds": round(fig.sat_s, 1),
            "share_of_time": round(fig.sat_s / sat_span, 4) if sat_span > 0 else 0.0,
            "longest_seconds": round(fig.sat_longest_s, 1),
        },
    }


def _nothing_usable(r: Replay) -> str:
    """The error for records of which no frame could be replayed: what each line was."""
    rd = r.reading
    files = ", ".join(rd.files)
    if not rd.lines:
        why = "; ".join(rd.cut_short) or "the files are empty"
        return f"{files}: no records ({why}); give the edge daemon's JSON Lines sink files (docs/records.md)"
    found = [f"{n} {what}" for n, what in (
        (rd.not_json, "not JSON objects"), (rd.too_long, f"longer than {MAX_LINE:,} characters"),
        (rd.not_records, "without stream, frame_seq or signals"),
        (sum(rd.wrong_types.values()), "with a field of the wrong type: "
         + ", ".join(f"{k} {n}" for k, n in sorted(rd.wrong_types.items()))),
        (sum(rd.bad_values.values()), "with a value that cannot be used: "
         + ", ".join(f"{k} {n}" for k, n in sorted(rd.bad_values.items()))),
        (rd.late, "late records"), (rd.duplicates, "duplicates"),
        (r.bad_values, "with signals or edge facts that are not numbers")) if n]
    unread = "".join(f"; {note}" for note in rd.cut_short)
    return (f"{files}: none of the {rd.lines} line(s) is a usable frame record ({'; '.join(found)}{unread}); give "
            "the edge daemon's JSON Lines sink files, whose fields docs/records.md describes")


def _by_frames(version: Dict[str, Any]) -> Tuple[int, str, str]:
    """The order the report lists policy versions in: most frames first, then by name and digest."""
    return -version["frames"], version["name"], version["digest"]


def _notes(r: Replay) -> List[str]:
    rd = r.reading
    notes = []
    span = covered(union(sp for st in r.streams.values() for sp in st.spans()))
    if r.streams and span < 3600:
        notes.append(f"the records cover {span:.0f} s of capture time: per-hour and per-day figures are "
                     "extrapolated from it")
    if rd.not_json:
        notes.append(f"{rd.not_json} line(s) are not JSON objects (a line torn by a crash?): skipped")
    if rd.too_long:
        notes.append(f"{rd.too_long} line(s) are longer than {MAX_LINE:,} characters, which no record is (a file "
                     "that is not the sink's, or a run of NUL bytes a crash left?): skipped")
    if rd.not_records:
        notes.append(f"{rd.not_records} JSON line(s) lack stream, frame_seq or signals: not frame records, skipped")
    for name, n in sorted(rd.wrong_types.items()):
        notes.append(f"{n} record(s) have {name} of another type than docs/records.md gives it: skipped")
    for name, n in sorted(rd.bad_values.items()):
        if name == "capture_unix_ns":
            notes.append(f"{n} record(s) have no capture time, or one before 2000 or after 2200 (a clock not yet "
                         "set, such as a device that starts at 1970 until NTP syncs): skipped")
        else:
            notes.append(f"{n} record(s) have {name} that is not {value_rule(name)}: skipped")
    if rd.late:
        notes.append(f"{rd.late} late record(s) (a spooled frame's cloud answer) skipped: "
                     "the frame's decision is in its first record")
    if rd.duplicates:
        notes.append(f"{rd.duplicates} duplicate record(s) (the same stream and frame_seq twice: "
                     "a file given twice?) skipped")
    if rd.beyond_window:
        late = (f"{rd.beyond_window} record(s) came more than {rd.reorder_frames:,} frames of their stream late "
                "(after frames the daemon decided after them) and were decided where they came; budget effects "
                "around them may differ from the daemon's")
        if rd.reorder_frames < r.reorder_window:
            late += (f". The {rd.streams:,} stream(s) shared the reorder budget of {rd.reorder_budget:,} records "
                     "held at once (edgewise.policy.recorded.REORDER_BUDGET, which bounds the replay's memory), "
                     f"{rd.reorder_frames:,} each instead of {r.reorder_window:,}: replay fewer streams at once to "
                     "give each more, e.g. one device's records: zcat -f FILES | grep '\"device\":\"DEVICE\"' | "
                     "edgewise edge check-policy POLICY --replay -")
        else:
            late += f" (the reorder window: {r.reorder_window:,} frames of a stream)"
        notes.append(late)
    for path in rd.empty_files:
        notes.append(f"{path}: no records")
    notes.extend(rd.cut_short)
    if r.no_clock:
        notes.append(f"{r.no_clock} record(s) lack decided_s (written by an older daemon): their budget and "
                     "cooldown run on capture time, so decisions at the limits may differ from the daemon's")
    if r.no_facts:
        notes.append(f"{r.no_facts} record(s) lack edge_classes (written by an older daemon): class thresholds "
                     "and learned features read the recorded boxes instead, which for frames the cloud "
                     "answered are the merged boxes")
    for name, n in sorted(r.missing_signals.items()):
        notes.append(f"{n} record(s) lack signal {name} (recorded by a daemon without it): counted as 0")
    if r.bad_values:
        notes.append(f"{r.bad_values} record(s) have signals or edge facts that are not numbers: skipped (a string, "
                     "null, NaN, an infinity or a number too large for a float)")
    for key, st in sorted(r.streams.items()):
        sid = r.name(key)
        if st.backwards:
            notes.append(f"stream {sid}: capture time goes backwards {st.backwards} time(s) (at most "
                         f"{st.largest_back_s:.1f} s; a clock step?): frames are replayed in the daemon's "
                         "order, hours and spans read the capture times as recorded")
        if st.jumps:
            spans = st.spans()
            notes.append(f"stream {sid}: capture time jumps by more than {GAP_S / 3600:.0f} h {st.jumps} time(s) "
                         f"(at most {st.largest_jump_s / 3600:,.1f} h; a clock step, or the stream stopped): the "
                         f"records cover {covered(spans) / 3600:,.2f} h of the {(spans[-1][1] - spans[0][0]) / 3600:,.1f} "
                         "h from the first capture to the last, and the figures per hour and per day count only "
                         "those, not the gaps")
    versions = sorted(r.versions.values(), key=_by_frames)
    if versions and not any(v["digest"] for v in versions):
        notes.append("the records do not carry policy_digest (written by an older daemon): whether a policy "
                     "decided them cannot be checked, so nothing is checked for reproduction")
    notes.extend(filter(None, (_carry_note(side, versions) for side in r.sides)))
    for side in r.sides:
        if side.policy is None or not (side.checked or side.after_reload):
            continue
        others = sum(v["frames"] for v in versions if v["digest"] != side.digest)
        if others:
            notes.append(f"{others} of the frames were decided by another policy version than {side.label}: "
                         "those are a what-if" + ("" if side.after_reload else ", the others are checked for reproduction"))
        if side.agreed < side.checked and side.policy.spec.on_cloud_unavailable == "drop":
            notes.append(f"{side.label} drops the escalations the cloud could not take (onCloudUnavailable: drop), "
                         "and a dropped frame has no record (docs/records.md): the replay does not see the budget "
                         "those frames spent, so the decisions after them may not reproduce, and the recorded "
                         "decisions count none of them as escalated; edgewise_edge_escalations_total"
                         "{outcome=\"dropped\"} counts them on the device")
        if side.after_reload:
            notes.append(f"{side.after_reload} frame(s) were decided by {side.label} after a live reload from another "
                         "version in the same daemon run: the daemon's budget (tokens, window, cooldown, ranking) "
                         "then came from the other version's decisions, which the records do not hold, so they "
                         f"are compared ({side.agreed_after_reload} agree) but not checked for reproduction (the "
                         "frames of a daemon run that started with this policy are)")
    return notes


def _carry_note(side: Side, versions: Sequence[Dict[str, Any]]) -> str:
    """The line saying that ``side``'s carry-aware policy reads the carry-state features another
    policy's daemon recorded ("" when it reads none of those)."""
    if side.policy is None:
        return ""
    reads = _carry_read(side.policy)
    under = [f"{', '.join(sorted(v['carry'] & reads))} under {v['name'] or 'an unnamed policy'!r} "
             f"({v['digest'][:12] or 'no digest'})"
             for v in versions if v["digest"] != side.digest and v.get("carry", set()) & reads]
    if not under:
        return ""
    return (f"{side.label} reads the carry-state features as recorded, {'; '.join(under)}: the pixels are not "
            "in the records, so the carrier cannot be re-run and they follow that policy's escalations, not "
            f"{side.label}'s own")


def _report(r: Replay, elapsed: float, cpu: float) -> Dict[str, Any]:
    rec_payload = _recorded_payload(r)
    frames_n = sum(st.figs[0].frames for st in r.streams.values())
    spans = {sid: st.spans() for sid, st in r.streams.items()}
    overall = union(sp for ss in spans.values() for sp in ss)
    first = overall[0][0] if overall else 0.0
    last = overall[-1][1] if overall else 0.0
    sides = []
    for i, side in enumerate(r.sides):
        total = Figures()
        streams = {}
        for sid in sorted(r.streams):
            st = r.streams[sid]
            total.add(st.figs[i])
            streams[r.name(sid)] = _figures_doc(r, side, st.figs[i], spans[sid], rec_payload)
        doc: Dict[str, Any] = {
            "label": side.label,
            "policy": None if side.policy is None else {
                "name": side.policy.metadata.name, "source": side.policy.source, "digest": side.digest},
            "overall": _figures_doc(r, side, total, overall, rec_payload,
                                    sum(covered(ss) for ss in spans.values())),
            "streams": streams,
            "hardest_suppressed": [
                {"hardness": round(-h, 4), "stream": r.name(sid), "frame_seq": seq, "capture_unix_ns": ns,
                 "suppressed_by": by}
                for h, ns, sid, seq, by in side.hardest],
        }
        if side.policy is not None and (side.checked or side.after_reload):
            doc["reproduction"] = {"checked": side.checked, "agreed": side.agreed,
                                   "share": side.agreed / side.checked if side.checked else 1.0,
                                   "mismatches": [dict(m, stream=r.name((m["device"], m["stream"])))
                                                  for m in sorted(side.mismatches, key=_mismatch_order)],
                                   "after_reload": {"compared": side.after_reload,
                                                    "agreed": side.agreed_after_reload}}
        sides.append(doc)
    newly = sum(c[0] for c in r.changes.values())
    no_longer = sum(c[1] for c in r.changes.values())
    rd = r.reading
    return {
        "records": {
            "files": rd.files, "lines": rd.lines, "frames": frames_n, "streams": len(r.streams),
            "capture_start_unix_s": round(first, 3), "capture_end_unix_s": round(last, 3),
            "hours": round(covered(overall) / 3600.0, 3),  # capture time covered: no gaps
            "daemon_runs": {r.name(sid): s.runs for sid, s in sorted(r.streams.items())},
            "policies": [{"name": v["name"], "digest": v["digest"], "frames": v["frames"],
                          "generations": sorted(v["generations"])}
                         for v in sorted(r.versions.values(), key=_by_frames)],
            "seconds": round(elapsed, 3),
            "cpu_seconds": round(cpu, 3),  # below "seconds" when other processes share the CPUs
            "records_per_second": round(rd.lines / elapsed) if elapsed > 0 else None,
            # records held to restore the order: a stream's window at the end, all streams' budget
            "reorder": {"window_frames": rd.reorder_frames, "budget_records": rd.reorder_budget,
                        "held_most": rd.held_most},
        },
        "sides": sides,
        "changes": {
            "newly_escalated": newly, "no_longer_escalated": no_longer,
            "streams": {r.name(sid): {"newly_escalated": c[0], "no_longer_escalated": c[1]}
                        for sid, c in sorted(r.changes.items())},
        },
        "notes": _notes(r),
    }
