"""Generated reference pages of the operator's guide, so they cannot drift from the code.

Rendered from the code that enforces them:

* ``docs/policy-reference.md`` from the policy schema's field metadata
  (:func:`edgewise.policy.schema.describe_schema`), the hardness signal names and
  the decision reasons, with example error messages produced by the real loader;
* ``docs/settings/{edge,gateway,worker,autoscaler}.md`` from each process's settings
  ``SCHEMA`` (:mod:`edgewise.settings`: types, defaults, allowed values, environment
  variables, flags and docs from the field metadata), with real loader messages;
* the ``gateway.config`` subtree of ``charts/edgewise/values.schema.json`` from the
  gateway's field metadata (types, enums, ranges, no unknown keys), so a typo in the
  chart values fails ``helm install`` instead of the gateway pod's start;
* ``docs/policy.schema.json``, the JSON Schema (draft-07) of an ``EscalationPolicy``
  file from the policy's field metadata (:func:`policy_json_schema`: keys, types,
  choices, ranges, required keys, no unknown keys), for editors
  (``yaml-language-server``) and CI checks of policy files;
* ``charts/edgewise/README.md`` (what ``helm show readme`` prints): install, upgrade,
  rollback and uninstall, the modes (every value with a fixed set of choices) and the
  values table, from ``values.schema.json`` (types, choices, descriptions) and
  ``values.yaml`` (defaults).

``python -m edgewise_tools.reference --write`` regenerates them;
``--check`` exits 1 with a unified diff when a committed page is stale
(``tests/edgewise_tools/test_reference.py`` runs the check). This is an offline
tool: it may import ``edge``; the runtime core never imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import importlib
import json
import sys
import tempfile
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from edgewise.errors import ConfigError
from edgewise.fieldrules import allowed_text
from edgewise.hardness.signals import SIGNAL_NAMES
from edgewise.policy.deciding import REASONS, SUPPRESSORS
from edgewise.policy.fields import FieldSpec, field_specs
from edgewise.policy.loading import parse_policy
from edgewise.policy.schema import DEFAULT_WEIGHTS, Policy, describe_schema
from edgewise.settings import VALUE_RULES, Row, Schema, Spec
from edgewise.settings import rows as rows_of
from edgewise.settings.fields import fields_of
from edgewise.settings.values import is_mapping, is_section, optional, sequence

#: Repository root (``edgewise_tools/reference.py`` -> three levels up).
ROOT = Path(__file__).resolve().parents[1]
POLICY_PAGE = "docs/policy-reference.md"
POLICY_SCHEMA = "docs/policy.schema.json"
CHART_SCHEMA = "charts/edgewise/values.schema.json"
CHART_README = "charts/edgewise/README.md"
CHART_VALUES = "charts/edgewise/values.yaml"
CHART_YAML = "charts/edgewise/Chart.yaml"
#: Hand-written files a generated page is rendered from (besides the code and other pages).
INPUTS = (CHART_VALUES, CHART_YAML)
COMMAND = "python -m edgewise_tools.reference --write"

#: What each hardness signal measures (one line; the function docstrings in
#: ``edgewise/hardness/signals.py`` give the paper or system each follows).
SIGNAL_DOCS: Dict[str, str] = {
    "uncertain_count": "Boxes whose score lies inside the uncertainty band, divided by "
                       "`signals.uncertainSaturation` and capped at 1 (NoScope's two-threshold cascade).",
    "uncertain_fraction": "Fraction of the frame's boxes inside the band (Sedna's IBT filter).",
    "mean_conf": "1 - mean box score (Sedna's Threshold filter; the weakest signal).",
    "min_conf": "1 - lowest box score.",
    "entropy": "Highest normalised entropy of a box's class-score distribution.",
    "margin": "Highest 1 - (top-1 minus top-2 class probability) over the boxes.",
    "small_boxes": "Fraction of boxes smaller than `signals.smallArea` of the frame (DDS).",
    "tracker_disagreement": "(boxes appearing + tracks vanishing) / (boxes + vanished) against a "
                            "simple IoU tracker; 0 until the tracker has seen `signals.trackMinHits` frames.",
    "missed_object": "Highest objectness the model saw where no box was kept (DDS feedback regions); "
                     "what makes a frame with no detections escalatable.",
    "motion": "Foreground (MOG2 background subtraction on a grey copy `signals.motion.width` px wide) that no "
              "detection explains, as a share of the frame divided by `signals.motion.areaSaturation`: "
              "what the edge cannot see but the pixels show. Computed only when a weight, the learned "
              "model or region payloads use it.",
    "motion_blobs": "Unexplained foreground blobs no larger than `signals.motion.smallBlob` of the frame (far "
                    "objects are small), divided by `signals.motion.blobSaturation`.",
}

#: ``Decision.reason`` values (label ``reason`` of ``edgewise_edge_escalations_total``).
REASON_DOCS: Dict[str, str] = {
    "hard": "hardness >= the threshold in force (stream > lowest class present > global).",
    "always": "the stream has `mode: always`.",
    "audit": "an easy frame picked by `spec.auditFraction`.",
    "below_threshold": "easy frame; not escalated.",
    "stream_never": "the stream has `mode: never`; not escalated.",
}

#: ``Decision.suppressed_by`` values: why a candidate frame was not escalated.
SUPPRESSOR_DOCS: Dict[str, str] = {
    "cooldown": "the stream escalated less than `cooldownSeconds` ago.",
    "priority": "`budget.priority: hardest` and the frame is not among the hardest recent candidates.",
    "budget_fraction": "`budget.maxFraction` of the last `budget.windowFrames` frames is used up.",
    "budget_rate": "the token bucket (`budget.maxPerSecond`, `budget.burst`) is empty.",
}

#: Bad policy snippets run through the real loader to show the error format.
_ERROR_EXAMPLES: Tuple[Tuple[str, str], ...] = (
    ("a value out of range", "  budget:\n    maxFraction: 1.5\n"),
    ("a misspelled key", "  deadline_ms: 500\n"),
    ("a value that is not allowed", "  transport: http\n"),
    ("a key given twice", "  threshold: 0.5\n  threshold: 0.4\n"),
)

_HEADER = "<!-- Generated by `{cmd}` from {src}. Do not edit by hand. -->\n"

_MINIMAL = (
    "apiVersion: edgewise/v1\n"
    "kind: EscalationPolicy\n"
    "metadata:\n"
    "  name: minimal\n"
    "spec: {}\n"
)


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: its ``|`` escaped (GitHub's tables take ``\\|``
    inside a code span too) and line breaks made spaces, so it cannot end its cell or its row."""
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out.extend("| " + " | ".join(markdown_cell(c) for c in row) + " |" for row in rows)
    return out


