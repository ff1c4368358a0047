"""YAML composed into nodes, safely: the one reader of settings files and policy files.

Both loaders compose (not load) their YAML so every value keeps its line. What can go
wrong while reading hostile or broken text is handled here, once, as a
:class:`~edgewise.errors.ConfigError` naming the file:

- invalid YAML, with its line;
- alias expansion ("billion laughs": nine levels of ``&a [*b, *b, ...]`` expand to 10^9
  values from a few hundred bytes) and very large files: the composed tree may hold at most
  :data:`MAX_NODES` values counting every alias expansion (a settings or policy file holds a
  few hundred), and a file at most :data:`MAX_BYTES` (a file that grows with a fleet, the
  gateway's device tokens, has larger :class:`SizeLimits` of its own);
- nesting deeper than Python's recursion limit, numbers of thousands of digits, memory.

YAML merge keys (``<<: *defaults``) are resolved as YAML defines them: the mapping's own
keys win over merged ones; a key written twice in the same mapping is an error.

Numbers are read as YAML 1.2's core schema reads them (:class:`Loader`), not by PyYAML's
YAML 1.1 rules: ``010`` is ten (YAML 1.1: eight, octal), ``1:30`` is text (YAML 1.1: ninety,
base 60), ``1_000`` is text; ``0o17`` and ``0x1f`` are octal and hex. So a number in a file
reads as the same text does in an environment variable or ``--set`` (``metrics.port: 010``
was port 8 in the file and 10 in the environment, found by a probe). A program that rewrites
a settings file reads it with :func:`load_as_written` and writes it with :class:`Dumper`, so the
daemon reads what the file said (``edge provision`` turned stream ids ``01`` and ``010`` into
``1`` and ``8``).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import yaml

from edgewise.errors import ConfigError
from edgewise.filereads import read_capped

#: Files larger than this are refused (settings and policies are a few KB).
MAX_BYTES = 1 << 20
#: Values a composed file may hold, every alias expansion counted.
MAX_NODES = 100_000


@dataclass(frozen=True)
class SizeLimits:
    """How large a file of one kind may be: ``max_bytes`` and ``max_values`` (every alias
    expansion counted); ``usual`` says in the refusal how large such a file is. The default, for
    settings and policy files; a file that grows with a fleet (the gateway's device tokens) has
    its own."""

    max_bytes: int = MAX_BYTES
    max_values: int = MAX_NODES
    usual: str = "a settings or policy file holds a few hundred values"


SETTINGS_SIZE = SizeLimits()

_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema numbers (module doc)."""


def _int_1_2(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text[:2] in ("0o", "0x"):
        return int(text, 8 if text[:2] == "0o" else 16)
    try:
        return int(text, 10)
    except ValueError:  # an explicit !!int tag: 0b11, +0x1f
        return int(text.replace("_", ""), 0)


Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(_INT_TAG, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                             list("-+0123456789"))
Loader.add_implicit_resolver(
    _FLOAT_TAG, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                           r"|\.(?:nan|NaN|NAN))$"), list("-+.0123456789"))
Loader.add_constructor(_INT_TAG, _int_1_2)


class Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper with :class:`Loader`'s number rules: a scalar is written plain only
    where :class:`Loader` reads it back as the same type (text ``01`` or ``1_000`` is quoted,
    ``1e3`` written plain). For files the daemon reads that a program writes (``edge provision``)."""


Dumper.yaml_implicit_resolvers = {first: list(resolvers) for first, resolvers in Loader.yaml_implicit_resolvers.items()}


class Written(str):
    """A number as its file wrote it (``01``, ``1.50``), with its YAML tag: what
    :func:`load_as_written` reads a number as, and :class:`Dumper` writes back unchanged."""

    tag = _INT_TAG


class _WrittenLoader(Loader):
    """:class:`Loader` that keeps each number's text (:class:`Written`)."""


def _written(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Written:
    out = Written(loader.construct_scalar(node))
    out.tag = node.tag
    return out


_WrittenLoader.add_constructor(_INT_TAG, _written)
_WrittenLoader.add_constructor(_FLOAT_TAG, _written)
Dumper.add_representer(Written, lambda dumper, data: dumper.represent_scalar(data.tag, str(data)))


def load_as_written(text: str) -> object:
    """``text`` (one YAML document) as Python values, every number kept as written
    (:class:`Written`): a program that rewrites a settings file with :class:`Dumper` gives the
    daemon the text it would have read. The daemon reads ``id: 01`` and ``id: 1_000`` as the
    texts ``01`` and ``1_000`` where a string goes (settings/tree.py keeps a number's text); read
    as YAML 1.1 numbers and written back, they were ``1`` and ``1000``."""
    return yaml.load(text, Loader=_WrittenLoader)  # (a SafeLoader)


@contextlib.contextmanager
def guarded(name: str, what: str) -> Iterator[None]:
    """Turn what reading ``name`` can raise besides ConfigError into one ConfigError line."""
    try:
        yield
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{name}: nested too deeply to read; {what} files are a few levels deep, "
                          "is this the right file?") from None
    except MemoryError:
        raise ConfigError(f"{name}: too large to read into memory; is this the right file?") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc) or "Exceeds the limit" in str(exc):
            raise ConfigError(f"{name}: a number has too many digits; use a number of at most a few "
                              "digits") from None
        raise ConfigError(f"{name}: cannot read the {what}: {exc}") from None
    except yaml.MarkedYAMLError as exc:  # a tag or merge key no reader here takes: its line
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = ", ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"{name}{line}: cannot read a value: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: cannot read a value: {' '.join(str(exc).split())}") from None
    except Exception as exc:  # a reader of live reloads must refuse the file, never stop
        raise ConfigError(f"{name}: cannot read the {what}: {type(exc).__name__}: {exc}") from None


