"""Rollouts: the one record every method fills, and the sampler loop that fills it for plain SDE/ODE sampling.

Noise is drawn per sample from a generator seeded by that sample's seed (initial noise first, then one draw per
step), so a trajectory depends only on its seed, its prompt and the weights: not on the batch it shares, the rank
it runs on or the device's batch kernels' draw order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from flowrl.sampling.steps import ODE_STEPS, get_step, ode_kind

#: ``velocity(z [B, ...], sigma [B]) -> v [B, ...]``: the model with its conditioning and guidance bound.
VelocityFn = Callable[[Tensor, Tensor], Tensor]


@dataclass
class Rollout:
    """A batch of trajectories. ``T`` steps; latents hold the ``T + 1`` states from noise (index 0) to the sample.

    Fields: prompts ``[B]``; group_ids, seeds ``[B]`` long; latents ``[B, T+1, ...]``; log_probs ``[B, T]`` (0 on
    deterministic steps); sigmas ``[B, T+1]``; train_mask ``[B, T]`` bool (steps the loss sees); images
    ``[B, 3, H, W]`` in ``[0, 1]``; rewards ``{name: [B]}``; step_rewards ``[B, T]``; completion_rewards ``[B, K]``
    the weighted total reward of the ODE completions of K states (dense step-reward methods); node_ids, parent_ids
    for branch and tree methods; nfe: model evaluations spent per trajectory (a CFG pair counts as one).
    """

    prompts: list[str]
    group_ids: Tensor
    seeds: Tensor
    latents: Tensor
    log_probs: Tensor
    sigmas: Tensor
    train_mask: Tensor
    images: Optional[Tensor] = None
    rewards: dict[str, Tensor] = field(default_factory=dict)
    step_rewards: Optional[Tensor] = None
    completion_rewards: Optional[Tensor] = None
    node_ids: Optional[Tensor] = None
    parent_ids: Optional[Tensor] = None
    nfe: int = 0

    @property
    def num_steps(self) -> int:
        return self.log_probs.shape[1]

    @classmethod
    def cat(cls, parts: Sequence["Rollout"]) -> "Rollout":
        """The rollouts of consecutive chunks of a batch as one (rows concatenated in order)."""
        def join(values):
            if values[0] is None or isinstance(values[0], int):
                return values[0]
            if isinstance(values[0], dict):
                return {key: torch.cat([v[key] for v in values]) for key in values[0]}
            return torch.cat(values) if torch.is_tensor(values[0]) else [x for v in values for x in v]

        return cls(**{f.name: join([getattr(p, f.name) for p in parts]) for f in fields(cls)})


def seeded_noise(seeds: Tensor, shape: Sequence[int], draws: int, device: torch.device | str = "cpu") -> Tensor:
    """Standard normal noise ``[B, draws, *shape]``, row ``i`` from a CPU generator seeded with ``seeds[i]``.

    >>> a = seeded_noise(torch.tensor([7, 8]), (2,), 3); b = seeded_noise(torch.tensor([8]), (2,), 3)
    >>> torch.equal(a[1], b[0])
    True
    """
    rows = []
    for seed in seeds.tolist():
        gen = torch.Generator().manual_seed(int(seed))
        rows.append(torch.randn((draws, *shape), generator=gen))
    return torch.stack(rows).to(device)


def sde_steps(num_steps: int, step_kind: str, sde_window: Optional[tuple[int, int]] = None) -> Tensor:
    """Which steps are stochastic ``[T]`` bool: all, or those in ``[start, end)``; a deterministic kind (``ode``,
    ``ddim_ode``) has none."""
    mask = torch.zeros(num_steps, dtype=torch.bool)
    if step_kind not in ODE_STEPS.values():
        start, end = sde_window or (0, num_steps)
        mask[start:end] = True
    return mask


@torch.no_grad()
def sample(
    velocity: VelocityFn,
    seeds: Tensor,
    sigmas: Tensor,
    latent_shape: Sequence[int],
    step_kind: str = "flow_grpo",
    noise_level: float | Tensor = 0.7,
    sde_mask: Optional[Tensor] = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """Run the sampler from seeded noise along ``sigmas [T+1]`` (shared) and record every state.

    Args:
        velocity: the bound model (see :data:`VelocityFn`).
        seeds: ``[B]`` long. sigmas: ``[T + 1]`` from 1 to 0.
        step_kind: the step used where ``sde_mask`` is True (elsewhere its deterministic form, ``ode_kind``).
        noise_level: a float or ``[T]`` per-step values (e.g. calibrated noise).
    Returns:
        latents ``[B, T+1, *latent_shape]`` and log_probs ``[B, T]`` (float32).
    """
    num_steps = sigmas.numel() - 1
    sde_mask = sde_steps(num_steps, step_kind) if sde_mask is None else sde_mask
    levels = torch.as_tensor(noise_level, dtype=torch.float32).expand(num_steps)
    noise = seeded_noise(seeds, latent_shape, num_steps + 1, device)  # [B, T+1, ...]
    batch = seeds.numel()
    latents = torch.empty((batch, num_steps + 1, *latent_shape), device=device)
    log_probs = torch.zeros(batch, num_steps, device=device)
    z = latents[:, 0] = noise[:, 0]
    for k in range(num_steps):
        sigma, sigma_next = sigmas[k].expand(batch).to(device), sigmas[k + 1].expand(batch).to(device)
        v = velocity(z, sigma)
        step = get_step(step_kind if sde_mask[k] else ode_kind(step_kind))
        out = step(z, v, sigma, sigma_next, noise=noise[:, k + 1], noise_level=levels[k])
        z = latents[:, k + 1] = out.z_next
        log_probs[:, k] = out.log_prob
    return latents, log_probs


def trained_steps(sde_mask: Tensor, timestep_fraction: float, sigmas: Tensor, step_kind: str) -> Tensor:
    """Steps the loss trains ``[T]``: stochastic steps among the first ``floor(T * timestep_fraction)`` (as
    flow_grpo), minus steps whose transition has zero std (CPS landing on sigma = 0; DDIM landing on sigma = 0 or
    not moving, as SD1.5's last step does with ``steps_offset = 0``).

    >>> trained_steps(torch.ones(10, dtype=torch.bool), 0.99, torch.linspace(1, 0, 11), "flow_grpo").sum().item()
    9
    """
    num_steps = sde_mask.numel()
    mask = sde_mask.clone()
    mask[int(num_steps * timestep_fraction):] = False
    if step_kind == "cps":
        mask &= sigmas[1:] > 0
    if step_kind == "ddim":
        mask &= (sigmas[1:] > 0) & (sigmas[1:] < sigmas[:-1])
    return mask
