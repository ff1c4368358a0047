"""The same value gives the same result in every process (edge, gateway, worker, autoscaler).

One table of values, each fed to a real field of every process through its own loader
entry point (``load_settings``) from three sources: the YAML file, an environment
variable, ``--set``. Every process must return the same value, or refuse with the same
problem, naming the same kind of source: ``file:line``, the variable, the flag. The
named ``--metrics-port`` flag, which all four have, goes through each real command line.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import pytest

from edgewise.cli import build_parser
from edgewise.errors import ConfigError
from edgewise.settings import settings_from_args


@dataclass(frozen=True)
class Process:
    module: str
    argv: Tuple[str, ...]
    base: str  # the smallest valid file (a different key from the fields below)
    fields: Dict[str, Optional[str]]  # kind -> a real key of that kind (None: the process has none)


PROCESSES = {
    "edge": Process("edge.settings", ("edge", "run"), "streams: [{id: s, kind: synthetic}]\n",
                    {"bool": "sinks.stdout", "int": "model.max_det", "float": "spool.replay_interval_s", "str": "device_id"}),
    "gateway": Process("cloud.gateway.settings", ("cloud", "gateway"), "discovery: {static: ['a:1']}\n",
                       {"bool": "retry.enabled", "int": "limits.max_id_length", "float": "limits.rate_per_device",
                        "str": "mqtt.client_id"}),
    "worker": Process("cloud.worker.settings", ("cloud", "worker"), "model: m.onnx\n",
                      {"bool": None, "int": "max_det", "float": "grace_s", "str": "worker_id"}),
    "autoscaler": Process("cloud.autoscaler.settings", ("cloud", "autoscaler"), "gateway_urls: [http://g:1]\n",
                          {"bool": "dry_run", "int": "max_replicas", "float": "gateway_timeout_s", "str": "metrics_host"}),
}

#: Expected outcome: the value, or "!problem" (the message after its source and key path, up to
#: "; allowed:", which names each field's own range).
Outcome = Union[Any, str]

#: (kind, value in YAML, outcome from YAML, value as text, outcome from text). Text is what an
#: environment variable or --set carries; None: no such text case.
TABLE: List[Tuple[str, str, Outcome, Optional[str], Outcome]] = [
    ("bool", "yes", True, "yes", True),
    ("bool", "'off'", False, "OFF", False),
    ("bool", "1", True, "1", True),
    ("bool", "maybe", "!'maybe' is not a boolean", "maybe", "!'maybe' is not a boolean"),
    ("bool", "null", "!null is not allowed", None, None),
    ("int", "3.0", 3, "3.0", 3),
    ("int", "'3'", 3, "3", 3),
    ("int", "3.5", "!3.5 is not an integer", "3.5", "!'3.5' is not an integer"),
    ("int", "true", "!true is not an integer", "true", "!'true' is not an integer"),
    ("int", "0", "!0 is out of range", "0", "!'0' is out of range"),
    ("int", "null", "!null is not allowed", None, None),
    ("float", "5", 5.0, "5", 5.0),
    ("float", "'0.5'", 0.5, "0.5", 0.5),
    ("float", "1e-3", 0.001, "1e-3", 0.001),
    ("float", "-1", "!-1 is out of range", "-1", "!'-1' is out of range"),
    ("float", "fast", "!'fast' is not a number", "fast", "!'fast' is not a number"),
    ("str", "5", "5", "5", "5"),
    ("str", "edge-7", "edge-7", "edge-7", "edge-7"),
    ("str", "yes", "!true is not a string; YAML reads yes/no/on/off/true/false unquoted as a boolean: quote the "
                   "value to mean the text", "yes", "yes"),
    ("str", "[a]", "!expected a single value, got a list", None, None),
    ("str", "null", "!null is not allowed", None, None),
]

CASES = [(name, row) for name in PROCESSES for row in TABLE if PROCESSES[name].fields[row[0]]]


def _module(name: str) -> Any:
    return importlib.import_module(PROCESSES[name].module)


def _file(tmp_path: Path, name: str, key: str, yaml_value: str) -> Tuple[Path, int]:
    """A settings file setting ``key`` (first lines) plus the process's base; and the key's line."""
    *sections, leaf = key.split(".")
    lines = [f"{'  ' * i}{s}:" for i, s in enumerate(sections)] + [f"{'  ' * len(sections)}{leaf}: {yaml_value}"]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n" + PROCESSES[name].base)
    return path, len(lines)


def _outcome(load: Any) -> Tuple[str, Any]:
    try:
        settings = load()
    except ConfigError as exc:
        return "error", str(exc)
    return "ok", settings


def _check(kind: str, got: Tuple[str, Any], key: str, source: str, expected: Outcome) -> None:
    status, value = got
    if isinstance(expected, str) and expected.startswith("!"):
        assert status == "error", f"{source}: expected a refusal, got {value!r}"
        assert value.startswith(source), value
        rest = value[len(source):]
        assert rest.split("; allowed:")[0] == expected[1:], value
        return
    assert status == "ok", value
    for part in key.split("."):
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected), (source, value)


@pytest.mark.parametrize("name, row", CASES, ids=[f"{n}-{r[0]}-{r[1]}" for n, r in CASES])
def test_yaml_value_gives_the_same_result_in_every_process(tmp_path: Path, name: str, row: Any) -> None:
    kind, yaml_value, expected, _text, _ = row
    key = PROCESSES[name].fields[kind]
    path, line = _file(tmp_path, name, key, yaml_value)
    got = _outcome(lambda: _module(name).load_settings(path, (), {}))
    _check(kind, got, key, f"{path}:{line}: {key}: ", expected)


@pytest.mark.parametrize("name, row", [c for c in CASES if c[1][3] is not None],
                         ids=[f"{n}-{r[0]}-{r[3]}" for n, r in CASES if r[3] is not None])
def test_text_value_gives_the_same_result_from_environment_and_set(tmp_path: Path, name: str, row: Any) -> None:
    kind, _yaml, _, text, expected = row
    key = PROCESSES[name].fields[kind]
    mod = _module(name)
    base = tmp_path / "base.yaml"
    base.write_text(PROCESSES[name].base)
    env = mod.SCHEMA.env_name(key)
    _check(kind, _outcome(lambda: mod.load_settings(base, (), {env: text})), key, f"{env}: ", expected)
    _check(kind, _outcome(lambda: mod.load_settings(base, [f"{key}={text}"], {})), key, f"--set {key}: ", expected)


@pytest.mark.parametrize("name", PROCESSES)
def test_a_misspelled_key_is_refused_alike_everywhere(tmp_path: Path, name: str) -> None:
    key = PROCESSES[name].fields["int"]
    assert key is not None
    *sections, leaf = key.split(".")
    typo = ".".join([*sections, leaf + "s"])
    mod = _module(name)
    path, line = _file(tmp_path, name, typo, "3")
    status, msg = _outcome(lambda: mod.load_settings(path, (), {}))
    assert status == "error" and msg.startswith(f"{path}:{line}: {typo}: unknown key (did you mean '{leaf}'?); ")
    base = tmp_path / "base.yaml"
    base.write_text(PROCESSES[name].base)
    env = mod.SCHEMA.env_name(typo)
    status, msg = _outcome(lambda: mod.load_settings(base, (), {env: "3"}))
    assert status == "error" and msg.startswith(f"{env}: unknown key (did you mean {mod.SCHEMA.env_name(key)}?); ")
    status, msg = _outcome(lambda: mod.load_settings(base, [f"{typo}=3"], {}))
    assert status == "error" and msg.startswith(f"--set {typo}: unknown key (did you mean '{key}'?); ")
    old = mod.SCHEMA.env_prefix[:-1] + key.upper().replace(".", "__")  # one "_" after the process: old spelling
    status, msg = _outcome(lambda: mod.load_settings(base, (), {old: "3"}))
    assert status == "error" and msg.startswith(f"{old}: not a settings variable; ")


@pytest.mark.parametrize("name", PROCESSES)
def test_a_misspelled_process_word_is_refused_and_the_other_processes_variables_ignored(
        tmp_path: Path, name: str) -> None:
    """``EDGEWISE_GATWAY__METRICS_PORT=19302`` was ignored without a word: the gateway served its
    metrics on the file's port. Variables of the other processes (a shared environment) stay ignored."""
    mod = _module(name)
    key = PROCESSES[name].fields["int"]
    assert key is not None
    base = tmp_path / "base.yaml"
    base.write_text(PROCESSES[name].base)
    env = mod.SCHEMA.env_name(key)
    word = mod.SCHEMA.process.upper()
    for typo in (word[:-1], word[:1] + word[2:], word + "S"):  # a letter left out, one more
        wrong = env.replace(f"EDGEWISE_{word}__", f"EDGEWISE_{typo}__", 1)
        status, msg = _outcome(lambda: mod.load_settings(base, (), {wrong: "3"}))
        assert status == "error" and msg.startswith(f"{wrong}: not a settings variable; "), msg
        assert msg.endswith(f"(did you mean {env}?)"), msg
    others = {_module(o).SCHEMA.env_name(PROCESSES[o].fields["int"] or "metrics_port"): "3"
              for o in PROCESSES if o != name}
    status, _settings = _outcome(lambda: mod.load_settings(base, (), others))
    assert status == "ok", _settings


