"""Group-relative outcome estimators: one advantage per row from its score ``s_i`` (the masked sum of its rewards)
and the other rows of its group, broadcast over the row's valid positions.

Notation: ``s_i`` row score, ``g(i)`` its group, ``n_g`` group size, ``mu_g`` / ``sigma_g`` group mean / std,
``L_i`` the number of valid positions of row i. Each estimator names the verl function it matches
(volcengine/verl ``verl/trainer/ppo/core_algos.py``); a group of one follows ``singleton`` (verl: ``raw``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.advantages.primitives import group_index, group_stats, normalize, scores, spread
from flowrl.advantages.registry import register


@register("grpo")
def grpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, ddof: int = 1,
         std_scope: str = "group", singleton: str = "raw") -> Tensor:
    """GRPO (arXiv 2402.03300): ``A_i = (s_i - mu_g) / (sigma + eps)``; verl ``compute_grpo_outcome_advantage``.

    Args:
        rewards, mask: ``[B, T]``. group_ids: ``[B]``.
        eps: added to the std. ddof: 0 (population) or 1 (unbiased, ``torch.std``).
        std_scope: ``group``, ``batch`` (= ``global``: the std of every row score), ``none`` (Dr.GRPO).
        singleton: ``raw`` (mean 0, std 1: ``s_i / (1 + eps)``, verl) or ``zero`` (TRL, flow_grpo).
        clip: clamp to ``[-clip, clip]`` (added by ``register``).
    Returns:
        ``[B, T]``, zero where ``mask`` is 0.

    >>> r = torch.tensor([[1.0], [2.0], [3.0], [4.0]]); m = torch.ones(4, 1, dtype=torch.bool)
    >>> [round(a, 4) for a in grpo(r, m, torch.zeros(4, dtype=torch.long), eps=1e-4, ddof=0)[:, 0].tolist()]
    [-1.3415, -0.4472, 0.4472, 1.3415]
    """
    return normalize(scores(rewards, mask), group_ids, std_scope=std_scope, eps=eps, ddof=ddof, singleton=singleton)


@register("dr_grpo")
def dr_grpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, singleton: str = "raw") -> Tensor:
    """Dr.GRPO (arXiv 2503.20783): ``A_i = s_i - mu_g``, no std division.

    verl: ``grpo`` with ``norm_adv_by_std_in_grpo=False`` (a singleton keeps ``s_i``); TRL:
    ``scale_rewards="none"`` (a singleton gets 0). The paper's loss aggregation is a ``flowrl.losses`` choice.

    >>> dr_grpo(torch.tensor([[1.0], [3.0], [4.0]]), torch.ones(3, 1, dtype=torch.bool), torch.tensor([0, 0, 1]))
    tensor([[-1.],
            [ 1.],
            [ 4.]])
    """
    return normalize(scores(rewards, mask), group_ids, std_scope="none", singleton=singleton)


@register("rloo")
def rloo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, singleton: str = "raw") -> Tensor:
    """RLOO (arXiv 2402.14740): ``A_i = s_i - mean_{j != i} s_j = n/(n-1) * (s_i - mu_g)``.

    verl ``compute_rloo_outcome_advantage`` keeps a singleton's raw score; verl ``rloo_vectorized`` and TRL
    ``RLOOTrainer`` give it 0 (presets ``rloo@verl``, ``rloo@trl``).

    >>> rloo(torch.tensor([[1.0], [2.0], [6.0]]), torch.ones(3, 1, dtype=torch.bool), torch.zeros(3).long())[:, 0]
    tensor([-3.0000, -1.5000,  4.5000])
    """
    s = scores(rewards, mask)
    mean, _, n = group_stats(s, group_ids)
    lone = s if singleton == "raw" else torch.zeros_like(s)
    return torch.where(n > 1, n / (n - 1).clamp_min(1) * (s - mean), lone)


@register("opo")
def opo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, singleton: str = "raw") -> Tensor:
    """OPO (arXiv 2505.23585): length-weighted baseline ``b_g = sum_j L_j s_j / sum_j L_j``, ``A_i = s_i - b_g``.

    verl ``compute_opo_outcome_advantage`` (a singleton gets ``b = 0``, so keeps its raw score). A group whose rows
    have no valid position has no baseline; its rows are fully masked, so they get 0.

    >>> m = torch.tensor([[True, False], [True, True]])  # lengths 1 and 2: b = (1*3 + 2*6) / 3 = 5
    >>> opo(torch.tensor([[3.0, 0.0], [0.0, 6.0]]), m, torch.zeros(2).long()).tolist()
    [[-2.0, 0.0], [1.0, 1.0]]
    """
    s, length = scores(rewards, mask), mask.sum(dim=1).double()
    weighted, _, n = group_stats(length * s, group_ids)
    total = group_stats(length, group_ids)[0]
    baseline = weighted / torch.where(total > 0, total, 1.0)
    lone = s if singleton == "raw" else torch.zeros_like(s)
    return torch.where(n > 1, s - baseline, lone)


@register("gpg")
def gpg(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, singleton: str = "raw") -> Tensor:
    """GPG (arXiv 2504.02546): ``A_i = alpha * (s_i - mu_g)``, ``alpha = B / max(#{i: s_i != 0}, 1)``.

    verl ``compute_gpg_outcome_advantage``: ``alpha`` counts non-zero scores over the whole batch (so rows of
    groups with all-zero rewards raise the others' weight); ``f_norm = 1`` and no std division.

    >>> m = torch.ones(4, 1, dtype=torch.bool)  # 1 of 4 scores non-zero: alpha = 4; group means 0.5 and 0
    >>> gpg(torch.tensor([[1.0], [0.0], [0.0], [0.0]]), m, torch.tensor([0, 0, 1, 1]))[:, 0]
    tensor([ 2., -2.,  0.,  0.])
    """
    s = scores(rewards, mask)
    alpha = s.shape[0] / torch.count_nonzero(s).clamp_min(1)
    return alpha * normalize(s, group_ids, std_scope="none", singleton=singleton)


@register("grpo_passk")
def grpo_passk(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, ddof: int = 1,
               std_scope: str = "group") -> Tensor:
    """Pass@k training (arXiv 2503.19595): only the best row of each group gets ``(s_max - s_2nd) / (sigma + eps)``.

    verl ``compute_grpo_passk_outcome_advantage`` (``std_scope="none"`` is its ``norm_adv_by_std_in_grpo=False``).
    On ties the advantage is 0 whichever row is picked.

    Raises:
        ValueError: a group with fewer than 2 rows.

    >>> m = torch.ones(3, 1, dtype=torch.bool)  # best 5, second 2, unbiased std 2.0817
    >>> grpo_passk(torch.tensor([[1.0], [5.0], [2.0]]), m, torch.zeros(3).long(), eps=0.0)[:, 0]
    tensor([0.0000, 1.4412, 0.0000])
    """
    s = scores(rewards, mask)
    inverse, k = group_index(group_ids)
    n = torch.zeros(k, device=s.device).index_add_(0, inverse, torch.ones_like(s, dtype=torch.float))
    if (n < 2).any():
        lone = group_ids[(n < 2)[inverse]].unique().tolist()
        raise ValueError(f"grpo_passk needs at least 2 rows per group; groups {lone} have 1")
    best = torch.full((k,), -torch.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, inverse, s, "amax")
    rows = torch.arange(s.shape[0], device=s.device)
    first = torch.full((k,), s.shape[0], device=s.device).scatter_reduce(
        0, inverse, torch.where(s == best[inverse], rows, s.shape[0]), "amin")
    winner = rows == first[inverse]
    second = torch.full_like(best, -torch.inf).scatter_reduce(0, inverse, torch.where(winner, -torch.inf, s), "amax")
    gap = s - second[inverse]
    std = spread(s, group_ids, std_scope, ddof)
    return torch.where(winner, gap if std is None else gap / (std + eps), 0.0)