def read_bytes(path: Union[str, Path], what: str, regular_only: bool = True, expected: str = "",
               size: SizeLimits = SETTINGS_SIZE) -> bytes:
    """The bytes of the ``what`` file (``policy``, ``edge settings``) at ``path``, at most
    ``size.max_bytes``; a ConfigError saying why it cannot be read.

    ``regular_only``: refuse anything but a regular file (after symlinks) without waiting on it:
    a named pipe would block the reader until a writer comes (a daemon's start, its reload, a
    gateway's SIGHUP, which froze its event loop: found by a probe). Off only for ``check-policy``,
    which reads pipes (``check-policy <(kubectl get configmap ...)``). ``expected`` words what
    the file should be (default: a ``what`` YAML file)."""
    p = Path(path)
    expected = expected or f"{'an' if what[:1] in 'aeiou' else 'a'} {what} YAML file"
    try:
        data, found = read_capped(p, size.max_bytes, expected, regular_only)
    except FileNotFoundError:
        raise ConfigError(f"{p}: {what} file not found; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, expected {expected}") from None
    except PermissionError:
        raise ConfigError(f"{p}: permission denied reading the {what} file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the {what} file: {exc.strerror or exc}") from None
    check_size(found, str(p), what, size)
    return data


def decode(data: bytes, name: str, what: str) -> str:
    """UTF-8 ``data`` as text; a ConfigError saying to save the ``what`` file as UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8 text ({exc}); save the {what} file as UTF-8") from None


def check_size(size: int, name: str, what: str, limits: SizeLimits = SETTINGS_SIZE) -> None:
    """Refuse a file of ``size`` bytes over ``limits.max_bytes``."""
    if size > limits.max_bytes:
        raise ConfigError(f"{name}: {what} file is {size} bytes, over the {limits.max_bytes}-byte limit "
                          f"({limits.usual}); is this the right file?")


def compose(text: str, name: str, size: SizeLimits = SETTINGS_SIZE) -> Tuple[Optional[yaml.Node], yaml.SafeLoader]:
    """The single document of ``text`` as a node tree (None when empty) and its loader,
    whose ``construct_object`` reads scalars; the caller disposes of the loader.

    Raises:
        ConfigError: invalid YAML (with its line), a NUL or other character YAML does not
            allow, several documents, or a tree over ``size.max_values`` values.
    """
    loader: Optional[yaml.SafeLoader] = None
    try:
        loader = Loader(text)  # reads every character: a NUL is refused here
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        if loader is not None:
            loader.dispose()
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context
        if exc.context and str(problem).startswith("but "):  # the half that says what was expected
            problem = f"{exc.context}, {problem}"  # ("expected a single document in the stream, but found ...")
        hint = _bracket_hint(text, mark.line, mark.column) if mark is not None else ""
        raise ConfigError(f"{name}{line}: not valid YAML: {problem}{hint}") from None
    except yaml.YAMLError as exc:
        if loader is not None:
            loader.dispose()
        problem = getattr(exc, "reason", None) or " ".join(str(exc).split())
        where = f" at character {exc.position}" if isinstance(exc, yaml.reader.ReaderError) else ""
        raise ConfigError(f"{name}: not valid YAML{where}: {problem}") from None
    if root is not None:
        _check_expanded_size(root, name, size)
    return root, loader


#: an IPv6 literal with a port written unquoted: ``[::1]:50051``, which YAML reads as a list
_BRACKETED_ADDRESS = re.compile(r"(?<![\"'\w])(\[[0-9A-Za-z:.%]*:[0-9A-Za-z:.%]*\]:[0-9]+)")


def _bracket_hint(text: str, line: int, column: int) -> str:
    """How to write an IPv6 address with a port that line ``line`` (from 0) of ``text`` holds
    unquoted: YAML reads ``[`` as the start of a list, so ``- [::1]:50051`` is not valid YAML.
    Only for the address the error is in (its ``column``, from 0, falls within it): YAML stops
    inside ``[::1]:50051`` (at its first ``:``, or at the ``:port`` after ``]``), and an address
    elsewhere on the line (in a comment, in a quoted string) has nothing to do with the error."""
    lines = text.splitlines()
    if not 0 <= line < len(lines):
        return ""
    for found in _BRACKETED_ADDRESS.finditer(lines[line]):
        if found.start(1) <= column < found.end(1):
            return f"; quote an IPv6 address with a port, YAML reads '[' as a list: '{found.group(1)}'"
    return ""


def _check_expanded_size(root: yaml.Node, name: str, size: SizeLimits) -> None:
    """Count the values of the tree as a reader expands it (aliases are shared node objects
    reached several times), stopping at ``size.max_values``: the cost is bounded by the limit."""
    seen = 0
    stack: List[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        seen += 1
        if seen > size.max_values:
            raise ConfigError(f"{name}: expands to more than {size.max_values} values (YAML aliases "
                              f"repeating aliases?); {size.usual}")
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append(k)
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def mapping_pairs(node: yaml.MappingNode, loader: yaml.SafeLoader,
                  fail: Callable[[yaml.Node, str], ConfigError]) -> Dict[str, Tuple[yaml.Node, yaml.Node]]:
    """The mapping's entries by key, YAML merge keys resolved (own keys win over merged
    ones, of ``<<: [*a, *b]`` the first); ``fail(key_node, problem)`` makes the error for a
    key that is not a string or is written twice in this mapping, merge keys included (also
    in a mapping that is itself merged in)."""
    own: List[Tuple[yaml.Node, yaml.Node]] = []
    merged: List[Tuple[yaml.Node, yaml.Node]] = []
    _flatten(node, loader, fail, own, merged)
    out: Dict[str, Tuple[yaml.Node, yaml.Node]] = {}
    for knode, vnode in merged:  # merged entries first (error order as before), the first one kept
        key = _key(knode, loader, fail)
        if key not in out:
            out[key] = (knode, vnode)
    out.update(_once(own, loader, fail))  # an own key wins over a merged one
    return out


def _once(entries: List[Tuple[yaml.Node, yaml.Node]], loader: yaml.SafeLoader,
          fail: Callable[[yaml.Node, str], ConfigError]) -> Dict[str, Tuple[yaml.Node, yaml.Node]]:
    """One mapping's own entries by key; a key written twice is the error."""
    out: Dict[str, Tuple[yaml.Node, yaml.Node]] = {}
    for knode, vnode in entries:
        key = _key(knode, loader, fail)
        earlier = out.get(key)
        if earlier is not None:
            raise fail(knode, f"duplicate key (first defined on line {earlier[0].start_mark.line + 1})")
        out[key] = (knode, vnode)
    return out


