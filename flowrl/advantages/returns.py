"""Return-based estimators: advantages from per-position returns-to-go rather than one score per row (GAE,
REINFORCE++, ReMax), whitened over the valid positions of the whole batch where the peer does so.

Notation: ``r_t`` rewards, ``m_t`` mask, ``G_t`` return-to-go, ``V_t`` critic values. Whitening is verl's
``masked_whiten``: ``(x - mean) * rsqrt(var + eps)`` with mean and variance over every valid position of the batch
(unbiased with ``ddof=1``), so long rows weigh more. verl leaves whitened values at masked positions; flowrl
zeroes them (the loss masks them anyway).
"""

from __future__ import annotations

from torch import Tensor

from flowrl.advantages.primitives import (discounted_returns, generalized_advantages, masked_whiten, normalize,
                                          scores)
from flowrl.advantages.registry import register


@register("gae")
def gae(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, values: Tensor, gamma: float = 1.0, lam: float = 1.0,
        eps: float = 1e-8, ddof: int = 1) -> Tensor:
    """GAE (arXiv 1506.02438), whitened: verl ``compute_gae_advantage_return`` (defaults gamma = lam = 1).

    Masked positions are skipped: ``V_next`` and ``A_next`` come from the next valid position (see
    ``primitives.generalized_advantages``). ``group_ids`` is unused.

    >>> import torch; m = torch.ones(2, 2, dtype=torch.bool); v = torch.zeros(2, 2)
    >>> gae(torch.tensor([[0.0, 1.0], [0.0, 3.0]]), m, torch.zeros(2).long(), values=v).tolist()
    [[-0.8660253882408142, -0.8660253882408142], [0.8660253882408142, 0.8660253882408142]]
    """
    return masked_whiten(generalized_advantages(rewards, values, mask, gamma, lam), mask, ddof, eps)


@register("reinforce_plus_plus")
def reinforce_plus_plus(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, gamma: float = 1.0,
                        eps: float = 1e-8, ddof: int = 1) -> Tensor:
    """REINFORCE++ (arXiv 2501.03262): whitened discounted return ``G_t = r_t + gamma * m_{t+1} * G_{t+1}``.

    verl ``compute_reinforce_plus_plus_outcome_advantage``: a masked position resets the return flowing
    backwards (``holes="reset"``). ``group_ids`` is unused.
    """
    return masked_whiten(discounted_returns(rewards, mask, gamma, holes="reset"), mask, ddof, eps)


@register("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, eps: float = 1e-8,
                                 ddof: int = 1, singleton: str = "raw") -> Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262): ``s_i - mu_g`` on every valid position, then whitened.

    verl ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (a singleton has mean 0: ``raw``).
    """
    centered = normalize(scores(rewards, mask), group_ids, std_scope="none", singleton=singleton)
    return masked_whiten(centered[:, None].expand_as(rewards), mask, ddof, eps)


@register("remax")
def remax(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, baselines: Tensor) -> Tensor:
    """ReMax (arXiv 2310.10505): ``A_t = sum_{k >= t} r_k m_k - b_i``.

    verl ``compute_remax_outcome_advantage``; ``b_i`` is the reward of a greedy decode (LLM) or a deterministic
    ODE sample (flow models) of row i's prompt. ``group_ids`` is unused.

    >>> import torch; r = torch.tensor([[1.0, 2.0]]); m = torch.ones(1, 2, dtype=torch.bool)
    >>> remax(r, m, torch.zeros(1).long(), baselines=torch.tensor([0.5])).tolist()
    [[2.5, 1.5]]
    """
    return discounted_returns(rewards, mask, 1.0, holes="skip") - baselines[:, None]
