"""The command-line conventions every process shares, from its :class:`Schema`.

``--config FILE`` (``-c``), repeatable ``--set KEY.PATH=VALUE``, ``--describe-settings``
(prints every key and exits 0), plus the process's named flags (``--port`` ->
``port``), which are read as text and converted by the loader, so a bad value is
reported like any other (``--port: 'x' is not an integer``). Flags override
``--set``, which overrides the environment, which overrides the file.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, List, Mapping, Optional, Sequence, TypeVar

from edgewise.fieldrules import ascii_digits, number_text_hint
from edgewise.settings.describing import describe
from edgewise.settings.fields import walk
from edgewise.settings.loading import Flag, Schema
from edgewise.settings.tree import Override, Source, set_override

T = TypeVar("T")


class _Describe(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, schema: Schema[Any], help: str = "") -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.schema = schema

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        sys.stdout.write(describe(self.schema) + "\n")
        parser.exit(0)


def positive_int(text: str) -> int:
    """An argparse ``type`` for a whole number >= 1 in the ASCII digits 0-9, the digits every setting
    is read in (:func:`edgewise.fieldrules.ascii_digits`); ``int()`` alone took ``'١٢'``, ``'１２'``
    and ``'1_000'``. A ValueError becomes argparse's usage error; one for a number in other digits
    or with ``_`` says how to write it."""
    digits = text.strip()
    if not ascii_digits(digits):
        hint = number_text_hint(digits)
        if hint:
            raise argparse.ArgumentTypeError(f"invalid {positive_int.__name__} value: {text!r} ({hint})")
        raise ValueError(text)
    n = int(digits)
    if n < 1:
        raise ValueError(text)
    return n


positive_int.__name__ = "whole number >= 1"  # argparse says "invalid <name> value: '0'"


def _dest(flag: Flag) -> str:
    return "setting" + flag.name


def add_settings_arguments(parser: argparse.ArgumentParser, schema: Schema[Any]) -> None:
    """Add ``--config``, ``--set``, ``--describe-settings`` and ``schema``'s named flags."""
    parser.add_argument("--config", "-c", metavar="FILE", help=f"{schema.process} settings YAML")
    parser.add_argument("--set", dest="settings_set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override one setting (repeatable); list items by index, e.g. KEY.0.SUBKEY=VALUE")
    parser.add_argument("--describe-settings", action=_Describe, schema=schema,
                        help="print every setting (type, default, allowed values, environment variable) and exit")
    docs = dict(walk(schema.root))
    for flag in schema.flags:
        help_text = f"{flag.help or docs[flag.path].spec.doc} (sets {flag.path})".replace("%", "%%")
        metavar = flag.metavar or flag.path.rsplit(".", 1)[-1].upper()
        if flag.switch:
            parser.add_argument(flag.name, dest=_dest(flag), action="store_const", const=True,
                                default=None, help=help_text)
        else:
            parser.add_argument(flag.name, dest=_dest(flag), action="append" if flag.repeat else "store",
                                default=None, metavar=metavar, help=help_text)


def overrides_from_args(args: argparse.Namespace, schema: Schema[Any]) -> List[Override]:
    """The ``--set`` items, then the named flags that were given, as loader overrides."""
    out = [set_override(item) for item in args.settings_set]
    for flag in schema.flags:
        value = getattr(args, _dest(flag), None)
        if value is None:
            continue
        src = Source(flag.name, tuple(flag.path.split(".")))
        for path, implied in flag.implies:
            out.append(Override(tuple(path.split(".")), implied, Source(flag.name), text=False))
        out.append(Override(src.path, value, src, text=isinstance(value, str)))
    return out


def settings_from_args(args: argparse.Namespace, schema: Schema[T], env: Optional[Mapping[str, str]] = None) -> T:
    """The validated settings for parsed ``args`` (see :meth:`Schema.load`)."""
    return schema.load(args.config, overrides_from_args(args, schema), env)
