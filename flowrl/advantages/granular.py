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
from typing import Optional

from torch import Tensor

from flowrl.advantages.registry import compute


def granular_grpo(rewards: Tensor, mask: Tensor, group_ids: Tensor, *, per_column: str = "step_grpo@g2rpo",
                  clip: Optional[float] = None) -> Tensor:
    """The sum over score columns of the per-(group, step) normalised rewards, clipped after the sum.

    Args:
        rewards: ``[B, K, C]`` (or ``[B, K]``: one column, which is ``per_column`` itself).
        mask: ``[B, K]`` bool; group_ids: ``[B]`` int.
        per_column: the step estimator or preset normalising each column (``step_grpo@g2rpo``: unbiased std, +1e-8).
        clip: clamp the summed advantage to ``[-clip, clip]`` (None: no clip).
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
    total = sum(compute(per_column, table[..., c], mask, group_ids) for c in range(table.shape[-1]))
    return total if clip is None else total.clamp(-clip, clip)


def granular_evaluations(num_steps: int, group_size: int, trained_steps: list[int], granularities: list[int]) -> int:
    """Model evaluations per prompt: the shared ODE anchor's ``T``, then per member and trained step ``k`` one SDE
    step and, per granularity ``g``, an ODE completion of ``ceil((T - 1 - k) / g)`` steps (the grid
    ``sigma[:k + 2] ++ sigma[k + 2::g]``): ``T + G sum_k (1 + sum_g ceil((T - 1 - k) / g))``.

    The published setting (``scripts/finetune/finetune_g2rpo_hps.sh``: T = 16, G = 12, steps 0..7, g in {1, 2}):
    the sum over k is 24 + 22 + 21 + 19 + 18 + 16 + 15 + 13 = 148, so 16 + 12 * 148 = 1792.

    >>> granular_evaluations(16, 12, list(range(8)), [1, 2])
    1792
    """
    if not all(0 <= k < num_steps - 1 for k in trained_steps) or not all(g >= 1 for g in granularities):
        raise ValueError(f"trained_steps {trained_steps} must lie in [0, T - 1) = [0, {num_steps - 1}) and "
                         f"granularities {granularities} be >= 1")
    per_member = sum(1 + sum(math.ceil((num_steps - 1 - k) / g) for g in granularities) for k in trained_steps)
    return num_steps + group_size * per_member
