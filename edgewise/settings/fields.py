"""Field metadata of settings dataclasses: each field's doc, allowed values and secrecy, declared once.

Every settings field is written ``name: T = setting("doc", default, lo=..., choices=...)``
(the settings counterpart of the policy schema's :func:`edgewise.policy.fields.opt`).
The type comes from the annotation; the loader checks ranges and choices from the
metadata and names the source of a bad value, ``--describe-settings`` and the
reference pages print it, and :func:`check` validates an object built in code (the
cores that take a settings section, such as the gateway's balancer, call it).

Range and choice texts and checks are the policy schema's too
(:mod:`edgewise.fieldrules`), so both say "an integer in [1, 65535]" the same way.
``secret=True`` marks tokens and passwords: their values are left out of ``repr``
(so out of logs) and out of error messages.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from edgewise.errors import ConfigError
from edgewise.fieldrules import allowed_text, range_problem, show, suggest
from edgewise.settings.values import choices, is_section, optional, sequence

_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


@dataclass(frozen=True)
class Spec:
    """What one settings field means and allows."""

    doc: str
    choices: Tuple[Any, ...] = ()
    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    secret: bool = False
    #: what an out-of-range error adds, in parentheses: why the range ends where it does
    why: str = ""

    def kind(self, tp: Any) -> str:
        """``bool``, ``int``, ``float`` or ``str`` for scalar type ``tp`` (a Literal's choices count)."""
        allowed = self.allowed_values(tp)
        return _KINDS.get(type(allowed[0]) if allowed else tp, "str")

    def allowed(self, tp: Any, nullable: bool = False) -> str:
        """What scalar type ``tp`` with this metadata accepts (``an integer in [1, 65535]``)."""
        text = allowed_text(self.kind(tp), tuple(str(c) or '""' for c in self.allowed_values(tp)),
                            self.lo, self.hi, self.lo_open, self.hi_open)
        return text + (", or null" if nullable else "")

    def allowed_values(self, tp: Any) -> Tuple[Any, ...]:
        """The declared choices, else those of a ``Literal`` type, else ()."""
        return self.choices or choices(tp)

    def shown(self, value: Any) -> str:
        """``value`` as an error message may quote it (``***`` for a secret)."""
        return "***" if self.secret else show(value)


def setting(doc: str, default: Any = MISSING, *, factory: Optional[Callable[[], Any]] = None,
            **spec: Any) -> Any:
    """A dataclass ``field`` carrying a :class:`Spec` (``doc`` is joined into one line)."""
    meta = {"setting": Spec(doc=" ".join(doc.split()), **spec)}
    in_repr = not spec.get("secret", False)
    if factory is not None:
        return field(default_factory=factory, metadata=meta, repr=in_repr)
    return field(default=default, metadata=meta, repr=in_repr)


@dataclass(frozen=True)
class FieldInfo:
    """One field of a settings dataclass: resolved type, metadata, default."""

    name: str
    type: Any
    spec: Spec
    field: dataclasses.Field  # type: ignore[type-arg]

    @property
    def required(self) -> bool:
        return self.field.default is MISSING and self.field.default_factory is MISSING

    def default(self) -> Any:
        """The field's default value (None for a required field)."""
        if self.field.default is not MISSING:
            return self.field.default
        if self.field.default_factory is not MISSING:
            return self.field.default_factory()
        return None


_FIELDS: Dict[type, Dict[str, FieldInfo]] = {}


def fields_of(cls: type) -> Dict[str, FieldInfo]:
    """Name -> :class:`FieldInfo` of settings dataclass ``cls``, in declaration order."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        _FIELDS[cls] = {f.name: FieldInfo(f.name, hints[f.name], f.metadata.get("setting") or Spec(doc=""), f)
                        for f in dataclasses.fields(cls)}
    return _FIELDS[cls]


def walk(cls: type, prefix: str = "") -> Iterator[Tuple[str, FieldInfo]]:
    """(key path, field) of every value of settings dataclass ``cls``, in declaration order;
    sections are entered; a list of sections is given, then its items as ``key[].field``."""
    for info in fields_of(cls).values():
        key = prefix + info.name
        inner = optional(info.type)[0]
        seq = sequence(inner)
        if is_section(inner):
            yield from walk(inner, key + ".")
        elif seq is not None and is_section(seq[0]):
            yield key, info
            yield from walk(seq[0], key + "[].")
        else:
            yield key, info


def changed_keys(old: Any, new: Any, prefix: str = "") -> List[str]:
    """Key paths whose values differ between two settings objects of one class, in declaration
    order: sections are entered, a list is compared whole (a process that re-reads its settings
    on SIGHUP names what it does not apply)."""
    keys: List[str] = []
    for info in fields_of(type(old)).values():
        a, b = getattr(old, info.name), getattr(new, info.name)
        if dataclasses.is_dataclass(a) and type(a) is type(b):
            keys += changed_keys(a, b, prefix + info.name + ".")
        elif a != b:
            keys.append(prefix + info.name)
    return keys


def value_problem(spec: Spec, tp: Any, value: Any, shown: str = "") -> Optional[Tuple[str, str]]:
    """(problem, allowed) when a converted scalar or list ``value`` breaks ``spec``, else None;
    ``shown`` is how the problem quotes the value (default: as converted)."""
    inner, nullable = optional(tp)
    if value is None:
        return None
    seq = sequence(inner)
    if seq is not None:
        for item in value:
            bad = value_problem(spec, seq[0], item)
            if bad:
                return bad
        return None
    if inner not in _KINDS and not choices(inner):
        return None
    allowed = spec.allowed_values(inner)
    shown = shown or spec.shown(value)
    if allowed and value not in allowed:
        return f"{shown} is not allowed{suggest(str(value), [str(c) for c in allowed])}", spec.allowed(inner, nullable)
    out_of_range = range_problem(value, spec.lo, spec.hi, spec.lo_open, spec.hi_open) \
        if spec.kind(inner) in ("int", "float") else None
    if out_of_range:
        why = f" ({spec.why})" if spec.why else ""
        return f"{shown} {out_of_range}{why}", spec.allowed(inner, nullable)
    return None


class Invalid(ConfigError):
    """A settings value that breaks a rule, with the key path it is at (``limits.max_deadline_s``).

    Cross-field validation raises it; the loader replaces the path prefix with where
    the value came from (``file:line``, the environment variable, the flag). A rule
    between keys names the others it reads in ``also`` (``limits.max_message_bytes`` for
    ``limits.max_image_bytes``): the loader then names the latest source that set any of
    them, the one the operator just changed (``--min 16`` against the default
    ``max_replicas``), not a file that sets neither.
    """

    def __init__(self, path: str, problem: str, allowed: str = "", also: Sequence[str] = ()) -> None:
        super().__init__(f"{path}: {problem}" + (f"; allowed: {allowed}" if allowed else ""))
        self.path = path
        self.problem = problem
        self.allowed = allowed
        self.also = tuple(also)


def check(obj: Any, path: str = "") -> None:
    """Raise :class:`Invalid` at the first field of dataclass ``obj`` outside its declared
    choices or range (not recursive: a section checks its own fields)."""
    for info in fields_of(type(obj)).values():
        bad = value_problem(info.spec, info.type, getattr(obj, info.name))
        if bad:
            raise Invalid(f"{path}.{info.name}" if path else info.name, *bad)
