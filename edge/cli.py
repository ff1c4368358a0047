"""``edgewise edge run``, ``edgewise edge check-config`` and ``edgewise edge check-policy``.

Thin layer over ``edge.settings`` (through :mod:`edgewise.settings`: ``--config``,
``--set``, ``--describe-settings`` and the named flags) + ``edge.daemon.run_daemon``
and ``edgewise.policy`` (docs/design/conventions.md#thin-cli). Registered by the CLI dispatcher
(``edgewise.cli.COMMAND_MODULES``).
"""

from __future__ import annotations

import argparse
from typing import Any

from edge.settings import SCHEMA
from edgewise.settings import add_settings_arguments, settings_from_args


def register(subparsers: Any) -> None:
    """Add ``run`` and ``check-policy`` to the ``edge`` group."""
    run = subparsers.add_parser(
        "run", help="run the edge daemon",
        description="Run the edge daemon. Settings, later wins: --config YAML < EDGEWISE_EDGE__<KEY>__<SUBKEY> "
                    "environment variables < --set KEY.PATH=VALUE < the named flags.",
    )
    add_settings_arguments(run, SCHEMA)
    run.set_defaults(func=_run)

    cfg = subparsers.add_parser(
        "check-config", help="check the daemon's settings before starting it (exit 2 with what to fix)",
        description="Everything `edge run` checks before it starts, without starting: the settings "
                    "(placeholders included), the device id, writable state folders, the model and its "
                    "backend, the policy file.")
    add_settings_arguments(cfg, SCHEMA)
    cfg.set_defaults(func=_check_config)

    chk = subparsers.add_parser("check-policy", help="validate an escalation policy file and explain it")
    chk.add_argument("file", help="policy YAML (kind: EscalationPolicy)")
    chk.set_defaults(func=_check_policy)


def _run(args: argparse.Namespace) -> int:
    from edge.daemon import run_daemon
    return run_daemon(settings_from_args(args, SCHEMA))


def _check_config(args: argparse.Namespace) -> int:
    """Exit 0 with a summary, or raise the first problem as one line (exit 2)."""
    from edge.preflight import check_backend, preflight
    from edgewise.runtime.metadata import load_model_info

    s = settings_from_args(args, SCHEMA)
    lines = preflight(s, create=False)  # run by root (postinst): never make folders the daemon cannot use
    info = load_model_info(s.model.path, s.model.imgsz or None)
    lines.append(f"model {info.path} ({info.precision}, {info.imgsz[0]}x{info.imgsz[1]}) on {check_backend(s)}")
    if s.policy_file:
        from edgewise.policy.loading import load_policy

        load_policy(s.policy_file)
        lines.append(f"policy {s.policy_file}")
    lines.append(f"cloud {', '.join(s.cloud.endpoints) or '(no gRPC endpoint)'}"
                 + (f", MQTT {s.cloud.mqtt.host}:{s.cloud.mqtt.port}" if s.cloud.mqtt.host else ""))
    print(f"{args.config or 'settings'}: ok: " + "; ".join(lines))
    return 0


def _check_policy(args: argparse.Namespace) -> int:
    """Explain a valid policy (exit 0); an invalid one raises ConfigError (exit 2, like every
    other configuration error)."""
    from edgewise.policy import explain, warnings
    from edgewise.policy.loading import load_policy

    policy = load_policy(args.file)
    print(explain(policy))
    for w in warnings(policy):
        print(f"warning: {w}")
    return 0
