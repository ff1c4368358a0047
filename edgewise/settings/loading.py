"""The settings loader of every process: defaults < YAML < environment < ``--set`` < named flags.

A process declares its settings once, as a :class:`Schema`: the root dataclass
(fields declared with :func:`edgewise.settings.setting`), the short cross-field
``validate`` function, and its named flags. :meth:`Schema.load` then

1. reads the YAML file (``--config``) into a tree that keeps every value's line;
2. lays the environment (``EDGEWISE_<PROCESS>__SECTION__KEY``, in name order), the
   ``--set KEY.PATH=VALUE`` items and the named flags over it, each value tagged
   with its variable or flag; list items are addressed by index
   (``streams.0.fps``, ``EDGEWISE_EDGE__STREAMS__0__FPS``);
3. builds the typed dataclasses once, strictly (:mod:`edgewise.settings.building`),
   each error naming the origin of the bad value:
   ``edge.yaml:14: cloud.mqtt.port: 70000 is out of range; allowed: an integer in
   [1, 65535]``, ``EDGEWISE_GATEWAY__BALANCR__MODE: balancr: unknown key (did you mean
   EDGEWISE_GATEWAY__BALANCER__MODE?)``, ``--port: 'x' is not an integer``;
   A value the environment gave that the command line replaces is logged (a WARNING
   naming both): in a Helm pod or a systemd unit the operator edits the environment
   (``worker.envFrom``, ``/etc/default/edgewise-edge``), not the command line, and the
   chart's ``--max-batch=8`` overrode an ``EDGEWISE_WORKER__BATCHING__MAX_BATCH_SIZE=16``
   without a word;
4. runs ``validate``, whose :class:`~edgewise.settings.fields.Invalid` path is
   mapped back to where that value was set; a rule between keys, to the latest layer
   that set any key it reads (``--min: max_replicas: need min_replicas <=
   max_replicas``, not the file, which set neither).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Generic,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

from edgewise.errors import ConfigError
from edgewise.fieldrules import ascii_digits, closest
from edgewise.settings.building import build_section
from edgewise.settings.fields import Invalid, fields_of, walk
from edgewise.settings.tree import (
    Override,
    Part,
    Source,
    Val,
    describe,
    env_overrides,
    fail,
    lookup,
    read_yaml,
    set_override,
    to_val,
    value_overrides,
)
from edgewise.settings.values import is_mapping, is_section, optional, sequence

log = logging.getLogger("edgewise.settings")

T = TypeVar("T")
Overrides = Union[Mapping[str, Any], Sequence[Union[str, Override]]]


@dataclass(frozen=True)
class Flag:
    """A named command-line flag that sets one key path (``--port`` -> ``port``).

    ``repeat``: the flag may be given several times and sets a list; ``switch``: it
    takes no value and sets true; ``implies``: other (key path, value) pairs it sets.
    ``help`` defaults to the setting's doc.
    """

    name: str
    path: str
    help: str = ""
    repeat: bool = False
    switch: bool = False
    implies: Tuple[Tuple[str, Any], ...] = ()
    metavar: str = ""


class Schema(Generic[T]):
    """The settings of one process: root dataclass, cross-field validation, named flags."""

    def __init__(self, process: str, root: Type[T], command: str,
                 validate: Optional[Callable[[T], None]] = None, flags: Sequence[Flag] = (),
                 notes: Optional[Callable[[], Sequence[str]]] = None) -> None:
        self.process = process
        self.root = root
        self.command = command
        self.validate = validate
        self.flags = tuple(flags)
        self.notes = notes
        """Lines ``--describe-settings`` adds about this machine (what an ``auto`` resolves to)."""

    @property
    def env_prefix(self) -> str:
        """``EDGEWISE_<PROCESS>__``."""
        return f"EDGEWISE_{self.process.upper()}__"

    def env_name(self, key: str) -> str:
        """Environment variable of key path ``key`` (``streams[].fps`` -> ``..._STREAMS__<N>__FPS``)."""
        return self.env_prefix + "__".join(key.replace("[]", ".<N>").split(".")).upper()

    def load(self, config: Optional[Union[str, os.PathLike[str]]] = None, overrides: Overrides = (),
             env: Optional[Mapping[str, str]] = None) -> T:
        """Build and validate the settings (see the module docstring for the layers).

        Args:
            config: YAML file, or None.
            overrides: ``KEY.PATH=VALUE`` strings (``--set``), overrides from the flags
                (:func:`edgewise.settings.cli.overrides_from_args`), or a mapping of key
                path to Python value (for programs and tests).
            env: environment (default ``os.environ``).

        Raises:
            ConfigError: the first problem, naming where the bad value came from.
        """
        label = str(config) if config else f"{self.process} settings"
        tree = read_yaml(config, f"{self.process} settings") if config else Val({}, Source(label))
        layers = env_overrides(self.process.upper(), dict(os.environ if env is None else env),
                               _env_names(self))
        if isinstance(overrides, Mapping):
            layers += value_overrides(dict(overrides))
        else:
            layers += [o if isinstance(o, Override) else set_override(o) for o in overrides]
        default = self.root()
        for ov in layers:
            self._apply(tree, ov, default)
        settings: T = build_section(self.root, tree, default)
        if self.validate is not None:
            try:
                self.validate(settings)
            except Invalid as exc:
                rank = {ov.src: i for i, ov in enumerate(layers, 1)}  # later layers win; the file is 0
                raise _blame(exc, tree, Source(label), rank) from None
        return settings

    def _apply(self, tree: Val, ov: Override, default: Any) -> None:
        """Put override ``ov`` into ``tree``, checking its key path against the schema."""
        node: Val = tree
        tp: Any = self.root
        dflt = default
        done: List[Part] = []
        for i, part in enumerate(ov.path):
            tp = optional(tp)[0]
            key: Part
            secret = False
            if is_section(tp):
                infos = fields_of(tp)
                if part not in infos:
                    raise self._unknown(ov, done, part, list(infos))
                key, tp, secret = part, infos[part].type, infos[part].spec.secret
                dflt = getattr(dflt, part) if dflt is not None else infos[part].default()
            elif sequence(tp) is not None:
                n = len(node.data)
                if not ascii_digits(part) or int(part) >= n:
                    raise fail(ov.src, done, f"has no item {part}; add items in the file",
                               f"an index from 0 to {n - 1}" if n else "none: the list is empty")
                key, tp = int(part), sequence(tp)[0]  # type: ignore[index]
                dflt = dflt[key] if dflt is not None and key < len(dflt) else None
            elif is_mapping(tp):
                key, tp, dflt = part, Any, None
            else:
                raise fail(ov.src, done, f"is a single value; it has no key {part!r}")
            done.append(key)
            if i == len(ov.path) - 1:
                before = node.data.get(key) if isinstance(node.data, dict) else node.data[key]
                if before is not None and _from_env(before.src) and not _from_env(ov.src):
                    log.warning("%s is not in force: %s replaces it (later layers win: the environment < "
                                "--set < the named flags)", before.src.label, ov.src.label)
                node.data[key] = Val(ov.value, ov.src, True) if ov.text else to_val(ov.value, ov.src)
                return
            node = _container(node, key, tp, dflt, ov.src, done, secret)

    def _unknown(self, ov: Override, done: List[Part], part: str, options: List[str]) -> ConfigError:
        hit = closest(part, options)
        hint = ""
        if hit:
            fixed = list(ov.path)
            fixed[len(done)] = hit
            hint = f" (did you mean {self.env_prefix + '__'.join(fixed).upper()}?)" \
                if ov.src.label.startswith("EDGEWISE_") else f" (did you mean {'.'.join(fixed)!r}?)"
        return fail(ov.src, done + [part], f"unknown key{hint}", " | ".join(options))


def _blame(exc: Invalid, tree: Val, default: Source, rank: Mapping[Source, int]) -> ConfigError:
    """``exc`` (a key path and a problem) prefixed with where that key was last set: of the
    keys its rule reads (``exc.path`` and ``exc.also``), the one set by the latest layer (the
    rule's own key on a tie); none of them set, the deepest section around ``exc.path``."""
    parts = _parts(exc.path)
    found_all = (lookup(tree, _parts(key), exact=True) for key in (exc.path, *exc.also))
    set_here = [v for v in found_all if v is not None and v is not tree]
    if set_here:
        src = max(set_here, key=lambda v: rank.get(v.key_src, 0)).key_src
    else:
        found = lookup(tree, parts)
        src = found.key_src if found is not None and found is not tree else default
    return fail(src, [int(p) if ascii_digits(p) else p for p in parts], exc.problem, exc.allowed)


def _from_env(src: Source) -> bool:
    """Whether ``src`` is an environment variable (``EDGEWISE_<PROCESS>__...``)."""
    return src.label.startswith("EDGEWISE_")


def _parts(path: str) -> List[str]:
    """``streams[0].fps`` -> ``["streams", "0", "fps"]``."""
    return [p for p in re.split(r"[.\[\]]+", path) if p]


@functools.lru_cache(maxsize=None)
def _env_names(schema: Schema[Any]) -> Tuple[str, ...]:
    return tuple(schema.env_name(key) for key, _info in walk(schema.root))


def _container(node: Val, key: Part, tp: Any, dflt: Any, src: Source, path: List[Part],
               secret: bool = False) -> Val:
    """The mapping or list at ``node[key]``, created (from the default) when absent. (A
    ``secret`` value found instead is not quoted: ``--set cloud.token.x=1`` printed the token.)"""
    inner = optional(tp)[0]
    want = list if sequence(inner) is not None else dict
    child = node.data[key] if isinstance(node.data, list) else node.data.get(key)  # type: ignore[index]
    if child is None or child.data is None:
        new = to_val(dflt if dflt is not None else [], src) if want is list else Val({}, child.key_src if child else src)
        node.data[key] = new
        return new
    if not isinstance(child.data, want):
        raise fail(child.key_src, path, f"expected {'a list' if want is list else 'a mapping'}, got "
                                    f"{'***' if secret else describe(child.data)}")
    return child