# --------------------------------------------------------------------------- policy page

def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def _section_default(path: str) -> Any:
    """Default value at ``path`` in a default :class:`Policy` (MISSING under a map or null)."""
    obj: Any = Policy()
    for key in path.split("."):
        if obj is None or key.startswith("<"):
            return MISSING
        specs = field_specs(type(obj))
        if key not in specs:
            return MISSING
        obj = getattr(obj, specs[key][0])
    return obj


def _default_cell(path: str, text: str) -> str:
    if text == "(required)":
        value = _section_default(path)
        parent = _parent(path)
        if value is MISSING or not parent or parent in ("metadata",):
            return "(required)"
        return f"`{value}`; required when `{parent}` is written"
    if text.startswith("("):
        return text
    return f"`{text}`" if text else '`""`'


def _error_example(snippet: str) -> str:
    text = _MINIMAL.replace("spec: {}\n", "spec:\n" + snippet)
    try:
        parse_policy(text, "policy.yaml")
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"example policy unexpectedly valid:\n{text}")


def policy_reference() -> str:
    """The Markdown of ``docs/policy-reference.md``."""
    parse_policy(_MINIMAL, "minimal")  # the skeleton shown below must stay valid
    rows = describe_schema()
    groups: Dict[str, List[Tuple[str, str, str, str, str]]] = {}
    for row in rows:
        groups.setdefault(_parent(row[0]), []).append(row)
    lines = [
        _HEADER.format(cmd=COMMAND, src="`edgewise/policy/schema.py`"),
        "# Escalation policy reference",
        "",
        "Every key of an escalation policy file (`apiVersion: edgewise/v1`, "
        "`kind: EscalationPolicy`), with its type, default and allowed values. "
        "How to write, check and reload a policy: [policies.md](policies.md).",
        "",
        "The smallest valid policy; every other key takes the default listed below:",
        "",
        "```yaml",
        _MINIMAL.rstrip("\n"),
        "```",
        "",
        "Keys are camelCase. Unknown keys, duplicate keys, wrong types and values out of range "
        "are refused with the file, line, key path and the allowed values. Overrides apply "
        "per stream > per class > global: a stream's `threshold` wins; otherwise, of the "
        "classes present in a frame, the lowest class threshold (or the global one) applies; "
        "`null` in an override means *inherit*.",
        "",
    ]
    for parent, group in groups.items():
        lines.append(f"## `{parent}`" if parent else "## Top level")
        lines.append("")
        lines.extend(_table(
            ("key", "type", "default", "allowed", "description"),
            [(f"`{p}`", t, _default_cell(p, d), a, doc) for p, t, d, a, doc in group],
        ))
        lines.append("")
    lines += [
        "## Hardness signals",
        "",
        "Names accepted under `spec.signals.weights`. Each signal is a number in [0, 1], "
        "higher = harder; a signal with no weight (or weight 0) is not counted, and a "
        "`weights` mapping you write replaces the default weights as a whole. "
        "`combine: max` takes the largest weight x signal, `combine: mean` the weighted mean.",
        "",
    ]
    missing = [n for n in SIGNAL_NAMES if n not in SIGNAL_DOCS]
    if missing:
        raise AssertionError(f"SIGNAL_DOCS lacks {missing}")
    lines.extend(_table(
        ("signal", "default weight", "measures"),
        [(f"`{n}`", f"{DEFAULT_WEIGHTS[n]:g}" if n in DEFAULT_WEIGHTS else "0 (not counted)",
          SIGNAL_DOCS[n]) for n in SIGNAL_NAMES],
    ))
    lines += [
        "",
        "## Decisions",
        "",
        "Every frame gets one reason (label `reason` of `edgewise_edge_escalations_total` "
        "and field `reason` of the sink record):",
        "",
    ]
    lines.extend(_table(("reason", "meaning"), [(f"`{r}`", REASON_DOCS[r]) for r in REASONS]))
    lines += [
        "",
        "A candidate (`hard`, `always`, `audit`) is still held back, in this order, by "
        "(field `suppressed_by` of the sink record):",
        "",
    ]
    lines.extend(_table(("suppressed by", "meaning"), [(f"`{s}`", SUPPRESSOR_DOCS[s]) for s in SUPPRESSORS]))
    lines += [
        "",
        "`mode: always` streams skip the `priority` check; every other limit applies.",
        "",
        "## Error messages",
        "",
        "Produced by the loader for these edits of the minimal policy above "
        "(the format is `file:line: key.path: problem; allowed: values`):",
        "",
    ]
    for what, snippet in _ERROR_EXAMPLES:
        lines.append(f"* {what}: `{_error_example(snippet)}`")
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- settings pages

