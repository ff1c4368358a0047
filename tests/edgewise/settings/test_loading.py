"""The loader: layering, strict building, and errors that name the source of each bad value."""

from __future__ import annotations

import pytest

from edgewise.errors import ConfigError
from edgewise.settings import check
from edgewise.settings.building import load_file
from tests.edgewise.settings.conftest import Item, Net


def test_defaults_without_any_source(schema):
    r = schema.load(None, env={})
    assert r.net == Net() and [i.name for i in r.items] == ["x", "y"] and r.ratio is None and r.pair == (1.0, 2.0)


def test_layers_file_env_set_values_in_order(schema, yaml_file):
    p = yaml_file("name: file\nnet:\n  port: 8080\n  host: h\n")
    env = {"EDGEWISE_TEST__NET__PORT": "8081", "EDGEWISE_TEST__NAME": "env", "EDGEWISE_OTHER__X": "ignored"}
    r = schema.load(p, ["net.port=8082"], env)
    assert (r.name, r.net.host, r.net.port) == ("env", "h", 8082)
    assert schema.load(p, {"net.port": 8083}, env).net.port == 8083
    assert schema.load(p, env=env).net.port == 8081


def test_a_section_in_the_file_overlays_the_default_not_the_class(schema, yaml_file):
    r = schema.load(yaml_file("net: {tls: true, port: 443}\nitems:\n  - name: z\n"), env={})
    assert r.net == Net(tls=True, port=443) and r.items == [Item("z")]
    assert schema.load(yaml_file("net:\n"), env={}).net == Net()  # a section left empty keeps its defaults


def test_list_items_by_index_from_the_defaults_and_the_file(schema, yaml_file):
    r = schema.load(None, ["items.1.weight=3"], {"EDGEWISE_TEST__ITEMS__0__NAME": "a"})
    assert [(i.name, i.weight) for i in r.items] == [("a", 2.0), ("y", 3.0)]
    with pytest.raises(ConfigError, match=r"^--set items.2.name: items: has no item 2; add items in the file; "
                                          r"allowed: an index from 0 to 1$"):
        schema.load(None, ["items.2.name=z"], {})
    with pytest.raises(ConfigError, match=r"^--set tags.0: tags: has no item 0.*allowed: none: the list is empty"):
        schema.load(None, ["tags.0=a"], {})
    with pytest.raises(ConfigError, match=r"^--set net.port.x: net.port: is a single value; it has no key 'x'"):
        schema.load(None, ["net.port.x=1"], {})


def test_text_and_yaml_values_follow_one_table(schema, yaml_file):
    r = schema.load(yaml_file("ratio: '0.5'\ntags: a, b\nsizes: [4, '8']\npair: [3, 4]\nnet: {port: 443.0, tls: 'on'}\n"),
                    env={})
    assert (r.ratio, r.tags, r.sizes, r.pair, r.net.port, r.net.tls) == (0.5, ["a", "b"], (4, 8), (3.0, 4.0), 443, True)
    r = schema.load(None, ["ratio=null", "tags=[c, d]", "sizes=", "pair=5,6", "net.tls=yes", "net.port=443",
                           "extra.port=50061", "extra.name=w"], {})
    assert (r.ratio, r.tags, r.sizes, r.pair, r.net.tls) == (None, ["c", "d"], (), (5.0, 6.0), True)
    assert r.extra == {"port": 50061, "name": "w"}  # free-form mappings read text as YAML scalars


def test_numbers_are_read_in_ascii_digits_only(schema, yaml_file):
    """Python's int() and float() take any script's digits, so `port: '١٢٣٤'` (Arabic-Indic, which
    YAML leaves a string), `EDGEWISE_..._PORT=８０８０` (full-width) and `--set ratio=٠.٥` were
    taken as 1234, 8080 and 0.5, and `--set items.١.name=z` set item 1 (found by a probe).
    Each is refused, naming its source and key."""
    hint = r" \(write it in the ASCII digits 0-9\); allowed: "
    with pytest.raises(ConfigError, match=r"/s.yaml:2: net.port: '١٢٣٤' is not an integer" + hint):
        schema.load(yaml_file("net:\n  port: '١٢٣٤'\n"), env={})
    with pytest.raises(ConfigError, match=r"^EDGEWISE_TEST__NET__PORT: '８０８０' is not an integer" + hint):
        schema.load(None, env={"EDGEWISE_TEST__NET__PORT": "８０８０"})
    with pytest.raises(ConfigError, match=r"^--set ratio: '٠.٥' is not a number" + hint):
        schema.load(None, ["ratio=٠.٥"], {})
    with pytest.raises(ConfigError, match=r"^--set items.١.name: items: has no item ١"):
        schema.load(None, ["items.١.name=z"], {})
    r = schema.load(yaml_file("net:\n  port: '1234'\nratio: ' 0.5 '\n"), ["items.1.name=z"], {})
    assert (r.net.port, r.ratio, r.items[1].name) == (1234, 0.5, "z")  # ASCII text still reads


