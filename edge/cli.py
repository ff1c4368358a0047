"""``edgewise edge run`` and ``edgewise edge check-policy``.

Thin layer over ``edge.settings.load_settings`` + ``edge.daemon.run_daemon`` and
``edgewise.policy`` (docs/design/conventions.md#thin-cli). Registered by the CLI dispatcher
(``edgewise.cli.COMMAND_MODULES``).
"""

from __future__ import annotations

import argparse
from typing import Any, List


def register(subparsers: Any) -> None:
    """Add ``run`` and ``check-policy`` to the ``edge`` group."""
    run = subparsers.add_parser(
        "run", help="run the edge daemon",
        description="Run the edge daemon. Settings: --config YAML, then EDGEWISE_EDGE_<PATH> env vars "
                    "(``__`` between levels), then --set/flag overrides.",
    )
    run.add_argument("--config", "-c", help="settings YAML (see edge/edge.example.yaml)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                     help="override one setting, e.g. --set streams.0.fps=5 (repeatable)")
    run.add_argument("--device-id", help="override device_id")
    run.add_argument("--policy", help="override policy_file")
    run.add_argument("--metrics-port", type=int, help="override metrics.port (0 = any, -1 = off)")
    run.add_argument("--jsonl", help="override sinks.jsonl")
    run.add_argument("--describe-settings", action="store_true", help="print every settings key and exit")
    run.set_defaults(func=_run)

    chk = subparsers.add_parser("check-policy", help="validate an escalation policy file and explain it")
    chk.add_argument("file", help="policy YAML (kind: EscalationPolicy)")
    chk.set_defaults(func=_check_policy)


def _run(args: argparse.Namespace) -> int:
    from edge.settings import describe, load_settings

    if args.describe_settings:
        print(describe())
        return 0
    overrides: List[str] = list(args.overrides)
    # Flags override only when given (sentinel merge, hypercorn's __main__).
    for flag, key in (("device_id", "device_id"), ("policy", "policy_file"),
                      ("metrics_port", "metrics.port"), ("jsonl", "sinks.jsonl")):
        v = getattr(args, flag)
        if v is not None:
            overrides.append(f"{key}={v}")
    settings = load_settings(args.config, overrides)
    from edge.daemon import run_daemon

    return run_daemon(settings)


def _check_policy(args: argparse.Namespace) -> int:
    from edgewise.policy.loading import load_policy

    policy = load_policy(args.file)  # ConfigError: one line "edgewise: error: ...", exit 2
    from edgewise.policy import explain, warnings

    print(explain(policy))
    for w in warnings(policy):
        print(f"warning: {w}")
    return 0
