"""Settings values with their origin: the YAML file's nodes (``file:line``) and the overrides.

The loader first collects every layer into one tree of :class:`Val` (a mapping,
list or scalar plus the :class:`Source` it came from), then builds the typed
dataclasses from it once, so an error names the origin of the exact value:
``edge.yaml:14`` (the YAML is *composed*, so each key keeps its node's line),
``EDGEWISE_EDGE__CLOUD__TOKEN``, ``--set cloud.token``, ``--metrics-port``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import yaml

from edgewise import yamlnodes
from edgewise.errors import ConfigError
from edgewise.fieldrules import ascii_digits, closest, show

#: One step of a key path: a key, or an index into a list.
Part = Union[str, int]


@dataclass(frozen=True)
class Source:
    """Where a value came from: ``label`` starts its error messages; ``path`` is the key
    path an override sets (errors at exactly that path need not repeat it)."""

    label: str
    path: Tuple[str, ...] = ()


class Val:
    """A value in the layered tree: ``data`` is a dict of Val, a list of Val or a scalar."""

    __slots__ = ("data", "src", "key_src", "text", "written")

    def __init__(self, data: Any, src: Source, text: bool = False, written: Optional[str] = None) -> None:
        self.data = data
        self.src = src
        self.key_src = src  # the line of the key (for unknown-key errors)
        self.text = text  # given as text (environment, --set, flag), not by YAML
        #: a YAML scalar YAML read as a number, as written: a text field takes it verbatim
        #: (``token: 012`` is "012", not the octal 10; ``version: 1.10`` is "1.10")
        self.written = written


@dataclass(frozen=True)
class Override:
    """One value set over the file: ``path`` (keys and item indices as written), ``value``
    (text from the environment or a flag, or a Python value), its source."""

    path: Tuple[str, ...]
    value: Any
    src: Source
    text: bool = True


def dotted(path: Sequence[Part]) -> str:
    """``("streams", 0, "fps")`` -> ``streams[0].fps``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def fail(src: Source, path: Sequence[Part], problem: str, allowed: str = "") -> ConfigError:
    """``SOURCE: key.path: problem; allowed: values`` (the path left out when the source
    is an override of exactly that key)."""
    where = "" if not path or tuple(str(p) for p in path) == src.path else f"{dotted(path)}: "
    tail = f"; allowed: {allowed}" if allowed else ""
    return ConfigError(f"{src.label}: {where}{problem}{tail}")


def describe(data: Any) -> str:
    """What a value is, for "expected a mapping, got ..." messages."""
    if isinstance(data, dict):
        return "a mapping"
    if isinstance(data, list):
        return "a list"
    return show(data)


# --------------------------------------------------------------------------- YAML

def read_yaml(path: Union[str, os.PathLike[str]], what: str, mapping: bool = True,
              size: yamlnodes.SizeLimits = yamlnodes.SETTINGS_SIZE) -> Val:
    """The YAML file at ``path`` as a :class:`Val` tree (``{}`` for an empty file; with
    ``mapping=False`` the top level may be any value, ``[]`` when empty), at most as large
    as ``size`` allows.

    Raises:
        ConfigError: unreadable or oversized file, invalid YAML (with its line), a top level
            that is not a mapping, a duplicate or non-string key (see :mod:`edgewise.yamlnodes`).
    """
    text = yamlnodes.decode(yamlnodes.read_bytes(os.fspath(path), what, size=size), str(path), what)
    return parse_yaml(text, str(path), what, mapping, size)


def parse_yaml(text: str, name: str, what: str, mapping: bool = True,
               size: yamlnodes.SizeLimits = yamlnodes.SETTINGS_SIZE) -> Val:
    """YAML ``text`` as a :class:`Val` tree; ``name`` labels its lines (see :func:`read_yaml`)."""
    with yamlnodes.guarded(name, what):
        root, loader = yamlnodes.compose(text, name, size)
        try:
            if root is None:
                return Val({} if mapping else [], Source(name))
            if mapping and not isinstance(root, yaml.MappingNode):
                raise ConfigError(f"{name}:{root.start_mark.line + 1}: the top level must be a mapping of {what}")
            return _node(root, name, (), loader)
        finally:
            loader.dispose()


