"""The shared command-line conventions: --config, --set, --describe-settings, named flags."""

from __future__ import annotations

import argparse

import pytest

from edgewise.errors import ConfigError
from edgewise.settings import add_settings_arguments, describe, rows, settings_from_args


def _parser(schema) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgewise test")
    add_settings_arguments(p, schema)
    return p


def test_flags_beat_set_beat_environment_beat_file(schema, yaml_file):
    cfg = yaml_file("net: {port: 1}\ntags: [f]\n")
    args = _parser(schema).parse_args(["-c", str(cfg), "--set", "net.port=2", "--port", "3", "--tag", "a", "--tag", "b"])
    r = settings_from_args(args, schema, env={"EDGEWISE_TEST__NET__PORT": "4"})
    assert r.net.port == 3 and r.tags == ["a", "b"]
    args = _parser(schema).parse_args(["--config", str(cfg), "--set", "net.port=2"])
    assert settings_from_args(args, schema, env={"EDGEWISE_TEST__NET__PORT": "4"}).net.port == 2


@pytest.mark.parametrize("text, env, flags, source", [
    # the rule's other key set over a file that sets neither: the file was named, the flag
    # or variable the operator had just given was not (`--min 16` against the default max_replicas)
    ("net:\n  host: h\n", {"EDGEWISE_TEST__NET__TLS": "1"}, [], "EDGEWISE_TEST__NET__TLS"),
    ("net:\n  host: h\n", {}, ["--tls"], "--tls"),
    # the rule's own key in the file, the other one later: the later one is what changed
    ("net:\n  port: 80\n", {"EDGEWISE_TEST__NET__TLS": "1"}, [], "EDGEWISE_TEST__NET__TLS"),
    ("net:\n  tls: true\n", {"EDGEWISE_TEST__NET__PORT": "80"}, [], "EDGEWISE_TEST__NET__PORT: "),
    ("net:\n  tls: true\n", {"EDGEWISE_TEST__NET__PORT": "80"}, ["--tls"], "--tls"),
    ("net:\n  port: 80\n  tls: true\n", {}, [], "s.yaml:2"),  # both in the file: the rule's own key
])
def test_a_rule_between_keys_names_the_latest_source_of_either(schema, yaml_file, text, env, flags, source):
    cfg = yaml_file(text)
    args = _parser(schema).parse_args(["--config", str(cfg), *flags])
    with pytest.raises(ConfigError) as ei:
        settings_from_args(args, schema, env=env)
    where = f"{cfg.parent}/{source}" if source.startswith("s.yaml") else source
    # (the key path is left out where the source set exactly it)
    rest = "must not be 80 with tls" if source.endswith(": ") else ": net.port: must not be 80 with tls"
    assert str(ei.value) == where + rest


def test_an_environment_value_the_command_line_replaces_is_logged(schema, yaml_file, caplog):
    """The chart runs workers with flags (``--max-batch=8``): an ``EDGEWISE_WORKER__BATCHING__MAX_BATCH_SIZE``
    from ``worker.envFrom`` was not in force, and nothing said so."""
    cfg = yaml_file("net: {port: 1}\n")
    env = {"EDGEWISE_TEST__NET__PORT": "4", "EDGEWISE_TEST__NAME": "env"}
    with caplog.at_level("WARNING", logger="edgewise.settings"):
        r = settings_from_args(_parser(schema).parse_args(["-c", str(cfg), "--port", "3"]), schema, env=env)
    assert r.net.port == 3 and r.name == "env"
    assert [rec.getMessage() for rec in caplog.records] == [
        "EDGEWISE_TEST__NET__PORT is not in force: --port replaces it (later layers win: the environment < --set "
        "< the named flags)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgewise.settings"):  # the environment over the file: its purpose
        settings_from_args(_parser(schema).parse_args(["-c", str(cfg), "--set", "name=s"]), schema,
                           env={"EDGEWISE_TEST__NET__PORT": "4"})
    assert not caplog.records


def test_switches_and_implied_keys(schema):
    r = settings_from_args(_parser(schema).parse_args(["--https"]), schema, env={})
    assert r.net.tls and r.net.port == 443
    args = _parser(schema).parse_args(["--tls"])
    with pytest.raises(ConfigError, match=r"^--tls: net.port: must not be 80 with tls$"):
        settings_from_args(args, schema, env={})


def test_flag_values_are_converted_by_the_loader_and_named(schema):
    args = _parser(schema).parse_args(["--port", "eighty"])
    with pytest.raises(ConfigError, match=r"^--port: 'eighty' is not an integer; allowed: an integer in \[1, 65535\]$"):
        settings_from_args(args, schema, env={})


def test_describe_settings_prints_every_key_and_exits_0(schema, capsys):
    with pytest.raises(SystemExit) as ei:
        _parser(schema).parse_args(["--describe-settings", "--port", "nonsense"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert out == describe(schema) + "\n"
    assert "\nnet.port\n  type int, default 80; allowed: an integer in [1, 65535]\n" \
           "  env EDGEWISE_TEST__NET__PORT; flag --port\n  Port.\n" in out
    assert "\nitems\n  type list of mapping, default [{name: x, weight: 2.0}, {name: y, weight: 1.0}]" in out
    assert "\nitems[].name\n  type str, default (required); allowed: a string\n  env EDGEWISE_TEST__ITEMS__<N>__NAME" in out
    assert "secret: its value is never printed" in out


def test_rows_cover_every_key_once(schema):
    keys = [r.key for r in rows(schema)]
    assert keys == ["name", "ratio", "tags", "sizes", "pair", "net.host", "net.port", "net.tls", "net.token",
                    "net.mode", "items", "items[].name", "items[].weight", "extra"]
    ratio = rows(schema)[1]
    assert (ratio.type, ratio.default, ratio.allowed) == ("float or null", "null", "a number in [0, 1], or null")
    assert rows(schema)[4].type == "list of 2 float" and rows(schema)[-1].type == "mapping"


def test_help_names_the_key_each_flag_sets(schema):
    text = _parser(schema).format_help()
    assert "--port PORT" in text and "(sets net.port)" in text and "TLS on port 443 (sets net.tls)" in text
