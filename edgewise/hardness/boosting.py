"""Small gradient-boosted regression trees (numpy only) for the learned escalation policy.

Least-squares boosting (Friedman 2001) of shallow trees on quantile-binned features,
the histogram method of LightGBM / scikit-learn's ``HistGradientBoostingRegressor``
at toy scale: every feature is cut into at most ``bins`` quantile bins once, and each
split is the best bin boundary by the variance reduction of the residuals. A few
thousand frames and a dozen features fit in well under a second; no extra dependency.
The fitted trees serialise to plain JSON (:meth:`BoostedTrees.to_dict`) for the edge daemon.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple, Union

import numpy as np

from edgewise.errors import ConfigError

#: a tree node: a leaf ``(value,)`` or a split ``(feature, bin, left, right)``; rows whose
#: feature falls in bins ``<= bin`` go left
Node = Union[Tuple[float], Tuple[int, int, "Node", "Node"]]
#: deepest tree a model file may hold
MAX_DEPTH = 8


@dataclass
class BoostedTrees:
    """Boosted regression trees; fit with :meth:`fit`, score with :meth:`predict`.

    Attributes:
        rounds: number of trees.
        learning_rate: shrinkage of each tree's contribution.
        depth: depth of each tree (2: each tree can model one interaction).
        min_leaf: fewest training rows in a leaf (keeps leaves from fitting noise).
        bins: most quantile bins per feature.
    """

    rounds: int = 50
    learning_rate: float = 0.1
    depth: int = 2
    min_leaf: int = 20
    bins: int = 32
    edges: List[np.ndarray] = field(default_factory=list)
    base: float = 0.0
    trees: List[Node] = field(default_factory=list)
    split_gain: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def _digitize(self, x: np.ndarray) -> np.ndarray:
        return np.stack([np.searchsorted(e, x[:, j], side="left") for j, e in enumerate(self.edges)], axis=1)

    def fit(self, x: np.ndarray, y: np.ndarray) -> BoostedTrees:
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.ndim != 2 or len(x) != len(y) or not len(y):
            raise ValueError(f"fit: need x [n, features] and y [n] with n > 0, got {x.shape} and {y.shape}")
        q = np.linspace(0.0, 1.0, self.bins + 1)[1:-1]
        self.edges = [np.unique(np.quantile(x[:, j], q)) for j in range(x.shape[1])]
        b = self._digitize(x)
        self.base = float(y.mean())
        self.trees = []
        self.split_gain = np.zeros(x.shape[1])
        f = np.full(len(y), self.base)
        for _ in range(self.rounds):
            tree = self._grow(b, y - f, np.arange(len(y)), self.depth)
            self.trees.append(tree)
            f += self.learning_rate * self._apply(tree, b)
        return self

    def _grow(self, b: np.ndarray, r: np.ndarray, idx: np.ndarray, depth: int) -> Node:
        leaf: Node = (float(r[idx].mean()),)
        n = len(idx)
        if depth == 0 or n < 2 * self.min_leaf:
            return leaf
        total = float(r[idx].sum())
        best, where = 0.0, (-1, -1)
        for j in range(b.shape[1]):
            nb = len(self.edges[j]) + 1
            count = np.cumsum(np.bincount(b[idx, j], minlength=nb))[:-1]
            left = np.cumsum(np.bincount(b[idx, j], weights=r[idx], minlength=nb))[:-1]
            ok = (count >= self.min_leaf) & (n - count >= self.min_leaf)
            if not ok.any():
                continue
            # variance reduction of splitting after bin k (constant terms dropped)
            gain = np.where(ok, left ** 2 / np.maximum(count, 1)
                            + (total - left) ** 2 / np.maximum(n - count, 1) - total ** 2 / n, -np.inf)
            k = int(np.argmax(gain))
            if gain[k] > best:
                best, where = float(gain[k]), (j, k)
        if where[0] < 0:
            return leaf
        j, k = where
        self.split_gain[j] += best
        go_left = b[idx, j] <= k
        return (j, k, self._grow(b, r, idx[go_left], depth - 1), self._grow(b, r, idx[~go_left], depth - 1))

    def _apply(self, node: Node, b: np.ndarray) -> np.ndarray:
        if len(node) == 1:
            return np.full(len(b), node[0])
        j, k, left, right = node  # type: ignore[misc]
        go_left = b[:, j] <= k
        out = np.empty(len(b))
        out[go_left] = self._apply(left, b[go_left])
        out[~go_left] = self._apply(right, b[~go_left])
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        b = self._digitize(np.asarray(x, np.float64))
        out = np.full(len(b), self.base)
        for tree in self.trees:
            out += self.learning_rate * self._apply(tree, b)
        return out

    def predict_one(self, row: Sequence[float]) -> float:
        """One row in plain Python: the daemon's per-frame path (``predict`` pays numpy's
        per-call overhead on every node, milliseconds for one row)."""
        bins = [bisect.bisect_left(e, v) for e, v in zip(self.edges, row)]  # == searchsorted "left"
        out = self.base
        for node in self.trees:
            while len(node) == 4:
                node = node[2] if bins[node[0]] <= node[1] else node[3]  # type: ignore[misc]
            out += self.learning_rate * node[0]
        return float(out)

    def importance(self) -> np.ndarray:
        """Each feature's share of the total split gain (sums to 1 when any split was made)."""
        total = float(self.split_gain.sum())
        return self.split_gain / total if total > 0 else self.split_gain

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form (what :meth:`from_dict` reads)."""

        def node(n: Node) -> List[Any]:
            if len(n) == 1:
                return [n[0]]
            j, k, left, right = n  # type: ignore[misc]
            return [j, k, node(left), node(right)]

        return {"learningRate": self.learning_rate, "base": self.base,
                "edges": [e.tolist() for e in self.edges], "trees": [node(t) for t in self.trees]}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> BoostedTrees:
        """Validate and rebuild; ``where`` names the input in errors (ConfigError)."""

        def bad(what: str) -> ConfigError:
            return ConfigError(f"{where}: {what}; write the file again with `edgewise eval --train-data`")

        def number(v: Any, what: str) -> float:
            if not finite_number(v):
                raise bad(f"{what} must be a finite number, got {str(v)[:40]}")
            return float(v)

        if not isinstance(d, dict) or not {"learningRate", "base", "edges", "trees"} <= set(d):
            raise bad("expected keys learningRate, base, edges, trees")
        edges_in = d["edges"]
        if not isinstance(edges_in, list) or not all(isinstance(e, list) for e in edges_in):
            raise bad("edges must be a list of lists of numbers (bin edges per feature)")
        edges = [np.array([number(v, f"edges[{j}]") for v in e]) for j, e in enumerate(edges_in)]
        for j, e in enumerate(edges):
            if len(e) > 1 and np.any(np.diff(e) <= 0):
                raise bad(f"edges[{j}] must be strictly increasing")

        def tree(n: Any, path: str, depth: int) -> Node:
            if depth > MAX_DEPTH:
                raise bad(f"{path}: tree deeper than {MAX_DEPTH}")
            if isinstance(n, list) and len(n) == 1:
                return (number(n[0], f"{path} leaf"),)
            if not isinstance(n, list) or len(n) != 4:
                raise bad(f"{path}: a node is [value] or [feature, bin, left, right], got {str(n)[:60]}")
            j, k = n[0], n[1]
            if not isinstance(j, int) or isinstance(j, bool) or not 0 <= j < len(edges):
                raise bad(f"{path}: feature index {j!r} is not in 0..{len(edges) - 1}")
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= len(edges[j]):
                raise bad(f"{path}: bin {k!r} is not in 0..{len(edges[j])}")
            return (j, k, tree(n[2], path + ".left", depth + 1), tree(n[3], path + ".right", depth + 1))

        if not isinstance(d["trees"], list) or not d["trees"]:
            raise bad("trees must be a non-empty list")
        model = cls(learning_rate=number(d["learningRate"], "learningRate"), edges=edges,
                    base=number(d["base"], "base"))
        model.trees = [tree(t, f"trees[{i}]", 0) for i, t in enumerate(d["trees"])]
        model.rounds = len(model.trees)
        model.split_gain = np.zeros(len(edges))
        return model


def finite_number(v: Any) -> bool:
    """Whether a value read from JSON is a finite number (not a bool, not NaN or an infinity,
    not an integer past the largest float): the rule for every number of a model file."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(_float_or_inf(v))


def _float_or_inf(v: Union[int, float]) -> float:
    """``v`` as a float; an int past the largest float is infinite (``float()`` raises, and
    numpy's isfinite refuses a Python int that large: found by a probe)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf
