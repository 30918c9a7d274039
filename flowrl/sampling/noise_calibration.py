"""DenseGRPO's exploration-space calibration (arXiv 2601.20218, Alg. 1): a per-step SDE noise scale ``psi(k)``.

``psi(k)`` is the noise scale the step function applies at step ``k``: for the ``flow_grpo`` SDE that is
``s_k = a * sqrt(sigma / (1 - sigma))`` (the std of the step is ``s_k sqrt(-dt)``), so calibration starts from
Flow-GRPO's value and the step receives ``noise_level = psi(k) / sqrt(sigma / (1 - sigma))``. Other step kinds take
their ``noise_level`` as the scale itself (factor 1). Each calibration iteration samples N trajectories and counts,
per step, the positive and negative dense rewards ``dR``: a balanced step (``|#pos - #neg| < eps1``) has room to
explore more (``psi += eps2``), an unbalanced one less (``psi -= eps2``). Zeros count as neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class NoiseCalibration:
    """Options of Alg. 1. ``samples``: trajectories N per iteration (over all ranks); ``iterations``: updates of
    ``psi``; ``eps1``: balance threshold on ``|#(dR > 0) - #(dR < 0)|``; ``eps2``: the step of ``psi``."""

    samples: int = 24
    iterations: int = 10
    eps1: float = 2.0
    eps2: float = 0.01

    def problems(self) -> list[str]:
        out = []
        if self.samples < 1 or self.iterations < 1:
            out.append(f"model.calibration: samples={self.samples} and iterations={self.iterations} must be >= 1 "
                       "(calibration: null turns calibration off)")
        if self.eps1 <= 0 or self.eps2 <= 0:
            out.append(f"model.calibration: eps1={self.eps1} and eps2={self.eps2} must be > 0")
        return out


def noise_scale_factors(sigmas: Tensor, step_kind: str) -> Tensor:
    """Per-step factor ``[T]`` between a step's ``noise_level`` and its noise scale ``psi = noise_level * factor``.

    ``flow_grpo``: ``sqrt(sigma / (1 - sigma))`` with ``sigma_next`` in the denominator at ``sigma == 1``, exactly as
    :func:`~flowrl.sampling.steps.flow_grpo_step` forms ``s``; every other kind: 1.

    >>> noise_scale_factors(torch.tensor([1.0, 0.5, 0.2, 0.0]), "flow_grpo")  # sqrt(1/0.5), sqrt(1), sqrt(0.25)
    tensor([1.4142, 1.0000, 0.5000])
    """
    sigma, sigma_next = sigmas[:-1].double(), sigmas[1:].double()
    if step_kind != "flow_grpo":
        return torch.ones_like(sigma).float()
    return torch.sqrt(sigma / (1 - torch.where(sigma >= 1, sigma_next, sigma))).float()


def calibration_update(psi: Tensor, step_rewards: Tensor, eps1: float = 2.0, eps2: float = 0.01) -> Tensor:
    """One iteration of Alg. 1 on the dense rewards of N trajectories.

    Args:
        psi: ``[T]`` noise scales. step_rewards: ``[N, T]`` ``dR`` of the sampled trajectories (NaN counts as
            neither sign).
    Returns:
        ``[T]``: ``psi + eps2`` where ``|#(dR > 0) - #(dR < 0)| < eps1``, else ``psi - eps2``; a decrease that
        would make ``psi`` non-positive is skipped (the step needs a positive std; Alg. 1 does not say).

    Reference notes' example: 4 positive, 3 negative, one zero -> balanced; 1 positive, 7 negative -> not.

    >>> dr = torch.tensor([[0.1, -0.1], [-0.2, -0.2], [0.3, -0.3], [-0.1, -0.1], [0.05, 0.05], [-0.02, -0.02],
    ...                    [0.0, -0.01], [0.01, -0.04]])
    >>> calibration_update(torch.tensor([0.7, 0.7]), dr)
    tensor([0.7100, 0.6900])
    """
    positive, negative = (step_rewards > 0).sum(0), (step_rewards < 0).sum(0)  # [T]
    balanced = (positive - negative).abs() < eps1
    updated = torch.where(balanced, psi + eps2, psi - eps2)
    return torch.where(updated > 0, updated, psi)
