"""Declarative field metadata for the policy schema: one source for validation and docs.

Every schema dataclass field carries ``metadata=opt(...)``: its YAML key, kind,
allowed values or range, and a one-line description. The loader
(:mod:`edgewise.policy.loading`) validates against it and
:func:`edgewise.policy.schema.describe_schema` renders the reference rows from
it, so the documentation cannot drift from what is enforced.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, Dict, Optional, Tuple

from edgewise.fieldrules import allowed_text, in_range, range_problem

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
    #: for a ``map``: the form its keys are matched in (class names: :func:`~edgewise.fieldrules.class_name_form`)
    key_form: Optional[Callable[[str], str]] = None

    def allowed(self) -> str:
        """Human-readable allowed values: choices, range, or type."""
        if self.kind == "section":
            text = "a mapping"
        elif self.kind == "weights":
            text = "a mapping of " + " | ".join(self.keys) + " to a number in [0, 1]"
        elif self.kind == "map":
            text = "a mapping of name to a mapping"
        else:
            text = allowed_text(self.kind, self.choices, self.lo, self.hi, self.lo_open, self.hi_open,
                                nonempty=self.required)
        if self.nullable:
            text += f", or null ({self.null_means})" if self.null_means else ", or null"
        return text

    def in_range(self, v: float) -> bool:
        """Whether number ``v`` is finite and within [lo, hi] (open ends respected)."""
        return in_range(v, self.lo, self.hi, self.lo_open, self.hi_open)

    def range_problem(self, v: float) -> Optional[str]:
        """What an error says after ``v`` when :meth:`in_range` refuses it, else None."""
        return range_problem(v, self.lo, self.hi, self.lo_open, self.hi_open)


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