@pytest.mark.parametrize("name", PROCESSES)
@pytest.mark.parametrize("text, expected", [("9200", 9200), ("9200.0", 9200),
                                            ("abc", "!'abc' is not an integer"),
                                            ("70000", "!'70000' is out of range")])
def test_the_metrics_port_flag_reads_alike_in_every_command(tmp_path: Path, name: str, text: str,
                                                            expected: Outcome) -> None:
    proc = PROCESSES[name]
    base = tmp_path / "base.yaml"
    base.write_text(proc.base)
    args = build_parser().parse_args([*proc.argv, "--config", str(base), "--metrics-port", text])
    schema = _module(name).SCHEMA
    key = next(f.path for f in schema.flags if f.name == "--metrics-port")
    _check("int", _outcome(lambda: settings_from_args(args, schema, env={})), key, "--metrics-port: ", expected)


#: A rule between two keys of each process, broken by the second key alone, given by a flag or variable
#: over the process's base file (which sets neither): (extra argv, env, the message's start).
PAIR_RULES = {
    "edge": ((), {"EDGEWISE_EDGE__CLOUD__TLS_KEY": "/k.pem"},
             "EDGEWISE_EDGE__CLOUD__TLS_KEY: cloud.tls_cert: tls_cert and tls_key must be given together"),
    "gateway": (("--listen", "0.0.0.0:9100"), {}, "--listen: metrics_port: 9100 is also the port of listen"),
    "worker": (("--port", "9101"), {}, "--port: metrics_port: 9101 is also the gRPC port"),
    "autoscaler": (("--min", "16"), {}, "--min: max_replicas: need min_replicas <= max_replicas"),
}


