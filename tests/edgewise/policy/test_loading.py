"""Policy files: the examples load; each invalid file fails with a precise message."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgewise.errors import ConfigError
from edgewise.policy import describe_schema, explain, load_policy, parse_policy
from edgewise.policy.schema import DEFAULT_WEIGHTS, Payload, Policy

ROOT = Path(__file__).resolve().parents[3]
INVALID = Path(__file__).resolve().parent / "invalid"
EXAMPLES = [ROOT / "examples" / "policy.yaml", *sorted((ROOT / "examples" / "policies").glob("*.yaml"))]

# file -> expected message after "<path>" (line, key path, problem, allowed values)
EXPECTED = {
    "api-version.yaml": ":1: apiVersion: 'edgewise/v2' is not allowed (did you mean 'edgewise/v1'?); allowed: edgewise/v1",
    "kind.yaml": ":2: kind: 'EscalatonPolicy' is not allowed (did you mean 'EscalationPolicy'?); allowed: EscalationPolicy",
    "missing-name.yaml": ":4: metadata.name: required key is missing; allowed: a non-empty string",
    "missing-spec.yaml": ":1: spec: required key is missing; allowed: a mapping",
    "unknown-key.yaml": ":7: spec.budget.maxFracton: unknown key (did you mean 'maxFraction'?); allowed: maxFraction | windowFrames | maxPerSecond | burst | priority",
    "out-of-range.yaml": ":8: spec.budget.maxFraction: 1.5 is out of range; allowed: a number in [0, 1]",
    "bad-transport.yaml": ":6: spec.transport: 'http' is not allowed; allowed: grpc | mqtt, or null (the device's "
                          "cloud.transport)",
    "jpeg-quality-range.yaml": ":7: spec.payload.jpegQuality: 0 is out of range; allowed: an integer in [1, 100]",
    "jpeg-quality-type.yaml": ":7: spec.payload.jpegQuality: 85.5 is not an integer; allowed: an integer in [1, 100]",
    "band-inverted.yaml": ":7: spec.band.low: 0.7 is above high (0.3); allowed: low <= high",
    "unknown-signal.yaml": ":9: spec.signals.weights.entropi: unknown signal (did you mean 'entropy'?); allowed: uncertain_count | uncertain_fraction | mean_conf | min_conf | entropy | margin | small_boxes | tracker_disagreement | missed_object | motion | motion_blobs",
    "zero-weights.yaml": ":7: spec.signals.weights: no signal has a weight > 0, so no frame could ever be hard; allowed: at least one weight > 0",
    "duplicate-key.yaml": ":8: spec.threshold: duplicate key (first defined on line 6); allowed: each key once per mapping",
    "unavailable-action.yaml": ":6: spec.onCloudUnavailable: 'buffer' is not allowed; allowed: spool | edge_only | drop",
    "merge-iou.yaml": ":8: spec.merge.iou: 0 is out of range; allowed: a number in (0, 1]",
    "stream-burst.yaml": ":8: spec.streams.cam-1.burst: 0 is out of range; allowed: an integer in [1, 10000], or null (inherit)",
    "threshold-type.yaml": ":6: spec.threshold: 'high' is not a number; allowed: a number in [0, 1]",
    "classes-list.yaml": ":7: spec.classes: expected a mapping, got a list; allowed: a mapping",
    "yaml-syntax.yaml": ":7: not valid YAML: expected ',' or '}', but got '<stream end>'",
    "class-band-partial.yaml": ":8: spec.classes.person.band.high: required key is missing; allowed: a number in [0, 1]",
    "budget-priority.yaml": ":7: spec.budget.priority: 'newest' is not allowed; allowed: hardest | fifo",
    "payload-mode.yaml": ":7: spec.payload.mode: 'crop' is not allowed (did you mean 'crops'?); allowed: full | crops | downscaled | regions | low+regions",
    "stream-unknown-key.yaml": ":8: spec.streams.cam-1.cooldown: unknown key (did you mean 'cooldownSeconds'?); allowed: mode | threshold | band | cooldownSeconds | maxPerSecond | burst | maxFraction",
    "empty.yaml": ": empty policy; write apiVersion: edgewise/v1, kind: EscalationPolicy, metadata.name and spec",
}


def test_every_invalid_file_has_an_expectation():
    assert sorted(p.name for p in INVALID.glob("*.yaml")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 10


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_invalid_policy_message_names_file_line_key_and_allowed(name):
    path = INVALID / name
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert str(err.value) == f"{path}{EXPECTED[name]}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load_and_explain(path):
    policy = load_policy(path)
    assert policy.source == str(path)
    text = explain(policy)
    assert policy.metadata.name in text
    assert "Budget per stream" in text


def test_explain_says_how_many_frames_the_fraction_allows():
    """maxFraction 0.004 of 1000 frames allows 4, and check-policy said 'at most 0% of any 1000
    frames' (the share rounded to a whole percent); it says the count the budget allows now,
    by the budget's own rule, per stream too."""
    text = explain(parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: f}\nspec:\n"
                                "  budget: {maxFraction: 0.004, windowFrames: 1000}\n"
                                "  streams: {gate: {maxFraction: 0.025}}\n"))
    assert "at most 4 of any 1000 frames (maxFraction 0.004)" in text
    assert "stream gate: maxFraction 0.025 (at most 25 of any 1000 frames)" in text
    assert "0%" not in text


