"""The generated reference pages in docs/ match what the code generates, and the generator's
--check / --write mode works (stale page -> exit 1 with a diff; --write fixes it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from edgewise.errors import ConfigError
from edgewise.hardness.signals import SIGNAL_NAMES
from edgewise.policy import describe_schema, parse_policy
from edgewise.policy.deciding import REASONS, SUPPRESSORS
from edgewise.settings import rows
from edgewise_tools import reference as ref

ROOT = Path(__file__).resolve().parents[2]
FIX = f"regenerate with: {ref.COMMAND} (then commit docs/)"


@pytest.mark.parametrize("page", sorted(ref.PAGES))
def test_committed_page_matches_the_code(page: str) -> None:
    text = ref.PAGES[page](ROOT)
    assert text is not None, f"{page}: its source package is not importable"
    committed = (ROOT / page).read_text(encoding="utf-8") if (ROOT / page).exists() else ""
    if committed != text:
        diff = "".join(ref.stale(ROOT))
        pytest.fail(f"{page} is stale; {FIX}\n{diff[:4000]}")


def test_policy_page_lists_every_schema_key_signal_and_reason() -> None:
    text = ref.policy_reference()
    for path, *_ in describe_schema():
        assert f"| `{path}` |" in text, path
    for name in SIGNAL_NAMES:
        assert f"| `{name}` |" in text, name
    for reason in (*REASONS, *SUPPRESSORS):
        assert f"| `{reason}` |" in text, reason


def test_policy_page_error_examples_are_real_loader_messages() -> None:
    text = ref.policy_reference()
    for _what, snippet in ref._ERROR_EXAMPLES:
        msg = ref._error_example(snippet)
        assert msg.startswith("policy.yaml:") and "; allowed: " in msg
        assert f"`{msg}`" in text


def test_policy_page_minimal_example_is_valid() -> None:
    assert parse_policy(ref._MINIMAL, "minimal").metadata.name == "minimal"


@pytest.mark.parametrize("page", sorted(ref.SETTINGS_PAGES))
def test_settings_page_lists_every_key_with_its_variable_and_flag(page: str) -> None:
    spec = ref.SETTINGS_PAGES[page]
    schema = ref._schema(spec.module)
    assert schema is not None
    text = ref.settings_reference(spec)
    assert text is not None
    for row in rows(schema):
        assert f"| `{row.key}` |" in text, row.key
        assert row.doc, f"{row.key} has no doc in {spec.module}"
        assert not row.env or f"`{row.env}`" in text
    for flag in schema.flags:
        assert f"`{flag.name}`" in text
    for msg in ref._error_examples(schema):
        assert f"* `{msg}`" in text and (msg.startswith("settings.yaml:2: ") or msg.startswith(schema.env_prefix))


def test_edge_page_environment_names_are_the_loader_s(tmp_path: Path) -> None:
    """Each documented variable really sets its key through edge.settings.load_settings."""
    import edge.settings as es

    cfg = tmp_path / "edge.yaml"
    cfg.write_text("streams: [{id: s, kind: synthetic}]\n")
    samples = {"str": "x-1", "int": "7", "float": "0.5", "bool": "true"}
    # keys whose validation needs a partner; their names follow the same rule
    paired = ("cloud.tls_cert", "cloud.tls_key", "sinks.mqtt")
    checked = 0
    for row in rows(es.SCHEMA):
        if "[]" in row.key or row.type not in samples or row.key in paired:
            continue
        value = "8123" if row.key.endswith("port") else samples[row.type]
        if " | " in row.allowed and row.type == "str":
            value = row.allowed.split(" | ")[-1]
        if row.key == "model.imgsz":  # a string the settings read as a size (c898547)
            value = "384,640"
        if row.type == "float" and row.allowed.startswith(("a number >= ", "a number in [")):  # a floor above
            floor = float(row.allowed.split(">= ")[1].split()[0] if ">=" in row.allowed
                          else row.allowed.split("[")[1].split(",")[0])
            value = str(max(float(value), floor + 0.5))
        got: object = es.load_settings(str(cfg), env={row.env: value})
        for part in row.key.split("."):
            got = getattr(got, part)
        assert str(got).lower() == value, (row.key, row.env, got)
        checked += 1
    assert checked >= 30


def test_chart_schema_of_gateway_config_follows_the_metadata() -> None:
    config = ref.gateway_config_schema()
    assert config is not None and config["additionalProperties"] is False
    assert not set(ref.CHART_OWNED) & set(config["properties"])
    balancer = config["properties"]["balancer"]
    assert balancer["additionalProperties"] is False
    assert balancer["properties"]["mode"]["enum"][0] == "wlc"
    assert balancer["properties"]["slow_start_min_pct"]["exclusiveMinimum"] == 0
    assert config["properties"]["mqtt"]["properties"]["port"] == {
        "description": "Broker port.", "type": "integer", "minimum": 1, "maximum": 65535}
    token = config["properties"]["auth"]["properties"]["tokens"]["items"]["properties"]["token"]
    assert token["type"] == ["string", "number"]


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for page in (*ref.PAGES, *ref.INPUTS):
        src = ROOT / page
        (root / page).parent.mkdir(parents=True, exist_ok=True)
        if src.exists():
            shutil.copy(src, root / page)
    return root


def test_check_exits_1_with_a_diff_when_stale_and_write_fixes_it(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    page = root / ref.POLICY_PAGE
    page.write_text(page.read_text().replace("| `spec.threshold` |", "| `spec.threshold_old` |"))
    cmd = [sys.executable, "-m", "edgewise_tools.reference", "--root", str(root)]
    out = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 1
    assert "-| `spec.threshold_old` |" in out.stdout and "+| `spec.threshold` |" in out.stdout
    assert ref.COMMAND in out.stdout
    out = subprocess.run([*cmd, "--write"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "policy-reference.md" in out.stdout
    out = subprocess.run([*cmd, "--check"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout


def test_missing_page_is_stale(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    (root / "docs/settings/edge.md").unlink()
    diffs = ref.stale(root)
    assert len(diffs) == 1 and "docs/settings/edge.md (generated)" in diffs[0]
    assert ref.main(["--check", "--root", str(root)]) == 1
    assert ref.main(["--write", "--root", str(root)]) == 0
    assert ref.stale(root) == []


# --------------------------------------------------------------------------- policy JSON Schema

#: Invalid policies only the loader's cross-field rules (or YAML itself) catch, not one key's metadata.
CROSS_FIELD = {"band-inverted.yaml", "duplicate-key.yaml", "zero-weights.yaml", "yaml-syntax.yaml"}


def _policy_validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / ref.POLICY_SCHEMA).read_text(encoding="utf-8"))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in [
    ROOT / "examples" / "policy.yaml", *(ROOT / "examples" / "policies").glob("*.yaml")]))
def test_policy_schema_accepts_the_example_policies(path: str) -> None:
    doc = yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))
    errors = [e.message for e in _policy_validator().iter_errors(doc)]
    assert errors == [], path


def test_policy_schema_rejects_a_misspelt_key_and_what_the_loader_rejects() -> None:
    validator = _policy_validator()
    doc = yaml.safe_load((ROOT / "examples" / "policy.yaml").read_text(encoding="utf-8"))
    doc["spec"]["budget"]["maxFracton"] = doc["spec"]["budget"].pop("maxFraction", 0.1)
    assert [e.message for e in validator.iter_errors(doc)] == [
        "Additional properties are not allowed ('maxFracton' was unexpected)"]
    invalid = sorted((ROOT / "tests" / "edgewise" / "policy" / "invalid").glob("*.yaml"))
    assert len(invalid) > 10
    for path in invalid:
        text = path.read_text(encoding="utf-8")
        with pytest.raises(ConfigError):
            parse_policy(text, path.name)
        if path.name not in CROSS_FIELD:
            assert not validator.is_valid(yaml.safe_load(text)), f"{path.name}: the schema accepts it"


def test_policy_schema_numbers_as_the_loader_reads_them() -> None:
    validator = _policy_validator()
    base = {"apiVersion": "edgewise/v1", "kind": "EscalationPolicy", "metadata": {"name": "n"}}
    for spec, ok in (({"threshold": 0.5}, True), ({"threshold": 1}, True), ({"cooldownSeconds": 1e-3}, True),
                     ({"threshold": "0.5"}, False), ({"payload": {"jpegQuality": 85.5}}, False),
                     ({"streams": {"cam": {"threshold": None}}}, True), ({"threshold": None}, False),
                     ({"signals": {"weights": {"entropy": 1.5}}}, False)):
        doc = dict(base, spec=spec)
        assert validator.is_valid(doc) is ok, spec
        try:
            parse_policy(yaml.safe_dump(doc), "p.yaml")
            loaded = True
        except ConfigError:
            loaded = False
        assert loaded is ok, spec
    # numbers as YAML 1.2 reads them: 1e-3 without a dot is a number, quoted it is text, refused by both
    assert parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: n}\n"
                        "spec: {threshold: 1e-1}\n", "p.yaml").spec.threshold == 0.1
    assert not validator.is_valid(dict(base, spec={"cooldownSeconds": "1e-3"}))
