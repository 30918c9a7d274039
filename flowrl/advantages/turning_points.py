"""TP-GRPO's step rewards (TurningPoint-GRPO, arXiv 2602.06422): incremental rewards, turning points, balancing.

Inside an SDE window of ``n`` steps a trajectory has ``n + 1`` rewards ``R [B, n+1]``: ``R_0`` of the ODE completion
of the latent at the window start, ``R_j`` of the completion after ``j`` SDE steps, ``R_n`` of the final image.

- incremental reward of window step ``j``: ``d_j = R_{j+1} - R_j`` (paper Eq. 7);
- trend ``g = R_n - R_0``; aggregated reward ``agg_j = R_n - R_j`` (Eq. 8, ``= sum_{i >= j} d_i``);
- turning point at ``j >= 1`` (Def. 4.1): ``sign(d_{j-1}) sign(g) < 0`` and ``sign(d_j) sign(g) > 0``, i.e. the step
  turns the local trend into the global one; with the Def. 5.1 constraint also ``sign(d_j) sign(R_n - R_{j+1}) > 0``
  (what follows the step agrees with it). First step ``j = 0`` (Sec. 5.3): ``consistent`` rule
  ``sign(d_0) sign(R_n - R_1) > 0``, ``plain`` rule ``sign(d_0) sign(g) > 0``, or ``none``;
- a turning point's step reward is ``agg_j``, every other step's ``d_j``;
- balancing (App. D): over a sampling batch, when both positive and negative turning-point rewards exist, only
  ``min(#pos, #neg)`` of each stay turning points, the largest by ``|agg_j|``; the others revert to ``d_j``.

All functions are pure tensor functions; signs use ``torch.sign`` (an exact zero is neither sign).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

FIRST_STEP_RULES = ("consistent", "plain", "none")


def incremental_rewards(rewards: Tensor) -> Tensor:
    """``d [B, n]``: ``d_j = R_{j+1} - R_j``.

    >>> incremental_rewards(torch.tensor([[0.0, 1.0, 3.0]])).tolist()
    [[1.0, 2.0]]
    """
    return rewards[:, 1:] - rewards[:, :-1]


def aggregated_rewards(rewards: Tensor) -> Tensor:
    """``agg [B, n]``: ``agg_j = R_n - R_j``, the long-term effect of step ``j`` and everything after it.

    >>> aggregated_rewards(torch.tensor([[0.0, 1.0, 3.0]])).tolist()
    [[3.0, 2.0]]
    """
    return rewards[:, -1:] - rewards[:, :-1]


def turning_points(rewards: Tensor, constraint: bool = True, first_step: str = "consistent") -> Tensor:
    """Which window steps are turning points ``[B, n]`` bool.

    Args:
        rewards: ``R [B, n+1]``, ``n >= 1``.
        constraint: the Def. 5.1 condition ``sign(d_j) sign(R_n - R_{j+1}) > 0`` on steps ``j >= 1`` (it rules out
            the last step, whose ``R_n - R_n`` is 0).
        first_step: the rule for ``j = 0``: ``consistent``, ``plain`` or ``none`` (never a turning point).

    >>> turning_points(torch.tensor([[0.50, 0.45, 0.60, 0.55, 0.70]])).tolist()
    [[False, True, False, False]]
    """
    if first_step not in FIRST_STEP_RULES:
        raise ValueError(f"first_step={first_step!r}: choose one of {list(FIRST_STEP_RULES)}")
    if rewards.ndim != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [B, n+1] with n >= 1 window steps; got {tuple(rewards.shape)}")
    d = torch.sign(incremental_rewards(rewards))
    trend = torch.sign(rewards[:, -1:] - rewards[:, :1])  # [B, 1]
    after = torch.sign(rewards[:, -1:] - rewards[:, 1:])  # sign(R_n - R_{j+1}) [B, n]
    agrees = d * trend  # s_j
    tp = torch.zeros_like(d, dtype=torch.bool)
    tp[:, 1:] = (agrees[:, :-1] < 0) & (agrees[:, 1:] > 0)
    if constraint:
        tp[:, 1:] &= d[:, 1:] * after[:, 1:] > 0
    if first_step == "consistent":
        tp[:, 0] = d[:, 0] * after[:, 0] > 0
    elif first_step == "plain":
        tp[:, 0] = agrees[:, 0] > 0
    return tp


def balance(tp: Tensor, agg: Tensor) -> Tensor:
    """Keep ``min(#pos, #neg)`` positive and as many negative turning points, the largest by ``|agg|``.

    Applies only when both signs occur; a turning point whose ``agg`` is exactly 0 is neither and stays. Ties in
    ``|agg|`` go to the earlier position in row-major order (the batch order), so the result is deterministic.

    Args:
        tp: ``[B, n]`` bool turning points. agg: ``[B, n]`` aggregated rewards.
    Returns:
        ``[B, n]`` bool, the turning points that keep ``agg`` as their reward.

    >>> balance(torch.tensor([[True, True, True]]), torch.tensor([[0.3, -0.1, 0.5]])).tolist()
    [[False, True, True]]
    """
    flat_tp, flat_agg = tp.flatten(), agg.flatten()
    keep = flat_tp.clone()
    pos, neg = flat_tp & (flat_agg > 0), flat_tp & (flat_agg < 0)
    quota = min(int(pos.sum()), int(neg.sum()))
    if quota == 0:
        return tp.clone()
    for side in (pos, neg):
        index = side.nonzero().squeeze(1)
        order = torch.sort(flat_agg[index].abs(), descending=True, stable=True).indices
        keep[index[order[quota:]]] = False
    return keep.view_as(tp)


def tp_step_rewards(rewards: Tensor, constraint: bool = True, first_step: str = "consistent",
                    balanced: bool = True, valid: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """TP-GRPO's step rewards ``[B, n]`` and the turning points that received ``agg_j`` ``[B, n]`` bool.

    Args:
        rewards: ``R [B, n+1]`` for the whole sampling batch (balancing counts over every row).
        constraint, first_step: see :func:`turning_points`. balanced: apply :func:`balance` over the batch.
        valid: ``[B]`` bool, rows that take part (others get no turning point; their rewards are returned as
            computed, for the caller to drop). None: rows whose rewards are all finite.

    >>> r, tp = tp_step_rewards(torch.tensor([[0.30, 0.40, 0.35, 0.50, 0.52]]))
    >>> [round(x, 2) for x in r[0].tolist()], tp[0].tolist()
    ([0.22, -0.05, 0.17, 0.02], [True, False, True, False])
    """
    step, tp, _ = turning_point_credit(rewards, constraint, first_step, balanced, valid)
    return step, tp


def turning_point_credit(rewards: Tensor, constraint: bool = True, first_step: str = "consistent",
                         balanced: bool = True, valid: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`tp_step_rewards`, and the turning points before balancing ``[B, n]`` (for the diagnostics).

    >>> rewards = torch.tensor([[0.3, 0.4, 0.35, 0.5, 0.52], [0.5, 0.6, 0.4, 0.45, 0.3]])  # row 1: TPs at j = 0, 2
    >>> _, tp, unbalanced = turning_point_credit(rewards)  # row 2: j = 1 (agg -0.3); one of each sign stays
    >>> tp.sum().item(), unbalanced.sum().item()
    (2, 3)
    """
    d, agg = incremental_rewards(rewards), aggregated_rewards(rewards)
    unbalanced = turning_points(rewards, constraint, first_step)
    valid = torch.isfinite(rewards).all(1) if valid is None else valid.bool()
    unbalanced &= valid[:, None]
    tp = balance(unbalanced, agg) if balanced else unbalanced
    return torch.where(tp, agg, d), tp, unbalanced