def test_a_subnormal_number_is_refused_as_the_policy_refuses_it(schema, yaml_file):
    """The settings share the policy's range rule (edgewise.fieldrules): `ratio: 1e-320` was taken."""
    with pytest.raises(ConfigError, match=r"/s.yaml:1: ratio: 1e-320 is too close to 0 \(below 2.2e-308"):
        schema.load(yaml_file("ratio: 1e-320\n"), env={})
    with pytest.raises(ConfigError, match=r"^--set ratio: '5e-324' is too close to 0 "):
        schema.load(None, ["ratio=5e-324"], {})
    assert schema.load(None, ["ratio=0"], {}).ratio == 0.0


def test_numbers_given_as_text_take_no_underscores(schema, yaml_file):
    """Python's int() and float() take '_' between digits, so `EDGEWISE_..._PORT=1_000`,
    `--set ratio=0.2_5` and `port: '1_000'` ran as 1000 and 0.25, and `port: 1_000` unquoted, which
    YAML 1.2 (the settings reader) leaves text, did too (found by a probe). File, environment and
    --set now agree: each is refused, naming its source and key."""
    hint = r" \(write it without '_' separators\); allowed: "
    with pytest.raises(ConfigError, match=r"/s.yaml:2: net.port: '1_000' is not an integer" + hint):
        schema.load(yaml_file("net:\n  port: 1_000\n"), env={})
    with pytest.raises(ConfigError, match=r"/s.yaml:2: net.port: '1_000' is not an integer" + hint):
        schema.load(yaml_file("net:\n  port: '1_000'\n"), env={})
    with pytest.raises(ConfigError, match=r"^EDGEWISE_TEST__NET__PORT: '1_000' is not an integer" + hint):
        schema.load(None, env={"EDGEWISE_TEST__NET__PORT": "1_000"})
    with pytest.raises(ConfigError, match=r"^--set net.port: '0x_1f' is not an integer" + hint):
        schema.load(None, ["net.port=0x_1f"], {})
    with pytest.raises(ConfigError, match=r"^--set ratio: '0.2_5' is not a number" + hint):
        schema.load(None, ["ratio=0.2_5"], {})
    r = schema.load(None, ["net.port=1000", "ratio=0.25", "net.host=a_b"], {})
    assert (r.net.port, r.ratio, r.net.host) == (1000, 0.25, "a_b")  # text fields keep their '_'


@pytest.mark.parametrize("text, message", [
    ("net:\n  prot: 1\n", "s.yaml:2: net.prot: unknown key (did you mean 'port'?); allowed: host | port | tls | token | mode"),
    ("net:\n  port: 0\n", "s.yaml:2: net.port: 0 is out of range; allowed: an integer in [1, 65535]"),
    ("net:\n  port: eighty\n", "s.yaml:2: net.port: 'eighty' is not an integer; allowed: an integer in [1, 65535]"),
    ("net:\n  mode: c\n", "s.yaml:2: net.mode: 'c' is not allowed; allowed: a | b"),
    ("net:\n  tls: maybe\n", "s.yaml:2: net.tls: 'maybe' is not a boolean; allowed: true | false"),
    ("name: null\n", "s.yaml:1: name: null is not allowed; allowed: a string"),
    ("ratio: 2\n", "s.yaml:1: ratio: 2 is out of range; allowed: a number in [0, 1], or null"),
    ("sizes: [1, 0]\n", "s.yaml:1: sizes[1]: 0 is out of range; allowed: an integer >= 1"),
    ("pair: [1]\n", "s.yaml:1: pair: has 1 items, not 2; allowed: a list, each item a number"),
    ("tags: {a: 1}\n", "s.yaml:1: tags: expected a list, got a mapping; allowed: a list, each item a string"),
    ("net: 8\n", "s.yaml:1: net: expected a mapping, got 8; allowed: a mapping"),
    ("name: [a]\n", "s.yaml:1: name: expected a single value, got a list; allowed: a string"),
    ("items:\n  - weight: 2\n", "s.yaml:2: items[0].name: required key is missing"),
    ("items:\n  - name: a\n  - name: a\n", "s.yaml:3: items[1].name: duplicate item name"),
    ("net:\n  tls: true\n", "s.yaml:2: net.port: must not be 80 with tls"),  # the line of what the rule read
    ("net: {port: 1}\nnet: {port: 2}\n", "s.yaml:2: net: duplicate key (first defined on line 1)"),
    ("1: a\n", "s.yaml:1: keys must be strings, got 1"),
    ("- a\n", "s.yaml:1: the top level must be a mapping of test settings"),
    ("net: [\n", "s.yaml:2: not valid YAML"),
])
def test_file_errors_name_the_line_and_key(schema, yaml_file, text, message):
    path = yaml_file(text)
    with pytest.raises(ConfigError) as ei:
        schema.load(path, env={})
    assert str(ei.value).startswith(str(path.parent) + "/" + message)


