"""Every settings key of a process, described: for ``--describe-settings`` and the reference pages.

One row per leaf key (``streams[].fps`` for the items of a list of sections): its
type, default, allowed values, environment variable, named flag and doc, all read
from the :class:`~edgewise.settings.loading.Schema` and the field metadata, so the
descriptions cannot drift from what the loader enforces.
"""

from __future__ import annotations

from typing import Any, List, NamedTuple

from edgewise.settings.building import allowed_text
from edgewise.settings.fields import fields_of, walk
from edgewise.settings.loading import Schema
from edgewise.settings.values import choices, is_mapping, is_section, optional, sequence


class Row(NamedTuple):
    """One settings key as the descriptions show it."""

    key: str
    type: str
    default: str
    allowed: str
    env: str
    flag: str
    doc: str
    secret: bool


def type_text(tp: Any) -> str:
    """``int``, ``float or null``, ``list of str``, ``list of 2 float``, ``mapping``."""
    inner, nullable = optional(tp)
    seq = sequence(inner)
    if seq is not None:
        text = f"list of {'' if seq[1] is None else f'{seq[1]} '}{type_text(seq[0])}"
    elif is_section(inner):
        text = "mapping"
    elif is_mapping(inner):
        text = "mapping"
    elif choices(inner):
        text = type(choices(inner)[0]).__name__
    else:
        text = getattr(inner, "__name__", str(inner))
    return f"{text} or null" if nullable else text


def yaml_text(value: Any) -> str:
    """A default as it would be written in YAML (``""``, ``null``, ``true``, ``[a, b]``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_text(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "__dataclass_fields__"):
        return "{" + ", ".join(f"{k}: {yaml_text(getattr(value, k))}" for k in value.__dataclass_fields__) + "}"
    return str(value)


def rows(schema: Schema[Any]) -> List[Row]:
    """Every key of ``schema`` (sections entered), in declaration order."""
    flags = {f.path: f.name for f in schema.flags}
    out = []
    for key, info in walk(schema.root):
        inner, nullable = optional(info.type)
        if "[]" in key:
            default = "(required)" if info.required else yaml_text(info.default())
        else:
            default = yaml_text(_default(schema.root, key))
        items_of_sections = sequence(inner) is not None and is_section(sequence(inner)[0])  # type: ignore[index]
        out.append(Row(key, type_text(info.type), default, allowed_text(info.spec, inner, nullable),
                       "" if items_of_sections else schema.env_name(key), flags.get(key, ""),
                       info.spec.doc, info.spec.secret))
    return out


def _default(cls: Any, key: str) -> Any:
    """The default at ``key``: the field's own, or inside its section's default value."""
    value: Any = None
    for i, part in enumerate(key.split(".")):
        info = fields_of(cls)[part]
        value = getattr(value, part) if i else info.default()
        cls = optional(info.type)[0]
    return value


def describe(schema: Schema[Any]) -> str:
    """The text ``--describe-settings`` prints."""
    lines = [
        f"Settings of `{schema.command}`; later layers win: defaults < --config FILE < environment "
        f"{schema.env_prefix}<KEY>__<SUBKEY> < --set KEY.PATH=VALUE < named flags. List items are "
        "addressed by index (KEY.0.SUBKEY).",
    ]
    for r in rows(schema):
        lines += ["", r.key, f"  type {r.type}, default {r.default}; allowed: {r.allowed}",
                  f"  env {r.env or '(set the items by index)'}" + (f"; flag {r.flag}" if r.flag else "")
                  + ("; secret: its value is never printed" if r.secret else ""),
                  f"  {r.doc}"]
    notes = list(schema.notes()) if schema.notes is not None else []
    if notes:
        lines += ["", "On this machine:"] + [f"  {n}" for n in notes]
    return "\n".join(lines)
