"""The generating half of every method, as an object the module and the evaluator own: conditioning, the guided
velocity (every model call, counted in ``forward_passes``) and deterministic samples from seeds.

:class:`Generation` holds the policy it draws from, the guidance scale and the default number of ODE steps; the
module's validation, evaluation and prediction (:mod:`flowrl.methods.validation`) and the evaluator
(:class:`flowrl.evaluation.module.Evaluator`) call it. Every sample it draws starts from
:func:`~flowrl.sampling.sampler.seeded_noise` of its seed, so the same (prompt, seed) gives the same image on any
number of processes and in any batch.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from flowrl.policies.base import Conditioning, FlowPolicy
from flowrl.sampling.sampler import VelocityFn, sample
from flowrl.sampling.solver import solver_sample
from flowrl.sampling.steps import ODE_STEPS


class Generation:
    """Draws from a policy (see the module docstring).

    Args:
        policy: the policy adapter it draws from (the evaluator swaps it for each model).
        guidance_scale: classifier-free guidance of :meth:`velocity_fn` and so of every sample.
        num_steps: ODE steps of :meth:`final_latents` when a call names none.
        placement: what has the ``device`` samples are drawn on, read at each call (the owning module, which the
            strategy moves); None: the CPU.
    """

    def __init__(self, policy: FlowPolicy, guidance_scale: float, num_steps: int, placement: Optional[Any] = None):
        self.policy, self.guidance_scale, self.num_steps = policy, guidance_scale, num_steps
        self.placement = placement
        self.forward_passes = 0  # rows through the model since it was built (a CFG pair: 2); the loop reads deltas

    @property
    def device(self) -> torch.device:
        """Where samples are drawn: the placement's device."""
        return torch.device("cpu") if self.placement is None else self.placement.device

    def encode(self, batch: dict) -> Conditioning:
        """The policy's conditioning of a batch's ``prompts`` and, where its prompt records carry them, ``images``."""
        return self.policy.encode(batch["prompts"], images=batch.get("images"))

    def velocity(self, z: Tensor, sigma: Tensor, cond: Conditioning, guidance_scale: float,
                 cfg_gradient: str = "both") -> Tensor:
        """The policy's velocity (:meth:`~flowrl.policies.base.FlowPolicy.velocity`, under whatever adapter is
        active), counted in ``forward_passes``: a row per evaluation, 2 for a classifier-free guidance pair. Every
        model call of a method goes through here, so the update's passes are counted alike for every method."""
        self.forward_passes += len(z) * (2 if guidance_scale != 1.0 and cond.guided else 1)
        return self.policy.velocity(z, sigma, cond, guidance_scale, cfg_gradient)

    def velocity_fn(self, cond: Conditioning, rows_of: Optional[Tensor] = None) -> VelocityFn:
        """The policy's guided velocity as a :data:`~flowrl.sampling.sampler.VelocityFn` whose ``rows`` index
        ``cond``'s rows, or index ``rows_of`` (a rollout's ``cond_rows``: each row's conditioning row) where given."""
        def velocity(z: Tensor, sigma: Tensor, rows: Tensor) -> Tensor:
            if rows_of is not None:
                rows = rows_of[rows.to(rows_of.device)]
            return self.velocity(z, sigma, cond.select(rows), self.guidance_scale)
        return velocity

    @torch.no_grad()
    def generate(self, prompts: list[str], seeds: Tensor, num_steps: Optional[int] = None,
                 images: Optional[list] = None) -> Tensor:
        """Images ``[B, 3, H, W]`` (videos ``[B, F, 3, H, W]``) decoded from :meth:`final_latents` of the prompts'
        conditioning; ``images``: the prompts' conditioning images, for an editing or image-to-video policy."""
        cond = self.encode({"prompts": prompts, "images": images})
        return self.policy.decode(self.final_latents(cond, seeds, num_steps), cond)

    @torch.no_grad()
    def final_latents(self, cond: Conditioning, seeds: Tensor, num_steps: Optional[int] = None) -> Tensor:
        """Final latents ``[B, *latent_shape]`` of the deterministic sampler (no noise after the seeded start,
        ``num_steps`` steps by default, ``guidance_scale``): the policy's own solver where its folder ships one
        (:meth:`~flowrl.policies.base.FlowPolicy.solver`: Wan's UniPC, as its pipeline steps), else flowrl's ODE step
        (Euler; DDIM for SD1.5), which is then the pipeline's."""
        sigmas = self.policy.sigmas(num_steps or self.num_steps).to(self.device)
        shape, solver = self.policy.latent_shape(), self.policy.solver()
        if solver is not None:
            return solver_sample(self.velocity_fn(cond), seeds, sigmas, shape, solver, self.device)
        latents, _ = sample(self.velocity_fn(cond), seeds, sigmas, shape, ODE_STEPS[self.policy.prediction],
                            device=self.device)
        return latents[:, -1]
