"""Tensor primitives every estimator composes: row scores, keyed group statistics, normalisation with an explicit
std scope, masked whitening, discounted returns and GAE.

Notation: ``N`` entries being normalised (rows for outcome estimators, valid (row, step) pairs for step-level
ones); ``keys [N]`` or ``[N, k]`` integer tensors, entries with equal keys form one group. Statistics run in
float64 so long groups and large rewards do not lose digits.

What the std scopes mean (the same for every estimator that takes ``std_scope``):

- ``group``: the std of the entries sharing the mean's key (a prompt group; a (group, step) pair; a step group).
- ``batch``: the std over every group of the batch, keeping the non-group part of the key: for outcome
  estimators the std of all row scores (TRL ``scale_rewards="batch"``, flow_grpo ``global_std``); for
  ``step_grpo`` the std of all rows at the same step; for ``tree`` all nodes at the same depth.
- ``global``: the std over every entry normalised (all row scores; all valid (row, step) entries). For outcome
  estimators ``batch`` and ``global`` coincide.
- ``none``: no division (Dr.GRPO).
"""

from __future__ import annotations

import torch
from torch import Tensor

STD_SCOPES = ("group", "batch", "global", "none")
SINGLETONS = ("raw", "zero")


def scores(rewards: Tensor, mask: Tensor) -> Tensor:
    """Per-row outcome ``[B]``: the sum of ``rewards [B, T]`` over valid positions.

    verl sums over every position; the two agree because verl's rewards are 0 at padding. Values at masked
    positions never count, not even a NaN.

    >>> scores(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[True, False], [True, True]])).tolist()
    [1.0, 7.0]
    """
    return torch.where(mask, rewards, 0.0).sum(dim=1)