@pytest.mark.parametrize("name", PROCESSES)
def test_a_rule_between_keys_names_the_flag_or_variable_that_broke_it(tmp_path: Path, name: str) -> None:
    """``edgewise cloud autoscaler --config a.yaml --min 16`` said ``a.yaml: max_replicas: need
    min_replicas <= max_replicas``: the file, which sets neither, not the flag just typed."""
    proc = PROCESSES[name]
    extra, env, start = PAIR_RULES[name]
    base = tmp_path / "base.yaml"
    base.write_text(proc.base)
    args = build_parser().parse_args([*proc.argv, "--config", str(base), *extra])
    status, msg = _outcome(lambda: settings_from_args(args, _module(name).SCHEMA, env=env))
    assert status == "error" and msg.startswith(start), msg


def test_every_process_has_the_same_command_line_conventions() -> None:
    parser = build_parser()
    for proc in PROCESSES.values():
        args = parser.parse_args([*proc.argv, "-c", "x.yaml", "--set", "a=b", "--set", "c=d"])
        assert args.config == "x.yaml" and args.settings_set == ["a=b", "c=d"]
        mod = importlib.import_module(proc.module)
        assert mod.SCHEMA.env_prefix == f"EDGEWISE_{mod.SCHEMA.process.upper()}__"
