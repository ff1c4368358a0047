"""The one coercion table of every process's settings: what a YAML, environment or flag value becomes.

A value reaches a field either as YAML made it (``3``, ``3.0``, ``'3'``, ``true``,
``null``, a list, a mapping) or as text (an environment variable, ``--set KEY=VALUE``,
a named flag). Both go through the same rules, keyed by the field's annotation, so
the same value gives the same result in the edge daemon, the gateway, the worker and
the autoscaler (:data:`VALUE_RULES` is the table the reference pages print):

* ``bool``: ``true``/``false``; the strings true/false, yes/no, on/off, 1/0 (any case);
  the integers 1 and 0.
* ``int``: an integer, a float without a fractional part (``3.0``), or a string
  holding either (``'3'``, ``'3.0'``) in ASCII digits without ``_``. Never a boolean.
* ``float``: a finite int or float, or a string holding one (``'0.5'``, ``'1e-3'``) in
  ASCII digits without ``_`` (``int()`` and ``float()`` take any script's digits and ``_``
  separators: ``'١٢'`` and ``'1_000'`` are refused, not 12 and 1000, as YAML 1.2 reads
  ``1_000`` in a file as text).
* ``str``: a string, or a number written as it reads (``5`` becomes ``"5"``); not a
  boolean, null, list or mapping (quote ``'yes'`` to mean the word).
* ``Optional[X]``: ``null``, or the text ``null`` or an empty string, is None; anything
  else is an X.
* lists and tuples: a YAML list, or a string of comma-separated items (``a:1,b:2``,
  optionally in ``[...]``; empty = no items); each item follows its own type's rule.
  A fixed-length tuple needs exactly that many items.
* a nested section (a dataclass): a mapping; its keys override the section's default.
* ``Literal[...]`` and declared choices: exactly one of the choices.
* ``Dict[str, Any]``: a mapping, passed on as written.

Pure: no I/O. :class:`Problem` says what is wrong with one value; the loader adds
where the value came from.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from edgewise.fieldrules import number_text_hint

#: (type, what is accepted): the rules above as the reference pages print them.
VALUE_RULES: Tuple[Tuple[str, str], ...] = (
    ("bool", "`true`/`false`; the strings true/false, yes/no, on/off, 1/0 (any case); the integers 1 and 0"),
    ("int", "an integer, a float without a fractional part (`3.0`), or a string holding either (`'3'`), in ASCII "
            "digits without `_` (`'١٢'` and `'1_000'` are no numbers); in a file "
            "numbers read as YAML 1.2 reads them (`010` is ten, not octal eight; `0o17` and `0x1f` are octal and hex; "
            "`1:30` is text)"),
    ("float", "a finite number, or a string holding one (`'0.5'`, `'1e-3'`), in ASCII digits without `_`"),
    ("str", "a string, or a number as written in YAML (`012` is `\"012\"`, `1.10` is `\"1.10\"`); quote `'yes'` to "
            "mean the word"),
    ("... or null", "`null`, or the text `null` or an empty string, means none"),
    ("list", "a YAML list, or comma-separated text (`a:1,b:2`, optionally in `[...]`); "
             "items follow their own type's rule"),
    ("section", "a mapping; the keys you write override the section's defaults"),
    ("choices", "exactly one of the listed values"),
)

_UNIONS = tuple({Union, getattr(types, "UnionType", Union)})
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
NULL_TEXTS = ("", "null")


class Problem(Exception):
    """What is wrong with one value: ``what`` it is not, and the ``allowed`` values."""

    def __init__(self, what: str, allowed: str = "") -> None:
        super().__init__(what)
        self.what = what
        self.allowed = allowed


def optional(tp: Any) -> Tuple[Any, bool]:
    """(inner type, whether null is allowed) of ``Optional[X]`` / ``X | None`` / ``X``."""
    if typing.get_origin(tp) in _UNIONS:
        args = typing.get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            return inner[0], True
        raise TypeError(f"unsupported settings type {tp!r}: only Optional unions")
    return tp, False


def is_section(tp: Any) -> bool:
    """Whether ``tp`` is a nested settings section (a dataclass type)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def is_mapping(tp: Any) -> bool:
    """Whether ``tp`` is a free-form mapping (``Dict[str, Any]``) or ``Any``."""
    return tp is Any or typing.get_origin(tp) is dict or tp is dict


def sequence(tp: Any) -> Optional[Tuple[Any, Optional[int], type]]:
    """(item type, fixed length or None, list or tuple) of a list/tuple type, else None."""
    origin = typing.get_origin(tp)
    if origin not in (list, tuple):
        return None
    args = typing.get_args(tp)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(set(args)) != 1:
            raise TypeError(f"unsupported settings type {tp!r}: tuple items must share one type")
        return args[0], len(args), tuple
    return args[0], None, origin


def is_text(tp: Any) -> bool:
    """``tp`` is ``str`` or a ``Literal`` of strings: a number written in YAML is taken as written."""
    return tp is str or any(isinstance(c, str) for c in choices(tp))


def choices(tp: Any) -> Tuple[Any, ...]:
    """The values of a ``Literal[...]`` type (empty for other types)."""
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()


def split_text(text: str) -> List[str]:
    """Comma-separated items of a text list, optionally wrapped in ``[...]``; blanks dropped."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    return [p.strip() for p in t.split(",") if p.strip()]


def is_null(value: Any) -> bool:
    """Whether ``value`` means "none" for an Optional field."""
    return value is None or (isinstance(value, str) and value.strip().lower() in NULL_TEXTS)


def coerce(tp: Any, value: Any) -> Any:
    """``value`` converted to scalar type ``tp`` (bool, int, float, str, a Literal, Any).

    Raises:
        Problem: the value cannot be read as ``tp``; ``what`` names the expected kind.
    """
    if tp is Any:
        return value
    if choices(tp):
        return coerce(type(choices(tp)[0]), value)
    if tp not in _SCALARS:
        raise TypeError(f"unsupported settings type {tp!r}")
    return _SCALARS[tp](value)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    word = value.strip().lower() if isinstance(value, str) else None
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise Problem("a boolean")


def _int(value: Any) -> int:
    num = _number(value, "an integer")
    if isinstance(num, int):  # any size: a range check says what is too large, float() would overflow
        return num
    if num is None or not num.is_integer():
        raise Problem("an integer")
    return int(num)


def _float(value: Any) -> float:
    num = _number(value, "a number")
    if num is None:
        raise Problem("a number")
    try:
        return float(num)
    except OverflowError:  # an int past the largest float
        raise Problem("a number of at most 1.8e308") from None


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise Problem("a string")


_SCALARS: Dict[Any, Callable[[Any], Any]] = {bool: _bool, int: _int, float: _float, str: _str}


def _number(value: Any, what: str) -> Optional[Union[int, float]]:
    if isinstance(value, str):
        text = value.strip()
        hint = number_text_hint(text)  # int() and float() take '١٢' as 12 and '1_000' as 1000
        if hint:
            raise Problem(f"{what} ({hint})")
        try:
            return int(text, 0) if text.lstrip("+-")[:2].lower() in ("0x", "0o") else int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if isinstance(value, int) or math.isfinite(value) else None
