"""Load and validate an escalation policy file, with errors that point at the line.

The YAML is *composed* (not just loaded) so every value keeps its node and the
node's mark: an error names the file, the 1-based line, the key path
(``spec.budget.maxFraction``), the bad value and the allowed values, e.g.::

    policy.yaml:14: spec.budget.maxFraction: 1.5 is out of range; allowed: a number in [0, 1]

Unknown keys are rejected with a "did you mean" suggestion; duplicate keys
(which plain YAML loaders silently resolve to the last one) are rejected too.
Validation is driven by the field metadata of :mod:`edgewise.policy.schema`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import yaml

from edgewise import yamlnodes
from edgewise.errors import ConfigError
from edgewise.fieldrules import other_file_hint, show, suggest
from edgewise.hardness.learned import GainModel
from edgewise.policy.fields import FieldSpec, field_specs
from edgewise.policy.schema import Policy


class _Ctx:
    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self.source = source
        self.loader = loader

    def fail(self, node: Optional[yaml.Node], path: str, problem: str, allowed: str = "") -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        where = f"{path}: " if path else ""
        tail = f"; allowed: {allowed}" if allowed else ""
        return ConfigError(f"{self.source}{line}: {where}{problem}{tail}")

    def scalar(self, node: yaml.Node) -> Any:
        return self.loader.construct_object(node, deep=True)


def _node_desc(node: yaml.Node, ctx: _Ctx) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return show(ctx.scalar(node))


def _mapping_items(
    node: yaml.Node, path: str, ctx: _Ctx
) -> Dict[str, Tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, path, f"expected a mapping, got {_node_desc(node, ctx)}", "a mapping")

    def key_error(knode: yaml.Node, problem: str) -> ConfigError:
        key = ctx.scalar(knode) if isinstance(knode, yaml.ScalarNode) else None
        if isinstance(key, str):
            return ctx.fail(knode, _join(path, key), problem, "each key once per mapping")
        return ctx.fail(knode, path or "(top level)",
                        f"keys must be strings, got {_node_desc(knode, ctx)}{yamlnodes.quote_hint(knode)}")

    return yamlnodes.mapping_pairs(node, ctx.loader, key_error)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _value(spec: FieldSpec, node: yaml.Node, path: str, ctx: _Ctx) -> Any:
    if spec.nullable and isinstance(node, yaml.ScalarNode) and ctx.scalar(node) is None:
        return None
    if spec.kind == "section":
        return _build(spec.cls, node, path, ctx)
    if spec.kind == "map":
        items = _mapping_items(node, path, ctx)
        out: Dict[str, Any] = {}
        lines: Dict[str, int] = {}
        for name, (knode, vnode) in items.items():
            if not name.strip():
                raise ctx.fail(knode, path, "empty name", "a non-empty name")
            if spec.key_form is not None:
                name = spec.key_form(name)  # class names in NFC, as the model loader takes them
                if name in lines:
                    raise ctx.fail(knode, _join(path, name),
                                   f"the same name as on line {lines[name]}, written in another Unicode form "
                                   "(one decomposed, NFD, as macOS file names give)", "each name once per mapping")
                lines[name] = knode.start_mark.line + 1
            out[name] = _build(spec.cls, vnode, f"{path}.{name}", ctx)
        return out
    if spec.kind == "weights":
        items = _mapping_items(node, path, ctx)
        weights: Dict[str, float] = {}
        wspec = FieldSpec(key="", kind="float", doc="", lo=0, hi=1)
        for name, (knode, vnode) in items.items():
            if name not in spec.keys:
                raise ctx.fail(
                    knode, f"{path}.{name}", f"unknown signal{suggest(name, spec.keys)}",
                    " | ".join(spec.keys),
                )
            weights[name] = _value(wspec, vnode, f"{path}.{name}", ctx)
        if not any(w > 0 for w in weights.values()):
            raise ctx.fail(node, path, "no signal has a weight > 0, so no frame could ever be hard",
                           "at least one weight > 0")
        return weights
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, path, f"expected a scalar, got {_node_desc(node, ctx)}", spec.allowed())
    v = ctx.scalar(node)  # numbers as YAML 1.2 reads them (yamlnodes.Loader): 1e-3 is one, 010 is ten
    if spec.kind == "int" and isinstance(v, float) and v.is_integer():
        v = int(v)  # 4.0: an integer to JSON Schema and to the settings loader, so to the policy's too
    if spec.kind in ("float", "int"):
        ok_type = isinstance(v, int) if spec.kind == "int" else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok_type:
            what = "an integer" if spec.kind == "int" else "a number"
            raise ctx.fail(node, path, f"{show(v)} is not {what}", spec.allowed())
        if spec.kind == "float" and abs(v) > sys.float_info.max:
            raise ctx.fail(node, path, f"{show(v)} is out of range", spec.allowed())
        bad = spec.range_problem(v)
        if bad:
            raise ctx.fail(node, path, f"{show(v)} {bad}", spec.allowed())
        return int(v) if spec.kind == "int" else float(v)
    if spec.kind == "bool":
        if not isinstance(v, bool):
            raise ctx.fail(node, path, f"{show(v)} is not a boolean", spec.allowed())
        return v
    if not isinstance(v, str):
        raise ctx.fail(node, path, f"{show(v)} is not a string{yamlnodes.quote_hint(node)}", spec.allowed())
    if spec.choices and v not in spec.choices:
        raise ctx.fail(node, path, f"{show(v)} is not allowed{suggest(v, spec.choices)}", spec.allowed())
    if spec.required and not v.strip():
        raise ctx.fail(node, path, "must not be empty", spec.allowed())
    return v


def _build(cls: Any, node: yaml.Node, path: str, ctx: _Ctx) -> Any:
    specs = field_specs(cls)
    items = _mapping_items(node, path, ctx)
    kwargs: Dict[str, Any] = {}
    for key, (knode, vnode) in items.items():
        if key not in specs:
            hint = ""
            if not path:
                kind = items["kind"][1] if "kind" in items else None
                hint = other_file_hint(items, kind.value if isinstance(kind, yaml.ScalarNode) else None, True)
            raise ctx.fail(
                knode, _join(path, key), f"unknown key{suggest(key, list(specs))}{hint}",
                " | ".join(specs),
            )
        attr, spec = specs[key]
        kwargs[attr] = _value(spec, vnode, _join(path, key), ctx)
    for key, (_attr, spec) in specs.items():
        if spec.required and key not in items:
            raise ctx.fail(node, _join(path, key), "required key is missing", spec.allowed())
    obj = cls(**kwargs)
    _check(obj, items, path, ctx)
    return obj


def _check(obj: Any, items: Dict[str, Tuple[yaml.Node, yaml.Node]], path: str, ctx: _Ctx) -> None:
    """Cross-field rules that one field's metadata cannot express."""
    low = getattr(obj, "low", None)
    high = getattr(obj, "high", None)
    if isinstance(low, float) and isinstance(high, float) and low > high:
        raise ctx.fail(
            items["low"][1], _join(path, "low"),
            f"{show(low)} is above high ({show(high)})", "low <= high",
        )


