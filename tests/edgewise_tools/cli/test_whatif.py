"""``edgewise edge check-policy --data DIR``: a policy's and an alternative's accuracy on labelled
frames through ``edgewise eval``'s machinery, on real models and a real generated set; the models'
outputs are cached, so a second policy is tried without running them again."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any, Dict, List

import pytest

from edgewise.cli import main
from edgewise_tools.cli import whatif

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    from edgewise.synth import PRESETS, SynthJob, generate

    root = tmp_path_factory.mktemp("whatifdata")
    generate(SynthJob(out=root / "test", frames=6, streams=2, seed=7, split="test", width=160, height=120,
                      difficulty=PRESETS["medium"]))
    return root / "test"


def test_accuracy_of_the_policy_and_the_alternative(labelled, tiny_model, small_model, tmp_path, capsys) -> None:
    strict = tmp_path / "strict.yaml"
    strict.write_text((ROOT / "examples" / "policy.yaml").read_text().replace("threshold: 0.5", "threshold: 1.0", 1))
    cache = tmp_path / "cache"
    args = ["edge", "check-policy", str(strict), "--against", str(ROOT / "examples" / "policy.yaml"),
            "--data", str(labelled), "--edge", str(tiny_model), "--cloud", str(small_model),
            "--threads", "1", "--cache", str(cache)]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in doc["accuracy"]["rows"]}
    assert list(rows) == ["edge only", str(strict), str(ROOT / "examples" / "policy.yaml"), "cloud only"]
    assert doc["accuracy"]["frames"] == 12 and rows["edge only"]["escalated"] == 0.0
    assert rows["cloud only"]["escalated"] == 1.0
    assert rows[str(strict)]["escalated"] <= rows[str(ROOT / "examples" / "policy.yaml")]["escalated"]
    assert all(0.0 <= r["f1"] <= 1.0 for r in rows.values())
    assert len(list(cache.glob("*.pkl"))) == 1
    # the second run reads the models' outputs from the cache: the same figures
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == doc["accuracy"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "Accuracy on" in text and "12 labelled frames" in text and "F1" in text
    assert len(list(cache.glob("*.pkl"))) == 1


def test_data_needs_both_models(labelled, tiny_model, capsys) -> None:
    rc = main(["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(labelled),
               "--edge", str(tiny_model)])
    assert rc == 2 and "--data needs --cloud MODEL" in capsys.readouterr().err


def test_what_the_collection_depends_on() -> None:
    """Another threshold, weights or budget replays the cached frames; another payload,
    band or carrying needs the models again (its regions and carried boxes differ)."""
    from edgewise.policy import load_policy
    from edgewise_tools.cli.whatif import collection, modes

    policy = load_policy(ROOT / "examples" / "policy.yaml")
    text = (ROOT / "examples" / "policy.yaml").read_text()
    assert modes(policy) == ("full", "regions")
    assert "mode: regions" in text and "threshold: 0.5" in text and "motion_blobs: 0.8" in text

    def variant(old: str, new: str):
        from edgewise.policy import parse_policy

        return collection(parse_policy(text.replace(old, new, 1), "variant.yaml"))

    same = collection(policy)
    assert variant("threshold: 0.5", "threshold: 0.9") == same
    assert variant("motion_blobs: 0.8", "motion_blobs: 0.2") == same
    assert variant("maxFraction: 0.1", "maxFraction: 0.3") == same
    assert variant("mode: regions", "mode: full") != same
    assert variant("band: {low: 0.25, high: 0.6}", "band: {low: 0.2, high: 0.6}") != same
    assert variant("carryFrames: 30", "carryFrames: 10") != same


@pytest.mark.parametrize("flag, value, said", [
    ("--limit", "-1", "--limit -1: must be >= 1"),  # was: every frame but the last
    ("--limit", "0", "--limit 0: must be >= 1"),
    ("--fps", "0", "--fps 0: must be > 0"),
])
def test_limit_and_fps_are_checked_as_eval_checks_them(labelled, tiny_model, tmp_path, capsys, flag, value,
                                                        said) -> None:
    rc = main(["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(labelled),
               "--edge", str(tiny_model), "--cloud", str(tiny_model), "--cache", str(tmp_path / "cache"), flag, value])
    assert rc == 2 and capsys.readouterr().err.startswith(f"edgewise: error: {said}")
    assert not (tmp_path / "cache").exists()


def test_models_of_other_classes_and_a_set_without_objects_are_refused(labelled, tiny_model, renamed_model,
                                                                      tmp_path, capsys) -> None:
    """``check-policy --data`` collects through ``evaluation.frames.collect`` as ``eval`` does,
    so it refuses what eval refuses: a cloud model of other classes, a set with no labelled object."""
    import shutil

    letters = renamed_model(tiny_model, list("abcdefghij"))
    args = ["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--edge", str(tiny_model),
            "--threads", "1", "--cache", str(tmp_path / "cache")]
    assert main([*args, "--data", str(labelled), "--cloud", str(letters)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "the edge and cloud models have different classes: edge 10 ['0', '1'" in err
    assert "cloud 10 ['a', 'b', 'c'" in err
    empty = tmp_path / "empty"
    shutil.copytree(labelled, empty)
    for f in (empty / "labels").iterdir():
        f.write_text("\n")
    assert main([*args, "--data", str(empty), "--cloud", str(tiny_model)]) == 2
    assert f"edgewise: error: no labelled objects in {empty}: the 12 label files" in capsys.readouterr().err
    assert not list((tmp_path / "cache").glob("*.pkl"))


def test_a_damaged_cache_runs_the_models_again_never_a_crash_or_other_figures(labelled, tiny_model, small_model,
                                                                             tmp_path, capsys) -> None:
    """A cache file with a changed byte (a disk error, a crash while the disk wrote it) crashed
    check-policy with whatever unpickling raised, or was read as other figures without a word."""
    cache = tmp_path / "cache"
    args = ["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(labelled),
            "--edge", str(tiny_model), "--cloud", str(small_model), "--threads", "1", "--cache", str(cache), "--json"]

    def figures() -> List[Dict[str, Any]]:  # the cloud's time per escalation is measured again: not compared
        rows = json.loads(capsys.readouterr().out)["accuracy"]["rows"]
        return [{k: v for k, v in r.items() if k != "cloud_ms_per_escalation"} for r in rows]

    assert main(args) == 0
    want = figures()
    (path,) = cache.glob("*.pkl")
    good = path.read_bytes()
    for k in range(1, 24):
        damaged = bytearray(good)
        damaged[len(good) * k // 24] ^= 0x5A
        path.write_bytes(bytes(damaged))
        assert main(args) == 0, k
        assert figures() == want, k
        assert path.read_bytes() != damaged, k  # the models ran again and wrote the cache again


class _Planted:
    """A pickle that leaves a mark when it is loaded: what another user could plant."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self):
        return (Path.touch, (self.mark,))


