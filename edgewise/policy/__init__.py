"""Escalation policy: schema, loader with precise errors, explain, decision core, holder.

Operators write ``apiVersion: edgewise/v1`` / ``kind: EscalationPolicy`` YAML;
:func:`load_policy` validates it into an immutable :class:`Policy`,
:func:`explain` summarises it, :class:`~edgewise.policy.deciding.Escalator`
decides per frame and :class:`PolicyHolder` swaps policies atomically on reload.
"""

from __future__ import annotations

from edgewise.policy.deciding import Decision, Escalator
from edgewise.policy.explaining import explain, warnings
from edgewise.policy.holding import PolicyHolder, ReloadPlan, ReloadResult, plan_reload
from edgewise.policy.loading import load_policy, parse_policy
from edgewise.policy.schema import (
    Band,
    Budget,
    ClassOverride,
    Merge,
    Payload,
    Policy,
    Signals,
    Spec,
    StreamOverride,
    describe_schema,
    schema_markdown,
)

__all__ = [
    "Band",
    "Budget",
    "ClassOverride",
    "Decision",
    "Escalator",
    "Merge",
    "Payload",
    "Policy",
    "PolicyHolder",
    "ReloadPlan",
    "ReloadResult",
    "Signals",
    "Spec",
    "StreamOverride",
    "describe_schema",
    "explain",
    "load_policy",
    "parse_policy",
    "plan_reload",
    "schema_markdown",
    "warnings",
]
