"""Reward-hacking signals: how far a tuned model's image moved from the base image of the same noise (drift), how
different a prompt's seeds still are from each other (diversity), and the flag that reads them together.

A policy that games its reward raises the trained score while something a reader cares about falls: a reward it
was not trained on (held-out), or the variety of its images (mode collapse, a known effect of reward maximisation:
Flow-GRPO, arXiv 2505.05470, keeps a KL term against reward hacking; DDPO, arXiv 2305.13301, reports
over-optimisation).
Drift has no "right" size and raises no flag; it says how much of the base model is left.

Distances (each a pure function, images in [0, 1], features any ``[B, D]``):
    pixels: the root-mean-square difference per image, in pixel units (0: identical, 1: black against white);
    features: the cosine distance ``1 - cos`` of the two feature vectors (0: same direction; scale-free, so a
    classifier's features and a CLIP embedding read alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Callable

import torch
from torch import Tensor

from flowrl.evaluation.stats import Comparison

Distance = Callable[[Tensor, Tensor], Tensor]


def pixel_distance(a: Tensor, b: Tensor) -> Tensor:
    """Root-mean-square difference ``[B]`` of images ``a, b [B, C, H, W]``.

    >>> pixel_distance(torch.zeros(2, 3, 2, 2), torch.tensor([1.0, 0.5]).view(2, 1, 1, 1).expand(2, 3, 2, 2))
    tensor([1.0000, 0.5000])
    """
    return (a.double() - b.double()).pow(2).flatten(1).mean(1).sqrt().float()


def feature_distance(a: Tensor, b: Tensor) -> Tensor:
    """Cosine distance ``1 - cos(a_i, b_i)`` ``[B]`` of features ``a, b [B, D]``, computed as
    ``|a/|a| - b/|b||^2 / 2`` (the same number; it is exactly 0 for vectors of one direction, where ``1 - cos``
    subtracts two nearly equal numbers).

    >>> feature_distance(torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]), torch.tensor([[0.0, 2.0], [2.0, 2.0],
    ...                                                                                     [-1.0, 0.0]]))
    tensor([1., 0., 2.])
    """
    unit = lambda x: torch.nn.functional.normalize(x.double().flatten(1), dim=1)  # noqa: E731
    return ((unit(a) - unit(b)).pow(2).sum(1) / 2).float()


DISTANCES: dict[str, Distance] = {"pixels": pixel_distance, "features": feature_distance}


def mean_pairwise(x: Tensor, distance: Distance) -> float:
    """The mean of ``distance`` over the ``S (S - 1) / 2`` unordered pairs of ``x [S, ...]`` (one prompt's seeds);
    NaN for fewer than two.

    Three images of one pixel at 0, 0.5 and 1: pairs at 0.5, 1 and 0.5, mean 2/3:

    >>> round(mean_pairwise(torch.tensor([0.0, 0.5, 1.0]).view(3, 1, 1, 1), pixel_distance), 4)
    0.6667
    """
    if len(x) < 2:
        return float("nan")
    first, second = zip(*combinations(range(len(x)), 2))
    return float(distance(x[list(first)], x[list(second)]).double().mean())


@dataclass(frozen=True)
class Flag:
    """The verdict on one tuned model: ``raised`` when a trained reward rose beyond its interval while a watched
    signal (a held-out reward, a diversity) fell beyond its own; ``gains`` and ``falls`` name them, ``watched``
    every signal that was read."""

    model: str
    raised: bool
    gains: dict[str, Comparison] = field(default_factory=dict)
    falls: dict[str, Comparison] = field(default_factory=dict)
    watched: list[str] = field(default_factory=list)


def fell(comparison: Comparison, margin: float = 0.0) -> bool:
    """Whether the whole interval of the change lies below ``-margin x |base mean|`` (``margin`` 0: below zero).

    >>> from flowrl.evaluation.stats import Interval
    >>> c = Comparison(0.9, 1.0, -0.1, Interval(-0.15, -0.04), 0.1, 0.8, 50)
    >>> fell(c), fell(c, margin=0.05)
    (True, False)
    """
    return comparison.interval.high < -margin * abs(comparison.base_mean)


def hacking_flag(model: str, trained: dict[str, Comparison], watched: dict[str, Comparison],
                 margin: float = 0.0) -> Flag:
    """The flag of ``model`` from its comparisons with the base: ``trained`` on the rewards it was trained on,
    ``watched`` on the held-out rewards and the diversities.

    Args:
        margin: how far, as a fraction of the base's mean, a watched signal must fall beyond its interval (0: any
            fall that the interval excludes zero for).

    >>> from flowrl.evaluation.stats import Interval
    >>> up = Comparison(0.8, 0.5, 0.3, Interval(0.25, 0.35), 0.9, 0.05, 64)
    >>> down = Comparison(0.4, 0.6, -0.2, Interval(-0.26, -0.14), 0.1, 0.85, 64)
    >>> flat = Comparison(0.6, 0.6, 0.0, Interval(-0.03, 0.03), 0.4, 0.4, 64)
    >>> hacking_flag("tuned", {"brightness": up}, {"digit_alignment": down}).raised
    True
    >>> hacking_flag("tuned", {"brightness": up}, {"digit_alignment": flat}).raised  # a benign gain
    False
    """
    gains = {name: c for name, c in trained.items() if c.interval.low > 0}
    falls = {name: c for name, c in watched.items() if fell(c, margin)}
    return Flag(model, bool(gains and falls), gains, falls, list(watched))
