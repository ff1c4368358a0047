"""Hostile YAML in settings and policy files: one clear error, quickly, from both loaders."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from edgewise.errors import ConfigError
from edgewise.policy import parse_policy
from edgewise.settings import parse_yaml

POLICY_HEAD = "apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: p}\n"


def laughs(levels: int = 9) -> str:
    """Nine levels of nine aliases each: 10^9 values from about 400 bytes."""
    lines = ["x_a: &a [1,1,1,1,1,1,1,1,1]"]
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"x_{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def both(text: str):
    """The settings reader and the policy reader, on the same hostile text."""
    return [lambda: parse_yaml(text, "s.yaml", "edge settings"),
            lambda: parse_policy(POLICY_HEAD + "spec: {}\n" + text, "p.yaml")]


@pytest.mark.parametrize("read", both(laughs()), ids=["settings", "policy"])
def test_an_alias_bomb_is_refused_at_once(read):
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"expands to more than 100000 values \(YAML aliases"):
        read()
    assert time.monotonic() - t0 < 5.0


@pytest.mark.parametrize("read", both("x: " + "[" * 50_000 + "]" * 50_000 + "\n"), ids=["settings", "policy"])
def test_nesting_deeper_than_python_can_follow_is_one_line(read):
    with pytest.raises(ConfigError, match=r"nested too deeply to read"):
        read()


@pytest.mark.parametrize("read", [lambda: parse_yaml("threads: " + "9" * 5000 + "\n", "s.yaml", "edge settings"),
                                  lambda: parse_policy(POLICY_HEAD + "spec:\n  threshold: " + "9" * 5000, "p.yaml")],
                         ids=["settings", "policy"])
def test_a_number_of_thousands_of_digits_is_one_line(read):
    with pytest.raises(ConfigError, match=r"a number has too many digits"):
        read()


@pytest.mark.parametrize("read", both("a: b\x00c\n"), ids=["settings", "policy"])
def test_a_nul_byte_is_named_with_its_position(read):
    with pytest.raises(ConfigError, match=r"not valid YAML at character \d+: special characters are not allowed"):
        read()


@pytest.mark.parametrize("value, says", [
    ("!custom 0.5", "could not determine a constructor for the tag '!custom'"),
    ("!!python/name:os.system", "could not determine a constructor for the tag 'tag:yaml.org"),
    ("\n    <<: 5", "while constructing a mapping, expected a mapping or list of mappings for merging"),
])
def test_a_tag_or_merge_key_no_reader_takes_names_its_line(value: str, says: str):
    line = 5 if "<<" in value else 4
    with pytest.raises(ConfigError, match=rf"^s.yaml:{line}: cannot read a value: " + re.escape(says)):
        parse_yaml(f"a: 1\nb: 2\nc:\n  d: {value}\n", "s.yaml", "edge settings")
    with pytest.raises(ConfigError, match=rf"^p.yaml:{line + 1}: cannot read a value: " + re.escape(says)):
        parse_policy(POLICY_HEAD + f"spec:\n  {'signals' if '<<' in value else 'threshold'}: {value}\n", "p.yaml")


def test_merge_keys_work_in_policies_as_in_settings_and_own_keys_win():
    text = (POLICY_HEAD + "spec:\n  streams:\n    a: &s {threshold: 0.3, mode: auto}\n"
            "    b:\n      <<: *s\n      threshold: 0.4\n")
    streams = parse_policy(text, "p.yaml").spec.streams
    assert (streams["a"].threshold, streams["b"].threshold, streams["b"].mode) == (0.3, 0.4, "auto")
    tree = parse_yaml("base: &b {x: 1, y: 2}\nitem:\n  <<: *b\n  y: 3\n", "s.yaml", "settings")
    assert {k: v.data for k, v in tree.data["item"].data.items()} == {"x": 1, "y": 3}


def test_of_several_merged_mappings_the_first_wins_and_own_duplicates_are_refused():
    tree = parse_yaml("a: &a {x: 1}\nb: &b {x: 2, z: 0}\nc:\n  <<: [*a, *b]\n", "s.yaml", "settings")
    assert {k: v.data for k, v in tree.data["c"].data.items()} == {"x": 1, "z": 0}
    with pytest.raises(ConfigError, match=r"^s.yaml:5: c.x: duplicate key \(first defined on line 3\)"):
        parse_yaml("a: &a {x: 1}\nc:\n  x: 1\n  <<: *a\n  x: 2\n", "s.yaml", "settings")
    with pytest.raises(ConfigError, match=r"^p.yaml:6: spec.threshold: duplicate key \(first defined on line 5\)"):
        parse_policy(POLICY_HEAD + "spec:\n  threshold: 0.3\n  threshold: 0.4\n", "p.yaml")


def test_two_merge_keys_in_one_mapping_are_refused_not_the_last_taken():
    # PyYAML let the second '<<' win silently, so 'c.x' read 2 where one merge list reads 1
    says = r"a second merge key '<<' in one mapping \(the first is on line (\d+)\); .*'<<: \[\*first, \*second\]'"
    with pytest.raises(ConfigError, match=r"^s.yaml:5: c\.<<: " + says) as settings:
        parse_yaml("a: &a {x: 1}\nb: &b {x: 2, z: 0}\nc:\n  <<: *a\n  <<: *b\n", "s.yaml", "settings")
    with pytest.raises(ConfigError, match=r"^p.yaml:10: spec.streams.b.<<: " + says) as policy:
        parse_policy(POLICY_HEAD + "spec:\n  streams:\n    a: &s {threshold: 0.3}\n    c: &t {threshold: 0.5}\n"
                     "    b:\n      <<: *s\n      <<: *t\n", "p.yaml")
    assert "line 4)" in str(settings.value) and "line 9)" in str(policy.value)


def test_an_oversized_settings_file_is_refused_before_it_is_parsed(tmp_path):
    from edgewise.settings import read_yaml

    p = tmp_path / "big.yaml"
    p.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match=r"big.yaml: edge settings file is \d+ bytes, over the 1048576-byte limit"):
        read_yaml(p, "edge settings")


def test_check_config_refuses_a_settings_alias_bomb_in_seconds(tmp_path):
    """`edge check-config` and `edge run` hung for minutes and grew without bound."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text("device_id: cam-1\n" + laughs())
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "edgewise", "edge", "check-config", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "expands to more than 100000 values" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 30


