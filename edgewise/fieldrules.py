"""How a field's allowed values are checked and said, shared by the policy schema and the settings.

One place for the rules both loaders (:mod:`edgewise.policy.loading`,
:mod:`edgewise.settings`) apply to a single value and the words their errors use:
a range with open or closed ends (``an integer in [1, 65535]``, ``a number > 0``),
and no subnormal number in it (``1e-320``: no rate or period, infinite inverted),
choices (``grpc | mqtt``), how a bad value is quoted, and the did-you-mean
suggestion (difflib); the digits a number given as text is read in (ASCII, not
any script's, and no ``_`` separators); and the form a class name is matched in (Unicode NFC), for the
model loader and the policy's ``spec.classes`` keys. Dependency-free so both can use
it without importing each other.
"""

from __future__ import annotations

import difflib
import math
import sys
import unicodedata
from typing import Any, Collection, Optional, Sequence

#: What each scalar kind is called in "allowed:" texts.
KIND_WORDS = {"float": "a number", "int": "an integer", "bool": "true | false", "str": "a string"}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def allowed_text(kind: str, choices: Sequence[str] = (), lo: Optional[float] = None, hi: Optional[float] = None,
                 lo_open: bool = False, hi_open: bool = False, nonempty: bool = False) -> str:
    """``grpc | mqtt``, ``an integer in [1, 65535]``, ``a number > 0``, ``a non-empty string``."""
    if choices:
        return " | ".join(choices)
    if kind in ("float", "int"):
        what = KIND_WORDS[kind]
        if lo is not None and hi is not None:
            return f"{what} in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
        if lo is not None:
            return f"{what} {'>' if lo_open else '>='} {_num(lo)}"
        if hi is not None:
            return f"{what} {'<' if hi_open else '<='} {_num(hi)}"
        return what
    if kind == "str" and nonempty:
        return "a non-empty string"
    return KIND_WORDS.get(kind, kind)


#: the smallest magnitude a non-zero number may have (2.2e-308, the smallest normal float):
#: below it a float is subnormal (``1e-320``, ``5e-324``), holds a few bits of precision, and
#: as a rate or a period means nothing (``maxPerSecond: 1e-320``), its inverse infinite
MIN_NONZERO = sys.float_info.min
#: what a value below :data:`MIN_NONZERO` is told
TOO_SMALL = (f"is too close to 0 (below {MIN_NONZERO:.1e}: a subnormal number, meaningless as a rate or a "
             "period, infinite inverted); write 0 where 0 is allowed, or a larger number")


def in_range(v: float, lo: Optional[float] = None, hi: Optional[float] = None,
             lo_open: bool = False, hi_open: bool = False) -> bool:
    """Whether number ``v`` is finite, zero or at least :data:`MIN_NONZERO` in magnitude, and
    within [lo, hi] (open ends respected). An int of any size is compared exactly (no float
    conversion, which overflows past 1.8e308)."""
    return range_problem(v, lo, hi, lo_open, hi_open) is None


def range_problem(v: float, lo: Optional[float] = None, hi: Optional[float] = None,
                  lo_open: bool = False, hi_open: bool = False) -> Optional[str]:
    """What an error says after the value when :func:`in_range` refuses ``v`` (``is out of
    range``, or :data:`TOO_SMALL`), else None: the one range rule of the policy and the settings."""
    if isinstance(v, float) and v != 0.0 and abs(v) < MIN_NONZERO:
        return TOO_SMALL
    if isinstance(v, float) and not math.isfinite(v):
        return "is out of range"
    if lo is not None and (v <= lo if lo_open else v < lo):
        return "is out of range"
    if hi is not None and (v >= hi if hi_open else v > hi):
        return "is out of range"
    return None


def show(value: Any) -> str:
    """A value as an error message quotes it: YAML spelling, strings quoted, cut at 60 characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 10_000:
        return f"an integer of {value.bit_length()} bits"  # (str() refuses past 4300 digits)
    text = repr(value) if isinstance(value, str) else str(value)
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    return text if len(text) <= 60 else text[:57] + "..."


def closest(key: str, options: Sequence[str]) -> Optional[str]:
    """The option ``key`` most likely misspells (difflib, or the same letters ignoring case
    and ``_``), or None."""
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.6)
    if close:
        return close[0]
    lowered = {o.lower().replace("_", ""): o for o in options}
    return lowered.get(key.lower().replace("_", ""))


def suggest(key: str, options: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the :func:`closest` option, else ``""``."""
    hit = closest(key, options)
    return f" (did you mean {hit!r}?)" if hit else ""


#: how an error says which digits a number is read in
ASCII_DIGITS_HINT = "write it in the ASCII digits 0-9"
#: how an error says a number given as text has no digit separators
NO_UNDERSCORE_HINT = "write it without '_' separators"


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is a non-empty run of the ASCII digits 0-9, the only digits a setting,
    a port or an index is read in. Python's ``str.isdigit`` and ``int()`` take any script's
    digits (``'١٢'``, full-width ``'１２'``; ``isdigit`` even ``'²'``, which ``int()`` then
    refuses), so an Arabic-Indic port was taken as a number and a superscript one crashed."""
    return text.isascii() and text.isdigit()


def number_text_hint(text: str) -> Optional[str]:
    """Why ``text`` (a number given as text: an environment variable, ``--set``, a quoted or
    unquoted-but-text YAML value) cannot be read as a number before ``int()``/``float()`` see it,
    or None. Both take any script's digits (:func:`ascii_digits`) and ``_`` between digits
    (``'1_000'`` is 1000), which YAML 1.2 does not (``1_000`` in a file is text), so a number
    read from text read more than the same number written in a file."""
    if not text.isascii():
        return ASCII_DIGITS_HINT
    if "_" in text:
        return NO_UNDERSCORE_HINT
    return None


#: the longest class name accepted (COCO's longest is 14 characters)
MAX_NAME_CHARS = 256


def class_name_form(name: str) -> str:
    """The one form a class name is matched in: Unicode normal form C. A name taken from a
    macOS file name is decomposed (NFD) and differed from the same name typed elsewhere (NFC),
    though both look alike; the model loader (:mod:`edgewise.runtime.metadata`) and the policy
    loader (``spec.classes`` keys) both take names through here, so an edge model, a cloud model
    and a policy agree on a name whichever form each was written in. A name over 4 times
    :data:`MAX_NAME_CHARS` is returned as it is (it is refused for its length anyway, and
    normalising megabytes is slow)."""
    return unicodedata.normalize("NFC", name) if len(name) <= 4 * MAX_NAME_CHARS else name


#: ``kind`` of an escalation policy file (:mod:`edgewise.policy.schema`).
POLICY_KIND = "EscalationPolicy"


def other_file_hint(top_keys: Collection[str], kind: object, read_as_policy: bool) -> str:
    """For an unknown key at the top of a file: ``"; ..."`` saying it is the other kind of file
    (a policy given as ``--config``, or a settings file given as the policy), else ``""``.
    The loaders' own "unknown key; allowed: ..." named the first key and nothing else."""
    if not read_as_policy and kind == POLICY_KIND:
        return (f"; this file is an escalation policy (kind: {POLICY_KIND}), not settings: the edge daemon "
                "reads it from policy_file (--policy)")
    if read_as_policy and "kind" not in top_keys and "spec" not in top_keys:
        return (f"; this file is no escalation policy (a policy has apiVersion, kind: {POLICY_KIND}, metadata "
                "and spec at its top): settings go to --config, the policy is the file policy_file names")
    return ""
