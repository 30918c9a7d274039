"""G²RPO, Granular GRPO (arXiv 2510.01982, CVPR 2026): one SDE step per branch off a shared ODE anchor, completions at
several granularities, advantages summed over granularities and rewards.

TempFlow-GRPO's tree with two changes (:class:`~flowrl.methods.tempflow_grpo.TempFlowGRPO`, ``bcmi/Granular-GRPO``
``fastvideo/train_g2rpo_hps.py``, ``sample_reference_model`` and ``train_one_step``):

- the group is one tree: its members share the initial noise and one ODE anchor; at each trained step ``k`` the ``G``
  members (``branches``) take one Flow-GRPO SDE step from the anchor's ``z_k``, reusing its one model output there,
  and differ only in their noise;
- each branch is completed by the ODE once per granularity ``g`` (``sigma[k + 1], sigma[k + 2::g]``, last point 0;
  :func:`~flowrl.sampling.ode_complete.completion_sigmas`), a leaf each, scored by every reward; the leaves of a
  branch share its one trained edge, trained once;
- ``A_k = sum_{g, m} w_m (R - mean) / (std + 1e-8)`` per (tree, step, granularity, reward), unbiased std, clipped to 5
  after the sum (:func:`~flowrl.advantages.granular.granular_leaf_advantages`); PPO clip 1e-4, no noise-aware weight.

Cost per tree at the published setting (T = 16, G = 12, k = 0..7, g in {1, 2}): 1,688 evaluations, the authors'
1,792 less the anchor's 8 unused steps and the 96 member re-evaluations of its states
(:func:`~flowrl.advantages.granular.granular_evaluations`); 192 scored leaves.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.advantages.granular import granular_leaf_advantages
from flowrl.methods.batch import Batch
from flowrl.methods.option_surface import at_least
from flowrl.methods.tempflow_grpo import TempFlowGRPO
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.tree import TreeShape


class G2RPO(TempFlowGRPO):
    """G²RPO. Options beyond TempFlow-GRPO's (:class:`~flowrl.methods.tempflow_grpo.TempFlowGRPO`), whose defaults
    change to the authors' (``branches`` is the group's ``G`` members, ``timestep_fraction`` 0.5 trains the first half
    of the steps as their ``eta_step_list``, no noise-aware weight):

    Args:
        granularities: complete each branch on every ``g``-th schedule point, once per ``g`` (the authors' 1 and 2).
        advantage_clip: clamp the summed advantage to ``[-clip, clip]`` (their ``adv_clip_max``; None: no clip).
        advantage: the estimator normalising each (granularity, reward) column per (tree, step): ``step_grpo@g2rpo``
            (unbiased std, +1e-8, no clip: the clip applies to the sum).
    """

    def __init__(self, policy: FlowPolicy, granularities: Optional[list[int]] = None,
                 advantage_clip: Optional[float] = 5.0, branches: int = 12, timestep_fraction: float = 0.5,
                 noise_aware: bool = False, advantage: str = "step_grpo@g2rpo", **kwargs: Any):
        super().__init__(policy, branches=branches, timestep_fraction=timestep_fraction, noise_aware=noise_aware,
                         advantage=advantage, **kwargs)
        self.granularities = [1, 2] if granularities is None else granularities
        self.advantage_clip = advantage_clip

    def problems(self) -> list[str]:
        problems = super().problems() + at_least(self, 0, ("advantage_clip",), strict=True, hint=" (or null)")
        grains = self.granularities
        if not grains or min(grains) < 1 or len(set(grains)) != len(grains):
            problems.append(f"model.granularities={grains}: give distinct granularities >= 1 (1: every step)")
        if self.completion_steps is not None:
            problems.append(f"model.completion_steps={self.completion_steps}: G2RPO's granularities set the completion "
                            "grids; leave completion_steps null")
        if self.reward_aggregation != "sum":
            problems.append(f"model.reward_aggregation={self.reward_aggregation!r}: G2RPO normalises each reward per "
                            "(tree, step, granularity) and sums them (the authors' rule); leave it at sum")
        return problems

    def shape_of(self, batch: int = 0) -> TreeShape:
        return dataclasses.replace(super().shape_of(batch), granularities=tuple(self.granularities))

    def branch_credit(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """Every leaf's advantage ``[B, T]`` (its branch's) and whether its branch is usable ``[B]``."""
        return granular_leaf_advantages(
            batch.rewards, self.reward_set.weights, batch.train_mask, batch.granularity, batch.node_ids,
            self.advantage_groups(batch), batch.valid, per_column=self.advantage, clip=self.advantage_clip,
            **(self.advantage_options or {}))

    def advantages(self, batch: Batch):
        return self.branch_credit(batch)[0]

    def loss_weights(self, batch: Batch) -> Tensor:
        """TempFlow-GRPO's, zero on the leaves of a branch with a leaf left unscored (out of the statistics)."""
        return super().loss_weights(batch) * self.branch_credit(batch)[1][:, None]
