"""DiffusionNFT (arXiv 2509.16117): online RL on the forward process, from clean samples of any sampler.

Two LoRA adapters on one backbone (NVlabs/DiffusionNFT ``scripts/train_nft_sd3.py``: ``default`` and ``old``): the
policy (the policy's own adapter ``default``: trained, evaluated, averaged by ``EMA`` and exported) and ``old``, the
sampling policy, a frozen copy soft-updated after every batch, ``old <- d old + (1 - d) policy`` with the decay
schedule of :func:`~flowrl.losses.nft.old_decay` (the code's ``return_decay``). The reference for the KL-style term is
the backbone without adapters.

One training step = one batch: ``old`` samples ``num_steps`` steps (the deterministic ODE by default, CFG-free by
default: any sampler works, only the clean latents are kept); the images are scored and given group advantages
(``grpo@flow_grpo``), mapped to optimality probabilities ``r``; each sample is trained at
``floor(T * timestep_fraction)`` of the schedule's noise levels (a random subset per sample) on freshly noised copies
``x_t = (1 - t) x0 + t eps`` with the negative-aware loss (:func:`~flowrl.losses.nft.nft_loss`) plus
``beta mean((v - v_ref)^2)``, in ``num_minibatches`` optimizer steps over the batch of every rank.

Randomness is a function of (seed, step, row seed), so resume is exact and 2 ranks equal 1. Deviations from the code:
the rollout uses flowrl's Euler ODE on the policy's schedule (the code: a second-order "dpm2" solver), the loss's
velocities are conditional even when sampling uses CFG (the code concatenates unconditional embeddings there).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.losses.nft import ADVANTAGE_MODES, nft_loss, optimality_probability
from flowrl.methods.forward_process import ForwardProcess, OldDecay
from flowrl.methods.option_surface import at_least
from flowrl.policies.base import FlowPolicy

__all__ = ["DiffusionNFT", "OldDecay"]


class DiffusionNFT(ForwardProcess):
    """DiffusionNFT. Options beyond the forward-process update's (:class:`~flowrl.methods.forward_process.
    ForwardProcess`; ``guidance_scale`` is the sampler's CFG, 1 by default):

    Args:
        guidance_scale: the sampler's classifier-free guidance (1: CFG-free, the code's default).
        step_kind: the sampler step (null: the policy's ODE; ``flow_grpo``, ``cps``, ``dance`` sample an SDE).
        noise_level: the SDE's noise scale (SDE steps only).
        nft_beta: strength beta of the implicit positive and negative policies (the code: 1; 0.1 for OCR and
            multi-reward).
        beta: weight of ``mean((v - v_ref)^2)`` to the reference (the code's ``train.beta``, 1e-4).
        advantage_clip: advantages are clipped to +-this, mapped to ``r = A / clip / 2 + 1/2``, and the loss is
            multiplied by it (``adv_clip_max``, 5).
        advantage_mode: ``all``, ``positive_only``, ``negative_only``, ``one_only`` or ``binary`` (``adv_mode``).
        timestep_fraction: each sample trains at ``floor(T * timestep_fraction)`` of the schedule's T noise levels.
        num_minibatches: optimizer steps per batch (the code's ``gradient_step_per_epoch``: 1; 2 for OCR).
        micro_batch_size: (sample, noise level) pairs per forward pass (None: a minibatch's pairs at once).
        old_decay: the soft update of the sampling policy ``old`` after each batch.
    """

    def __init__(self, policy: FlowPolicy, guidance_scale: float = 1.0, step_kind: Optional[str] = None,
                 noise_level: float = 0.7, nft_beta: float = 1.0, beta: float = 1e-4, advantage_clip: float = 5.0,
                 advantage_mode: str = "all", timestep_fraction: float = 0.99, num_minibatches: int = 1,
                 micro_batch_size: Optional[int] = None, old_decay: OldDecay = OldDecay(), **kwargs: Any):
        super().__init__(policy, guidance_scale=guidance_scale, step_kind=step_kind, noise_level=noise_level,
                         beta=beta, advantage_clip=advantage_clip, timestep_fraction=timestep_fraction,
                         num_minibatches=num_minibatches, micro_batch_size=micro_batch_size, old_decay=old_decay,
                         **kwargs)
        self.nft_beta, self.advantage_mode = nft_beta, advantage_mode

    def problems(self) -> list[str]:
        problems = super().problems() + at_least(self, 0, ("nft_beta",), strict=True)
        if self.advantage_mode not in ADVANTAGE_MODES:
            problems.append(f"model.advantage_mode={self.advantage_mode!r}: choose one of {list(ADVANTAGE_MODES)}")
        return problems

    def sample_targets(self, advantages: Tensor, valid: Tensor) -> Tensor:
        """The optimality probabilities ``r`` (0.5 where no reward: no preference either way)."""
        r = optimality_probability(advantages, self.advantage_clip, self.advantage_mode)
        return torch.where(valid, r, torch.full_like(r, 0.5))

    def pair_loss(self, x0: Tensor, t: Tensor, r: Tensor, cond, seeds: Tensor, level_ids: Tensor) -> Tensor:
        """The loss ``[P]`` of (sample, noise level) pairs: the NFT loss plus ``beta`` times the reference term."""
        x_t, _ = self.noised(x0, t, seeds, level_ids)
        with torch.no_grad(), self.policy.adapter("old"):
            v_old = self.generation.velocity(x_t, t, cond, 1.0)
        v = self.generation.velocity(x_t, t, cond, 1.0)
        loss = nft_loss(v, v_old, x_t, x0, t, r, self.nft_beta, self.advantage_clip)
        if self.beta > 0:
            loss = loss + self.reference_term(v, x_t, t, cond)
        return loss
