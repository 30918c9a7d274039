"""Policy losses shared by LLM tokens and denoising steps: a registry of pure functions on ``[B, T]`` tensors.

Notation:
    B: rows (a completion, a sampler trajectory); T: positions (tokens, denoising steps).
    log_prob, old_log_prob, advantages ``[B, T]`` float; mask ``[B, T]`` bool (positions that carry a loss).
    r = exp(log_prob - old_log_prob), the per-position importance ratio; sg(x): x with its gradient stopped.

Every loss is ``fn(log_prob, old_log_prob, advantages, mask, **options) -> (loss [B, T], metrics)``: the loss is 0
where ``mask`` is 0 and no gradient reaches a masked position even if it holds ``inf`` or ``nan`` (padding), and
``metrics`` are detached scalars, each a mean (or min / max) over valid positions. A loss that needs more than
log-probs per position (a Gaussian step's mean shift and std: Flow-DPPO, GRPO-Guard) declares those names when it
registers (``needs``, from :data:`STEP_INPUTS`) and takes them as keyword tensors ``[B, T]`` beside its options;
:func:`policy_loss_needs` tells the caller which to hand over. Reduce the loss with
:func:`flowrl.losses.aggregate`. Formulas follow verl ``verl/trainer/ppo/core_algos.py``
(``compute_policy_loss_<name>``); a deviation says so where it happens.

Scale: a diffusion step's log-prob is a Gaussian log-density *averaged* over latent dims (flow_grpo, DanceGRPO),
so clip ranges there are ~1e-4, where 0.2 is usual for tokens.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from flowrl.losses.registry import (PRESETS, STEP_INPUTS, PolicyLoss, available_policy_losses, check_policy_loss,  # noqa: F401
                                    is_sequence_level, policy_loss, policy_loss_needs, policy_loss_options,
                                    register_policy_loss, resolve_policy_loss)

_MAX_LOG_RATIO = 20.0  # as verl: keeps exp finite on stale samples


def _mean(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, x.float(), 0.0).sum() / mask.sum().clamp_min(1)


def _metrics(log_ratio: Tensor, ratio: Tensor, mask: Tensor, high: Optional[Tensor] = None,
             low: Optional[Tensor] = None, dual: Optional[Tensor] = None) -> dict[str, Tensor]:
    """Masked diagnostics; ``high``/``low``/``dual`` are ``[B, T]`` bools of the positions each clip is active."""
    with torch.no_grad():
        none = torch.zeros_like(mask)
        high, low, dual = (none if x is None else x for x in (high, low, dual))
        valid = ratio.detach()[mask].float()
        out = {"clip_frac": _mean(high | low, mask), "clip_frac_high": _mean(high, mask),
               "clip_frac_low": _mean(low, mask), "dual_clip_frac": _mean(dual, mask),
               "approx_kl": _mean(0.5 * log_ratio.detach() ** 2, mask), "ppo_kl": _mean(-log_ratio.detach(), mask),
               "ratio_mean": _mean(ratio.detach(), mask)}
        out["ratio_min"] = valid.min() if valid.numel() else torch.tensor(float("nan"))
        out["ratio_max"] = valid.max() if valid.numel() else torch.tensor(float("nan"))
    return out


def _ratio(log_prob: Tensor, old_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    log_ratio = (log_prob - old_log_prob).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return log_ratio, log_ratio.exp()


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float,
                       clip_high: Optional[float]) -> tuple[Tensor, Tensor, Tensor]:
    """``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))`` and where its clip is active above / below."""
    clip_high = clip_low if clip_high is None else clip_high
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    active = clipped > unclipped  # A > 0 and r > 1 + clip_high, or A < 0 and r < 1 - clip_low
    return torch.maximum(unclipped, clipped), active & (advantages > 0), active & (advantages < 0)


# -- losses ----------------------------------------------------------------------------------------------------


@register_policy_loss("vanilla")
def vanilla(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
            clip_high: Optional[float] = None, dual_clip: Optional[float] = None, clip_eta: Optional[float] = None,
            clip_bounds: Optional[tuple[float, float]] = None,
            clip_bounds_scale: Optional[tuple[float, float]] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip (arXiv 1707.06347): ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, then for ``A < 0`` and
    ``dual_clip = c``: ``min(that, -A c)`` (dual-clip PPO, arXiv 1912.09729). ``clip_high > clip_low`` is DAPO's
    clip-higher (arXiv 2503.14476, 0.28 vs 0.2). verl ``compute_policy_loss_vanilla`` always applies the dual clip
    (``clip_ratio_c = 3.0``); here it is off unless set, as in flow_grpo and TRL. verl reports the dual-clip
    fraction as ``pg_clipfrac_lower``; here that is ``dual_clip_frac``.

    ``clip_eta = eta`` makes the clip reward-conditioned (Dynamic-TreeRPO, arXiv 2509.23352, Eq. 11, as its
    reviews describe it; no public code): each position's range is ``clamp(eps (1 + eta |A|), *clip_bounds)`` with
    ``eps`` its ``clip_low`` / ``clip_high``, so a large advantage may move its ratio further; ``clip_bounds_scale``
    gives the bounds as multiples of each ``eps`` instead (``(0.5, 3)``: ``[eps / 2, 3 eps]``, the same for any clip
    range).

    >>> loss, m = vanilla(torch.tensor([[0.5]]).log1p(), torch.zeros(1, 1), torch.full((1, 1), 2.0),
    ...                   torch.ones(1, 1, dtype=torch.bool), clip_low=0.1, clip_eta=1.0, clip_bounds=(0.0, 0.25))
    >>> round(loss.item(), 4)  # eps = clamp(0.1 * (1 + 2), 0, 0.25) = 0.25: r = 1.5 clipped to 1.25, -2 * 1.25
    -2.5

    >>> loss, m = vanilla(torch.tensor([[1.5e-4]]).log1p(), torch.zeros(1, 1), torch.ones(1, 1),
    ...                   torch.ones(1, 1, dtype=torch.bool), clip_low=1e-4)
    >>> round(loss.item(), 6), m["clip_frac_high"].item()
    (-1.0001, 1.0)
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    if clip_eta is not None:
        factor = 1.0 + clip_eta * advantages.detach().abs()
        bounds = lambda eps: ((eps * clip_bounds_scale[0], eps * clip_bounds_scale[1]) if clip_bounds_scale  # noqa: E731
                              else clip_bounds or (0.0, float("inf")))
        clip_low, clip_high = ((eps * factor).clamp(*bounds(eps))
                               for eps in (clip_low, clip_low if clip_high is None else clip_high))
    loss, high, low = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    dual = None
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
    return loss, _metrics(log_ratio, ratio, mask, high, low, dual)


@register_policy_loss("gspo", sequence_level=True)
def gspo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
         clip_high: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (arXiv 2507.18071): PPO clip on the row's geometric-mean ratio ``s = exp(mean_t log r_t)``, in verl's
    stop-gradient form ``log s_t = log_prob_t - sg(log_prob_t) + sg(log s)`` (clamped at 10): every position's value
    is ``s``, and position t's gradient is ``-A s`` times ``grad log_prob_t``. With ``seq-mean-token-mean``
    aggregation (verl forces it) and one advantage per row this is the paper's gradient
    ``-A s mean_t grad log_prob_t``. The paper's clip ranges are 3e-4 / 4e-4 (verl and TRL use their usual clip).

    >>> loss, m = gspo(torch.tensor([[0.2, 0.4]]), torch.zeros(1, 2), torch.ones(1, 2),
    ...                torch.ones(1, 2, dtype=torch.bool), clip_low=0.5)
    >>> [round(x, 4) for x in loss[0].tolist()]  # s = exp(0.3) = 1.3499 for both positions
    [-1.3499, -1.3499]
    """
    m = mask.to(log_prob.dtype)
    seq_log_ratio = ((log_prob - old_log_prob) * m).sum(-1) / m.sum(-1).clamp_min(1)  # [B]
    log_ratio = (log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]).clamp(max=10.0)  # [B, T]
    ratio = log_ratio.exp()
    loss, high, low = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    metrics = _metrics(log_prob - old_log_prob, ratio, mask, high, low)
    return loss, metrics


