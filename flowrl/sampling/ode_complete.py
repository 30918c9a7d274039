"""ODE completion: from latents at any step of a rollout, the deterministic Euler ODE of the policy down to sigma 0.

Dense step-reward methods (DenseGRPO arXiv 2601.20218 Eq. 8, TP-GRPO arXiv 2602.06422) score the clean image that
the current policy would reach from each intermediate latent. All (trajectory, start step) pairs advance together
in one batch with per-sample sigmas, and a pair drops out of the batch once it reaches sigma 0, so completing every
step of a batch costs ``max`` (not ``sum``) sequential model calls. NFE accounting counts one evaluation per row of
every velocity call (a classifier-free guidance pair is one evaluation, as the papers count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from flowrl.sampling.sampler import VelocityFn, sample_from


@dataclass
class Completion:
    """Clean latents ``[N, *shape]`` at sigma 0 and the model evaluations each one took, ``nfe [N]`` long."""

    latents: Tensor
    nfe: Tensor


def completion_sigmas(sigmas: Tensor, start: Tensor, completion_steps: Optional[int] = None,
                      granularity: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Per-sample sigma grids of the completions, padded with zeros.

    Full completions follow the remaining schedule ``sigmas[start:]``. With ``completion_steps = n`` a completion
    takes ``min(n, T - start)`` Euler steps on the remaining schedule interpolated at evenly spaced fractional
    indices between ``start`` and ``T`` (so ``n = T - start`` is the remaining schedule itself). With a
    ``granularity`` ``g`` (G²RPO) a completion steps to the next schedule point, then every ``g``-th one, and its
    last step lands on 0: ``sigma[s], sigma[s + 1::g]`` with the last point replaced by 0, ``ceil((T - s) / g)``
    steps (``bcmi/Granular-GRPO`` ``fastvideo/train_g2rpo_hps.py``: the grid ``sigma[:k + 2] ++ sigma[k + 2::g]``
    from ``s = k + 1``, scored at ``x0_hat`` of its last input, which is the Euler step from there to 0).

    Args:
        sigmas: ``[T + 1]`` shared schedule from 1 to 0. start: ``[N]`` long in ``[0, T]``.
        completion_steps: ``n >= 1`` or None (the full remaining schedule).
        granularity: ``[N]`` long ``>= 1``, or None (every step); not with ``completion_steps``.
    Returns:
        grid ``[N, S + 1]`` (``S`` the most steps of any sample; ``grid[i, steps[i]:] == 0``) and steps ``[N]`` long.

    >>> grid, steps = completion_sigmas(torch.tensor([1.0, 0.8, 0.5, 0.0]), torch.tensor([0, 2, 3]))
    >>> grid, steps.tolist()
    (tensor([[1.0000, 0.8000, 0.5000, 0.0000],
            [0.5000, 0.0000, 0.0000, 0.0000],
            [0.0000, 0.0000, 0.0000, 0.0000]]), [3, 1, 0])
    >>> completion_sigmas(torch.tensor([1.0, 0.8, 0.5, 0.0]), torch.tensor([0]), 2)[0]  # indices 0, 1.5, 3
    tensor([[1.0000, 0.6500, 0.0000]])
    >>> s5 = torch.tensor([1.0, 0.9, 0.7, 0.5, 0.3, 0.0])  # T = 5, g = 2
    >>> grid, steps = completion_sigmas(s5, torch.tensor([1, 2]), granularity=torch.tensor([2, 2]))
    >>> grid, steps.tolist()  # from 1: sigma[1], sigma[2::2] = 0.9, (0.7, 0.3 -> 0); from 2: 0.7, (0.5, 0.0)
    (tensor([[0.9000, 0.7000, 0.0000],
            [0.7000, 0.5000, 0.0000]]), [2, 2])
    """
    num_steps = sigmas.numel() - 1
    start = start.long().to(sigmas.device)
    if start.numel() and (start.min() < 0 or start.max() > num_steps):
        raise ValueError(f"start indices must lie in [0, {num_steps}] (the schedule has T={num_steps} steps); "
                         f"got {start.min().item()}..{start.max().item()}")
    if completion_steps is not None and completion_steps < 1:
        raise ValueError(f"completion_steps={completion_steps} must be >= 1 (or None: the full remaining schedule)")
    if granularity is not None:
        if completion_steps is not None:
            raise ValueError("give completion_steps or granularity, not both: each sets the completion's grid")
        return _granular_sigmas(sigmas, start, granularity.long().to(sigmas.device))
    remaining = num_steps - start  # [N]
    steps = remaining if completion_steps is None else remaining.clamp(max=completion_steps)
    width = int(steps.max()) if steps.numel() else 0
    j = torch.arange(width + 1, device=sigmas.device, dtype=torch.float64)  # [S + 1]
    # fractional schedule index of grid point j: start + j * remaining / steps, capped at T (the padding)
    frac = start[:, None] + j[None] * (remaining / steps.clamp(min=1))[:, None].double()
    frac = frac.clamp(max=num_steps)
    low = frac.floor().long().clamp(max=num_steps - 1) if num_steps > 0 else frac.long()
    sig = sigmas.double()
    grid = sig[low] + (frac - low) * (sig[(low + 1).clamp(max=num_steps)] - sig[low])
    grid = torch.where(j[None] >= steps[:, None], torch.zeros_like(grid), grid)
    return grid.to(sigmas.dtype), steps