def test_a_policy_given_as_settings_is_named_as_one(schema, yaml_file):
    # `edge run --config policy.yaml` said only "apiVersion: unknown key; allowed: ..."
    path = yaml_file("apiVersion: edgewise/v1\nkind: EscalationPolicy\nmetadata: {name: a}\nspec: {}\n")
    with pytest.raises(ConfigError, match=r"s.yaml:1: apiVersion: unknown key; this file is an escalation policy "
                                          r"\(kind: EscalationPolicy\), not settings: the edge daemon reads it from "
                                          r"policy_file \(--policy\); allowed: "):
        schema.load(path, env={})
    with pytest.raises(ConfigError, match=r"s.yaml:2: net.kind: unknown key; allowed: "):  # only at the top
        schema.load(yaml_file("net:\n  kind: EscalationPolicy\n"), env={})


def test_yaml_anchors_and_merge_keys(schema, yaml_file):
    r = schema.load(yaml_file("extra: &h {host: h}\nnet: {port: 81, <<: *h}\n"), env={})
    assert (r.net.port, r.net.host) == (81, "h")


def test_environment_errors_name_the_variable(schema):
    with pytest.raises(ConfigError, match=r"^EDGEWISE_TEST__NET__PORT: 'x' is not an integer; allowed: an integer"):
        schema.load(None, env={"EDGEWISE_TEST__NET__PORT": "x"})
    with pytest.raises(ConfigError, match=r"^EDGEWISE_TEST__NET__PROT: unknown key \(did you mean "
                                          r"EDGEWISE_TEST__NET__PORT\?\); allowed: host \| port"):
        schema.load(None, env={"EDGEWISE_TEST__NET__PROT": "1"})
    with pytest.raises(ConfigError, match=r"^EDGEWISE_TEST_NET__PORT: not a settings variable; test settings are named "
                                          r"EDGEWISE_TEST__<KEY>__<SUBKEY> \(did you mean EDGEWISE_TEST__NET__PORT\?\)$"):
        schema.load(None, env={"EDGEWISE_TEST_NET__PORT": "1"})
    with pytest.raises(ConfigError, match=r"^EDGEWISE_TEST__NET__TLS: net.port: must not be 80 with tls"):
        schema.load(None, env={"EDGEWISE_TEST__NET__TLS": "1"})


def test_flag_and_set_errors_name_the_flag(schema):
    with pytest.raises(ConfigError, match=r"^--set net.port: '0' is out of range"):
        schema.load(None, ["net.port=0"], {})
    with pytest.raises(ConfigError, match=r"^--set net.prot: unknown key \(did you mean 'net.port'\?\)"):
        schema.load(None, ["net.prot=1"], {})
    with pytest.raises(ConfigError, match=r"^--set 'net.port': expected KEY.PATH=VALUE"):
        schema.load(None, ["net.port"], {})
    with pytest.raises(ConfigError, match=r"^override tags: tags\[1\]: null is not allowed; allowed: a string$"):
        schema.load(None, {"tags": ["a", None]}, {})


def test_a_cross_field_error_names_the_latest_source_of_its_key(schema):
    with pytest.raises(ConfigError, match=r"^--set items.1.name: duplicate item name$"):
        schema.load(None, ["items.1.name=x"], {"EDGEWISE_TEST__ITEMS__0__NAME": "x"})


def test_secrets_never_appear(schema, yaml_file):
    r = schema.load(None, env={"EDGEWISE_TEST__NET__TOKEN": "s3cret"})
    assert r.net.token == "s3cret" and "s3cret" not in repr(r)
    with pytest.raises(ConfigError) as ei:
        schema.load(yaml_file("net:\n  token: [s3cret]\n"), env={})
    assert "s3cret" not in str(ei.value) and "net.token" in str(ei.value)
    # a key set below a secret: the value found instead of a mapping was quoted (found by a probe)
    for overrides, env in ((["net.token.x=1"], {}), ([], {"EDGEWISE_TEST__NET__TOKEN__X": "1"})):
        with pytest.raises(ConfigError) as ei:
            schema.load(yaml_file("net:\n  token: s3cret\n"), overrides, env)
        assert "s3cret" not in str(ei.value) and "expected a mapping, got ***" in str(ei.value)