@dataclass(frozen=True)
class SettingsPage:
    """A process whose settings get a reference page: the module holding its ``SCHEMA``."""

    module: str
    title: str
    intro: str


SETTINGS_PAGES: Dict[str, SettingsPage] = {
    "docs/settings/edge.md": SettingsPage(
        "edge.settings", "Edge daemon",
        "On a Jetson the file is `/etc/edgewise/edge.yaml` (read by `edgewise-edge.service`) and secrets go "
        "in `/etc/default/edgewise-edge` as environment variables. How to install and run the daemon: "
        "[install-edge.md](../install-edge.md); a commented example: `edge/edge.example.yaml`."),
    "docs/settings/gateway.md": SettingsPage(
        "cloud.gateway.settings", "Gateway",
        "In the Helm chart, `gateway.config` holds these keys except `listen`, `metrics_host`, `metrics_port` "
        "and `discovery`, which the chart sets itself; `values.schema.json` is generated from the same "
        "field metadata, so a misspelled or out-of-range key fails `helm install` "
        "([install-cloud.md](../install-cloud.md)). A commented example: `cloud/gateway/gateway.example.yaml`."),
    "docs/settings/worker.md": SettingsPage(
        "cloud.worker.settings", "Worker",
        "The Helm chart passes them as flags from `worker.*` values "
        "([install-cloud.md](../install-cloud.md))."),
    "docs/settings/autoscaler.md": SettingsPage(
        "cloud.autoscaler.settings", "Autoscaler",
        "The Helm chart runs it with `autoscaling.mode: builtin` and passes flags from `autoscaling.*` "
        "values ([install-cloud.md](../install-cloud.md)). A commented example: "
        "`cloud/autoscaler/autoscaler.example.yaml`."),
}


