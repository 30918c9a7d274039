"""Policy losses that read the step's mean shift: Flow-DPPO's trust-region mask and GRPO-Guard's RatioNorm.

Both trained and sampling transitions of a denoising step are Gaussians with one std ``s`` (the sampler step's
``std``, ``std_dev_t sqrt(dt)`` for the Flow-GRPO SDE), so the divergence of the update at a (row, step) is exact:

    D = mean_d (mu_theta - mu_old)^2 / (2 s^2) = KL(N(mu_theta, s^2) || N(mu_old, s^2)) / d

(``mean_sq_diff / (2 std^2)``, the :data:`~flowrl.losses.policy.STEP_INPUTS` these losses declare). ``D`` is also the
bias of the per-dimension log-ratio: over the noise of the recorded sample, ``E[l_theta - l_old] = -D``, which is why
Flow-GRPO's ratios sit below 1. Log-probs are flowrl's per-dimension means, the convention of UniRL and flow_grpo, so
their thresholds and clip ranges carry over unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.losses.policy import _MAX_LOG_RATIO, _clipped_surrogate, _mean, _metrics, _ratio, register_policy_loss


@register_policy_loss("dppo", needs=("mean_sq_diff", "std"))
def dppo(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, mean_sq_diff: Tensor,
         std: Tensor, kl_threshold: float = 1e-5) -> tuple[Tensor, dict[str, Tensor]]:
    """Flow-DPPO (arXiv 2606.11025; UniRL ``unirl/algorithms/flowdppo.py`` ``_flowdppo_kl_adv_loss``): ``-A r`` with
    no ratio clip, dropped where the step left the trust region (``D >= kl_threshold``) **and** the update pushes it
    further out (``r > 1`` with ``A > 0``, or ``r < 1`` with ``A < 0``); a step that left it in the other direction
    keeps its corrective gradient. ``torch.where``, not a product, and the log-ratio clamped as every flowrl loss:
    an overflowing ratio on a dropped pair is neither ``nan`` in the loss nor in its gradient (UniRL's unclamped
    ratio keeps the loss finite but not the gradient). Metrics add ``dppo_masked_frac`` and ``dppo_divergence``.

    >>> one = lambda v: torch.tensor([[v]])
    >>> loss, m = dppo(one(0.1), one(0.0), one(1.0), one(True), mean_sq_diff=one(1e-3), std=one(0.1))
    >>> loss.item(), m["dppo_masked_frac"].item()  # D = 1e-3 / 0.02 = 0.05 >= 1e-5, r > 1 and A > 0: dropped
    (0.0, 1.0)
    """
    log_ratio, ratio = _ratio(log_prob, old_log_prob)
    divergence = (mean_sq_diff / (2 * std**2)).detach()
    outward = ((ratio > 1) & (advantages > 0)) | ((ratio < 1) & (advantages < 0))
    drop = (divergence >= kl_threshold) & outward
    loss = torch.where(drop, torch.zeros_like(ratio), -advantages * ratio)
    metrics = _metrics(log_ratio, ratio, mask)
    metrics.update(dppo_masked_frac=_mean(drop, mask), dppo_divergence=_mean(divergence, mask))
    return loss, metrics


@register_policy_loss("grpo_guard", needs=("mean_sq_diff", "std", "dt"))
def grpo_guard(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, *, mean_sq_diff: Tensor,
               std: Tensor, dt: Tensor, clip_low: float = 2e-6, clip_high: float | None = None,
               bias_over: str = "pair") -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO-Guard's RatioNorm (arXiv 2510.22319; ``zhtmike/flow_grpo`` ``scripts/train_sd3_GRPO_Guard.py``, the
    ``config.rationorm`` loss block): the log-ratio de-biased by ``b = D`` and scaled by the step's std,
    ``log r~ = (l_theta - l_old + b) s``, PPO-clipped, and the step's loss divided by ``dt``.

    ``bias_over``: ``pair`` computes ``b`` and ``s`` per (row, step), as the ports (verl-omni, Flow-Factory);
    ``step`` as the authors' script: their ``mean(dim=())`` reduces the whole micro-batch of one step to one ``b``
    (``mean_rows mean_sq_diff / (2 s^2)``) and ``s`` is the micro-batch's mean, so here ``b`` and ``s`` are the means
    over the rows that train the same step in the micro-batch (flowrl's micro-batches mix steps; theirs hold one).

    >>> one = lambda v: torch.tensor([[v]])
    >>> loss, m = grpo_guard(one(-0.5), one(0.0), one(1.0), one(True), mean_sq_diff=one(0.01), std=one(0.1),
    ...                      dt=one(0.1))
    >>> round(loss.item(), 4)  # b = 0.01 / 0.02 = 0.5 cancels the -0.5: r~ = 1, loss -1 / dt
    -10.0
    """
    if bias_over == "step":
        m = mask.to(std.dtype)
        count = m.sum(0, keepdim=True).clamp_min(1)  # rows per step in this micro-batch
        s = ((std * m).sum(0, keepdim=True) / count).expand_as(std)
        bias = ((mean_sq_diff * m).sum(0, keepdim=True) / count).expand_as(std) / (2 * s**2)
    else:
        s, bias = std, mean_sq_diff / (2 * std**2)
    log_ratio = ((log_prob - old_log_prob + bias) * s).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = log_ratio.exp()
    loss, high, low = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    metrics = _metrics(log_ratio, ratio, mask, high, low)
    metrics["guard_bias"] = _mean(bias.detach(), mask)
    return loss / dt, metrics
