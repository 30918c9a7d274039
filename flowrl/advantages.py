"""Advantage estimators shared by LLM token sequences and denoising trajectories.

Notation (as in torchtune's ``rlhf`` module):
    B: rows (a completion of an LLM, a trajectory of a sampler); T: positions (tokens, denoising steps).
    rewards ``[B, T]``: outcome reward on the last valid position and/or dense step rewards.
    mask ``[B, T]`` bool: positions that carry a loss. group_ids ``[B]`` long: rows sharing a prompt.

Every estimator is a plain function ``fn(rewards, mask, group_ids, **options) -> advantages [B, T]`` that is zero
where ``mask`` is 0, registered by name. Numeric conventions are explicit options, never hidden constants:
``eps``, ``ddof``, ``std_scope`` (``group`` / ``batch`` / ``none``), ``singleton`` (``raw`` / ``zero``), ``clip``.
Presets (``name@peer``) pin the options that reproduce a peer exactly:

- ``grpo@flow_grpo``: yifan123/flow_grpo ``stat_tracking.PerPromptStatTracker`` with ``global_std=True``: group
  mean, population std of the whole gathered batch, ``+1e-4``, clipped to ``[-5, 5]``; a group of one gets 0.
- ``grpo@verl``: verl ``core_algos.compute_grpo_outcome_advantage``: unbiased group std, ``+1e-6``; a group of one
  keeps its raw score (mean 0, std 1).
- ``grpo@trl``: TRL ``GRPOTrainer`` with ``scale_rewards="group"``: unbiased group std, ``+1e-4``; a group of one
  gets 0.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

Estimator = Callable[..., Tensor]
_REGISTRY: dict[str, Estimator] = {}
_PRESETS: dict[str, tuple[str, dict]] = {
    "grpo@flow_grpo": ("grpo", dict(eps=1e-4, ddof=0, std_scope="batch", singleton="zero", clip=5.0)),
    "grpo@verl": ("grpo", dict(eps=1e-6, ddof=1, std_scope="group", singleton="raw", clip=None)),
    "grpo@trl": ("grpo", dict(eps=1e-4, ddof=1, std_scope="group", singleton="zero", clip=None)),
}


def register(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator adding an estimator to the registry under ``name``."""

    def wrap(fn: Estimator) -> Estimator:
        if name in _REGISTRY:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return wrap


def available() -> list[str]:
    """Every estimator and preset name ``compute`` accepts."""
    return sorted([*_REGISTRY, *_PRESETS])


def resolve(name: str, **options) -> tuple[Estimator, dict]:
    """The estimator function for ``name`` and its options (a preset's options, overridden by ``options``)."""
    base, preset = _PRESETS.get(name, (name, {}))
    if base not in _REGISTRY:
        raise ValueError(f"unknown advantage estimator {name!r}; available: {available()}")
    return _REGISTRY[base], {**preset, **options}


def compute(name: str, rewards: Tensor, mask: Tensor, group_ids: Tensor, **options) -> Tensor:
    """Advantages ``[B, T]`` from the estimator or preset ``name``."""
    fn, options = resolve(name, **options)
    return fn(rewards, mask, group_ids, **options)


def scores(rewards: Tensor, mask: Tensor) -> Tensor:
    """Per-row outcome ``[B]``: the sum of rewards over valid positions."""
    return (rewards.float() * mask).sum(dim=1)


def group_stats(x: Tensor, group_ids: Tensor, ddof: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row group mean, group std and group size of ``x [B]``; std is 0 where a group has ``<= ddof`` rows.

    >>> m, s, n = group_stats(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 1]))
    >>> m.tolist(), s.tolist(), n.tolist()
    ([2.0, 2.0, 5.0], [1.0, 1.0, 0.0], [2.0, 2.0, 1.0])
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    k = int(inverse.max()) + 1 if inverse.numel() else 0
    x = x.double()  # group sums in float64: rewards can be large and groups long
    count = torch.zeros(k, dtype=x.dtype, device=x.device).index_add_(0, inverse, torch.ones_like(x))
    mean = torch.zeros_like(count).index_add_(0, inverse, x) / count
    sq = torch.zeros_like(count).index_add_(0, inverse, (x - mean[inverse]) ** 2)
    var = sq / (count - ddof).clamp_min(1)
    var = torch.where(count > ddof, var, torch.zeros_like(var))
    return mean[inverse].float(), var.sqrt()[inverse].float(), count[inverse].float()


def _check(rewards: Tensor, mask: Tensor, group_ids: Tensor) -> None:
    if rewards.ndim != 2 or mask.shape != rewards.shape:
        raise ValueError(f"rewards and mask must both be [B, T]; got {tuple(rewards.shape)} and {tuple(mask.shape)}")
    if group_ids.shape != rewards.shape[:1]:
        raise ValueError(f"group_ids must be [B]={rewards.shape[0]}; got {tuple(group_ids.shape)}")
    if not torch.isfinite(rewards[mask.bool()]).all():
        raise ValueError("rewards contain NaN or inf at valid positions; mask those rows out first")


@register("grpo")
def grpo(
    rewards: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    eps: float = 1e-6,
    ddof: int = 1,
    std_scope: str = "group",
    singleton: str = "raw",
    clip: float | None = None,
) -> Tensor:
    """Group-relative advantage ``A_i = (s_i - mean_g) / (std + eps)`` broadcast over the row's valid positions.

    Args:
        rewards, mask: ``[B, T]``; the row score ``s_i`` is the masked sum of ``rewards``.
        group_ids: ``[B]``.
        eps: added to the std. ddof: 0 (population std) or 1 (unbiased).
        std_scope: ``group`` (std within the group), ``batch`` (std of every score in the batch), ``none`` (no
            division: Dr.GRPO).
        singleton: what a group of one gets: ``raw`` (its score, as verl: mean 0 and std 1) or ``zero``.
        clip: clamp advantages to ``[-clip, clip]`` (None: no clamp).
    Returns:
        ``[B, T]`` float32, zero where ``mask`` is 0.

    >>> r = torch.tensor([[1.0], [2.0], [3.0], [4.0]]); m = torch.ones(4, 1, dtype=torch.bool)
    >>> [round(a, 4) for a in grpo(r, m, torch.zeros(4, dtype=torch.long), eps=1e-4, ddof=0)[:, 0].tolist()]
    [-1.3415, -0.4472, 0.4472, 1.3415]
    """
    _check(rewards, mask, group_ids)
    if std_scope not in ("group", "batch", "none") or singleton not in ("raw", "zero") or ddof not in (0, 1):
        raise ValueError(f"bad grpo options: std_scope={std_scope!r}, singleton={singleton!r}, ddof={ddof!r}")
    s = scores(rewards, mask)  # [B]
    mean, std, count = group_stats(s, group_ids, ddof)
    if std_scope == "batch":
        std = s.std(correction=ddof).expand_as(s) if s.numel() > ddof else torch.zeros_like(s)
    adv = s - mean if std_scope == "none" else (s - mean) / (std + eps)
    lone = count == 1
    adv = torch.where(lone, s if singleton == "raw" else torch.zeros_like(s), adv)
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv[:, None] * mask  # [B, T]