def _schema(module: str) -> Optional[Schema[Any]]:
    try:
        return importlib.import_module(module).SCHEMA  # type: ignore[no-any-return]
    except ModuleNotFoundError:
        return None


def _error_examples(schema: Schema[Any]) -> List[str]:
    """Real loader messages: a misspelled key in the file, a bad number in the environment."""
    rows = [r for r in rows_of(schema) if r.env and "[]" not in r.key]
    parent, leaf = next(r.key for r in rows if "." in r.key).rsplit(".", 1)
    number = next(r for r in rows if r.type == "int")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "settings.yaml"
        path.write_text(f"{parent}:\n  {leaf[:-2] + leaf[-1] + leaf[-2]}: 1\n", encoding="utf-8")
        for config, env in ((path, {}), (None, {number.env: "lots"})):
            try:
                schema.load(config, env=env)
            except ConfigError as exc:
                out.append(str(exc).replace(str(path), "settings.yaml"))
                continue
            raise AssertionError(f"example settings unexpectedly valid: {config or env}")
    return out


def settings_reference(page: SettingsPage, _root: Path = ROOT) -> Optional[str]:
    """The Markdown of one process's settings page (None when its package is not installed)."""
    schema = _schema(page.module)
    if schema is None:
        return None
    flags = ", ".join(f"`{f.name}`" for f in schema.flags)
    src = page.module.replace(".", "/") + ".py"
    lines = [
        _HEADER.format(cmd=COMMAND, src=f"`{src}`"),
        f"# {page.title} settings reference",
        "",
        f"Every setting of `{schema.command}`. {page.intro}",
        "",
        "Layers, later wins: the defaults below < the YAML file (`--config FILE`) < environment variables "
        f"`{schema.env_prefix}<KEY>__<SUBKEY>` < `--set KEY.PATH=VALUE` (repeatable) < the named flags "
        f"({flags}). List items are addressed by index (`--set KEY.0.SUBKEY=VALUE`, "
        f"`{schema.env_prefix}KEY__0__SUBKEY`). `{schema.command} --describe-settings` prints the same list.",
        "",
        "Unknown keys and variables, wrong types and values out of range are refused at start; the message "
        "names where the value came from (the file and line, the variable or the flag), the key path and "
        "the allowed values, e.g.:",
        "",
    ]
    lines += [f"* `{msg}`" for msg in _error_examples(schema)]
    lines += [
        "",
        "Values are read the same way by every edgewise process:",
        "",
    ]
    lines += _table(("type", "accepted"), VALUE_RULES)
    lines.append("")
    groups: Dict[str, List[Row]] = {}
    for row in rows_of(schema):
        top = row.key.split(".")[0].split("[")[0] if "." in row.key else ""
        groups.setdefault(top, []).append(row)
    for top, group in groups.items():
        lines += [f"## `{top}`" if top else "## Top level", ""]
        lines.extend(_table(
            ("key", "type", "default", "allowed", "environment variable", "flag", "description"),
            [(f"`{r.key}`", r.type, f"`{r.default}`", r.allowed, f"`{r.env}`" if r.env else "(items by index)",
              f"`{r.flag}`" if r.flag else "", _rst_to_md(r.doc) + (" Secret: never printed." if r.secret else ""))
             for r in group]))
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- policy JSON Schema