def test_example_values_round_trip():
    p = load_policy(ROOT / "examples" / "policy.yaml")
    assert p.spec.budget.max_fraction == 0.1 and p.spec.budget.burst == 4
    assert not p.spec.classes  # the shipped camera pair has no class "person" to override
    assert not p.spec.streams  # no stream of the shipped edge.yaml to override (csi0 is in a comment)
    assert p.spec.merge.strategy == "fuse" and p.spec.payload.jpeg_quality == 85
    e = load_policy(ROOT / "examples" / "policies" / "episodes.yaml")
    assert e.spec.classes["person"].threshold == 0.4
    assert e.spec.classes["person"].band is not None and e.spec.classes["person"].band.high == 0.7
    assert e.spec.streams["gate-cam"].max_per_second == 1.0


def test_minimal_policy_takes_documented_defaults():
    p = parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: m}\nspec: {}\n")
    assert p == Policy(metadata=p.metadata, source="<policy>")
    assert dict(p.spec.signals.weights) == DEFAULT_WEIGHTS
    assert p.spec.transport is None and p.spec.on_cloud_unavailable == "spool"  # None: the device's own


def test_null_inherits_and_weights_replace_defaults():
    p = parse_policy(
        "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: m}\n"
        "spec:\n  streams:\n    s1: {threshold: null, burst: 2}\n"
        "  budget: {maxPerSecond: null}\n  signals: {weights: {entropy: 1}}\n"
    )
    assert p.spec.streams["s1"].threshold is None
    assert p.rate_for("s1") == (None, 2)
    assert dict(p.spec.signals.weights) == {"entropy": 1.0}


