"""``run_eval``: collect both models' outputs, replay every policy, build the result."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from edgewise.errors import ConfigError, InvalidInputError
from edgewise.hardness.learned import GainModel
from edgewise.policy import Policy, load_policy
from edgewise.regions import COMPARED_MODES
from edgewise.runtime import Detector
from edgewise_tools.evaluation import bootstrap, hybrid, scoring
from edgewise_tools.evaluation.frames import (
    REFERENCE,
    FrameRecord,
    collect,
    fit_warnings,
    list_frames,
    stride_problem,
)
from edgewise_tools.evaluation.marginal import fit_carry_model
from edgewise_tools.evaluation.sequential import CarryScores, select
from edgewise_tools.provenance import dataset_meta, git_state, provenance

log = logging.getLogger(__name__)

#: our policies and the baselines they must beat at equal rate
OURS = ("combined", "learned", "learned_carry")
BASELINES = ("random", "sedna_threshold", "sedna_ibt")
DEFAULT_RATES = (0.02, 0.05, 0.10, 0.15, 0.20, 0.30, 0.50)
RANDOM_SEEDS = 5
#: the carry-aware gain model's file, beside the learned one's (``model_out``)
CARRY_MODEL = "gain-model-carry.json"


@dataclass
class EvalConfig:
    """Inputs of one evaluation.

    Attributes:
        edge, cloud: ONNX models (Ultralytics export format).
        policy: the escalation policy file (weights, bands, threshold, budget, merge, payload).
        data: held-out dataset folder (``edgewise synth --split test``).
        train_data: training-split folder for the learned gain predictor (optional:
            without it the learned policy is skipped and the report says so); never ``data``
            itself (:func:`check_train_data`).
        rates: escalation rates at which policies are compared; at least one <= ``target_rate``
            (the target is judged at the largest such rate, never above it).
        fps: frame rate of the streams (timeline for the policy's budget).
        target_rate, target_fraction, target_gap, target_uplink, target_margin: the goal:
            at most ``target_rate`` of frames escalated, our policy keeps >= ``target_fraction``
            of cloud-only F1, closes >= ``target_gap`` of the edge-to-cloud gap, saves >=
            ``target_uplink`` of the bytes of sending every frame whole at full resolution,
            and leads every baseline by >= ``target_margin`` of cloud-only F1 with the 95%
            interval of the lead above 0; ``target_edge_ratio``: the set must have a real gap,
            edge-only F1 and mAP@0.5 at most this share of cloud-only's.
        payloads: payload modes measured side by side (each costs a cloud pass per frame).
        payload: the mode every policy is compared in (default: the policy file's).
        cloud_input: ``auto`` (native for a model that asks for it), ``model`` or
            ``native`` (:class:`edgewise.runtime.Detector`).
        samples: bootstrap samples of the confidence intervals.
        limit: evaluate at most this many frames (quick runs).
        threads: ONNX Runtime intra-op threads per model.
        edge_imgsz, cloud_imgsz: the input size of a model that does not state it (a dynamic
            export without ``imgsz`` metadata) as (height, width); None: the model's own.
        model_out: where to write the learned policy's gain model (``signals.learnedModel``
            of a policy file); not written when None or without ``train_data``.
        ours: the policy declared ours before the test set is looked at (``combined`` or
            ``learned``); None: the learned one when it was fitted, else the combined hardness.
        carry_lag: with the policy's ``merge.carryFrames`` > 0, an escalated frame's answer is
            carried (:mod:`edgewise.carrying`) from this many frames after it: 1, it is back
            before the next frame (at ``fps`` 10, within 100 ms); each more frame is one more
            frame interval of cloud round trip. None: no answer is carried.
        reference_quality: the JPEG quality of the reference, every frame whole at full
            resolution, which cloud-only F1 and the uplink saved are taken against; None: the
            policy's ``jpegQuality`` (a policy at a lower quality then shrinks its own
            reference; name the quality of the setting it replaces to compare the two).
    """

    edge: Path
    cloud: Path
    policy: Path
    data: Path
    train_data: Optional[Path] = None
    rates: Sequence[float] = DEFAULT_RATES
    fps: float = 10.0
    target_rate: float = 0.15
    target_fraction: float = 0.95
    target_gap: float = 0.70
    target_uplink: float = 0.90
    target_margin: float = 0.03
    target_edge_ratio: float = 0.85
    payloads: Sequence[str] = COMPARED_MODES
    payload: Optional[str] = None
    cloud_input: str = "auto"
    samples: int = bootstrap.SAMPLES
    limit: Optional[int] = None
    threads: Optional[int] = None
    edge_imgsz: Optional[Tuple[int, int]] = None
    cloud_imgsz: Optional[Tuple[int, int]] = None
    model_out: Optional[Path] = None
    carry_lag: Optional[int] = 1
    ours: Optional[str] = None
    reference_quality: Optional[int] = None


def _collect(cfg: EvalConfig, data: Path, edge: Detector, cloud: Detector, policy: Policy,
             modes: Sequence[str], reference: bool = True) -> List[FrameRecord]:
    """:func:`collect` over ``data``; ``reference`` False: at the policy's quality alone (the
    training frames: the learned policies are fitted on what escalating sends, never on the
    reference, which at a quality of its own would cost a cloud pass per frame for nothing)."""
    def progress(i: int, n: int) -> None:
        if i % 50 == 0 or i == n:
            log.info("%s: %d/%d frames", data, i, n)

    return collect(data, edge, cloud, policy, modes, cfg.limit, progress,
                   cfg.reference_quality if reference else None)


def check_config(cfg: EvalConfig) -> None:
    """What :func:`run_eval` refuses before a model runs (ConfigError naming the options): an
    undeclarable ``--ours``, a target rate below every compared rate (it would be judged at a
    higher rate than it allows), a ``--data`` or ``--train-data`` folder without its frames
    (:func:`~edgewise_tools.evaluation.frames.list_frames`: else the evaluated set's models ran
    for minutes before a mistyped training folder was noticed), and training data that is the
    evaluated set itself."""
    if cfg.ours is not None and (cfg.ours not in OURS or (cfg.ours != "combined" and cfg.train_data is None)):
        raise ConfigError(f"--ours {cfg.ours}: declare one of {', '.join(OURS)} (the learned ones need --train-data)")
    if cfg.reference_quality is not None and not 1 <= cfg.reference_quality <= 100:
        raise ConfigError(f"--reference-quality {cfg.reference_quality}: a JPEG quality is 1..100")
    if not any(r <= cfg.target_rate + 1e-9 for r in cfg.rates):
        shown = ",".join(f"{r:g}" for r in cfg.rates)
        raise ConfigError(f"--rates {shown}: none is <= --target-rate {cfg.target_rate:g}, so the target (at most "
                          f"{cfg.target_rate:.1%} of frames escalated) cannot be judged; add {cfg.target_rate:g} "
                          "to --rates or raise --target-rate")
    for folder in (cfg.data, cfg.train_data):
        if folder is not None:
            list_frames(Path(folder))
    strided = stride_problem(Path(cfg.data))
    if strided:
        raise InvalidInputError(f"--data {cfg.data}: {strided}; evaluate a set written with "
                                "`edgewise synth --stride 1`")
    if cfg.train_data is not None:
        check_train_data(Path(cfg.data), Path(cfg.train_data))
        strided = stride_problem(Path(cfg.train_data))
        if strided:
            log.warning("--train-data %s: %s; the learned policy is fitted on them anyway, but it decides on "
                        "consecutive frames: a set written with `edgewise synth --stride 1` fits it to them",
                        cfg.train_data, strided)


def check_train_data(data: Path, train: Path) -> None:
    """``--train-data`` is not ``--data``: not the same folder, nor (by their ``dataset.json``)
    the same generated set (same preset, split and seed). A learned policy fitted on the frames
    it is judged on would be judged on what it memorised."""
    if data.resolve() == train.resolve():
        raise ConfigError(f"--train-data {train} is the --data folder {data}: the learned policy would be fitted on "
                          "the frames it is judged on; give it a training split of other frames "
                          "(`edgewise synth --split train` with another seed)")
    a, b = dataset_meta(data), dataset_meta(train)
    same = ("preset", "split", "seed")  # a preset neither names (a library-made set) counts as the same
    if all(k in a and k in b for k in ("split", "seed")) and all(a.get(k) == b.get(k) for k in same):
        desc = ", ".join(f"{k} {a[k]}" for k in same if k in a)
        raise ConfigError(f"--train-data {train} and --data {data} are the same generated set ({desc} in both "
                          "dataset.json): the learned policy would be fitted on the frames it is judged on; "
                          "generate the training set with `edgewise synth --split train` and another seed")


def run_eval(cfg: EvalConfig) -> Dict[str, Any]:
    check_config(cfg)
    state = git_state()  # before the run writes its gain model (into the tree, for the shipped pair)
    policy = load_policy(cfg.policy)
    mode = cfg.payload or policy.spec.payload.mode
    modes = list(dict.fromkeys(["full", *cfg.payloads, mode, policy.spec.payload.mode]))
    edge = Detector.from_file(cfg.edge, threads=cfg.threads, source="edge", imgsz=cfg.edge_imgsz)
    cloud = Detector.from_file(cfg.cloud, threads=cfg.threads, source="cloud", input_size=cfg.cloud_input,
                               imgsz=cfg.cloud_imgsz)
    nc = len(edge.names)
    for warning in fit_warnings(policy, Path(cfg.data), edge.names, str(cfg.edge)):
        log.warning("%s", warning)
    records = _collect(cfg, Path(cfg.data), edge, cloud, policy, modes)
    n = len(records)
    merge = policy.spec.merge
    sig = policy.spec.signals
    hardness = scoring.combined_scores(records, sig.weights, sig.combine)
    scores: Dict[str, List[np.ndarray]] = {
        "random": [scoring.random_scores(records, seed) for seed in range(RANDOM_SEEDS)],
        # a policy whose scores tie is averaged over as many tie-break draws as random over seeds
        "sedna_threshold": scoring.tie_draws(scoring.sedna_threshold_scores(records), RANDOM_SEEDS),
        "sedna_ibt": scoring.tie_draws(scoring.sedna_ibt_scores(records), RANDOM_SEEDS),
        "combined": scoring.tie_draws(hardness, RANDOM_SEEDS),
    }
    # the policy's whole-frame refresh goes with its own payload mode
    pl = policy.spec.payload
    sending = hybrid.own_sending(policy, cfg.fps) if mode == pl.mode else mode
    carry = merge.carry()
    lag = hybrid.carried_from(merge, cfg.carry_lag)
    # Every row keeps the policy file's cooldown (in frames at ``fps``): it is the deployment's
    # setting, not part of a frame score, and once answers are carried it spends a budget well, so a
    # baseline without it was compared with one chance less, and an oracle without it understated
    # what a better score could reach (it spent its budget on neighbouring frames).
    gap = int(math.ceil(policy.spec.cooldown_seconds * cfg.fps - 1e-9))
    learned: Dict[str, Any] = {"trained": False}
    selections: Dict[str, Dict[float, List[np.ndarray]]] = {}
    if cfg.train_data is not None:
        train = _collect(cfg, Path(cfg.train_data), edge, cloud, policy, [mode], reference=False)
        model = scoring.fit_gain_model(train, merge, info={"trainData": str(cfg.train_data)}, mode=mode)
        scores["learned"] = scoring.tie_draws(model.predict(scoring.features(records)), RANDOM_SEEDS)
        learned = {"trained": True, "train_frames": len(train), "importance": model.importance()}
        if cfg.model_out is not None:
            learned["file"] = str(model.save(cfg.model_out))
        # fitted on the payload mode alone, like the learned one: the training frames are collected
        # in that mode only (the whole-frame refresh would need the whole frames too)
        carry_model = fit_carry_model(train, policy, mode, lag, cfg.target_rate, gap,
                                      info={"trainData": str(cfg.train_data)})
        selections["learned_carry"] = _carry_selections(records, policy, carry_model, cfg.rates, gap, lag, sending)
        learned["carry"] = {"importance": carry_model.importance(), "rounds": carry_model.info.get("rounds")}
        if cfg.model_out is not None:
            learned["carry"]["file"] = str(carry_model.save(Path(cfg.model_out).with_name(CARRY_MODEL)))
    else:
        learned["why"] = "no --train-data given"
    scores[scoring.ORACLE] = scoring.tie_draws(scoring.f1_gain(records, merge, mode), RANDOM_SEEDS)
    gaps = {k: gap for k in scores}
    streams = [r.stream for r in records]
    index, n_streams = bootstrap.stream_ids(streams)
    w = bootstrap.weights(n_streams, cfg.samples)
    base: Dict[str, Dict[str, Any]] = {}
    for k, (metrics, per_frame) in (("edge_only", hybrid.evaluate_frames(records, np.zeros(n, bool), nc, merge)),
                                    ("cloud_only", hybrid.cloud_only(records, nc, REFERENCE))):
        base[k] = metrics
        base[k]["f1_ci"] = bootstrap.f1_interval(bootstrap.per_stream(per_frame, index, n_streams), w)
    rates, counts = hybrid.at_rates(records, scores, cfg.rates, nc, merge, sending, cfg.samples, lag, gaps,
                                    selections)
    ours = cfg.ours or ("learned" if "learned" in scores else "combined")
    diffs = hybrid.differences(counts, ours, BASELINES, cfg.rates, cfg.samples, rows=rates)
    thresholds = [round(float(t), 3) for t in np.linspace(0.0, 1.0, 21)]
    sweep = hybrid.threshold_sweep(records, hardness, thresholds, nc, merge, sending, lag)
    at = _judged_index(cfg.rates, cfg.target_rate)
    # the same draws as its row of at_rates
    our_masks = (selections[ours][cfg.rates[at]] if ours in selections else
                 [hybrid.top_fraction(v, cfg.rates[at], seed=i, streams=streams, gap=gaps.get(ours, 0))
                  for i, v in enumerate(scores[ours])])
    payloads = {m: {"cloud_only": hybrid.cloud_only(records, nc, m)[0],
                    "at_target_rate": hybrid.evaluate_draws(records, our_masks, nc, merge, m, lag)}
                for m in modes}
    if isinstance(sending, hybrid.Sending):  # the policy's mode with its refresh, beside the pure modes
        payloads[f"{mode}+whole"] = {
            "cloud_only": hybrid.cloud_only(records, nc, sending)[0],
            "at_target_rate": hybrid.evaluate_draws(records, our_masks, nc, merge, sending, lag)}
    carrying = {"frames": carry.frames, "min_match": carry.min_match, "scope": carry.scope, "lag_frames": lag,
                "cooldown_frames": gap,
                "ours_at_target_rate": hybrid.evaluate_draws(records, our_masks, nc, merge, sending, lag),
                "ours_without_carry": hybrid.evaluate_draws(records, our_masks, nc, merge, sending),
                # a 30-frame evaluation stream starts with nothing carried every 3 s, a live feed rarely:
                # the share of each selection spent on a stream's first frame says how much a lead owes it
                "first_frame_share": {
                    "ours": _first_frame_share(records, our_masks),
                    "random": _first_frame_share(records, [
                        hybrid.top_fraction(v, cfg.rates[at], seed=i, streams=streams, gap=gap)
                        for i, v in enumerate(scores["random"])])}}
    data_meta = {"test": cfg.data, **({"policy_fit": cfg.train_data} if cfg.train_data else {})}
    return {
        "provenance": provenance({"edge": cfg.edge, "cloud": cfg.cloud}, cfg.policy, data_meta, state,
                                 cloud_input=cloud.input_size),
        "data": str(cfg.data), "frames": n, "streams": n_streams, "edge_model": str(cfg.edge),
        "cloud_model": str(cfg.cloud), "policy": str(cfg.policy), "merge": merge.strategy, "payload": mode,
        "whole_frame_every_s": pl.whole_frame_every_s if isinstance(sending, hybrid.Sending) else 0.0,
        "ours": ours, "bootstrap": {"samples": cfg.samples, "seed": bootstrap.SEED, "unit": "stream"},
        "uplink_all_frames_bytes": int(sum(r.jpeg_bytes for r in records)),
        "reference_quality": pl.jpeg_quality if cfg.reference_quality is None else cfg.reference_quality,
        "payload_quality": pl.jpeg_quality,
        # every frame whole at the payload's own quality (the reference's bytes when they are one quality)
        "uplink_all_frames_bytes_at_payload_quality": int(sum(r.sent("full").nbytes for r in records)),
        "baselines": base,
        "payloads": payloads,
        "policy_run": hybrid.policy_run(records, policy, nc, cfg.fps, cfg.carry_lag),
        "carry": carrying,
        "at_rates": rates,
        "differences": diffs,
        "threshold_sweep": sweep,
        "learned": learned,
        "target": judge_target(base, rates, cfg.rates, cfg.target_rate, cfg.target_fraction, diffs=diffs,
                               ours=ours, gap=cfg.target_gap, uplink=cfg.target_uplink, margin=cfg.target_margin,
                               edge_ratio=cfg.target_edge_ratio),
    }


def _first_frame_share(records: Sequence[FrameRecord], masks: Sequence[np.ndarray]) -> float:
    """The share of the escalations of ``masks`` (averaged over draws) that are a stream's first frame."""
    first = np.array([i == 0 or r.stream != records[i - 1].stream for i, r in enumerate(records)])
    shares = [float((m & first).sum()) / max(int(m.sum()), 1) for m in masks]
    return float(np.mean(shares)) if shares else 0.0