def _range_schema(lo: Optional[float], hi: Optional[float], lo_open: bool, hi_open: bool) -> Dict[str, Any]:
    """``minimum``/``maximum`` (or their ``exclusive`` forms) of a number's range."""
    out: Dict[str, Any] = {}
    for key, bound, is_open in (("minimum", lo, lo_open), ("maximum", hi, hi_open)):
        if bound is not None:
            out["exclusive" + key.capitalize() if is_open else key] = int(bound) if float(bound).is_integer() else bound
    return out


def _policy_field_schema(spec: FieldSpec) -> Dict[str, Any]:
    """The JSON Schema of one policy key, as the loader (``edgewise.policy.loading``) checks it."""
    out: Dict[str, Any] = {"description": spec.doc}
    if spec.kind == "section":
        out.update(_policy_section_schema(spec.cls))
    elif spec.kind == "map":
        out.update(type="object", propertyNames={"pattern": r"\S"},
                   additionalProperties=_policy_section_schema(spec.cls))
    elif spec.kind == "weights":
        out.update(type="object", additionalProperties=False,
                   properties={k: {"type": "number", "minimum": 0, "maximum": 1} for k in spec.keys})
    elif spec.kind in ("float", "int"):
        out["type"] = "integer" if spec.kind == "int" else "number"
        out.update(_range_schema(spec.lo, spec.hi, spec.lo_open, spec.hi_open))
    elif spec.kind == "bool":
        out["type"] = "boolean"
    else:
        out["type"] = "string"
        if spec.choices:
            out["enum"] = list(spec.choices)
        elif spec.required:
            out["pattern"] = r"\S"
    if spec.nullable:
        body = {k: v for k, v in out.items() if k != "description"}
        out = {"description": spec.doc, "anyOf": [body, {"type": "null"}]}
    return out


def _policy_section_schema(cls: Any) -> Dict[str, Any]:
    specs = field_specs(cls)
    out: Dict[str, Any] = {
        "type": "object", "additionalProperties": False,
        "properties": {key: _policy_field_schema(spec) for key, (_attr, spec) in specs.items()}}
    required = [key for key, (_attr, spec) in specs.items() if spec.required]
    if required:
        out["required"] = required
    return out


