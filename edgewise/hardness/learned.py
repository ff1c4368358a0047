"""The learned hardness: a frame's predicted F1 gain from escalating it, as a percentile.

``edgewise eval --train-data DIR`` fits boosted regression trees
(:mod:`~edgewise.hardness.boosting`) of each training frame's F1 gain from escalating
it, measured against ground truth (the ORIC / DCSB practice of predicting the benefit
of offloading, ``docs/design/escalation.md#learned-gain-model``), on the edge-side features below, and
writes them to ``gain-model.json`` together with the distribution of its predictions
on the training frames. A policy naming that file (``signals.learnedModel``) uses,
instead of the weighted signals, **hardness = the percentile of the frame's predicted
gain among the training frames**: threshold 0.85 escalates what the model ranks in its
top 15%, so the threshold reads as an escalation rate on traffic like the training set.

A model fitted with the carry-state features (:mod:`edgewise.hardness.carrystate`, what the
stream's carried answers already explain) predicts the *marginal* gain: what escalating the
frame adds to what is in force (``edgewise eval``'s ``learned_carry`` policy). The daemon then
computes those features before deciding (``edge.deciding``); they reach the model through the
signals mapping, under their own names.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from edgewise.detections import Detections
from edgewise.errors import ConfigError
from edgewise.filereads import read_capped
from edgewise.hardness.boosting import BoostedTrees, finite_number
from edgewise.hardness.carrystate import CARRY_FEATURES
from edgewise.hardness.signals import RECORD_DECIMALS, SIGNAL_NAMES

FORMAT = "edgewise-gain-model/v1"
#: the facts about the boxes among the features
BOX_FACTS: Tuple[str, ...] = ("log_n_boxes", "empty", "max_score")
#: what a per-frame model reads: every signal and three facts about the boxes
FRAME_FEATURES: Tuple[str, ...] = tuple(SIGNAL_NAMES) + BOX_FACTS
#: the inputs this version computes, in column order: the frame's, then the carry-state
#: features (0 where the signals mapping lacks them). A model file names the features it was
#: fitted on, a subset (a model fitted before the motion signals existed uses the others; a
#: per-frame model, :data:`FRAME_FEATURES`, leaves the carry state out).
FEATURE_NAMES: Tuple[str, ...] = FRAME_FEATURES + CARRY_FEATURES
MAX_MODEL_BYTES = 4 << 20


def frame_features(signals: Mapping[str, float], dets: Detections) -> List[float]:
    """One frame's feature row over :data:`FEATURE_NAMES` (edge-side only: what the daemon
    knows before asking)."""
    n = len(dets)
    return features_of(signals, n, float(dets.scores.max()) if n else 0.0)


def features_of(signals: Mapping[str, float], boxes: int, max_score: float) -> List[float]:
    """The feature row from the signals, the number of boxes and the highest box score.
    The score is taken at the frame record's precision (:data:`RECORD_DECIMALS`), so a
    replay of the records (``edgewise.policy.replay``) gets the daemon's features."""
    sig = [float(signals.get(s, 0.0)) for s in SIGNAL_NAMES]
    carry = [float(signals.get(s, 0.0)) for s in CARRY_FEATURES]
    facts = [math.log1p(boxes), float(boxes == 0), round(max_score, RECORD_DECIMALS) if boxes else 0.0]
    return [v if math.isfinite(v) else 0.0 for v in sig] + facts + [v if math.isfinite(v) else 0.0 for v in carry]


