"""Loss aggregation: how a ``[B, T]`` per-position loss becomes the scalar that is back-propagated.

The modes and their names are verl's ``agg_loss`` (``verl/trainer/ppo/core_algos.py``); with ``L`` the loss,
``m`` the mask, ``N_rows`` the rows with at least one valid position (or ``num_rows``), ``T`` the padded length:

- ``token-mean``: ``sum_it L m / N_tok`` with ``N_tok = sum_it m`` (or ``num_tokens``). verl's default; TRL
  ``loss_type="bnpo"`` (local count) and ``"dapo"`` (the global count: pass ``num_tokens``).
- ``seq-mean-token-sum``: ``sum_i (sum_t L m) / N_rows``.
- ``seq-mean-token-mean``: ``sum_i (sum_t L m / sum_t m) / N_rows``; TRL ``loss_type="grpo"``, the GRPO paper.
- ``seq-mean-token-sum-norm`` (Dr. GRPO, arXiv 2503.20783): ``sum_it L m / C``, ``C = loss_scale_factor``
  (default ``T``; TRL uses ``max_completion_length``), divided by ``N_rows`` too when ``divide_by_rows``.
  ``divide_by_rows=False`` is verl's ``agg_loss`` at volcengine/verl b178a3cd ("turns off seq-dim averaging":
  the scale grows with the micro-batch); ``True`` is TRL ``loss_type="dr_grpo"`` (``/ (B * max_completion_length)``,
  pass ``num_rows=B`` if a row may be fully masked) and verl-project/verl at 018f23b, which divides by ``N_rows``.

Rows with no valid position are left out of ``N_rows`` (as verl). Masked positions never reach the sum, even if
they hold ``nan``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _check(mode: str, divide_by_rows: bool, loss_scale_factor: Optional[float], num_tokens: Optional[float],
           num_rows: Optional[float]) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {list(AGGREGATIONS)}")
    problems = []
    if mode != "seq-mean-token-sum-norm" and (divide_by_rows or loss_scale_factor is not None):
        problems.append("divide_by_rows and loss_scale_factor apply to 'seq-mean-token-sum-norm' only")
    if mode != "token-mean" and num_tokens is not None:
        problems.append("num_tokens applies to 'token-mean' only")
    if mode == "token-mean" and num_rows is not None:
        problems.append("num_rows applies to the seq-mean modes only")
    if loss_scale_factor is not None and loss_scale_factor <= 0:
        problems.append(f"loss_scale_factor={loss_scale_factor} must be > 0")
    if problems:
        raise ValueError(f"loss aggregation {mode!r}: " + "; ".join(problems))


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean", *, divide_by_rows: bool = False,
              loss_scale_factor: Optional[float] = None, num_tokens: Optional[float] = None,
              num_rows: Optional[float] = None) -> Tensor:
    """Reduce a ``[B, T]`` loss over its valid positions (see the module docstring for each mode's formula).

    Args:
        loss: ``[B, T]``. mask: ``[B, T]`` bool (or 0/1).
        mode: one of :data:`AGGREGATIONS`.
        divide_by_rows: ``seq-mean-token-sum-norm`` only: also divide by ``N_rows`` (TRL) or not (verl b178a3cd).
        loss_scale_factor: ``seq-mean-token-sum-norm`` only: the constant ``C`` (default ``T``, the padded length).
        num_tokens: ``token-mean`` only: the denominator (e.g. valid tokens of the whole accumulated batch).
        num_rows: seq-mean modes: the row denominator (e.g. rows of the whole accumulated batch).
    Returns:
        a scalar.
    Raises:
        ValueError: an unknown mode, or an option that the mode does not use.

    >>> loss, mask = torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [1, 0]]).bool()
    >>> [aggregate(loss, mask, m).item() for m in AGGREGATIONS]  # 9/3, (4+5)/2, (2+5)/2, 9/2
    [3.0, 4.5, 3.5, 4.5]
    """
    _check(mode, divide_by_rows, loss_scale_factor, num_tokens, num_rows)
    mask = mask.bool()
    kept = torch.where(mask, loss, loss.new_zeros(()))
    if mode == "token-mean":
        return kept.sum() / (mask.sum().clamp_min(1) if num_tokens is None else num_tokens)
    row_sums, row_counts = kept.sum(-1), mask.sum(-1)  # [B]
    rows = (row_counts > 0).sum().clamp_min(1) if num_rows is None else num_rows
    if mode == "seq-mean-token-sum":
        return row_sums.sum() / rows
    if mode == "seq-mean-token-mean":
        return (row_sums / row_counts.clamp_min(1)).sum() / rows
    total = row_sums.sum() / (mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return total / rows if divide_by_rows else total