def _granular_sigmas(sigmas: Tensor, start: Tensor, granularity: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`completion_sigmas` at a granularity per sample (see there)."""
    num_steps = sigmas.numel() - 1
    if granularity.numel() and granularity.min() < 1:
        raise ValueError(f"granularities must be >= 1; got {granularity.min().item()}")
    steps = torch.div(num_steps - start + granularity - 1, granularity, rounding_mode="floor")  # ceil((T - s) / g)
    width = int(steps.max()) if steps.numel() else 0
    j = torch.arange(width + 1, device=sigmas.device)[None]  # [1, S + 1]
    index = torch.where(j == 0, start[:, None], start[:, None] + 1 + (j - 1) * granularity[:, None])
    grid = sigmas[index.clamp(max=num_steps)]
    return torch.where(j >= steps[:, None], torch.zeros_like(grid), grid), steps


@torch.no_grad()
def ode_complete(velocity: VelocityFn, latents: Tensor, rows: Tensor, start: Tensor, sigmas: Tensor,
                 completion_steps: Optional[int] = None, chunk_size: Optional[int] = None,
                 step_kind: str = "ode", granularity: Optional[Tensor] = None) -> Completion:
    """Complete ``latents`` to sigma 0 with the Euler ODE, every (trajectory, start) pair in one batch.

    Args:
        velocity: the policy with its guidance bound, see :data:`VelocityFn`, e.g.
            ``lambda z, s, rows: policy.velocity(z, s, cond.select(rows), guidance_scale)``.
        latents: ``[N, *shape]`` states to complete. rows: ``[N]`` long, the trajectory (conditioning row) of each.
        start: ``[N]`` long, index into ``sigmas`` of each state's sigma (``T``: already clean, 0 evaluations).
        sigmas: ``[T + 1]`` shared schedule from 1 to 0.
        completion_steps: Euler steps per completion (capped by the remaining steps); None: the remaining schedule.
        chunk_size: at most this many rows per velocity call (memory); None: all active pairs at once.
        step_kind: the deterministic step (``ode``; ``ddim_ode`` for epsilon-prediction models, see
            :func:`~flowrl.sampling.steps.ode_kind`).
        granularity: ``[N]`` each completion's granularity (G²RPO's coarser grids, :func:`completion_sigmas`).
    Returns:
        :class:`Completion` with latents ``[N, *shape]`` (float32) and nfe ``[N]``.

    >>> v = lambda z, s, rows: torch.ones_like(z)  # dz/dsigma = 1: z(0) = z - sigma_start
    >>> sigmas = torch.tensor([1.0, 0.4, 0.0])
    >>> out = ode_complete(v, torch.zeros(2, 1), torch.tensor([0, 1]), torch.tensor([0, 1]), sigmas)
    >>> out.latents[:, 0], out.nfe.tolist()
    (tensor([-1.0000, -0.4000]), [2, 1])
    """
    if latents.shape[0] != rows.shape[0] or latents.shape[0] != start.shape[0]:
        raise ValueError(f"latents, rows and start need one entry per state; got {latents.shape[0]}, "
                         f"{rows.shape[0]} and {start.shape[0]}")
    grid, steps = completion_sigmas(sigmas.float(), start, completion_steps, granularity)
    # the step loop on each pair's own remaining schedule: a pair leaves the model calls once it reaches sigma 0
    done, _ = sample_from(velocity, latents.float().clone(), grid.to(latents.device), 0, None, step_kind,
                          rows=rows.long().to(latents.device), steps=steps, chunk_size=chunk_size, keep_states=False)
    return Completion(latents=done[:, 0], nfe=steps.to(latents.device))


def complete_trajectories(velocity: VelocityFn, trajectory_latents: Tensor, sigmas: Tensor,
                          starts: Optional[Tensor] = None, completion_steps: Optional[int] = None,
                          chunk_size: Optional[int] = None, step_kind: str = "ode") -> Completion:
    """ODE completions of the states of a batch of rollouts, all in one :func:`ode_complete` batch.

    Args:
        trajectory_latents: ``[B, T + 1, *shape]`` (a :class:`~flowrl.sampling.rollout.Rollout`'s latents).
        starts: ``[K]`` long, the state indices to complete (the latent before step k is index k); None: ``0..T-1``.
        Others as :func:`ode_complete`.
    Returns:
        :class:`Completion` with latents ``[B, K, *shape]`` and nfe ``[B, K]``.

    >>> v = lambda z, s, rows: torch.ones_like(z)
    >>> out = complete_trajectories(v, torch.zeros(2, 3, 1), torch.tensor([1.0, 0.4, 0.0]))
    >>> out.latents.shape, out.nfe.tolist()
    (torch.Size([2, 2, 1]), [[2, 1], [2, 1]])
    """
    batch, num_states = trajectory_latents.shape[:2]
    device = trajectory_latents.device
    starts = torch.arange(num_states - 1, device=device) if starts is None else starts.long().to(device)
    rows = torch.arange(batch, device=device).repeat_interleave(len(starts))  # [B * K] trajectory-major
    start = starts.repeat(batch)  # [B * K]
    out = ode_complete(velocity, trajectory_latents[rows, start], rows, start, sigmas, completion_steps, chunk_size,
                       step_kind)
    shape = (batch, len(starts))
    return Completion(latents=out.latents.reshape(*shape, *out.latents.shape[1:]), nfe=out.nfe.reshape(shape))
