"""The carry-aware gain model: what escalating a frame adds to what its stream carries.

Once answers are carried, a frame's worth depends on the stream's state: escalating it
changes its own boxes and, through the carried answer, the boxes of the frames after it,
up to the stream's next escalation (which replaces it). :func:`marginal_gains` measures
exactly that on labelled frames, under a reference selection that fixes the other
escalations: per frame, its carry-state features at that selection's state
(:class:`.sequential.FrameViews`) and the F1 gain, linearised
(:func:`.scoring.linear_gain`), of escalating it on top of the selection's earlier
escalations, summed over the frame and the frames it would carry into, the reference's later
escalations going on, until the stream carries the same either way (usually once the
reference's next escalation is answered; under ``carryScope: regions`` not outside its
regions) or ``carryFrames`` run out.

:func:`fit_carry_model` fits the gain model on those gains. The reference is first the
combined hardness at the target rate (with the cooldown), then the model's own selection
replayed on the training frames (:func:`.sequential.select`), so the states it learns from
are the ones it meets when it decides; a development study found the second round worth
2-4 points of cloud F1 at 15% (docs/design/escalation.md#carry-aware-gain-model).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from edgewise.carrying import CarryConfig
from edgewise.detections import Detections
from edgewise.hardness.learned import FEATURE_NAMES, GainModel, features_of
from edgewise.policy import Policy
from edgewise.policy.schema import Merge, WholeFrames
from edgewise_tools.evaluation import hybrid, scoring
from edgewise_tools.evaluation.carryreplay import CarryReplay
from edgewise_tools.evaluation.frames import FrameRecord
from edgewise_tools.evaluation.metrics import match_counts
from edgewise_tools.evaluation.sequential import CarryScores, FrameViews, ModeOf, select

#: rounds of fitting: the combined hardness's selection, then the model's own
ROUNDS = 2


def _counts(d: Detections, r: FrameRecord) -> np.ndarray:
    c = match_counts(d.boxes, d.class_ids, d.scores, r.gt_boxes, r.gt_cls)
    return np.array([c.tp, c.fp], np.float64)


def _stream_ends(records: Sequence[FrameRecord]) -> np.ndarray:
    """Per record, the position after its stream's last record."""
    out = np.zeros(len(records), int)
    end = len(records)
    for i in range(len(records) - 1, -1, -1):
        if i + 1 < len(records) and records[i + 1].stream != records[i].stream:
            end = i + 1
        out[i] = end
    return out


def marginal_gains(records: Sequence[FrameRecord], ref: np.ndarray, merge: Merge, mode_of: ModeOf, lag: int,
                   cfg: CarryConfig, views: FrameViews) -> Tuple[np.ndarray, np.ndarray]:
    """Each record's :data:`~edgewise.hardness.learned.FEATURE_NAMES` row at the carry state of
    selection ``ref`` and its marginal gain (see the module docstring)."""
    edge = np.array([_counts(r.edge, r) for r in records]).reshape(-1, 2)
    tp, fp = edge.sum(axis=0) if len(edge) else (0.0, 0.0)
    n = float(sum(len(r.gt_cls) for r in records))

    def gain(a: Detections, b: Detections, r: FrameRecord) -> float:
        d = _counts(a, r) - _counts(b, r)
        return scoring.linear_gain(d[0], d[1], tp, fp, n)

    ends = _stream_ends(records)
    sent, ahead = WholeFrames(), [""] * len(records)  # the payload mode of each reference escalation
    for i, r in enumerate(records):
        if ref[i]:
            ahead[i] = mode_of(sent, r)
    replay = CarryReplay(records, lag, cfg)
    whole = WholeFrames()
    rows, y = [], []
    for i, r in enumerate(records):
        now = hybrid.carried_at(replay, i)
        carried = now.boxes if now is not None and len(now.boxes) else None
        nb = len(r.edge)
        rows.append(features_of(views.features(records, i, replay, carried), nb,
                                float(r.edge.scores.max()) if nb else 0.0))
        trial = WholeFrames()
        trial.last = dict(whole.last)
        mode = mode_of(trial, r)
        g = gain(hybrid.final_boxes(r, True, merge, False, mode), hybrid.final_boxes(r, False, merge, False,
                                                                                    carried=now), r)
        without, with_i = replay.copy(), replay.copy()
        with_i.escalate(i, mode)
        # the reference's later escalations go on in both: a newer answer still on its way (lag
        # > 1) or covering only its regions (carryScope regions) leaves this one carried
        for k in range(i + 1, min(int(ends[i]), i + 1 + cfg.frames)):
            rk = records[k]
            a, b = hybrid.carried_at(with_i, k), hybrid.carried_at(without, k)
            if with_i.key() == without.key() and with_i.waiting == without.waiting:
                break  # this escalation changes nothing from here on
            if ref[k]:  # publishes its own answer either way
                with_i.escalate(k, ahead[k])
                without.escalate(k, ahead[k])
                continue
            g += gain(hybrid.final_boxes(rk, False, merge, False, carried=a),
                      hybrid.final_boxes(rk, False, merge, False, carried=b), rk)
        y.append(g)
        if ref[i]:
            replay.escalate(i, mode_of(whole, r))
    return np.asarray(rows, np.float64).reshape(-1, len(FEATURE_NAMES)), np.asarray(y, np.float64)


def fit_carry_model(records: Sequence[FrameRecord], policy: Policy, mode: hybrid.Mode, lag: Optional[int],
                    rate: float, gap: int, info: Optional[Mapping[str, Any]] = None,
                    rounds: int = ROUNDS) -> GainModel:
    """The carry-aware gain model fitted on labelled ``records`` (see the module docstring):
    ``mode`` is what escalations send, ``lag`` when answers are carried (None: never, the
    policy carries nothing), ``rate`` the share of frames the reference selections escalate
    with a cooldown of ``gap`` frames."""
    merge = policy.spec.merge
    cfg = merge.carry() if lag is not None else replace(merge.carry(), frames=0)
    lag = lag or 1
    mode_of = hybrid.mode_of(mode)
    views = FrameViews(records, policy)
    sig = policy.spec.signals
    streams = [r.stream for r in records]
    ref = hybrid.top_fraction(scoring.combined_scores(records, sig.weights, sig.combine), rate, seed=0,
                              streams=streams, gap=gap)
    meta = dict(info or {}, frames=len(records), merge=merge.strategy, mergeIou=merge.iou,
                payload=mode.mode if isinstance(mode, hybrid.Sending) else mode, carryLag=lag, rate=rate,
                cooldownFrames=gap, rounds=rounds)
    model = None
    for round_ in range(rounds):
        x, y = marginal_gains(records, ref, merge, mode_of, lag, cfg, views)
        model = GainModel.fit(x, y, meta, features=FEATURE_NAMES)
        if round_ + 1 < rounds:
            ref = select(records, CarryScores(records, policy, model), hybrid.budget(rate, len(records)), gap, lag,
                         cfg, mode_of)
    assert model is not None
    return model