def _node(node: yaml.Node, name: str, path: Tuple[Part, ...], loader: yaml.SafeLoader) -> Val:
    src = Source(f"{name}:{node.start_mark.line + 1}")
    if isinstance(node, yaml.MappingNode):
        def key_error(knode: yaml.Node, problem: str) -> ConfigError:
            key = loader.construct_object(knode) if isinstance(knode, yaml.ScalarNode) else None
            at = path + (key,) if isinstance(key, str) else path
            return fail(Source(f"{name}:{knode.start_mark.line + 1}"), at, problem)

        out: Dict[str, Val] = {}
        for key, (knode, vnode) in yamlnodes.mapping_pairs(node, loader, key_error).items():
            out[key] = _node(vnode, name, path + (key,), loader)
            out[key].key_src = Source(f"{name}:{knode.start_mark.line + 1}")
        return Val(out, src)
    if isinstance(node, yaml.SequenceNode):
        return Val([_node(n, name, path + (i,), loader) for i, n in enumerate(node.value)], src)
    value = loader.construct_object(node, deep=True)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)  # yes/no stay booleans: refused as text
    written = node.value if number and isinstance(node.value, str) else None
    return Val(value, src, written=written)


# --------------------------------------------------------------------------- overrides

def set_override(item: str) -> Override:
    """``KEY.PATH=VALUE`` (a ``--set`` argument) as an override."""
    key, eq, value = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set metrics.port=9100")
    parts = tuple(key.split("."))
    return Override(parts, value, Source(f"--set {key}", parts))


def value_overrides(values: Dict[str, Any]) -> List[Override]:
    """Key path -> Python value (programmatic overrides) as overrides."""
    out = []
    for key, value in values.items():
        parts = tuple(key.split("."))
        out.append(Override(parts, value, Source(f"override {key}", parts), text=isinstance(value, str)))
    return out


def env_overrides(word: str, env: Dict[str, str], known: Sequence[str]) -> List[Override]:
    """Overrides from ``EDGEWISE_<WORD>__KEY__SUBKEY`` variables, in name order.

    Any other variable starting with ``EDGEWISE_<WORD>_`` (a single ``_``, as older
    releases spelled them) is an error naming it, with the closest of ``known``; so is
    one whose process word misspells ``<WORD>`` (``EDGEWISE_GATWAY__LISTEN``), which
    was ignored without a word. The variables of the other processes (a shared
    environment file) are left alone: no two process words are that close.
    """
    prefix = f"EDGEWISE_{word}__"
    out = []
    for name in sorted(env):
        if name.startswith(prefix[:-1]):
            rest = name[len(prefix) - 1:].lstrip("_")
        else:
            other = re.fullmatch(r"EDGEWISE_([A-Z0-9]+)__(.+)", name)
            if other is None or closest(other.group(1), [word]) is None:
                continue  # not this process's (another's, or no settings variable)
            rest = other.group(2)
        if not name.startswith(prefix) or len(name) == len(prefix):
            hit = closest(prefix + rest, known)
            raise ConfigError(f"{name}: not a settings variable; {word.lower()} settings are named "
                              f"{prefix}<KEY>__<SUBKEY>" + (f" (did you mean {hit}?)" if hit else ""))
        parts = tuple(p.lower() for p in name[len(prefix):].split("__"))
        out.append(Override(parts, env[name], Source(name, parts)))
    return out


# --------------------------------------------------------------------------- plain values

def to_val(value: Any, src: Source) -> Val:
    """A Python value (a default: dataclass, list, scalar) as a :class:`Val` tree."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return Val({f.name: to_val(getattr(value, f.name), src) for f in dataclasses.fields(value)}, src)
    if isinstance(value, (list, tuple)):
        return Val([to_val(v, src) for v in value], src)
    if isinstance(value, dict):
        return Val({k: to_val(v, src) for k, v in value.items()}, src)
    return Val(value, src)


def plain(val: Val) -> Any:
    """A :class:`Val` tree as plain Python (text leaves read as YAML scalars: ``8`` is 8)."""
    if isinstance(val.data, dict):
        return {k: plain(v) for k, v in val.data.items()}
    if isinstance(val.data, list):
        return [plain(v) for v in val.data]
    if val.text and isinstance(val.data, str):
        try:
            return yaml.load(val.data, Loader=yamlnodes.Loader)  # numbers as a file reads them
        except yaml.YAMLError:
            return val.data
    return val.data


def lookup(root: Val, parts: Sequence[str], exact: bool = False) -> Optional[Val]:
    """The deepest :class:`Val` along ``parts`` (list indices as digits); ``exact``: the one
    at ``parts`` itself, or None where it was not set."""
    node: Optional[Val] = root
    for p in parts:
        data = node.data if node is not None else None
        if isinstance(data, dict) and p in data:
            nxt: Optional[Val] = data[p]
        elif isinstance(data, list) and ascii_digits(p) and int(p) < len(data):
            nxt = data[int(p)]
        else:
            return None if exact else node
        node = nxt
    return node