def test_two_documents_say_that_one_is_expected() -> None:
    """The message kept only "but found another document" (found by a probe)."""
    from edgewise import yamlnodes

    with pytest.raises(ConfigError, match=r"^x.yaml:2: not valid YAML: expected a single document in the stream, "
                                          r"but found another document$"):
        yamlnodes.compose("a: 1\n---\nb: 2\n", "x.yaml")


def test_of_a_merge_list_the_first_wins_whatever_the_key_and_the_pyyaml_release():
    # PyYAML 6.0.4's flatten_mapping drops a repeated merged key only when the two key strings are
    # one object: a one-letter key ('x', interned) kept the first mapping's value, a real setting
    # name ('threshold') the last one's, though the error above tells to write this form for the first
    tree = parse_yaml("a: &a {threshold: 1, x: 1}\nb: &b {threshold: 2, x: 2, z: 0}\nc:\n  <<: [*a, *b]\n",
                      "s.yaml", "settings")
    assert {k: v.data for k, v in tree.data["c"].data.items()} == {"threshold": 1, "x": 1, "z": 0}
    pol = parse_policy(POLICY_HEAD + "spec:\n  streams:\n    a: &s {threshold: 0.3}\n    c: &t {threshold: 0.5}\n"
                       "    b:\n      <<: [*s, *t]\n", "p.yaml")
    assert pol.spec.streams["b"].threshold == 0.3
    # a merged mapping's own keys win over what it merges, the mapping's own over all merged
    tree = parse_yaml("a: &a {threshold: 1}\nb: &b {<<: *a, threshold: 2}\nc:\n  <<: *b\nd:\n  <<: *b\n  threshold: 3\n",
                      "s.yaml", "settings")
    assert tree.data["c"].data["threshold"].data == 2 and tree.data["d"].data["threshold"].data == 3


