"""Step-level estimators: advantages that differ between the positions of a row, from per-step rewards, step
groups, strata or process rewards. The diffusion methods use these with T = denoising steps.

Notation: ``x[i, t]`` per-position values, ``g(i)`` group, ``s_i`` row score, ``A^E_i`` the episode (GRPO)
advantage of row i with the same ``eps`` / ``ddof`` / ``std_scope`` / ``singleton``. ``step_group_ids`` are scoped
within a group: the key of position (i, t) is ``(g(i), step_group_ids[i, t])``, so ids may repeat across groups.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.advantages.primitives import at_positions, discounted_returns, normalize, scores
from flowrl.advantages.registry import register


@register("step_grpo")
def step_grpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, eps: float = 1e-6, ddof: int = 1,
              std_scope: str = "group", singleton: str = "raw", gamma: float | None = None) -> Tensor:
    """Per-step group normalisation: ``A[i, t] = (x[i, t] - mean_{g(i), t} x) / (std + eps)``.

    DenseGRPO (dense step rewards ``r_t = R(x0_hat(t-1)) - R(x0_hat(t))`` normalised across the group at each
    timestep), TP-GRPO (incremental step rewards). Means over the valid rows of ``(group, step)``.

    Args:
        gamma: None normalises the step rewards themselves (``x = rewards``, DenseGRPO); a number first turns them
            into discounted returns-to-go (``x = G``, holes skipped), so an outcome-only reward gives GRPO.
        std_scope: ``group`` (per (group, step)), ``batch`` (per step over all groups), ``global`` (all valid
            entries), ``none``. Other options as ``grpo``.

    >>> r = torch.tensor([[0.1, 0.0], [-0.1, 0.4], [0.3, 0.2]]); m = torch.ones(3, 2, dtype=torch.bool)
    >>> step_grpo(r, m, torch.tensor([0, 0, 1]), eps=0.0, ddof=0).tolist()  # group 1 is a singleton: raw
    [[1.0, -1.0], [-1.0, 1.0], [0.30000001192092896, 0.20000000298023224]]
    """
    x = rewards if gamma is None else discounted_returns(rewards, mask, gamma, holes="skip")
    rows, steps = mask.nonzero(as_tuple=True)
    adv = normalize(x[rows, steps], torch.stack([group_ids[rows], steps], dim=1), std_scope=std_scope, eps=eps,
                    ddof=ddof, singleton=singleton, batch_keys=steps)
    return at_positions(adv, mask, rows, steps)


@register("gigpo")
def gigpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, step_group_ids: Tensor, eps: float = 1e-6,
          ddof: int = 1, std_scope: str = "group", singleton: str = "raw", weight: float = 1.0,
          gamma: float = 1.0) -> Tensor:
    """GiGPO (arXiv 2505.10978): ``A[i, t] = A^E_i + weight * A^S[i, t]``.

    ``A^S`` normalises the discounted return-to-go ``G[i, t]`` (holes skipped) within its step group (anchor
    state; for flow models a shared latent or tree node). A step group of one, or an id < 0, gets ``A^S = 0``, so
    with no shared states GiGPO is GRPO. verl-agent ``gigpo/core_gigpo.py::compute_gigpo_outcome_advantage``:
    its default ``mode="mean_norm"`` is ``std_scope="none"``, ``mean_std_norm`` is ``group`` (eps 1e-6, unbiased).

    Args:
        step_group_ids: ``[B, T]`` int, the step group of each position (scoped within the row's group).
        weight: ``omega``, the step advantage's weight (verl-agent ``step_advantage_w``). gamma: return discount.
        std_scope: for both levels; ``batch`` / ``global`` divide by the std of all rows (episode) and of all
            grouped entries (step). Other options as ``grpo``.
    """
    episode = normalize(scores(rewards, mask), group_ids, std_scope=std_scope, eps=eps, ddof=ddof,
                        singleton=singleton)
    rows, steps = (mask & (step_group_ids >= 0)).nonzero(as_tuple=True)
    returns = discounted_returns(rewards, mask, gamma, holes="skip")
    keys = torch.stack([group_ids[rows], step_group_ids[rows, steps]], dim=1)
    step = normalize(returns[rows, steps], keys, std_scope=std_scope, eps=eps, ddof=ddof, singleton="zero")
    return episode[:, None] + weight * at_positions(step, mask, rows, steps)


@register("stratified_grpo")
def stratified_grpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, stratum_ids: Tensor, eps: float = 1e-6,
                    ddof: int = 1, std_scope: str = "group", singleton: str = "raw", alpha: float = 1.0) -> Tensor:
    """Stratified GRPO (arXiv 2510.06214): ``A_i = alpha * A^SAN_i + (1 - alpha) * A^GN_i``.

    ``A^SAN`` normalises within (group, stratum) (strata: trajectory structure for search agents; sampler
    configuration in mixed-sampler diffusion training); ``A^GN`` is plain GRPO over the group. Options as ``grpo``.

    >>> m = torch.ones(4, 1, dtype=torch.bool); r = torch.tensor([[1.0], [3.0], [10.0], [14.0]])
    >>> stratified_grpo(r, m, torch.zeros(4).long(), stratum_ids=torch.tensor([0, 0, 1, 1]), eps=0.0)[:, 0]
    tensor([-0.7071,  0.7071, -0.7071,  0.7071])
    """
    s = scores(rewards, mask)
    options = dict(std_scope=std_scope, eps=eps, ddof=ddof, singleton=singleton)
    san = normalize(s, torch.stack([group_ids, stratum_ids], dim=1), **options)
    return alpha * san + (1 - alpha) * normalize(s, group_ids, **options)


@register("prime")
def prime(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, process_rewards: Tensor, eps: float = 1e-6,
          ddof: int = 1, std_scope: str = "group", singleton: str = "raw", alpha: float = 1.0,
          gamma: float | None = None) -> Tensor:
    """Process + outcome: ``A[i, t] = A^E_i + alpha * A^P[i, t]`` (PRIME arXiv 2502.01456, OPRL).

    ``A^P`` normalises the process rewards over every valid step of the group (all steps of all its rows
    pooled); with ``gamma`` set it is then accumulated into a discounted return-to-go (PRIME accumulates with
    gamma = 1). verl-recipe ``prime/prime_core_algos.py::compute_rloo_advantage_return`` instead takes RLOO per
    source, sums the sources, accumulates and whitens; this is the OPRL-style combination with explicit options.

    Args:
        process_rewards: ``[B, T]`` per-step rewards, e.g. an implicit PRM ``beta * (log pi - log pi_ref)``.
        alpha: weight of the process advantage. Other options as ``grpo``.
    """
    options = dict(std_scope=std_scope, eps=eps, ddof=ddof, singleton=singleton)
    episode = normalize(scores(rewards, mask), group_ids, **options)
    rows, steps = mask.nonzero(as_tuple=True)
    process = at_positions(normalize(process_rewards[rows, steps], group_ids[rows], **options), mask, rows, steps)
    if gamma is not None:
        process = discounted_returns(process, mask, gamma, holes="skip")
    return episode[:, None] + alpha * process
