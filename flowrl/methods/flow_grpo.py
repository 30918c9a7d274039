"""Flow-GRPO (arXiv 2505.05470): GRPO on the flow SDE, one outcome reward per trajectory.

The shared loop is the whole algorithm: SDE sampling on every step, group advantages (``grpo@flow_grpo``:
population std of the gathered batch, +1e-4, clip 5) broadcast to every trained step, PPO clip 1e-4, optional KL.
Its one hook: the trained steps are the stochastic steps among the first ``floor(T * timestep_fraction)``. As the
authors' ``scripts/train_sd3.py`` (``compute_log_prob``), the unconditional half of the guided velocity is detached
(``cfg_gradient: cond``) and the KL is divided by the SDE's ``s^2`` (``kl_convention: flow_grpo``), so their
published ``beta`` values (0.01 PickScore, 0.04 GenEval and OCR) transfer unchanged.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from flowrl.methods.policy_gradient import PolicyGradient
from flowrl.policies.base import FlowPolicy
from flowrl.sampling.sampler import fraction_problems, trained_steps


class FlowGRPO(PolicyGradient):
    """Flow-GRPO. Options beyond the loop's (:class:`~flowrl.methods.policy_gradient.PolicyGradient`):

    Args:
        timestep_fraction: train the stochastic steps among the first ``floor(T * timestep_fraction)``.
        cfg_gradient: ``cond``: the unconditional half detached, as flow_grpo's ``compute_log_prob``; ``both``: the
            exact gradient of the guided velocity (DDPO's ``scripts/train.py``).
        kl_convention: ``flow_grpo``: ``beta`` in flow_grpo's units (its KL over ``2 s^2``); ``exact``: the
            Gaussian KL of the two transitions.
    """

    def __init__(self, policy: FlowPolicy, timestep_fraction: float = 0.99, cfg_gradient: str = "cond",
                 kl_convention: str = "flow_grpo", **kwargs: Any):
        super().__init__(policy, cfg_gradient=cfg_gradient, kl_convention=kl_convention, **kwargs)
        self.timestep_fraction = timestep_fraction

    def problems(self) -> list[str]:
        return super().problems() + fraction_problems(self.timestep_fraction)

    def trained_steps(self, sde_mask: Tensor, sigmas: Tensor) -> Tensor:
        return trained_steps(sde_mask, self.timestep_fraction, sigmas, self.step_kind)
