"""Typed settings from a tree of sourced values: strict, with errors that name each value's origin.

:func:`build_section` turns a :class:`~edgewise.settings.tree.Val` tree (a YAML file with
the overrides laid over it) into dataclass instances: unknown keys refused with a
did-you-mean, every value converted by the one coercion table
(:mod:`edgewise.settings.values`) and checked against its field's choices and range,
required keys of new list items demanded. A mapping overrides the section's *default*
(``scale_down: {stabilization_window_s: 120}`` keeps the default policies). An error
reads ``SOURCE: key.path: problem; allowed: values``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Dict, List, Tuple, Union

from edgewise.fieldrules import other_file_hint, suggest
from edgewise.settings.fields import Invalid, Spec, fields_of, value_problem
from edgewise.settings.tree import Part, Val, describe, fail, plain, read_yaml
from edgewise.settings.values import (
    Problem,
    coerce,
    is_mapping,
    is_null,
    is_section,
    is_text,
    optional,
    sequence,
    split_text,
)
from edgewise.yamlnodes import SETTINGS_SIZE, UNQUOTED_BOOLEAN, SizeLimits


def build_value(tp: Any, val: Val, path: Tuple[Part, ...], spec: Spec, dflt: Any) -> Any:
    """The typed value of ``val`` for annotation ``tp`` (the coercion table of values.py)."""
    inner, nullable = optional(tp)
    data = val.data
    if nullable and is_null(data):
        return None
    if is_section(inner):
        return build_section(inner, val, dflt, path)
    allowed = allowed_text(spec, inner, nullable)
    if data is None:
        raise fail(val.key_src, path, "null is not allowed", allowed)
    seq = sequence(inner)
    if seq is not None:
        item_tp, size, kind = seq
        if isinstance(data, str):
            items = [Val(t, val.src, True) for t in split_text(data)]
        elif isinstance(data, list):
            items = data
        else:
            raise fail(val.key_src, path, f"expected a list, got {describe(data)}", allowed)
        if size is not None and len(items) != size:
            raise fail(val.key_src, path, f"has {len(items)} items, not {size}", allowed)
        return kind(build_value(item_tp, v, path + (i,), spec, None) for i, v in enumerate(items))
    if is_mapping(inner):
        if not isinstance(data, dict):
            raise fail(val.key_src, path, f"expected a mapping, got {describe(data)}", allowed)
        return plain(val)
    if isinstance(data, (dict, list)):
        raise fail(val.key_src, path, f"expected a single value, got {describe(data)}", allowed)
    if val.written is not None and is_text(inner):
        data = val.written
    try:
        value = coerce(inner, data)
    except Problem as exc:
        quote = f"; {UNQUOTED_BOOLEAN}" if isinstance(data, bool) and is_text(inner) else ""
        raise fail(val.key_src, path, f"{spec.shown(data)} is not {exc.what}{quote}", allowed) from None
    bad = value_problem(spec, tp, value, spec.shown(data))
    if bad:
        raise fail(val.key_src, path, *bad)
    return value


def allowed_text(spec: Spec, tp: Any, nullable: bool = False) -> str:
    """What a field accepts, as error messages and the reference pages say it."""
    seq = sequence(tp)
    if seq is not None:
        return f"a list, each item {allowed_text(spec, seq[0])}" + (", or null" if nullable else "")
    if is_mapping(tp) or is_section(tp):
        return "a mapping"
    return spec.allowed(tp, nullable)


def build_section(cls: Any, val: Val, dflt: Any = None, path: Tuple[Part, ...] = ()) -> Any:
    """Dataclass ``cls`` from mapping ``val`` laid over ``dflt`` (class defaults when None);
    errors name the source of the bad value and its key path (below ``path``)."""
    data: Dict[str, Val] = val.data if val.data is not None else {}
    if not isinstance(data, dict):
        raise fail(val.key_src, path, f"expected a mapping, got {describe(data)}", "a mapping")
    infos = fields_of(cls)
    kwargs = {}
    for key, child in data.items():
        info = infos.get(key)
        if info is None:
            hint = "" if path else other_file_hint(data, data["kind"].data if "kind" in data else None, False)
            raise fail(child.key_src, path + (key,), f"unknown key{suggest(key, list(infos))}{hint}",
                       " | ".join(infos))
        sub = getattr(dflt, key) if dflt is not None else info.default()
        kwargs[key] = build_value(info.type, child, path + (key,), info.spec, sub)
    if dflt is None:
        for name, info in infos.items():
            if info.required and name not in kwargs:
                raise fail(val.key_src, path + (name,), "required key is missing")
    try:
        return replace(dflt, **kwargs) if dflt is not None else cls(**kwargs)
    except Invalid as exc:
        first = exc.path.split(".")[0]
        src = data[first].key_src if first in data else val.key_src
        raise fail(src, path + tuple(exc.path.split(".")), exc.problem, exc.allowed) from None
    except ValueError as exc:
        raise fail(val.key_src, path, str(exc)) from None


def load_file(tp: Any, path: Union[str, os.PathLike[str]], what: str) -> Any:
    """A YAML file holding one value of type ``tp`` (e.g. a list of sections), built with the
    same rules as settings and errors naming ``file:line``."""
    return build_value(tp, read_yaml(path, what, mapping=False), (), Spec(doc=""), None)


def load_list_file(item_tp: Any, path: Union[str, os.PathLike[str]], what: str,
                   size: SizeLimits = SETTINGS_SIZE) -> List[Tuple[Any, str]]:
    """A YAML file holding a list of ``item_tp``, built as :func:`load_file` builds it, each item
    with the ``file:line`` it starts on: for the rules a caller checks across the items (a
    device listed twice) to name the line as the loader's own errors do. ``size``: how large
    the file may be (a list that grows with a fleet has larger limits than a settings file)."""
    tree = read_yaml(path, what, mapping=False, size=size)
    items = build_value(List[item_tp], tree, (), Spec(doc=""), None)  # type: ignore[valid-type]
    vals = tree.data if isinstance(tree.data, list) else [tree] * len(items)  # (a scalar: comma-split text)
    return [(item, v.src.label) for item, v in zip(items, vals)]
