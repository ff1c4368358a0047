"""Replaying escalation decisions over the collected frames, and the comparisons.

``evaluate`` scores one selection (which frames went to the cloud, in which payload
mode) the way the literature does: against ground truth (F1 at the operating threshold,
mAP@0.5) and against the cloud model's own output on every frame (DDS / NoScope /
DCSB), with the uplink bytes it costs. ``at_rates`` puts every policy at the same
escalation rates (never above them: ``floor(rate * N)`` frames; a policy's cooldown may
leave it ``short`` of a rate, and then it is not compared there), with a 95% interval of
each F1 by resampling streams (:mod:`.bootstrap`); ``differences`` gives the paired
interval of our policy's lead over each baseline; ``run_policy`` replays an operator's
policy file with its thresholds, cooldown and budget on the stream timeline, and
``policy_run`` scores it with the policy's own payload, merge and carrying (``edgewise
eval``'s policy row and ``check-policy --data``); ``threshold_sweep`` traces the curve of
the combined hardness threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from edgewise.carrying import CARRIED, CarryConfig, Looked, combine
from edgewise.detections import Detections
from edgewise.policy import Escalator, Policy
from edgewise.policy.schema import Merge, Payload, WholeFrames
from edgewise_tools.evaluation import bootstrap
from edgewise_tools.evaluation.carryreplay import CarryReplay
from edgewise_tools.evaluation.frames import FrameRecord, stream_id
from edgewise_tools.evaluation.metrics import Counts, match_counts, mean_ap
from edgewise_tools.evaluation.sequential import FrameViews


@dataclass(frozen=True)
class Sending:
    """What an escalation sends: payload ``mode``, and the policy ``payload``'s whole-frame
    refresh (``wholeFrameEverySeconds``, :meth:`Payload.whole_frame_due`, the daemon's rule)
    on each stream's timeline of ``fps`` frames per second."""

    mode: str
    payload: Payload
    fps: float = 10.0

    def per_frame(self, records: Sequence[FrameRecord], mask: np.ndarray) -> List[str]:
        """The payload mode of each frame were it escalated: ``full`` where the refresh is due."""
        out = [self.mode] * len(records)
        whole = WholeFrames()
        for i, r in enumerate(records):
            if mask[i]:
                out[i] = self.mode_of(whole, r)
        return out

    def mode_of(self, whole: WholeFrames, r: FrameRecord) -> str:
        """The payload mode of an escalation of ``r``, noting a whole frame in ``whole``."""
        now = r.frame / self.fps
        mode = whole.mode(self.payload, r.stream, now)
        if mode != "full" and r.sent(mode).whole:
            whole.sent_whole(r.stream, now)
        return mode


#: a payload mode, or a mode with the policy's whole-frame refresh
Mode = Union[str, Sending]
#: the merge when none is given: the cloud's boxes replace the edge's (nothing carried)
REPLACE = Merge(strategy="replace", iou=0.5)


def mode_of(mode: Mode) -> Callable[[WholeFrames, FrameRecord], str]:
    """Each escalation's payload mode under ``mode`` (:meth:`Sending.mode_of`), for a selection
    made frame by frame (:mod:`.sequential`)."""
    return mode.mode_of if isinstance(mode, Sending) else (lambda whole, r: mode)


def _modes(records: Sequence[FrameRecord], mask: np.ndarray, mode: Mode) -> List[str]:
    return mode.per_frame(records, mask) if isinstance(mode, Sending) else [mode] * len(records)


class Carried(NamedTuple):
    """What a stream carries onto a frame: the boxes (maybe none) and where the answers in
    force looked (:meth:`CarryReplay.looked`)."""

    boxes: Detections
    looked: Looked


def carried_at(replay: CarryReplay, i: int) -> Optional[Carried]:
    """Move ``replay`` to record ``i`` (:meth:`CarryReplay.at`) and say what its stream
    carries there (None: no answer in force)."""
    boxes = replay.at(i)
    looked = replay.looked()
    if not looked:
        return None
    return Carried(boxes if boxes is not None else Detections.empty(source=CARRIED), looked)


def final_boxes(r: FrameRecord, up: bool, merge: Merge, low: bool, mode: str = "full",
                carried: Optional[Carried] = None) -> Detections:
    """What frame ``r`` publishes: the answer to its escalation (``up``) sent in ``mode``
    merged with the edge's boxes, or the edge's boxes with the ``carried`` ones (the daemon's
    ``edge.carrying.publish``); ``low``: at the low threshold, for mAP."""
    if not up:
        edge = r.edge_all if low else r.edge
        if carried is None:
            return edge
        return combine(edge, carried.boxes, edge_floor=merge.carry().edge_floor, looked=carried.looked)
    m = r.sent(mode)
    edge, cloud = (r.edge_all, m.cloud_all) if low else (r.edge, m.cloud)
    return merge.apply(edge, cloud, m.regions)


def _carried(records: Sequence[FrameRecord], mask: np.ndarray, modes: Sequence[str], lag: Optional[int],
             cfg: CarryConfig) -> List[Optional[Carried]]:
    """Per frame, what the edge carries from its stream's answers (None: no answer in force,
    and on the escalated frames, which publish their own answer). The answer to frame t is there from
    frame t + ``lag`` on (1: before the next frame); until then the ones before it are carried
    (:class:`~edgewise_tools.evaluation.carryreplay.CarryReplay`, the daemon's rule). ``lag``
    None: nothing is carried."""
    out: List[Optional[Carried]] = [None] * len(records)
    if lag is None:
        return out
    replay = CarryReplay(records, lag, cfg)
    for i in range(len(records)):
        carried = carried_at(replay, i)
        if mask[i]:
            replay.escalate(i, modes[i])
        else:
            out[i] = carried
    return out


def evaluate(
    records: Sequence[FrameRecord], mask: np.ndarray, nc: int, merge: Merge = REPLACE, mode: Mode = "full",
    carry_lag: Optional[int] = None,
) -> Dict[str, float]:
    """Metrics of the hybrid that escalates exactly the frames in ``mask``, sending ``mode``,
    merging (and carrying, with ``carry_lag``) under the policy's ``merge``.

    ``uplink_saved`` is against sending every frame whole at full resolution."""
    return evaluate_frames(records, mask, nc, merge, mode, carry_lag)[0]


def evaluate_frames(
    records: Sequence[FrameRecord], mask: np.ndarray, nc: int, merge: Merge = REPLACE, mode: Mode = "full",
    carry_lag: Optional[int] = None,
) -> Tuple[Dict[str, float], np.ndarray]:
    """:func:`evaluate`'s metrics and, from the same pass, each frame's true positives, false
    positives and misses against ground truth ([N, 3], what the stream bootstrap resamples).
    With ``carry_lag`` (frames) the frames between escalations keep the answers' carried
    boxes under ``merge.carry()`` (the policy's ``merge.carry*``, :func:`_carried`); records
    must be in stream order, as collected."""
    vs_gt, vs_cloud = Counts(), Counts()
    per_frame = np.zeros((len(records), 3), np.float64)
    preds, gts = [], []
    sent = 0
    cloud_ms = 0.0
    modes = _modes(records, mask, mode)
    carried = _carried(records, mask, modes, carry_lag, merge.carry())
    for i, (r, up) in enumerate(zip(records, mask)):
        d = final_boxes(r, bool(up), merge, low=False, mode=modes[i], carried=carried[i])
        c = match_counts(d.boxes, d.class_ids, d.scores, r.gt_boxes, r.gt_cls)
        vs_gt += c
        per_frame[i] = (c.tp, c.fp, c.fn)
        vs_cloud += match_counts(d.boxes, d.class_ids, d.scores, r.cloud.boxes, r.cloud.class_ids)
        lo = final_boxes(r, bool(up), merge, low=True, mode=modes[i], carried=carried[i])
        preds.append((lo.boxes, lo.class_ids, lo.scores))
        gts.append((r.gt_boxes, r.gt_cls))
        if up:
            m = r.sent(modes[i])
            sent += m.nbytes
            cloud_ms += m.cloud_ms
    m_ap, _ = mean_ap(preds, gts, nc)
    total = int(sum(r.jpeg_bytes for r in records))
    n_up = int(np.count_nonzero(mask))
    return {
        "escalated": float(np.mean(mask)) if len(mask) else 0.0,
        "f1": vs_gt.f1, "precision": vs_gt.precision, "recall": vs_gt.recall,
        "map50": m_ap, "f1_vs_cloud": vs_cloud.f1,
        "uplink_bytes": int(sent), "uplink_saved": 1.0 - sent / total if total else 0.0,
        "bytes_per_escalation": sent / n_up if n_up else 0.0,
        "cloud_ms_per_escalation": cloud_ms / n_up if n_up else 0.0,
    }, per_frame


def evaluate_draws(records: Sequence[FrameRecord], masks: Sequence[np.ndarray], nc: int, merge: Merge = REPLACE,
                   mode: Mode = "full", carry_lag: Optional[int] = None) -> Dict[str, float]:
    """:func:`evaluate`'s metrics averaged over selections (a policy's tie-break draws, random's seeds)."""
    runs = [evaluate(records, m, nc, merge, mode, carry_lag) for m in masks]
    return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}