def _key(knode: yaml.Node, loader: yaml.SafeLoader, fail: Callable[[yaml.Node, str], ConfigError]) -> str:
    key = loader.construct_object(knode) if isinstance(knode, yaml.ScalarNode) else None
    if not isinstance(key, str):
        raise fail(knode, f"keys must be strings, got {_desc(knode, loader)}{quote_hint(knode)}")
    return key


def _flatten(node: yaml.MappingNode, loader: yaml.SafeLoader, fail: Callable[[yaml.Node, str], ConfigError],
             own: List[Tuple[yaml.Node, yaml.Node]], merged: List[Tuple[yaml.Node, yaml.Node]]) -> None:
    """``node``'s own entries into ``own`` and the entries its merge key brings, in precedence
    order (of ``<<: [*a, *b]`` all of a's before b's, a merged mapping's own before what it
    merges), into ``merged``. Not PyYAML's ``flatten_mapping``: which merged entry wins there
    changed between releases (6.0.4 drops a repeated key only when the two key strings are the
    same object, so ``<<: [*a, *b]`` read b's ``threshold`` and a's ``x``); nor are merged entries
    written into the node (only the key '=' is retagged as text, as PyYAML does)."""
    merges = [(k, v) for k, v in node.value if k.tag == _MERGE_TAG]
    if len(merges) > 1:  # YAML allows one merge key per mapping; PyYAML let one of them win silently
        raise fail(_merge_key(merges[1][0]), f"a second merge key '<<' in one mapping (the first is on line "
                              f"{merges[0][0].start_mark.line + 1}); merge several with one key: "
                              "'<<: [*first, *second]'")
    for k, v in node.value:
        if k.tag == _VALUE_TAG:  # the key '=', text as PyYAML's flatten_mapping made it
            k.tag = _STR_TAG
        if k.tag != _MERGE_TAG:
            own.append((k, v))
    if not merges:
        return
    knode, value = merges[0]
    sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
    for src in sources:
        if not isinstance(src, yaml.MappingNode):
            loader.flatten_mapping(node)  # PyYAML's own error: "expected a mapping ... for merging"
            raise fail(_merge_key(knode), "a merge key '<<' takes a mapping or a list of mappings")
        src_own: List[Tuple[yaml.Node, yaml.Node]] = []
        src_merged: List[Tuple[yaml.Node, yaml.Node]] = []
        _flatten(src, loader, fail, src_own, src_merged)
        _once(src_own, loader, fail)  # a mapping merged in has each key once too
        merged.extend(src_own)  # its own entries first, then what it merges
        merged.extend(src_merged)


def _merge_key(knode: yaml.Node) -> yaml.Node:
    """A merge key as a text key, for an error's key path (its tag has no constructor)."""
    return yaml.ScalarNode(_STR_TAG, "<<", knode.start_mark, knode.end_mark)


#: why a text field got a boolean: the one wording of the settings, tokens files and model metadata
UNQUOTED_BOOLEAN = "YAML reads yes/no/on/off/true/false unquoted as a boolean: quote the value to mean the text"


def quote_hint(node: yaml.Node) -> str:
    """For a scalar YAML read as something else than text (``101``, ``yes``, ``null``): how to
    write it as text."""
    if isinstance(node, yaml.ScalarNode) and node.style is None:
        return f"; quote it to mean the text: '{node.value}'"
    return ""


def _desc(node: yaml.Node, loader: yaml.SafeLoader) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(loader.construct_object(node))
