"""The generated reference pages in docs/ match what the code generates, and the generator's
--check / --write mode works (stale page -> exit 1 with a diff; --write fixes it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgewise.hardness.signals import SIGNAL_NAMES
from edgewise.policy import describe_schema, parse_policy
from edgewise.policy.deciding import REASONS, SUPPRESSORS
from edgewise_tools import reference as ref

ROOT = Path(__file__).resolve().parents[2]
FIX = f"regenerate with: {ref.COMMAND} (then commit docs/)"


@pytest.mark.parametrize("page", sorted(ref.PAGES))
def test_committed_page_matches_the_code(page: str) -> None:
    text = ref.PAGES[page]()
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


def test_edge_page_lists_every_setting_with_its_full_docstring() -> None:
    import edge.settings as es

    text = ref.edge_settings_reference()
    assert text is not None
    rows = ref.settings_rows(es, es.EdgeSettings, env_prefix=es.ENV_PREFIX)
    keys = {r[0] for r in rows}
    assert {"device_id", "streams[].uri", "cloud.mqtt.password", "spool.max_bytes", "metrics.port"} <= keys
    for key, _t, _d, env, doc in rows:
        assert f"| `{key}` |" in text
        assert doc, f"{key} has no docstring in edge/settings.py"
    # multi-line docstrings are kept whole (describe() keeps only the first line)
    uri = next(r for r in rows if r[0] == "streams[].uri")
    assert "appsink" in uri[4]
    token = next(r for r in rows if r[0] == "cloud.token")
    assert token[3] == "EDGEWISE_EDGE_CLOUD__TOKEN" and "EDGEWISE_EDGE_CLOUD__TOKEN" in token[4]


def test_edge_page_environment_names_are_the_loader_s(tmp_path: Path) -> None:
    """Each documented variable really sets its key through edge.settings.load_settings."""
    import edge.settings as es

    cfg = tmp_path / "edge.yaml"
    cfg.write_text("streams: [{id: s, kind: synthetic}]\n")
    rows = ref.settings_rows(es, es.EdgeSettings, env_prefix=es.ENV_PREFIX)
    samples = {"str": "x-1", "int": "7", "float": "0.5", "bool": "true"}
    # keys whose validation needs a partner or a choice; their names follow the same rule
    paired = ("cloud.transport", "cloud.tls_cert", "cloud.tls_key", "sinks.mqtt")
    checked = 0
    for key, tname, _d, env, _doc in rows:
        if not env or tname not in samples or key in paired:
            continue
        value = samples[tname]
        if key.endswith("port"):
            value = "8123"
        s = es.load_settings(str(cfg), env={env: value})
        got = s
        for part in key.split("."):
            got = getattr(got, part)
        assert str(got).lower() == value, (key, env, got)
        checked += 1
    assert checked >= 30


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    for page in ref.PAGES:
        src = ROOT / page
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
    (root / ref.EDGE_PAGE).unlink()
    diffs = ref.stale(root)
    assert len(diffs) == 1 and "edge-settings-reference.md (generated)" in diffs[0]
    assert ref.main(["--check", "--root", str(root)]) == 1
    assert ref.main(["--write", "--root", str(root)]) == 0
    assert ref.stale(root) == []