def parse_policy(text: Union[str, bytes], source_name: str = "<policy>", learned_model: bool = True) -> Policy:
    """Validate policy YAML ``text``; ``source_name`` is used in error messages.
    ``learned_model=False`` leaves ``spec.signals.learnedModel`` unread (a file that may exist
    on the device only: ``edgewise edge bundle`` checks a policy it ships on another machine).

    Raises :class:`~edgewise.errors.ConfigError` naming file, line, key path,
    the bad value and the allowed values, and nothing else: whatever else goes
    wrong while reading the text (a number too long to convert, nesting deeper
    than Python's recursion limit, memory) is a ConfigError naming the file too,
    so a hot reload can refuse the file and keep the old policy.
    """
    with yamlnodes.guarded(source_name, "policy"):
        return _parse_policy(text, source_name, learned_model)


def _parse_policy(text: Union[str, bytes], source_name: str, learned_model: bool) -> Policy:
    if isinstance(text, bytes):
        text = yamlnodes.decode(text, source_name, "policy")
    root, loader = yamlnodes.compose(text, source_name)
    ctx = _Ctx(source_name, loader)
    try:
        if root is None:
            raise ConfigError(
                f"{source_name}: empty policy; write apiVersion: edgewise/v1, "
                "kind: EscalationPolicy, metadata.name and spec"
            )
        policy = _build(Policy, root, "", ctx)
    finally:
        loader.dispose()
    learned = None
    if policy.spec.signals.learned_model and learned_model:
        # relative to the policy file's folder (the working directory for text without a file)
        model = Path(policy.spec.signals.learned_model)
        if not model.is_absolute() and not source_name.startswith("<"):
            model = Path(source_name).parent / model
        try:
            learned = GainModel.load(model)
        except ConfigError as exc:
            raise ConfigError(f"{source_name}: spec.signals.learnedModel: {exc}") from None
    return Policy(policy.api_version, policy.kind, policy.metadata, policy.spec, source=source_name,
                  learned=learned)


def read_policy_bytes(path: Union[str, Path], regular_only: bool = False) -> bytes:
    """The policy file's bytes, read once (at most :data:`~edgewise.yamlnodes.MAX_BYTES`);
    ConfigError saying why it cannot be read.

    ``regular_only`` (the daemon, at start and on every reload, and ``check-config``): refuse
    anything but a regular file (after symlinks) without waiting on it: a named pipe put
    where the policy was would otherwise block the reader until a writer comes, which
    stops hot reload and the daemon's shutdown. ``check-policy`` reads pipes
    (``check-policy <(kubectl get configmap ...)``)."""
    return yamlnodes.read_bytes(path, "policy", regular_only,
                                "a policy YAML file (the daemon re-reads it on every change)")


def load_policy(path: Union[str, Path]) -> Policy:
    """Read and validate the policy file at ``path`` (see :func:`parse_policy`)."""
    return parse_policy(read_policy_bytes(path), str(path))
