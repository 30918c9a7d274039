"""AWM, Advantage Weighted Matching (arXiv 2509.25050, ICML 2026): the policy gradient on the flow-matching loss.

The forward-process update of :class:`~flowrl.methods.forward_process.ForwardProcess` (DiffusionNFT's sibling): each
rollout's clean latent, noised at ``num_train_times`` of the schedule's noise levels with one noise for the old and
the new forward, gets the weighted flow-matching log-likelihood ``l = w(t, -mean (v - (eps - x0))^2)``
(:func:`~flowrl.losses.awm.flow_matching_log_likelihood`) and the PPO-clipped ``exp(l - l_old)`` times its rescaled
advantage (:func:`~flowrl.losses.awm.awm_loss`), plus ``beta mean((v - v_ref)^2)`` to the backbone and
``ema_beta mean((v - v_ema)^2)`` to a third adapter ``velocity_ema`` that follows the policy once per batch with the
decay ``min(0.3, 0.001 n)`` (their ``kl_ema_decay_type: linear``). Read from the authors'
``scxue/advantage_weighted_matching`` ``scripts/train_sd3_awm.py`` and ``config/dgx_awm.py`` (@be51372).

``l_old`` is the sampling policy's (the adapter ``old``): with one minibatch and ``old`` following the policy
(``old_decay`` 0, their ``off_policy: False``) it is the detached ``l`` itself, as their loop does, so no extra forward
is spent and the ratio is exactly 1. Deviations: each sample draws its own stratified times (theirs: one draw per
micro-batch); ``beta`` and ``ema_beta`` may be 0 (their script then fails).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.losses.awm import AWM_WEIGHTINGS, advantage_rescale, awm_loss, flow_matching_log_likelihood
from flowrl.methods.forward_process import ForwardProcess, OldDecay
from flowrl.policies.base import FlowPolicy
from flowrl.losses.nft import old_decay
from flowrl.sampling.sampler import branch_seed, fraction_steps
from flowrl.training.adapter_steps import follow


class AWM(ForwardProcess):
    """AWM. Options beyond the forward-process update's (:class:`~flowrl.methods.forward_process.ForwardProcess`):

    Args:
        weighting: ``w(t, m)`` of the log-likelihood: ``uniform``, ``t``, ``t2``, ``huber`` or ``ghuber`` (theirs).
        ghuber_power: ``p`` of ``ghuber`` (0.25).
        clip_range: PPO clip of the ratio, ``[1 - c, 1 + c]`` (theirs: 1).
        advantage_max: advantages clipped to ``advantage_clip`` are rescaled to ``+-advantage_max`` (null: kept).
        num_train_times: noise levels per sample, one drawn from each of as many equal strata of the first
            ``floor(T * timestep_fraction)`` levels after the first (their ``discrete_wo_init``: 6 of 14 at 0.9).
        ema_beta: weight of ``mean((v - v_ema)^2)`` to the adapter ``velocity_ema`` (theirs: 1; 0: off).
        ema_follow: ``velocity_ema``'s decay after each batch (theirs: ``min(0.3, 0.001 n)``).
    """

    named_adapters = ("old", "velocity_ema")

    def __init__(self, policy: FlowPolicy, weighting: str = "ghuber", ghuber_power: float = 0.25,
                 clip_range: float = 1.0, advantage_max: Optional[float] = 1.0, num_train_times: int = 6,
                 beta: float = 1e-3, timestep_fraction: float = 0.9, old_decay: OldDecay = OldDecay(0, 0.0, 0.0),
                 ema_beta: float = 1.0, ema_follow: OldDecay = OldDecay(0, 0.001, 0.3), **kwargs: Any):
        super().__init__(policy, beta=beta, timestep_fraction=timestep_fraction, old_decay=old_decay, **kwargs)
        self.weighting, self.ghuber_power, self.clip_range = weighting, ghuber_power, clip_range
        self.advantage_max, self.num_train_times = advantage_max, num_train_times
        self.ema_beta, self.ema_follow = ema_beta, ema_follow

    def setup_weights(self) -> None:
        super().setup_weights()
        self.policy.add_adapter("velocity_ema", self.policy.lora, trainable=False)
        follow(self.policy, "velocity_ema", "default", 0.0)  # a copy

    def problems(self) -> list[str]:
        rules = {"weighting": (self.weighting in AWM_WEIGHTINGS, f"one of {list(AWM_WEIGHTINGS)}"),
                 "ghuber_power": (self.ghuber_power > 0, "> 0 (theirs: 0.25)"),
                 "clip_range": (0 <= self.clip_range <= 1, "in [0, 1] (theirs: 1)"),
                 "advantage_max": (self.advantage_max is None or self.advantage_max > 0, "> 0 or null"),
                 "num_train_times": (1 <= self.num_train_times, ">= 1 (theirs: 6)"),
                 "ema_beta": (self.ema_beta >= 0, ">= 0 (theirs: 1)")}
        return super().problems() + [f"model.{key}={getattr(self, key)!r} must be {what}"
                                     for key, (ok, what) in rules.items() if not ok]

    def sample_targets(self, advantages: Tensor, valid: Tensor) -> Tensor:
        """The rescaled advantages (0 where no reward)."""
        return torch.where(valid, advantage_rescale(advantages, self.advantage_clip, self.advantage_max), 0.0)

    def update(self, rollout, cond, batch) -> dict[str, float]:
        """The forward-process update, then ``velocity_ema`` follows the policy."""
        metrics = super().update(rollout, cond, batch)
        e = self.ema_follow
        follow(self.policy, "velocity_ema", "default", old_decay(self.global_step, e.delay, e.rate, e.limit))
        return metrics

    def times_per_sample(self, num_levels: int) -> int:
        return self.num_train_times

    def level_ids(self, seed: Tensor, num_levels: int, count: int) -> Tensor:
        """One level from each of ``count`` strata of ``[1, floor(T * timestep_fraction))`` (their
        ``discrete_wo_init``: ``lower + floor(u (upper - lower))`` on ``linspace(1, floor(T f), count + 1)``)."""
        bounds = torch.linspace(1, fraction_steps(num_levels, self.timestep_fraction), count + 1).long()
        u = torch.rand(count, generator=torch.Generator().manual_seed(
            branch_seed(int(seed), [self.seed, self.global_step])))
        return (bounds[:-1] + (u * (bounds[1:] - bounds[:-1])).long()).clamp(max=num_levels - 1)

    def pair_loss(self, x0: Tensor, t: Tensor, r: Tensor, cond, seeds: Tensor, level_ids: Tensor) -> Tensor:
        """The loss ``[P]`` of (sample, noise level) pairs: the clipped advantage-weighted ratio plus ``beta`` times
        the reference term."""
        x_t, noise = self.noised(x0, t, seeds, level_ids)
        log_prob = lambda v: flow_matching_log_likelihood(v, noise - x0, t, self.weighting,  # noqa: E731
                                                          self.ghuber_power)
        v = self.generation.velocity(x_t, t, cond, 1.0)
        if self.num_minibatches == 1 and self.old_decay.rate * self.old_decay.limit == 0:  # old is the policy
            old = log_prob(v).detach()
        else:
            with torch.no_grad(), self.policy.adapter("old"):
                old = log_prob(self.generation.velocity(x_t, t, cond, 1.0))
        loss, _ = awm_loss(log_prob(v), old, r, self.clip_range)
        if self.beta > 0:
            loss = loss + self.reference_term(v, x_t, t, cond)
        if self.ema_beta > 0:
            with torch.no_grad(), self.policy.adapter("velocity_ema"):
                v_ema = self.generation.velocity(x_t, t, cond, 1.0)
            loss = loss + self.ema_beta * (v - v_ema).square().flatten(1).mean(1)
        return loss.float()
