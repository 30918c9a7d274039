"""The plain diffusers pipeline as the oracle of an adapter: its final latents for given start latents, and the
adapter's ODE sample through flowrl's own sampler from the same noise."""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.sampling.sampler import sample, seeded_noise

PROMPTS = ["a red cat", "a photo of a blue dog on the grass"]  # two lengths: the batch is padded and masked
SEEDS = torch.tensor([11, 12])


def start_noise(policy, seeds: Tensor = SEEDS) -> Tensor:
    """The initial noise ``[B, *latent_shape]`` of flowrl's rollout of ``seeds``."""
    return seeded_noise(seeds, policy.latent_shape(), 1)[:, 0]


def adapter_ode(policy, steps: int, guidance: float, prompts=PROMPTS, seeds: Tensor = SEEDS) -> Tensor:
    """The adapter's final latents ``[B, C, h, w]`` from ``flowrl.sampling.sampler.sample`` with the ``ode`` step."""
    cond = policy.encode(prompts)
    with torch.no_grad():
        latents, _ = sample(lambda z, s, rows: policy.velocity(z, s, cond, guidance), seeds, policy.sigmas(steps),
                            policy.latent_shape(), "ode")
    return latents[:, -1]


def pipeline_run(pipe, **call) -> tuple[Tensor, Tensor]:
    """``(final latents in the pipeline's own layout, images [B, 3, H, W] in [0, 1])`` of one pipeline call; the
    latents are read by a step-end callback (the decode path un-normalises and reshapes them before the VAE)."""
    seen = {}

    def keep(pipe, step, timestep, tensors):
        seen["latents"] = tensors["latents"]
        return {}

    pipe.set_progress_bar_config(disable=True)
    images = pipe(callback_on_step_end=keep, output_type="pt", **call).images
    return seen["latents"], images
