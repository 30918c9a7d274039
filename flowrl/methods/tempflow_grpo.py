"""TempFlow-GRPO (arXiv 2508.04324): credit at each step from one-step SDE branches off an ODE trajectory.

Per seed the main trajectory is the ODE. At each branch step ``k`` (default: every trained step, as the authors'
``train_sd3_pr.py``) it spawns ``K`` branches (default 6) that reuse its velocity at ``z_k``, take one Flow-GRPO SDE
step each and are completed with the ODE and scored: every branch's reward is caused by its one stochastic step
(the paper's credit localisation). A row is a branch; its one trained transition is ``z_k -> z^b_{k+1}``. The
advantage of step ``k`` is ``step_grpo`` over the ``K`` branches of the same seed (``advantage_group: tree``, the
authors' "seed group"; ``prompt`` normalises over all branches of the prompt's group), with their numerics
(population std, +1e-4, clip 5). Noise-aware weighting (Eq. 7/8): step ``k``'s loss is weighted by
``w_k = s_k sqrt(dt_k) / mean_j s_j sqrt(dt_j)`` over the branch steps, ``s_k sqrt(dt_k)`` being the SDE step's std
(the authors' code uses the constant 2.25 = 1 / mean for SD3.5 at T=10, a=0.7).

Cost per seed at ``T = 10``, ``K = 6``: 9 ODE evaluations of the main trajectory plus ``6 * sum_{k<9} (9 - k) = 270``
for the completions: 279 (asserted by counting real forward calls).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.methods.batch import Batch
from flowrl.methods.tree_method import TreeMethod
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.sampler import fraction_problems, fraction_steps
from flowrl.sampling.steps import get_step
from flowrl.sampling.tree import TreeShape


def noise_aware_weights(stds: Tensor) -> Tensor:
    """``w_k = std_k / mean(std)`` over the branch steps (mean 1), ``std_k = s_k sqrt(dt_k)`` the SDE step's std.

    >>> noise_aware_weights(torch.tensor([1.0, 3.0]))  # mean 2
    tensor([0.5000, 1.5000])
    """
    return stds / stds.mean()


def branch_steps_of(num_steps: int, branch_steps: Optional[list[int]], timestep_fraction: float) -> list[int]:
    """The steps that branch: ``branch_steps``, or the first ``floor(T * timestep_fraction)``.

    >>> branch_steps_of(10, None, 0.99), branch_steps_of(10, [5, 2], 0.99)
    ([0, 1, 2, 3, 4, 5, 6, 7, 8], [2, 5])
    """
    if branch_steps is not None:
        return sorted(branch_steps)
    return list(range(fraction_steps(num_steps, timestep_fraction)))


class TempFlowGRPO(TreeMethod):
    """TempFlow-GRPO. Options beyond the tree layer's (:class:`~flowrl.methods.tree_method.TreeMethod`):

    Args:
        branches: ``K``, SDE branches per branch step and seed.
        branch_steps: the steps that branch (None: the first ``floor(T * timestep_fraction)``, every trained step).
        timestep_fraction: with ``branch_steps`` null, branch on the first ``floor(T * fraction)`` steps.
        noise_aware: weight each step's loss by its SDE std relative to the mean over the branch steps.
        advantage: ``step_grpo@flow_grpo`` per seed group and step, as the authors' seed-group statistics:
            population std, +1e-4, advantages clipped to 5.
    """

    def __init__(self, policy: FlowPolicy, branches: int = 6, branch_steps: Optional[list[int]] = None,
                 timestep_fraction: float = 0.99, noise_aware: bool = True, advantage: str = "step_grpo@flow_grpo",
                 **kwargs: Any):
        super().__init__(policy, advantage=advantage, **kwargs)
        self.branches, self.noise_aware = branches, noise_aware
        self.branch_steps, self.timestep_fraction = branch_steps, timestep_fraction

    def branching_steps(self) -> list[int]:
        """The steps that branch (:func:`branch_steps_of` of the options)."""
        return branch_steps_of(self.num_steps, self.branch_steps, self.timestep_fraction)

    def problems(self) -> list[str]:
        problems, T, fraction = super().problems(), self.num_steps, self.timestep_fraction
        if self.branches < 2:
            problems.append(f"model.branches={self.branches}: step advantages need at least 2 branches per step")
        if fraction_problems(fraction):
            return problems + fraction_problems(fraction)
        if self.branch_steps is None:  # the first floor(T x fraction) steps branch (none: the rule every method shares)
            steps = self.branching_steps()
            if steps and steps[-1] >= T - 1:
                problems.append(f"model.timestep_fraction={fraction} branches on the last of the {T} steps "
                                "(branch_steps unset: the first floor(T x fraction)), which lands on the image with "
                                "nothing left to complete; lower it or set branch_steps")
            return problems
        steps = sorted(self.branch_steps)
        if not steps or steps[0] < 0 or steps[-1] >= T - 1 or len(set(steps)) != len(steps):
            problems.append(f"model.branch_steps={self.branch_steps}: choose distinct steps in [0, {T - 1}) (the last "
                            "step lands on the image: nothing is left to complete; a repeated step would branch twice "
                            "from one state)")
        return problems

    def shape_of(self, batch: int = 0) -> TreeShape:
        T, steps = self.num_steps, self.branching_steps()
        side, last = tuple(self.branches if k in steps else 0 for k in range(T)), (steps or [-1])[-1]
        return TreeShape(splits=(1,) * T, sde=(False,) * T, noise_scale=(1.0,) * T, side=side, stop=last + 1,
                         frontier_leaves=False)

    def loss_weights(self, batch: Batch) -> Tensor:
        """``w_k`` on each row's branch step (1 without ``noise_aware``)."""
        if not self.noise_aware:
            return torch.ones_like(batch.log_probs)
        return torch.ones_like(batch.log_probs) * self.step_weights().to(batch.log_probs)

    def step_weights(self) -> Tensor:
        """``[T]`` the noise-aware weight of each step (mean 1 over the branch steps, 0 elsewhere)."""
        sigmas = self.policy.sigmas(self.num_steps).float()
        steps = torch.tensor(self.branching_steps())
        zero = torch.zeros(len(steps), 1)
        out = get_step(self.step_kind)(zero, zero, sigmas[steps], sigmas[steps + 1], noise=zero,
                                       noise_level=self.noise_levels()[steps])
        weights = torch.zeros(self.num_steps)
        weights[steps] = noise_aware_weights(out.std.reshape(len(steps), -1)[:, 0])
        return weights