def cloud_only(records: Sequence[FrameRecord], nc: int, mode: Mode = "full") -> Tuple[Dict[str, float], np.ndarray]:
    """:func:`evaluate_frames` of the cloud model alone: every frame sent in ``mode``, the
    cloud's boxes its answer (``replace``; with a crop payload the edge's boxes outside every
    crop stay, which the cloud never saw), nothing carried. Not under the policy's merge:
    ``fuse`` keeps the edge's unconfirmed boxes above ``edgeFloor``, so every frame escalated
    and fused is a hybrid, not the cloud-only reference the literature, the demo and the
    "F1 vs cloud" column mean (on a camera val set it scored 0.746 against the cloud's own
    0.755, F1 vs cloud 0.987)."""
    return evaluate_frames(records, np.ones(len(records), bool), nc, REPLACE, mode)


def budget(rate: float, n: int) -> int:
    """How many of ``n`` frames a rate allows: ``floor(rate * N)``, never more than the rate
    (15% of 12 frames is 1, not round's 2 = 16.7%); the epsilon keeps 0.15 * 900 at 135."""
    return int(math.floor(rate * n + 1e-6))


def is_short(rate: float, escalated: float, n: int) -> bool:
    """Whether a selection escalating the share ``escalated`` of ``n`` frames falls short of
    ``rate`` by more than one frame: not at the rate of its column (a cooldown that cannot
    spend the budget), so not comparable with the policies that are."""
    return (rate - escalated) * n > 1.0 + 1e-6


