"""Flash-GRPO's one stochastic step per group (arXiv 2605.15980): the step draw, the Flash SDE noise and the
temporal gradient rectification weight.

Notation: ``sigmas [T + 1]`` the sampling grid (``sigma_0`` first, ``sigma_T`` last), step k maps ``sigma_k`` to
``sigma_{k+1}``, ``dt_k = sigma_k - sigma_{k+1} > 0``; ``s_k`` the Flow-GRPO SDE's noise scale (its step std is
``s_k sqrt(dt_k)``, :func:`flowrl.sampling.steps.flow_grpo_step`).

Held to ``Shredded-Pork/Flash-GRPO`` @8cfc973:

- ``flow_grpo/diffusers_patch/wan2_1_pipeline_with_logprob2.py`` ``sde_step_with_logprob``: Flow-GRPO's SDE mean with
  ``std_dev_t = sigma_min + (sigma_max - sigma_min) sigma_k``, ``sigma_max = sigmas[1]``, ``sigma_min = sigmas[-1]``
  (no eta); it returns ``coe = 1 / (sqrt(dt) / std_dev_t + std_dev_t sqrt(dt) (1 - sigma) / (2 sigma))``.
- ``scripts/train_wanx2_1_flash.py``: one step per prompt drawn uniformly from the first 10 of 20 steps
  (``random.choices`` over ``weights = [1] * 10``), the ODE elsewhere; the loss of a sample is weighted by its
  ``coe`` (hard-coded there as a table for Wan 2.1, 20 steps, shift 3) over the mean ``coe`` of the micro-batch,
  averaged across processes. UniRL's port (``unirl/algorithms/flashgrpo.py``) divides by the mean over the pool.

flowrl expresses the Flash noise as per-step noise levels of the ``flow_grpo`` step (:func:`flash_noise_levels`), so no
new step kind is needed: the step contract has no room for the grid's ``sigma_max`` / ``sigma_min``, the noise level
has.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

WEIGHT_SCOPES = ("batch", "pool")


def group_steps(group_ids: Tensor, pool: list[int], seed: int, iteration: int) -> Tensor:
    """One step per prompt group drawn uniformly from ``pool``, shared by the group's rows: ``[B]`` long. Each group
    draws from ``np.random.default_rng([seed, iteration, group_id])``, so a group's step does not depend on which
    rank holds it or on the other groups (the authors draw on rank zero and broadcast).

    >>> steps = group_steps(torch.tensor([0, 0, 1, 1, 1]), [2, 3], seed=0, iteration=0)
    >>> steps[0] == steps[1], steps[2] == steps[4], set(steps.tolist()) <= {2, 3}
    (tensor(True), tensor(True), True)
    """
    if not pool:
        raise ValueError("the step pool is empty; give at least one step")
    groups, inverse = group_ids.cpu().unique(return_inverse=True)
    draws = [pool[int(np.random.default_rng([seed, iteration, int(g)]).integers(len(pool)))] for g in groups]
    return torch.tensor(draws, dtype=torch.long)[inverse].to(group_ids.device)


def one_step_mask(steps: Tensor, num_steps: int) -> Tensor:
    """``[B, T]`` bool: row b is stochastic (and trained) at ``steps[b]`` only.

    >>> one_step_mask(torch.tensor([1, 0]), 3).tolist()
    [[False, True, False], [True, False, False]]
    """
    return torch.arange(num_steps, device=steps.device)[None, :] == steps[:, None]


def flash_std(sigmas: Tensor) -> Tensor:
    """The Flash SDE's ``std_dev_t`` of each step ``[T]``: ``sigma_min + (sigma_max - sigma_min) sigma_k`` with
    ``sigma_max = sigmas[1]``, ``sigma_min = sigmas[-1]``.

    >>> [round(x, 4) for x in flash_std(torch.tensor([1.0, 0.8, 0.5, 0.0])).tolist()]  # 0.8 sigma
    [0.8, 0.64, 0.4]
    """
    sigma_max, sigma_min = sigmas[1], sigmas[-1]
    return sigma_min + (sigma_max - sigma_min) * sigmas[:-1]


def flash_noise_levels(sigmas: Tensor) -> Tensor:
    """The ``flow_grpo`` step's noise levels ``a_k`` ``[T]`` that give the Flash std: its ``s = a sqrt(sigma /
    (1 - sigma))`` (``sigma_next`` in the denominator at ``sigma = 1``) equals :func:`flash_std`.

    >>> [round(x, 4) for x in flash_noise_levels(torch.tensor([1.0, 0.8, 0.5, 0.0])).tolist()]  # 0.8/sqrt(1/0.2)
    [0.3578, 0.32, 0.4]
    """
    sigma, sigma_next = sigmas[:-1], sigmas[1:]
    return flash_std(sigmas) / torch.sqrt(sigma / (1 - torch.where(sigma >= 1, sigma_next, sigma)))


def rectification(sigmas: Tensor) -> Tensor:
    """Each step's gradient-scale coefficient ``coe_k = 1 / den_k`` ``[T]``, ``den_k = sqrt(dt_k) / s_k + s_k
    sqrt(dt_k) (1 - sigma_k) / (2 sigma_k)`` with ``s_k`` the Flash std (the authors' ``sde_step_with_logprob``).

    s = 0.25 * 0.5 = 0.125, sqrt(dt) = 0.5: den = 0.5 / 0.125 + 0.125 * 0.5 * 0.5 / (2 * 0.5) = 4.03125:

    >>> round(rectification(torch.tensor([0.5, 0.25, 0.0]))[0].item(), 4)
    0.2481
    """
    sigma, dt = sigmas[:-1], sigmas[:-1] - sigmas[1:]
    s, root = flash_std(sigmas), dt.sqrt()
    return 1.0 / (root / s + s * root * (1 - sigma) / (2 * sigma))


def rectified_weights(steps: Tensor, coefficients: Tensor, scope: str = "batch",
                      pool: list[int] | None = None) -> Tensor:
    """Per-row loss weights ``[B]``: the ``coe`` of each row's step over a mean, ``batch`` (the rows given: the
    authors' micro-batch mean, gathered over processes) or ``pool`` (UniRL: the mean over the candidate steps).

    >>> coe = torch.tensor([4.0, 2.0, 1.0])
    >>> rectified_weights(torch.tensor([0, 1, 1, 1]), coe)  # mean of 4, 2, 2, 2 is 2.5
    tensor([1.6000, 0.8000, 0.8000, 0.8000])
    >>> rectified_weights(torch.tensor([0, 1]), coe, "pool", pool=[0, 1, 2])  # pool mean 7 / 3
    tensor([1.7143, 0.8571])
    """
    if scope not in WEIGHT_SCOPES:
        raise ValueError(f"rectified weight scope {scope!r}: choose one of {list(WEIGHT_SCOPES)}")
    if scope == "pool" and not pool:
        raise ValueError("the pool scope needs the candidate steps (pool=[...])")
    coe = coefficients[steps]
    return coe / (coe.mean() if scope == "batch" else coefficients[pool].mean())
