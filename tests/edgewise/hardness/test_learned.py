"""The learned hardness: fit, JSON round trip, validation of model files, use by a policy."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from edgewise.detections import Detections
from edgewise.errors import ConfigError
from edgewise.hardness.learned import FEATURE_NAMES, FRAME_FEATURES, GainModel, frame_features
from edgewise.policy import Escalator, PolicyHolder, load_policy
from edgewise.policy.explaining import explain

MISSED = FEATURE_NAMES.index("missed_object")
NAMES = ("a", "b")


def empty() -> Detections:
    return Detections(boxes=np.zeros((0, 4), np.float32), scores=np.zeros(0, np.float32),
                      class_ids=np.zeros(0, np.int32), names=NAMES)


@pytest.fixture(scope="module")
def model() -> GainModel:
    # the gain is high exactly where the edge saw a strong missed object
    rng = np.random.default_rng(0)
    x = rng.random((600, len(FRAME_FEATURES)))  # a per-frame model: no carry state
    gain = (x[:, MISSED] > 0.9).astype(float) * 5.0 + rng.normal(0, 0.1, 600)
    rows = np.hstack([x, np.zeros((600, len(FEATURE_NAMES) - len(FRAME_FEATURES)))])
    return GainModel.fit(rows, gain, {"trainData": "unit", "frames": 600, "merge": "fuse"})


def test_fit_ranks_the_gain_and_hardness_is_a_training_percentile(model) -> None:
    hard = frame_features({"missed_object": 0.95}, empty())
    easy = frame_features({"missed_object": 0.1}, empty())
    assert model.predict(np.array([hard]))[0] > model.predict(np.array([easy]))[0] + 0.5
    # 10% of training frames have missed_object > 0.9: they hold the top percentiles
    assert model.hardness({"missed_object": 0.95}, empty()) > 0.8
    assert model.hardness({"missed_object": 0.1}, empty()) < 0.8
    p = model.percentile(np.array([-1e9, 1e9]))
    assert p.tolist() == [0.0, 1.0]
    # the per-frame path (plain Python) agrees with the batch one
    x = np.random.default_rng(2).random((200, len(FEATURE_NAMES)))
    x[:50, MISSED] = model.trees.edges[MISSED][[3, 7, 11, 20, 29] * 10]  # exactly on bin edges
    assert [model.trees.predict_one(row) for row in x] == pytest.approx(model.predict(x).tolist(), abs=1e-12)
    sig = dict(zip(FEATURE_NAMES, x[0]))
    assert model.hardness(sig, empty()) == model.percentile(
        model.predict(np.array([frame_features(sig, empty())])))[0]
    assert max(model.importance(), key=model.importance().get) == "missed_object"


def test_json_round_trip(model, tmp_path) -> None:
    path = model.save(tmp_path / "gain-model.json")
    back = GainModel.load(path)
    x = np.random.default_rng(1).random((50, len(FEATURE_NAMES)))
    assert np.allclose(back.predict(x), model.predict(x))
    assert np.allclose(back.quantiles, model.quantiles)
    assert back.info["trainData"] == "unit" and back.source == str(path)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format="other/v9"), "format must be 'edgewise-gain-model/v1'"),
    (lambda d: d.update(features=["a"]), "fitted on features"),
    (lambda d: d["trees"].__setitem__(0, [99, 0, [0.0], [1.0]]), r"trees\[0\]: feature index 99"),
    (lambda d: d["trees"].__setitem__(0, [0, 0, [0.0]]), r"trees\[0\]: a node is"),
    (lambda d: d["trees"].__setitem__(0, [float("nan")]), r"trees\[0\] leaf must be a finite number"),
    (lambda d: d.update(quantiles=[1.0, 0.0]), "quantiles must be a non-decreasing"),
    (lambda d: d.update(trees=[]), "trees must be a non-empty list"),
    (lambda d: d["edges"].__setitem__(0, [2.0, 1.0]), r"edges\[0\] must be strictly increasing"),
    # an integer past any float: numpy's isfinite refused it with a TypeError, blamed on the policy (a probe)
    (lambda d: d["edges"].__setitem__(0, [10 ** 400]), r"edges\[0\] must be a finite number, got 1000"),
    # the same in the quantiles: math.isfinite raised OverflowError, which the policy loader reported as
    # "cannot read the policy: OverflowError" without naming the model file or the field (a probe)
    (lambda d: d.update(quantiles=[0.0, 10 ** 400]), "quantiles must be a non-decreasing list of at least 2 finite"),
])
def test_invalid_model_files_name_the_problem(model, tmp_path, edit, message) -> None:
    d = model.to_dict()
    edit(d)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=message) as exc:
        GainModel.load(path)
    assert str(path) in str(exc.value)


def test_not_json_and_missing_file(tmp_path) -> None:
    (tmp_path / "m.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not JSON"):
        GainModel.load(tmp_path / "m.json")
    with pytest.raises(ConfigError, match="run `edgewise eval --train-data`"):
        GainModel.load(tmp_path / "absent.json")
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)  # nesting beyond the parser's recursion
    with pytest.raises(ConfigError, match="deep.json: not JSON"):
        GainModel.load(tmp_path / "deep.json")
    (tmp_path / "digits.json").write_text('{"format": 1' + "0" * 5000 + "}")  # past int()'s digit limit
    with pytest.raises(ConfigError, match=r"digits.json: not JSON \(ValueError: Exceeds the limit"):
        GainModel.load(tmp_path / "digits.json")


POLICY = """apiVersion: edgewise/v1
kind: EscalationPolicy
metadata: {name: learned}
spec:
  threshold: 0.85
  signals: {learnedModel: %s}
  budget: {maxFraction: 1.0, windowFrames: 10, maxPerSecond: null}
  merge: {strategy: fuse}