def test_non_utf8_and_missing_file_are_config_errors(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_policy(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_policy(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_policy(tmp_path)


def test_describe_schema_rows_are_complete_and_match_the_loader():
    rows = describe_schema()
    paths = [r[0] for r in rows]
    assert len(paths) == len(set(paths))
    for path, typ, default, allowed, doc in rows:
        assert path and typ and default != "" or path == "metadata.description", path
        assert allowed and doc, path
    by_path = {r[0]: r for r in rows}
    assert by_path["spec.budget.maxFraction"][1:4] == ("number", "0.2", "a number in [0, 1]")
    assert by_path["spec.transport"][3] == "grpc | mqtt, or null (the device's cloud.transport)"
    assert by_path["spec.streams.<stream>.burst"][3].startswith("an integer in [1, 10000]")
    assert "spec.classes.<name>.band.low" in by_path
    # every documented leaf key is accepted by the loader with its default value
    for path, typ, default, _allowed, _doc in rows:
        if not path.startswith("spec.") or "<" in path or typ == "mapping" or default in ("null", "(required)"):
            continue
        *parents, leaf = path.split(".")[1:]
        doc = "spec:\n"
        for i, part in enumerate(parents):
            doc += "  " * (i + 1) + part + ":\n"
        doc += "  " * (len(parents) + 1) + f"{leaf}: {default}\n"
        parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: m}\n" + doc)


def test_explain_warns_about_budget_that_admits_nothing():
    p = parse_policy(
        "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: m}\n"
        "spec: {budget: {maxFraction: 0.001, windowFrames: 100}}\n"
    )
    assert "no frame can ever be escalated" in explain(p)


def test_schema_markdown_has_one_row_per_key():
    from edgewise.policy import schema_markdown

    md = schema_markdown().splitlines()
    assert len(md) == 2 + len(describe_schema())
    assert any(line.startswith("| spec.transport | string | null | grpc \\| mqtt, or null (the device's cloud.transport) |")
               for line in md), [line for line in md if "transport" in line]


def test_exponent_without_dot_is_a_number_but_quoted_is_not():
    head = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: m}\n"
    p = parse_policy(head + "spec: {budget: {maxPerSecond: 1e-3}}\n")  # YAML 1.1 reads a string
    assert p.spec.budget.max_per_second == 0.001
    with pytest.raises(ConfigError, match=r"spec.threshold: '0.5' is not a number"):
        parse_policy(head + "spec: {threshold: '0.5'}\n")
    with pytest.raises(ConfigError, match=r"spec.threshold: 'nan' is not a number"):
        parse_policy(head + "spec: {threshold: nan}\n")
    with pytest.raises(ConfigError, match=r"spec.threshold: nan is out of range"):
        parse_policy(head + "spec: {threshold: .nan}\n")


def test_whole_frame_refresh_rule_and_its_explanation():
    """payload.wholeFrameEverySeconds: one rule (Payload.whole_frame_due) for the daemon, the
    evaluation and the what-if; off at 0 and for full payloads; a clock that went back is a new run."""
    body = ("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\nspec:\n"
            "  payload: {mode: regions, wholeFrameEverySeconds: 2}\n")
    p = parse_policy(body)
    due = p.spec.payload.whole_frame_due
    assert due(None, 5.0) and not due(5.0, 6.9) and due(5.0, 7.0) and due(5.0, 4.0)
    assert not Payload(mode="regions").whole_frame_due(None, 1.0)
    assert not Payload(mode="full", whole_frame_every_s=2.0).whole_frame_due(None, 1.0)
    text = explain(p)
    assert "the whole frame instead when the stream's last went 2s ago" in text
    assert "wholeFrameEverySeconds 2 without merge.carryFrames" in text
    carried = parse_policy(body + "  merge: {carryFrames: 30}\n")
    assert "without merge.carryFrames" not in explain(carried)
    with pytest.raises(ConfigError, match="wholeFrameEverySeconds"):
        parse_policy(body.replace("wholeFrameEverySeconds: 2", "wholeFrameEverySeconds: -1"))


def test_carry_scope_is_validated_and_explained():
    body = ("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\nspec:\n"
            "  payload: {mode: regions}\n")
    p = parse_policy(body + "  merge: {carryFrames: 30, carryScope: regions}\n")
    assert p.spec.merge.carry().scope == "regions"
    assert "replaces them only inside the regions it saw" in explain(p) and "carryScope" not in explain(p)
    assert "a newer answer replaces them." in explain(parse_policy(body + "  merge: {carryFrames: 30}\n"))
    with pytest.raises(ConfigError, match=r"spec.merge.carryScope"):
        parse_policy(body + "  merge: {carryScope: tiles}\n")
    whole = parse_policy(body.replace("regions", "low+regions") + "  merge: {carryFrames: 30, carryScope: regions}\n")
    assert "carryScope regions has no effect: every payload.mode low+regions answer covers the whole frame" in explain(whole)
    off = parse_policy(body + "  merge: {carryScope: regions}\n")
    assert "carryScope regions has no effect: nothing is carried" in explain(off)


def test_the_daemon_refuses_a_named_pipe_at_once_and_check_policy_still_reads_one(tmp_path):
    """Reading a FIFO without a writer blocked the daemon's reload thread for ever;
    ``regular_only`` (the daemon's reads) refuses it without waiting, and the plain read
    (``check-policy <(kubectl ...)``) reads what a writer sends."""
    import os
    import threading

    from edgewise.policy.holding import PolicyHolder
    from edgewise.policy.loading import read_policy_bytes

    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    outcome = []
    t = threading.Thread(target=lambda: outcome.append(_refusal(fifo)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the daemon's read of a FIFO blocked"
    assert outcome == [f"{fifo}: is a named pipe (FIFO), expected a policy YAML file "
                       "(the daemon re-reads it on every change)"]
    with pytest.raises(ConfigError, match="named pipe"):  # the daemon's start and check-config
        PolicyHolder.from_file(fifo)
    plan = PolicyHolder(parse_policy(EXAMPLES[0].read_bytes(), str(EXAMPLES[0]))).prepare(fifo)
    assert not plan.ok and "named pipe" in (plan.error or "")  # every reload

    text = EXAMPLES[0].read_bytes()
    writer = threading.Thread(target=fifo.write_bytes, args=(text,), daemon=True)
    writer.start()
    assert read_policy_bytes(fifo) == text
    writer.join(10)


def _refusal(path: Path) -> str:
    from edgewise.policy.loading import read_policy_bytes

    try:
        read_policy_bytes(path, regular_only=True)
    except ConfigError as exc:
        return str(exc)
    return "read"


def test_a_file_over_the_limit_is_refused_with_its_own_size(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 3_000_000)
    with pytest.raises(ConfigError, match=r"big\.yaml: policy file is 3000000 bytes, over the 1048576-byte limit"):
        load_policy(big)


HEAD = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: n}\nspec:\n"


def test_numbers_read_as_yaml_1_2_and_past_any_float_are_out_of_range_with_their_line():
    """`windowFrames: 0300` was 192 (YAML 1.1 octal) and the explanation said "any 192 frames";
    `cooldownSeconds: 1:30` was 90 (base 60); a 400-digit number was "cannot read the policy:
    OverflowError" with no line (found by a probe)."""
    p = parse_policy(HEAD + "  budget: {windowFrames: 0300}\n", "p.yaml")
    assert p.spec.budget.window_frames == 300 and "any 300 frames" in explain(p)
    with pytest.raises(ConfigError, match=r"^p.yaml:5: spec.cooldownSeconds: '1:30' is not a number"):
        parse_policy(HEAD + "  cooldownSeconds: 1:30\n", "p.yaml")
    huge = "1" + "0" * 400
    for key in ("threshold", "budget: {windowFrames", "budget: {maxPerSecond"):
        text = HEAD + f"  {key}: {huge}" + ("}" if "{" in key else "") + "\n"
        with pytest.raises(ConfigError, match=r"^p.yaml:5: spec\..* is out of range"):
            parse_policy(text, "p.yaml")


def test_an_integer_written_with_a_point_zero_and_a_number_key_read_as_the_other_loaders_do():
    """`burst: 4.0` passed the JSON schema and the settings loader's rule and was refused here;
    `streams: {101: ...}` said "keys must be strings" with no word of quoting (found by a probe)."""
    p = parse_policy(HEAD + "  budget: {burst: 4.0}\n", "p.yaml")
    assert p.spec.budget.burst == 4 and isinstance(p.spec.budget.burst, int)
    with pytest.raises(ConfigError, match=r"keys must be strings, got 101; quote it to mean the text: '101'"):
        parse_policy(HEAD + "  streams: {101: {mode: never}}\n", "p.yaml")


def test_a_settings_file_given_as_the_policy_is_named_as_not_one():
    # `check-policy edge.yaml` / `--policy edge.yaml` said only "device_id: unknown key; allowed: ..."
    with pytest.raises(ConfigError, match=r"^edge.yaml:1: device_id: unknown key; this file is no escalation policy "
                                          r"\(a policy has apiVersion, kind: EscalationPolicy, metadata and spec at "
                                          r"its top\): settings go to --config, the policy is the file policy_file "
                                          r"names; allowed: apiVersion \| kind \| metadata \| spec$"):
        parse_policy("device_id: cam-1\nmodel: {path: m.onnx}\n", "edge.yaml")
    with pytest.raises(ConfigError, match=r"^p.yaml:3: specs: unknown key \(did you mean 'spec'\?\); allowed: "):
        parse_policy("apiVersion: edgewise/v1\nkind: EscalationPolicy\nspecs: {}\n", "p.yaml")  # a policy's typo


def test_a_class_key_written_decomposed_is_the_models_class(tmp_path):
    """A policy written on macOS (its class key decomposed, NFD: 'a' + U+0308) named 'Fußgänger'
    as the model does (NFC), alike to the eye; the daemon warned "spec.classes Fußgänger are not
    classes of <model>" and the class's threshold never applied (found by a probe). Policy keys
    are taken in the form the model loader takes names in."""
    import unicodedata

    from edgewise.runtime.metadata import load_model_info
    from tests.edgewise.runtime.graphs import fake_yolo, names_meta

    nfd, nfc = unicodedata.normalize("NFD", "Fußgänger"), unicodedata.normalize("NFC", "Fußgänger")
    assert nfd != nfc
    model = tmp_path / "m.onnx"
    info = load_model_info(fake_yolo(model, nc=2, metadata=names_meta([nfc, "Auto"])))
    p = parse_policy(HEAD + f"  threshold: 0.5\n  classes: {{{nfd}: {{threshold: 0.2}}}}\n", "p.yaml")
    assert p.fit_warnings(info.names, str(model), ["s"]) == []
    assert p.threshold_for("s", (nfc,)) == (0.2, f"class {nfc}")
    # the two forms of one name in one file: one class twice, refused as a duplicate key is
    with pytest.raises(ConfigError, match=rf"^p.yaml:7: spec.classes.{nfc}: the same name as on line 6, written in "
                                          r"another Unicode form \(one decomposed, NFD, as macOS file names give\); "
                                          r"allowed: each name once per mapping$"):
        parse_policy(HEAD + f"  classes:\n    {nfc}: {{threshold: 0.2}}\n    {nfd}: {{threshold: 0.3}}\n", "p.yaml")


@pytest.mark.parametrize("key", ["budget: {maxPerSecond", "streams: {s: {maxPerSecond", "cooldownSeconds",
                                 "payload: {wholeFrameEverySeconds"])
@pytest.mark.parametrize("value", ["1e-320", "5e-324", "-1e-310"])
def test_a_subnormal_number_is_refused_not_taken_as_a_rate(key, value):
    """`maxPerSecond: 1e-320` loaded: a rate of no escalation at all that `explain` printed as
    "9.99989e-321/s", and 5e-324 is infinite inverted (found by a probe). A non-zero number below
    the smallest normal float (2.2e-308) is refused by the one range rule, for every number."""
    text = HEAD + f"  {key}: {value}" + "}" * key.count("{") + "\n"
    with pytest.raises(ConfigError, match=r"^p.yaml:5: spec\..*: -?\de-3\d\d is too close to 0 \(below 2.2e-308: a "
                                          r"subnormal number, meaningless as a rate or a period, infinite inverted\); "
                                          r"write 0 where 0 is allowed, or a larger number; allowed: "):
        parse_policy(text, "p.yaml")


def test_zero_and_small_normal_numbers_still_load():
    p = parse_policy(HEAD + "  cooldownSeconds: 0\n  budget: {maxPerSecond: 1e-6}\n", "p.yaml")
    assert (p.spec.cooldown_seconds, p.spec.budget.max_per_second) == (0.0, 1e-6)