def top_fraction(scores: np.ndarray, rate: float, seed: int = 0, streams: Optional[Sequence[int]] = None,
                 gap: int = 0) -> np.ndarray:
    """Mask of the :func:`budget` (``floor(rate * N)``) highest scores; ties broken by a seeded
    shuffle. With ``gap`` > 0 (and each frame's stream, frames in stream order) a frame less
    than ``gap`` frames from one already taken in its stream is passed over for the next
    highest: a cooldown, which is what spends a budget well once answers are carried, and
    which caps the share it can reach (about 1/``gap`` of each stream: :func:`is_short`)."""
    n = len(scores)
    k = budget(rate, n)
    mask = np.zeros(n, dtype=bool)
    if k <= 0:
        return mask
    tiebreak = np.random.default_rng(seed).random(n)
    order = np.lexsort((tiebreak, -np.asarray(scores, np.float64)))
    if gap <= 0 or streams is None:
        mask[order[:k]] = True
        return mask
    sid = list(streams)
    pos = [0] * n
    for i in range(1, n):
        pos[i] = pos[i - 1] + 1 if sid[i] == sid[i - 1] else 0
    taken: Dict[Any, List[int]] = {}
    for i in order:
        near = taken.setdefault(sid[i], [])
        if any(abs(pos[i] - q) < gap for q in near):
            continue
        mask[i] = True
        near.append(pos[i])
        k -= 1
        if k == 0:
            break
    return mask


