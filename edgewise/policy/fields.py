"""Declarative field metadata for the policy schema: one source for validation and docs.

Every schema dataclass field carries ``metadata=opt(...)``: its YAML key, kind,
allowed values or range, and a one-line description. The loader
(:mod:`edgewise.policy.loading`) validates against it and
:func:`edgewise.policy.schema.describe_schema` renders the reference rows from
it, so the documentation cannot drift from what is enforced.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Dict, Optional, Tuple

#: Field kinds the loader understands.
KINDS = ("float", "int", "str", "bool", "section", "map", "weights")


@dataclass(frozen=True)
class FieldSpec:
    """How one YAML key is validated and documented."""

    key: str
    kind: str
    doc: str
    required: bool = False
    choices: Tuple[str, ...] = ()
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    nullable: bool = False
    null_means: str = ""
    cls: Any = None
    keys: Tuple[str, ...] = ()

    def allowed(self) -> str:
        """Human-readable allowed values: choices, range, or type."""
        if self.choices:
            text = " | ".join(self.choices)
        elif self.kind in ("float", "int"):
            what = "a number" if self.kind == "float" else "an integer"
            if self.lo is not None and self.hi is not None:
                lb = "(" if self.lo_open else "["
                rb = ")" if self.hi_open else "]"
                text = f"{what} in {lb}{_num(self.lo)}, {_num(self.hi)}{rb}"
            elif self.lo is not None:
                text = f"{what} {'>' if self.lo_open else '>='} {_num(self.lo)}"
            elif self.hi is not None:
                text = f"{what} {'<' if self.hi_open else '<='} {_num(self.hi)}"
            else:
                text = what
        elif self.kind == "bool":
            text = "true | false"
        elif self.kind == "str":
            text = "a non-empty string" if self.required else "a string"
        elif self.kind == "section":
            text = "a mapping"
        elif self.kind == "weights":
            text = "a mapping of " + " | ".join(self.keys) + " to a number in [0, 1]"
        else:
            text = "a mapping of name to a mapping"
        if self.nullable:
            text += f", or null ({self.null_means})" if self.null_means else ", or null"
        return text

    def in_range(self, v: float) -> bool:
        """Whether number ``v`` is finite and within [lo, hi] (open ends respected)."""
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def opt(
    key: str,
    kind: str,
    doc: str,
    default: Any = MISSING,
    factory: Optional[Callable[[], Any]] = None,
    **spec: Any,
) -> Any:
    """A dataclass ``field`` carrying a :class:`FieldSpec` under ``metadata["spec"]``."""
    if kind not in KINDS:
        raise ValueError(f"unknown field kind {kind!r}")
    meta = {"spec": FieldSpec(key=key, kind=kind, doc=doc, **spec)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def field_specs(cls: Any) -> Dict[str, Tuple[str, FieldSpec]]:
    """YAML key -> (attribute name, spec) of a schema dataclass, in declaration order."""
    out: Dict[str, Tuple[str, FieldSpec]] = {}
    for f in fields(cls):
        spec = f.metadata.get("spec")
        if isinstance(spec, FieldSpec):
            out[spec.key] = (f.name, spec)
    return out


def field_default(cls: Any, attr: str) -> Any:
    """The default value of attribute ``attr`` of dataclass ``cls`` (MISSING if none)."""
    for f in fields(cls):
        if f.name == attr:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
    return MISSING
