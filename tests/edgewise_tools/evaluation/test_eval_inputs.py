"""What `edgewise eval` refuses before it runs a model, as one line and exit status 2: numeric
options out of range (one rule per option, :func:`edgewise_tools.cli.eval.check_option`, shared
with ``check-policy --data``) and a malformed dataset (dataset.json, labels, labels/, images/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import List

import pytest

from edgewise.cli import main
from edgewise.errors import ConfigError, InvalidInputError
from edgewise_tools.cli.eval import check_option
from edgewise_tools.provenance import dataset_id, dataset_meta

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from edgewise.synth import PRESETS, SynthJob, generate

    root = tmp_path_factory.mktemp("evalinputs") / "test"
    generate(SynthJob(out=root, frames=2, streams=1, seed=5, split="test", width=96, height=64,
                      difficulty=PRESETS["easy"]))
    return root


def _eval(model: Path, data: Path, out: Path, *extra: str) -> List[str]:
    return ["eval", "--edge", str(model), "--cloud", str(model), "--policy", str(ROOT / "examples" / "policy.yaml"),
            "--data", str(data), "--out", str(out), "--payloads", "full", "--samples", "10", "--threads", "1", *extra]


@pytest.mark.parametrize("flag, value, said", [
    ("--samples", "0", "--samples 0: must be >= 1"),
    ("--samples", "-5", "--samples -5: must be >= 1"),
    ("--samples", "-1000000", "--samples -1000000: must be >= 1"),
    ("--fps", "0", "--fps 0: must be > 0"),
    ("--fps", "-1", "--fps -1: must be > 0"),
    ("--fps", "nan", "--fps nan: must be > 0"),
    ("--carry-lag", "-1", "--carry-lag -1: must be >= 0 (frames after an escalation; 0 carries nothing)"),
    ("--target-rate", "5", "--target-rate 5: must be in (0, 1]"),
    ("--target-rate", "0", "--target-rate 0: must be in (0, 1]"),
    ("--target-uplink", "1.5", "--target-uplink 1.5: must be in [0, 1]"),
    ("--limit", "0", "--limit 0: must be >= 1"),
    ("--limit", "-1", "--limit -1: must be >= 1"),
])
def test_options_out_of_range_are_one_line_naming_the_flag(tiny_model, dataset, tmp_path, capsys, flag, value,
                                                           said) -> None:
    assert main(_eval(tiny_model, dataset, tmp_path / "out", flag, value)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edgewise: error: {said}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_check_option_rules() -> None:
    check_option("--limit", None, ">= 1")  # not given
    check_option("--carry-lag", 0, ">= 0")
    check_option("--target-rate", 1.0, "in (0, 1]")
    with pytest.raises(ConfigError, match=r"^--fps inf: must be > 0$"):
        check_option("--fps", float("inf"), "> 0")


def _broken(dataset: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    return data


def test_a_malformed_dataset_is_refused_with_where_and_what(tiny_model, dataset, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    data = _broken(dataset, tmp_path)
    (data / "dataset.json").write_text("{not json")
    assert main(_eval(tiny_model, data, out)) == 2
    assert f"edgewise: error: {data / 'dataset.json'}: not valid JSON" in capsys.readouterr().err
    shutil.copy(dataset / "dataset.json", data / "dataset.json")
    label = data / "labels" / "s000_f000001.txt"
    n = len(label.read_text().splitlines()) + 1
    for line, said in (("a 0.5 0.5 0.1 0.1", "class 'a' is not a number"),
                       ("42 0.5 0.5 2.0 -1", "class 42 is not one of the 10 classes (0..9)"),
                       ("3 0.5 0.5 2.0 -1", "w 2.0 is not a normalised size")):
        label.write_text((dataset / "labels" / label.name).read_text() + line + "\n")
        assert main(_eval(tiny_model, data, out)) == 2
        assert f"edgewise: error: {label}:{n}: {said}" in capsys.readouterr().err
    shutil.rmtree(data / "labels")
    assert main(_eval(tiny_model, data, out)) == 2
    assert f"edgewise: error: {data}: no labels/ folder" in capsys.readouterr().err
    shutil.copytree(dataset / "labels", data / "labels")
    (data / "images" / "s000_f000001.jpg").unlink()
    assert main(_eval(tiny_model, data, out)) == 2
    err = capsys.readouterr().err
    assert "holds 1 frames but" in err and "declares 1 stream(s) x 2 frame(s) = 2: 1 missing (s000_f000001)" in err
    assert not out.exists()


def test_dataset_json_in_the_provenance(tmp_path) -> None:
    assert dataset_meta(tmp_path) == {} and dataset_id(tmp_path) == {"path": str(tmp_path)}
    (tmp_path / "dataset.json").write_text(json.dumps({"split": "test", "streams": 2, "other": 1}))
    assert dataset_id(tmp_path) == {"path": str(tmp_path), "split": "test", "streams": 2}
    (tmp_path / "dataset.json").write_text("[1, 2]")
    with pytest.raises(InvalidInputError, match="dataset.json: must be a JSON object"):
        dataset_id(tmp_path)
    (tmp_path / "dataset.json").write_bytes(b"\xff\xfe")
    with pytest.raises(InvalidInputError, match="dataset.json: not valid JSON"):
        dataset_id(tmp_path)