def test_a_cache_file_another_user_could_have_written_is_never_unpickled(labelled, tiny_model, small_model,
                                                                          tmp_path, capsys, caplog) -> None:
    """Unpickling runs code, and a checksum proves nothing against someone who can write the
    file: a cache file of another user's, one others may write, or a link, is not read (the
    models run again and the figures are the same); check-policy's own file is mode 0600."""
    cache = tmp_path / "cache"
    args = ["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(labelled),
            "--edge", str(tiny_model), "--cloud", str(small_model), "--threads", "1", "--cache", str(cache), "--json"]
    old = os.umask(0o002)  # a umask that lets the group write
    try:
        assert main(args) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    (path,) = cache.glob("*.pkl")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    mark = tmp_path / "planted-code-ran"
    body = pickle.dumps(_Planted(mark))
    planted = whatif.CACHE_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body

    def plant(how: str) -> None:
        path.unlink()
        if how == "link":
            (tmp_path / "elsewhere.pkl").write_bytes(planted)
            path.symlink_to(tmp_path / "elsewhere.pkl")
            return
        path.write_bytes(planted)
        if how == "others may write":
            path.chmod(0o666)
        elif how == "another user's":
            os.chown(path, 65534, 65534)

    hows = ["others may write", "link"] + (["another user's"] if os.geteuid() == 0 else [])
    for how in hows:
        plant(how)
        caplog.clear()
        assert main(args) == 0, how
        assert not mark.exists(), how
        assert json.loads(capsys.readouterr().out)["accuracy"]["rows"], how
        assert "not read (a cache is unpickled, which runs code)" in caplog.text or \
            "cannot be read" in caplog.text, (how, caplog.text)
    path.unlink()
    path.write_bytes(planted)  # the same file as this user's own, mode 0644: read, as any cache is
    path.chmod(0o644)
    assert main(args) == 0 and mark.exists()