def test_missing_and_empty_files(schema, tmp_path, yaml_file):
    with pytest.raises(ConfigError, match=r"nope.yaml: test settings file not found; check the path"):
        schema.load(tmp_path / "nope.yaml", env={})
    assert schema.load(yaml_file(""), env={}).name == "n"


def test_check_validates_objects_built_in_code():
    check(Net(port=443))
    with pytest.raises(ConfigError, match=r"^net.port: 0 is out of range; allowed: an integer in \[1, 65535\]$"):
        check(Net(port=0), "net")
    with pytest.raises(ConfigError, match=r"^mode: 'c' is not allowed; allowed: a \| b$"):
        check(Net(mode="c"))


def test_load_file_reads_a_typed_list(tmp_path):
    from typing import List

    p = tmp_path / "items.yaml"
    p.write_text("- {name: a, weight: 2}\n- {name: b}\n")
    assert load_file(List[Item], p, "items") == [Item("a", 2.0), Item("b")]
    p.write_text("- {name: a}\n- {nme: b}\n")
    with pytest.raises(ConfigError, match=r"items.yaml:2: \[1\].nme: unknown key \(did you mean 'name'\?\)"):
        load_file(List[Item], p, "items")


def test_a_text_field_takes_a_yaml_number_as_written(schema, yaml_file, tmp_path):
    # YAML reads 1.10 as 1.1 (and YAML 1.1 read 012 as octal 10): a token or name must not change on the way in
    r = schema.load(yaml_file("name: 1.10\nnet: {token: 012, port: 012}\n"), env={})
    assert (r.name, r.net.token, r.net.port) == ("1.10", "012", 12)  # a number field reads the number (YAML 1.2)
    from typing import List

    p = tmp_path / "items.yaml"
    p.write_text("- {name: 0x1F}\n- {name: 1e3}\n")
    assert [i.name for i in load_file(List[Item], p, "items")] == ["0x1F", "1e3"]
    p.write_text("- {name: on}\n")  # a YAML boolean in a text field stays an error: quote 'on'
    with pytest.raises(ConfigError, match="is not a string; YAML reads yes/no/on/off/true/false unquoted as a "
                                          "boolean: quote the value to mean the text"):
        load_file(List[Item], p, "items")


def test_numbers_read_as_yaml_1_2_so_a_file_and_the_environment_agree(schema, yaml_file):
    """PyYAML's YAML 1.1 read `port: 010` as 8 (octal) and `1:30` as 90 (base 60), while the same
    text in the environment or --set was 10 and refused (found by a probe). A file now reads
    numbers as YAML 1.2 does, as the text rules do."""
    for written, port in (("010", 10), ("0755", 755), ("08080", 8080), ("0x1f", 31), ("0o17", 15)):
        from_file = schema.load(yaml_file(f"net: {{port: {written}}}\n"), env={}).net.port
        assert from_file == port, written
        assert schema.load(None, env={"EDGEWISE_TEST__NET__PORT": written}).net.port == port
    with pytest.raises(ConfigError, match=r":1: net.port: '1:30' is not an integer"):
        schema.load(yaml_file("net: {port: 1:30}\n"), env={})
    assert schema.load(yaml_file("name: 010\n"), env={}).name == "010"  # text keeps what is written
    assert schema.load(yaml_file("net: {port: !!int 0b11}\n"), env={}).net.port == 3  # an explicit tag
    huge = "0x" + "f" * 4000  # past int()'s 4300 decimal digits, which hex is not held to
    with pytest.raises(ConfigError, match=r":1: net.port: an integer of 16000 bits is out of range"):
        schema.load(yaml_file(f"net: {{port: {huge}}}\n"), env={})


def test_a_number_past_any_float_is_a_range_error_with_its_line_not_a_traceback(schema, yaml_file):
    """A 400-digit integer raised OverflowError (int too large to convert to float) out of every
    settings loader, and the gateway's SIGHUP logged a traceback (found by a probe)."""
    huge = "1" + "0" * 400
    with pytest.raises(ConfigError, match=r":2: net.port: .* is out of range"):
        schema.load(yaml_file(f"net:\n  port: {huge}\n"), env={})
    with pytest.raises(ConfigError, match=r"ratio: .*a number of at most 1.8e308"):
        schema.load(yaml_file(f"ratio: {huge}\n"), env={})


def test_a_named_pipe_as_the_settings_file_is_refused_without_waiting(schema, tmp_path):
    """A FIFO at the settings path blocked the start (and a gateway's SIGHUP froze its event loop
    until SIGKILL; found by a probe). It is refused at once, as the policy file is."""
    import os

    fifo = tmp_path / "settings.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"settings.yaml: is a named pipe \(FIFO\), expected a test settings YAML file"):
        schema.load(str(fifo), env={})
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text .*save the test settings file as UTF-8"):
        schema.load(str(bad), env={})
