"""Statistics of a paired evaluation: every model drew every (prompt, seed) from the same initial noise, so a tuned
model's score is compared with the base model's score *of the same noise*, and the uncertainty is that of the
prompts drawn from the suite.

Notation:
    ``P`` prompts, ``S`` seeds per prompt; ``scores [P, S]`` one metric of one model (NaN: not scored);
    a prompt's value is the mean over its finite seeds, a paired prompt difference the mean over the seeds where
    both models are finite of ``model - base``; means and intervals are over prompts.

The interval is the percentile bootstrap (Efron & Tibshirani 1993, ch. 13) over prompts: seeds of one prompt stay
together (they share the prompt, so they are not independent draws), and the resamples come from a seeded
generator, so the same scores give the same interval on any machine and any number of processes. Every comparison
of one run with the same number of prompts reuses the same resamples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A two-sided interval ``[low, high]``; NaN ends where there were no values."""

    low: float
    high: float

    def excludes_zero(self) -> bool:
        """Whether zero lies outside the interval (the change is larger than the resampling noise).

        >>> Interval(0.1, 0.4).excludes_zero(), Interval(-0.1, 0.4).excludes_zero()
        (True, False)
        """
        return self.low > 0 or self.high < 0


def prompt_means(scores: np.ndarray) -> np.ndarray:
    """Each prompt's mean over its finite seeds ``[P]`` (NaN for a prompt with none) from ``scores [P, S]``.

    >>> prompt_means(np.array([[1.0, 3.0], [np.nan, 4.0], [np.nan, np.inf]])).tolist()
    [2.0, 4.0, nan]
    """
    finite = np.isfinite(scores)
    counts = finite.sum(axis=1)
    sums = np.where(finite, scores, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def paired_differences(model: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Per prompt, the mean over seeds of ``model - base`` where both are finite ``[P]`` (NaN: no finite pair).

    Args:
        model, base: ``[P, S]`` scores of the same (prompt, seed) cells.

    >>> paired_differences(np.array([[3.0, 5.0], [1.0, 2.0]]), np.array([[1.0, np.nan], [1.5, 2.5]])).tolist()
    [2.0, -0.5]
    """
    if model.shape != base.shape:
        raise ValueError(f"paired scores need the same (prompt, seed) cells; got {model.shape} and {base.shape}")
    both = np.isfinite(model) & np.isfinite(base)
    return prompt_means(np.where(both, model - base, np.nan))


def resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap resamples of ``n`` prompts ``[resamples, n]`` (indices drawn with replacement), a pure function of
    ``(n, resamples, seed)``.

    >>> resample_indices(3, 2, seed=0).shape, bool((resample_indices(5, 4, 1) == resample_indices(5, 4, 1)).all())
    ((2, 3), True)
    """
    if n < 1 or resamples < 1:
        raise ValueError(f"a bootstrap needs at least one value and one resample; got n={n}, resamples={resamples}")
    return np.random.Generator(np.random.PCG64(seed)).integers(0, n, size=(resamples, n))


def bootstrap_interval(values: np.ndarray, resamples: int = 10_000, confidence: float = 0.95,
                       seed: int = 0) -> Interval:
    """The percentile-bootstrap interval of the mean of ``values [n]`` (non-finite values left out).

    The hand-computed case: for ``[0, 0, 3]`` a resample's mean is ``k`` where ``k ~ Binomial(3, 1/3)`` counts the
    draws of the 3, so P(mean = 0) = 8/27 = 0.30 (above 0.025: the low end is 0) and P(mean = 3) = 1/27 = 0.037
    (above 0.025: the high end is 3):

    >>> bootstrap_interval(np.array([0.0, 0.0, 3.0]))
    Interval(low=0.0, high=3.0)
    >>> bootstrap_interval(np.array([2.0, 2.0]))  # no spread, no width
    Interval(low=2.0, high=2.0)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence}: must be between 0 and 1 (e.g. 0.95)")
    values = values[np.isfinite(values)]
    if values.size == 0:
        return Interval(math.nan, math.nan)
    means = values[resample_indices(values.size, resamples, seed)].mean(axis=1)  # [R]
    alpha = 1 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return Interval(float(low), float(high))


@dataclass(frozen=True)
class Summary:
    """One model's mean of one metric over prompts, with its interval."""

    mean: float
    interval: Interval
    prompts: int  # prompts with at least one finite score


def summarize(scores: np.ndarray, resamples: int = 10_000, confidence: float = 0.95, seed: int = 0) -> Summary:
    """The mean over prompts of the prompt means of ``scores [P, S]`` and its bootstrap interval.

    >>> summarize(np.array([[1.0, 3.0], [4.0, np.nan]]), resamples=200)
    Summary(mean=3.0, interval=Interval(low=2.0, high=4.0), prompts=2)
    """
    values = prompt_means(scores)
    finite = values[np.isfinite(values)]
    mean = float(finite.mean()) if finite.size else math.nan
    return Summary(mean, bootstrap_interval(finite, resamples, confidence, seed), int(finite.size))


@dataclass(frozen=True)
class Comparison:
    """A model against the base on one metric, paired by (prompt, seed).

    ``difference`` is the mean over prompts of the paired prompt differences and ``interval`` its bootstrap
    interval; ``improved`` / ``worsened`` are the shares of those prompts whose difference is above / below 0
    (ties count in neither); ``mean`` and ``base_mean`` are the two models' means over the same prompts.
    """

    mean: float
    base_mean: float
    difference: float
    interval: Interval
    improved: float
    worsened: float
    prompts: int

    @property
    def relative(self) -> float:
        """The difference as a fraction of the base's mean (NaN for a base mean of 0).

        >>> Comparison(1.2, 1.0, 0.2, Interval(0.1, 0.3), 0.8, 0.1, 10).relative
        0.2
        """
        return round(self.difference / abs(self.base_mean), 12) if self.base_mean else math.nan


def compare(model: np.ndarray, base: np.ndarray, resamples: int = 10_000, confidence: float = 0.95,
            seed: int = 0, prompts: Optional[np.ndarray] = None) -> Comparison:
    """``model [P, S]`` against ``base [P, S]`` on the prompts ``prompts`` (a boolean mask or indices; None: all).

    Two prompts, two seeds; prompt 0 improves by (2 + 0) / 2 = 1, prompt 1 worsens by 1:

    >>> c = compare(np.array([[3.0, 1.0], [0.0, 0.0]]), np.array([[1.0, 1.0], [1.0, 1.0]]), resamples=400)
    >>> c.mean, c.base_mean, c.difference, c.improved, c.worsened, c.prompts
    (1.0, 1.0, 0.0, 0.5, 0.5, 2)
    >>> c.interval  # a resample of 2 prompts: both improved (+1), both worsened (-1) or one of each (0)
    Interval(low=-1.0, high=1.0)
    """
    if prompts is not None:
        model, base = model[prompts], base[prompts]
    differences = paired_differences(model, base)
    paired = np.isfinite(differences)
    d = differences[paired]
    if d.size == 0:
        return Comparison(math.nan, math.nan, math.nan, Interval(math.nan, math.nan), math.nan, math.nan, 0)
    both = np.isfinite(model) & np.isfinite(base)
    own = lambda s: float(prompt_means(np.where(both, s, np.nan))[paired].mean())  # noqa: E731  the paired cells
    return Comparison(own(model), own(base), float(d.mean()), bootstrap_interval(d, resamples, confidence, seed),
                      float((d > 0).mean()), float((d < 0).mean()), int(d.size))


def category_masks(categories: list[Optional[str]]) -> dict[str, np.ndarray]:
    """``{category: prompt mask [P]}`` in order of first appearance; prompts without a category are in none.

    >>> {k: v.tolist() for k, v in category_masks(["a", None, "b", "a"]).items()}
    {'a': [True, False, False, True], 'b': [False, False, True, False]}
    """
    names = list(dict.fromkeys(c for c in categories if c is not None))
    array = np.array([c if c is not None else "" for c in categories], dtype=object)
    return {name: array == name for name in names}