def test_a_strided_set_is_refused_before_a_model_runs(labelled, tiny_model, tmp_path, capsys) -> None:
    """check-policy replays the set as streams, as eval does: a strided one is refused by the same
    rule (``evaluation.frames.stride_problem``), before any model runs or anything is cached."""
    import shutil

    strided = tmp_path / "strided"
    shutil.copytree(labelled, strided)
    meta = json.loads((strided / "dataset.json").read_text())
    (strided / "dataset.json").write_text(json.dumps({**meta, "stride": 2}))
    assert main(["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(strided),
                 "--edge", str(tiny_model), "--cloud", str(tiny_model), "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert f"--data {strided}: its dataset.json says stride 2" in err and "edgewise synth --stride 1" in err
    assert not (tmp_path / "cache").exists()


def test_a_cache_file_of_other_inputs_is_not_read(labelled, tiny_model, small_model, tmp_path, capsys,
                                                  caplog) -> None:
    """The key of the inputs (models, data, what of the policy the collection depends on) is in
    the file, not only in its name: a valid cache file copied or renamed under another key's name
    is not read as the outputs of these inputs."""
    cache = tmp_path / "cache"
    base = ["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(labelled),
            "--edge", str(tiny_model), "--threads", "1", "--cache", str(cache), "--json"]
    assert main([*base, "--cloud", str(small_model)]) == 0
    (small,) = cache.glob("*.pkl")
    assert main([*base, "--cloud", str(tiny_model)]) == 0
    capsys.readouterr()
    (tiny,) = [p for p in cache.glob("*.pkl") if p != small]
    tiny.write_bytes(small.read_bytes())  # the small cloud model's outputs under the tiny one's name
    caplog.clear()
    assert main([*base, "--cloud", str(tiny_model)]) == 0
    assert "holds the models' outputs of other inputs" in caplog.text
    assert tiny.read_bytes() != small.read_bytes()  # the models ran again and wrote their own


def test_a_data_folder_without_frames_is_refused_before_the_models_load(tiny_model, tmp_path, capsys,
                                                                       monkeypatch) -> None:
    from edgewise.runtime import Detector

    def loaded(*_a: object, **_k: object) -> None:
        raise AssertionError("a model was loaded before --data was checked")

    monkeypatch.setattr(Detector, "from_file", loaded)
    missing = tmp_path / "nope"
    rc = main(["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(missing),
               "--edge", str(tiny_model), "--cloud", str(tiny_model), "--cache", str(tmp_path / "cache")])
    assert rc == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"edgewise: error: {missing}: does not exist (expected "
                                                         "a dataset folder written by `edgewise synth`)")


@pytest.mark.parametrize("extra, named", [
    (["--edge", "edge.onnx", "--cloud", "cloud.onnx"], "--edge, --cloud set"),  # --data forgotten: ignored in silence
    (["--fps", "5"], "--fps sets"),
    (["--limit", "3", "--cache", "c"], "--limit, --cache set"),
])
def test_accuracy_options_without_data_are_refused(capsys, extra: List[str], named: str) -> None:
    assert main(["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"edgewise: error: {named} how the accuracy on labelled frames is measured: give --data DIR")
    assert err.count("\n") == 1


def test_class_overrides_the_edge_model_lacks_are_warned_about(labelled, tiny_model, small_model, tmp_path,
                                                               caplog) -> None:
    """``check-policy --data`` warned of overrides for streams the set lacks, not of classes the edge
    model lacks (it had no class names there): a ``classes: {person: ...}`` override against a digits
    model changed no decision, silently. Warned about as the daemon and ``eval`` warn, also when the
    models' outputs come from the cache."""
    policy = tmp_path / "p.yaml"
    policy.write_text((ROOT / "examples" / "policy.yaml").read_text().replace(
        "  auditFraction: 0.0\n", "  auditFraction: 0.0\n  classes: {person: {threshold: 0.1}}\n"))
    args = ["edge", "check-policy", str(policy), "--data", str(labelled), "--edge", str(tiny_model),
            "--cloud", str(small_model), "--threads", "1", "--cache", str(tmp_path / "cache")]
    for _ in range(2):  # models run, then the cache
        caplog.clear()
        assert main(args) == 0
        assert "spec.classes person" in caplog.text and str(tiny_model) in caplog.text, caplog.text


@pytest.mark.parametrize("under", [False, True])
def test_a_cache_named_that_cannot_be_a_folder_is_refused_before_a_model_runs(labelled, tiny_model, tmp_path, capsys,
                                                                             under) -> None:
    """`--cache FILE` ran both models over the set (minutes) and then only warned that nothing
    could be cached; a named cache is now checked first, as every output folder is."""
    plain = tmp_path / "cache.txt"
    plain.write_text("not a folder")
    cache, said = ((plain / "sub", f"--cache {plain / 'sub'}: {plain} is a file, not a folder") if under else
                   (plain, f"--cache {plain}: is a file; give a folder"))
    assert main(["edge", "check-policy", str(ROOT / "examples" / "policy.yaml"), "--data", str(labelled),
                 "--edge", str(tiny_model), "--cloud", str(tiny_model), "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "cannot cache" not in err  # refused before the models ran, not warned after