@register_policy_loss("gpg")
def gpg(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor,
        mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG (arXiv 2504.02546), plain REINFORCE: ``-A log_prob``, no ratio, no clip (verl ``compute_policy_loss_gpg``).
    Its gradient is the on-policy policy gradient however stale ``old_log_prob`` is; the ratio is reported only.
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    return -advantages * log_prob, _metrics(log_ratio, ratio, mask)


@register_policy_loss("cispo")
def cispo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, clip_low: float = 0.2,
          clip_high: Optional[float] = None) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): ``-sg(clip(r, 1 - clip_low, 1 + clip_high)) A log_prob``; the clipped
    ratio is a detached weight, so clipped positions keep their gradient (verl ``compute_policy_loss_cispo``).
    TRL's ``loss_type="cispo"`` caps only from above, ``min(r, epsilon_high)``: that is ``clip_low=1``,
    ``clip_high=epsilon_high - 1`` here.

    >>> loss, m = cispo(torch.tensor([[-1.0]]), torch.tensor([[-2.0]]), torch.ones(1, 1),
    ...                 torch.ones(1, 1, dtype=torch.bool))
    >>> round(loss.item(), 4), m["clip_frac_high"].item()  # r = e > 1.2: -1.2 * 1 * (-1)
    (1.2, 1.0)
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss = -weight * advantages * log_prob
    return loss, _metrics(log_ratio, ratio, mask, ratio > 1.0 + clip_high, ratio < 1.0 - clip_low)


@register_policy_loss("sapo")
def sapo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, tau_pos: float = 1.0,
         tau_neg: float = 1.05) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO (arXiv 2511.20347), a soft trust region: ``-A sigmoid(tau (r - 1)) 4 / tau`` with ``tau = tau_pos`` where
    ``A > 0`` else ``tau_neg`` (verl ``compute_policy_loss_sapo`` defaults; TRL's ``sapo`` is the same gate). At
    ``r = 1`` the gate's slope is 1, so the gradient is the on-policy ``-A grad log_prob``; it fades as ``r`` leaves
    1 instead of being cut. verl forces ``seq-mean-token-mean`` aggregation. No hard clip: clip fractions are 0.

    >>> loss, _ = sapo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool))
    >>> loss.item()  # -1 * sigmoid(0) * 4 / 1
    -2.0
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return -gate * advantages, _metrics(log_ratio, ratio, mask)
