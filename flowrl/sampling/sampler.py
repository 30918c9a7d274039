"""The one sampler primitive, ``sample_from``, and the noise it consumes.

``sample_from`` continues a batch of trajectories from latents at any step ``k`` of a schedule, with a per-row,
per-step choice of the SDE step or its ODE, and the noise of each step given by the caller. Plain sampling
(:func:`sample`), a window of SDE steps inside an ODE trajectory (TP-GRPO), a shared prefix continued by branches
(tree methods) and ODE completions of intermediate states are all calls of it.

Noise is drawn per row from a CPU generator seeded by that row's seed (the initial noise first, then one draw per
step), so a trajectory depends only on its seed, its prompt and the weights: not on the batch it shares, the rank it
runs on or the device's kernels' draw order. A branch's seed is derived from its tree's seed and its path of child
indices (:func:`branch_seed`), so the same config gives the same tree bit for bit on any number of processes.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from flowrl.sampling.steps import ODE_STEPS, get_step, ode_kind

#: ``velocity(z [B, ...], sigma [B]) -> v [B, ...]``: the model with its conditioning and guidance bound.
VelocityFn = Callable[[Tensor, Tensor], Tensor]

_MASK64 = (1 << 64) - 1


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


def branch_seed(seed: int, path: Sequence[int]) -> int:
    """The seed of the node reached from a tree seeded ``seed`` by the child indices ``path`` (splitmix64 mixing of
    each step of the path, so siblings and cousins get unrelated noise); the empty path is the tree's own seed.

    >>> branch_seed(5, []), branch_seed(5, [0]) != branch_seed(5, [1]), branch_seed(5, [0, 1]) != branch_seed(5, [1, 0])
    (5, True, True)
    >>> 0 <= branch_seed(2**62, [3, 1, 4]) < 2**63
    True
    """
    value = int(seed)
    for child in path:
        z = (value + 0x9E3779B97F4A7C15 * (int(child) + 1)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        value = (z ^ (z >> 31)) >> 1  # a non-negative int64 for torch.Generator.manual_seed and long tensors
    return value


def path_noise(seeds: Tensor, paths: Sequence[Sequence[int]], shape: Sequence[int], draws: int,
               device: torch.device | str = "cpu") -> Tensor:
    """Noise ``[B, draws, *shape]`` for rows that continue a tree along ``paths``: row ``i`` draws from
    ``branch_seed(seeds[i], paths[i])``.

    >>> n = path_noise(torch.tensor([3, 3]), [[0], [1]], (2,), 1)
    >>> torch.equal(n[0], n[1]), torch.equal(path_noise(torch.tensor([3]), [[]], (2,), 1), seeded_noise(
    ...     torch.tensor([3]), (2,), 1))
    (False, True)
    """
    return seeded_noise(torch.tensor([branch_seed(s, p) for s, p in zip(seeds.tolist(), paths)]), shape, draws,
                        device)


@torch.no_grad()
def sample_from(velocity: VelocityFn, z: Tensor, sigmas: Tensor, start: int, noise: Tensor,
                step_kind: str = "flow_grpo", sde_mask: Optional[Tensor] = None,
                noise_level: float | Tensor = 0.7, velocities: Optional[list[Tensor]] = None) -> tuple[Tensor, Tensor]:
    """Continue trajectories from latents ``z [B, ...]`` at step ``start`` of ``sigmas`` for ``n`` steps.

    Args:
        velocity: the bound model (see :data:`VelocityFn`).
        z: ``[B, *latent_shape]`` the states at step ``start``.
        sigmas: ``[T + 1]`` the schedule (shared by the rows). start: the step ``z`` is at.
        noise: ``[B, n, *latent_shape]`` the noise of steps ``start .. start + n - 1`` (ignored on ODE steps).
        step_kind: the SDE step; where ``sde_mask`` is False its deterministic form (``ode_kind``) runs instead.
        sde_mask: ``[n]`` or ``[B, n]`` bool, per step or per row and step; None: the SDE on every step.
        noise_level: a float or ``[T]`` per schedule step (e.g. calibrated noise).
        velocities: a list that receives the model output of each step (for estimates that reuse it).
    Returns:
        latents ``[B, n + 1, *latent_shape]`` (``z`` first) and log_probs ``[B, n]`` (float32, 0 on ODE steps).
    """
    batch, n = z.shape[0], noise.shape[1]
    levels = torch.as_tensor(noise_level, dtype=torch.float32).expand(sigmas.numel() - 1)
    mask = torch.ones(n, dtype=torch.bool) if sde_mask is None else sde_mask
    mask = mask.expand(batch, n).cpu()
    sde, ode = get_step(step_kind), get_step(ode_kind(step_kind))
    latents = torch.empty((batch, n + 1, *z.shape[1:]), device=z.device, dtype=z.dtype)
    log_probs = torch.zeros(batch, n, device=z.device)
    latents[:, 0] = z
    for i in range(n):
        k = start + i
        sigma, sigma_next = sigmas[k].expand(batch).to(z.device), sigmas[k + 1].expand(batch).to(z.device)
        v = velocity(z, sigma)
        if velocities is not None:
            velocities.append(v)
        rows = mask[:, i]
        outs = [step(z, v, sigma, sigma_next, noise=noise[:, i], noise_level=levels[k])
                for step, needed in ((sde, rows.any()), (ode, not rows.all())) if needed]
        if len(outs) == 1:
            z_next, log_prob = outs[0].z_next, outs[0].log_prob
        else:  # a step on which some rows branch (SDE) and others follow the ODE
            pick = rows.to(z.device)
            z_next = torch.where(pick.view(-1, *[1] * (z.dim() - 1)), outs[0].z_next, outs[1].z_next)
            log_prob = torch.where(pick, outs[0].log_prob, outs[1].log_prob)
        z = latents[:, i + 1] = z_next
        log_probs[:, i] = log_prob
    return latents, log_probs


@torch.no_grad()
def sample(velocity: VelocityFn, seeds: Tensor, sigmas: Tensor, latent_shape: Sequence[int],
           step_kind: str = "flow_grpo", noise_level: float | Tensor = 0.7, sde_mask: Optional[Tensor] = None,
           device: torch.device | str = "cpu", velocities: Optional[list[Tensor]] = None) -> tuple[Tensor, Tensor]:
    """Whole trajectories from seeded noise along ``sigmas [T+1]``: ``sample_from`` step 0 with ``seeded_noise``.

    Args:
        seeds: ``[B]`` long. sigmas: ``[T + 1]`` from 1 to 0. sde_mask: ``[T]`` or ``[B, T]`` (default: the SDE
            on every step of an SDE kind, none for an ODE kind).
    Returns:
        latents ``[B, T+1, *latent_shape]`` and log_probs ``[B, T]`` (float32).
    """
    num_steps = sigmas.numel() - 1
    sde_mask = sde_steps(num_steps, step_kind) if sde_mask is None else sde_mask
    noise = seeded_noise(seeds, latent_shape, num_steps + 1, device)  # [B, T+1, ...]
    return sample_from(velocity, noise[:, 0], sigmas, 0, noise[:, 1:], step_kind, sde_mask, noise_level, velocities)


def sde_steps(num_steps: int, step_kind: str, sde_window: Optional[tuple[int, int]] = None) -> Tensor:
    """Which steps are stochastic ``[T]`` bool: all, or those in ``[start, end)``; a deterministic kind (``ode``,
    ``ddim_ode``) has none."""
    mask = torch.zeros(num_steps, dtype=torch.bool)
    if step_kind not in ODE_STEPS.values():
        start, end = sde_window or (0, num_steps)
        mask[start:end] = True
    return mask


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
