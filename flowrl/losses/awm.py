"""AWM, Advantage Weighted Matching (arXiv 2509.25050): the policy gradient on a weighted flow-matching likelihood.

Read from the authors' ``scxue/advantage_weighted_matching`` ``advantage_weighted_matching/scripts/train_sd3_awm.py``
(``compute_log_prob_awm`` and the ``exp_first`` loss of the training loop). For a rollout's clean latent ``x0``, noise
``eps`` and a time ``t`` in [0, 1], ``x_t = (1 - t) x0 + t eps`` and the flow-matching target is ``eps - x0``; with
``m = -mean_d (v_theta(x_t) - (eps - x0))^2`` (float64) the "log-likelihood" is ``w(t, m)``:

    uniform: m     t: m t     t2: m t^2     huber: -(sqrt(-m + 1e-10) - 1e-5) t     ghuber: -((-m + e)^p - e^p) t / p

(``e = 1e-10``). The objective per (sample, time) is PPO's clip on ``r = exp(l_theta - l_old)`` times the advantage,
the advantage first clamped to ``+-clip`` and rescaled to ``+-advantage_max`` (:func:`advantage_rescale`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from flowrl.losses.policy import policy_loss

#: The weightings ``w(t, m)`` of the authors' ``compute_log_prob_awm`` (their ``t**2`` is ``t2``, ``Uniform`` is
#: ``uniform``).
AWM_WEIGHTINGS = ("uniform", "t", "t2", "huber", "ghuber")
_EPS = 1e-10


def flow_matching_log_likelihood(v: Tensor, target: Tensor, t: Tensor, weighting: str = "ghuber",
                                 power: float = 0.25) -> Tensor:
    """``w(t, -mean_d (v - target)^2)`` per row ``[B]``, float64 (see the module docstring).

    Args:
        v: ``[B, ...]`` the velocity (with gradient). target: ``[B, ...]`` ``eps - x0``. t: ``[B]`` times in [0, 1].
        weighting: one of :data:`AWM_WEIGHTINGS`. power: ``p`` of ``ghuber`` (> 0).
    Raises:
        ValueError: an unknown weighting.

    >>> v, target, t = torch.tensor([[1.0, 3.0]]), torch.zeros(1, 2), torch.tensor([0.5])
    >>> flow_matching_log_likelihood(v, target, t, "t").item()  # m = -(1 + 9) / 2 = -5, times t
    -2.5
    >>> round(flow_matching_log_likelihood(v, target, t, "ghuber", 0.5).item(), 4)  # -(sqrt(5) - 1e-5) 0.5 / 0.5
    -2.2361
    """
    m = -(v.double() - target.double()).square().flatten(1).mean(1)
    t = t.double().reshape(-1)
    if weighting == "uniform":
        return m
    if weighting == "t":
        return m * t
    if weighting == "t2":
        return m * t**2
    if weighting == "huber":
        return -(torch.sqrt(-m + _EPS) - 1e-5) * t
    if weighting == "ghuber":
        return -((-m + _EPS) ** power - _EPS**power) * t / power
    raise ValueError(f"unknown AWM weighting {weighting!r}; choose one of {list(AWM_WEIGHTINGS)}")


def advantage_rescale(advantages: Tensor, clip: float = 5.0, advantage_max: Optional[float] = 1.0) -> Tensor:
    """``clamp(A, -clip, clip)``, then (``advantage_max`` set) ``/ clip * advantage_max``: the authors' rescale, not
    a second clamp.

    >>> advantage_rescale(torch.tensor([-7.0, 2.5])).tolist()
    [-1.0, 0.5]
    """
    a = advantages.clamp(-clip, clip)
    return a if advantage_max is None else a / clip * advantage_max


def awm_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor,
             clip_range: float = 1.0) -> tuple[Tensor, dict[str, Tensor]]:
    """``max(-A r, -A clip(r, 1 - c, 1 + c))`` per (sample, time) ``[P]`` with ``r = exp(l_theta - sg(l_old))``
    (their ``exp_first``), and the ratio metrics of :func:`~flowrl.losses.policy.policy_loss`. The authors' default
    ``c = 1`` never clips above 1 + 1 and clips below at 0, so on-policy this is ``-A exp(l - sg(l))``: value ``-A``,
    gradient ``-A grad l``.

    >>> loss, m = awm_loss(torch.tensor([-2.0], requires_grad=True), torch.tensor([-2.0]), torch.tensor([0.5]))
    >>> loss.tolist(), m["ratio_mean"].item()
    ([-0.5], 1.0)
    """
    one = torch.ones_like(log_prob, dtype=torch.bool)[:, None]
    loss, metrics = policy_loss("vanilla", log_prob[:, None], old_log_prob.detach().to(log_prob.dtype)[:, None],
                                advantages.to(log_prob.dtype)[:, None], one, clip_low=clip_range)
    return loss[:, 0], metrics
