"""Deterministic sampling with a model folder's own multistep solver (a diffusers scheduler's ``step``), for the
families whose pipeline does not step Euler (Wan's ``UniPCMultistepScheduler``): what ``generate`` draws for
validation, ``evaluate`` and ``predict``, so that these match the pipeline's output for the same noise. RL rollouts
keep flowrl's own SDE / ODE steps (:mod:`flowrl.sampling.steps`), whose log-probabilities the methods train on.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from flowrl.sampling.sampler import VelocityFn, seeded_noise


@torch.no_grad()
def solver_sample(velocity: VelocityFn, seeds: Tensor, sigmas: Tensor, latent_shape: Sequence[int], scheduler,
                  device: torch.device | str = "cpu") -> Tensor:
    """Final latents ``[B, *latent_shape]`` from the seeds' initial noise (the same as
    :func:`~flowrl.sampling.sampler.sample`'s), stepping ``scheduler``'s ``step`` on its grid of ``T`` steps.

    Args:
        velocity: the bound model, called at ``sigmas[i]`` (the policy's grid, whose timesteps are the scheduler's).
        sigmas: ``[T + 1]`` the policy's grid for ``T`` steps (its sigmas are the model's inputs; the scheduler steps
            on its own, which may differ in a guard, e.g. UniPC's first sigma ``1 - 1e-6``).
        scheduler: a fresh scheduler (it keeps multistep state; :meth:`~flowrl.policies.base.FlowPolicy.solver`).

    Raises:
        ValueError: the scheduler's grid has another number of steps than ``sigmas``.
    """
    num_steps = sigmas.numel() - 1
    scheduler.set_timesteps(num_steps, device=device)
    if len(scheduler.timesteps) != num_steps:
        raise ValueError(f"{type(scheduler).__name__} gives {len(scheduler.timesteps)} timesteps for {num_steps} "
                         "steps; its step cannot follow this grid")
    z = seeded_noise(seeds, latent_shape, 1, device)[:, 0]
    rows = torch.arange(len(seeds), device=device)
    for i, t in enumerate(scheduler.timesteps):
        v = velocity(z, sigmas[i].to(device).expand(len(z)), rows)
        z = scheduler.step(v, t, z, return_dict=False)[0]
    return z
