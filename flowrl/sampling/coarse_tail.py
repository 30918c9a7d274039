"""MixGRPO-Flash's compressed ODE tail: the steps after the SDE window integrated on a coarser grid.

MixGRPO-Flash (arXiv 2507.21802; ``Tencent-Hunyuan/MixGRPO`` ``fastvideo/utils/sampling_utils.py``,
``run_sample_step``, ``--dpm_post_compress_ratio``, 0.4 by default) rebuilds the schedule after the window's last
SDE step ``L``: ``num_post_steps = int(max((T - L) * ratio, 1))`` points from the time after the window to 0, so
``num_post_steps - 1`` ODE steps instead of the grid's ``T - L - 1``. Only the model calls after the window are
saved: the window's steps (what trains) are the same.

flowrl's grid after the window is a sub-grid of the rollout's own schedule, at rounded evenly spaced indices from
``L + 1`` to ``T`` (:func:`tail_indices`); the authors re-space linearly in time and re-apply SD3's shift, which is
the same points for a shifted linear grid where ``(T - L - 1) / (points - 1)`` is a whole number, and a sub-grid
holds for every policy's schedule. It takes at least one step (the authors' count gives none, ending off 0, when
``(T - L) * ratio < 2``). A trajectory sampled on the coarse grid is put back on the full one by
:func:`expand_to_grid`: a skipped state is the linear interpolation in sigma between the computed states around it,
which is exactly the Euler path of the coarse step (a chord of a multistep solver's or DDIM's), and its log-prob 0
(the ODE's).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def tail_points(num_steps: int, last: int, ratio: float) -> int:
    """How many grid points the tail after the SDE step ``last`` keeps, ``T - last`` of them on the full grid:
    the authors' ``int((T - L) * ratio)``, at least 2 (one step, so that the trajectory ends at sigma 0) and at
    most all of them.

    >>> tail_points(6, 1, 0.6), tail_points(6, 1, 0.4), tail_points(6, 1, 0.2), tail_points(6, 5, 0.4)
    (3, 2, 2, 1)
    """
    return min(max(int((num_steps - last) * ratio), 2), num_steps - last)


def tail_indices(num_steps: int, last: int, ratio: float) -> list[int]:
    """The full grid's indices the tail after the SDE step ``last`` is computed at: :func:`tail_points` of them,
    evenly spaced from ``last + 1`` to ``T`` and rounded half up (distinct: they are at least one apart).

    >>> tail_indices(6, 1, 0.6), tail_indices(6, 1, 0.4), tail_indices(6, 1, 1.0)
    ([2, 4, 6], [2, 6], [2, 3, 4, 5, 6])
    >>> tail_indices(25, 3, 0.4)  # the authors' 25 steps, a window ending at step 3: 8 points, 7 steps for 21
    [4, 7, 10, 13, 16, 19, 22, 25]
    """
    if not 0 <= last < num_steps or not 0 < ratio <= 1:
        raise ValueError(f"tail_indices(num_steps={num_steps}, last={last}, ratio={ratio}): needs 0 <= last < T and "
                         "0 < ratio <= 1")
    points, span = tail_points(num_steps, last, ratio), num_steps - last - 1
    if points == 1:
        return [num_steps]
    # round(j * span / (points - 1)) half up, in integers so that no float decides a tie
    return [last + 1 + (2 * j * span + points - 1) // (2 * (points - 1)) for j in range(points)]


def last_stochastic_step(sde_mask: Tensor) -> Optional[int]:
    """The last step that is stochastic for some row of ``sde_mask [T]`` or ``[B, T]`` (None: none is).

    >>> last_stochastic_step(torch.tensor([[True, False, False], [False, True, False]])), last_stochastic_step(
    ...     torch.zeros(3, dtype=torch.bool))
    (1, None)
    """
    stochastic = sde_mask.reshape(-1, sde_mask.shape[-1]).any(0).nonzero()
    return int(stochastic.max()) if len(stochastic) else None


def coarse_grid(sde_mask: Tensor, ratio: float) -> Optional[Tensor]:
    """The full grid's indices ``[n + 1]`` (long) a rollout with the stochastic steps ``sde_mask [T]`` (or
    ``[B, T]``: after every row's last) computes: every index up to the step after the last stochastic one, then
    :func:`tail_indices`. None when nothing is skipped (``ratio`` 1, no stochastic step, or none after it).

    >>> coarse_grid(torch.tensor([True, True, False, False, False, False]), 0.6).tolist()
    [0, 1, 2, 4, 6]
    >>> coarse_grid(torch.tensor([True, True, False, False, False, False]), 1.0) is None
    True
    """
    num_steps, last = sde_mask.shape[-1], last_stochastic_step(sde_mask)
    if ratio >= 1 or last is None:
        return None
    tail = tail_indices(num_steps, last, ratio)
    if len(tail) == num_steps - last:
        return None
    return torch.tensor(list(range(last + 1)) + tail)


def grid_problem(sde_mask: Tensor, grid: Tensor) -> Optional[str]:
    """Why ``grid`` cannot coarsen a rollout with the stochastic steps ``sde_mask [T]`` or ``[B, T]`` (None: it
    can): it must run from 0 to ``T`` increasing, and a step it merges with the next must be deterministic."""
    num_steps, grid = sde_mask.shape[-1], grid.cpu()
    if grid[0] != 0 or grid[-1] != num_steps or not bool((grid.diff() > 0).all()):
        return f"the grid {grid.tolist()} must rise from 0 to T = {num_steps}"
    stochastic = sde_mask.reshape(-1, num_steps).any(0).tolist()
    merged = [k for a, b in zip(grid[:-1].tolist(), grid[1:].tolist()) if b > a + 1 for k in range(a, b)
              if stochastic[k]]
    if merged:
        return f"the grid {grid.tolist()} merges the stochastic steps {merged}; only deterministic ones can merge"
    return None


def expand_to_grid(latents: Tensor, log_probs: Tensor, sigmas: Tensor, grid: Tensor) -> tuple[Tensor, Tensor]:
    """Trajectories computed at the indices ``grid [n + 1]`` of ``sigmas [T + 1]`` put back on the full grid:
    latents ``[B, n + 1, ...]`` -> ``[B, T + 1, ...]`` (computed states as they are, a skipped one the linear
    interpolation in sigma between its neighbours: the Euler path of the coarse step) and log_probs ``[B, n]`` ->
    ``[B, T]`` (each coarse step's at its first index, 0 on the skipped steps).

    >>> z, lp = expand_to_grid(torch.tensor([[[1.0], [0.0]]]), torch.zeros(1, 1), torch.tensor([1.0, 0.75, 0.0]),
    ...                        torch.tensor([0, 2]))
    >>> z.flatten().tolist(), lp.shape
    ([1.0, 0.75, 0.0], torch.Size([1, 2]))
    """
    num_steps, grid = sigmas.numel() - 1, grid.to(latents.device)
    out = latents.new_empty((latents.shape[0], num_steps + 1, *latents.shape[2:]))
    out[:, grid] = latents
    full_log_probs = log_probs.new_zeros((log_probs.shape[0], num_steps))
    full_log_probs[:, grid[:-1]] = log_probs
    skipped = torch.ones(num_steps + 1, dtype=torch.bool, device=latents.device)
    skipped[grid] = False
    if skipped.any():
        at = skipped.nonzero().squeeze(1)
        after = torch.searchsorted(grid, at)  # the coarse state after each skipped one; the one before is after - 1
        s = sigmas.to(latents.device, torch.float64)
        weight = (s[at] - s[grid[after - 1]]) / (s[grid[after]] - s[grid[after - 1]])
        weight = weight.to(latents.dtype).view(1, -1, *[1] * (latents.dim() - 2))
        out[:, at] = torch.lerp(latents[:, after - 1], latents[:, after], weight)
    return out, full_log_probs
