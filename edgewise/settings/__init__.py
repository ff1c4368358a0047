"""One settings mechanism for every process (edge daemon, gateway, worker, autoscaler).

A process declares typed dataclasses whose fields carry their doc, choices, range
and secrecy (:func:`setting`), a short cross-field ``validate`` and a table of named
flags, as one :class:`Schema`; it gets strict loading from YAML < environment
(``EDGEWISE_<PROCESS>__SECTION__KEY``) < ``--set KEY.PATH=VALUE`` < flags, errors
that name where each bad value came from, ``--describe-settings`` and the reference
pages. Modules: :mod:`.values` (the coercion table), :mod:`.fields` (metadata),
:mod:`.tree` (values with their origin), :mod:`.building` (typed construction),
:mod:`.loading` (the layers), :mod:`.describing`, :mod:`.cli`.
"""

from __future__ import annotations

from edgewise.settings.cli import add_settings_arguments, overrides_from_args, settings_from_args
from edgewise.settings.describing import Row, describe, rows
from edgewise.settings.fields import Invalid, Spec, check, setting
from edgewise.settings.loading import Flag, Schema
from edgewise.settings.tree import Source, parse_yaml, read_yaml
from edgewise.settings.values import VALUE_RULES, coerce

__all__ = [
    "VALUE_RULES", "Flag", "Invalid", "Row", "Schema", "Source", "Spec", "add_settings_arguments", "check",
    "coerce", "describe", "overrides_from_args", "parse_yaml", "read_yaml", "rows", "setting",
    "settings_from_args",
]
