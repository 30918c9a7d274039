"""Combining the scores of several reward callbacks into one reward per sample.

Modes (the method's ``reward_aggregation`` option):

- ``sum`` (the default): the weighted raw sum ``sum_k w_k r_k``.
- ``advantage_sum``: each reward normalised within its group, ``(r_k - mean_g(r_k)) / (std_g(r_k) + eps)``, then
  the weighted sum; rewards on different scales then weigh by ``w_k`` alone.
- ``gdpo``: GDPO (arXiv 2601.05242, Sec. 3): the ``advantage_sum`` value, then normalised over the whole batch,
  ``(A - mean_batch(A)) / (std_batch(A) + eps)``. Defaults follow the authors' TRL implementation
  (NVlabs/GDPO ``grpo_trainer.py``): unbiased std (``ddof=1``) and ``eps=1e-4`` at both stages.

The result is the reward the advantage estimator sees: its group mean is already 0 for the two normalising modes,
so ``gdpo`` with ``advantage: grpo`` and ``advantage_options: {std_scope: none}`` is GDPO exactly.

A sample whose score from any reward is NaN or inf is invalid: it is left out of every statistic here, of the
group statistics of the estimator and of the loss, and counted in the logs; it is never turned into a zero
reward. The caller passes the batch gathered from every rank, so statistics are global.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from flowrl.advantages import group_stats


def weighted_sum(scores: dict[str, Tensor], weights: dict[str, float]) -> tuple[Tensor, Tensor]:
    """Total reward ``[B]`` and validity ``[B]`` bool; invalid rows hold 0 in the total.

    >>> total, ok = weighted_sum({"a": torch.tensor([1.0, float("nan")]), "b": torch.tensor([2.0, 3.0])},
    ...                          {"a": 1.0, "b": 0.5})
    >>> total.tolist(), ok.tolist()
    ([2.0, 0.0], [True, False])
    """
    if not scores:
        raise ValueError("no reward scores to combine: add a reward callback to trainer.callbacks")
    stacked = torch.stack([scores[name].float() * weights[name] for name in scores])  # [K, B]
    valid = torch.isfinite(stacked).all(dim=0)
    total = torch.where(valid, stacked.sum(dim=0), torch.zeros_like(stacked[0]))
    return total, valid


def reward_tally(scores: dict[str, Tensor], weights: dict[str, float]) -> dict[str, Tensor]:
    """Sums and counts that add up over batches and ranks into means that leave non-finite scores out.

    For each reward ``name``: ``name`` (sum of its finite scores), ``name/count`` (how many) and ``name/nonfinite``;
    for the weighted total, ``total`` / ``total/count`` over the valid rows (every score finite) and
    ``total/nonfinite`` (rows left out). :func:`tally_means` turns a (summed) tally into means.

    >>> t = reward_tally({"a": torch.tensor([1.0, float("nan"), 3.0])}, {"a": 2.0})
    >>> {k: v.item() for k, v in t.items()}  # doctest: +NORMALIZE_WHITESPACE
    {'a': 4.0, 'a/count': 2.0, 'a/nonfinite': 1.0, 'total': 8.0, 'total/count': 2.0, 'total/nonfinite': 1.0}
    """
    total, valid = weighted_sum(scores, weights)
    out: dict[str, Tensor] = {}
    for name, values in {**scores, "total": total}.items():
        finite = valid if name == "total" else torch.isfinite(values)
        out[name] = torch.where(finite, values.float(), 0.0).sum()
        out[f"{name}/count"] = finite.sum().float()
        out[f"{name}/nonfinite"] = (~finite).sum().float()
    return out


def tally_means(tally: dict[str, Tensor]) -> dict[str, float]:
    """``{name: mean over finite scores}`` (NaN where none was finite) and ``{name_nonfinite: count}`` where the
    count is not 0, from a :func:`reward_tally` (or a sum of several).

    >>> tally_means(reward_tally({"a": torch.tensor([1.0, float("nan"), 3.0])}, {"a": 2.0}))
    {'a': 2.0, 'a_nonfinite': 1.0, 'total': 4.0, 'total_nonfinite': 1.0}
    """
    out: dict[str, float] = {}
    for key, value in tally.items():
        if "/" in key:
            continue
        count = float(tally[f"{key}/count"])
        out[key] = float(value) / count if count else float("nan")
        if (nonfinite := float(tally[f"{key}/nonfinite"])) > 0:
            out[f"{key}_nonfinite"] = nonfinite
    return out


def group_normalized(x: Tensor, group_ids: Tensor, eps: float = 1e-4, ddof: int = 1) -> Tensor:
    """``(x - mean_g) / (std_g + eps)`` per group ``[B]``; a group of ``<= ddof`` rows gets 0.

    >>> group_normalized(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]), eps=0.0, ddof=0).tolist()
    [-1.0, 1.0, 0.0]
    """
    mean, std, _ = group_stats(x.float(), group_ids, ddof=ddof)
    out = (x - mean) / (std + eps) if eps > 0 else torch.where(std > 0, (x - mean) / std, 0.0)
    return out.float()


def advantage_sum(scores: dict[str, Tensor], weights: dict[str, float], group_ids: Tensor, eps: float = 1e-4,
                  ddof: int = 1) -> Tensor:
    """``sum_k w_k * group_normalized(r_k)`` ``[B]`` over valid (finite) rows only."""
    return torch.stack([weights[n] * group_normalized(s, group_ids, eps, ddof) for n, s in scores.items()]).sum(0)


def gdpo(scores: dict[str, Tensor], weights: dict[str, float], group_ids: Tensor, eps: float = 1e-4,
         ddof: int = 1) -> Tensor:
    """GDPO: ``advantage_sum`` then batch normalisation ``(A - mean(A)) / (std(A) + eps)`` ``[B]``.

    >>> out = gdpo({"a": torch.tensor([0.0, 2.0, 0.0, 4.0])}, {"a": 1.0}, torch.tensor([0, 0, 1, 1]), eps=0.0)
    >>> [round(v, 4) for v in out.tolist()]
    [-0.866, 0.866, -0.866, 0.866]
    """
    total = advantage_sum(scores, weights, group_ids, eps, ddof)
    std = total.std(correction=ddof) if total.numel() > ddof else total.new_zeros(())
    return (total - total.mean()) / (std + eps) if eps > 0 or std > 0 else total - total.mean()


AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "sum": lambda scores, weights, group_ids, **_: weighted_sum(scores, weights)[0],
    "advantage_sum": advantage_sum,
    "gdpo": gdpo,
}


def aggregate(mode: str, scores: dict[str, Tensor], weights: dict[str, float], group_ids: Tensor,
              **options) -> tuple[Tensor, Tensor]:
    """The reward ``[B]`` of aggregation ``mode`` and validity ``[B]`` bool; invalid rows hold 0.

    Args:
        mode: ``sum``, ``advantage_sum`` or ``gdpo``.
        scores: ``{name: [B]}`` raw scores of every reward (the batch gathered from every rank).
        weights: ``{name: w}``. group_ids: ``[B]`` long.
        options: ``eps`` and ``ddof`` of the normalising modes.
    Raises:
        ValueError: unknown mode, or every sample has a non-finite score (names the rewards at fault).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"reward_aggregation={mode!r}; choose one of {sorted(AGGREGATIONS)}")
    _, valid = weighted_sum(scores, weights)
    if not valid.any():
        bad = [n for n, s in scores.items() if not torch.isfinite(s).any()] or [
            n for n, s in scores.items() if not torch.isfinite(s).all()]
        raise ValueError(f"every sample of the batch got a non-finite score (NaN/inf) from reward(s) {bad}; "
                         "check those reward callbacks (or their server)")
    kept = {name: s.float()[valid] for name, s in scores.items()}
    total = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    total[valid] = AGGREGATIONS[mode](kept, weights, group_ids[valid], **options).float()
    return total, valid
