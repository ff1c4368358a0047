"""`edgewise eval`: the hybrid's accuracy for its share of escalated frames, offline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List

from edgewise.errors import ConfigError
from edgewise.outputs import check_output_folder
from edgewise.regions import COMPARED_MODES, MODES
from edgewise.runtime.detector import INPUT_SIZES
from edgewise.runtime.metadata import imgsz_problem, setting_imgsz
from edgewise_tools.evaluation.bootstrap import MAX_SAMPLES, MIN_SAMPLES
from edgewise_tools.options import RULES, check_option


def _check_options(args: argparse.Namespace) -> None:
    check_option("--fps", args.fps, "> 0", "the streams' frame rate")
    check_option("--samples", args.samples, f">= {MIN_SAMPLES}",
                 "bootstrap samples per interval: its ends are their 2.5th and 97.5th percentiles, which fewer "
                 f"than {MIN_SAMPLES} cannot place")
    check_option("--samples", args.samples, f"<= {MAX_SAMPLES}",
                 "bootstrap samples per interval: their draws take samples x streams numbers in memory, and more "
                 "than that moves no interval's ends")
    check_option("--limit", args.limit, ">= 1", "the number of frames to evaluate; leave it out for all")
    check_option("--carry-lag", args.carry_lag, ">= 0", "frames after an escalation; 0 carries nothing")
    check_option("--target-rate", args.target_rate, "in (0, 1]", "a share of the frames")
    for flag, value in (("--target-fraction", args.target_fraction), ("--target-gap", args.target_gap),
                        ("--target-edge-ratio", args.target_edge_ratio)):
        check_option(flag, value, ">= 0", "a share")
    check_option("--target-uplink", args.target_uplink, "in [0, 1]", "a share of the uplink bytes")
    check_option("--target-margin", args.target_margin, ">= 0", "a share of cloud-only F1")
    for flag, value in (("--edge-imgsz", args.edge_imgsz), ("--cloud-imgsz", args.cloud_imgsz)):
        problem = imgsz_problem(value)  # the rule of the edge's model.imgsz and the worker's --imgsz
        if problem:
            raise ConfigError(f"{flag} {problem}")


def _rates(text: str) -> List[float]:
    try:
        rates = sorted(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates {text!r}: comma-separated fractions like 0.05,0.1") from None
    if not rates or not all(RULES["in (0, 1]"](r) for r in rates):
        raise argparse.ArgumentTypeError(f"--rates {text!r}: each rate must be in (0, 1]")
    twice = sorted({r for r in rates if rates.count(r) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"--rates {text!r}: {', '.join(f'{r:g}' for r in twice)} given twice "
                                         "(each rate is a column of the tables): give each once")
    return rates


def _modes(text: str) -> List[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"--payloads {text!r}: comma-separated modes among {', '.join(MODES)}")
    return modes


#: the learned policy's file in the report folder (with --train-data)
GAIN_MODEL = "gain-model.json"


def _handler(args: argparse.Namespace) -> int:
    from edgewise_tools.evaluation import report
    from edgewise_tools.evaluation.evaluating import CARRY_MODEL, EvalConfig, run_eval

    _check_options(args)
    for flag, p in (("--edge", args.edge), ("--cloud", args.cloud), ("--policy", args.policy)):
        if not Path(p).is_file():
            raise ConfigError(f"{flag} {p}: file not found")
    check_output_folder(args.out, "--out", report.FILES + ((GAIN_MODEL, CARRY_MODEL) if args.train_data else ()))
    cfg = EvalConfig(
        edge=Path(args.edge), cloud=Path(args.cloud), policy=Path(args.policy), data=Path(args.data),
        train_data=Path(args.train_data) if args.train_data else None, rates=args.rates,
        fps=args.fps, limit=args.limit, threads=args.threads, edge_imgsz=setting_imgsz(args.edge_imgsz),
        cloud_imgsz=setting_imgsz(args.cloud_imgsz), model_out=Path(args.out) / GAIN_MODEL,
        payloads=args.payloads, payload=args.payload, cloud_input=args.cloud_input, samples=args.samples,
        target_rate=args.target_rate, target_fraction=args.target_fraction, target_gap=args.target_gap,
        target_uplink=args.target_uplink, target_margin=args.target_margin, target_edge_ratio=args.target_edge_ratio,
        carry_lag=args.carry_lag or None, ours=args.ours, reference_quality=args.reference_quality,
    )
    result = run_eval(cfg)
    paths = report.write(result, Path(args.out))
    print(report.markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths))
    if report.pyplot() is None:
        print(f"no {report.FILES[2]}: {report.NO_MATPLOTLIB}", file=sys.stderr)
    earlier = [] if args.train_data else [p for p in (Path(args.out) / GAIN_MODEL, Path(args.out) / CARRY_MODEL)
                                          if p.exists()]
    if earlier:  # beside this run's report, as if this run had fitted them: left (a policy may name them)
        print(f"note: {' and '.join(str(p) for p in earlier)} {'are' if len(earlier) > 1 else 'is'} from an earlier "
              "run into this folder: this one fitted no gain model (no --train-data), and its report says "
              "nothing of it", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the top-level ``eval`` command."""
    p = subparsers.add_parser("eval", help="measure edge-only, cloud-only and hybrid accuracy offline")
    p.add_argument("--edge", required=True, help="edge model ONNX (e.g. models/edge-int8.onnx)")
    p.add_argument("--cloud", required=True, help="cloud model ONNX")
    p.add_argument("--policy", required=True, help="escalation policy YAML")
    p.add_argument("--data", required=True, help="held-out dataset folder (edgewise synth --split test)")
    p.add_argument("--train-data", default=None, help="labelled training-split folder: fits the learned policy and writes it to "
                   "OUT/gain-model.json (a policy uses it with signals.learnedModel)")
    p.add_argument("--out", default="eval-report", help="output folder for eval.json/.md/.png (default %(default)s)")
    p.add_argument("--rates", type=_rates, default=[0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5],
                   help="escalation rates to compare policies at, comma-separated (default %(default)s)")
    p.add_argument("--fps", type=float, default=10.0, help="stream frame rate for the policy's budget timeline (default %(default)s)")
    p.add_argument("--payloads", type=_modes, default=list(COMPARED_MODES),
                   help=f"payload modes measured side by side (default {','.join(COMPARED_MODES)}; "
                        f"any of {', '.join(MODES)}); each costs one cloud pass per frame")
    p.add_argument("--payload", choices=MODES, default=None,
                   help="payload mode the policies are compared in (default: the policy file's)")
    p.add_argument("--cloud-input", choices=INPUT_SIZES, default="auto",
                   help="cloud model input size: auto = native for a model that asks for it (metadata "
                        "input_size: native, as the camera pair's cloud model; default %(default)s)")
    p.add_argument("--samples", type=int, default=1000,
                   help=f"bootstrap samples (streams resampled) per interval, {MIN_SAMPLES} to {MAX_SAMPLES} (1000)")
    p.add_argument("--target-rate", type=float, default=0.15, help="most frames escalated (0.15)")
    p.add_argument("--target-fraction", type=float, default=0.95, help="least share of cloud-only F1 kept (0.95)")
    p.add_argument("--target-gap", type=float, default=0.70, help="least share of the edge-to-cloud gap closed (0.7)")
    p.add_argument("--target-uplink", type=float, default=0.90,
                   help="least share of uplink bytes saved against every frame whole at full resolution (0.9)")
    p.add_argument("--target-edge-ratio", type=float, default=0.85,
                   help="the set must have a real gap: edge-only F1 and mAP at most this share of cloud-only's (0.85)")
    p.add_argument("--target-margin", type=float, default=0.03,
                   help="least lead over each baseline, as a share of cloud-only F1, with its interval above 0 (0.03)")
    p.add_argument("--ours", choices=("combined", "learned", "learned_carry"), default=None,
                   help="the policy declared ours, judged against the target (default: learned when "
                        "--train-data fits it, else combined)")
    p.add_argument("--carry-lag", type=int, default=1,
                   help="frames after an escalated frame from which the edge carries its answer (the policy's "
                        "merge.carryFrames, default %(default)s): 1, back before the next frame; 0: carry nothing")
    p.add_argument("--reference-quality", type=int, default=None, metavar="Q",
                   help="JPEG quality of the reference, every frame whole at full resolution, that cloud-only F1 "
                        "and the uplink saved are taken against (default: the policy's jpegQuality); name the "
                        "quality of the setting a lower-quality policy replaces to compare the two")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N frames")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads per model")
    p.add_argument("--edge-imgsz", default="0", metavar="N|H,W",
                   help="input size of an edge model that does not state it (a dynamic export without imgsz "
                        "metadata): 640 (square) or 384,640 (height, width); 0: the model's own")
    p.add_argument("--cloud-imgsz", default="0", metavar="N|H,W", help="the same for the cloud model")
    p.set_defaults(func=_handler)
