"""Max-variance down-sampling of rollouts (PODS, arXiv 2504.13818): of each group's ``n`` rows keep the ``m`` whose
scores have the largest variance, and train only those.

The paper proves that such a subset is always the ``k`` lowest plus the ``m - k`` highest scores for some
``0 <= k <= m``, so after one sort only ``m + 1`` candidates are compared (``O(n log n)``). Ties are broken
deterministically: rows of equal score are ordered by their index (a stable sort), and among candidates of equal
variance the one with the fewest lowest scores (the smallest ``k``) wins, so the same scores give the same rows on
every rank and after a resume.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.advantages.primitives import group_index, group_stats


def max_variance_subset(scores: Tensor, group_ids: Tensor, m: int) -> Tensor:
    """Per group, the rows of the size-``m`` subset of largest score variance; a group of ``m`` rows or fewer keeps
    every row.

    Args:
        scores: ``[B]`` finite, one per row (e.g. a rollout's reward). group_ids: ``[B]`` int, rows sharing a prompt
            (any ids; rows of a group need not be adjacent). m: rows kept per group, ``>= 1``.
    Returns:
        ``[B]`` bool, the kept rows.

    >>> scores = torch.tensor([0.0, 1.0, 2.0, 10.0, 5.0, 5.0, 5.0])
    >>> max_variance_subset(scores, torch.tensor([0, 0, 0, 0, 1, 1, 1]), 2).tolist()  # {0, 10}; equal scores: last 2
    [True, False, False, True, False, True, True]
    """
    if m < 1:
        raise ValueError(f"m={m}: keep at least one row per group")
    if scores.shape != group_ids.shape or scores.ndim != 1:
        raise ValueError(f"scores and group_ids must both be [B]; got {tuple(scores.shape)} and "
                         f"{tuple(group_ids.shape)}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf; select among the rows with a finite score")
    if scores.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=scores.device)
    group, num_groups = group_index(group_ids)  # [B] in [0, G)
    x = scores.double()
    # rows sorted by (group, score, index): two stable sorts, the last key first
    order = torch.argsort(x, stable=True)
    order = order[torch.argsort(group[order], stable=True)]
    sizes = torch.bincount(group, minlength=num_groups)  # [G]
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.empty_like(group)
    rank[order] = torch.arange(len(x), device=x.device) - starts[group[order]]  # each row's place in its sorted group
    n = sizes[group]  # [B] its group's size
    centred = x - group_stats(x, group_ids)[0]  # variances compared without the mean's cancellation
    k = torch.arange(m + 1, device=x.device)[:, None]  # [m + 1, 1] candidates: the k lowest and m - k highest
    member = (rank < k) | (rank >= n - (m - k))  # [m + 1, B]
    inside = torch.where(member, centred, 0.0)
    sums = torch.zeros(m + 1, num_groups, dtype=x.dtype, device=x.device).index_add(1, group, inside)
    squares = torch.zeros_like(sums).index_add(1, group, inside * inside)
    variance = squares / m - (sums / m) ** 2  # [m + 1, G] each candidate's population variance
    best = torch.argmax(variance, dim=0)  # the first maximum: the smallest k
    kept = member[best[group], torch.arange(len(x), device=x.device)]
    return kept | (n <= m)
