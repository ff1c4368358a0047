"""The operator's guide in docs/ against the code: commands parse with the real CLI parser,
metric names are ones the code exports (and every exported metric is documented), chart
values, policy keys and edge settings named in the prose exist, quoted error messages are
real, and links between pages resolve."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest
import yaml

from edgewise.cli import build_parser
from edgewise.policy import describe_schema
from edgewise.settings import rows

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("settings/*.md"))  # design/ is checked apart
SOURCE_DIRS = ("edgewise", "edge", "cloud")

# Messages printed by tools around edgewise, quoted in troubleshooting.md.
EXTERNAL_MESSAGES = {
    "additional properties",   # helm: values.schema.json, unknown key
    "missing property",        # helm: values.schema.json, a required value set to null
    "chart requires kubeVersion",  # helm: Chart.yaml kubeVersion
    "unrecognized arguments",  # argparse
}

FENCE = re.compile(r"^```(\w*)\s*$")
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
COMMAND_START = re.compile(r"^(?:\$\s+)?(?:sudo\s+)?(?:/usr/bin/)?(edgewise|edgewise-edge)\s")
SHELL_OPS = {"&&", "||", "|", ";", ">", ">>", "2>", "<"}


def _blocks(text: str) -> Iterator[Tuple[str, List[str]]]:
    """(language, lines) of every fenced code block."""
    lang: Optional[str] = None
    lines: List[str] = []
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and lang is None:
            lang, lines = m.group(1), []
        elif line.strip() == "```" and lang is not None:
            yield lang, lines
            lang = None
        elif lang is not None:
            lines.append(line)


def _prose(text: str) -> str:
    """The page without its fenced code blocks."""
    out, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line) or (inside and line.strip() == "```"):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def _argv(command: str) -> List[str]:
    words = shlex.split(command, comments=True)
    for i, w in enumerate(words):
        if w in SHELL_OPS:
            words = words[:i]
            break
    while words and words[0] in ("$", "sudo"):
        words = words[1:]
    return words[1:]  # drop the program name


def block_commands() -> List[Tuple[str, str]]:
    """(page, command line) of every edgewise command in a shell code block."""
    found = []
    for page in PAGES:
        for lang, lines in _blocks(page.read_text()):
            if lang not in ("sh", "bash", "console", ""):
                continue
            joined: List[str] = []
            buf = ""
            for line in lines:
                if line.rstrip().endswith("\\"):
                    buf += line.rstrip()[:-1] + " "
                    continue
                joined.append(buf + line)
                buf = ""
            for line in joined:
                if COMMAND_START.match(line.strip()):
                    found.append((page.name, line.strip()))
    return found


def inline_commands() -> List[Tuple[str, str]]:
    """(page, span) of every inline code span that quotes an edgewise command."""
    found = []
    for page in PAGES:
        for span in SPAN.findall(_prose(page.read_text())):
            if COMMAND_START.match(span.strip() + " ") and not span.startswith("edgewise:"):
                found.append((page.name, span.strip()))
    return found


def _parse(argv: List[str]) -> Tuple[Optional[argparse.Namespace], str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv), ""
    except SystemExit as exc:
        return None, f"exit {exc.code}: {err.getvalue().strip()}"


def test_docs_quote_commands() -> None:
    assert len(block_commands()) >= 12
    assert len(inline_commands()) >= 5


@pytest.mark.parametrize("page,command", block_commands())
def test_command_in_code_block_parses(page: str, command: str) -> None:
    argv = [a for a in _argv(command) if a not in ("-h", "--help", "--describe-settings")]  # they exit 0
    ns, err = _parse(argv)
    assert ns is not None, f"{page}: `{command}` does not parse: {err}"


def _subparsers(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@pytest.mark.parametrize("page,span", inline_commands())
def test_inline_command_names_real_subcommands_and_flags(page: str, span: str) -> None:
    """Inline mentions may omit required arguments; their words and flags must exist."""
    parser = build_parser()
    words = _argv(span)
    i = 0
    while i < len(words) and not words[i].startswith("-"):
        subs = _subparsers(parser)
        if not subs:
            break
        assert words[i] in subs, f"{page}: `{span}`: {words[i]!r} is not a subcommand ({', '.join(subs)})"
        parser = subs[words[i]]
        i += 1
    flags = {o for a in parser._actions for o in a.option_strings}
    for w in words[i:]:
        if w.startswith("--"):
            assert w.split("=")[0] in flags, f"{page}: `{span}`: no flag {w} (has {sorted(flags)})"


# --------------------------------------------------------------------------- metrics

METRIC_CALL = re.compile(
    r"\b(Counter|Gauge|Histogram|Summary|CounterMetricFamily|GaugeMetricFamily|HistogramMetricFamily)"
    r"\(\s*\"(edgewise_[a-z0-9_]+)\"", re.S)


def exported_metrics() -> Dict[str, Set[str]]:
    """Family (as documented: counters with _total) -> sample names Prometheus shows."""
    out: Dict[str, Set[str]] = {}
    for d in SOURCE_DIRS:
        for py in (ROOT / d).rglob("*.py"):
            for kind, name in METRIC_CALL.findall(py.read_text(encoding="utf-8")):
                if kind.startswith("Counter"):
                    base = name[: -len("_total")] if name.endswith("_total") else name
                    out[base + "_total"] = {base + "_total"}
                elif kind.startswith("Histogram") or kind == "Summary":
                    out[name] = {name, name + "_bucket", name + "_sum", name + "_count"}
                else:
                    out[name] = {name}
    return out


def _hpa_metric_name() -> str:
    values = yaml.safe_load((ROOT / "charts/edgewise/values.yaml").read_text())
    return str(values["autoscaling"]["hpa"]["metricName"])


def test_source_exports_the_metric_families() -> None:
    fams = exported_metrics()
    assert "edgewise_edge_frames_total" in fams
    assert "edgewise_edge_cloud_rtt_seconds_bucket" in fams["edgewise_edge_cloud_rtt_seconds"]
    assert len(fams) >= 40


def test_every_metric_named_in_docs_is_exported() -> None:
    from edgewise.runtime.metadata import CONF_KEY

    valid = set().union(*exported_metrics().values()) | {_hpa_metric_name(), CONF_KEY}  # CONF_KEY: ONNX metadata
    bad = []
    for page in PAGES:
        for name in set(re.findall(r"\bedgewise_(?!tools\b)[a-z0-9_]+\b", page.read_text())):
            if name not in valid and not name.endswith("_"):  # "edgewise_edge_*" names a prefix
                bad.append(f"{page.name}: {name}")
    assert not bad, "metric names the code does not export (counters end in _total): " + ", ".join(sorted(bad))


def test_every_exported_metric_is_documented() -> None:
    text = (DOCS / "metrics.md").read_text()
    missing = [f for f in exported_metrics() if f"`{f}`" not in text]
    assert not missing, f"document these metrics in docs/metrics.md: {missing}"


# --------------------------------------------------------------------------- keys

DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\[\]|\.\d+)?(?:\.[A-Za-z_<][A-Za-z0-9_<>]*(?:\[\])?)+$")


FILE_NAME = re.compile(r"\.(crt|key|pem|yaml|yml|json|db|md|txt|onnx|engine|service|com)$")  # .com: host names


def _spans(page: Path) -> Set[str]:
    """Inline code spans shaped like a key path (file names such as `tls.crt` excluded)."""
    return {s for s in SPAN.findall(_prose(page.read_text())) if DOTTED.match(s) and not FILE_NAME.search(s)}


def _chart_value_exists(values: Dict[str, object], span: str) -> bool:
    node: object = values
    parts = span.split(".")
    for i, p in enumerate(parts):
        if ".".join(parts[:i]) == "gateway.config":
            return True  # free-form gateway settings, validated by the gateway at start
        if not isinstance(node, dict) or p not in node:
            return False
        node = node[p]
    return True


def _values() -> Dict[str, object]:
    return dict(yaml.safe_load((ROOT / "charts/edgewise/values.yaml").read_text()))


def test_chart_values_named_in_install_cloud_exist() -> None:
    values = _values()
    bad = [s for s in _spans(DOCS / "install-cloud.md")
           if s.split(".")[0] in values and not _chart_value_exists(values, s)]
    assert not bad, f"not keys of charts/edgewise/values.yaml: {bad}"


def _policy_path(span: str) -> str:
    parts = span.split(".")
    if len(parts) >= 3 and parts[:2] == ["spec", "classes"]:
        parts[2] = "<name>"
    if len(parts) >= 3 and parts[:2] == ["spec", "streams"]:
        parts[2] = "<stream>"
    return ".".join(parts)


def test_policy_keys_named_in_docs_exist() -> None:
    paths = {row[0] for row in describe_schema()}
    paths |= {p.rsplit(".", 1)[0] for p in paths if "." in p}  # map entries: spec.classes.<name>
    bad = []
    for page in PAGES:
        for span in _spans(page):
            if span.split(".")[0] in ("spec", "metadata") and _policy_path(span) not in paths:
                bad.append(f"{page.name}: {span}")
    assert not bad, f"not keys of the policy schema: {bad}"


def test_edge_settings_named_in_docs_exist() -> None:
    import edge.settings as es

    keys = {r.key for r in rows(es.SCHEMA)}
    sections = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    tops = {k.split(".")[0].split("[")[0] for k in keys}
    values = _values()
    bad = []
    for page in PAGES:
        if page.name == "install-cloud.md" or page.parent.name == "settings":  # chart values; other processes
            continue
        for span in _spans(page):
            top = span.split(".")[0].split("[")[0]
            if top not in tops:
                continue
            key = re.sub(r"^streams\.\d+", "streams[]", span)
            if key not in keys and key not in sections and not _chart_value_exists(values, span):
                bad.append(f"{page.name}: {span}")
    assert not bad, f"not keys of edge/settings.py: {bad}"


# --------------------------------------------------------------------------- messages, links

def _corpus() -> str:
    parts = [p.read_text(encoding="utf-8") for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")]
    parts += [p.read_text(encoding="utf-8") for p in (ROOT / "charts/edgewise").rglob("*") if p.is_file()]
    parts += [p.read_text(encoding="utf-8") for p in (ROOT / "deploy/jetson").rglob("*") if p.is_file()]
    return "\n".join(parts)


def quoted_messages() -> List[str]:
    out = []
    in_table = False
    for line in (DOCS / "troubleshooting.md").read_text().splitlines():
        if line.startswith("| message |"):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
            continue
        if in_table and not line.startswith("|---"):
            first = line.split(" | ")[0]
            out.extend(SPAN.findall(first))
    return out


def test_troubleshooting_quotes_real_messages() -> None:
    msgs = quoted_messages()
    assert len(msgs) >= 50
    corpus = _corpus()
    missing = [m for m in msgs if m not in corpus and m not in EXTERNAL_MESSAGES]
    assert not missing, f"messages not found in edgewise/, edge/, cloud/, the chart or deploy/jetson: {missing}"


def test_links_between_pages_resolve() -> None:
    bad = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                bad.append(f"{page.name} -> {target}")
    assert not bad, bad


# --------------------------------------------------------------------------- YAML examples

def yaml_blocks() -> List[Tuple[str, str]]:
    return [(p.name, "\n".join(lines)) for p in PAGES for lang, lines in _blocks(p.read_text())
            if lang == "yaml"]


def test_policy_examples_in_docs_are_valid() -> None:
    from edgewise.policy import parse_policy

    found = [(page, text) for page, text in yaml_blocks() if "kind: EscalationPolicy" in text]
    assert len(found) >= 2
    for page, text in found:
        parse_policy(text, f"{page} example")  # raises ConfigError with file:line on a mistake


def test_edge_yaml_example_in_docs_loads(tmp_path: Path) -> None:
    from edge.settings import load_settings

    found = [text for page, text in yaml_blocks() if text.lstrip().startswith("device_id:")]
    assert found
    for i, text in enumerate(found):
        cfg = tmp_path / f"edge{i}.yaml"
        # the examples name reserved example domains, which the daemon refuses until a reader
        # puts in their own addresses (edge.settings.PLACEHOLDER_DOMAINS): do that here
        cfg.write_text(text.replace(".example.com", ".plant.lan"))
        s = load_settings(str(cfg), env={})
        assert s.streams and s.policy_file


def test_chart_values_examples_in_docs_render(tmp_path: Path) -> None:
    import shutil
    import subprocess

    helm = ROOT / ".cache/tools/helm"
    exe = str(helm) if helm.exists() else shutil.which("helm")
    if exe is None:
        pytest.skip("helm is not installed (`make helm`)")
    values = _values()
    found = [text for page, text in yaml_blocks()
             if page == "install-cloud.md" and (yaml.safe_load(text) or {}).keys() <= values.keys()]
    assert len(found) >= 2
    for i, text in enumerate(found):
        f = tmp_path / f"values{i}.yaml"
        f.write_text(text)
        out = subprocess.run([exe, "template", "edgewise", str(ROOT / "charts/edgewise"), "-f", str(f)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"values example {i} does not render:\n{text}\n{out.stderr}"