def _carry_selections(records: Sequence[FrameRecord], policy: Policy, model: GainModel, rates: Sequence[float],
                      gap: int, lag: Optional[int], sending: hybrid.Mode) -> Dict[float, List[np.ndarray]]:
    """The carry-aware model's selections at each rate, one per draw, replayed frame by frame
    (:func:`.sequential.select`: it decides on the state its earlier decisions left)."""
    score = CarryScores(records, policy, model)
    cfg = policy.spec.merge.carry() if lag is not None else replace(policy.spec.merge.carry(), frames=0)
    return {rate: [select(records, score, hybrid.budget(rate, len(records)), gap, lag or 1, cfg,
                          hybrid.mode_of(sending), seed=i) for i in range(RANDOM_SEEDS)] for rate in rates}


def _judged_index(compared: Sequence[float], max_rate: float) -> int:
    """The largest compared rate within ``max_rate``; ValueError when none is (:func:`check_config`
    refuses such options first): judging at a higher rate would credit the target with more
    escalations than it allows."""
    within = [i for i, r in enumerate(compared) if r <= max_rate + 1e-9]
    if not within:
        raise ValueError(f"no compared rate ({', '.join(f'{r:g}' for r in compared)}) is <= the target rate "
                         f"{max_rate:g}: the target cannot be judged")
    return within[-1]


