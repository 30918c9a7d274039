"""G²RPO's multi-granularity advantages (Granular GRPO, arXiv 2510.01982) and its rollout cost.

Notation: B rows (group members), K trained steps (one SDE step each, branched from a shared ODE anchor), C score
columns: one per (completion granularity g, reward model m); ``rewards [B, K, C]`` is the reward of the ODE completion
of row i's branch at step k, completed on the grid of granularity g and scored by model m.

``A[i, k] = sum_c (R[i, k, c] - mean_{g(i)} R[., k, c]) / (std_{g(i)} R[., k, c] + eps)``: each column normalised per
(prompt group, step) with the unbiased std and ``eps = 1e-8``, then summed (``bcmi/Granular-GRPO``
``fastvideo/train_g2rpo_hps.py`` ``train_one_step``, its ``hps_advantages + clip_advantages`` loop); the advantage
clip (5 in their script) applies to the sum. The authors normalise in float32, where a group of equal rewards gets
order-1 advantages from rounding over ``1e-8``; flowrl's estimators run in float64, where they stay ~1e-9.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.advantages.registry import compute


def granular_grpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, per_column: str = "step_grpo@g2rpo",
                  clip: Optional[float] = None, column_weights: Optional[Tensor] = None, **options: Any) -> Tensor:
    """The (weighted) sum over score columns of the per-(group, step) normalised rewards, clipped after the sum.

    Args:
        rewards: ``[B, K, C]`` (or ``[B, K]``: one column, which is ``per_column`` itself).
        mask: ``[B, K]`` bool; group_ids: ``[B]`` int.
        per_column: the step estimator or preset normalising each column (``step_grpo@g2rpo``: unbiased std, +1e-8).
        clip: clamp the summed advantage to ``[-clip, clip]`` (None: no clip).
        column_weights: ``[C]`` each column's weight in the sum (None: 1 each, the authors').
        **options: overrides of ``per_column``'s options.
    Returns:
        ``[B, K]``, zero where ``mask`` is 0.

    Two members, one step, columns (g = 1, g = 2): each column normalises to -/+ 1 / sqrt(2) (unbiased std of two
    values is |a - b| / sqrt(2)), so the sum is -/+ sqrt(2):

    >>> import torch
    >>> r = torch.tensor([[[1.0, 5.0]], [[3.0, 6.0]]])
    >>> granular_grpo(r, torch.ones(2, 1, dtype=torch.bool), torch.tensor([0, 0]))
    tensor([[-1.4142],
            [ 1.4142]])
    """
    table = rewards[..., None] if rewards.ndim == 2 else rewards
    if table.ndim != 3 or table.shape[:2] != mask.shape:
        raise ValueError(f"rewards must be [B, K, C] over mask [B, K] = {tuple(mask.shape)}; got "
                         f"{tuple(rewards.shape)}")
    weights = [1.0] * table.shape[-1] if column_weights is None else column_weights.tolist()
    total = sum(w * compute(per_column, table[..., c], mask, group_ids, **options) for c, w in enumerate(weights))
    return total if clip is None else total.clamp(-clip, clip)


def granular_leaf_advantages(scores: dict[str, Tensor], weights: dict[str, float], mask: Tensor,
                             granularity: Tensor, branch_ids: Tensor, group_ids: Tensor, valid: Tensor,
                             **options: Any) -> tuple[Tensor, Tensor]:
    """:func:`granular_grpo` on a tree's leaves: a leaf is one (branch, granularity) completion, scored by each reward.

    The leaves of one branch (the same ``branch_ids`` at its one trained step, in one group) become a row of the
    table, each (granularity, reward) a column weighted by the reward's weight; every leaf of the branch gets the
    branch's advantage at its trained step (the loop trains the shared edge once).

    Args:
        scores: ``{reward: [L]}``; weights: ``{reward: w}``. mask: ``[L, T]`` bool, one trained step per leaf (rows
            with none get 0). granularity, group_ids: ``[L]`` long; branch_ids: ``[L, T]`` (tree node ids).
        valid: ``[L]`` bool, leaves with a valid reward. **options: :func:`granular_grpo`'s.
    Returns:
        advantages ``[L, T]`` and ``[L]`` whether the leaf's branch has every column finite and every leaf valid
        (a branch without is left out of the statistics and gets 0).

    One branch per member, two members, granularities 1 and 2, one reward: the columns' sum, per member:

    >>> mask = torch.tensor([[True, False]] * 4)
    >>> a, ok = granular_leaf_advantages({"r": torch.tensor([1.0, 5.0, 3.0, 6.0])}, {"r": 1.0}, mask,
    ...     torch.tensor([1, 2, 1, 2]), torch.tensor([[7, 7], [7, 7], [8, 8], [8, 8]]), torch.zeros(4).long(),
    ...     torch.ones(4, dtype=torch.bool))
    >>> a[:, 0], ok.tolist()  # as granular_grpo's example: -/+ sqrt(2)
    (tensor([-1.4142, -1.4142,  1.4142,  1.4142]), [True, True, True, True])
    """
    steps, trained = mask.float().argmax(1), mask.any(1)  # [L] the one trained step
    leaf_rows = torch.arange(len(steps), device=mask.device)
    keys = torch.stack([group_ids.long(), branch_ids[leaf_rows, steps].long(), steps], 1)
    _, branch = torch.unique(keys, dim=0, return_inverse=True)  # [L] the leaf's branch
    grains, column = torch.unique(granularity, return_inverse=True)
    names, n = list(scores), int(branch.max()) + 1 if len(branch) else 0
    table = torch.full((n, mask.shape[1], len(grains) * len(names)), float("nan"), dtype=torch.float64)
    for m, name in enumerate(names):
        table[branch, steps, column * len(names) + m] = scores[name].double().cpu()
    ok_leaf = (valid & trained & torch.stack([torch.isfinite(s) for s in scores.values()]).all(0)).cpu()
    ok = torch.ones(n, dtype=torch.bool).scatter_reduce(0, branch.cpu(), ok_leaf, "amin")
    branch_steps = torch.zeros(n, dtype=torch.long).scatter(0, branch.cpu(), steps.cpu())
    ok &= torch.isfinite(table[torch.arange(n), branch_steps]).all(-1)
    branch_mask = torch.zeros(n, mask.shape[1], dtype=torch.bool)
    branch_mask[torch.arange(n), branch_steps] = ok
    branch_groups = torch.zeros(n, dtype=torch.long).scatter(0, branch.cpu(), group_ids.long().cpu())
    column_weights = torch.tensor([weights[name] for name in names] * len(grains), dtype=torch.float64)
    advantages = granular_grpo(table.nan_to_num(0.0), branch_mask, branch_groups, column_weights=column_weights,
                               **options)
    return (advantages[branch.cpu()] * mask.cpu()).to(mask.device).float(), ok[branch.cpu()].to(mask.device)


def granular_evaluations(num_steps: int, group_size: int, trained_steps: list[int], granularities: list[int],
                         shared_anchor: bool = False) -> int:
    """Model evaluations per prompt: the shared ODE anchor's ``T``, then per member and trained step ``k`` one SDE
    step and, per granularity ``g``, an ODE completion of ``ceil((T - 1 - k) / g)`` steps (the grid
    ``sigma[:k + 2] ++ sigma[k + 2::g]``): ``T + G sum_k (1 + sum_g ceil((T - 1 - k) / g))``, the authors' count.

    ``shared_anchor``: flowrl's rollout, where the members' SDE steps reuse the anchor's model output at its state
    (the same input: one evaluation per ``k``, not ``G``) and the anchor stops at the last trained step:
    ``max(k) + 1 + G sum_k sum_g ceil((T - 1 - k) / g)``.

    The published setting (``scripts/finetune/finetune_g2rpo_hps.sh``: T = 16, G = 12, steps 0..7, g in {1, 2}):
    the sum over k is 24 + 22 + 21 + 19 + 18 + 16 + 15 + 13 = 148, so 16 + 12 * 148 = 1792; sharing the anchor
    saves its 8 unused steps and 12 x 8 member evaluations: 1792 - 8 - 96 = 1688.

    >>> granular_evaluations(16, 12, list(range(8)), [1, 2]), granular_evaluations(16, 12, list(range(8)), [1, 2], True)
    (1792, 1688)
    """
    if not all(0 <= k < num_steps - 1 for k in trained_steps) or not all(g >= 1 for g in granularities):
        raise ValueError(f"trained_steps {trained_steps} must lie in [0, T - 1) = [0, {num_steps - 1}) and "
                         f"granularities {granularities} be >= 1")
    own = 0 if shared_anchor else 1  # a member's SDE step evaluates the anchor state again (the authors' loop)
    per_member = sum(own + sum(math.ceil((num_steps - 1 - k) / g) for g in granularities) for k in trained_steps)
    return (max(trained_steps) + 1 if shared_anchor else num_steps) + group_size * per_member