def group_index(keys: Tensor) -> tuple[Tensor, int]:
    """Dense group index ``[N]`` in ``0..K-1`` for integer ``keys [N]`` or ``[N, k]``, and ``K``.

    >>> group_index(torch.tensor([[7, 0], [7, 1], [7, 0]]))
    (tensor([0, 1, 0]), 2)
    """
    _, inverse = torch.unique(keys, dim=0 if keys.ndim > 1 else None, return_inverse=True)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def group_stats(x: Tensor, keys: Tensor, ddof: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Per-entry group mean, group std and group size of ``x [N]``; std is 0 where a group has ``<= ddof`` entries.

    >>> m, s, n = group_stats(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]))
    >>> m.tolist(), s.tolist(), n.tolist()
    ([2.0, 2.0, 5.0], [1.0, 1.0, 0.0], [2.0, 2.0, 1.0])
    """
    inverse, k = group_index(keys)
    x = x.double()
    count = torch.zeros(k, dtype=x.dtype, device=x.device).index_add_(0, inverse, torch.ones_like(x))
    mean = torch.zeros_like(count).index_add_(0, inverse, x) / count
    sq = torch.zeros_like(count).index_add_(0, inverse, (x - mean[inverse]) ** 2)
    var = torch.where(count > ddof, sq / (count - ddof).clamp_min(1), torch.zeros_like(sq))
    return mean[inverse], var.sqrt()[inverse], count[inverse]


def spread(x: Tensor, keys: Tensor, std_scope: str, ddof: int, batch_keys: Tensor | None = None) -> Tensor | None:
    """The std ``[N]`` each entry of ``x`` is divided by under ``std_scope`` (None for ``none``).

    Args:
        x: ``[N]`` values. keys: ``[N]`` or ``[N, k]`` the group of each entry (``group`` scope).
        std_scope: one of ``group``, ``batch``, ``global``, ``none`` (see the module docstring).
        ddof: 0 (population std) or 1 (unbiased).
        batch_keys: ``[N]`` the non-group part of the key pooled over groups for ``batch`` (None: all entries).
    """
    if std_scope == "none":
        return None
    if std_scope == "group":
        return group_stats(x, keys, ddof)[1]
    everything = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    pooled = batch_keys if std_scope == "batch" and batch_keys is not None else everything
    return group_stats(x, pooled, ddof)[1]


def normalize(x: Tensor, keys: Tensor, *, std_scope: str = "group", eps: float = 1e-6, ddof: int = 1,
              singleton: str = "raw", batch_keys: Tensor | None = None) -> Tensor:
    """``(x - mean_key) / (std + eps)``, the group-relative normalisation of every GRPO-family estimator.

    Args:
        x: ``[N]`` values. keys: ``[N]`` or ``[N, k]``: the mean is taken over entries with equal keys.
        std_scope, ddof, batch_keys: which std divides (see ``spread``). eps: added to that std.
        singleton: what an entry alone in its group gets: ``raw`` (mean 0 and std 1, as verl: ``x / (1 + eps)``,
            or ``x`` without division) or ``zero``.
    Returns:
        ``[N]`` float64. A group whose std plus ``eps`` is exactly 0 (tied values, ``eps=0``) gets 0.

    >>> normalize(torch.tensor([1.0, 2.0, 3.0, 4.0, 7.0]), torch.tensor([0, 0, 0, 0, 1]), eps=0.0, ddof=0).tolist()
    [-1.3416407864998738, -0.4472135954999579, 0.4472135954999579, 1.3416407864998738, 7.0]
    """
    mean, _, count = group_stats(x, keys, ddof)
    x = x.double()
    std = spread(x, keys, std_scope, ddof, batch_keys)
    if std is None:
        out, raw = x - mean, x
    else:
        denom = std + eps
        out = torch.where(denom > 0, (x - mean) / torch.where(denom > 0, denom, 1.0), 0.0)
        raw = x / (1.0 + eps)
    lone = raw if singleton == "raw" else torch.zeros_like(x)
    return torch.where(count == 1, lone, out)


def at_positions(values: Tensor, mask: Tensor, rows: Tensor, steps: Tensor) -> Tensor:
    """``[B, T]`` holding ``values [N]`` at positions ``(rows, steps)`` and 0 elsewhere (the inverse of
    ``x[mask.nonzero(as_tuple=True)]``).

    >>> m = torch.tensor([[True, False], [False, True]])
    >>> at_positions(torch.tensor([1.0, 2.0]), m, *m.nonzero(as_tuple=True)).tolist()
    [[1.0, 0.0], [0.0, 2.0]]
    """
    out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    out[rows, steps] = values
    return out


def masked_whiten(x: Tensor, mask: Tensor, ddof: int = 1, eps: float = 1e-8) -> Tensor:
    """``(x - mean) * rsqrt(var + eps)`` over the valid entries of ``x [B, T]``; 0 where ``mask`` is 0.

    verl ``torch_functional.masked_whiten`` with ``ddof=1``, except that flowrl zeroes masked entries (verl
    leaves whitened values there; the loss masks them anyway).

    Raises:
        ValueError: fewer than ``ddof + 1`` valid entries (verl divides by zero there).

    >>> masked_whiten(torch.tensor([[1.0, 3.0, 9.0]]), torch.tensor([[True, True, False]]), eps=0.0).tolist()
    [[-0.7071067811865475, 0.7071067811865475, 0.0]]
    """
    n = mask.sum()
    if n <= ddof:
        raise ValueError(f"whitening needs more than ddof={ddof} valid positions in the batch; got {int(n)}: "
                         "use a larger batch or ddof=0")
    x = torch.where(mask, x.double(), 0.0)
    mean = x.sum() / n
    var = torch.where(mask, (x - mean) ** 2, 0.0).sum() / (n - ddof)
    return torch.where(mask, (x - mean) * torch.rsqrt(var + eps), 0.0)


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float = 1.0, holes: str = "skip") -> Tensor:
    """Return-to-go ``G_t = r_t + gamma * G_next`` over ``rewards [B, T]``; 0 where ``mask`` is 0.

    Args:
        holes: what a masked position inside a row does. ``skip``: it is transparent: its reward is ignored and
            ``G_next`` is the return of the next valid position, undiscounted across the hole (verl GAE, verl
            ReMax's masked cumsum). ``reset``: the return flowing backwards stops there (verl REINFORCE++).
            With right padding only, the two agree.

    >>> r = torch.tensor([[1.0, 5.0, 2.0]]); m = torch.tensor([[True, False, True]])
    >>> discounted_returns(r, m, 0.5, "skip").tolist(), discounted_returns(r, m, 0.5, "reset").tolist()
    ([[2.0, 0.0, 2.0]], [[1.0, 0.0, 2.0]])
    """
    if holes not in ("skip", "reset"):
        raise ValueError(f"holes={holes!r}: choose 'skip' or 'reset'")
    rewards = rewards.double()
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        g = rewards[:, t] + gamma * running
        running = torch.where(mask[:, t], g, running if holes == "skip" else torch.zeros_like(g))
        out[:, t] = torch.where(mask[:, t], g, 0.0)
    return out


def generalized_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0,
                           lam: float = 1.0) -> Tensor:
    """Unwhitened GAE ``A_t = delta_t + gamma * lam * A_next``, ``delta_t = r_t + gamma * V_next - V_t``.

    Masked positions are skipped as in verl ``compute_gae_advantage_return``: ``V_next`` and ``A_next`` come from
    the next valid position. ``A + values`` are the critic's returns. 0 where ``mask`` is 0.

    >>> r = torch.tensor([[0.0, 1.0]]); v = torch.tensor([[0.5, 0.25]]); m = torch.ones(1, 2, dtype=torch.bool)
    >>> generalized_advantages(r, v, m, gamma=1.0, lam=0.5).tolist()  # A1 = 1 - .25; A0 = (.25 - .5) + .5 * .75
    [[0.125, 0.75]]
    """
    rewards, values = rewards.double(), values.double()
    out = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        adv = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, adv, next_adv)
        out[:, t] = torch.where(valid, adv, 0.0)
    return out
