"""The boosted regression trees of the learned gain predictor, on functions with known shape."""

from __future__ import annotations

import numpy as np
import pytest

from edgewise.hardness.boosting import BoostedTrees


def test_fits_an_interaction_a_linear_model_cannot() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((2000, 3))
    y = ((x[:, 0] > 0.5) & (x[:, 1] > 0.5)).astype(float)  # AND: needs depth 2; feature 2 is noise
    model = BoostedTrees(rounds=40, learning_rate=0.3).fit(x, y)
    test = rng.random((500, 3))
    truth = (test[:, 0] > 0.5) & (test[:, 1] > 0.5)
    p = model.predict(test)
    assert np.mean((p > 0.5) == truth) > 0.95
    # a least-squares line on the same data ranks far worse than the trees
    z = np.hstack([np.ones((len(x), 1)), x])
    beta = np.linalg.lstsq(z, y, rcond=None)[0]
    lin = np.hstack([np.ones((len(test), 1)), test]) @ beta
    assert np.mean((p - truth) ** 2) < 0.5 * np.mean((lin - truth) ** 2)
    share = model.importance()
    assert share.sum() == pytest.approx(1.0) and share[2] < 0.05


def test_constant_target_and_min_leaf() -> None:
    x = np.arange(30, dtype=float).reshape(-1, 1)
    model = BoostedTrees(min_leaf=20).fit(x, np.full(30, 2.5))
    assert np.allclose(model.predict(x), 2.5)
    assert model.importance().tolist() == [0.0]  # 30 rows cannot make two leaves of 20


def test_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="need x"):
        BoostedTrees().fit(np.zeros((3, 2)), np.zeros(4))
