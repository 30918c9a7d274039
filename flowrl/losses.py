"""Policy losses, loss aggregation and KL terms shared by LLM tokens and denoising steps.

Notation: ``log_prob``, ``old_log_prob``, ``advantages``, ``mask``: ``[B, T]``; the ratio is
``exp(log_prob - old_log_prob)``. Losses return an unaggregated ``[B, T]`` loss and a dict of detached metrics;
``aggregate`` reduces it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def vanilla(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate: ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` per position.

    Returns:
        loss ``[B, T]``; metrics ``clip_frac`` (positions where the clipped branch is larger), ``approx_kl``
        (``0.5 (log r)^2``) and ``ratio`` (``[B, T]``, detached).

    >>> loss, m = vanilla(torch.tensor([[1.5e-4]]).log1p(), torch.zeros(1, 1), torch.ones(1, 1), 1e-4)
    >>> round(loss.item(), 6), m["clip_frac"].item()
    (-1.0001, 1.0)
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)  # as verl: keeps exp finite on stale samples
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    metrics = {
        "clip_frac": (clipped > unclipped).float().detach(),
        "approx_kl": (0.5 * log_ratio**2).detach(),
        "ratio": ratio.detach(),
    }
    return torch.maximum(unclipped, clipped), metrics


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a ``[B, T]`` loss over valid positions. ``token-mean``: mean over every valid position.

    >>> aggregate(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [1, 0]]).bool()).item()
    3.0
    """
    if mode != "token-mean":
        raise ValueError(f"unknown loss aggregation {mode!r}; choose 'token-mean'")
    mask = mask.to(loss.dtype)
    return (loss * mask).sum() / mask.sum().clamp_min(1.0)


def gaussian_mean_kl(mean: Tensor, ref_mean: Tensor, std: Tensor) -> Tensor:
    """KL between two Gaussians of equal std, averaged over dims: ``mean((mu - mu_ref)^2) / (2 std^2)`` ``[B]``.

    flowrl uses the transition std of the step (``s sqrt(-dt)`` for the Flow-GRPO SDE), i.e. the exact KL of the two
    transition kernels; flow_grpo divides by ``s^2`` alone, which makes its KL ``|dt|`` times ours, so a flow_grpo
    ``beta`` maps to ``beta * |dt|`` here.

    >>> gaussian_mean_kl(torch.ones(1, 2), torch.zeros(1, 2), torch.full((1, 1), 0.5)).item()
    2.0
    """
    sq = (mean.float() - ref_mean.float()) ** 2 / (2 * std.float() ** 2)
    return sq.flatten(1).mean(dim=1)