def policy_json_schema() -> Dict[str, Any]:
    """JSON Schema (draft-07) of a policy file, from the field metadata the loader enforces.
    What one key's metadata cannot say (``band.low <= band.high``, at least one weight > 0,
    the learned model file) only ``edgewise edge check-policy`` checks."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://edgewise.invalid/schemas/policy.schema.json",
        "title": "edgewise EscalationPolicy",
        "description": f"Generated from edgewise/policy/schema.py by `{COMMAND}`; reference: "
                       "docs/policy-reference.md. Cross-field rules are checked by `edgewise edge check-policy`.",
        **_policy_section_schema(Policy),
    }


# --------------------------------------------------------------------------- chart schema

#: Gateway keys the chart's gateway-configmap.yaml sets itself (from other values).
CHART_OWNED = ("listen", "metrics_host", "metrics_port", "discovery")


def json_schema(tp: Any, spec: Optional[Spec] = None) -> Dict[str, Any]:
    """JSON schema (draft-07) of a settings type: types, enums, ranges, no unknown keys."""
    inner, nullable = optional(tp)
    out: Dict[str, Any] = {"description": spec.doc} if spec is not None and spec.doc else {}
    item_spec = Spec(doc="", **{k: v for k, v in dataclasses.asdict(spec).items() if k != "doc"}) if spec else None
    seq = sequence(inner)
    if is_section(inner):
        out.update(type="object", additionalProperties=False,
                   properties={n: json_schema(i.type, i.spec) for n, i in fields_of(inner).items()})
    elif seq is not None:
        out.update(type="array", items=json_schema(seq[0], item_spec))
        if seq[1] is not None:
            out.update(minItems=seq[1], maxItems=seq[1])
    elif is_mapping(inner):
        out["type"] = "object"
    else:
        out.update(_scalar_schema(inner, spec or Spec(doc="")))
    if nullable:
        out["type"] = (out["type"] if isinstance(out["type"], list) else [out["type"]]) + ["null"]
        if "enum" in out:
            out["enum"].append(None)
    return out


#: A number written as text (what ``helm --set key=0.5`` passes: Helm reads only integers).
_NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


def _scalar_schema(tp: Any, spec: Spec) -> Dict[str, Any]:
    """The JSON schema of a scalar as the coercion table reads it (VALUE_RULES): a float may be
    a numeric string, a str may be a number; ranges and choices from the metadata."""
    kind = spec.kind(tp)
    allowed = spec.allowed_values(tp)
    if allowed:
        return {"type": "string", "enum": list(allowed)}
    out: Dict[str, Any] = {"type": {"bool": "boolean", "int": "integer", "float": ["number", "string"]}.get(
        kind, ["string", "number"])}
    out.update(_range_schema(spec.lo, spec.hi, spec.lo_open, spec.hi_open))
    if kind == "float":
        out["pattern"] = _NUMBER_TEXT
    return out


def gateway_config_schema() -> Optional[Dict[str, Any]]:
    """The chart's ``gateway.config`` schema, from the gateway's settings metadata."""
    schema = _schema("cloud.gateway.settings")
    if schema is None:
        return None
    out = json_schema(schema.root)
    for key in CHART_OWNED:
        del out["properties"][key]
    out["description"] = (f"Extra gateway settings merged into gateway.yaml (generated by `{COMMAND}` from "
                          f"cloud/gateway/settings.py; {', '.join(CHART_OWNED)} are set by the chart).")
    return out


#: The chart's table of the ranges of its numbers that may be written as text (``gateway.config``'s
#: and the chart's own decimals; ``validate.yaml`` applies it; generated with the schema).
CHART_RANGES = "charts/edgewise/templates/_number_ranges.tpl"


def _number_text_ranges(node: Dict[str, Any], path: Tuple[str, ...] = ()) -> List[Dict[str, Any]]:
    """Every number of ``node`` (a JSON schema) that may be written as text, with its range."""
    if node.get("type") == "object":
        return [r for k, sub in node.get("properties", {}).items() for r in _number_text_ranges(sub, path + (k,))]
    if node.get("pattern") != _NUMBER_TEXT:
        return []
    lo_open, hi_open = "exclusiveMinimum" in node, "exclusiveMaximum" in node
    lo = node.get("exclusiveMinimum", node.get("minimum"))
    hi = node.get("exclusiveMaximum", node.get("maximum"))
    return [{"path": list(path), "lo": lo, "hi": hi, "loOpen": lo_open, "hiOpen": hi_open,
             "allowed": allowed_text("float", (), lo, hi, lo_open, hi_open)}]


def chart_ranges(root: Path = ROOT) -> Optional[str]:
    """``_number_ranges.tpl``: JSON Schema applies ``minimum``/``maximum`` to numbers only, and
    ``helm --set key=1.5`` passes text, so text numbers passed ``helm install`` out of range (the
    gateway then refused them at its start: a crash-looping pod); ``validate.yaml`` checks them
    against this table, whose paths start at ``.Values``."""
    schema = chart_schema(root)
    if schema is None:
        return None
    ranges = json.dumps(_number_text_ranges(json.loads(schema)), separators=(",", ":"))
    return (f"{{{{/* Generated by `{COMMAND}` from values.schema.json (gateway.config's part from\n"
            "     cloud/gateway/settings.py): do not edit. The range of each value that may be a number\n"
            "     written as text (helm --set passes 1.5 as text, which the schema's minimum/maximum do not\n"
            "     check); validate.yaml applies it. */}}\n"
            f"{{{{- define \"edgewise.numberRanges\" -}}}}\n{ranges}\n{{{{- end -}}}}\n")


def chart_schema(root: Path = ROOT) -> Optional[str]:
    """``charts/edgewise/values.schema.json`` with the generated ``gateway.config`` subtree."""
    config = gateway_config_schema()
    if config is None:
        return None
    doc = json.loads((root / CHART_SCHEMA).read_text(encoding="utf-8"))
    doc["properties"]["gateway"]["properties"]["config"] = config
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


_CHART_TEXT = """\
# edgewise Helm chart