def judge_target(base: Dict[str, Any], rates: Dict[str, List[Dict[str, Any]]], compared: Sequence[float],
                 max_rate: float, fraction: float, diffs: Optional[Dict[str, List[Dict[str, Any]]]] = None,
                 ours: Optional[str] = None, gap: Optional[float] = None, uplink: Optional[float] = None,
                 margin: Optional[float] = None, edge_ratio: Optional[float] = None) -> Dict[str, Any]:
    """The verdict on the target at the largest compared rate within ``max_rate``.

    Parts (each None when it cannot be judged from what was given): ``edge_gap_met``, the
    set has a real gap (edge-only F1 and mAP@0.5 at most ``edge_ratio`` of cloud-only's);
    ``fraction_met``, our
    policy keeps >= ``fraction`` of cloud-only F1; ``gap_met``, it closes >= ``gap`` of the
    edge-to-cloud F1 gap; ``uplink_met``, it saves >= ``uplink`` of the bytes of sending
    every frame whole; ``margins_met``, it leads each baseline by >= ``margin`` of cloud-only
    F1 with the bootstrap interval of the lead above 0 (``diffs``). ``met`` is every part
    that could be judged, and never when a lead was asked for and could not be judged (it
    cannot be claimed). ``ours`` is the policy declared before looking at the test set (the
    learned one when it was fitted, else the combined hardness); without it, our better
    policy at that rate. ``best_policy`` is the best of all (baselines too), for the report,
    among the rows really at that rate (a row ``short`` of it, :func:`hybrid.is_short`, only
    when none is). ``ours_escalated`` is the share our policy really escalated there.
    When the cloud model is not more accurate than the edge model, escalation has nothing to
    add and the target is reported as not met (``cloud_better: false``), never as trivially met.
    ``ours_minus_baselines`` gives, per baseline, our F1 minus the baseline's at that rate (the
    ``diff`` of ``diffs``, the lead its interval is of, when given);
    ``ours_beat_baselines`` whether every lead is positive (and its interval above 0 when
    intervals were given). Leads are not judged (``margins_met`` and ``ours_beat_baselines``
    None, ``margins_why`` says why) where our row or a baseline's is ``short`` (unequal
    budgets) or an interval was not judged (``diffs`` ``beats`` None: too few streams).
    Fractions of cloud-only F1 are None when cloud-only F1 is 0.
    """
    edge_f1, cloud_f1 = base["edge_only"]["f1"], base["cloud_only"]["f1"]
    at = _judged_index(compared, max_rate)
    policies = [k for k in rates if k != scoring.ORACLE]
    # a row that escalated less than its rate (a cooldown's cap, hybrid.is_short) is not at that rate
    at_rate = [k for k in policies if not rates[k][at].get("short")] or policies
    best = max(at_rate, key=lambda k: rates[k][at]["f1"])
    mine = [k for k in OURS if k in rates]
    if ours is None or ours not in rates:
        ours = max(mine, key=lambda k: rates[k][at]["f1"]) if mine else best
    our = rates[ours][at]
    gap_f1 = cloud_f1 - edge_f1
    frac = our["f1"] / cloud_f1 if cloud_f1 > 0 else None
    closed = (our["f1"] - edge_f1) / gap_f1 if gap_f1 > 0 else None
    # with intervals, each lead is the difference table's (the estimate its interval is of: for random, averaged
    # over seeds, the F1 of the seeds' mean counts, not the mean of their F1s that its row shows)
    margins = {b: (diffs[b][at]["diff"] if diffs and b in diffs and "diff" in diffs[b][at]
                   else our["f1"] - rates[b][at]["f1"]) for b in BASELINES if b in rates and b != ours}
    beats: Dict[str, Optional[bool]] = {
        b: (None if diffs[b][at]["beats"] is None else bool(diffs[b][at]["beats"]))
        for b in margins if diffs and b in diffs}
    why: Optional[str] = None  # why the leads are not judged
    short = [k for k in (ours, *margins) if rates[k][at].get("short")]
    if short:
        k = short[0]
        why = (f"not comparable: the cooldown allows at most {rates[k][at]['escalated']:.1%} of frames escalated, "
               f"not {compared[at]:.1%}" if k in OURS else
               f"not comparable: {k} escalates only {rates[k][at]['escalated']:.1%} of frames, not {compared[at]:.1%}")
    elif cloud_f1 <= 0:
        why = "not judged: cloud-only F1 is 0, so a lead has no points of it"
    elif any(v is None for v in beats.values()):
        why = (f"not judged: fewer than {bootstrap.MIN_STREAMS} streams, whose resampling understates the "
               "uncertainty of a lead (its interval would lie above 0 by chance far more often than 2.5%)")
    edge_f1_ratio = edge_f1 / cloud_f1 if cloud_f1 > 0 else None
    edge_map_ratio = (base["edge_only"]["map50"] / base["cloud_only"]["map50"]
                      if "map50" in base["edge_only"] and base["cloud_only"].get("map50") else None)
    parts: Dict[str, Optional[bool]] = {
        "edge_gap_met": (None if edge_ratio is None or edge_f1_ratio is None else
                         bool(edge_f1_ratio <= edge_ratio and (edge_map_ratio is None or edge_map_ratio <= edge_ratio))),
        "fraction_met": bool(gap_f1 > 0 and frac is not None and frac >= fraction),
        "gap_met": None if gap is None else bool(closed is not None and closed >= gap),
        "uplink_met": (None if uplink is None or "uplink_saved" not in our
                       else bool(our["uplink_saved"] >= uplink)),
        "margins_met": (None if margin is None or not margins or why is not None else
                        bool(all(m >= margin * cloud_f1 for m in margins.values())
                             and (not diffs or all(beats.get(b, False) for b in margins)))),
    }
    return {
        "max_rate": max_rate, "f1_fraction": fraction, "gap_target": gap, "uplink_target": uplink,
        "edge_ratio_target": edge_ratio, "edge_f1_ratio": edge_f1_ratio, "edge_map50_ratio": edge_map_ratio,
        "margin_target": margin, "compared_at_rate": compared[at], "ours_escalated": our.get("escalated"),
        "ours": ours, "best_policy": best,
        "ours_f1_fraction": frac, "best_f1_fraction": rates[best][at]["f1"] / cloud_f1 if cloud_f1 > 0 else None,
        "cloud_better": bool(gap_f1 > 0), "ours_uplink_saved": our.get("uplink_saved"),
        "ours_minus_baselines": margins, "ours_beat_baselines_ci": beats, "margins_why": why,
        "ours_beat_baselines": (None if why is not None else
                                bool(margins) and all(m > 0 for m in margins.values())
                                and all(beats.get(b, True) for b in margins)),
        "oracle_f1_fraction": (rates[scoring.ORACLE][at]["f1"] / cloud_f1
                               if scoring.ORACLE in rates and cloud_f1 > 0 else None),
        "gap_closed": closed,
        **parts,
        # a lead asked for but not judgeable (unequal budgets, too few streams) is not met: it cannot be claimed
        "met": (bool(gap_f1 > 0) and all(v for v in parts.values() if v is not None)
                and not (margin is not None and margins and why is not None)),
    }
