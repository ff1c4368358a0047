"""``edgewise edge run``, ``check-config``, ``health`` and ``check-policy``.

Thin layer over ``edge.settings`` (through :mod:`edgewise.settings`: ``--config``,
``--set``, ``--describe-settings`` and the named flags) + ``edge.daemon.run_daemon``
and ``edgewise.policy`` (docs/design/conventions.md#thin-cli). Registered by the CLI dispatcher
(``edgewise.cli.COMMAND_MODULES``).

``check-policy`` validates and explains a policy; with ``--replay RECORDS...`` it also
replays it over the daemon's frame records (:mod:`edgewise.policy.replay`) against
``--against OTHER.yaml`` or the recorded decisions, prints the what-if table
(:mod:`edgewise.policy.whatif`) or, with ``--json``, everything as one JSON document,
and exits 0 (valid, gates passed), 1 (valid, a gate failed) or 2 (invalid policy or
unusable records). Accuracy on labelled data (``--data DIR``) needs the evaluation
tools, which the Jetson bundle does not ship: ``edgewise_tools.cli.whatif`` adds
those options to this command when it is installed and hands the work back through
``args.accuracy`` (this module never imports the tools).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from edge.settings import SCHEMA, load_settings, policy_fit
from edgewise.settings import add_settings_arguments, settings_from_args

#: ``check-policy`` exit statuses (docs/policies.md#use-it-in-ci); an invalid policy or unusable
#: records exit 2, the dispatcher's status for every EdgewiseError (``edgewise.cli``).
EXIT_OK, EXIT_GATE = 0, 1


def register(subparsers: Any) -> None:
    """Add ``run``, ``check-config``, ``health`` and ``check-policy`` to the ``edge`` group."""
    run = subparsers.add_parser(
        "run", help="run the edge daemon",
        description="Run the edge daemon. Settings, later wins: --config YAML < EDGEWISE_EDGE__<KEY>__<SUBKEY> "
                    "environment variables < --set KEY.PATH=VALUE < the named flags.",
    )
    add_settings_arguments(run, SCHEMA)
    run.set_defaults(func=_run, reloads_on_sighup=True)

    cfg = subparsers.add_parser(
        "check-config", help="check the daemon's settings before starting it (exit 2 with what to fix)",
        description="Everything `edge run` checks before it starts, without starting: the settings "
                    "(placeholders included), the device id, writable state folders, the model and its "
                    "backend, the policy file.")
    add_settings_arguments(cfg, SCHEMA)
    cfg.set_defaults(func=_check_config)

    health = subparsers.add_parser(
        "health", help="ask the running daemon's /healthz (exit 0 healthy, 1 not: a container's HEALTHCHECK)",
        description="Ask the edge daemon that runs with these settings for its /healthz (the port of metrics.port, "
                    "on the loopback when it binds every address), print its answer, and exit 0 when it is "
                    "healthy (running, ok or degraded), 1 when not (starting, stopping, stalled, not answering).")
    add_settings_arguments(health, SCHEMA)
    health.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long to wait for the answer (default %(default)s)")
    health.set_defaults(func=_health)

    chk = subparsers.add_parser(
        "check-policy", help="validate an escalation policy file, explain it, replay it on recorded frames",
        description="Validate and explain an escalation policy; with --replay, replay it over the edge daemon's "
                    "frame records and compare it with --against OTHER.yaml or the recorded decisions. Exit "
                    "status: 0 valid (and every gate passed), 1 valid but a gate failed, 2 invalid policy or "
                    "unusable records.",
    )
    chk.add_argument("file", help="policy YAML (kind: EscalationPolicy)")
    chk.add_argument("--replay", nargs="+", metavar="RECORDS",
                     help="JSON Lines sink files of the daemon (rotated and gzip'd ones too, any order)")
    chk.add_argument("--against", metavar="OTHER.yaml",
                     help="compare with this policy instead of the decisions recorded in the records")
    chk.add_argument("--json", action="store_true", help="print one JSON document (explanation, figures, gates)")
    chk.add_argument("--top", type=int, default=10, metavar="N", help="hardest held-back frames to list (default 10)")
    chk.add_argument("--max-share", type=float, metavar="FRACTION",
                     help="gate: exit 1 when the policy escalates more than this fraction of the replayed frames")
    chk.add_argument("--max-bytes-per-day", type=float, metavar="BYTES",
                     help="gate: exit 1 when the policy's estimated uplink exceeds this many bytes per day")
    chk.add_argument("--strict", action="store_true", help="gate: exit 1 when the policy has warnings")
    chk.add_argument("--config", metavar="EDGE_YAML",
                     help="also check it as this device's daemon does at a reload: refused when it names a transport "
                          "the settings do not configure, warned about classes the model lacks and streams the "
                          "device does not have (the environment's EDGEWISE_EDGE__* apply, as for the daemon)")
    chk.set_defaults(func=_check_policy, accuracy=None)


def _run(args: argparse.Namespace) -> int:
    from edge.daemon import run_daemon
    from edge.preflight import STATE_UMASK
    os.umask(os.umask(0) | STATE_UMASK)
    return run_daemon(settings_from_args(args, SCHEMA), reread=lambda: settings_from_args(args, SCHEMA))


def _health(args: argparse.Namespace) -> int:
    from edge.healthcheck import check
    from edgewise.errors import ConfigError

    if not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout:g}: must be > 0 (seconds)")
    return check(settings_from_args(args, SCHEMA), args.timeout, sys.stdout, sys.stderr)


def _check_config(args: argparse.Namespace) -> int:
    """Exit 0 with a summary, or raise the first problem as one line (exit 2)."""
    from edge.preflight import (
        check_backend,
        check_metrics_host,
        check_sources,
        check_state_files,
        preflight,
    )
    from edgewise.errors import ModelError
    from edgewise.runtime.firstframe import first_frame_problem
    from edgewise.runtime.metadata import load_model_info, setting_imgsz

    s = settings_from_args(args, SCHEMA)
    lines = preflight(s, create=False)  # run by root (postinst): never make folders the daemon cannot use
    check_state_files(s)
    check_metrics_host(s)
    check_sources(s)
    info = load_model_info(s.model.path, setting_imgsz(s.model.imgsz))
    problem = first_frame_problem(info, s.model.max_batch)  # what the daemon's first frames would refuse
    if problem:
        raise ModelError(f"{info.path}: {problem}")
    lines.append(f"model {info.path} ({info.precision}, {info.imgsz[0]}x{info.imgsz[1]}) on {check_backend(s)}")
    if s.policy_file:
        from edgewise.policy.holding import PolicyHolder

        policy = PolicyHolder.from_file(s.policy_file, policy_fit(s)).policy  # as the daemon loads it
        lines.append(f"policy {s.policy_file}")
        # the daemon logs the same at its start: valid, but not what was meant
        for warning in policy.fit_warnings(info.names, s.model.path, [st.id for st in s.streams]):
            print(f"{args.config or 'settings'}: warning: {warning}", file=sys.stderr)
    lines.append(f"cloud {', '.join(s.cloud.endpoints) or '(no gRPC endpoint)'}"
                 + (f", MQTT {s.cloud.mqtt.host}:{s.cloud.mqtt.port}" if s.cloud.mqtt.host else ""))
    print(f"{args.config or 'settings'}: ok: " + "; ".join(lines))
    return 0


def _device_fit(policy: Any, config: str) -> List[str]:
    """What the daemon of the device ``config`` configures refuses of ``policy`` at a reload
    (ConfigError, as ``PolicyHolder`` words it) and warns about (``Policy.fit_warnings``): a
    policy that passed ``check-policy`` alone could be refused on the device (found by a probe)."""
    from edgewise.policy.holding import PolicyHolder
    from edgewise.runtime.metadata import load_model_info, setting_imgsz

    s = load_settings(config)
    PolicyHolder(policy, fit=policy_fit(s))  # raises as the daemon's reload refuses
    names = load_model_info(s.model.path, setting_imgsz(s.model.imgsz)).names
    return policy.fit_warnings(names, s.model.path, [st.id for st in s.streams])


def _describe(policy: Any) -> Dict[str, Any]:
    from edgewise.policy import explain, warnings
    from edgewise.policy.digest import policy_digest

    return {"name": policy.metadata.name, "source": policy.source, "digest": policy_digest(policy),
            "explanation": explain(policy).splitlines(), "warnings": warnings(policy)}


def _check_policy(args: argparse.Namespace) -> int:
    """Explain (and replay) a valid policy; an invalid one or unusable records raise an
    EdgewiseError (exit 2, like every other configuration error)."""
    from edgewise.errors import ConfigError
    from edgewise.policy.loading import load_policy
    from edgewise.policy.whatif import gate_failures, table

    policy = load_policy(args.file)
    fit_warnings = _device_fit(policy, args.config) if args.config else []
    other = load_policy(args.against) if args.against else None
    data = getattr(args, "data", None)
    if other is not None and not args.replay and not data:
        raise ConfigError("--against compares on recorded frames (--replay) or labelled data (--data); give one")
    if args.top < 0:
        raise ConfigError(f"--top {args.top}: must be >= 0")
    if args.max_share is not None and not 0.0 <= args.max_share <= 1.0:
        raise ConfigError(f"--max-share {args.max_share:g}: must be a fraction in [0, 1]")
    if args.max_bytes_per_day is not None and not args.max_bytes_per_day >= 0:
        raise ConfigError(f"--max-bytes-per-day {args.max_bytes_per_day:g}: must be >= 0")
    if (args.max_share is not None or args.max_bytes_per_day is not None) and not args.replay:
        raise ConfigError("--max-share and --max-bytes-per-day gate the replay's figures: give --replay RECORDS")
    unused = getattr(args, "accuracy_without_data", None)  # set with the options, where the tools are installed
    problem = unused(args) if unused is not None else None
    if problem:
        raise ConfigError(problem)
    doc: Dict[str, Any] = {"policy": _describe(policy), "against": _describe(other) if other is not None else None}
    doc["policy"]["warnings"] += fit_warnings
    report: Optional[Dict[str, Any]] = None
    if args.replay:
        from edgewise.policy.replay import replay

        report = replay(args.replay, policy, other, top=args.top, label=args.file, against_label=args.against or "")
    doc["replay"] = report
    accuracy_text = ""
    if data:
        doc["accuracy"], accuracy_text = args.accuracy(args, policy, other)
    failed = gate_failures(report, doc["policy"]["warnings"], args.max_share, args.max_bytes_per_day, args.strict)
    code = EXIT_GATE if failed else EXIT_OK
    doc["gates"] = {"failed": failed}
    doc["exit"] = code
    if args.json:
        print(json.dumps(doc, indent=1))
        return code
    print("\n".join(doc["policy"]["explanation"]))
    for w in doc["policy"]["warnings"]:
        print(f"warning: {w}")
    if report is not None:
        print()
        print(table(report))
    if accuracy_text:
        print()
        print(accuracy_text)
    for f in failed:
        print(f"gate failed: {f}")
    return code