<!-- Generated by `{cmd}` from values.schema.json and values.yaml: do not edit. -->

{description}

Kubernetes `{kube}` (supported: 1.29-1.33); tested with Helm 4. The full guide, with TLS, device tokens,
an upgrade to a new model and a rollback, is `docs/install-cloud.md` in the repository; metrics,
dashboard and alerts are in `docs/metrics.md`.

## Install, upgrade, roll back, uninstall

```sh
kubectl create namespace edgewise
helm install edgewise charts/edgewise -n edgewise                # or: -f my-values.yaml
helm test edgewise -n edgewise --logs                            # one real frame through a worker
helm upgrade edgewise charts/edgewise -n edgewise --reset-then-reuse-values --set worker.replicas=4
helm history edgewise -n edgewise
helm rollback edgewise 1 -n edgewise                             # back to revision 1
helm uninstall edgewise -n edgewise
```

`helm uninstall` leaves the Secrets you created (TLS, tokens) and deletes the engine cache claim
the chart created (`worker.engineCache.pvc`, when no `claimName` was given). Check a values file
without a cluster: `helm lint --strict charts/edgewise -f my-values.yaml`; rules between values
fail with one sentence naming what to change. Upgrade with `--reset-then-reuse-values` (Helm >= 3.14):
your earlier values over this chart's defaults. `--reuse-values` keeps the earlier chart's defaults
as well, so a value a newer chart adds is missing and the schema refuses it (`missing property`).

## Modes

Every value with a fixed set of choices:

{modes}

## Values

Every value, its type, default and meaning. `gateway.config` takes the gateway's settings
(`docs/settings/gateway.md`; checked against the same types and ranges the gateway enforces).

