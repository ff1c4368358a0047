"""Confidence intervals by resampling streams: is a policy's lead real or noise?

Frames of one camera stream are not independent (the same objects, light and episode
span many of them), so the unit of resampling is the **stream**: a bootstrap sample draws
as many streams as the set has, with replacement, and adds up their detection counts
(true positives, false positives, misses) into an F1. Over ``n`` samples (1000 by default,
a fixed seed) the 2.5th and 97.5th percentiles are the 95% interval (Efron and
Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13; the cluster bootstrap of
Davison and Hinkley, "Bootstrap Methods and their Application", 1997, section 3.8).

A difference between two policies is resampled *paired*: the same streams in both, so
what the interval measures is how much the lead depends on which streams were drawn.
A policy "beats" another only when the interval of the difference lies above 0
(docs/design/escalation.md#evaluation-method), and never on fewer than
:data:`MIN_STREAMS` streams: resampling few clusters understates the spread (one stream is
drawn in every sample, its interval has no width), and the interval of a lead excludes 0 far
more often than the 2.5% it stands for (``hybrid.differences`` leaves such a lead not judged).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

#: default number of bootstrap samples and their seed
SAMPLES = 1000
SEED = 0
#: the fewest bootstrap samples of an interval: its ends are the 2.5th and 97.5th percentiles of
#: the samples, and fewer than 1 / 0.025 = 40 leave no sample beyond them (one sample made a
#: zero-width "interval" that did not even hold the point estimate, and judged every positive
#: draw a lead that is not noise)
MIN_SAMPLES = 40
#: the most: the draws take samples x streams numbers twice over (``--samples 100000000`` of 30
#: streams asked for 24 GB after the models had run, and ended in a traceback); 100000 samples
#: place the 2.5th percentile to within a tenth of what 1000 do and cost 50 MB for 30 streams
MAX_SAMPLES = 100_000
#: fewer streams than this and no lead is judged, and the report says its intervals are a floor.
#: Simulated with no real difference between two policies (per-stream counts of equal
#: expectation, streams of unequal difficulty), the paired interval lay above 0 in 24.6% of the
#: runs on 2 streams, 12.0% on 3, 7.5% on 6, 5.6% on 8, 5.0% on 10 and 3.6% on 30, for a nominal
#: 2.5%: a lead of 2 streams judged "not noise" was chance one time in four. (It was 2, for the
#: zero width of one stream; the report warned below 10 but judged leads from 2 on.)
MIN_STREAMS = 10


def stream_ids(streams: Sequence[int]) -> Tuple[np.ndarray, int]:
    """Each frame's stream as an index 0..S-1, and S."""
    uniq, inv = np.unique(np.asarray(streams), return_inverse=True)
    return inv.astype(np.int64), len(uniq)


def per_stream(frame_counts: np.ndarray, index: np.ndarray, n_streams: int) -> np.ndarray:
    """Frame counts [N, 3] (tp, fp, fn) summed per stream: [S, 3]."""
    out = np.zeros((n_streams, 3), np.float64)
    np.add.at(out, index, np.asarray(frame_counts, np.float64))
    return out


def weights(n_streams: int, samples: int = SAMPLES, seed: int = SEED) -> np.ndarray:
    """[samples, S]: how often each stream is drawn in each bootstrap sample; ValueError for
    fewer than :data:`MIN_SAMPLES` samples or more than :data:`MAX_SAMPLES` (``edgewise eval
    --samples`` refuses them first)."""
    if samples < MIN_SAMPLES:
        raise ValueError(f"{samples} bootstrap samples: a 95% interval needs at least {MIN_SAMPLES}")
    if samples > MAX_SAMPLES:
        raise ValueError(f"{samples} bootstrap samples: at most {MAX_SAMPLES} (their draws take samples x streams "
                         "numbers in memory)")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_streams, size=(samples, n_streams))
    w = np.zeros((samples, n_streams), np.float64)
    np.add.at(w, (np.repeat(np.arange(samples), n_streams), draws.ravel()), 1.0)
    return w


def f1(counts: np.ndarray) -> np.ndarray:
    """F1 = 2TP / (2TP + FP + FN) of counts [..., 3]; 1 where there is nothing to find or find."""
    c = np.asarray(counts, np.float64)
    den = 2 * c[..., 0] + c[..., 1] + c[..., 2]
    return np.where(den > 0, 2 * c[..., 0] / np.where(den > 0, den, 1.0), 1.0)


def interval(values: np.ndarray, level: float = 0.95) -> List[float]:
    """The percentile interval [lo, hi] of bootstrap values."""
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.asarray(values, np.float64), [a, 1.0 - a])
    return [float(lo), float(hi)]


def f1_interval(counts: np.ndarray, w: np.ndarray) -> List[float]:
    """95% interval of the F1 of per-stream counts [S, 3] under bootstrap weights ``w``."""
    return interval(f1(w @ counts))


def difference(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> Dict[str, object]:
    """F1(a) - F1(b) of per-stream counts on the same streams, its paired 95% interval, and
    whether the interval excludes 0 on the positive side."""
    diff = float(f1(a.sum(0)) - f1(b.sum(0)))
    ci = interval(f1(w @ a) - f1(w @ b))
    return {"diff": diff, "ci": ci, "beats": bool(ci[0] > 0)}
