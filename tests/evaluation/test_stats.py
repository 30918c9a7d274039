"""The statistics of a paired evaluation against hand-computed values and an exact oracle: the bootstrap interval
(every resample of a few prompts enumerated), the pairing by (prompt, seed) cell, the shares of prompts that moved
and the breakdown by category."""

import itertools

import numpy as np
import pytest

from flowrl.evaluation.stats import (bootstrap_interval, category_masks, compare, paired_differences, prompt_means,
                                     summarize)


def exact_bootstrap_quantiles(values, confidence=0.95):
    """The quantiles of the mean over *every* resample of ``values`` (n^n equally likely index tuples), taken as
    the smallest mean whose cumulative probability reaches the level: an oracle that shares no code with the
    bootstrap."""
    n = len(values)
    means = sorted(sum(values[i] for i in idx) / n for idx in itertools.product(range(n), repeat=n))
    alpha = 1 - confidence
    return means[int(np.ceil(alpha / 2 * len(means))) - 1], means[int(np.ceil((1 - alpha / 2) * len(means))) - 1]


def test_the_interval_of_a_hand_computed_case():
    # [0, 0, 3]: the resample mean is the number k of 3s drawn, k ~ Binomial(3, 1/3):
    # P(0) = 8/27 = 0.296 >= 0.025, so the low end is 0; P(k <= 2) = 26/27 = 0.963 < 0.975, so the high end is 3
    interval = bootstrap_interval(np.array([0.0, 0.0, 3.0]), resamples=20_000, seed=1)
    assert (interval.low, interval.high) == (0.0, 3.0)
    # [0, 1, 1, 1]: the mean is j/4, j ~ Binomial(4, 3/4): P(j <= 1) = 13/256 = 0.051 >= 0.025 and
    # P(j = 0) = 1/256 = 0.004 < 0.025, so the low end is 1/4; P(j <= 3) = 175/256 = 0.68 < 0.975: the high end is 1
    interval = bootstrap_interval(np.array([0.0, 1.0, 1.0, 1.0]), resamples=20_000, seed=1)
    assert (interval.low, interval.high) == (0.25, 1.0)
    assert exact_bootstrap_quantiles([0.0, 1.0, 1.0, 1.0]) == (0.25, 1.0)


@pytest.mark.parametrize("values", [[0.2, 0.9, 0.4, 0.3, 0.1], [1.0, -2.0, 0.5, 0.25, 3.0]])
def test_the_interval_matches_the_exact_bootstrap_distribution(values):
    # 5 prompts: 3125 equally likely resamples. With 40,000 draws the empirical 2.5% / 97.5% quantiles land on the
    # exact ones or within one atom of them; the atoms here are 0.02 / 0.05 apart
    low, high = exact_bootstrap_quantiles(values)
    interval = bootstrap_interval(np.array(values), resamples=40_000, seed=3)
    atom = min(abs(a - b) for a, b in itertools.combinations(values, 2)) / len(values)
    assert abs(interval.low - low) <= atom + 1e-12 and abs(interval.high - high) <= atom + 1e-12


def test_the_interval_is_reproducible_and_shrinks_as_prompts_grow():
    rng = np.random.default_rng(0)
    values = rng.normal(0.3, 1.0, size=400)
    a, b = bootstrap_interval(values, seed=5), bootstrap_interval(values, seed=5)
    assert a == b
    assert bootstrap_interval(values, seed=6) != a  # another seed, other resamples
    # the normal approximation: half-width 1.96 sd / sqrt(n) = 1.96 * 1.0 / 20 = 0.098
    half = (a.high - a.low) / 2
    assert 0.085 < half < 0.11
    small = bootstrap_interval(values[:25], seed=5)
    assert small.high - small.low > 3 * (a.high - a.low)  # sqrt(400 / 25) = 4 times wider, roughly


def test_pairs_are_cells_and_prompts_are_the_unit():
    # prompt 0: seeds (1.0 vs 0.0) and (NaN vs 5.0): only the first pair counts, +1
    # prompt 1: (2.0 vs 3.0) and (4.0 vs 4.0): (-1 + 0) / 2 = -0.5; prompt 2: no finite pair
    model = np.array([[1.0, np.nan], [2.0, 4.0], [np.nan, np.nan]])
    base = np.array([[0.0, 5.0], [3.0, 4.0], [1.0, 1.0]])
    assert paired_differences(model, base).tolist()[:2] == [1.0, -0.5]
    c = compare(model, base, resamples=1000)
    assert c.prompts == 2 and c.difference == pytest.approx(0.25)  # (1 - 0.5) / 2
    assert (c.improved, c.worsened) == (0.5, 0.5)
    # the means are over the paired cells: the model (1 + 3) / 2 = 2, the base (0 + 3.5) / 2 = 1.75
    assert (c.mean, c.base_mean) == (2.0, 1.75)
    assert c.difference == c.mean - c.base_mean


def test_a_difference_of_means_is_not_a_paired_difference():
    # the same scores shuffled across seeds: the means agree, the paired differences do not
    base = np.array([[0.0, 1.0], [0.0, 1.0]])
    model = np.array([[1.0, 0.0], [1.0, 0.0]])
    c = compare(model, base, resamples=100)
    assert c.difference == 0.0 and c.improved == 0.0 and c.worsened == 0.0  # per prompt: (+1 - 1) / 2 = 0
    assert summarize(model).mean == summarize(base).mean == 0.5


def test_categories_select_their_prompts():
    model = np.array([[1.0], [2.0], [3.0], [10.0]])
    base = np.zeros((4, 1))
    masks = category_masks(["a", "b", "a", None])
    assert list(masks) == ["a", "b"]
    assert compare(model, base, prompts=masks["a"], resamples=100).difference == 2.0  # (1 + 3) / 2
    assert compare(model, base, prompts=masks["b"], resamples=100).prompts == 1
    assert prompt_means(model[masks["a"]]).tolist() == [1.0, 3.0]