@pytest.mark.parametrize("merged", ["{<<: *a, <<: *b}", "&m {<<: *a, <<: *b}", "[{<<: *a, <<: *b}]"])
def test_two_merge_keys_in_a_mapping_that_is_merged_in_are_refused_too(merged):
    # such a mapping was flattened by PyYAML inside the one that merged it, never read by
    # mapping_pairs: one of the two silently won
    with pytest.raises(ConfigError, match=r"a second merge key '<<' in one mapping"):
        parse_yaml(f"a: &a {{threshold: 1}}\nb: &b {{threshold: 2}}\nc:\n  <<: {merged}\n", "s.yaml", "settings")
    with pytest.raises(ConfigError, match=r"^s.yaml:3: cannot read a value: .*expected a mapping for merging"):
        parse_yaml("a: &a {x: 1}\nb:\n  <<: [*a, 3]\n", "s.yaml", "settings")


def test_a_mapping_merged_in_has_each_key_once_too():
    # written inline as a merge value it was never read as a mapping of its own: the first 'x' won
    with pytest.raises(ConfigError, match=r"^s.yaml:1: b.x: duplicate key \(first defined on line 1\)"):
        parse_yaml("b: {<<: {x: 1, x: 2}}\n", "s.yaml", "settings")
    with pytest.raises(ConfigError, match=r"^s.yaml:3: b.x: duplicate key \(first defined on line 2\)"):
        parse_yaml("b:\n  <<: [{y: 0}, {x: 1,\n    x: 2}]\n", "s.yaml", "settings")


@pytest.mark.parametrize("text, address", [
    ("transport:\n  endpoints:\n    - [::1]:50051\n", "[::1]:50051"),
    ("cloud:\n  endpoints:\n  - grpc.example.com:443\n  - [fd00::7]:443 # the spare\n", "[fd00::7]:443"),
])
def test_an_unquoted_ipv6_address_with_a_port_says_to_quote_it(text: str, address: str) -> None:
    """YAML reads ``[`` as a list: the error named the line, not what to write (review)."""
    from edgewise import yamlnodes

    with pytest.raises(ConfigError, match=r"^e.yaml:\d: not valid YAML: .*; quote an IPv6 address with a port, "
                                          rf"YAML reads '\[' as a list: '{re.escape(address)}'$"):
        yamlnodes.compose(text, "e.yaml")
    quoted = text.replace(address, f"'{address}'")
    assert yamlnodes.compose(quoted, "e.yaml")[0] is not None


def test_a_yaml_error_without_an_address_gets_no_quoting_hint() -> None:
    from edgewise import yamlnodes

    with pytest.raises(ConfigError) as err:
        yamlnodes.compose("a: [1, 2\nb: 3\n", "e.yaml")
    assert "IPv6" not in str(err.value)


@pytest.mark.parametrize("text", [
    "a: b: c  # was [::1]:50051\n",            # the address is in a comment
    'a: "host [::1]:50051" b: c\n',            # and here quoted already, in a string
    "a: [1, 2\nb: 3  # [::1]:50051\n",          # the error is elsewhere on the line
])
def test_an_address_beside_an_unrelated_yaml_error_gets_no_quoting_hint(text: str) -> None:
    """The hint is for the address YAML stumbled on: one in a comment or in a quoted string on
    the error's line had nothing to do with the error, and 'quote it' misled (review)."""
    from edgewise import yamlnodes

    with pytest.raises(ConfigError) as err:
        yamlnodes.compose(text, "e.yaml")
    assert "IPv6" not in str(err.value), str(err.value)