def at_rates(
    records: Sequence[FrameRecord],
    scores: Mapping[str, Sequence[np.ndarray]],
    rates: Sequence[float],
    nc: int,
    merge: Merge = REPLACE,
    mode: Mode = "full",
    samples: int = bootstrap.SAMPLES,
    carry_lag: Optional[int] = None,
    gaps: Optional[Mapping[str, int]] = None,
    selections: Optional[Mapping[str, Mapping[float, Sequence[np.ndarray]]]] = None,
) -> Tuple[Dict[str, List[Dict[str, Any]]], Dict[str, List[np.ndarray]]]:
    """Each policy at each rate (a policy with several score vectors, random seeds or
    :func:`~edgewise_tools.evaluation.scoring.tie_draws`, is averaged over them: ``draws``),
    each row with ``f1_ci``: the 95% interval of its F1 by resampling streams,
    the nominal ``rate`` and the share really ``escalated``, and ``short`` when that falls
    more than one frame short of the rate (:func:`is_short`: not comparable at that rate).
    ``gaps`` names the policies that keep a cooldown (frames, :func:`top_fraction`);
    ``carry_lag`` carries answers under ``merge`` (:func:`evaluate_frames`). ``selections``
    gives the policies whose decisions depend on earlier ones by their masks at each rate
    (one per draw, :func:`edgewise_tools.evaluation.sequential.select`), not by scores.
    Also returns each policy's per-stream counts [S, 3] per rate, for :func:`differences`."""
    streams = [r.stream for r in records]
    index, n_streams = bootstrap.stream_ids(streams)
    w = bootstrap.weights(n_streams, samples)
    out: Dict[str, List[Dict[str, Any]]] = {}
    counts: Dict[str, List[np.ndarray]] = {}
    names = list(scores) + [k for k in (selections or {}) if k not in scores]
    for name in names:
        rows: List[Dict[str, Any]] = []
        per: List[np.ndarray] = []
        for rate in rates:
            gap = (gaps or {}).get(name, 0)
            masks = (list(selections[name][rate]) if selections and name in selections else
                     [top_fraction(v, rate, seed=i, streams=streams, gap=gap) for i, v in enumerate(scores[name])])
            runs = [evaluate_frames(records, m, nc, merge, mode, carry_lag) for m in masks]
            row: Dict[str, Any] = {k: float(np.mean([r[k] for r, _ in runs])) for k in runs[0][0]}
            c = np.mean([bootstrap.per_stream(f, index, n_streams) for _, f in runs], axis=0)
            row["rate"] = rate
            row["draws"] = len(masks)
            row["short"] = is_short(rate, row["escalated"], len(records))
            row["f1_ci"] = bootstrap.f1_interval(c, w)
            rows.append(row)
            per.append(c)
        out[name] = rows
        counts[name] = per
    return out, counts


