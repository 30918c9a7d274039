"""Flow-GRPO (arXiv 2505.05470): GRPO on the flow SDE, one outcome reward per trajectory.

The shared loop is the whole algorithm: SDE sampling on every step, group advantages (``grpo@flow_grpo``:
population std of the gathered batch, +1e-4, clip 5) broadcast to every trained step, PPO clip 1e-4, optional KL.
Its one hook: the trained steps are the stochastic steps among the first ``floor(T * timestep_fraction)``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.sampler import trained_steps


class FlowGRPO(PolicyGradient):
    """Flow-GRPO. Options beyond the loop's (:class:`~flowrl.methods.policy_gradient.PolicyGradient`):

    Args:
        timestep_fraction: train the stochastic steps among the first ``floor(T * timestep_fraction)``.
    """

    def __init__(self, policy: FlowPolicy, timestep_fraction: float = 0.99, **kwargs: Any):
        super().__init__(policy, **kwargs)
        self.timestep_fraction = timestep_fraction

    @classmethod
    def check_options(cls, o) -> list[str]:
        if not 0 < o.timestep_fraction <= 1:
            return [f"model.timestep_fraction={o.timestep_fraction} must be in (0, 1]"]
        return []

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        return trained_steps(sde_mask, self.timestep_fraction, sigmas, self.step_kind)
