"""TDM-R1's losses (arXiv 2603.07700): the fake score of trajectory distribution matching, the surrogate reward fitted
by group preference (DGPO), and the few-step generator's regression targets in x0 space.

Pure tensor functions, as the authors' code computes them (Luo-Yihong/TDM-R1 ``scripts/train_tdmr1_pub.py``,
``main``'s training loop and ``compute_group_dgpo_loss_allreduce``). Rectified flow: ``z_s = (1 - s) x0 + s eps``,
velocity ``v = eps - x0``, so ``x0_hat = z - s v``.

Notation:
    B: rows (samples); G: rows of a group (same prompt); D: latent dimensions (means over them are per row).
    sigma: a row's noise level in [0, 1]; tau: the level a stored latent is re-noised to (``tau >= sigma``).
    A: group advantages ``[B]``; dsm / ref: per-row denoising losses of the surrogate and of the reference.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

#: TDM-R1 samples re-noising times ``0.02`` (20 of 1000 timesteps) above the lower bound, in unshifted time.
TIME_MARGIN = 0.02


def _rows(x: Tensor, like: Tensor) -> Tensor:
    """A per-row ``[B]`` value as ``[B, 1, ...]`` broadcasting against ``like``."""
    return x.reshape(-1, *([1] * (like.dim() - 1)))


def _row_mean(x: Tensor) -> Tensor:
    return x.flatten(1).mean(dim=1)


def shift_time(u: Tensor, shift: float) -> Tensor:
    """The SD3 time shift ``s u / (1 + (s - 1) u)`` (the code's ``convert``), mapping unshifted time to sigma.

    >>> shift_time(torch.tensor([0.0, 0.5, 1.0]), 3.0).tolist()  # 1.5 / 2 = 0.75
    [0.0, 0.75, 1.0]
    """
    return shift * u / (1 + (shift - 1) * u)


def unshift_time(sigma: Tensor, shift: float) -> Tensor:
    """The inverse of :func:`shift_time`, ``sigma / (s - (s - 1) sigma)`` (the code's ``inv_convert``).

    >>> unshift_time(torch.tensor([0.75]), 3.0).tolist()  # 0.75 / (3 - 1.5)
    [0.5]
    """
    return sigma / (shift - (shift - 1) * sigma)


def renoise_sigma(lower: Tensor, u: Tensor, shift: float, margin: float = TIME_MARGIN) -> Tensor:
    """The level ``tau [B]`` a latent at ``lower [B]`` is re-noised to: uniform ``u`` in [0, 1] mapped onto
    ``[unshift(lower) + margin, 1]`` in unshifted time, then shifted (clamped to ``[lower, 1]``).

    >>> round(renoise_sigma(torch.tensor([0.5]), torch.tensor([0.5]), 1.0).item(), 4)  # 0.52 + 0.5 * 0.48
    0.76
    """
    low = unshift_time(lower, shift) + margin
    return torch.maximum(shift_time(low + u * (1 - low), shift), lower).clamp(max=1.0)


def renoise(z: Tensor, sigma: Tensor, tau: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The forward process from level ``sigma`` to ``tau >= sigma``: ``z_tau = a z + b noise`` with
    ``a = (1 - tau) / (1 - sigma)``, ``b = sqrt(tau^2 - (sigma a)^2)``.

    Args:
        z, noise: ``[B, ...]``. sigma, tau: ``[B]``.
    Returns:
        ``z_tau [B, ...]``, ``a`` and ``b`` as ``[B, 1, ...]``.

    >>> z_tau, a, b = renoise(torch.ones(1, 1), torch.tensor([0.5]), torch.tensor([0.75]), torch.ones(1, 1))
    >>> [round(v, 4) for v in (z_tau.item(), a.item(), b.item())]  # a = 0.5, b = sqrt(0.5625 - 0.0625)
    [1.2071, 0.5, 0.7071]
    """
    sigma, tau = _rows(sigma.float(), z), _rows(tau.float(), z)
    a = (1 - tau) / (1 - sigma)
    b = (tau.square() - (sigma * a).square()).clamp(min=0).sqrt()
    return a * z + b * noise, a, b


def surrogate_target(z: Tensor, sigma: Tensor, tau: Tensor, noise: Tensor) -> Tensor:
    """The surrogate's denoising target ``[B, ...]`` for a stored latent ``z`` at ``sigma`` re-noised to ``tau`` with
    ``noise`` (the code's ``target_v_dgpo``): ``-z / (1 - sigma) + noise / b (tau + sigma^2 a / (1 - sigma))``; for a
    clean latent (``sigma = 0``) it is the flow-matching velocity ``noise - z``.

    >>> surrogate_target(torch.tensor([[0.2]]), torch.tensor([0.0]), torch.tensor([0.6]), torch.tensor([[1.0]]))
    tensor([[0.8000]])
    """
    _, a, b = renoise(z, sigma, tau, noise)
    s = _rows(sigma.float(), z)
    return -z / (1 - s) + noise / b * (_rows(tau.float(), z) + s.square() * a / (1 - s))


def group_logits(delta: Tensor, advantages: Tensor, group_ids: Tensor, beta_dpo: float) -> Tensor:
    """Each row's group logit ``s_g = sum_{i in g} A_i beta_dpo delta_i / G_g`` ``[B]``, with ``delta = dsm - ref``
    (detached) and ``G_g`` the rows of group ``g`` (Eq. 8's Bradley-Terry logit; the code's all-reduced group sums).

    >>> s = group_logits(torch.tensor([-0.1, 0.1, 0.0, 0.05]), torch.tensor([1.0, -1.0, 0.5, -0.5]),
    ...                  torch.tensor([0, 0, 0, 0]), 1.0)
    >>> [round(v, 6) for v in s.tolist()]  # (-0.1 - 0.1 + 0 - 0.025) / 4 for each row of the group
    [-0.05625, -0.05625, -0.05625, -0.05625]
    """
    groups, index = group_ids.unique(return_inverse=True)
    terms = advantages * beta_dpo * delta.detach()
    sums = terms.new_zeros(len(groups)).index_add(0, index, terms)
    counts = terms.new_zeros(len(groups)).index_add(0, index, torch.ones_like(terms))
    return (sums / counts)[index]


def frozen_rows(dsm: Tensor, old: Tensor, ref: Tensor, advantages: Tensor, clip_range: float, drift: Tensor,
                drift_threshold: float) -> Tensor:
    """Rows whose surrogate denoising loss is detached ``[B]`` bool: those that already moved past ``1 +/- clip_range``
    in their advantage's direction (``ratio = exp(old - dsm)``; ``A > 0`` wants it up, ``A <= 0`` down), and, when
    the surrogate's mean squared drift from the reference exceeds ``drift_threshold``, those already better than the
    reference in their direction (``exp(ref - dsm)`` above 1 for ``A > 0``, below 1 otherwise).

    >>> frozen_rows(torch.tensor([0.5, 0.5]), torch.tensor([0.6, 0.6]), torch.tensor([0.5, 0.5]),
    ...             torch.tensor([1.0, -1.0]), 1e-3, torch.tensor(0.0), 0.05)  # ratio e^0.1: up past 1 + c
    tensor([ True, False])
    """
    up = advantages > 0
    ratio, ref_ratio = torch.exp(old - dsm), torch.exp(ref - dsm)
    moved = torch.where(up, ratio > 1 + clip_range, ratio < 1 - clip_range)
    better = torch.where(up, ref_ratio > 1, ref_ratio < 1)
    return moved | ((drift > drift_threshold) & better)


def group_preference_loss(dsm: Tensor, advantages: Tensor, weights: Tensor,
                          frozen: Optional[Tensor] = None) -> Tensor:
    """The surrogate's group preference loss ``mean_i(w_i A_i dsm_i)`` (a scalar), ``w = sigmoid(s_g)`` detached: its
    gradient is that of ``softplus`` of the group logit. ``frozen`` rows contribute no gradient.

    >>> dsm, adv = torch.tensor([0.50, 0.70, 0.60, 0.65]), torch.tensor([1.0, -1.0, 0.5, -0.5])
    >>> w = torch.sigmoid(group_logits(dsm - 0.6, adv, torch.zeros(4, dtype=torch.long), 1.0))
    >>> round(group_preference_loss(dsm, adv, w).item(), 6)  # 0.485941 * (0.5 - 0.7 + 0.3 - 0.325) / 4
    -0.027334
    """
    if frozen is not None:
        dsm = torch.where(frozen, dsm.detach(), dsm)
    return (weights.detach() * advantages * dsm).mean()


def fake_score_loss(fake_v: Tensor, target_v: Tensor, real_v: Tensor, real_weight: float = 0.02) -> Tensor:
    """The fake score's per-row loss ``[B]``: ``mean((target - fake)^2) + real_weight mean((real - fake)^2)``, with
    ``target = (z_tau - x0_generator) / tau`` (TDM's denoising target for the generator's own samples).

    >>> round(fake_score_loss(torch.zeros(1, 2), torch.ones(1, 2), torch.full((1, 2), 2.0)).item(), 6)  # 1 + 0.02 * 4
    1.08
    """
    fit = _row_mean((target_v.detach() - fake_v).square())
    return fit + real_weight * _row_mean((real_v.detach() - fake_v).square())


def generator_loss(x0: Tensor, real_cond: Tensor, real_uncond: Tensor, fake: Tensor, teacher_guidance: float,
                   tdm_weight: float, surrogate: Optional[Tensor] = None, surrogate_ref: Optional[Tensor] = None,
                   floor: float = 1e-5) -> tuple[Tensor, dict[str, Tensor]]:
    """The generator's per-row loss ``[B]``: regressions of its ``x0`` onto detached targets, each divided by a
    detached mean absolute gap (TDM-R1 code, generator update).

    Targets (all x0 predictions of the re-noised generator sample): CFG as a reward ``x0 + (g - 1)(cond - uncond)``
    (``g = teacher_guidance``; JDM / DI++), the distribution-matching (reverse-KL) direction ``x0 + (cond - fake)``,
    and the surrogate reward direction ``x0 + (surrogate - surrogate_ref)`` (the surrogate with its CFG, the reference
    without). Weights: ``w = mean|x0 - (uncond + g (cond - uncond))|``, ``w_r = mean|x0 - surrogate|``, floored at
    ``floor`` (the code divides unguarded). With the surrogate:
    ``tdm_weight L_cfg / w + (1 - tdm_weight) L_r / w_r + L_kl / w``; without (steps past ``trunc_steps``):
    ``tdm_weight (L_cfg + L_kl) / w``.

    Returns:
        the loss ``[B]`` and its parts ``{cfg, kl, reward}`` ``[B]`` (reward absent without the surrogate).

    >>> t = lambda v: torch.tensor([[v]])
    >>> loss, parts = generator_loss(t(0.0), t(0.2), t(0.1), t(0.15), 4.5, 0.3, t(0.3), t(0.25))
    >>> round(loss.item(), 6), round(parts["cfg"].item(), 5)  # 0.3 * 0.35^2 / 0.55 + 0.7 * 0.05^2 / 0.3 + 0.05^2 / 0.55
    (0.077197, 0.22273)
    """
    x0_d = x0.double()
    guided = real_uncond + teacher_guidance * (real_cond - real_uncond)
    w = _rows(_row_mean((x0_d - guided.double()).abs()).clamp(min=floor), x0).detach()
    cfg_target = (x0 + (teacher_guidance - 1) * (real_cond - real_uncond)).detach()
    kl_target = (x0 + (real_cond - fake)).detach()
    parts = {"cfg": _row_mean((cfg_target - x0).square() / w), "kl": _row_mean((kl_target - x0).square() / w)}
    if surrogate is None:
        return tdm_weight * (parts["cfg"] + parts["kl"]), parts
    w_r = _rows(_row_mean((x0_d - surrogate.double()).abs()).clamp(min=floor), x0).detach()
    reward_target = (x0 + (surrogate - surrogate_ref)).detach()
    parts["reward"] = _row_mean((reward_target - x0).square() / w_r)
    return tdm_weight * parts["cfg"] + (1 - tdm_weight) * parts["reward"] + parts["kl"], parts