{values}
"""


def _schema_type(node: Dict[str, Any]) -> str:
    if "oneOf" in node:
        return " or ".join(_schema_type(n) for n in node["oneOf"])
    if "const" in node:
        return json.dumps(node["const"])
    if node.get("pattern") == _NUMBER_TEXT:
        return "number"  # or the same number as text, as `helm --set` passes a decimal
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and isinstance(node.get("items"), dict) and "type" in node["items"]:
        return f"list of {_schema_type(node['items'])}"
    return " or ".join(kinds)


def _value_default(values: Any, path: str) -> str:
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return "(none)"
        node = node[part]
    text = json.dumps(node, ensure_ascii=False)
    return "see values.yaml" if len(text) > 48 or "\\n" in text else f"`{text}`"


def chart_leaves(schema: Dict[str, Any], prefix: str = "") -> List[Tuple[str, Dict[str, Any]]]:
    """(dotted path, schema node) of every chart value the README lists: each leaf of the
    hand-written schema; ``gateway.config`` and objects open to other keys as one row."""
    out: List[Tuple[str, Dict[str, Any]]] = []
    for key, node in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "properties" in node and path != "gateway.config" and node.get("additionalProperties") is False:
            out.extend(chart_leaves(node, path + "."))
        else:
            out.append((path, node))
    return out


def chart_readme(root: Path = ROOT) -> str:
    """``charts/edgewise/README.md`` from the chart's schema, values and Chart.yaml."""
    import yaml

    # the schema as this run generates it, so one --write brings both pages up to date
    schema = json.loads(chart_schema(root) or (root / CHART_SCHEMA).read_text(encoding="utf-8"))
    values = yaml.safe_load((root / CHART_VALUES).read_text(encoding="utf-8"))
    chart = yaml.safe_load((root / CHART_YAML).read_text(encoding="utf-8"))
    leaves = chart_leaves(schema)
    modes = _table(("value", "choices", "meaning"), [
        (f"`{p}`", ", ".join(f"`{c}`" for c in n["enum"]), n.get("description", ""))
        for p, n in leaves if "enum" in n and p.count(".") < 3])
    rows = _table(("value", "type", "default", "meaning"), [
        (f"`{p}`", _schema_type(n), _value_default(values, p), n.get("description", "")) for p, n in leaves])
    return _CHART_TEXT.format(cmd=COMMAND, description=" ".join(chart["description"].split()),
                              kube=chart["kubeVersion"], modes="\n".join(modes), values="\n".join(rows))


# --------------------------------------------------------------------------- write / check

#: Generated file -> its renderer (given the repository root; None when its source is not installed).
PAGES: Dict[str, Callable[[Path], Optional[str]]] = {POLICY_PAGE: lambda _root: policy_reference()}
PAGES[POLICY_SCHEMA] = lambda _root: json.dumps(policy_json_schema(), indent=2) + "\n"
PAGES.update({path: functools.partial(settings_reference, page) for path, page in SETTINGS_PAGES.items()})
PAGES[CHART_SCHEMA] = chart_schema
PAGES[CHART_README] = chart_readme
PAGES[CHART_RANGES] = chart_ranges


def render(root: Path = ROOT) -> Dict[Path, str]:
    """Every generated page (path -> text); pages whose source is not installed are left out."""
    out: Dict[Path, str] = {}
    for rel, fn in PAGES.items():
        text = fn(root)
        if text is not None:
            out[root / rel] = text
    return out


def stale(root: Path = ROOT) -> List[str]:
    """Unified diffs of committed pages that differ from what the code generates ([] = fresh)."""
    diffs: List[str] = []
    for path, text in render(root).items():
        try:
            old = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            old = ""
        if old != text:
            try:
                rel = str(path.relative_to(root))
            except ValueError:
                rel = str(path)
            diffs.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), text.splitlines(keepends=True),
                fromfile=f"{rel} (committed)", tofile=f"{rel} (generated)",
            )))
    return diffs


def write(root: Path = ROOT) -> List[Path]:
    """Regenerate every page; returns the paths that changed."""
    changed: List[Path] = []
    for path, text in render(root).items():
        try:
            old: Optional[str] = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            old = None
        if old != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m edgewise_tools.reference --check|--write [--root DIR]``."""
    p = argparse.ArgumentParser(prog="python -m edgewise_tools.reference",
                                description="Generate or check the reference pages in docs/.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when a page is stale")
    mode.add_argument("--write", action="store_true", help="regenerate the pages")
    p.add_argument("--root", default=str(ROOT), help="repository root (default: this checkout)")
    args = p.parse_args(argv)
    root = Path(args.root)
    for rel, page in SETTINGS_PAGES.items():
        if _schema(page.module) is None:
            print(f"note: {page.module} is not importable; {rel} skipped", file=sys.stderr)
    if args.write:
        for path in write(root):
            print(f"wrote {path}")
        return 0
    diffs = stale(root)
    if diffs:
        sys.stdout.write("\n".join(diffs))
        print(f"\nreference pages are stale; regenerate them with: {COMMAND}")
        return 1
    print("reference pages are up to date")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