@dataclass
class GainModel:
    """Trees of the predicted gain plus the training frames' prediction percentiles.

    Attributes:
        trees: the fitted :class:`BoostedTrees` over ``features``.
        quantiles: predictions on the training frames at 0, 1, ..., 100 percent.
        info: provenance (training data, frames, merge strategy), shown by explain.
        source: file it was loaded from ("" when fitted in memory).
        features: the columns of :data:`FEATURE_NAMES` the trees were fitted on.
    """

    trees: BoostedTrees
    quantiles: np.ndarray
    info: Dict[str, Any] = field(default_factory=dict)
    source: str = ""
    features: Tuple[str, ...] = FRAME_FEATURES
    #: positions of ``features`` in a :data:`FEATURE_NAMES` row (None: all of them, in order),
    #: worked out once: ``hardness_of`` runs per frame
    _columns: Optional[List[int]] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.features != FEATURE_NAMES:  # a model's features are in FEATURE_NAMES' order
            self._columns = [FEATURE_NAMES.index(n) for n in self.features]

    @classmethod
    def fit(cls, x: np.ndarray, gain: np.ndarray, info: Mapping[str, Any],
            features: Tuple[str, ...] = FRAME_FEATURES, **params: Any) -> GainModel:
        """Fit on the ``features`` of :data:`FEATURE_NAMES` rows ``x`` and each frame's gain
        (any scale: it is normalised)."""
        y = np.asarray(gain, np.float64)
        y = y / max(float(np.abs(y).max()) if len(y) else 0.0, 1e-12)
        cols = [FEATURE_NAMES.index(n) for n in features]
        rows = np.asarray(x, np.float64).reshape(-1, len(FEATURE_NAMES))[:, cols]
        trees = BoostedTrees(**params).fit(rows, y)
        quantiles = np.quantile(trees.predict(rows), np.linspace(0.0, 1.0, 101))
        return cls(trees=trees, quantiles=quantiles, info=dict(info), features=tuple(features))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted relative gain of each :data:`FEATURE_NAMES` row (higher: escalate first)."""
        rows = np.asarray(x, np.float64).reshape(-1, len(FEATURE_NAMES))
        return self.trees.predict(rows if self._columns is None else rows[:, self._columns])

    def percentile(self, predicted: np.ndarray) -> np.ndarray:
        """Mid-rank percentile in [0, 1] of predictions among the training frames'."""
        q = self.quantiles
        lo = np.searchsorted(q, predicted, side="left")
        hi = np.searchsorted(q, predicted, side="right")
        return np.asarray((lo + hi) / (2.0 * len(q)), np.float64)

    def hardness(self, signals: Mapping[str, float], dets: Detections) -> float:
        """The learned hardness of one frame, in [0, 1]."""
        n = len(dets)
        return self.hardness_of(signals, n, float(dets.scores.max()) if n else 0.0)

    def predicted_of(self, signals: Mapping[str, float], boxes: int, max_score: float) -> float:
        """The predicted gain from what the policy knows of a frame (see :func:`features_of`),
        over the model's own features, in plain Python (the per-frame path)."""
        row = features_of(signals, boxes, max_score)
        return self.trees.predict_one(row if self._columns is None else [row[i] for i in self._columns])

    def hardness_of(self, signals: Mapping[str, float], boxes: int, max_score: float) -> float:
        """The learned hardness from what the policy knows of a frame (the daemon's and the
        replay's per-frame path): :meth:`predicted_of` as a training percentile."""
        return float(self.percentile(np.array([self.predicted_of(signals, boxes, max_score)]))[0])

    def uses_carry(self) -> bool:
        """Whether the model reads the carry-state features (the daemon must compute them)."""
        return any(n in CARRY_FEATURES for n in self.features)

    def importance(self) -> Dict[str, float]:
        """Each feature's share of the trees' split gain (0 after loading: not stored)."""
        return {n: round(float(v), 4) for n, v in zip(self.features, self.trees.importance())}

    def to_dict(self) -> Dict[str, Any]:
        return {"format": FORMAT, "features": list(self.features), "info": self.info,
                "importance": self.importance(), "quantiles": self.quantiles.tolist(),
                **self.trees.to_dict()}

    def save(self, path: Union[str, Path]) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def load(cls, path: Union[str, Path]) -> GainModel:
        """Read and validate a model file; ConfigError names the file and what is wrong."""
        p = Path(path)
        try:
            data, size = read_capped(p, MAX_MODEL_BYTES, "the gain model's JSON file")
            if size > MAX_MODEL_BYTES:
                raise ConfigError(f"{p}: {size} bytes, over {MAX_MODEL_BYTES}; not a gain model written by "
                                  "edgewise eval")
            d = json.loads(data.decode("utf-8"))
        except IsADirectoryError:
            raise ConfigError(f"{p}: is a folder; signals.learnedModel names the gain model's JSON file "
                              "(e.g. gain-model.json, written by `edgewise eval --train-data`)") from None
        except FileNotFoundError:
            raise ConfigError(f"{p}: gain model file not found; run `edgewise eval --train-data` to write it, "
                              "or fix signals.learnedModel") from None
        except ConfigError:  # (a ValueError too)
            raise
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # (ValueError: also a number of 5000 digits)
            raise ConfigError(f"{p}: not JSON ({type(exc).__name__}: {str(exc)[:100]})") from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the gain model file: {exc.strerror or exc}") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ConfigError(f"{p}: format must be {FORMAT!r}, got {d.get('format') if isinstance(d, dict) else d!r}")
        feats = d.get("features")
        if (not isinstance(feats, list) or not feats or len(set(map(str, feats))) != len(feats)
                or not all(f in FEATURE_NAMES for f in feats)):
            raise ConfigError(f"{p}: fitted on features {feats!r}, this edgewise computes "
                              f"{list(FEATURE_NAMES)}; fit it again with this version")
        trees = BoostedTrees.from_dict(d, str(p))
        if len(trees.edges) != len(feats):
            raise ConfigError(f"{p}: edges has {len(trees.edges)} features, expected {len(feats)}")
        q = d.get("quantiles")
        if (not isinstance(q, list) or len(q) < 2
                or not all(finite_number(v) for v in q)
                or any(b < a for a, b in zip(q, q[1:]))):
            raise ConfigError(f"{p}: quantiles must be a non-decreasing list of at least 2 finite numbers")
        info = d.get("info", {})
        return cls(trees=trees, quantiles=np.asarray(q, np.float64), info=info if isinstance(info, dict) else {},
                   source=str(p), features=tuple(str(f) for f in feats))