def differences(counts: Mapping[str, List[np.ndarray]], ours: str, baselines: Sequence[str],
                rates: Sequence[float], samples: int = bootstrap.SAMPLES,
                rows: Optional[Mapping[str, List[Dict[str, Any]]]] = None) -> Dict[str, List[Dict[str, Any]]]:
    """Per baseline and rate: F1 of ``ours`` minus the baseline's, with its paired 95% interval
    (same resampled streams) and ``beats`` (the interval lies above 0). ``beats`` is None, not
    judged, with fewer than :data:`bootstrap.MIN_STREAMS` streams (so few understate the
    uncertainty of a lead) and where either side's row of :func:`at_rates` (``rows``) is ``short``:
    ``comparable`` False, the two escalated different shares."""
    if ours not in counts:
        return {}
    n_streams = len(counts[ours][0])
    w = bootstrap.weights(n_streams, samples)
    out: Dict[str, List[Dict[str, Any]]] = {}
    for b in baselines:
        if b not in counts:
            continue
        out[b] = []
        for i, rate in enumerate(rates):
            d: Dict[str, Any] = dict(bootstrap.difference(counts[ours][i], counts[b][i], w), rate=rate)
            d["comparable"] = not (rows and any(rows[k][i].get("short") for k in (ours, b) if k in rows))
            if not d["comparable"] or n_streams < bootstrap.MIN_STREAMS:
                d["beats"] = None
            out[b].append(d)
    return out


def run_policy(records: Sequence[FrameRecord], policy: Policy, fps: float, carry_lag: Optional[int] = 1) -> np.ndarray:
    """Replay the policy file on the stream timeline (frame / fps seconds): thresholds,
    cooldown, budget and priority all apply, exactly as in the daemon. A policy whose gain
    model reads the carry state gets it as the daemon computes it, from the answers its own
    escalations carry ``carry_lag`` frames later (:class:`CarryReplay`)."""
    esc = Escalator(policy, clock=lambda: 0.0)
    mask = np.zeros(len(records), dtype=bool)
    replay = views = None
    if policy.uses_carry():
        lag = carried_from(policy.spec.merge, carry_lag)
        cfg = policy.spec.merge.carry() if lag is not None else replace(policy.spec.merge.carry(), frames=0)
        replay, views = CarryReplay(records, lag or 1, cfg), FrameViews(records, policy)
    pick = mode_of(own_sending(policy, fps))
    whole = WholeFrames()
    for i, r in enumerate(records):
        signals = r.signals
        if replay is not None and views is not None:
            signals = views.features(records, i, replay, replay.at(i))
        d = esc.decide(stream_id(r.stream), r.frame, r.edge, signals, now=r.frame / fps)
        mask[i] = d.escalate
        if d.escalate and replay is not None:
            replay.escalate(i, pick(whole, r))
    return mask


def own_sending(policy: Policy, fps: float) -> Mode:
    """What the policy's escalations send: its payload mode, with its whole-frame refresh."""
    pl = policy.spec.payload
    return Sending(pl.mode, pl, fps) if pl.refreshes else pl.mode


def carried_from(merge: Merge, carry_lag: Optional[int]) -> Optional[int]:
    """The lag (frames) from which an answer is carried under ``merge``; None when the policy
    carries nothing (the daemon carries only what the policy asks), whatever lag was asked."""
    return carry_lag if merge.carry().enabled else None


def policy_run(records: Sequence[FrameRecord], policy: Policy, nc: int, fps: float,
               carry_lag: Optional[int] = 1) -> Dict[str, float]:
    """The metrics of the policy file as the daemon runs it: its decisions (:func:`run_policy`),
    its payload (:func:`own_sending`), its merge and, when it carries answers, its carrying
    from ``carry_lag`` frames after each escalation (None: nothing carried). ``records`` must hold the policy's
    payload mode (and ``full`` when it refreshes with whole frames)."""
    merge = policy.spec.merge
    return evaluate(records, run_policy(records, policy, fps, carry_lag), nc, merge, own_sending(policy, fps),
                    carried_from(merge, carry_lag))


def threshold_sweep(
    records: Sequence[FrameRecord], hardness: np.ndarray, thresholds: Sequence[float], nc: int,
    merge: Merge = REPLACE, mode: Mode = "full", carry_lag: Optional[int] = None,
) -> List[Dict[str, Any]]:
    """Escalate every frame with hardness >= t (no budget): the policy's threshold curve."""
    rows = []
    for t in thresholds:
        row: Dict[str, Any] = dict(evaluate(records, hardness >= t, nc, merge, mode, carry_lag))
        row["threshold"] = float(t)
        rows.append(row)
    return rows
