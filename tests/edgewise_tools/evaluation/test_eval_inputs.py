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
from edgewise_tools.options import check_option
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
            "--data", str(data), "--out", str(out), "--payloads", "full", "--samples", "40", "--threads", "1", *extra]


@pytest.mark.parametrize("flag, value, said", [
    ("--samples", "0", "--samples 0: must be >= 40"),
    ("--samples", "-5", "--samples -5: must be >= 40"),
    ("--samples", "-1000000", "--samples -1000000: must be >= 40"),
    # one sample made a zero-width "interval" and judged any positive draw a lead that is not noise
    ("--samples", "1", "--samples 1: must be >= 40 (bootstrap samples per interval: its ends are their 2.5th and "
                       "97.5th percentiles, which fewer than 40 cannot place)"),
    ("--samples", "39", "--samples 39: must be >= 40"),
    # 24 GB of draws asked for after the models had run: a traceback (found by a probe)
    ("--samples", "100000000", "--samples 100000000: must be <= 100000 (bootstrap samples per interval: their "
                               "draws take samples x streams numbers in memory"),
    ("--fps", "0", "--fps 0: must be > 0"),
    ("--fps", "-1", "--fps -1: must be > 0"),
    ("--fps", "nan", "--fps nan: must be > 0"),
    ("--carry-lag", "-1", "--carry-lag -1: must be >= 0 (frames after an escalation; 0 carries nothing)"),
    ("--target-rate", "5", "--target-rate 5: must be in (0, 1]"),
    ("--target-rate", "0", "--target-rate 0: must be in (0, 1]"),
    ("--target-uplink", "1.5", "--target-uplink 1.5: must be in [0, 1]"),
    ("--limit", "0", "--limit 0: must be >= 1"),
    ("--edge-imgsz", "-32", "--edge-imgsz '-32' is not a size; write 640 (square) or 384,640 (height, width), "
                            "or 0 for the model's own"),
    ("--cloud-imgsz", "640,", "--cloud-imgsz '640,' is not a size"),
    ("--limit", "-1", "--limit -1: must be >= 1"),
    ("--target-margin", "nan", "--target-margin nan: must be >= 0 (a share of cloud-only F1)"),
    ("--target-margin", "-0.1", "--target-margin -0.1: must be >= 0"),
    ("--rates", "0.3,0.5", "--rates 0.3,0.5: none is <= --target-rate 0.15, so the target (at most 15.0% of frames "
                           "escalated) cannot be judged; add 0.15 to --rates or raise --target-rate"),
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


def test_a_strided_set_is_not_replayed_as_streams(tiny_model, dataset, tmp_path, capsys) -> None:
    """A set that keeps one frame in k (training data) has gaps that motion, the tracker and the
    budget's timeline would take as consecutive frames: refused, naming the stride and the fix."""
    out = tmp_path / "out"
    data = _broken(dataset, tmp_path)
    meta = json.loads((dataset / "dataset.json").read_text())
    for stride in (3, "1", 1.5):
        (data / "dataset.json").write_text(json.dumps({**meta, "stride": stride}))
        assert main(_eval(tiny_model, data, out)) == 2
        err = capsys.readouterr().err
        assert f"--data {data}: its dataset.json says stride {stride!r}: it keeps one frame in" in err
        assert "edgewise synth --stride 1" in err
    assert not out.exists()


def test_a_stream_missing_a_frame_is_not_replayed_as_consecutive(tiny_model, dataset, tmp_path, capsys) -> None:
    """Without a dataset.json declaring the frames nothing said one was missing: a stream going
    from frame 0 to frame 2 was evaluated as if they were consecutive (found by a probe: a
    15-frame camera set without s001_f000003 ran through, motion, carrying and cooldown taking
    the jump for one frame). Refused like a strided set, naming the stream and the frame."""
    out = tmp_path / "out"
    data = _broken(dataset, tmp_path)
    (data / "dataset.json").unlink()
    for folder, ext in (("images", "jpg"), ("labels", "txt")):
        (data / folder / f"s000_f000001.{ext}").rename(data / folder / f"s000_f000002.{ext}")
    assert main(_eval(tiny_model, data, out)) == 2
    err = capsys.readouterr().err
    assert f"--data {data}: stream 0 goes from frame 0 to frame 2 (s000_f000001 missing in images/)" in err
    assert not out.exists()


def test_policy_overrides_no_frame_of_the_set_gets_are_warned_about(tiny_model, dataset, tmp_path, caplog) -> None:
    """The set's streams are replayed as s0, s1, ...: a policy's override for another stream id (a
    device's ``cam0: {mode: never}``) applied to no frame, silently (found by a probe: check-policy
    --data escalated 37.5% of a set under it, 18.8% with the override on s0). Warned about, as the
    daemon warns of streams and classes it lacks."""
    policy = tmp_path / "p.yaml"
    policy.write_text((ROOT / "examples" / "policy.yaml").read_text().replace(
        "  auditFraction: 0.0\n", "  auditFraction: 0.0\n  streams: {cam0: {mode: never}}\n"))
    args = _eval(tiny_model, dataset, tmp_path / "out", "--rates", "0.5", "--target-rate", "0.5")
    args[args.index("--policy") + 1] = str(policy)
    assert main(args) == 0
    assert f"--data {dataset} (its streams replayed as s0): policy {policy}: spec.streams cam0 are not streams" \
        in caplog.text


def test_a_strided_training_set_is_fitted_with_a_warning(tiny_model, dataset, tmp_path, caplog) -> None:
    """A strided training set (the older reference recipe's) is still fitted, with a warning: the
    refusal is for the evaluated set, whose figures it would change."""
    train = _broken(dataset, tmp_path)
    meta = json.loads((dataset / "dataset.json").read_text())
    (train / "dataset.json").write_text(json.dumps({**meta, "stride": 3, "seed": meta["seed"] + 1}))
    assert main(_eval(tiny_model, dataset, tmp_path / "out", "--train-data", str(train), "--rates", "0.5",
                      "--target-rate", "0.5")) == 0
    assert f"--train-data {train}: its dataset.json says stride 3" in caplog.text


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


def test_the_training_data_is_not_the_evaluated_set(tiny_model, dataset, tmp_path, capsys) -> None:
    """A learned policy fitted on the frames it is judged on: the same folder (under any name)
    or a copy of the same generated set (same preset, split and seed in dataset.json)."""
    out = tmp_path / "out"
    (tmp_path / "link").symlink_to(dataset)
    for same in (dataset, tmp_path / "link"):
        assert main(_eval(tiny_model, dataset, out, "--train-data", str(same))) == 2
        assert f"--train-data {same} is the --data folder {dataset}" in capsys.readouterr().err
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    assert main(_eval(tiny_model, dataset, out, "--train-data", str(copy))) == 2
    assert (f"--train-data {copy} and --data {dataset} are the same generated set (split test, seed 5 in both "
            "dataset.json)") in capsys.readouterr().err
    assert not out.exists()


def test_models_and_labels_of_other_classes_are_refused(tiny_model, renamed_model, dataset, tmp_path,
                                                        capsys) -> None:
    """Class ids that mean other objects to the two models, or to the labels: ConfigError
    naming both lists, before a model runs (a cloud F1 of 0 and '% of cloud F1' otherwise)."""
    animals = renamed_model(tiny_model, ["cat", "dog", "car", "bus", "cow", "pig", "owl", "ant", "bee", "elk"])
    args = _eval(tiny_model, dataset, tmp_path / "out")
    args[args.index("--cloud") + 1] = str(animals)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert ("the edge and cloud models have different classes: edge 10 ['0', '1', '2', '3', '4', '5', '6', '7', "
            "'8', '9'], cloud 10 ['cat', 'dog', 'car', 'bus', 'cow', 'pig', 'owl', 'ant', 'bee', 'elk']") in err
    data = _broken(dataset, tmp_path)
    meta = json.loads((data / "dataset.json").read_text())
    (data / "dataset.json").write_text(json.dumps(dict(meta, names=["cat", "dog"], nc=2)))
    assert main(_eval(tiny_model, data, tmp_path / "out")) == 2
    assert (f"{data / 'dataset.json'} names 2 classes ['cat', 'dog'] but the models have 10 ['0', '1'"
            in capsys.readouterr().err)
    # a set labelled with the models' first classes means the same ids
    (data / "dataset.json").write_text(json.dumps(dict(meta, names=["0", "1", "2", "3", "4", "5"], nc=6)))
    from edgewise.runtime import Detector
    from edgewise_tools.evaluation.frames import check_classes

    edge = Detector.from_file(tiny_model, threads=1)
    check_classes(edge, edge, data)
    assert not (tmp_path / "out").exists()


def test_the_models_input_sizes_reach_the_detectors(tiny_model, dataset, tmp_path, capsys) -> None:
    """--edge-imgsz / --cloud-imgsz are what a dynamic export without imgsz metadata needs (the
    warning names them); on this fixed 160 model another size is refused, naming it. They take
    height,width as model.imgsz and the worker's --imgsz do (they took a square size only)."""
    for flag, size, shown in (("--edge-imgsz", "96", "96x96"), ("--cloud-imgsz", "96,160", "96x160")):
        assert main(_eval(tiny_model, dataset, tmp_path / "out", flag, size)) == 2
        err = capsys.readouterr().err.splitlines()[-1]
        assert f"imgsz {shown} was asked for but the model's input is fixed at 160x160" in err, err
    assert main(_eval(tiny_model, dataset, tmp_path / "out", "--edge-imgsz", "160", "--cloud-imgsz", "160,160",
                      "--rates", "0.5", "--target-rate", "0.5")) == 0


def test_unreadable_label_files_and_a_set_without_objects(tiny_model, dataset, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    data = _broken(dataset, tmp_path)
    label = data / "labels" / "s000_f000001.txt"
    label.write_bytes(b"\xff\xfe\x00bad")
    assert main(_eval(tiny_model, data, out)) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the models' loading lines
    assert err.startswith(f"edgewise: error: {label}: not a text label file (not UTF-8: byte 0 is b'\\xff')")
    label.unlink()
    label.mkdir()
    assert main(_eval(tiny_model, data, out)) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"edgewise: error: {label}: a folder where the frame's label file should be")
    label.rmdir()
    for f in (data / "labels").iterdir():
        f.write_text("")
    assert main(_eval(tiny_model, data, out)) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"edgewise: error: no labelled objects in {data}: the 2 label files of the frames "
                          "evaluated (labels/s<stream>_f<frame>.txt) are all empty or missing")
    assert not out.exists()


def test_one_stream_judges_no_lead_end_to_end(tiny_model, dataset, tmp_path) -> None:
    out = tmp_path / "out"
    assert main(_eval(tiny_model, dataset, out, "--rates", "0.5", "--target-rate", "0.5")) == 0
    result = json.loads((out / "eval.json").read_text())
    assert result["streams"] == 1
    assert all(d["beats"] is None for rows in result["differences"].values() for d in rows)
    t = result["target"]
    assert t["margins_met"] is None and t["ours_beat_baselines"] is None
    assert t["margins_why"].startswith("not judged")
    md = (out / "eval.md").read_text()
    assert "(2 frames, 1 stream)" in md and "Only 1 stream:" in md and "**+" not in md and "CI above 0" not in md
    assert "NaN" not in (out / "eval.json").read_text()


@pytest.mark.parametrize("name, train", [("eval.json", False), ("eval.md", False), ("eval.png", False),
                                         ("gain-model.json", True)])
def test_a_report_file_that_cannot_be_written_is_refused_before_any_model_runs(tiny_model, dataset, tmp_path,
                                                                               capsys, name, train) -> None:
    """A folder where eval writes one of its files was found only once every model had run and
    every interval was drawn: a traceback (IsADirectoryError), and the work lost."""
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    extra = ("--train-data", str(tmp_path / "train")) if train else ()
    assert main(_eval(tiny_model, dataset, out, *extra)) == 2
    assert capsys.readouterr().err == (f"edgewise: error: --out {out}: {out / name} is a folder, where this command "
                                       f"writes its {name}; move it away or choose another folder\n")
    assert [p.name for p in out.iterdir()] == [name]


@pytest.mark.parametrize("value, said", [
    ("0.1,0.15,0.1", "--rates '0.1,0.15,0.1': 0.1 given twice (each rate is a column of the tables): give each once"),
    ("0.1,1.5", "--rates '0.1,1.5': each rate must be in (0, 1]"),
    ("a,b", "--rates 'a,b': comma-separated fractions like 0.05,0.1"),
])
def test_rates_are_distinct_fractions(value, said, capsys) -> None:
    """A rate given twice printed the same column twice in every table."""
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--edge", "e.onnx", "--cloud", "c.onnx", "--data", "d", "--rates", value])
    assert exc.value.code == 2
    assert f"error: argument --rates: {said}" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["--data", "--train-data"])
def test_a_folder_without_frames_is_refused_before_any_model_runs(tiny_model, dataset, tmp_path, capsys,
                                                                 monkeypatch, which) -> None:
    """A mistyped --train-data was found only after the evaluated set's models had all run (minutes
    on a real test split), and a mistyped --data only after both models had loaded."""
    from edgewise.runtime import Detector

    def loaded(*_a: object, **_k: object) -> None:
        raise AssertionError("a model was loaded before the folders were checked")

    monkeypatch.setattr(Detector, "from_file", loaded)
    missing = tmp_path / "tarin"
    data = missing if which == "--data" else dataset
    extra = ("--train-data", str(missing)) if which == "--train-data" else ()
    assert main(_eval(tiny_model, data, tmp_path / "out", *extra)) == 2
    assert capsys.readouterr().err == (f"edgewise: error: {missing}: does not exist (expected a dataset "
                                       "folder written by `edgewise synth`)\n")