"""


def test_policy_uses_the_learned_hardness(model, tmp_path) -> None:
    model.save(tmp_path / "models" / "gain-model.json")
    (tmp_path / "policy.yaml").write_text(POLICY % "models/gain-model.json")  # relative to the policy file
    p = load_policy(tmp_path / "policy.yaml")
    assert p.learned is not None
    esc = Escalator(p, clock=lambda: 0.0)
    hard = esc.decide("cam", 0, empty(), {"missed_object": 0.95}, now=0.0)
    easy = esc.decide("cam", 1, empty(), {"missed_object": 0.1}, now=1.0)
    assert hard.escalate and hard.reason == "hard" and hard.hardness > 0.85
    assert not easy.escalate and easy.reason == "below_threshold"
    text = explain(p)
    assert "percentile of the predicted F1 gain" in text and "600 training frames" in text
    assert "about 15% of traffic" in text


def test_policy_with_a_bad_model_is_refused_and_reload_keeps_the_old(model, tmp_path) -> None:
    path = tmp_path / "policy.yaml"
    with pytest.raises(ConfigError, match=r"spec.signals.learnedModel: .*gain model file not found"):
        path.write_text(POLICY % "absent.json")
        load_policy(path)
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match=r"spec.signals.learnedModel: .*folder: is a folder; .*JSON file"):
        path.write_text(POLICY % "folder")
        load_policy(path)
    model.save(tmp_path / "g.json")
    path.write_text(POLICY % "g.json")
    holder = PolicyHolder.from_file(path)
    (tmp_path / "broken.json").write_text("[]")
    path.write_text(POLICY % "broken.json")
    res = holder.reload(path)
    assert not res.ok and "broken.json" in (res.error or "") and holder.policy.learned is not None


def test_a_learned_model_that_is_a_device_a_pipe_or_too_big_is_refused_at_once(model, tmp_path) -> None:
    """/dev/zero passed a size check from stat (0 bytes) and was read until the kernel killed
    the process for memory; a named pipe blocked the reload. Both are refused, unread."""
    import os

    from edgewise.hardness.learned import MAX_MODEL_BYTES

    path = tmp_path / "policy.yaml"
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "big.json").write_bytes(b" " * (MAX_MODEL_BYTES + 10))
    for name, says in [("/dev/zero", "is a device, expected the gain model's JSON file"),
                       ("pipe.json", "is a named pipe (FIFO), expected the gain model's JSON file"),
                       ("big.json", f"{MAX_MODEL_BYTES + 10} bytes, over {MAX_MODEL_BYTES}; not a gain model")]:
        path.write_text(POLICY % name)
        with pytest.raises(ConfigError, match=r"spec.signals.learnedModel: .*" + re.escape(says)):
            load_policy(path)


def test_explain_warns_when_the_payload_differs_from_the_models(model, tmp_path) -> None:
    from edgewise.hardness.learned import GainModel as GM

    fitted = GM(model.trees, model.quantiles, dict(model.info, payload="regions"))
    fitted.save(tmp_path / "gain-model.json")
    (tmp_path / "policy.yaml").write_text(POLICY % "gain-model.json")
    text = explain(load_policy(tmp_path / "policy.yaml"))
    assert "fitted for payload.mode regions, this policy sends full" in text
    (tmp_path / "policy.yaml").write_text((POLICY % "gain-model.json") + "  payload: {mode: regions}\n")
    assert "payload.mode" not in explain(load_policy(tmp_path / "policy.yaml"))
